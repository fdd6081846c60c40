//! The loop structure shared by every CPU kernel, written once against the [`Simd`] trait that
//! each ISA file implements (a 16-lane canonical accumulator plus the per-format chunk decoders).
//!
//! * `n == 1`: a fused decode + dot over [`Simd::TILE_ROWS`] weight rows at once (independent
//!   accumulator chains for ILP; [`Simd::STREAM_8_ROWS`] for BF16 and f32 where the register file
//!   holds them), streaming each weight byte exactly once. BF16 and f32 ask for each row's
//!   bytes [`Elem::AHEAD`] ahead (the hardware prefetcher restarts on every row's new page);
//!   the compressed formats prefetch the row group two groups ahead (their decode otherwise
//!   leaves the memory stream idle), and 4-bit formats with groups of 32 take a loop whose
//!   per-group work is one table product per row, with the scales widened 64 groups at a time.
//! * `2 <= n <= 4 * TILE_XS` (verify passes, small batches): the same fused loop over
//!   `TILE_ROWS` weight rows and up to `TILE_XS` input rows in registers; more inputs sweep the
//!   same weight group again while its bytes are still in L1/L2 (memory reads each weight once);
//!   f32 ([`Elem::KBLOCK`]) sweeps the group in k-blocks instead, every input tile per block, so
//!   the memory stream does not idle while later tiles compute.
//! * larger `n` (prefill): the decoded-panel path of [`super::panel`].
//!
//! Both paths perform, for every `(weight row, input row)` pair, exactly the canonical sequence
//! `acc[k % 16] = fma(w[k], x[k], acc[k % 16])` in increasing `k` followed by the fixed reduction
//! tree, so the result never depends on `n`, tiling or threads. The zero-padded tail lanes are
//! part of that sequence (the reference pads its rows the same way).

use super::panel::{ElemPanel, GenericPanel, PanelOps, pack_xs, panel_rows};
use super::plan::{Kind, Plan};
use crate::kernels::LANES;

/// The canonical lane order: register lane `l` holds canonical lane `l`.
pub(crate) const IDENTITY_LANES: [u8; LANES] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

/// 16 f32 values, 64-byte aligned: one canonical chunk of an input row, a decoded weight row or
/// a saved accumulator.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
pub(crate) struct Chunk(pub [f32; LANES]);

/// The operations an ISA provides. `V` holds 16 canonical lanes (one zmm, two ymm, four NEON
/// registers, or an array). `add` rounds each sum to f32; `fma` is IEEE fused multiply-add (one
/// rounding), the canonical accumulation step.
pub(crate) trait Simd: Copy {
    type V: Copy;
    /// Weight rows per register tile (and per fused n = 1 step).
    const TILE_ROWS: usize;
    /// Whether the formats the hardware prefetcher streams (BF16, f32) take 8 weight rows per
    /// fused n = 1 step (where the register file holds them) instead of `TILE_ROWS`.
    const STREAM_8_ROWS: bool = false;
    /// Input rows per register tile of the multi-row path.
    const TILE_XS: usize;
    /// Input rows of the wide tile (2 weight rows x `WIDE_XS` inputs, one decode per weight
    /// chunk) used when `TILE_XS < n <= WIDE_XS`; 0: none (the register file is too small).
    const WIDE_XS: usize = 0;
    /// Weight rows of the multi-row path's panel and register tile: 8 (an 8 x 3 tile, each
    /// input chunk loaded once for 8 weight rows) where the register file holds 24
    /// accumulators, else `TILE_ROWS`.
    const PANEL_ROWS: usize = Self::TILE_ROWS;
    /// Input rows of the multi-row path's register tile (and of its packed input tiles): 3 or
    /// `TILE_XS`.
    const PANEL_XS: usize = Self::TILE_XS;

    fn zero(self) -> Self::V;
    fn splat(self, v: f32) -> Self::V;
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c`, rounded once.
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn load(self, c: &Chunk) -> Self::V;
    fn store(self, c: &mut Chunk, v: Self::V);
    /// `v` with lanes `len..16` set to `+0.0`.
    fn keep_first(self, v: Self::V, len: usize) -> Self::V;
    /// The fixed tree `acc[l] += acc[l + s]`, `s = 8, 4, 2, 1`; returns lane 0.
    fn reduce(self, v: Self::V) -> f32;
    /// [`Simd::reduce`] of 8 accumulators at once, into `out[0..8]` (an ISA with wide
    /// registers pairs the same lanes of several accumulators in one add: each sum is the same
    /// tree, since IEEE addition is commutative).
    #[inline(always)]
    fn reduce8(self, v: &[Self::V; 8], out: &mut [f32]) {
        for (o, &v) in out[..8].iter_mut().zip(v) {
            *o = self.reduce(v);
        }
    }
    /// Canonical lane held by register lane `l` of what the nibble decoders (`dec_int4`,
    /// `dec_mxfp4`) return. An ISA that places nibbles cheaper in another lane order says so
    /// here; the dispatcher then lays the input rows out in the same order, every
    /// multiply-add meets the same operands as in the canonical order, and
    /// [`Simd::nibbles_to_canonical`] restores the order before the reduction tree.
    const NIBBLE_LANES: [u8; LANES] = IDENTITY_LANES;
    /// An accumulator in the nibble decoders' lane order, in canonical order.
    #[inline(always)]
    fn nibbles_to_canonical(self, v: Self::V) -> Self::V {
        v
    }
    /// `v` (in the nibble decoders' lane order) with canonical lanes `len..16` set to `+0.0`.
    #[inline(always)]
    fn keep_first_nibbles(self, v: Self::V, len: usize) -> Self::V {
        self.keep_first(v, len)
    }
    /// Ask for the cache line holding `b[0]` (a hint: no effect on any result; the default
    /// does nothing).
    #[inline(always)]
    fn prefetch(self, _b: &[u8]) {}
    /// Ask for the cache line holding `b[0]` into the L2 cache but not L1 (a hint; the
    /// default does nothing).
    #[inline(always)]
    fn prefetch_l2(self, _b: &[u8]) {}

    /// 16 little-endian f32 from the first 64 bytes of `b`.
    fn dec_f32(self, b: &[u8]) -> Self::V;
    /// 16 bf16 from the first 32 bytes of `b`.
    fn dec_bf16(self, b: &[u8]) -> Self::V;
    /// The FP8 segment operand for block scale `s` (`|s| < 2^119`, see `plan`): `256 * s`.
    fn fp8_seg(self, s: f32) -> Self::V;
    /// Whether the segment `b` holds an E4M3 NaN code (`0x7F`/`0xFF`). An ISA whose `dec_fp8`
    /// patches NaN codes itself keeps this default (`false`: no second scan); one that checks
    /// per segment instead overrides it and decodes without a patch.
    #[inline(always)]
    fn fp8_nan_in(self, _b: &[u8]) -> bool {
        false
    }
    /// 16 E4M3 bytes: `e4m3 * s` (one f32 rounding) from `fp8_seg(s)`. NaN codes give a NaN,
    /// unless this ISA overrides `fp8_nan_in` (then the segment's operand is NaN, see [`Elem`]).
    fn dec_fp8(self, b: &[u8], seg: Self::V) -> Self::V;
    /// The INT4 segment operand for group scale `s` (a splat, or a pre-scaled lookup table).
    fn int4_seg(self, s: f32) -> Self::V;
    /// 16 INT4 nibbles (8 bytes, low nibble first): `(u - 8) * s` from `int4_seg(s)`.
    fn dec_int4(self, b: &[u8], seg: Self::V) -> Self::V;
    /// The MXFP4 segment operand for group scale `s` (a splat, or a pre-scaled lookup table).
    fn mxfp4_seg(self, s: f32) -> Self::V;
    /// 16 E2M1 nibbles (8 bytes, low nibble first): `e2m1 * s` from `mxfp4_seg(s)`.
    fn dec_mxfp4(self, b: &[u8], seg: Self::V) -> Self::V;
}

/// A stored element format: bytes per canonical chunk, how its scale number `i` is read, the
/// per-segment operand made once from the segment's scale and stored bytes, and the chunk
/// decoder.
///
/// FP8: a segment holding a NaN code gets a NaN operand, so all its elements decode to NaN. The
/// row's result is NaN either way (a NaN element makes its lane, and so the sum, NaN; NaN-ness
/// is the contract, not the payload), and decoders may then skip a per-chunk NaN patch.
pub(crate) trait Elem {
    const BYTES: usize;
    /// Whether the fused loops fetch the group of rows two ahead at the rate they read this
    /// one: the compressed formats, whose decode arithmetic otherwise leaves the memory stream
    /// idle. BF16 and f32 lost with it (one row 0.94 -> 0.78 of the old one-stream probe) and
    /// use [`Elem::AHEAD`] instead.
    const PREFETCH: bool = true;
    /// Bytes ahead of the read position that the fused loops ask for in each row they read,
    /// one line per 64 bytes read, continuing into the same row of the next group near a row's
    /// end; 0: none. The hardware prefetcher alone kept the BF16 one-row loop at 76-86 % of
    /// the probe: every row starts a new 4 KiB page, and it needs a few misses on each before
    /// it streams. With 1 KiB ahead: 92-106 % (87-96 % on a second machine of the same kind),
    /// dsv3-bench decode 11.0 -> 13.8 tok/s.
    /// (The compressed formats measured 5-15 % slower with it in place of `PREFETCH`.)
    const AHEAD: usize = 0;
    /// Whether `TILE_XS < n <= WIDE_XS` inputs take the wide tile (2 weight rows, one decode
    /// per chunk for all inputs). Not for BF16 and f32, whose decode is one or two operations:
    /// 4-row tiles swept twice measured BF16 8 rows at 1.45-1.67x one row against 1.59-1.96x.
    const WIDE: bool = true;
    /// Whether `TILE_XS < n <= 4 * TILE_XS` inputs take the k-blocked sweep
    /// ([`fused_kblocked`]) instead of whole-row sweeps. Only for a format without scales (a
    /// k-block may end inside a scale segment, whose operand it does not recompute). f32, all
    /// interleaved runs of 2026-12-05: 8 rows 1.25-1.46x one row -> 1.15-1.29x, 16 rows
    /// 1.89-2.26x -> 1.73-1.99x. BF16 measured the same at 8 rows and 5 % slower at 16: its
    /// ceiling there is its arithmetic, not the memory.
    const KBLOCK: bool = false;
    /// Whether chunks decode through the nibble decoders (see [`Simd::NIBBLE_LANES`]).
    const NIBBLE: bool = false;
    fn scale_at(p: &Plan, i: usize) -> f32;
    fn seg<S: Simd>(s: S, scale: f32, bytes: &[u8]) -> S::V;
    fn decode<S: Simd>(s: S, b: &[u8], seg: S::V) -> S::V;
}

macro_rules! elem {
    ($name:ident, $bytes:expr, |$p:ident, $i:ident| $scale:expr,
     |$s:ident, $f:ident, $sb:ident| $seg:expr, |$b:ident, $sc:ident| $body:expr
     $(, $flag:ident : $ty:ty = $val:expr)*) => {
        #[derive(Debug)]
        pub(crate) struct $name;
        impl Elem for $name {
            const BYTES: usize = $bytes;
            $(const $flag: $ty = $val;)*
            #[inline(always)]
            #[allow(unused_variables)]
            fn scale_at($p: &Plan, $i: usize) -> f32 {
                $scale
            }
            #[inline(always)]
            #[allow(unused_variables)]
            fn seg<S: Simd>($s: S, $f: f32, $sb: &[u8]) -> S::V {
                $seg
            }
            #[inline(always)]
            #[allow(unused_variables)]
            fn decode<S: Simd>($s: S, $b: &[u8], $sc: S::V) -> S::V {
                $body
            }
        }
    };
}
elem!(
    F32E,
    64,
    |p, i| 1.0,
    |s, f, sb| s.zero(),
    |b, sc| s.dec_f32(b),
    PREFETCH: bool = false,
    AHEAD: usize = 2 * STREAM_AHEAD,
    WIDE: bool = false,
    KBLOCK: bool = true
);
elem!(
    Bf16E,
    32,
    |p, i| 1.0,
    |s, f, sb| s.zero(),
    |b, sc| s.dec_bf16(b),
    PREFETCH: bool = false,
    AHEAD: usize = STREAM_AHEAD,
    WIDE: bool = false
);
elem!(
    Fp8E,
    16,
    |p, i| p.fp8_scale(i),
    |s, f, sb| if s.fp8_nan_in(sb) {
        s.splat(f32::NAN)
    } else {
        s.fp8_seg(f)
    },
    |b, sc| s.dec_fp8(b, sc)
);
elem!(
    Int4E,
    8,
    |p, i| p.int4_scale(i),
    |s, f, sb| s.int4_seg(f),
    |b, sc| s.dec_int4(b, sc),
    NIBBLE: bool = true
);
elem!(
    Mxfp4E,
    8,
    |p, i| p.mxfp4_scale(i),
    |s, f, sb| s.mxfp4_seg(f),
    |b, sc| s.dec_mxfp4(b, sc),
    NIBBLE: bool = true
);

/// Where a task's results go: `out[i][r - r0]` is `y[i, r]`.
pub(crate) type Outs<'o, 'y> = &'o mut [&'y mut [f32]];

/// The task interface every ISA entry point forwards to: rows `r0..r1` of `p` against the
/// padded inputs `x`: `n` rows of `ceil(cols / 16)` chunks, one after another, or where
/// [`packed_width`] is `Some(w)`, packed in tiles of `w` rows ([`pack_xs`]).
#[inline(always)]
pub(crate) fn run_rows<S: Simd>(s: S, p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    match p.kind {
        Kind::F32 => rows_elem::<S, F32E>(s, p, x, n, r0, r1, out),
        Kind::Bf16 => rows_elem::<S, Bf16E>(s, p, x, n, r0, r1, out),
        Kind::Fp8 => rows_elem::<S, Fp8E>(s, p, x, n, r0, r1, out),
        Kind::Int4 => rows_elem::<S, Int4E>(s, p, x, n, r0, r1, out),
        Kind::Mxfp4 => rows_elem::<S, Mxfp4E>(s, p, x, n, r0, r1, out),
        Kind::Generic => panel_rows::<S, GenericPanel>(s, p, x, n, r0, r1, out),
    }
}

#[inline(always)]
fn rows_elem<S: Simd, E: Elem>(s: S, p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    if n == 1 {
        let mut r = r0;
        // Rows the hardware prefetcher streams (BF16, f32): more rows per step on a large
        // register file keep more memory streams in flight (BF16 one row 24.7 -> 26.8 GB/s,
        // dsv3-bench decode +2-3 %). The compressed formats keep `TILE_ROWS`: their software
        // prefetch is tuned to it (8 rows measured FP8 at 16.4 GB/s against 18.8).
        while S::STREAM_8_ROWS && !E::PREFETCH && r + 8 <= r1 {
            fused_n::<S, E, 8, 1>(s, p, r, r0, x, true, out);
            r += 8;
        }
        while r + S::TILE_ROWS <= r1 {
            if S::TILE_ROWS == 4 {
                fused_n::<S, E, 4, 1>(s, p, r, r0, x, true, out);
            } else {
                fused_n::<S, E, 2, 1>(s, p, r, r0, x, true, out);
            }
            r += S::TILE_ROWS;
        }
        for r in r..r1 {
            fused_n::<S, E, 1, 1>(s, p, r, r0, x, true, out);
        }
    } else if n <= 4 * S::TILE_XS {
        fused_rows::<S, E>(s, p, x, n, r0, r1, out);
    } else {
        panel_rows::<S, ElemPanel<E>>(s, p, x, n, r0, r1, out);
    }
}

/// Whether a call of `n` input rows on a plan of `kind` takes the multi-row (panel) path, whose
/// inputs the dispatcher packs once for every task: the tile width `w` of [`pack_xs`].
pub(crate) fn packed_width<S: Simd>(kind: Kind, n: usize) -> Option<usize> {
    (kind == Kind::Generic || n > 4 * S::TILE_XS).then_some(S::PANEL_XS)
}

/// `2 <= n <= 4 * TILE_XS` (verify passes of up to 15 drafts, small prefill chunks): the fused
/// path with several input rows. Each weight chunk of a group of `TILE_ROWS` rows is decoded in
/// registers and multiplied into up to `TILE_XS` input rows at once; more inputs take a second
/// sweep over the same group, whose bytes are then still in L1/L2, so each weight byte still
/// comes from memory once. Where the ISA has a wide tile and `n` fits it, groups of 2 rows take
/// all `n` inputs in one sweep, so each chunk is decoded once instead of once per sweep. No
/// decoded panel is written and read back. Rows left over at the end go through the panel path.
#[inline(always)]
fn fused_rows<S: Simd, E: Elem>(s: S, p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    let cpr = p.m.cols.div_ceil(LANES);
    let wide = E::WIDE && n > S::TILE_XS && n <= S::WIDE_XS;
    let (group, per) = if wide {
        (2, S::WIDE_XS)
    } else {
        (S::TILE_ROWS, S::TILE_XS)
    };
    let mut r = r0;
    if E::KBLOCK && n > S::TILE_XS {
        while (S::TILE_ROWS, S::TILE_XS) == (4, 4) && r + 4 <= r1 {
            fused_kblocked::<S, E, 4, 4>(s, p, r, r0, x, n, out);
            r += 4;
        }
        while (S::TILE_ROWS, S::TILE_XS) == (2, 2) && r + 2 <= r1 {
            fused_kblocked::<S, E, 2, 2>(s, p, r, r0, x, n, out);
            r += 2;
        }
    }
    while r + group <= r1 {
        let mut i0 = 0;
        while i0 < n {
            let ni = (n - i0).min(per);
            let xs = &x[i0 * cpr..(i0 + ni) * cpr];
            let outs = &mut out[i0..i0 + ni];
            match (group, ni) {
                (2, 5) => fused_n::<S, E, 2, 5>(s, p, r, r0, xs, i0 == 0, outs),
                (2, 6) => fused_n::<S, E, 2, 6>(s, p, r, r0, xs, i0 == 0, outs),
                (2, 7) => fused_n::<S, E, 2, 7>(s, p, r, r0, xs, i0 == 0, outs),
                (2, 8) => fused_n::<S, E, 2, 8>(s, p, r, r0, xs, i0 == 0, outs),
                (4, 1) => fused_n::<S, E, 4, 1>(s, p, r, r0, xs, i0 == 0, outs),
                (4, 2) => fused_n::<S, E, 4, 2>(s, p, r, r0, xs, i0 == 0, outs),
                (4, 3) => fused_n::<S, E, 4, 3>(s, p, r, r0, xs, i0 == 0, outs),
                (4, _) => fused_n::<S, E, 4, 4>(s, p, r, r0, xs, i0 == 0, outs),
                (2, 1) => fused_n::<S, E, 2, 1>(s, p, r, r0, xs, i0 == 0, outs),
                (_, _) => fused_n::<S, E, 2, 2>(s, p, r, r0, xs, i0 == 0, outs),
            }
            i0 += ni;
        }
        r += group;
    }
    if r < r1 {
        let mut rest: Vec<&mut [f32]> = out.iter_mut().map(|o| &mut o[r - r0..]).collect();
        let mut packed = Vec::new();
        pack_xs(x, n, cpr, S::PANEL_XS, &mut packed);
        panel_rows::<S, ElemPanel<E>>(s, p, &packed, n, r, r1, &mut rest);
    }
}

/// Fused dot of weight rows `r..r + R` against input rows `0..N` (`ceil(cols / 16)` chunks
/// each); results go to `out[i][r - base + j]`. Each weight chunk is decoded once, in registers,
/// for all `N`. `stream`: these rows come from memory (not a second sweep over cached rows), so
/// a streamed format asks for its bytes [`Elem::AHEAD`] ahead.
#[inline(always)]
fn fused_n<S: Simd, E: Elem, const R: usize, const N: usize>(
    s: S,
    p: &Plan,
    r: usize,
    base: usize,
    x: &[Chunk],
    stream: bool,
    out: Outs,
) {
    let cols = p.m.cols;
    let cpr = cols.div_ceil(LANES);
    let (full, tail) = (cols / LANES, cols % LANES);
    // No closures (`array::from_fn`) anywhere in the kernels: a closure is a separate function
    // that does not inherit the caller's `target_feature`s, and LLVM may leave it out of line
    // (a call and a `vzeroupper` per segment), or compile the SIMD inside it to calls.
    let (mut rows, mut sbase) = ([&[][..]; R], [0usize; R]);
    for j in 0..R {
        rows[j] = p.row_bytes(r + j, E::BYTES);
        sbase[j] = p.scale_base(r + j);
    }
    let mut xs = [&[][..]; N];
    for (i, xi) in xs.iter_mut().enumerate() {
        *xi = &x[i * cpr..(i + 1) * cpr];
    }
    // The groups after this one follow it in memory: fetch the one two groups ahead at the rate
    // these rows are read, so later groups start from the cache and the reads of short rows
    // overlap the arithmetic (one group ahead measured FP8 7168 x 2048 at 0.60 of the probe,
    // two at 0.72; the 4-bit formats gained nothing more).
    let ahead = Ahead {
        next: p.span_bytes(r + 2 * R, r + 3 * R, E::BYTES),
        rows: if stream {
            p.span_bytes(r, r + 2 * R, E::BYTES)
        } else {
            &[]
        },
        row_len: cols * E::BYTES / LANES,
    };
    let mut acc = [[s.zero(); N]; R];
    let (mut c0, mut seg) = (0, 0);
    if E::NIBBLE && p.seg_chunks == 2 {
        seg = fused_pairs::<S, E, R, N>(s, p, &rows, &sbase, &xs, full / 2, ahead, &mut acc);
        c0 = 2 * seg;
    }
    while c0 < full {
        let c1 = (c0 + p.seg_chunks).min(full);
        let mut wseg = [&[][..]; R];
        let mut sc = [s.zero(); R];
        for j in 0..R {
            wseg[j] = &rows[j][c0 * E::BYTES..c1 * E::BYTES];
            sc[j] = E::seg(s, E::scale_at(p, sbase[j] + seg), wseg[j]);
        }
        let mut xseg = [&[][..]; N];
        for i in 0..N {
            xseg[i] = &xs[i][c0..c1];
        }
        for k in 0..c1 - c0 {
            chunk_step::<S, E, R, N>(s, &wseg, &sc, &xseg, k, c0, ahead, &mut acc);
        }
        c0 = c1;
        seg += 1;
    }
    if tail > 0 {
        let seg = full / p.seg_chunks;
        let mut w = [s.zero(); R];
        for j in 0..R {
            let sc = E::seg(s, E::scale_at(p, sbase[j] + seg), &rows[j][full * E::BYTES..]);
            w[j] = decode_tail::<S, E>(s, rows[j], full, tail, sc);
        }
        for i in 0..N {
            let xv = s.load(&xs[i][full]);
            for j in 0..R {
                acc[j][i] = s.fma(w[j], xv, acc[j][i]);
            }
        }
    }
    if R == 8 {
        for (i, o) in out.iter_mut().enumerate().take(N) {
            let mut v = [s.zero(); 8];
            for (j, vj) in v.iter_mut().enumerate() {
                *vj = ElemPanel::<E>::canonical(s, acc[j][i]);
            }
            s.reduce8(&v, &mut o[r - base..r - base + 8]);
        }
        return;
    }
    for j in 0..R {
        for i in 0..N {
            out[i][r - base + j] = s.reduce(ElemPanel::<E>::canonical(s, acc[j][i]));
        }
    }
}

/// Chunks per k-block of [`fused_kblocked`]: 2 KiB of an f32 row (1 KiB of a BF16 one), which
/// is [`Elem::AHEAD`] of each, so the first input tile of a block asks for the next block.
const KBLOCK_CHUNKS: usize = 32;

/// `TILE_XS < n <= 4 * TILE_XS` inputs of an [`Elem::KBLOCK`] format (f32): weight rows
/// `r..r + R` are swept in k-blocks of [`KBLOCK_CHUNKS`] chunks, each block by every tile of up
/// to `N` inputs in turn, the accumulators kept in a small array between blocks. The first tile
/// reads the block from memory and asks for the next one; the others read it from L1, while
/// the next block is on its way. (Sweeping whole rows once per tile left the memory idle during
/// every later sweep.) Each accumulator still meets its chunks in increasing `k` and the tail
/// last, as in [`fused_n`], so no bit changes.
#[inline(always)]
fn fused_kblocked<S: Simd, E: Elem, const R: usize, const N: usize>(
    s: S,
    p: &Plan,
    r: usize,
    base: usize,
    x: &[Chunk],
    n: usize,
    out: Outs,
) {
    let cols = p.m.cols;
    let cpr = cols.div_ceil(LANES);
    let (full, tail) = (cols / LANES, cols % LANES);
    let (mut rows, mut sc) = ([&[][..]; R], [s.zero(); R]);
    for j in 0..R {
        rows[j] = p.row_bytes(r + j, E::BYTES);
        sc[j] = E::seg(s, E::scale_at(p, p.scale_base(r + j)), rows[j]);
    }
    let tiles = n.div_ceil(N);
    assert!(tiles <= 4, "the k-blocked sweep takes at most 4 tiles of inputs");
    let mut accs = [[[s.zero(); N]; R]; 4];
    let first = Ahead {
        next: &[],
        rows: p.span_bytes(r, r + 2 * R, E::BYTES),
        row_len: cols * E::BYTES / LANES,
    };
    let later = Ahead { rows: &[], ..first };
    let mut b0 = 0;
    while b0 < full {
        let b1 = (b0 + KBLOCK_CHUNKS).min(full);
        let mut wseg = [&[][..]; R];
        for j in 0..R {
            wseg[j] = &rows[j][b0 * E::BYTES..b1 * E::BYTES];
        }
        for (t, saved) in accs.iter_mut().enumerate().take(tiles) {
            let xt = &x[t * N * cpr..];
            let ahead = if t == 0 { first } else { later };
            match (n - t * N).min(N) {
                m if m == N => block_tile::<S, E, R, N, N>(s, &wseg, &sc, xt, cpr, b0, ahead, saved),
                1 => block_tile::<S, E, R, N, 1>(s, &wseg, &sc, xt, cpr, b0, ahead, saved),
                2 => block_tile::<S, E, R, N, 2>(s, &wseg, &sc, xt, cpr, b0, ahead, saved),
                _ => block_tile::<S, E, R, N, 3>(s, &wseg, &sc, xt, cpr, b0, ahead, saved),
            }
        }
        b0 = b1;
    }
    for (t, acc) in accs.iter_mut().enumerate().take(tiles) {
        let m = (n - t * N).min(N);
        if tail > 0 {
            let mut w = [s.zero(); R];
            for j in 0..R {
                w[j] = decode_tail::<S, E>(s, rows[j], full, tail, sc[j]);
            }
            for i in 0..m {
                let xv = s.load(&x[(t * N + i) * cpr + full]);
                for j in 0..R {
                    acc[j][i] = s.fma(w[j], xv, acc[j][i]);
                }
            }
        }
        for (i, o) in out[t * N..t * N + m].iter_mut().enumerate() {
            for j in 0..R {
                o[r - base + j] = s.reduce(ElemPanel::<E>::canonical(s, acc[j][i]));
            }
        }
    }
}

/// One k-block (`wseg`, from chunk `b0`) of a tile of `M <= N` inputs (`x`: the tile's first
/// input, `cpr` chunks per input) into the tile's saved accumulators.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block_tile<S: Simd, E: Elem, const R: usize, const N: usize, const M: usize>(
    s: S,
    wseg: &[&[u8]; R],
    sc: &[S::V; R],
    x: &[Chunk],
    cpr: usize,
    b0: usize,
    ahead: Ahead,
    saved: &mut [[S::V; N]; R],
) {
    debug_assert!(M <= N);
    let len = wseg[0].len() / E::BYTES;
    let mut acc = [[s.zero(); M]; R];
    let mut xseg = [&[][..]; M];
    for i in 0..M {
        xseg[i] = &x[i * cpr + b0..i * cpr + b0 + len];
        for j in 0..R {
            acc[j][i] = saved[j][i];
        }
    }
    for k in 0..len {
        chunk_step::<S, E, R, M>(s, wseg, sc, &xseg, k, b0, ahead, &mut acc);
    }
    for i in 0..M {
        for j in 0..R {
            saved[j][i] = acc[j][i];
        }
    }
}

/// Segments of scale groups two chunks wide (INT4 and MXFP4 groups of 32 columns):
/// segments `0..nseg` of the rows, every one full. Each row's scales are widened a block at a
/// time ([`Plan::nibble_scales`]) and the segment loop indexes exact-length slices, so a
/// segment costs its decodes and multiply-adds plus one table product per row. Returns the
/// segments done (`nseg`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fused_pairs<S: Simd, E: Elem, const R: usize, const N: usize>(
    s: S,
    p: &Plan,
    rows: &[&[u8]; R],
    sbase: &[usize; R],
    xs: &[&[Chunk]; N],
    nseg: usize,
    ahead: Ahead,
    acc: &mut [[S::V; N]; R],
) -> usize {
    const BLOCK: usize = 64;
    let mut scales = [[0.0f32; BLOCK]; R];
    let mut w = [&[][..]; R];
    for j in 0..R {
        w[j] = &rows[j].as_chunks::<16>().0[..nseg];
    }
    let mut x = [&[][..]; N];
    for i in 0..N {
        x[i] = &xs[i].as_chunks::<2>().0[..nseg];
    }
    let mut b0 = 0;
    while b0 < nseg {
        let len = BLOCK.min(nseg - b0);
        for j in 0..R {
            p.nibble_scales(sbase[j] + b0, &mut scales[j][..len]);
        }
        for seg in b0..b0 + len {
            let mut sc = [s.zero(); R];
            let mut wseg = [&[][..]; R];
            for j in 0..R {
                sc[j] = E::seg(s, scales[j][seg - b0], &[]);
                wseg[j] = &w[j][seg][..];
            }
            let mut xseg = [&[][..]; N];
            for i in 0..N {
                xseg[i] = &x[i][seg][..];
            }
            chunk_step::<S, E, R, N>(s, &wseg, &sc, &xseg, 0, 2 * seg, ahead, acc);
            chunk_step::<S, E, R, N>(s, &wseg, &sc, &xseg, 1, 2 * seg, ahead, acc);
        }
        b0 += len;
    }
    nseg
}

/// [`Elem::AHEAD`] of BF16 (twice it for f32, which reads twice the bytes per chunk): 1 KiB
/// and 2 KiB measured the same.
const STREAM_AHEAD: usize = 1024;

/// What the fused loop over a group of `R` weight rows asks the memory system for ahead of its
/// reads (hints only: no effect on any result).
#[derive(Clone, Copy)]
struct Ahead<'a> {
    /// The group two ahead (rows `r + 2R..r + 3R`), fetched at the rate this group is read
    /// ([`Elem::PREFETCH`] formats).
    next: &'a [u8],
    /// Rows `r..r + 2R` ([`Elem::AHEAD`] formats), `row_len` bytes each; empty on a second
    /// sweep over rows already in the cache.
    rows: &'a [u8],
    row_len: usize,
}

impl Ahead<'_> {
    /// Ask for byte `off` of each of this group's `R` rows; an offset past a row's end continues
    /// in the same row of the next group, so that group's first lines are on their way before
    /// its reads start (the hardware prefetcher needs a few misses on each new page first).
    #[inline(always)]
    fn rows<S: Simd, const R: usize>(self, s: S, off: usize) {
        let (row, at) = if off < self.row_len {
            (0, off)
        } else {
            (R, off - self.row_len)
        };
        for j in 0..R {
            if let Some(b) = self.rows.get((row + j) * self.row_len + at..) {
                s.prefetch(b);
            }
        }
    }
}

/// Chunk `k` of the segment starting at chunk `c0`: decode it in each of the `R` weight rows
/// and multiply-add it into the `N` input rows; ask for the bytes `ahead` says.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn chunk_step<S: Simd, E: Elem, const R: usize, const N: usize>(
    s: S,
    wseg: &[&[u8]; R],
    sc: &[S::V; R],
    xseg: &[&[Chunk]; N],
    k: usize,
    c0: usize,
    ahead: Ahead,
    acc: &mut [[S::V; N]; R],
) {
    let pos = (c0 + k) * E::BYTES;
    if E::AHEAD > 0 && !ahead.rows.is_empty() && pos.is_multiple_of(64) {
        ahead.rows::<S, R>(s, pos + E::AHEAD);
    }
    let at = pos * R;
    let mut line = 0;
    while E::PREFETCH && line < R * E::BYTES {
        if let Some(b) = ahead.next.get(at + line..) {
            s.prefetch(b);
        }
        line += 64;
    }
    let mut w = [s.zero(); R];
    for j in 0..R {
        w[j] = E::decode(s, &wseg[j][k * E::BYTES..], sc[j]);
    }
    for i in 0..N {
        let xv = s.load(&xseg[i][k]);
        for j in 0..R {
            acc[j][i] = s.fma(w[j], xv, acc[j][i]);
        }
    }
}

/// Decode the partial chunk `c` (`len < 16` valid columns) of a row, zero-padded.
#[inline(always)]
pub(super) fn decode_tail<S: Simd, E: Elem>(s: S, row: &[u8], c: usize, len: usize, scale: S::V) -> S::V {
    let mut buf = [0u8; 64];
    let start = c * E::BYTES;
    let nb = row.len() - start;
    buf[..nb].copy_from_slice(&row[start..]);
    let v = E::decode(s, &buf, scale);
    if E::NIBBLE {
        s.keep_first_nibbles(v, len)
    } else {
        s.keep_first(v, len)
    }
}

/// Sum of `data` read as f32 through the ISA's widest loads (the bandwidth probe's inner loop):
/// four streams at once, one per quarter, as the one-row kernels read several weight rows at
/// once. (One stream measured 20-27 GB/s on a Xeon where the f32 kernel read 31-34: the probe
/// understated the memory and overstated every kernel's fraction of it.) Bytes after the last
/// whole 64 of each quarter are not read.
#[inline(always)]
pub(crate) fn read_sum<S: Simd>(s: S, data: &[u8]) -> f32 {
    let quarter = data.len() / 4;
    let (a, rest) = data.split_at(quarter);
    let (b, rest) = rest.split_at(quarter);
    let (c, d) = rest.split_at(quarter);
    let mut acc = [s.zero(); 4];
    let lines = a
        .chunks_exact(64)
        .zip(b.chunks_exact(64))
        .zip(c.chunks_exact(64).zip(d.chunks_exact(64)));
    for ((a, b), (c, d)) in lines {
        acc[0] = s.add(acc[0], s.dec_f32(a));
        acc[1] = s.add(acc[1], s.dec_f32(b));
        acc[2] = s.add(acc[2], s.dec_f32(c));
        acc[3] = s.add(acc[3], s.dec_f32(d));
    }
    let v = s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3]));
    s.reduce(v)
}
