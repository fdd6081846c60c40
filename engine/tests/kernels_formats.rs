//! The element decode rules against hand-computed values (bf16, FP8 E4M3, INT4 pack-quantized,
//! MXFP4 + E8M0, FP8 block scales), checked through `format`'s decoders, the reference
//! `decode_row`, and every available ISA's kernel (a one-hot input row extracts one weight).

use deltafin_engine::kernels::format::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32, e8m0_to_f32};
use deltafin_engine::kernels::{Format, Isa, Matrix, ScaleDtype, matmul_with, reference};
use deltafin_engine::weights::Blob;

fn bits_eq(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Every element of row `r` as the kernel of `isa` sees it: `dot(W[r], e_k)` equals `W[r, k]`
/// (except that a `-0.0` element dots to `+0.0`).
fn kernel_row(isa: Isa, m: &Matrix, r: usize) -> Vec<f32> {
    let mut x = vec![0.0f32; m.cols * m.cols];
    for k in 0..m.cols {
        x[k * m.cols + k] = 1.0;
    }
    let mut y = vec![0.0f32; m.cols * m.rows];
    matmul_with(isa, m, &x, m.cols, &mut y);
    (0..m.cols).map(|k| y[k * m.rows + r]).collect()
}

/// `decode_row` of row `r` equals `want`, and every ISA extracts the same values. A row with a
/// NaN or infinite element dots to NaN against every one-hot input (`NaN * 0`, `inf * 0`).
fn assert_row(m: &Matrix, r: usize, want: &[f32]) {
    let mut got = vec![0.0; m.cols];
    reference::decode_row(m, r, &mut got);
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            bits_eq(g, w),
            "decode_row {:?} r={r} k={k}: got {g:e}, want {w:e}",
            m.format
        );
    }
    let poisoned = want.iter().any(|w| !w.is_finite());
    for isa in Isa::available() {
        for (k, (&g, &w)) in kernel_row(isa, m, r).iter().zip(want).enumerate() {
            let w = if poisoned {
                f32::NAN
            } else if w == 0.0 {
                0.0
            } else {
                w
            }; // never -0.0
            assert!(
                bits_eq(g, w),
                "{isa} {:?} r={r} k={k}: got {g:e}, want {w:e}",
                m.format
            );
        }
    }
}

#[test]
fn bf16_values() {
    assert_eq!(bf16_to_f32(0x3F80), 1.0);
    assert_eq!(bf16_to_f32(0xC000), -2.0);
    assert_eq!(bf16_to_f32(0x3F00), 0.5);
    assert_eq!(bf16_to_f32(0x4049).to_bits(), 0x4049_0000); // 3.140625
    assert_eq!(bf16_to_f32(0x8000).to_bits(), 0x8000_0000); // -0.0
    assert_eq!(bf16_to_f32(0x7F80), f32::INFINITY);
    assert!(bf16_to_f32(0x7FC0).is_nan());
    assert_eq!(bf16_to_f32(0x0001).to_bits(), 0x0001_0000); // a subnormal
    let words: [u16; 5] = [0x3F80, 0xC000, 0x3F00, 0x4049, 0x0001];
    let data: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let m = Matrix::new(Format::Bf16, 1, 5, Blob::from_vec(data), None).unwrap();
    assert_row(&m, 0, &[1.0, -2.0, 0.5, 3.140625, f32::from_bits(0x0001_0000)]);
}

#[test]
fn e4m3_values() {
    assert_eq!(e4m3_to_f32(0x38), 1.0); // exponent 7 = bias
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6)); // smallest normal
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
    assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9)); // largest subnormal
    assert_eq!(e4m3_to_f32(0x7E), 448.0); // largest finite: 2^8 * 1.75
    assert_eq!(e4m3_to_f32(0x40), 2.0);
    assert_eq!(e4m3_to_f32(0x3C), 1.5);
    assert_eq!(e4m3_to_f32(0xB8), -1.0);
    assert_eq!(e4m3_to_f32(0xFE), -448.0);
    assert!(e4m3_to_f32(0x7F).is_nan());
    assert!(e4m3_to_f32(0xFF).is_nan());
    assert_eq!(e4m3_to_f32(0x00).to_bits(), 0);
    assert_eq!(e4m3_to_f32(0x80).to_bits(), 0x8000_0000); // -0.0
}

#[test]
fn e4m3_every_code_through_kernels() {
    // Row 0: all 256 codes with the NaN codes 0x7F/0xFF replaced by 0x00; row 1: all 256 codes.
    // Unit scale: every ISA must see `e4m3(b) * 1.0`.
    let finite: Vec<u8> = (0..=255u8)
        .map(|b| if b & 0x7F == 0x7F { 0 } else { b })
        .collect();
    let data: Vec<u8> = finite.iter().copied().chain(0..=255u8).collect();
    let scales = Blob::from_vec(1.0f32.to_le_bytes().to_vec());
    let format = Format::Fp8Block {
        block_rows: 2,
        block_cols: 256,
    };
    let m = Matrix::new(format, 2, 256, Blob::from_vec(data), Some(scales)).unwrap();
    assert_row(&m, 0, &finite.iter().map(|&b| e4m3_to_f32(b)).collect::<Vec<_>>());
    assert_row(&m, 1, &(0..=255u8).map(e4m3_to_f32).collect::<Vec<_>>());
}

#[test]
fn fp8_scale_block_boundary() {
    // 3 x 20 with 2 x 16 blocks: scales [[0.5, 2], [-4, 0.25]] (row blocks 0..2, 2..3; column
    // blocks 0..16, 16..20). Every element is 0x38 (1.0), so W[r, c] is the block's scale.
    let scales: Vec<u8> = [0.5f32, 2.0, -4.0, 0.25]
        .iter()
        .flat_map(|s| s.to_le_bytes())
        .collect();
    let format = Format::Fp8Block {
        block_rows: 2,
        block_cols: 16,
    };
    let m = Matrix::new(
        format,
        3,
        20,
        Blob::from_vec(vec![0x38; 60]),
        Some(Blob::from_vec(scales)),
    )
    .unwrap();
    let row = |a: f32, b: f32| -> Vec<f32> { (0..20).map(|c| if c < 16 { a } else { b }).collect() };
    assert_row(&m, 0, &row(0.5, 2.0));
    assert_row(&m, 1, &row(0.5, 2.0));
    assert_row(&m, 2, &row(-4.0, 0.25));
}

#[test]
fn fp8_scale_is_one_rounding_of_the_product() {
    // 0x39 = 1.125; scale 0.1f32: the element is the f32 product, rounded once.
    let s = 0.1f32;
    let scales = Blob::from_vec(s.to_le_bytes().to_vec());
    let format = Format::Fp8Block {
        block_rows: 1,
        block_cols: 16,
    };
    let m = Matrix::new(format, 1, 16, Blob::from_vec(vec![0x39; 16]), Some(scales)).unwrap();
    assert_row(&m, 0, &[1.125f32 * s; 16]);
}

#[test]
fn int4_values_and_packing() {
    // Word 0: nibbles 0..7 in LSB-first order; word 1: nibbles 8..15. u = 0 -> -8 s, 15 -> 7 s.
    let words: [u32; 4] = [0x7654_3210, 0xFEDC_BA98, 0x0000_000F, 0x8000_0008];
    let data: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let scales: Vec<u8> = [0.5f32, -0.25].iter().flat_map(|s| s.to_le_bytes()).collect();
    let format = Format::Int4Group {
        group: 16,
        scale: ScaleDtype::F32,
    };
    let m = Matrix::new(format, 1, 32, Blob::from_vec(data), Some(Blob::from_vec(scales))).unwrap();
    let mut want: Vec<f32> = (0..16).map(|u| (u - 8) as f32 * 0.5).collect();
    assert_eq!((want[0], want[15]), (-4.0, 3.5)); // u = 0 -> -8 s, u = 15 -> 7 s
    let mut second = [-8i32; 16];
    second[0] = 7; // word 2: element 16 has u = 15
    second[8] = 0; // word 3: element 24 has u = 8
    second[15] = 0; // word 3: element 31 has u = 8 (the top nibble)
    want.extend(second.iter().map(|&q| q as f32 * -0.25));
    assert_row(&m, 0, &want);
}

#[test]
fn int4_scale_dtypes() {
    // bf16 0x4000 = 2.0 and f16 0x3800 = 0.5 scales; element u = 9 -> q = 1.
    for (dtype, bytes, s) in [
        (ScaleDtype::Bf16, 0x4000u16, 2.0f32),
        (ScaleDtype::F16, 0x3800, 0.5),
    ] {
        let format = Format::Int4Group {
            group: 16,
            scale: dtype,
        };
        let data = Blob::from_vec(vec![0x99; 8]);
        let m = Matrix::new(
            format,
            1,
            16,
            data,
            Some(Blob::from_vec(bytes.to_le_bytes().to_vec())),
        )
        .unwrap();
        assert_row(&m, 0, &[s; 16]);
    }
}

#[test]
fn e2m1_and_e8m0_values() {
    let want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    for (nib, &v) in want.iter().enumerate() {
        assert_eq!(e2m1_to_f32(nib as u8), v);
        assert_eq!(e2m1_to_f32(nib as u8 | 8), -v);
    }
    assert_eq!(e2m1_to_f32(0x8).to_bits(), 0x8000_0000); // -0.0
    assert_eq!(e8m0_to_f32(127), 1.0);
    assert_eq!(e8m0_to_f32(128), 2.0);
    assert_eq!(e8m0_to_f32(126), 0.5);
    assert_eq!(e8m0_to_f32(1), 2f32.powi(-126));
    assert_eq!(e8m0_to_f32(0).to_bits(), 0x0040_0000); // 2^-127, an f32 subnormal
    assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
    assert!(e8m0_to_f32(255).is_nan());
}

#[test]
fn mxfp4_nibble_order_and_scales() {
    // Byte 0x71: low nibble 1 (0.5) is column 0, high nibble 7 (6.0) is column 1; 0x8F: 0xF (-6)
    // then 0x8 (-0.0). Row 0 has scale 127 (1.0), row 1 scale 0 (2^-127), row 2 scale 255 (NaN).
    let mut bytes = vec![0x71, 0x8F, 0x32, 0xA4];
    bytes.extend([0u8; 4]);
    let data: Vec<u8> = [bytes.clone(), bytes.clone(), bytes].concat();
    let m = Matrix::new(
        Format::Mxfp4 { group: 16 },
        3,
        16,
        Blob::from_vec(data),
        Some(Blob::from_vec(vec![127, 0, 255])),
    )
    .unwrap();
    let mut row: Vec<f32> = vec![0.5, 6.0, -6.0, -0.0, 1.0, 1.5, 2.0, -1.0];
    row.extend([0.0; 8]);
    assert_row(&m, 0, &row);
    let tiny = f32::from_bits(0x0040_0000);
    assert_row(&m, 1, &row.iter().map(|v| v * tiny).collect::<Vec<_>>());
    assert_eq!((0.5 * tiny).to_bits(), 0x0020_0000); // exact: 2^-128
    assert_row(&m, 2, &[f32::NAN; 16]);
}
