//! AVX2 + F16C + FMA implementation of the kernel operations: two ymm registers hold the 16
//! canonical lanes (`lo` = lanes 0..8, `hi` = lanes 8..16). Decoders: BF16 by a shift, FP8
//! through an f16 (`vcvtph2ps`) with a NaN patch only when a NaN code is present, INT4 by integer
//! conversion of the nibble, MXFP4 by an 8-entry `vpermps` magnitude table plus the nibble's sign
//! bit.
//!
//! Safety model: an [`Avx2`] value exists only after runtime detection of AVX2, F16C and FMA, so
//! the intrinsics called through it are sound; every load reads from a slice whose length is
//! checked.

#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::driver::{self, Chunk, Outs, Simd};
use super::plan::Plan;
use crate::kernels::format::E2M1_VALUES;

/// Proof that the CPU supports AVX2, F16C and FMA.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2 {
    _private: (),
}

impl Avx2 {
    /// The token, if this CPU has AVX2, F16C and FMA.
    pub fn new() -> Option<Self> {
        let ok = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("fma");
        ok.then_some(Avx2 { _private: () })
    }
}

/// 16 canonical lanes as two 8-lane halves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct V2 {
    lo: __m256,
    hi: __m256,
}

const NIBBLE_SHIFTS: [i32; 8] = [0, 4, 8, 12, 16, 20, 24, 28];

impl Avx2 {
    /// The 8 nibbles of little-endian word `w` as lane indices (upper bits not cleared).
    #[inline(always)]
    fn nibble_idx(self, w: [u8; 4]) -> __m256i {
        // SAFETY: AVX2 proven by `self`; the shift table holds 8 i32 (32 bytes).
        unsafe {
            let v = _mm256_set1_epi32(i32::from_le_bytes(w));
            _mm256_srlv_epi32(v, _mm256_loadu_si256(NIBBLE_SHIFTS.as_ptr().cast()))
        }
    }

    /// `(u - 8) * s` for the 8 nibbles of `w`.
    #[inline(always)]
    fn int4_half(self, w: [u8; 4], s: __m256) -> __m256 {
        // SAFETY: AVX2 proven by `self`.
        unsafe {
            let u = _mm256_and_si256(self.nibble_idx(w), _mm256_set1_epi32(0xF));
            let q = _mm256_sub_ps(_mm256_cvtepi32_ps(u), _mm256_set1_ps(8.0));
            _mm256_mul_ps(q, s)
        }
    }

    /// `e2m1 * s` for the 8 nibbles of `w`.
    #[inline(always)]
    fn mxfp4_half(self, w: [u8; 4], s: __m256) -> __m256 {
        // SAFETY: AVX2 proven by `self`; the value table holds 8 f32 (32 bytes). `vpermps`
        // reads the low 3 index bits (the magnitude); bit 3 shifted to bit 31 is the sign.
        unsafe {
            let idx = self.nibble_idx(w);
            let mag = _mm256_permutevar8x32_ps(_mm256_loadu_ps(E2M1_VALUES.as_ptr()), idx);
            let sign = _mm256_and_si256(_mm256_slli_epi32::<28>(idx), _mm256_set1_epi32(i32::MIN));
            _mm256_mul_ps(_mm256_or_ps(mag, _mm256_castsi256_ps(sign)), s)
        }
    }
}

/// The two little-endian words of an 8-byte nibble chunk.
#[inline(always)]
fn words(b: &[u8]) -> ([u8; 4], [u8; 4]) {
    let b = &b[..8];
    ([b[0], b[1], b[2], b[3]], [b[4], b[5], b[6], b[7]])
}

impl Simd for Avx2 {
    type V = V2;
    const TILE_ROWS: usize = 2;
    const TILE_XS: usize = 2;

    #[inline(always)]
    fn zero(self) -> V2 {
        // SAFETY: AVX proven by `self`.
        unsafe {
            V2 {
                lo: _mm256_setzero_ps(),
                hi: _mm256_setzero_ps(),
            }
        }
    }
    #[inline(always)]
    fn splat(self, v: f32) -> V2 {
        // SAFETY: AVX proven by `self`.
        unsafe {
            V2 {
                lo: _mm256_set1_ps(v),
                hi: _mm256_set1_ps(v),
            }
        }
    }
    #[inline(always)]
    fn add(self, a: V2, b: V2) -> V2 {
        // SAFETY: AVX proven by `self`.
        unsafe {
            V2 {
                lo: _mm256_add_ps(a.lo, b.lo),
                hi: _mm256_add_ps(a.hi, b.hi),
            }
        }
    }
    #[inline(always)]
    fn fma(self, a: V2, b: V2, c: V2) -> V2 {
        // SAFETY: FMA proven by `self`.
        unsafe {
            V2 {
                lo: _mm256_fmadd_ps(a.lo, b.lo, c.lo),
                hi: _mm256_fmadd_ps(a.hi, b.hi, c.hi),
            }
        }
    }
    #[inline(always)]
    fn load(self, c: &Chunk) -> V2 {
        // SAFETY: `Chunk` is 64 bytes, 64-byte aligned (both halves 32-byte aligned).
        unsafe {
            V2 {
                lo: _mm256_load_ps(c.0.as_ptr()),
                hi: _mm256_load_ps(c.0.as_ptr().add(8)),
            }
        }
    }
    #[inline(always)]
    fn store(self, c: &mut Chunk, v: V2) {
        // SAFETY: `Chunk` is 64 bytes, 64-byte aligned and exclusively borrowed.
        unsafe {
            _mm256_store_ps(c.0.as_mut_ptr(), v.lo);
            _mm256_store_ps(c.0.as_mut_ptr().add(8), v.hi);
        }
    }
    #[inline(always)]
    fn keep_first(self, v: V2, len: usize) -> V2 {
        // SAFETY: AVX2 proven by `self`. Lane l is kept when l < len (signed compare of small ints).
        unsafe {
            let n = _mm256_set1_epi32(len as i32);
            let lo = _mm256_cmpgt_epi32(n, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            let hi = _mm256_cmpgt_epi32(n, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15));
            V2 {
                lo: _mm256_and_ps(v.lo, _mm256_castsi256_ps(lo)),
                hi: _mm256_and_ps(v.hi, _mm256_castsi256_ps(hi)),
            }
        }
    }
    #[inline(always)]
    fn reduce(self, v: V2) -> f32 {
        // SAFETY: AVX proven by `self`. Each step adds lanes `l` and `l + s` with lane `l` as the
        // first operand, exactly the reference tree.
        unsafe {
            let s8 = _mm256_add_ps(v.lo, v.hi);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
            _mm_cvtss_f32(s1)
        }
    }
    #[inline(always)]
    fn prefetch_l2(self, b: &[u8]) {
        if !b.is_empty() {
            // SAFETY: a prefetch is a hint that never faults; the address is inside `b`; SSE
            // is part of every x86-64 CPU.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(b.as_ptr().cast()) }
        }
    }
    #[inline(always)]
    fn prefetch(self, b: &[u8]) {
        if !b.is_empty() {
            // SAFETY: a prefetch is a hint that never faults; the address is inside `b`; SSE
            // is part of every x86-64 CPU.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().cast()) }
        }
    }
    #[inline(always)]
    fn dec_f32(self, b: &[u8]) -> V2 {
        assert!(b.len() >= 64);
        // SAFETY: 64 readable bytes (asserted); unaligned loads.
        unsafe {
            let p = b.as_ptr().cast::<f32>();
            V2 {
                lo: _mm256_loadu_ps(p),
                hi: _mm256_loadu_ps(p.add(8)),
            }
        }
    }
    #[inline(always)]
    fn dec_bf16(self, b: &[u8]) -> V2 {
        assert!(b.len() >= 32);
        // SAFETY: 32 readable bytes (asserted); unaligned loads; AVX2 proven by `self`.
        unsafe {
            let p = b.as_ptr().cast::<__m128i>();
            let lo = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)));
            let hi = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(1))));
            V2 {
                lo: _mm256_castsi256_ps(lo),
                hi: _mm256_castsi256_ps(hi),
            }
        }
    }
    #[inline(always)]
    fn fp8_seg(self, s: f32) -> V2 {
        self.splat(s * 256.0)
    }
    #[inline(always)]
    fn dec_fp8(self, b: &[u8], s256: V2) -> V2 {
        assert!(b.len() >= 16);
        // SAFETY: 16 readable bytes (asserted); AVX2/F16C proven by `self`. Bit layout as in
        // the AVX-512 decoder: f16 = (b & 0x7F) << 7 | (b & 0x80) << 8 = e4m3 / 256.
        unsafe {
            let v = _mm_loadu_si128(b.as_ptr().cast());
            let t = _mm256_slli_epi16::<7>(_mm256_cvtepu8_epi16(v));
            let h = _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));
            let lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s256.lo);
            let hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)), s256.hi);
            let nan = _mm_cmpeq_epi8(_mm_or_si128(v, _mm_set1_epi8(i8::MIN)), _mm_set1_epi8(-1));
            if _mm_movemask_epi8(nan) == 0 {
                return V2 { lo, hi };
            }
            let q = _mm256_set1_ps(f32::NAN);
            let mlo = _mm256_castsi256_ps(_mm256_cvtepi8_epi32(nan));
            let mhi = _mm256_castsi256_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(nan)));
            V2 {
                lo: _mm256_blendv_ps(lo, q, mlo),
                hi: _mm256_blendv_ps(hi, q, mhi),
            }
        }
    }
    #[inline(always)]
    fn int4_seg(self, s: f32) -> V2 {
        self.splat(s)
    }
    #[inline(always)]
    fn dec_int4(self, b: &[u8], s: V2) -> V2 {
        let (w0, w1) = words(b);
        V2 {
            lo: self.int4_half(w0, s.lo),
            hi: self.int4_half(w1, s.hi),
        }
    }
    #[inline(always)]
    fn mxfp4_seg(self, s: f32) -> V2 {
        self.splat(s)
    }
    #[inline(always)]
    fn dec_mxfp4(self, b: &[u8], s: V2) -> V2 {
        let (w0, w1) = words(b);
        V2 {
            lo: self.mxfp4_half(w0, s.lo),
            hi: self.mxfp4_half(w1, s.hi),
        }
    }
}

#[target_feature(enable = "avx2,f16c,fma")]
fn run_entry(tok: Avx2, p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    driver::run_rows(tok, p, x, n, r0, r1, out);
}

#[target_feature(enable = "avx2,f16c,fma")]
fn read_sum_entry(tok: Avx2, data: &[u8]) -> f32 {
    driver::read_sum(tok, data)
}

/// Rows `r0..r1` of `p` (see [`driver::run_rows`]).
///
/// # Panics
/// If the CPU lacks AVX2/F16C/FMA (the dispatcher checks first).
pub(crate) fn run(p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    let tok = Avx2::new().expect("dispatcher checked AVX2 availability");
    // SAFETY: `tok` exists, so every feature enabled on `run_entry` is present.
    unsafe { run_entry(tok, p, x, n, r0, r1, out) }
}

/// The bandwidth probe's read loop.
pub(crate) fn read_sum(data: &[u8]) -> f32 {
    let tok = Avx2::new().expect("dispatcher checked AVX2 availability");
    // SAFETY: `tok` exists, so every feature enabled on `read_sum_entry` is present.
    unsafe { read_sum_entry(tok, data) }
}
