//! AVX-512 (F + BW + VL) implementation of the kernel operations: one zmm register holds the
//! 16 canonical lanes. Decoders: BF16 by a 16-bit shift; FP8 E4M3 by moving the 7 magnitude bits
//! into an f16 (`e4m3 / 256` exactly, subnormals included) converted with `vcvtph2ps`, NaN codes
//! patched by a byte compare; INT4 and MXFP4 by `vpermps` lookup of the nibble (`vpermps` reads
//! only the low 4 index bits, so the shifted words need no masking).
//!
//! Safety model: an [`Avx512`] value exists only after runtime detection of every feature used
//! here, so the intrinsics called through it are sound; every load reads from a slice whose
//! length is checked first.

#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::driver::{self, Chunk, Outs, Simd};
use super::plan::Plan;
use crate::kernels::format::E2M1_VALUES;

/// Proof that the CPU supports AVX-512 F/BW/VL (and AVX2/F16C).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512 {
    _private: (),
}

impl Avx512 {
    /// The token, if this CPU has every feature the kernels use.
    pub fn new() -> Option<Self> {
        let ok = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Avx512 { _private: () })
    }
}

/// `n`-th nibble shift for each lane (lane `l` reads bits `4 * (l % 8)` of word `l / 8`).
const NIBBLE_SHIFTS: [i32; 16] = [0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28];
/// Word index for each lane.
const NIBBLE_WORDS: [i32; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
const INT4_LUT: [f32; 16] = [
    -8., -7., -6., -5., -4., -3., -2., -1., 0., 1., 2., 3., 4., 5., 6., 7.,
];
const E2M1_LUT: [f32; 16] = [
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
];

impl Avx512 {
    /// 16 nibbles of the first 8 bytes of `b` looked up in `lut`, times `s`.
    #[inline(always)]
    fn nibble_lut(self, b: &[u8], lut: &[f32; 16], s: __m512) -> __m512 {
        assert!(b.len() >= 8);
        // SAFETY: `b` has at least 8 readable bytes (asserted; `_mm_loadl_epi64` reads 8, unaligned
        // allowed); the constant arrays hold 16 elements (64 bytes); features proven by `self`.
        unsafe {
            let q = _mm512_castsi128_si512(_mm_loadl_epi64(b.as_ptr().cast()));
            let words = _mm512_permutexvar_epi32(_mm512_loadu_si512(NIBBLE_WORDS.as_ptr().cast()), q);
            let idx = _mm512_srlv_epi32(words, _mm512_loadu_si512(NIBBLE_SHIFTS.as_ptr().cast()));
            let v = _mm512_permutexvar_ps(idx, _mm512_loadu_ps(lut.as_ptr()));
            _mm512_mul_ps(v, s)
        }
    }
}

impl Simd for Avx512 {
    type V = __m512;
    const TILE_ROWS: usize = 4;
    const TILE_XS: usize = 4;

    #[inline(always)]
    fn zero(self) -> __m512 {
        // SAFETY: AVX-512F proven by `self`.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, v: f32) -> __m512 {
        // SAFETY: AVX-512F proven by `self`.
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F proven by `self`.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F proven by `self`.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn load(self, c: &Chunk) -> __m512 {
        // SAFETY: `Chunk` is 64 bytes, 64-byte aligned; AVX-512F proven by `self`.
        unsafe { _mm512_load_ps(c.0.as_ptr()) }
    }
    #[inline(always)]
    fn store(self, c: &mut Chunk, v: __m512) {
        // SAFETY: `Chunk` is 64 bytes, 64-byte aligned and exclusively borrowed.
        unsafe { _mm512_store_ps(c.0.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn keep_first(self, v: __m512, len: usize) -> __m512 {
        let mask = ((1u32 << len.min(16)) - 1) as __mmask16;
        // SAFETY: AVX-512F proven by `self`.
        unsafe { _mm512_maskz_mov_ps(mask, v) }
    }
    #[inline(always)]
    fn reduce(self, v: __m512) -> f32 {
        // SAFETY: AVX-512F/AVX proven by `self`. Each step adds lanes `l` and `l + s` with lane
        // `l` as the first operand, exactly the reference tree.
        unsafe {
            let lo = _mm512_castps512_ps256(v);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            let s8 = _mm256_add_ps(lo, hi);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
            _mm_cvtss_f32(s1)
        }
    }
    #[inline(always)]
    fn dec_f32(self, b: &[u8]) -> __m512 {
        assert!(b.len() >= 64);
        // SAFETY: 64 readable bytes (asserted); unaligned load; AVX-512F proven by `self`.
        unsafe { _mm512_loadu_ps(b.as_ptr().cast()) }
    }
    #[inline(always)]
    fn dec_bf16(self, b: &[u8]) -> __m512 {
        assert!(b.len() >= 32);
        // SAFETY: 32 readable bytes (asserted); unaligned load; AVX-512F proven by `self`.
        unsafe {
            let h = _mm256_loadu_si256(b.as_ptr().cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    fn dec_fp8(self, b: &[u8], s256: __m512) -> __m512 {
        assert!(b.len() >= 16);
        // SAFETY: 16 readable bytes (asserted); unaligned load; AVX2/F16C/AVX-512F/BW/VL proven
        // by `self`. Bits: t = b << 7 puts the magnitude in f16 bits 7..13 (exponent field
        // 0EEEE, mantissa MMM0000000 = e4m3 / 256) and the sign at bit 14; adding t & 0x4000
        // carries the sign into bit 15.
        unsafe {
            let v = _mm_loadu_si128(b.as_ptr().cast());
            let t = _mm256_slli_epi16::<7>(_mm256_cvtepu8_epi16(v));
            let h = _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));
            let w = _mm512_mul_ps(_mm512_cvtph_ps(h), s256);
            let nan = _mm_cmpeq_epi8_mask(_mm_or_si128(v, _mm_set1_epi8(i8::MIN)), _mm_set1_epi8(-1));
            _mm512_mask_mov_ps(w, nan, _mm512_set1_ps(f32::NAN))
        }
    }
    #[inline(always)]
    fn dec_int4(self, b: &[u8], s: __m512) -> __m512 {
        self.nibble_lut(b, &INT4_LUT, s)
    }
    #[inline(always)]
    fn dec_mxfp4(self, b: &[u8], s: __m512) -> __m512 {
        self.nibble_lut(b, &E2M1_LUT, s)
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
fn run_entry(tok: Avx512, p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    driver::run_rows(tok, p, x, n, r0, r1, out);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
fn read_sum_entry(tok: Avx512, data: &[u8]) -> f32 {
    driver::read_sum(tok, data)
}

/// Rows `r0..r1` of `p` (see [`driver::run_rows`]).
///
/// # Panics
/// If the CPU lacks AVX-512 (the dispatcher checks first).
pub(crate) fn run(p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    let tok = Avx512::new().expect("dispatcher checked AVX-512 availability");
    // SAFETY: `tok` exists, so every feature enabled on `run_entry` is present.
    unsafe { run_entry(tok, p, x, n, r0, r1, out) }
}

/// The bandwidth probe's read loop.
pub(crate) fn read_sum(data: &[u8]) -> f32 {
    let tok = Avx512::new().expect("dispatcher checked AVX-512 availability");
    // SAFETY: `tok` exists, so every feature enabled on `read_sum_entry` is present.
    unsafe { read_sum_entry(tok, data) }
}
