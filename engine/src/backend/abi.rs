//! The launch interface of the CUDA kernels in `cuda/matmul.cu`: which kernel a stored format
//! uses and the integer parameters it is passed. Kept apart from the feature-gated backend so
//! that the CPU emulation of the kernel source (`engine/tests/cuda_emulated.rs`) launches them
//! exactly as the backend does.

use crate::kernels::{Format, ScaleDtype};

/// One kernel launch's format-dependent arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelArgs {
    /// Entry point in `matmul.cu`.
    pub name: &'static str,
    /// The kernel's index in the order f32, bf16, fp8, int4, mxfp4 (the `FMT_*` codes).
    pub code: i32,
    /// FP8: block rows; INT4 / MXFP4: group size.
    pub p0: i32,
    /// FP8: block columns.
    pub p1: i32,
    /// Scale element type (`SCALE_F32` 0, `SCALE_BF16` 1, `SCALE_F16` 2).
    pub scale_dtype: i32,
}

/// Every kernel entry point, indexed by [`KernelArgs::code`].
pub const KERNELS: [&str; 5] = [
    "deltafin_matmul_f32",
    "deltafin_matmul_bf16",
    "deltafin_matmul_fp8",
    "deltafin_matmul_int4",
    "deltafin_matmul_mxfp4",
];

/// The launch arguments for a matrix stored as `format`. Layout parameters are validated by
/// [`crate::kernels::Matrix::new`]; values beyond `i32` are rejected there by the caller.
pub fn kernel_args(format: Format) -> KernelArgs {
    let (code, p0, p1, scale_dtype) = match format {
        Format::F32 => (0, 0, 0, 0),
        Format::Bf16 => (1, 0, 0, 0),
        Format::Fp8Block {
            block_rows,
            block_cols,
        } => (2, block_rows as i32, block_cols as i32, 0),
        Format::Int4Group { group, scale } => {
            let sdt = match scale {
                ScaleDtype::F32 => 0,
                ScaleDtype::Bf16 => 1,
                ScaleDtype::F16 => 2,
            };
            (3, group as i32, 0, sdt)
        }
        Format::Mxfp4 { group } => (4, group as i32, 0, 0),
    };
    KernelArgs {
        name: KERNELS[code as usize],
        code,
        p0,
        p1,
        scale_dtype,
    }
}
