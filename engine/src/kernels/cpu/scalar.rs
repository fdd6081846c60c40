//! Portable fallback: the [`Simd`] operations on a plain `[f32; 16]`, with table decoders
//! (no per-element branches), so it runs on any target and the compiler may auto-vectorise it.
//! Exactness is by construction: every element value comes from the same f32 operations as the
//! reference (`e4m3 / 256` from a table, then one multiply by the pre-scaled block scale).

use std::sync::OnceLock;

use super::driver::{self, Chunk, Outs, Simd};
use super::plan::Plan;
use crate::kernels::LANES;
use crate::kernels::format::{E2M1_VALUES, bf16_to_f32, e4m3_to_f32};

type V = [f32; LANES];

/// The portable ISA (always available).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scalar;

/// `e4m3(b) / 256` for every byte (exact: a power-of-two scaling of a normal f32 range).
fn fp8_table() -> &'static [f32; 256] {
    static TABLE: OnceLock<[f32; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        std::array::from_fn(|b| {
            let v = e4m3_to_f32(b as u8);
            if v.is_nan() { f32::NAN } else { v / 256.0 }
        })
    })
}

/// INT4 values `u - 8` by nibble.
const INT4_VALUES: [f32; 16] = [
    -8., -7., -6., -5., -4., -3., -2., -1., 0., 1., 2., 3., 4., 5., 6., 7.,
];

/// E2M1 values by nibble (bit 3 is the sign; `0x8` is `-0.0`).
fn e2m1_table() -> [f32; 16] {
    std::array::from_fn(|i| {
        if i < 8 {
            E2M1_VALUES[i]
        } else {
            -E2M1_VALUES[i - 8]
        }
    })
}

#[inline(always)]
fn nibbles(b: &[u8], table: &[f32; 16], s: f32) -> V {
    let b = &b[..8];
    std::array::from_fn(|k| {
        let byte = b[k / 2];
        let nib = if k % 2 == 0 { byte & 0x0F } else { byte >> 4 };
        table[nib as usize] * s
    })
}

impl Simd for Scalar {
    type V = V;
    const TILE_ROWS: usize = 2;
    const TILE_XS: usize = 2;

    #[inline(always)]
    fn zero(self) -> V {
        [0.0; LANES]
    }
    #[inline(always)]
    fn splat(self, v: f32) -> V {
        [v; LANES]
    }
    #[inline(always)]
    fn add(self, a: V, b: V) -> V {
        std::array::from_fn(|l| a[l] + b[l])
    }
    #[inline(always)]
    fn fma(self, a: V, b: V, c: V) -> V {
        std::array::from_fn(|l| a[l].mul_add(b[l], c[l]))
    }
    #[inline(always)]
    fn load(self, c: &Chunk) -> V {
        c.0
    }
    #[inline(always)]
    fn store(self, c: &mut Chunk, v: V) {
        c.0 = v;
    }
    #[inline(always)]
    fn keep_first(self, v: V, len: usize) -> V {
        std::array::from_fn(|l| if l < len { v[l] } else { 0.0 })
    }
    #[inline(always)]
    fn reduce(self, mut v: V) -> f32 {
        let mut s = LANES / 2;
        while s > 0 {
            for l in 0..s {
                v[l] += v[l + s];
            }
            s /= 2;
        }
        v[0]
    }
    #[inline(always)]
    fn dec_f32(self, b: &[u8]) -> V {
        let b = &b[..64];
        std::array::from_fn(|l| f32::from_le_bytes([b[4 * l], b[4 * l + 1], b[4 * l + 2], b[4 * l + 3]]))
    }
    #[inline(always)]
    fn dec_bf16(self, b: &[u8]) -> V {
        let b = &b[..32];
        std::array::from_fn(|l| bf16_to_f32(u16::from_le_bytes([b[2 * l], b[2 * l + 1]])))
    }
    #[inline(always)]
    fn fp8_seg(self, s: f32) -> V {
        [s * 256.0; LANES]
    }
    #[inline(always)]
    fn dec_fp8(self, b: &[u8], s256: V) -> V {
        let (b, t) = (&b[..16], fp8_table());
        std::array::from_fn(|l| t[b[l] as usize] * s256[l])
    }
    #[inline(always)]
    fn int4_seg(self, s: f32) -> V {
        [s; LANES]
    }
    #[inline(always)]
    fn dec_int4(self, b: &[u8], s: V) -> V {
        nibbles(b, &INT4_VALUES, s[0])
    }
    #[inline(always)]
    fn mxfp4_seg(self, s: f32) -> V {
        [s; LANES]
    }
    #[inline(always)]
    fn dec_mxfp4(self, b: &[u8], s: V) -> V {
        nibbles(b, &e2m1_table(), s[0])
    }
}

/// Rows `r0..r1` of `p` (see [`driver::run_rows`]).
pub(crate) fn run(p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    driver::run_rows(Scalar, p, x, n, r0, r1, out);
}

/// The bandwidth probe's read loop.
pub(crate) fn read_sum(data: &[u8]) -> f32 {
    driver::read_sum(Scalar, data)
}
