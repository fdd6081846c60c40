//! aarch64 Advanced SIMD (NEON) implementation of the kernel operations: four `float32x4_t`
//! registers hold the 16 canonical lanes. Decoders: BF16 by `shll #16`; FP8 E4M3 by placing the
//! magnitude bits in an f32 (`e4m3 * 2^-120`, an exact power-of-two scaling that may be an f32
//! subnormal) then multiplying by `2^112` (exact) to get `e4m3 / 256`; INT4/MXFP4 by a 16-entry
//! byte-table lookup (`tbl`) of each value's bf16 bits (all these values are exact in bf16).
//!
//! Safety model: a [`Neon`] value exists only after runtime detection of NEON, so the intrinsics
//! called through it are sound; every load reads from a slice whose length is checked first.

#![allow(unsafe_code)]

use std::arch::aarch64::*;

use super::driver::{self, Chunk, Outs, Simd};
use super::plan::Plan;
use crate::kernels::format::E2M1_VALUES;

/// Proof that the CPU supports NEON.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Neon {
    _private: (),
}

impl Neon {
    /// The token, if this CPU has NEON.
    pub fn new() -> Option<Self> {
        std::arch::is_aarch64_feature_detected!("neon").then_some(Neon { _private: () })
    }
}

/// 16 canonical lanes as four 4-lane registers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct V4([float32x4_t; 4]);

/// (high bytes, low bytes) of the bf16 encodings of 16 values.
const fn bf16_tables(v: [f32; 16]) -> ([u8; 16], [u8; 16]) {
    let (mut hi, mut lo) = ([0u8; 16], [0u8; 16]);
    let mut i = 0;
    while i < 16 {
        let b = v[i].to_bits() >> 16;
        hi[i] = (b >> 8) as u8;
        lo[i] = b as u8;
        i += 1;
    }
    (hi, lo)
}

const INT4_TABLES: ([u8; 16], [u8; 16]) = bf16_tables([
    -8., -7., -6., -5., -4., -3., -2., -1., 0., 1., 2., 3., 4., 5., 6., 7.,
]);
const E2M1_TABLES: ([u8; 16], [u8; 16]) = bf16_tables([
    E2M1_VALUES[0],
    E2M1_VALUES[1],
    E2M1_VALUES[2],
    E2M1_VALUES[3],
    E2M1_VALUES[4],
    E2M1_VALUES[5],
    E2M1_VALUES[6],
    E2M1_VALUES[7],
    -E2M1_VALUES[0],
    -E2M1_VALUES[1],
    -E2M1_VALUES[2],
    -E2M1_VALUES[3],
    -E2M1_VALUES[4],
    -E2M1_VALUES[5],
    -E2M1_VALUES[6],
    -E2M1_VALUES[7],
]);

/// `2^112` (exact).
const TWO_POW_112: f32 = 5.192_296_858_534_828e33;

impl Neon {
    /// The 16 bytes of `v` widened to four u32x4 (lane order kept).
    #[inline(always)]
    fn widen(self, v: uint8x16_t) -> [uint32x4_t; 4] {
        // SAFETY: NEON proven by `self`.
        unsafe {
            let lo = vmovl_u8(vget_low_u8(v));
            let hi = vmovl_high_u8(v);
            [
                vmovl_u16(vget_low_u16(lo)),
                vmovl_high_u16(lo),
                vmovl_u16(vget_low_u16(hi)),
                vmovl_high_u16(hi),
            ]
        }
    }

    /// 16 nibbles of the first 8 bytes of `b` through a bf16 byte table, times `s`.
    #[inline(always)]
    fn nibble_lut(self, b: &[u8], t: &([u8; 16], [u8; 16]), s: V4) -> V4 {
        assert!(b.len() >= 8);
        // SAFETY: 8 readable bytes (asserted); the tables hold 16 bytes each; NEON proven.
        unsafe {
            let b8 = vld1_u8(b.as_ptr());
            let z = vzip_u8(vand_u8(b8, vdup_n_u8(0x0F)), vshr_n_u8::<4>(b8));
            let nib = vcombine_u8(z.0, z.1);
            let th = vqtbl1q_u8(vld1q_u8(t.0.as_ptr()), nib);
            let tl = vqtbl1q_u8(vld1q_u8(t.1.as_ptr()), nib);
            let h0 = vreinterpretq_u16_u8(vzip1q_u8(tl, th));
            let h1 = vreinterpretq_u16_u8(vzip2q_u8(tl, th));
            let f = [
                vshll_n_u16::<16>(vget_low_u16(h0)),
                vshll_high_n_u16::<16>(h0),
                vshll_n_u16::<16>(vget_low_u16(h1)),
                vshll_high_n_u16::<16>(h1),
            ];
            V4(std::array::from_fn(|k| {
                vmulq_f32(vreinterpretq_f32_u32(f[k]), s.0[k])
            }))
        }
    }
}

impl Simd for Neon {
    type V = V4;
    const TILE_ROWS: usize = 2;
    const TILE_XS: usize = 2;

    #[inline(always)]
    fn zero(self) -> V4 {
        self.splat(0.0)
    }
    #[inline(always)]
    fn splat(self, v: f32) -> V4 {
        // SAFETY: NEON proven by `self`.
        unsafe { V4([vdupq_n_f32(v); 4]) }
    }
    #[inline(always)]
    fn add(self, a: V4, b: V4) -> V4 {
        // SAFETY: NEON proven by `self`.
        V4(std::array::from_fn(|k| unsafe { vaddq_f32(a.0[k], b.0[k]) }))
    }
    #[inline(always)]
    fn fma(self, a: V4, b: V4, c: V4) -> V4 {
        // SAFETY: NEON proven by `self`. `vfmaq_f32(c, a, b)` is `c + a * b`, rounded once.
        V4(std::array::from_fn(|k| unsafe {
            vfmaq_f32(c.0[k], a.0[k], b.0[k])
        }))
    }
    #[inline(always)]
    fn load(self, c: &Chunk) -> V4 {
        // SAFETY: `Chunk` holds 16 f32; each load reads 4 of them.
        V4(std::array::from_fn(|k| unsafe {
            vld1q_f32(c.0.as_ptr().add(4 * k))
        }))
    }
    #[inline(always)]
    fn store(self, c: &mut Chunk, v: V4) {
        for k in 0..4 {
            // SAFETY: `Chunk` holds 16 f32 and is exclusively borrowed; each store writes 4.
            unsafe { vst1q_f32(c.0.as_mut_ptr().add(4 * k), v.0[k]) }
        }
    }
    #[inline(always)]
    fn keep_first(self, v: V4, len: usize) -> V4 {
        let mut c = Chunk::default();
        self.store(&mut c, v);
        for l in len.min(16)..16 {
            c.0[l] = 0.0;
        }
        self.load(&c)
    }
    #[inline(always)]
    fn reduce(self, v: V4) -> f32 {
        // SAFETY: NEON proven by `self`. Lane `l` is the first operand of every add, as in the
        // reference tree: s = 8 pairs registers (0, 2) and (1, 3), s = 4 adds the results, s = 2
        // adds the halves, s = 1 adds lanes 0 and 1.
        unsafe {
            let s4 = vaddq_f32(vaddq_f32(v.0[0], v.0[2]), vaddq_f32(v.0[1], v.0[3]));
            let s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
            vget_lane_f32::<0>(s2) + vget_lane_f32::<1>(s2)
        }
    }
    #[inline(always)]
    fn dec_f32(self, b: &[u8]) -> V4 {
        assert!(b.len() >= 64);
        // SAFETY: 64 readable bytes (asserted); byte loads have no alignment requirement.
        V4(std::array::from_fn(|k| unsafe {
            vreinterpretq_f32_u8(vld1q_u8(b.as_ptr().add(16 * k)))
        }))
    }
    #[inline(always)]
    fn dec_bf16(self, b: &[u8]) -> V4 {
        assert!(b.len() >= 32);
        // SAFETY: 32 readable bytes (asserted); byte loads have no alignment requirement.
        unsafe {
            let h0 = vreinterpretq_u16_u8(vld1q_u8(b.as_ptr()));
            let h1 = vreinterpretq_u16_u8(vld1q_u8(b.as_ptr().add(16)));
            V4([
                vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h0))),
                vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h0)),
                vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h1))),
                vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h1)),
            ])
        }
    }
    #[inline(always)]
    fn fp8_seg(self, s: f32) -> V4 {
        self.splat(s * 256.0)
    }
    #[inline(always)]
    fn dec_fp8(self, b: &[u8], s256: V4) -> V4 {
        assert!(b.len() >= 16);
        // SAFETY: 16 readable bytes (asserted); NEON proven by `self`. f32 bits
        // (mag << 20) | (sign << 31) encode e4m3 * 2^-120 exactly; * 2^112 is exact.
        unsafe {
            let v = vld1q_u8(b.as_ptr());
            let mag = self.widen(vandq_u8(v, vdupq_n_u8(0x7F)));
            let neg = self.widen(vshrq_n_u8::<7>(v));
            let nan8 = vreinterpretq_s8_u8(vceqq_u8(vandq_u8(v, vdupq_n_u8(0x7F)), vdupq_n_u8(0x7F)));
            let (n16lo, n16hi) = (vmovl_s8(vget_low_s8(nan8)), vmovl_high_s8(nan8));
            let nan = [
                vmovl_s16(vget_low_s16(n16lo)),
                vmovl_high_s16(n16lo),
                vmovl_s16(vget_low_s16(n16hi)),
                vmovl_high_s16(n16hi),
            ];
            V4(std::array::from_fn(|k| {
                let bits = vorrq_u32(vshlq_n_u32::<20>(mag[k]), vshlq_n_u32::<31>(neg[k]));
                let w = vmulq_f32(
                    vmulq_f32(vreinterpretq_f32_u32(bits), vdupq_n_f32(TWO_POW_112)),
                    s256.0[k],
                );
                vbslq_f32(vreinterpretq_u32_s32(nan[k]), vdupq_n_f32(f32::NAN), w)
            }))
        }
    }
    #[inline(always)]
    fn int4_seg(self, s: f32) -> V4 {
        self.splat(s)
    }
    #[inline(always)]
    fn dec_int4(self, b: &[u8], s: V4) -> V4 {
        self.nibble_lut(b, &INT4_TABLES, s)
    }
    #[inline(always)]
    fn mxfp4_seg(self, s: f32) -> V4 {
        self.splat(s)
    }
    #[inline(always)]
    fn dec_mxfp4(self, b: &[u8], s: V4) -> V4 {
        self.nibble_lut(b, &E2M1_TABLES, s)
    }
}

#[target_feature(enable = "neon")]
fn run_entry(tok: Neon, p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    driver::run_rows(tok, p, x, n, r0, r1, out);
}

#[target_feature(enable = "neon")]
fn read_sum_entry(tok: Neon, data: &[u8]) -> f32 {
    driver::read_sum(tok, data)
}

/// Rows `r0..r1` of `p` (see [`driver::run_rows`]).
///
/// # Panics
/// If the CPU lacks NEON (the dispatcher checks first).
pub(crate) fn run(p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    let tok = Neon::new().expect("dispatcher checked NEON availability");
    // SAFETY: `tok` exists, so every feature enabled on `run_entry` is present.
    unsafe { run_entry(tok, p, x, n, r0, r1, out) }
}

/// The bandwidth probe's read loop.
pub(crate) fn read_sum(data: &[u8]) -> f32 {
    let tok = Neon::new().expect("dispatcher checked NEON availability");
    // SAFETY: `tok` exists, so every feature enabled on `read_sum_entry` is present.
    unsafe { read_sum_entry(tok, data) }
}
