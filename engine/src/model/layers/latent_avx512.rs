//! The AVX-512 loops of a latent-attention tile ([`super::latent_attention::TileOps`]): for
//! every value, the operations of the portable loops in the same order, in register tiles.
//!
//! * Scores: the 16-lane sums of 4 positions × 4 heads at once (each lane a chain of
//!   `fma(q, k, acc)`, as `dot16`), then those 16 sums reduced together by
//!   the fixed lane tree ([`reduce16`]: each level's pairs added across registers after shuffles,
//!   instead of one scalar tree per dot product).
//! * Values: 4 heads × 64 latent values held in registers over the tile's positions
//!   (`fma(p, c, acc)` in position order, as the portable loop), so each latent chunk is loaded once
//!   for 4 heads and the accumulators are not written back per position.
//!
//! Lanes past a width that is not a multiple of 16 are masked: never added, never stored, as in
//! the portable loops (which leave them out).
//!
//! Only instantiated under `#[target_feature(enable = "avx512f,fma")]` by
//! `latent_attention::block_partial_avx512`, which runs when the CPU reports AVX-512F.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::latent_attention::{LatentQuery, LatentShape, Partial, TILE, TileOps};

/// Positions and heads of a score tile (their 16 sums fill one reduction). Four by four: 8 loads
/// per 16 fused multiply-adds, where 2 heads by 8 positions took 10; on the Xeon this was
/// measured on, a C replica of the loop ran 25 % faster so (3.7 against 2.95 G FMA/s in L1).
const POS: usize = 4;
const HEADS: usize = 4;
/// Heads and 16-lane chunks of a value tile.
const V_HEADS: usize = 4;
const V_CHUNKS: usize = 4;
/// The most positions of a value run.
const SUB: usize = 32;

/// The AVX-512 [`TileOps`].
pub(super) struct Avx512;

/// The lanes of 16-value chunk `k` that lie below `len`.
#[inline(always)]
fn lanes(len: usize, k: usize) -> __mmask16 {
    let left = len.saturating_sub(16 * k);
    if left >= 16 {
        0xFFFF
    } else {
        ((1u32 << left) - 1) as __mmask16
    }
}

impl TileOps for Avx512 {
    #[inline(always)]
    fn scores(q: &LatentQuery<'_>, t0: usize, width: usize, s: LatentShape, scores: &mut [f32]) {
        // Positions outer, heads inner: a group of POS keys stays in L1 while every head group
        // reads it, where a head group sweeping the whole tile (73 KiB at DeepSeek-V3's widths)
        // read it from L2 once per group.
        let mut j0 = 0;
        while j0 < width {
            let (mut lat, mut rope) = ([std::ptr::null(); POS], [std::ptr::null(); POS]);
            for i in 0..POS {
                // Positions past the tile repeat its last one (their sums are dropped).
                let (l, r) = q.keys.key(t0 + (j0 + i).min(width - 1), s);
                (lat[i], rope[i]) = (l.as_ptr(), r.as_ptr());
            }
            let n = (width - j0).min(POS);
            let mut h0 = 0;
            while h0 < s.heads {
                // Missing heads repeat the last; their sums are computed and dropped.
                let hs: [usize; HEADS] = std::array::from_fn(|i| (h0 + i).min(s.heads - 1));
                let qa = hs.map(|h| q.q_abs[h * s.latent..].as_ptr());
                let qr = hs.map(|h| q.q_rope[h * s.rope..].as_ptr());
                let mut out = [0.0f32; 16];
                // SAFETY: the CPU has AVX-512F (see the module docs); every pointer is the start
                // of a `latent` or `rope` run of values, and the loads stop at that length.
                unsafe {
                    let dots = std::hint::black_box(DOTS);
                    let dl = dots(qa, &lat, s.latent);
                    let dr = dots(qr, &rope, s.rope);
                    let v = _mm512_mul_ps(_mm512_add_ps(dl, dr), _mm512_set1_ps(s.scale));
                    _mm512_storeu_ps(out.as_mut_ptr(), v);
                }
                for (hh, &h) in hs.iter().enumerate().take(s.heads - h0) {
                    scores[h * TILE + j0..][..n].copy_from_slice(&out[hh * POS..][..n]);
                }
                h0 += HEADS;
            }
            j0 += POS;
        }
    }

    #[inline(always)]
    fn values(
        q: &LatentQuery<'_>,
        t0: usize,
        width: usize,
        s: LatentShape,
        probs: &[f32],
        part: &mut Partial,
    ) {
        for h in 0..s.heads {
            for &p in &probs[h * TILE..][..width] {
                part.sum[h] += p;
            }
        }
        // Runs of positions whose latents stay in L1 while every (chunk group, head group) reads
        // them. A whole 64-position tile did not: rows are `4 · latent` bytes apart, so one chunk
        // group's 4 lines per row fall into `4096 / latent` of L1's 64 sets. Runs of
        // `8192 / latent` positions put 8 lines in each of those sets (of 12 ways): measured
        // best of 16 and 32 at both 256 values (32) and 512 (16).
        let sub = (8192 / s.latent.max(1)).clamp(8, SUB);
        let mut j0 = 0;
        while j0 < width {
            let n = (width - j0).min(sub);
            let mut lat = [std::ptr::null(); SUB];
            for (j, l) in lat.iter_mut().enumerate().take(n) {
                *l = q.keys.key(t0 + j0 + j, s).0.as_ptr();
            }
            let run = Run { lat: &lat[..n], j0 };
            let mut c0 = 0;
            while 16 * c0 < s.latent {
                let mut h0 = 0;
                while h0 < s.heads {
                    let full = h0 + V_HEADS <= s.heads && 16 * (c0 + V_CHUNKS) <= s.latent;
                    // SAFETY: the CPU has AVX-512F; `value_tile` masks every access to the heads
                    // below `s.heads` and the values below `s.latent` (and `full` says no mask
                    // is needed); every pointer of `lat` starts a position's `latent` values.
                    unsafe {
                        if full {
                            value_tile::<true>(&run, s, probs, &mut part.acc, (h0, c0));
                        } else {
                            value_tile::<false>(&run, s, probs, &mut part.acc, (h0, c0));
                        }
                    }
                    h0 += V_HEADS;
                }
                c0 += V_CHUNKS;
            }
            j0 += sub;
        }
    }
}

/// A run of consecutive positions of a tile: their latents, and the first one's index in the
/// tile (its column in `probs`).
struct Run<'a> {
    lat: &'a [*const f32],
    j0: usize,
}

/// [`dots`], called through a pointer the optimiser cannot see into (`black_box`), so that it
/// stays out of line. Inlined into the tile loop (which `#[inline(never)]` did not prevent: rustc
/// 1.95 left the attribute out of the IR), its sixteen accumulators shared the registers with the
/// softmax's hoisted constants and three were spilled to the stack on every chunk. Out of line,
/// the attention microbenchmark ran 10 % faster. One indirect call per 16 dot products.
type Dots = unsafe fn([*const f32; HEADS], &[*const f32; POS], usize) -> __m512;
const DOTS: Dots = dots;

/// Lane `hh * POS + i`: `dot16(q[hh], k[i])` over `len` values (the lane sums reduced by the
/// fixed tree).
///
/// # Safety
/// AVX-512F; each pointer starts `len` readable values.
#[target_feature(enable = "avx512f")]
unsafe fn dots(q: [*const f32; HEADS], k: &[*const f32; POS], len: usize) -> __m512 {
    // SAFETY: the caller's guarantee.
    reduce16(&unsafe { lane_sums(q, k, len) })
}

/// Per (head `hh`, position `i`), at index `hh * POS + i`: the 16 lane sums of
/// `dot16(q[hh], k[i])` over `len` values.
///
/// # Safety
/// AVX-512F; each pointer starts `len` readable values.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn lane_sums(q: [*const f32; HEADS], k: &[*const f32; POS], len: usize) -> [__m512; 16] {
    let mut acc = [_mm512_setzero_ps(); 16];
    let whole = len / 16;
    for c in 0..whole {
        let o = 16 * c;
        // SAFETY: `o + 16 <= len` (the caller's guarantee covers these loads).
        let qv = q.map(|p| unsafe { _mm512_loadu_ps(p.add(o)) });
        for i in 0..POS {
            // SAFETY: as above.
            let kv = unsafe { _mm512_loadu_ps(k[i].add(o)) };
            for hh in 0..HEADS {
                acc[hh * POS + i] = _mm512_fmadd_ps(qv[hh], kv, acc[hh * POS + i]);
            }
        }
    }
    if 16 * whole < len {
        let (m, o) = (lanes(len, whole), 16 * whole);
        // SAFETY: the masked loads read only the lanes below `len`.
        let qv = q.map(|p| unsafe { _mm512_maskz_loadu_ps(m, p.add(o)) });
        for i in 0..POS {
            // SAFETY: as above.
            let kv = unsafe { _mm512_maskz_loadu_ps(m, k[i].add(o)) };
            for hh in 0..HEADS {
                acc[hh * POS + i] = _mm512_mask3_fmadd_ps(qv[hh], kv, acc[hh * POS + i], m);
            }
        }
    }
    acc
}

/// Lane `i` of the result is `reduce_lanes(v[i])`: the same pairs added at each level of the
/// tree (`acc[l] + acc[l + s]` for s = 8, 4, 2, 1), sixteen sums at a time.
#[target_feature(enable = "avx512f")]
#[inline]
fn reduce16(v: &[__m512; 16]) -> __m512 {
    // s = 8: pair (2i, 2i+1) -> [2i: l + (l+8) | 2i+1: l + (l+8)], l < 8.
    let mut r = [_mm512_setzero_ps(); 8];
    for (i, ri) in r.iter_mut().enumerate() {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        let lo = _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b);
        let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b);
        *ri = _mm512_add_ps(lo, hi);
    }
    // s = 4: 128-bit block b of t[k] holds input 4k + b's four partials.
    let mut t = [_mm512_setzero_ps(); 4];
    for (k, tk) in t.iter_mut().enumerate() {
        let (a, b) = (r[2 * k], r[2 * k + 1]);
        let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b);
        let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b);
        *tk = _mm512_add_ps(lo, hi);
    }
    // s = 2: block b of u[0] = [4b: 2 partials, 4+b: 2], of u[1] = [8+b: 2, 12+b: 2].
    let mut u = [_mm512_setzero_ps(); 2];
    for (k, uk) in u.iter_mut().enumerate() {
        let (a, b) = (t[2 * k], t[2 * k + 1]);
        let lo = _mm512_shuffle_ps::<0b01_00_01_00>(a, b);
        let hi = _mm512_shuffle_ps::<0b11_10_11_10>(a, b);
        *uk = _mm512_add_ps(lo, hi);
    }
    // s = 1: lane 4b + m holds input 4m + b; one permutation puts input i in lane i.
    let lo = _mm512_shuffle_ps::<0b10_00_10_00>(u[0], u[1]);
    let hi = _mm512_shuffle_ps::<0b11_01_11_01>(u[0], u[1]);
    let sums = _mm512_add_ps(lo, hi);
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, sums)
}

/// `acc[h] += p_j · c_j` over the run's positions in order, for heads `h0..h0 + V_HEADS` and
/// chunks `c0..c0 + V_CHUNKS` (masked to the heads and values that exist; `FULL`: all exist,
/// and the masks are left out). The accumulators are loaded and stored per run; each value's
/// chain of fused multiply-adds goes on unchanged across runs.
///
/// # Safety
/// AVX-512F; `acc` holds `heads × latent` values and every pointer of the run starts `latent`
/// values; with `FULL`, `h0 + V_HEADS <= heads` and `16 (c0 + V_CHUNKS) <= latent`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn value_tile<const FULL: bool>(
    run: &Run<'_>,
    s: LatentShape,
    probs: &[f32],
    acc: &mut [f32],
    (h0, c0): (usize, usize),
) {
    let c = s.latent;
    let hn = (s.heads - h0).min(V_HEADS);
    let mut cm = [0 as __mmask16; V_CHUNKS];
    for (k, m) in cm.iter_mut().enumerate() {
        *m = lanes(c, c0 + k);
    }
    let base = acc.as_mut_ptr();
    let mut a = [[_mm512_setzero_ps(); V_CHUNKS]; V_HEADS];
    let mut m = [[0 as __mmask16; V_CHUNKS]; V_HEADS];
    for hh in 0..V_HEADS {
        for k in 0..V_CHUNKS {
            m[hh][k] = if hh < hn { cm[k] } else { 0 };
            // SAFETY: the mask keeps the load to existing heads and values.
            a[hh][k] = unsafe {
                _mm512_maskz_loadu_ps(
                    m[hh][k],
                    base.wrapping_add((h0 + hh.min(hn - 1)) * c + 16 * (c0 + k)),
                )
            };
        }
    }
    let mut prow = [&probs[..0]; V_HEADS];
    for (hh, pr) in prow.iter_mut().enumerate() {
        *pr = &probs[(h0 + hh.min(hn - 1)) * TILE + run.j0..][..run.lat.len()];
    }
    for (j, &lat) in run.lat.iter().enumerate() {
        let mut cv = [_mm512_setzero_ps(); V_CHUNKS];
        for k in 0..V_CHUNKS {
            let at = lat.wrapping_add(16 * (c0 + k));
            // SAFETY: the mask (or `FULL`) keeps the load inside the position's values.
            cv[k] = unsafe {
                if FULL {
                    _mm512_loadu_ps(at)
                } else {
                    _mm512_maskz_loadu_ps(cm[k], at)
                }
            };
        }
        for hh in 0..V_HEADS {
            let p = _mm512_set1_ps(prow[hh][j]);
            for k in 0..V_CHUNKS {
                a[hh][k] = if FULL {
                    _mm512_fmadd_ps(p, cv[k], a[hh][k])
                } else {
                    _mm512_mask3_fmadd_ps(p, cv[k], a[hh][k], m[hh][k])
                };
            }
        }
    }
    for hh in 0..V_HEADS {
        for k in 0..V_CHUNKS {
            // SAFETY: as for the loads.
            unsafe {
                _mm512_mask_storeu_ps(
                    base.wrapping_add((h0 + hh.min(hn - 1)) * c + 16 * (c0 + k)),
                    m[hh][k],
                    a[hh][k],
                )
            };
        }
    }
}
