//! Optimised CPU kernels versus the scalar reference, bit for bit: every format x every ISA this
//! CPU can run x shapes with tails, partial FP8 blocks, odd group sizes (the generic path) and
//! n = 1..=33 input rows; plus batch invariance under rayon pools of 1, 2 and 3 threads.
//!
//! NaN results are compared as "both NaN": Rust does not specify NaN sign/payload of arithmetic
//! results, so only NaN-ness is a contract. Every other value is compared with `to_bits()`.

mod kernel_support;

use deltafin_engine::kernels::{Isa, Matrix, ScaleDtype, matmul_with, reference};
use deltafin_engine::weights::Blob;
use kernel_support::*;

/// Every available ISA (and the default dispatcher) against the reference for each `n`.
fn check(m: &Matrix, ns: &[usize], label: &str) {
    for &n in ns {
        let x = patterned(n * m.cols, 1000 + n as u64);
        let mut want = vec![0.0; n * m.rows];
        reference::matmul(m, &x, n, &mut want);
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; n * m.rows];
            matmul_with(isa, m, &x, n, &mut got);
            assert_same(&want, &got, &format!("{label} {}x{} n={n} {isa}", m.rows, m.cols));
        }
        let mut got = vec![f32::NAN; n * m.rows];
        deltafin_engine::backend::matmul(m, &x, n, &mut got);
        assert_same(
            &want,
            &got,
            &format!("{label} {}x{} n={n} default", m.rows, m.cols),
        );
    }
}

/// Every row count from one row (decode) to 33 (past every register tile and the panel switch).
const ALL_N: [usize; 33] = {
    let mut n = [0; 33];
    let mut i = 0;
    while i < 33 {
        n[i] = i + 1;
        i += 1;
    }
    n
};
const FEW_N: [usize; 4] = [1, 2, 5, 9];

#[test]
fn isa_detection_is_consistent() {
    let avail = Isa::available();
    assert_eq!(avail.first(), Some(&Isa::detected()));
    assert_eq!(avail.last(), Some(&Isa::Scalar));
    assert!(avail.iter().all(|i| i.is_available()));
    eprintln!("available ISAs: {avail:?}");
}

#[test]
fn f32_matches_reference() {
    for (i, &(rows, cols)) in [(1, 1), (3, 15), (5, 16), (4, 17), (7, 33), (37, 300), (9, 513)]
        .iter()
        .enumerate()
    {
        check(&f32_matrix(rows, cols, i as u64), &ALL_N, "f32");
    }
    // Several k-blocks of the f32 multi-input sweep (68 full chunks and a tail), every input
    // tile count it takes on each ISA.
    check(
        &f32_matrix(200, 1100, 99),
        &[1, 2, 3, 5, 8, 9, 12, 13, 16, 17],
        "f32",
    );
}

#[test]
fn bf16_matches_reference() {
    for (i, &(rows, cols)) in [(1, 1), (3, 15), (5, 16), (4, 17), (7, 33), (37, 300), (9, 513)]
        .iter()
        .enumerate()
    {
        check(&bf16_matrix(rows, cols, 10 + i as u64), &ALL_N, "bf16");
    }
    check(&bf16_matrix(200, 1100, 98), &FEW_N, "bf16");
}

#[test]
fn fp8_matches_reference_with_partial_blocks() {
    check(&fp8_matrix(200, 300, (128, 128), 1, false), &ALL_N, "fp8 128x128");
    check(&fp8_matrix(13, 45, (4, 16), 2, false), &ALL_N, "fp8 4x16");
    check(&fp8_matrix(9, 1100, (128, 128), 3, false), &FEW_N, "fp8 wide");
}

#[test]
fn fp8_nan_codes_match_reference() {
    check(
        &fp8_matrix(37, 300, (16, 32), 4, true),
        &FEW_N,
        "fp8 with NaN codes",
    );
}

#[test]
fn fp8_special_scales_match_reference() {
    for (i, cols) in [40usize, 44, 300].into_iter().enumerate() {
        check(
            &fp8_special_scales_matrix(9, cols, 20 + i as u64),
            &FEW_N,
            "fp8 special scales",
        );
    }
}

#[test]
fn fp8_generic_paths_match_reference() {
    // block_cols not a multiple of 16: chunks straddle scale blocks.
    check(&fp8_matrix(11, 100, (3, 24), 5, false), &FEW_N, "fp8 3x24");
    // Scales around the pre-multiplication limit (2^119: decoders scale by 256): the largest
    // fast-path scale, the limit itself and a huge one (both generic).
    let m = fp8_matrix(8, 64, (8, 32), 6, false);
    for big in [
        f32::from_bits(2.0f32.powi(119).to_bits() - 1),
        2.0f32.powi(119),
        2.0f32.powi(125),
    ] {
        for neg in [1.0f32, -1.0] {
            let mut scales = m.scales.as_deref().unwrap().to_vec();
            scales[..4].copy_from_slice(&(neg * big).to_le_bytes());
            let m = Matrix::new(m.format, 8, 64, m.data.clone(), Some(Blob::from_vec(scales))).unwrap();
            check(&m, &FEW_N, &format!("fp8 scale {}", neg * big));
        }
    }
}

#[test]
fn int4_matches_reference() {
    for (i, dtype) in [ScaleDtype::F32, ScaleDtype::Bf16, ScaleDtype::F16]
        .into_iter()
        .enumerate()
    {
        let s = i as u64;
        check(&int4_matrix(5, 32, 32, dtype, s), &ALL_N, "int4 g32");
        check(&int4_matrix(37, 320, 32, dtype, s + 10), &ALL_N, "int4 g32");
        check(&int4_matrix(6, 256, 128, dtype, s + 20), &FEW_N, "int4 g128");
        // Groups that are not a multiple of 16 take the generic path (tails included).
        check(&int4_matrix(7, 40, 8, dtype, s + 30), &FEW_N, "int4 g8");
        check(&int4_matrix(5, 72, 24, dtype, s + 40), &FEW_N, "int4 g24");
    }
    check(
        &int4_matrix(200, 1088, 32, ScaleDtype::Bf16, 77),
        &FEW_N,
        "int4 big",
    );
    // Rows of more than 64 groups: the fused loops widen scales 64 groups at a time.
    for (i, dtype) in [ScaleDtype::Bf16, ScaleDtype::F32].into_iter().enumerate() {
        check(
            &int4_matrix(9, 32 * 141, 32, dtype, 80 + i as u64),
            &FEW_N,
            "int4 long rows",
        );
    }
}

#[test]
fn mxfp4_matches_reference() {
    check(&mxfp4_matrix(5, 32, 32, 1), &ALL_N, "mxfp4 g32");
    check(&mxfp4_matrix(37, 320, 32, 2), &ALL_N, "mxfp4 g32");
    check(&mxfp4_matrix(6, 256, 64, 3), &FEW_N, "mxfp4 g64");
    check(&mxfp4_matrix(7, 30, 2, 4), &FEW_N, "mxfp4 g2");
    check(&mxfp4_matrix(200, 1088, 32, 5), &FEW_N, "mxfp4 big");
    check(&mxfp4_matrix(9, 32 * 141, 32, 6), &FEW_N, "mxfp4 long rows");
}

/// Inputs wide enough that the multi-row path takes them in several row blocks, the last one
/// partial (8192 columns: blocks of 16 to 128 rows, by the L2 size).
#[test]
fn input_row_blocks_match_reference() {
    let ns = [17, 40, 140];
    check(&bf16_matrix(9, 8192, 31), &ns, "bf16 blocked");
    check(&f32_matrix(6, 8200, 32), &ns, "f32 blocked");
    check(&fp8_matrix(9, 8192, (128, 128), 33, false), &ns, "fp8 blocked");
    check(
        &int4_matrix(9, 8192, 32, ScaleDtype::Bf16, 34),
        &ns,
        "int4 blocked",
    );
    check(&mxfp4_matrix(9, 8192, 32, 35), &ns, "mxfp4 blocked");
}

#[test]
fn mxfp4_special_scales_match_reference() {
    check(&mxfp4_special_scales_matrix(), &ALL_N, "mxfp4 special scales");
}

#[test]
fn special_float_weights_match_reference() {
    check(&special_f32_matrix(), &FEW_N, "f32 specials");
}

#[test]
fn zero_sized_shapes() {
    for isa in Isa::available() {
        let m = f32_matrix(4, 0, 1);
        let mut y = vec![f32::NAN; 8];
        matmul_with(isa, &m, &[], 2, &mut y);
        assert!(
            y.iter().all(|v| v.to_bits() == 0),
            "{isa}: empty rows must dot to +0.0"
        );
        let m = f32_matrix(0, 8, 1);
        matmul_with(isa, &m, &[0.0; 16], 2, &mut []);
        let m = f32_matrix(3, 8, 1);
        matmul_with(isa, &m, &[], 0, &mut []);
    }
}

/// Matrices big enough that the dispatcher splits rows over threads even at n = 1.
fn invariance_cases() -> Vec<(&'static str, Matrix)> {
    vec![
        ("f32", f32_matrix(512, 530, 1)),
        ("bf16", bf16_matrix(512, 530, 2)),
        ("fp8", fp8_matrix(520, 530, (128, 128), 3, false)),
        ("int4", int4_matrix(512, 544, 32, ScaleDtype::Bf16, 4)),
        ("mxfp4", mxfp4_matrix(512, 544, 32, 5)),
        ("int4 generic", int4_matrix(512, 520, 8, ScaleDtype::F32, 6)),
    ]
}

#[test]
fn batch_invariance_across_n_and_pools() {
    let n = 9;
    for (label, m) in invariance_cases() {
        let x = patterned(n * m.cols, 7);
        let mut first: Option<Vec<f32>> = None;
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for isa in Isa::available() {
                let mut batch = vec![0.0; n * m.rows];
                pool.install(|| matmul_with(isa, &m, &x, n, &mut batch));
                for i in 0..n {
                    let mut single = vec![0.0; m.rows];
                    pool.install(|| matmul_with(isa, &m, &x[i * m.cols..(i + 1) * m.cols], 1, &mut single));
                    let what = format!("{label} {isa} threads={threads} row {i}");
                    assert_same(&single, &batch[i * m.rows..(i + 1) * m.rows], &what);
                }
                match &first {
                    None => first = Some(batch),
                    Some(f) => assert_same(f, &batch, &format!("{label} {isa} threads={threads} vs first")),
                }
            }
        }
    }
}
