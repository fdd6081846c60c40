//! Per-call classification of a [`Matrix`] for the optimised kernels: which chunk decoder runs
//! (or the generic decode-a-row fallback), how the per-row scale changes along a row ("scale
//! segments"), and the byte slice of each weight row.
//!
//! Invariant: a fast [`Kind`] is chosen only when every 16-column canonical chunk lies inside one
//! scale segment and the SIMD decode rule reproduces the reference element value bit for bit;
//! anything else (odd group sizes, FP8 scales so large that `256 * s` would overflow) is
//! [`Kind::Generic`], which decodes rows with [`reference::decode_row`]. The scale handed to the
//! decoders is the stored one; each ISA turns it into its own per-segment operand once
//! (`Simd::fp8_seg` and friends).

use crate::kernels::LANES;
use crate::kernels::format::{Format, Matrix, ScaleDtype, bf16_to_f32, e8m0_to_f32};
use crate::kernels::reference;

/// Which decoder a plan uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    F32,
    Bf16,
    Fp8,
    Int4,
    Mxfp4,
    /// Rows are decoded by the scalar reference into f32 first.
    Generic,
}

/// How the scale of segment `seg` of row `r` is found.
#[derive(Debug, Clone, Copy)]
enum ScaleRule {
    /// Unscaled formats: the scale operand is unused.
    One,
    /// f32 block scales (ISAs pre-multiply them by 256, see [`FP8_PRESCALE_LIMIT`]).
    Fp8 { block_rows: usize, scale_cols: usize },
    /// One scale per `group` columns of each row.
    Int4 { per_row: usize, dtype: ScaleDtype },
    /// One E8M0 byte per `group` columns of each row.
    Mxfp4 { per_row: usize },
}

/// A matrix prepared for the optimised kernels (cheap to build; borrowed per call).
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub m: &'a Matrix,
    pub kind: Kind,
    data: &'a [u8],
    scales: &'a [u8],
    /// Canonical chunks per scale segment (a whole padded row for unscaled formats).
    pub seg_chunks: usize,
    rule: ScaleRule,
}

/// `2^119`: FP8 scales at or above this magnitude would overflow when an ISA pre-multiplies
/// them by 256 (its decoders produce `e4m3 / 256`); they take the exact generic path.
const FP8_PRESCALE_LIMIT: f32 = f32::from_bits((119 + 127) << 23);

impl<'a> Plan<'a> {
    /// Classify `m`.
    pub fn new(m: &'a Matrix) -> Plan<'a> {
        let data = &m.data[..];
        let scales = m.scales.as_deref().unwrap_or(&[]);
        let whole_row = m.cols.div_ceil(LANES).max(1);
        let (kind, seg_cols, rule) = match m.format {
            Format::F32 => (Kind::F32, whole_row * LANES, ScaleRule::One),
            Format::Bf16 => (Kind::Bf16, whole_row * LANES, ScaleRule::One),
            Format::Fp8Block {
                block_rows,
                block_cols,
            } => {
                let ok = block_cols % LANES == 0 && fp8_scales_prescalable(scales);
                let rule = ScaleRule::Fp8 {
                    block_rows,
                    scale_cols: m.cols.div_ceil(block_cols),
                };
                (if ok { Kind::Fp8 } else { Kind::Generic }, block_cols, rule)
            }
            Format::Int4Group { group, scale } => {
                let rule = ScaleRule::Int4 {
                    per_row: m.cols / group,
                    dtype: scale,
                };
                (
                    if group % LANES == 0 {
                        Kind::Int4
                    } else {
                        Kind::Generic
                    },
                    group,
                    rule,
                )
            }
            Format::Mxfp4 { group } => {
                let rule = ScaleRule::Mxfp4 {
                    per_row: m.cols / group,
                };
                (
                    if group % LANES == 0 {
                        Kind::Mxfp4
                    } else {
                        Kind::Generic
                    },
                    group,
                    rule,
                )
            }
        };
        let seg_chunks = if kind == Kind::Generic {
            whole_row
        } else {
            seg_cols / LANES
        };
        Plan {
            m,
            kind,
            data,
            scales,
            seg_chunks,
            rule,
        }
    }

    /// The stored bytes of weight row `r` (`bytes_per_chunk` bytes per 16 elements).
    #[inline(always)]
    pub fn row_bytes(&self, r: usize, bytes_per_chunk: usize) -> &'a [u8] {
        let len = self.m.cols * bytes_per_chunk / LANES;
        &self.data[r * len..(r + 1) * len]
    }

    /// The stored bytes of rows `r0..r1`, cut at the last row (empty past it): one contiguous
    /// span, which the kernels prefetch while they compute the rows before it.
    #[inline(always)]
    pub fn span_bytes(&self, r0: usize, r1: usize, bytes_per_chunk: usize) -> &'a [u8] {
        let len = self.m.cols * bytes_per_chunk / LANES;
        let end = self.data.len();
        &self.data[(r0 * len).min(end)..(r1 * len).min(end)]
    }

    /// Index of the first scale of row `r` (segment `seg` of the row is scale `base + seg`).
    #[inline(always)]
    pub fn scale_base(&self, r: usize) -> usize {
        match self.rule {
            ScaleRule::One => 0,
            ScaleRule::Fp8 {
                block_rows,
                scale_cols,
            } => (r / block_rows) * scale_cols,
            ScaleRule::Int4 { per_row, .. } | ScaleRule::Mxfp4 { per_row } => r * per_row,
        }
    }

    /// Stored f32 scale number `i` (FP8 block scales, f32 INT4 group scales).
    #[inline(always)]
    pub fn fp8_scale(&self, i: usize) -> f32 {
        let b = &self.scales[4 * i..4 * i + 4];
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// INT4 group scale number `i`, widened exactly to f32. The bf16 and f32 cases are written
    /// out here rather than through `ScaleDtype::get`: that call, even forced inline, measured
    /// 1.9–2.4 GB/s against 3.2–5.0 for INT4 in `bench kernels --cache-hot --threads 1`.
    #[inline(always)]
    pub fn int4_scale(&self, i: usize) -> f32 {
        match self.rule {
            ScaleRule::Int4 {
                dtype: ScaleDtype::Bf16,
                ..
            } => bf16_to_f32(u16::from_le_bytes([self.scales[2 * i], self.scales[2 * i + 1]])),
            ScaleRule::Int4 {
                dtype: ScaleDtype::F32,
                ..
            } => self.fp8_scale(i),
            ScaleRule::Int4 { dtype, .. } => dtype.get(self.scales, i),
            _ => 1.0,
        }
    }

    /// Scales `first..first + out.len()` of a 4-bit format (INT4 or MXFP4), widened exactly to
    /// f32, in one pass over the stored bytes (the fused loops read a row's scales a block at
    /// a time instead of one per segment). Inlined, so that it compiles with the calling ISA's
    /// features and vectorises.
    #[inline(always)]
    pub fn nibble_scales(&self, first: usize, out: &mut [f32]) {
        let n = out.len();
        match self.rule {
            ScaleRule::Int4 {
                dtype: ScaleDtype::Bf16,
                ..
            } => {
                let b = &self.scales[2 * first..2 * (first + n)];
                for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                }
            }
            ScaleRule::Int4 { dtype, .. } => {
                for (k, o) in out.iter_mut().enumerate() {
                    *o = dtype.get(self.scales, first + k);
                }
            }
            ScaleRule::Mxfp4 { .. } => {
                for (o, &e) in out.iter_mut().zip(&self.scales[first..first + n]) {
                    *o = e8m0_to_f32(e);
                }
            }
            ScaleRule::One | ScaleRule::Fp8 { .. } => out.fill(1.0),
        }
    }

    /// MXFP4 group scale number `i` (E8M0).
    #[inline(always)]
    pub fn mxfp4_scale(&self, i: usize) -> f32 {
        e8m0_to_f32(self.scales[i])
    }

    /// Decode row `r` with the reference rule (the [`Kind::Generic`] path).
    pub fn decode_generic(&self, r: usize, out: &mut [f32]) {
        reference::decode_row(self.m, r, out);
    }
}

/// True when `256 * s` is exact for every f32 scale in `bytes` (no finite scale overflows).
fn fp8_scales_prescalable(bytes: &[u8]) -> bool {
    bytes.chunks_exact(4).all(|b| {
        let s = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        !s.is_finite() || s.abs() < FP8_PRESCALE_LIMIT
    })
}
