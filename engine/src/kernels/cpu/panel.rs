//! The multi-row (prefill) path of the CPU kernels, for `n > 4 * TILE_XS` input rows and for
//! the generic fallback: per group of [`Simd::PANEL_ROWS`] weight rows and per k-block of
//! [`KB_CHUNKS`] chunks, the rows are decoded once into an L1-resident f32 panel (chunk-major,
//! the rows interleaved), then register tiles of `PANEL_ROWS x PANEL_XS` (weight rows x input
//! rows) sweep the panel while the next panel's stored bytes are asked for into L2;
//! accumulators persist in a small buffer between k-blocks. The input rows are packed in tiles
//! of `PANEL_XS` rows (chunk-major, one stream per tile) and taken in blocks of half the L2
//! cache ([`super::cache_size::x_block_bytes`]), so the block every weight group sweeps stays in
//! L2 (1024 rows of a 2048-wide input are 8 MiB: streamed from L3 per weight group, they halved
//! the product's rate); each weight row is then decoded once per input block. Eight
//! accumulators are reduced at once ([`Simd::reduce8`]).
//!
//! Every `(weight row, input row)` pair still meets the canonical sequence of [`super::driver`]
//! (`acc[k % 16] = fma(w[k], x[k], acc[k % 16])` in increasing `k`, then the fixed tree): a
//! panel holds exactly the decoded values the fused path multiplies, so the path taken never
//! changes a bit.

use std::cell::RefCell;

use super::driver::{Chunk, Elem, Outs, Simd, decode_tail};
use super::plan::{Kind, Plan};
use crate::kernels::LANES;

/// Canonical chunks per k-block of the multi-row path (512 columns: 4 rows x 2 KiB in L1).
pub(crate) const KB_CHUNKS: usize = 32;

/// A weight row's place in an interleaved panel: stored row `r` as panel row `j` of `rr`,
/// chunks `c0..c0 + kc`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PanelRow {
    r: usize,
    j: usize,
    rr: usize,
    c0: usize,
    kc: usize,
}

/// How the multi-row path decodes a panel and reads an accumulator. A trait rather than
/// function values: a function item passed as `impl Fn` is called through a shim that does not
/// inherit the caller's `target_feature`s, so the decoder's intrinsics compiled to out-of-line
/// calls (about 8 % of a prefill pass).
pub(super) trait PanelOps {
    /// Stored bytes per canonical chunk of a row, for asking ahead for the next panel's bytes;
    /// 0: none (the generic fallback decodes whole rows).
    const BYTES: usize;
    /// Chunks `at.c0..at.c0 + at.kc` of weight row `at.r`, as row `at.j` of an interleaved panel
    /// of `at.rr` rows: chunk `c` goes to `out[(c - c0) * rr + j]`.
    fn decode<S: Simd>(s: S, p: &Plan, at: PanelRow, out: &mut [Chunk]);
    /// An accumulator in canonical lane order.
    fn canonical<S: Simd>(s: S, v: S::V) -> S::V;
}

/// Panels of a format with a vectorised decoder.
pub(super) struct ElemPanel<E>(std::marker::PhantomData<E>);

impl<E: Elem> PanelOps for ElemPanel<E> {
    const BYTES: usize = E::BYTES;
    #[inline(always)]
    fn decode<S: Simd>(s: S, p: &Plan, at: PanelRow, out: &mut [Chunk]) {
        decode_elem::<S, E>(s, p, at, out);
    }

    #[inline(always)]
    fn canonical<S: Simd>(s: S, v: S::V) -> S::V {
        if E::NIBBLE { s.nibbles_to_canonical(v) } else { v }
    }
}

/// Panels decoded by the scalar reference (the generic fallback).
pub(super) struct GenericPanel;

impl PanelOps for GenericPanel {
    const BYTES: usize = 0;
    #[inline(always)]
    fn decode<S: Simd>(s: S, p: &Plan, at: PanelRow, out: &mut [Chunk]) {
        decode_generic(s, p, at, out);
    }

    #[inline(always)]
    fn canonical<S: Simd>(_s: S, v: S::V) -> S::V {
        v
    }
}

/// Decode a weight row into the interleaved panel `out` (the multi-row path; see
/// [`PanelOps::decode`]).
#[inline(always)]
fn decode_elem<S: Simd, E: Elem>(s: S, p: &Plan, at: PanelRow, out: &mut [Chunk]) {
    let PanelRow { r, j, rr, c0, kc } = at;
    let cols = p.m.cols;
    let (full, tail) = (cols / LANES, cols % LANES);
    let row = p.row_bytes(r, E::BYTES);
    let mut c = c0;
    let end = c0 + kc;
    while c < end {
        let seg = c / p.seg_chunks;
        let seg_end = ((seg + 1) * p.seg_chunks).min(end);
        let bytes = &row[c * E::BYTES..(seg_end * E::BYTES).min(row.len())];
        let sc = E::seg(s, E::scale_at(p, p.scale_base(r) + seg), bytes);
        for c in c..seg_end.min(full) {
            let w = E::decode(s, &row[c * E::BYTES..(c + 1) * E::BYTES], sc);
            s.store(&mut out[(c - c0) * rr + j], w);
        }
        if tail > 0 && seg_end > full {
            let v = decode_tail::<S, E>(s, row, full, tail, sc);
            s.store(&mut out[(full - c0) * rr + j], v);
        }
        c = seg_end;
    }
}

/// The generic fallback's panel decoder: the whole row through the scalar reference (its
/// panels span the whole row, so each row is decoded once per input block).
fn decode_generic<S: Simd>(_s: S, p: &Plan, at: PanelRow, out: &mut [Chunk]) {
    let PanelRow { r, j, rr, c0, kc } = at;
    let cols = p.m.cols;
    let mut row = vec![0.0f32; cols];
    p.decode_generic(r, &mut row);
    for (c, src) in row[c0 * LANES..].chunks(LANES).take(kc).enumerate() {
        let o = &mut out[c * rr + j];
        o.0 = [0.0; LANES];
        o.0[..src.len()].copy_from_slice(src);
    }
}

/// Per-thread buffers of the multi-row path: the decoded panel and the accumulators saved
/// between k-blocks.
#[derive(Default)]
struct Scratch {
    panel: Vec<Chunk>,
    accs: Vec<Chunk>,
}

thread_local! {
    /// Per-thread (panel, accumulators) scratch of the multi-row path.
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { panel: Vec::new(), accs: Vec::new() })
    };
}

/// Input rows per block of the multi-row path for rows of `cpr` chunks: whole tiles of `w`
/// rows, at least 16 (so a panel decode serves enough products).
fn x_block_rows(cpr: usize, w: usize) -> usize {
    let rows = super::cache_size::x_block_bytes() / (cpr.max(1) * std::mem::size_of::<Chunk>());
    rows.max(16).next_multiple_of(w)
}

/// Multi-row path over rows `r0..r1`, panels decoded and accumulators read by `P`; `x` holds
/// the `n` input rows packed in tiles of [`Simd::PANEL_XS`] ([`pack_xs`]), taken in blocks of
/// [`x_block_rows`] (each block meets every weight row before the next).
#[inline(always)]
pub(super) fn panel_rows<S: Simd, P: PanelOps>(
    s: S,
    p: &Plan,
    x: &[Chunk],
    n: usize,
    r0: usize,
    r1: usize,
    out: Outs,
) {
    let cpr = p.m.cols.div_ceil(LANES);
    let w = S::PANEL_XS;
    let nb = x_block_rows(cpr, w);
    let mut i0 = 0;
    while i0 < n {
        let ni = nb.min(n - i0);
        let (t0, t1) = (i0 / w, (i0 + ni).div_ceil(w));
        panel_block::<S, P>(
            s,
            p,
            &x[t0 * cpr * w..t1 * cpr * w],
            ni,
            r0,
            r1,
            &mut out[i0..i0 + ni],
        );
        i0 += ni;
    }
}

/// [`panel_rows`] for one block of `n` input rows (packed, see [`pack_xs`]).
#[inline(always)]
fn panel_block<S: Simd, P: PanelOps>(s: S, p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: Outs) {
    let cpr = p.m.cols.div_ceil(LANES);
    let kb = if p.kind == Kind::Generic {
        cpr
    } else {
        KB_CHUNKS.min(cpr)
    };
    // The scratch is taken out of the thread-local rather than used inside a closure: a
    // closure is a separate function that does not inherit the caller's `target_feature`s, so
    // the SIMD tiles inside it would compile to out-of-line intrinsic calls (~10x slower).
    let Scratch { mut panel, mut accs } = SCRATCH.with_borrow_mut(std::mem::take);
    {
        let w = S::PANEL_XS;
        let tiles = n.div_ceil(w);
        panel.clear();
        panel.resize(S::PANEL_ROWS.max(S::TILE_ROWS) * kb, Chunk::default());
        let mut r = r0;
        while r < r1 {
            let rr = panel_group::<S>(r, r1);
            accs.clear();
            accs.resize(tiles * rr * w, Chunk::default());
            let mut c0 = 0;
            while c0 < cpr {
                let kc = kb.min(cpr - c0);
                for j in 0..rr {
                    let at = PanelRow {
                        r: r + j,
                        j,
                        rr,
                        c0,
                        kc,
                    };
                    P::decode(s, p, at, &mut panel[..kc * rr]);
                }
                let blk = Block {
                    w: &panel[..kc * rr],
                    x,
                    cpr,
                    c0,
                    kc,
                    tiles,
                };
                let next = if c0 + kc < cpr {
                    NextPanel::new(p, P::BYTES, r, rr, c0 + kc, kb.min(cpr - c0 - kc))
                } else if r + rr < r1 {
                    NextPanel::new(p, P::BYTES, r + rr, panel_group::<S>(r + rr, r1), 0, kb.min(cpr))
                } else {
                    NextPanel::new(p, 0, r, 0, 0, 0)
                };
                sweep_xs(s, rr, &blk, next, &mut accs);
                c0 += kc;
            }
            // Accumulator (row j, input i) of tile t = i / w is `accs[(t * rr + j) * w + i % w]`.
            let at = |j: usize, i: usize| ((i / w) * rr + j) * w + i % w;
            if rr == 8 {
                for (i, o) in out.iter_mut().enumerate() {
                    let mut v = [s.zero(); 8];
                    for (j, vj) in v.iter_mut().enumerate() {
                        *vj = P::canonical(s, s.load(&accs[at(j, i)]));
                    }
                    s.reduce8(&v, &mut o[r - r0..r - r0 + 8]);
                }
            } else {
                for j in 0..rr {
                    for (i, o) in out.iter_mut().enumerate() {
                        o[r + j - r0] = s.reduce(P::canonical(s, s.load(&accs[at(j, i)])));
                    }
                }
            }
            r += rr;
        }
    }
    SCRATCH.with_borrow_mut(|scratch| *scratch = Scratch { panel, accs });
}

/// Weight rows per panel at row `r` of rows `..r1`: [`Simd::PANEL_ROWS`] while that many are
/// left, then `TILE_ROWS`, then 1.
#[inline(always)]
fn panel_group<S: Simd>(r: usize, r1: usize) -> usize {
    if r + S::PANEL_ROWS <= r1 {
        S::PANEL_ROWS
    } else if r + S::TILE_ROWS <= r1 {
        S::TILE_ROWS
    } else {
        1
    }
}

/// The stored bytes of the panel after the one being swept, asked for a few cache lines per
/// register tile (hints only: no effect on any result). Without it every panel decode waited
/// on its rows' first reads from memory: each row's 1 KiB (BF16) of a k-block is too short for
/// the hardware prefetcher to run ahead.
struct NextPanel<'p, 'a> {
    p: &'p Plan<'a>,
    r: usize,
    /// Stored bytes per chunk.
    bytes: usize,
    /// Byte range of each row and the lines in it.
    b0: usize,
    b1: usize,
    row_lines: usize,
    /// Lines in all, and the next one to ask for.
    lines: usize,
    at: usize,
}

impl<'p, 'a> NextPanel<'p, 'a> {
    /// Rows `r..r + rr`, chunks `c0..c0 + kc` of a format of `bytes` per chunk (0: nothing).
    fn new(p: &'p Plan<'a>, bytes: usize, r: usize, rr: usize, c0: usize, kc: usize) -> Self {
        let row_len = p.m.cols * bytes / LANES;
        let (b0, b1) = ((c0 * bytes).min(row_len), ((c0 + kc) * bytes).min(row_len));
        let row_lines = (b1 - b0).div_ceil(64);
        NextPanel {
            p,
            r,
            bytes,
            b0,
            b1,
            row_lines,
            lines: row_lines * rr,
            at: 0,
        }
    }

    /// Ask for the next `count` lines.
    #[inline(always)]
    fn issue<S: Simd>(&mut self, s: S, count: usize) {
        let end = (self.at + count).min(self.lines);
        while self.at < end {
            let (j, l) = (self.at / self.row_lines, self.at % self.row_lines);
            let row = self.p.row_bytes(self.r + j, self.bytes);
            s.prefetch_l2(&row[(self.b0 + 64 * l).min(self.b1)..self.b1]);
            self.at += 1;
        }
    }
}

/// Where chunk `c` of input row `i` goes when rows of `cpr` chunks are packed in tiles of `w`
/// rows: the tile's chunks one after another, each holding its rows' chunk `c` (the rows after
/// the last are zeros). A register tile then reads its inputs as one stream: as separate rows
/// (8 KiB apart for 2,048 columns) the 8 x 3 tile measured 10-20 % slower.
#[inline(always)]
pub(crate) fn packed_at(i: usize, c: usize, cpr: usize, w: usize) -> usize {
    ((i / w) * cpr + c) * w + i % w
}

/// The `n` row-major input rows `x` (`cpr` chunks each) packed into `xs` (see [`packed_at`]).
pub(super) fn pack_xs(x: &[Chunk], n: usize, cpr: usize, w: usize, xs: &mut Vec<Chunk>) {
    xs.clear();
    xs.resize(n.div_ceil(w) * cpr * w, Chunk::default());
    for (i, row) in x.chunks_exact(cpr).take(n).enumerate() {
        for (c, v) in row.iter().enumerate() {
            xs[packed_at(i, c, cpr, w)] = *v;
        }
    }
}

/// One k-block of the multi-row path: a decoded panel and the packed input tiles it meets.
struct Block<'a> {
    /// `kc x rows` decoded chunks, interleaved: chunk `c` of row `j` at `c * rows + j`.
    w: &'a [Chunk],
    /// The packed input rows ([`pack_xs`]), `tiles` tiles of `cpr` chunks.
    x: &'a [Chunk],
    cpr: usize,
    /// First chunk of the block and its length.
    c0: usize,
    kc: usize,
    tiles: usize,
}

/// All input tiles against the panel's `rr` weight rows.
#[inline(always)]
fn sweep_xs<S: Simd>(s: S, rr: usize, b: &Block, mut next: NextPanel, accs: &mut [Chunk]) {
    // The next panel's lines, spread evenly over this sweep's register tiles.
    let per_tile = next.lines.div_ceil(b.tiles);
    for t in 0..b.tiles {
        next.issue(s, per_tile);
        match (rr, S::PANEL_XS) {
            (8, 3) => tile::<S, 8, 3>(s, b, t, accs),
            (4, 3) => tile::<S, 4, 3>(s, b, t, accs),
            (2, 3) => tile::<S, 2, 3>(s, b, t, accs),
            (1, 3) => tile::<S, 1, 3>(s, b, t, accs),
            (8, 2) => tile::<S, 8, 2>(s, b, t, accs),
            (4, 2) => tile::<S, 4, 2>(s, b, t, accs),
            (2, 2) => tile::<S, 2, 2>(s, b, t, accs),
            (1, 2) => tile::<S, 1, 2>(s, b, t, accs),
            (rr, w) => unreachable!("no {rr} x {w} register tile"),
        }
    }
}

/// Register tile: weight rows `0..R` of the panel x packed input tile `t` (`N ==
/// S::PANEL_XS` rows) over the block; the accumulators persist in `accs[t * R * N..]`.
#[inline(always)]
fn tile<S: Simd, const R: usize, const N: usize>(s: S, b: &Block, t: usize, accs: &mut [Chunk]) {
    debug_assert_eq!(N, S::PANEL_XS);
    // One pointer walks the interleaved panel and one the packed inputs (the rows are fixed
    // offsets from them): with a pointer per row, the 8 x 3 tile ran out of registers and
    // reloaded them from the stack.
    let w = &b.w.as_chunks::<R>().0[..b.kc];
    let start = t * b.cpr + b.c0;
    let x = &b.x[start * N..(start + b.kc) * N].as_chunks::<N>().0[..b.kc];
    let accs = &mut accs[t * R * N..(t + 1) * R * N];
    // No closures (`from_fn`) around SIMD operations here: a closure does not inherit the
    // caller's `target_feature`s, so an intrinsic inside one is an out-of-line call.
    let mut acc = [[s.zero(); N]; R];
    for j in 0..R {
        for i in 0..N {
            acc[j][i] = s.load(&accs[j * N + i]);
        }
    }
    // The input chunks stay in registers; each weight chunk is loaded and used for all `N`.
    for c in 0..b.kc {
        let mut xv = [s.zero(); N];
        for i in 0..N {
            xv[i] = s.load(&x[c][i]);
        }
        for j in 0..R {
            let wv = s.load(&w[c][j]);
            for i in 0..N {
                acc[j][i] = s.fma(wv, xv[i], acc[j][i]);
            }
        }
    }
    for j in 0..R {
        for i in 0..N {
            s.store(&mut accs[j * N + i], acc[j][i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_blocks_are_whole_register_tiles_of_at_least_16_rows() {
        for cpr in [1, 128, 448, 512, 1 << 20] {
            for w in [2, 3, 4] {
                let nb = x_block_rows(cpr, w);
                assert!(nb >= 16 && nb.is_multiple_of(w), "cpr {cpr}, tiles of {w}: {nb}");
            }
        }
    }
}
