//! The scalar reference kernels: the definition every optimised kernel is tested against
//! bit-for-bit. Deliberately simple; never optimised.

use super::LANES;
use super::format::{Format, Matrix, bf16_to_f32, e2m1_to_f32, e4m3_to_f32, e8m0_to_f32};

/// Decode row `r` of `m` into `out` (`out.len() == m.cols`) by the exact element rules.
pub fn decode_row(m: &Matrix, r: usize, out: &mut [f32]) {
    assert_eq!(out.len(), m.cols);
    let cols = m.cols;
    let data = &m.data[..];
    match m.format {
        // Whole-row slices rather than per-element indexing: the same values, in loops that
        // vectorise (the MLA layer decodes `kv_b_proj` on every pass).
        Format::F32 => {
            let row = &data[4 * r * cols..4 * (r + 1) * cols];
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Format::Bf16 => {
            let row = &data[2 * r * cols..2 * (r + 1) * cols];
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        Format::Fp8Block {
            block_rows,
            block_cols,
        } => {
            let scales = m.scales.as_deref().expect("fp8 scales");
            let scale_cols = cols.div_ceil(block_cols);
            for (c, o) in out.iter_mut().enumerate() {
                let s = f32::from_le_bytes(
                    scales[4 * ((r / block_rows) * scale_cols + c / block_cols)..][..4]
                        .try_into()
                        .unwrap(),
                );
                *o = e4m3_to_f32(data[r * cols + c]) * s;
            }
        }
        Format::Int4Group { group, scale } => {
            let scales = m.scales.as_deref().expect("int4 scales");
            for (c, o) in out.iter_mut().enumerate() {
                let word = (r * cols + c) / 8;
                let bytes = &data[4 * word..4 * word + 4];
                let u = (u32::from_le_bytes(bytes.try_into().unwrap()) >> (4 * (c % 8))) & 0xF;
                *o = (u as i32 - 8) as f32 * scale.get(scales, r * (cols / group) + c / group);
            }
        }
        Format::Mxfp4 { group } => {
            let scales = m.scales.as_deref().expect("mxfp4 scales");
            for (c, o) in out.iter_mut().enumerate() {
                let byte = data[(r * cols + c) / 2];
                let nibble = if c % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                *o = e2m1_to_f32(nibble) * e8m0_to_f32(scales[r * (cols / group) + c / group]);
            }
        }
    }
}

/// The canonical 16-lane dot product (see the module docs of `kernels`).
pub fn dot(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let mut acc = [0.0f32; LANES];
    let padded = w.len().div_ceil(LANES) * LANES;
    for k in 0..padded {
        let (a, b) = if k < w.len() { (w[k], x[k]) } else { (0.0, 0.0) };
        acc[k % LANES] = a.mul_add(b, acc[k % LANES]);
    }
    reduce_lanes(&mut acc)
}

/// The fixed reduction tree over the 16 lanes.
#[inline]
pub fn reduce_lanes(acc: &mut [f32; LANES]) -> f32 {
    let mut s = LANES / 2;
    while s > 0 {
        for l in 0..s {
            acc[l] += acc[l + s];
        }
        s /= 2;
    }
    acc[0]
}

/// Reference multi-row matmul: `y[i * rows + r] = dot(decode(W[r]), x[i])`.
pub fn matmul(m: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    assert_eq!(x.len(), n * m.cols, "x must hold n rows of cols");
    assert_eq!(y.len(), n * m.rows, "y must hold n rows of rows");
    let mut w = vec![0.0f32; m.cols];
    for r in 0..m.rows {
        decode_row(m, r, &mut w);
        for i in 0..n {
            y[i * m.rows + r] = dot(&w, &x[i * m.cols..(i + 1) * m.cols]);
        }
    }
}
