//! Stored weight formats and the element decode rules (the exact dequantisation definitions).

use crate::error::{Error, Result};
use crate::weights::Blob;

/// Element type of a per-group scale tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleDtype {
    F32,
    Bf16,
    F16,
}

impl ScaleDtype {
    /// Bytes per scale.
    pub fn size(self) -> usize {
        match self {
            ScaleDtype::F32 => 4,
            ScaleDtype::Bf16 | ScaleDtype::F16 => 2,
        }
    }

    /// Scale number `i` of `bytes` as f32 (exact widening).
    #[inline]
    pub fn get(self, bytes: &[u8], i: usize) -> f32 {
        match self {
            ScaleDtype::F32 => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()),
            ScaleDtype::Bf16 => bf16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])),
            ScaleDtype::F16 => half::f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
        }
    }
}

/// How a matrix's bytes encode its elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Little-endian f32, row-major `[rows, cols]`.
    F32,
    /// Little-endian bf16, row-major.
    Bf16,
    /// FP8 E4M3 (`float8_e4m3fn`) row-major with an f32 `weight_scale_inv` multiplier of shape
    /// `[ceil(rows / block_rows), ceil(cols / block_cols)]`:
    /// `W[r, c] = e4m3(w[r, c]) * scale[r / block_rows, c / block_cols]` (one f32 rounding).
    Fp8Block { block_rows: usize, block_cols: usize },
    /// compressed-tensors `pack-quantized` symmetric INT4: `int32 [rows, cols / 8]`, element `c` in
    /// bits `4 * (c % 8)..` of word `c / 8` (LSB first), offset binary (`q = u - 8`), scales
    /// `[rows, cols / group]`: `W[r, c] = (u - 8) * scale[r, c / group]`.
    Int4Group { group: usize, scale: ScaleDtype },
    /// MXFP4 (`mxfp4-pack-quantized`): `u8 [rows, cols / 2]`, low nibble = even column, E2M1
    /// values; E8M0 scale bytes `[rows, cols / group]`: `W[r, c] = e2m1(u) * 2^(E - 127)`
    /// (`E = 255` is NaN per OCP MX).
    Mxfp4 { group: usize },
}

/// A weight matrix `[rows (out), cols (in)]` in its stored format.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    /// Element bytes.
    pub data: Blob,
    /// Scale bytes for scaled formats.
    pub scales: Option<Blob>,
}

impl Matrix {
    /// Build a matrix, checking that `data` and `scales` have exactly the sizes the format needs.
    pub fn new(format: Format, rows: usize, cols: usize, data: Blob, scales: Option<Blob>) -> Result<Self> {
        let (want_data, want_scales) =
            format
                .byte_sizes(rows, cols)
                .map_err(|reason| Error::InvalidArgument {
                    field: "matrix",
                    reason,
                })?;
        let got_scales = scales.as_ref().map(|s| s.len());
        if data.len() != want_data || got_scales != want_scales {
            return Err(Error::InvalidArgument {
                field: "matrix",
                reason: format!(
                    "{format:?} {rows}x{cols} needs {want_data} data bytes and {want_scales:?} scale bytes, got {} and {got_scales:?}",
                    data.len()
                ),
            });
        }
        Ok(Matrix {
            format,
            rows,
            cols,
            data,
            scales,
        })
    }

    /// Rows `range` as a matrix viewing the same bytes (no copy), when the format stores them as
    /// one run: any rows of a per-row format; block FP8 rows that start on a block row and end on
    /// one or at the last row. `None` otherwise.
    pub fn row_block(&self, range: std::ops::Range<usize>) -> Option<Matrix> {
        let unit = match self.format {
            Format::Fp8Block { block_rows, .. } => block_rows,
            _ => 1,
        };
        let aligned =
            range.start.is_multiple_of(unit) && (range.end.is_multiple_of(unit) || range.end == self.rows);
        if range.is_empty() || range.end > self.rows || !aligned {
            return None;
        }
        // One row's data bytes, and one row's (block row's) scale bytes.
        let (row_bytes, unit_scales) = self.format.byte_sizes(1, self.cols).ok()?;
        let data = self.data.slice(range.start * row_bytes..range.end * row_bytes);
        let scales = match (&self.scales, unit_scales) {
            (Some(s), Some(u)) => Some(s.slice(range.start / unit * u..range.end.div_ceil(unit) * u)),
            (None, None) => None,
            _ => return None,
        };
        Matrix::new(self.format, range.len(), self.cols, data, scales).ok()
    }

    /// Bytes read by one pass over the matrix (data plus scales).
    pub fn nbytes(&self) -> usize {
        self.data.len() + self.scales.as_ref().map_or(0, |s| s.len())
    }
}

impl Format {
    /// `(data bytes, scale bytes)` for a `rows x cols` matrix, or why the shape is invalid.
    pub fn byte_sizes(self, rows: usize, cols: usize) -> std::result::Result<(usize, Option<usize>), String> {
        Ok(match self {
            Format::F32 => (rows * cols * 4, None),
            Format::Bf16 => (rows * cols * 2, None),
            Format::Fp8Block {
                block_rows,
                block_cols,
            } => {
                if block_rows == 0 || block_cols == 0 {
                    return Err("FP8 block size must be non-zero".into());
                }
                (
                    rows * cols,
                    Some(rows.div_ceil(block_rows) * cols.div_ceil(block_cols) * 4),
                )
            }
            Format::Int4Group { group, scale } => {
                if group == 0 || !group.is_multiple_of(8) || !cols.is_multiple_of(group) {
                    return Err(format!(
                        "INT4 needs cols ({cols}) divisible by a group ({group}) that is a multiple of 8"
                    ));
                }
                (rows * cols / 2, Some(rows * (cols / group) * scale.size()))
            }
            Format::Mxfp4 { group } => {
                if group == 0 || !group.is_multiple_of(2) || !cols.is_multiple_of(group) {
                    return Err(format!(
                        "MXFP4 needs cols ({cols}) divisible by an even group ({group})"
                    ));
                }
                (rows * cols / 2, Some(rows * (cols / group)))
            }
        })
    }
}

/// bf16 bits to f32 (exact).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// FP8 E4M3 (`float8_e4m3fn`: bias 7, no infinities, `S.1111.111` = NaN) to f32, exact.
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0x0F) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0F && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man * (2.0f32).powi(-9) // subnormal: 2^-6 * m/8
    } else {
        sign * (1.0 + man / 8.0) * (2.0f32).powi(exp - 7)
    }
}

/// E2M1 magnitudes indexed by the low three bits; bit 3 is the sign.
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// FP4 E2M1 nibble to f32 (exact; `0x8` is -0.0).
#[inline]
pub fn e2m1_to_f32(nibble: u8) -> f32 {
    let v = E2M1_VALUES[(nibble & 7) as usize];
    if nibble & 8 != 0 { -v } else { v }
}

/// E8M0 scale byte to f32: `2^(E - 127)`; `E = 0` is 2^-127 (an f32 subnormal), `E = 255` is NaN.
/// Written as selects, so a loop over a row's scales vectorises.
#[inline(always)]
pub fn e8m0_to_f32(e: u8) -> f32 {
    let bits = if e == 0 { 1 << 22 } else { u32::from(e) << 23 }; // E = 0: 2^-127
    f32::from_bits(if e == u8::MAX { f32::NAN.to_bits() } else { bits })
}
