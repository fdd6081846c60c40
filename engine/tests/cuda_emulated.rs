//! The CUDA kernel source (`engine/src/backend/cuda/matmul.cu`), run unchanged on the CPU by a
//! small emulator (`cuda_emulator/emulate.cpp`: one thread per CUDA thread, shuffles through
//! shared memory and barriers), against the scalar reference bit for bit: every format with
//! edge codes, tails, partial FP8 blocks and several tiles of input rows, launched with the
//! backend's own arguments ([`backend::abi::kernel_args`]).
//!
//! This checks the kernels' arithmetic and indexing on machines without a GPU (this
//! repository's CI); `engine/tests/cuda.rs` checks the same on a real device. Needs a C++20
//! compiler (`g++`); without one the test is skipped, unless `DELTAFIN_REQUIRE_SERVICES=1`.

mod emulator_support;
mod kernel_support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use deltafin_engine::backend::abi::kernel_args;
use deltafin_engine::kernels::{Matrix, ScaleDtype, reference};
use kernel_support::*;

/// The emulator binary, compiled once per test run (`None`: no compiler, skip).
fn emulator() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| emulator_support::compile("emulate.cpp", "deltafin-cuda-emulator"))
        .as_deref()
}

/// `m` times `n` rows of `x` through the emulated kernel.
fn emulate(bin: &Path, m: &Matrix, x: &[f32], n: usize) -> Vec<f32> {
    let a = kernel_args(m.format);
    let mut input = Vec::new();
    for v in [
        a.code,
        m.rows as i32,
        m.cols as i32,
        n as i32,
        a.p0,
        a.p1,
        a.scale_dtype,
    ] {
        input.extend(v.to_le_bytes());
    }
    let scales = m.scales.as_deref().unwrap_or(&[]);
    input.extend((m.data.len() as u64).to_le_bytes());
    input.extend((scales.len() as u64).to_le_bytes());
    input.extend(&m.data[..]);
    input.extend(scales);
    input.extend(x.iter().flat_map(|v| v.to_le_bytes()));
    let out = emulator_support::run(bin, &input);
    assert_eq!(out.len(), 4 * n * m.rows);
    floats(&out)
}

fn check(m: &Matrix, ns: &[usize], label: &str) {
    let Some(bin) = emulator() else { return };
    for &n in ns {
        let x = patterned(n * m.cols, 3000 + n as u64);
        let mut want = vec![0.0; n * m.rows];
        reference::matmul(m, &x, n, &mut want);
        let got = emulate(bin, m, &x, n);
        assert_same(
            &want,
            &got,
            &format!("emulated {label} {}x{} n={n}", m.rows, m.cols),
        );
    }
}

/// One and several register tiles of input rows (8 per tile), with a partial last tile.
const NS: [usize; 4] = [1, 3, 8, 19];

#[test]
fn f32_and_bf16_match_the_reference() {
    for (i, &(rows, cols)) in [(1, 1), (3, 15), (5, 16), (17, 33), (20, 300)].iter().enumerate() {
        check(&f32_matrix(rows, cols, i as u64), &NS, "f32");
        check(&bf16_matrix(rows, cols, 10 + i as u64), &NS, "bf16");
    }
}

#[test]
fn fp8_matches_the_reference_with_partial_blocks_nan_codes_and_special_scales() {
    check(&fp8_matrix(20, 300, (128, 128), 1, false), &NS, "fp8 128x128");
    check(&fp8_matrix(13, 45, (4, 16), 2, false), &NS, "fp8 4x16");
    check(&fp8_matrix(11, 100, (3, 24), 5, false), &[1, 9], "fp8 3x24");
    check(&fp8_matrix(17, 64, (16, 32), 4, true), &[1, 9], "fp8 NaN codes");
    let m = fp8_special_scales_matrix(9, 44, 20);
    check(&m, &[1, 9], "fp8 special scales");
}

#[test]
fn int4_matches_the_reference_for_every_scale_dtype() {
    for (i, dtype) in [ScaleDtype::F32, ScaleDtype::Bf16, ScaleDtype::F16]
        .into_iter()
        .enumerate()
    {
        let s = i as u64;
        check(&int4_matrix(5, 32, 32, dtype, s), &NS, "int4 g32");
        check(&int4_matrix(18, 256, 128, dtype, s + 20), &[1, 9], "int4 g128");
        check(&int4_matrix(7, 40, 8, dtype, s + 30), &[1, 9], "int4 g8");
    }
}

#[test]
fn mxfp4_matches_the_reference_with_special_scales() {
    check(&mxfp4_matrix(17, 320, 32, 2), &NS, "mxfp4 g32");
    check(&mxfp4_matrix(7, 30, 2, 4), &[1, 9], "mxfp4 g2");
    let m = mxfp4_special_scales_matrix();
    check(&m, &NS, "mxfp4 special scales");
}

#[test]
fn special_float_weights_match_the_reference() {
    check(&special_f32_matrix(), &[1, 9], "f32 specials");
}
