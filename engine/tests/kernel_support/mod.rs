//! Deterministic test matrices in every stored format (with edge codes) and the bit-exact
//! comparison, shared by the CPU and CUDA kernel parity tests.

#![allow(dead_code)]

use deltafin_engine::kernels::{Format, Matrix, ScaleDtype};
use deltafin_engine::weights::Blob;

/// splitmix64: deterministic test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// Values of either sign around 1 (so every sum is sensitive to the accumulation order), with
/// zeros, negative zeros, f32 subnormals, tiny and occasional large values mixed in.
pub fn patterned(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..len)
        .map(|_| {
            let u = rng.unit();
            match rng.next() % 64 {
                0 => 0.0,
                1 => -0.0,
                2 => u * 1e-39,
                3 => u * 1e-20,
                4 => u * 3e4,
                5..=8 => u * 1e-3,
                _ => u * 4.0,
            }
        })
        .collect()
}

pub fn scale_bytes(values: &[f32], dtype: ScaleDtype) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| match dtype {
            ScaleDtype::F32 => v.to_le_bytes().to_vec(),
            ScaleDtype::Bf16 => ((v.to_bits() >> 16) as u16).to_le_bytes().to_vec(),
            ScaleDtype::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
        })
        .collect()
}

pub fn f32_matrix(rows: usize, cols: usize, seed: u64) -> Matrix {
    let data: Vec<u8> = patterned(rows * cols, seed)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    Matrix::new(Format::F32, rows, cols, Blob::from_vec(data), None).unwrap()
}

pub fn bf16_matrix(rows: usize, cols: usize, seed: u64) -> Matrix {
    let data: Vec<u8> = patterned(rows * cols, seed)
        .iter()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    Matrix::new(Format::Bf16, rows, cols, Blob::from_vec(data), None).unwrap()
}

/// FP8 with valid codes (no NaN) unless `nan_codes`, scales of either sign around 1e-2.
pub fn fp8_matrix(rows: usize, cols: usize, block: (usize, usize), seed: u64, nan_codes: bool) -> Matrix {
    let mut rng = Rng(seed);
    let data: Vec<u8> = (0..rows * cols)
        .map(|_| {
            let b = rng.byte();
            if !nan_codes && b & 0x7F == 0x7F {
                b & 0xFE
            } else {
                b
            }
        })
        .collect();
    let n_scales = rows.div_ceil(block.0) * cols.div_ceil(block.1);
    let scales: Vec<f32> = (0..n_scales).map(|_| rng.unit() * 2e-2).collect();
    let format = Format::Fp8Block {
        block_rows: block.0,
        block_cols: block.1,
    };
    let scales = Blob::from_vec(scale_bytes(&scales, ScaleDtype::F32));
    Matrix::new(format, rows, cols, Blob::from_vec(data), Some(scales)).unwrap()
}

pub fn int4_matrix(rows: usize, cols: usize, group: usize, dtype: ScaleDtype, seed: u64) -> Matrix {
    let mut rng = Rng(seed);
    let data: Vec<u8> = (0..rows * cols / 2).map(|_| rng.byte()).collect();
    let scales: Vec<f32> = (0..rows * cols / group).map(|_| rng.unit() * 1e-2).collect();
    let scales = Blob::from_vec(scale_bytes(&scales, dtype));
    let format = Format::Int4Group { group, scale: dtype };
    Matrix::new(format, rows, cols, Blob::from_vec(data), Some(scales)).unwrap()
}

pub fn mxfp4_matrix(rows: usize, cols: usize, group: usize, seed: u64) -> Matrix {
    let mut rng = Rng(seed);
    let data: Vec<u8> = (0..rows * cols / 2).map(|_| rng.byte()).collect();
    let scales: Vec<u8> = (0..rows * cols / group)
        .map(|_| 120 + (rng.next() % 15) as u8)
        .collect();
    let format = Format::Mxfp4 { group };
    Matrix::new(
        format,
        rows,
        cols,
        Blob::from_vec(data),
        Some(Blob::from_vec(scales)),
    )
    .unwrap()
}

pub fn assert_same(want: &[f32], got: &[f32], what: &str) {
    assert_eq!(want.len(), got.len());
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        let same = w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan());
        assert!(
            same,
            "{what}: element {i}: reference {w:e} ({:#010x}) vs {g:e} ({:#010x})",
            w.to_bits(),
            g.to_bits()
        );
    }
}

/// `fp8_matrix` with block scales cycling through infinities, NaN, zeros of both signs, a
/// subnormal and an ordinary value (a zero padding lane times an infinite scale would be NaN if
/// a kernel did not zero it).
pub fn fp8_special_scales_matrix(rows: usize, cols: usize, seed: u64) -> Matrix {
    let specials = [f32::INFINITY, f32::NAN, f32::NEG_INFINITY, 0.0, -0.0, 1e-40, 3e-3];
    let m = fp8_matrix(rows, cols, (4, 16), seed, false);
    let scales: Vec<u8> = (0..m.scales.as_ref().unwrap().len() / 4)
        .flat_map(|k| specials[k % specials.len()].to_le_bytes())
        .collect();
    Matrix::new(m.format, rows, cols, m.data.clone(), Some(Blob::from_vec(scales))).unwrap()
}

/// A 9 x 64 MXFP4 matrix whose E8M0 scales include 0 (2^-127, an f32 subnormal), 255 (NaN),
/// 254 (2^127) and 1 (2^-126).
pub fn mxfp4_special_scales_matrix() -> Matrix {
    let m = mxfp4_matrix(9, 64, 32, 6);
    let mut scales = m.scales.as_deref().unwrap().to_vec();
    // Row 0 is all 2^-127 (its products stay tiny, so a wrong widening shows), row 1 holds a
    // NaN scale and the largest one, row 3 the smallest normal one.
    (scales[0], scales[1], scales[3], scales[5], scales[7]) = (0, 0, 255, 254, 1);
    Matrix::new(m.format, 9, 64, m.data.clone(), Some(Blob::from_vec(scales))).unwrap()
}

/// A 21 x 40 F32 matrix with infinities, NaN, f32::MAX, the smallest normal and subnormal, and
/// zeros of both signs mixed into patterned values.
pub fn special_f32_matrix() -> Matrix {
    let specials = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        -0.0,
        0.0,
    ];
    let mut vals = patterned(21 * 40, 5);
    for (i, v) in vals.iter_mut().enumerate().filter(|(i, _)| i % 7 == 3) {
        *v = specials[i % specials.len()];
    }
    let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    Matrix::new(Format::F32, 21, 40, Blob::from_vec(data), None).unwrap()
}

/// Little-endian f32 values.
pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Little-endian bytes of f32 values.
pub fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
