//! Matrix kernels over stored weight formats. A [`Matrix`] is a weight exactly as the checkpoint
//! ships it (F32, BF16, block-FP8, INT4 pack-quantized, MXFP4); kernels decode it element by
//! element inside the dot product and never keep a re-encoded copy.
//!
//! ## The canonical dot product (the batch-invariance contract)
//! Every kernel computes `y[i, r] = Σ_k W[r, k] · x[i, k]` in exactly this order:
//! * `W[r, k]` is decoded to f32 by [`format`]'s element rule (exact, or one f32 rounding for
//!   scaled FP8);
//! * the row is padded with zeros to a multiple of [`LANES`] (16); lane `l` accumulates
//!   `acc[l] = fma(w, x, acc[l])` for every `k ≡ l (mod 16)` in increasing `k`: IEEE fused
//!   multiply-add, one rounding per step, which every CPU ISA and CUDA (`__fmaf_rn`) compute
//!   identically;
//! * the lanes are reduced by the fixed tree `acc[l] += acc[l + s]` for `s = 8, 4, 2, 1`.
//!
//! Because the order depends only on `k`, the scalar reference ([`reference`]), the SIMD kernels
//! (AVX2 = two 8-lane registers, AVX-512 = one 16-lane register, NEON = four 4-lane registers)
//! and the multi-row kernel all produce bit-identical results: row `i` of a multi-row call equals
//! the single-row call, on any thread count.
//!
//! Model code multiplies through `backend::matmul`, which picks the device; nothing here
//! calls back into the backend.

pub mod cpu;
pub mod format;
pub mod layer_spec;
pub mod math;
pub mod ops;
pub mod reference;

pub use cpu::{Isa, matmul_with};
pub use format::{Format, Matrix, ScaleDtype};

/// Lanes of the canonical accumulator.
pub const LANES: usize = 16;
