//! AVX-512 (F + BW + VL) implementation of the kernel operations: one zmm register holds the
//! 16 canonical lanes.
//!
//! Decoders, each computing the reference element value with the same single f32 rounding:
//! * BF16 by a 16-bit shift;
//! * FP8 E4M3 by moving the code into an f16 (`(sext(b) << 7) & 0xBF80` is `e4m3 / 256`
//!   exactly, subnormal codes included: f16 subnormals convert exactly and without the microcode
//!   assist that an f32 subnormal operand of a multiply costs) converted with `vcvtph2ps`, times
//!   the block scale pre-multiplied by 256; a segment with a NaN code is found by one compare
//!   per 64 bytes and gets a NaN operand (see `driver::Elem`), so chunks need no NaN patch;
//! * INT4 and MXFP4 by a `vpermps` lookup of the nibble in a 16-entry table pre-multiplied by the
//!   group's scale once per group (`table[u] * s` is the reference's own product). The chunk's
//!   8 bytes are broadcast to every 64-bit lane and lane `q` shifted right by `4 q` (`vpsrlvq`),
//!   which puts nibbles `q` and `q + 8` in the two dwords of lane `q`: a fixed lane order
//!   (`NIBBLE_LANES`) that the input rows share, undone once per output before the reduction.
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

/// Right shift of each 64-bit lane `q` of the broadcast 8 nibble bytes: `4 * q`, which leaves
/// nibble `q` in the low bits of dword `2 q` and nibble `q + 8` in those of dword `2 q + 1`.
const NIBBLE_SHIFTS: [i64; 8] = [0, 4, 8, 12, 16, 20, 24, 28];
/// Canonical lane of each register lane after that shift (see `Simd::NIBBLE_LANES`).
const NIBBLE_LANES: [u8; 16] = [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15];
/// Register lane holding canonical lane `c` (the inverse of [`NIBBLE_LANES`]): `vpermps` index.
const NIBBLE_UNDO: [i32; 16] = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15];
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
    /// `table` times `s`, lane by lane: a group's pre-scaled lookup table.
    #[inline(always)]
    fn scaled_table(self, table: &[f32; 16], s: f32) -> __m512 {
        // SAFETY: the table holds 16 f32 (64 bytes, unaligned load); AVX-512F proven by `self`.
        unsafe { _mm512_mul_ps(_mm512_loadu_ps(table.as_ptr()), _mm512_set1_ps(s)) }
    }

    /// The 16 nibbles of the first 8 bytes of `b` looked up in the pre-scaled table `lut`, in
    /// the [`NIBBLE_LANES`] order: one broadcast load, one shift and one lookup per chunk.
    #[inline(always)]
    fn nibble_lut(self, b: &[u8], lut: __m512) -> __m512 {
        assert!(b.len() >= 8);
        // SAFETY: `b` has at least 8 readable bytes (asserted; one unaligned 8-byte read); the
        // shift table holds 8 i64 (64 bytes); features proven by `self`. `vpermps` reads only
        // the low 4 bits of each dword index, so the shifted qwords need no masking.
        unsafe {
            let q = _mm512_set1_epi64(b.as_ptr().cast::<i64>().read_unaligned());
            let idx = _mm512_srlv_epi64(q, _mm512_loadu_si512(NIBBLE_SHIFTS.as_ptr().cast()));
            _mm512_permutexvar_ps(idx, lut)
        }
    }
}

impl Simd for Avx512 {
    type V = __m512;
    const TILE_ROWS: usize = 4;
    const TILE_XS: usize = 4;
    const WIDE_XS: usize = 8;
    const PANEL_ROWS: usize = 8;
    const PANEL_XS: usize = 3;
    const STREAM_8_ROWS: bool = true;

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
    fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F proven by `self` (`vfmadd` is part of AVX-512F).
        unsafe { _mm512_fmadd_ps(a, b, c) }
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
    const NIBBLE_LANES: [u8; 16] = NIBBLE_LANES;
    #[inline(always)]
    fn nibbles_to_canonical(self, v: __m512) -> __m512 {
        // SAFETY: the index table holds 16 i32 (64 bytes, unaligned load); AVX-512F proven by
        // `self`. Lane `c` of the result is register lane `NIBBLE_UNDO[c]`, canonical lane `c`.
        unsafe { _mm512_permutexvar_ps(_mm512_loadu_si512(NIBBLE_UNDO.as_ptr().cast()), v) }
    }
    #[inline(always)]
    fn keep_first_nibbles(self, v: __m512, len: usize) -> __m512 {
        let mut mask: __mmask16 = 0;
        for (l, &c) in NIBBLE_LANES.iter().enumerate() {
            if usize::from(c) < len {
                mask |= 1 << l;
            }
        }
        // SAFETY: AVX-512F proven by `self`.
        unsafe { _mm512_maskz_mov_ps(mask, v) }
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
    fn reduce8(self, v: &[__m512; 8], out: &mut [f32]) {
        let out = &mut out[..8];
        // SAFETY: AVX-512F/AVX proven by `self`; `out` holds 8 f32 (checked above; unaligned
        // store). Every add pairs lane `l` with lane `l + s` of the same accumulator, `s = 8, 4,
        // 2, 1` in turn, exactly the tree of `reduce`; only which register lanes carry them
        // differs.
        unsafe {
            // s = 8: accumulator 2p in the low 256 bits, 2p + 1 in the high (8 lanes each).
            let mut h = [_mm512_setzero_ps(); 4];
            for (p, hp) in h.iter_mut().enumerate() {
                let (a, b) = (v[2 * p], v[2 * p + 1]);
                let lo = _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b);
                let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b);
                *hp = _mm512_add_ps(lo, hi);
            }
            // s = 4: 128-bit lane q of `f[t]` holds accumulator 4t + q (4 lanes).
            let mut f = [_mm512_setzero_ps(); 2];
            for (t, ft) in f.iter_mut().enumerate() {
                let (a, b) = (h[2 * t], h[2 * t + 1]);
                let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b);
                let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b);
                *ft = _mm512_add_ps(lo, hi);
            }
            // s = 2: lane q holds accumulators q (elements 0, 1) and 4 + q (elements 2, 3).
            let lo = _mm512_shuffle_ps::<0b01_00_01_00>(f[0], f[1]);
            let hi = _mm512_shuffle_ps::<0b11_10_11_10>(f[0], f[1]);
            let t = _mm512_add_ps(lo, hi);
            // s = 1: element 0 of lane q is accumulator q's sum, element 1 accumulator 4 + q's.
            let lo = _mm512_shuffle_ps::<0b10_00_10_00>(t, t);
            let hi = _mm512_shuffle_ps::<0b11_01_11_01>(t, t);
            let u = _mm512_add_ps(lo, hi);
            let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
            let sums = _mm512_castps512_ps256(_mm512_permutexvar_ps(order, u));
            _mm256_storeu_ps(out.as_mut_ptr(), sums);
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
    fn fp8_seg(self, s: f32) -> __m512 {
        self.splat(s * 256.0)
    }
    #[inline(always)]
    fn dec_fp8(self, b: &[u8], s256: __m512) -> __m512 {
        assert!(b.len() >= 16);
        // SAFETY: 16 readable bytes (asserted); unaligned load; AVX2/F16C/AVX-512F/BW/VL proven
        // by `self`. Bits: the sign-extended byte shifted left by 7 puts the magnitude in f16
        // bits 7..13 (exponent field 0EEEE, mantissa MMM0000000 = e4m3 / 256) and the sign in
        // bits 14 and 15; the mask clears bit 14.
        unsafe {
            let v = _mm_loadu_si128(b.as_ptr().cast());
            let t = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(v));
            let h = _mm256_and_si256(t, _mm256_set1_epi16(0xBF80_u16 as i16));
            _mm512_mul_ps(_mm512_cvtph_ps(h), s256)
        }
    }
    #[inline(always)]
    fn fp8_nan_in(self, b: &[u8]) -> bool {
        let mut blocks = b.chunks_exact(64);
        let mut found: __mmask64 = 0;
        for blk in &mut blocks {
            // SAFETY: `blk` has exactly 64 readable bytes (unaligned load); AVX-512F/BW proven by
            // `self`. A code is NaN when its low 7 bits are all set: `code | 0x80 == 0xFF`.
            found |= unsafe {
                let v = _mm512_loadu_si512(blk.as_ptr().cast());
                _mm512_cmpeq_epi8_mask(
                    _mm512_or_si512(v, _mm512_set1_epi8(i8::MIN)),
                    _mm512_set1_epi8(-1),
                )
            };
        }
        found != 0 || blocks.remainder().iter().any(|&c| c & 0x7F == 0x7F)
    }
    #[inline(always)]
    fn int4_seg(self, s: f32) -> __m512 {
        self.scaled_table(&INT4_LUT, s)
    }
    #[inline(always)]
    fn dec_int4(self, b: &[u8], lut: __m512) -> __m512 {
        self.nibble_lut(b, lut)
    }
    #[inline(always)]
    fn mxfp4_seg(self, s: f32) -> __m512 {
        self.scaled_table(&E2M1_LUT, s)
    }
    #[inline(always)]
    fn dec_mxfp4(self, b: &[u8], lut: __m512) -> __m512 {
        self.nibble_lut(b, lut)
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
