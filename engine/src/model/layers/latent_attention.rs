//! The attention core of absorbed MLA: softmax over latent keys, for many query rows at once,
//! on every core, with SIMD dot products, tiled over keys.
//!
//! Each query row carries, per head, its absorbed query `q_abs = W_UKᵀ q_nope` (`kv_lora`
//! values) and its rotated query part (`rope` values); the keys are the cache's normalised
//! latents and shared rotated keys (one per position, shared by every head: MLA is multi-query
//! in the latent space, so one read of a key serves all heads). The result is each head's latent
//! context `Σ_j softmax(s)_j · c_j`.
//!
//! ## A fixed reduction order
//! Positions are cut into blocks of [`BLOCK`] at fixed offsets from position 0, and blocks into
//! tiles of [`TILE`]. Inside a block the softmax runs online tile by tile; a block yields a
//! partial `(max, sum, Σ p·c)` per head; a row's blocks are merged in ascending order by one fold
//! ([`Partial::merge`]). The work is split over threads by rows (many rows: prefill) or by
//! `(row, block)` (few rows over a long cache: decode), but every row is always computed by
//! exactly this sequence of floating-point operations (on the row path, groups of up to
//! [`GROUP`] consecutive rows take each key tile in turn, so the keys the first row brought in
//! are in L2 for the others; each row's own sequence is unchanged), so its result does not
//! depend on the thread count, on which rows share the pass, or on how its prompt was chunked
//! (a row at position `p` sees the same blocks whatever the cache holds beyond `p`). Dot
//! products use 16 lanes like [`crate::kernels::reference::dot`], each lane a chain of fused
//! multiply-adds (IEEE `fma`, one rounding, exact alike on every CPU and GPU), as is the
//! probability-weighted sum of latents, so every instantiation gives the same bits. (A separate
//! multiply and add, as before 2026-12-05, cost twice the arithmetic ports' time.)
//!
//! A tile's two inner loops (the scores, and the probability-weighted sum of latents) are a
//! [`TileOps`]: the portable loops here (compiled as is, and under AVX2), or the AVX-512 ones of
//! [`super::latent_avx512`], which perform the same operations per value in register tiles.
//!
//! [`attend_reference`] is the scalar twin (exact two-pass softmax per head) for parity tests.

use rayon::prelude::*;

use crate::kernels::math::exp;
pub use crate::kernels::ops::dot16;
use crate::kernels::ops::lanes_dot;
use crate::state::Rows;

pub use crate::kernels::layer_spec::MLA_BLOCK as BLOCK;
/// Positions per tile (scores of one tile are held for all heads at once).
pub const TILE: usize = 64;

/// Per-head widths and the softmax scale.
#[derive(Debug, Clone, Copy)]
pub struct LatentShape {
    pub heads: usize,
    /// Latent width (`kv_lora_rank`).
    pub latent: usize,
    /// Shared rotated key width (`qk_rope_head_dim`).
    pub rope: usize,
    pub scale: f32,
}

/// The keys one row attends to: up to two runs of consecutive positions (a sequence's cache,
/// and for block drafting the block's own rows after it), `latent` and `rope` values per position
/// (in the cache's blocks or a flat slice: [`Rows`]); or chosen positions of one run (DeepSeek
/// Sparse Attention), read in the order given.
#[derive(Debug, Clone, Copy)]
pub struct LatentKeys<'a> {
    parts: [(Rows<'a>, Rows<'a>); 2],
    /// Positions in the first part.
    first: usize,
    /// Key `j` is position `chosen[j]` of the run (`None`: key `j` is position `j`).
    chosen: Option<&'a [u32]>,
}

/// A run of latents and rotated keys.
pub type KeyRun<'a> = (Rows<'a>, Rows<'a>);

impl<'a> LatentKeys<'a> {
    /// One run of positions.
    pub fn one(latent: impl Into<Rows<'a>>, rope: impl Into<Rows<'a>>, shape: LatentShape) -> Self {
        let empty: &[f32] = &[];
        Self::two((latent.into(), rope.into()), (empty.into(), empty.into()), shape)
    }

    /// Two runs: the positions of `a` come first.
    pub fn two(a: KeyRun<'a>, b: KeyRun<'a>, shape: LatentShape) -> Self {
        LatentKeys {
            parts: [a, b],
            first: a.0.len(shape.latent),
            chosen: None,
        }
    }

    /// The positions `chosen` (ascending) of one run, as keys `0..chosen.len()`: the same
    /// values in the same order as a run holding only those positions, without copying them.
    pub fn chosen(
        latent: impl Into<Rows<'a>>,
        rope: impl Into<Rows<'a>>,
        chosen: &'a [u32],
        shape: LatentShape,
    ) -> Self {
        LatentKeys {
            chosen: Some(chosen),
            ..Self::one(latent, rope, shape)
        }
    }

    /// Keys held.
    pub fn len(&self, shape: LatentShape) -> usize {
        match self.chosen {
            Some(c) => c.len(),
            None => self.first + self.parts[1].0.len(shape.latent),
        }
    }

    #[inline(always)]
    pub(super) fn key(&self, j: usize, s: LatentShape) -> (&'a [f32], &'a [f32]) {
        let j = match self.chosen {
            Some(c) => c[j] as usize,
            None => j,
        };
        let (part, j) = if j < self.first {
            (self.parts[0], j)
        } else {
            (self.parts[1], j - self.first)
        };
        (part.0.row(j, s.latent), part.1.row(j, s.rope))
    }
}

/// One query row: absorbed queries `[heads, latent]`, rotated query parts `[heads, rope]`, and
/// the first `len` positions of `keys` it attends to.
#[derive(Debug, Clone, Copy)]
pub struct LatentQuery<'a> {
    pub q_abs: &'a [f32],
    pub q_rope: &'a [f32],
    pub keys: LatentKeys<'a>,
    pub len: usize,
}

/// Softmax state of every head over a run of positions: running max, sum of `exp(s - max)`,
/// and `Σ exp(s - max) · c`.
#[derive(Debug, Clone)]
pub(super) struct Partial {
    max: Vec<f32>,
    pub(super) sum: Vec<f32>,
    pub(super) acc: Vec<f32>,
}

impl Partial {
    fn empty(s: LatentShape) -> Self {
        Partial {
            max: vec![f32::NEG_INFINITY; s.heads],
            sum: vec![0.0; s.heads],
            acc: vec![0.0; s.heads * s.latent],
        }
    }

    /// Fold the next run's partial into this one (the only cross-block combination).
    fn merge(&mut self, next: &Partial, s: LatentShape) {
        for h in 0..s.heads {
            let m = self.max[h].max(next.max[h]);
            let (a, b) = (exp(self.max[h] - m), exp(next.max[h] - m));
            self.max[h] = m;
            self.sum[h] = self.sum[h] * a + next.sum[h] * b;
            let acc = &mut self.acc[h * s.latent..][..s.latent];
            for (x, &y) in acc.iter_mut().zip(&next.acc[h * s.latent..][..s.latent]) {
                *x = *x * a + y * b;
            }
        }
    }

    /// Each head's normalised context into `out` `[heads, latent]`.
    fn finish(&self, s: LatentShape, out: &mut [f32]) {
        for h in 0..s.heads {
            let inv = 1.0 / self.sum[h];
            let acc = &self.acc[h * s.latent..][..s.latent];
            out[h * s.latent..][..s.latent]
                .iter_mut()
                .zip(acc)
                .for_each(|(o, &a)| *o = a * inv);
        }
    }
}

/// A tile's two inner loops; every implementation performs, for every value, the operations of
/// [`Portable`] in the same order.
pub(super) trait TileOps {
    /// `scores[h * TILE + (j - t0)] = (dot16(q_abs[h], latent_j) + dot16(q_rope[h], rope_j)) ·
    /// scale` for the `width` positions `j` from `t0`.
    fn scores(q: &LatentQuery<'_>, t0: usize, width: usize, s: LatentShape, scores: &mut [f32]);
    /// For every head, in position order: `sum[h] += p_j` and `acc[h] = fma(p_j, c_j, acc[h])`, with
    /// `p_j = probs[h * TILE + (j - t0)]` and `c_j` the latent of position `j`.
    fn values(
        q: &LatentQuery<'_>,
        t0: usize,
        width: usize,
        s: LatentShape,
        probs: &[f32],
        part: &mut Partial,
    );
}

/// The portable loops (the definition of the order).
pub(super) struct Portable;

impl TileOps for Portable {
    #[inline(always)]
    fn scores(q: &LatentQuery<'_>, t0: usize, width: usize, s: LatentShape, scores: &mut [f32]) {
        for j in t0..t0 + width {
            let (latent, rope) = q.keys.key(j, s);
            for h in 0..s.heads {
                let qa = &q.q_abs[h * s.latent..][..s.latent];
                let qr = &q.q_rope[h * s.rope..][..s.rope];
                scores[h * TILE + (j - t0)] = (lanes_dot(qa, latent) + lanes_dot(qr, rope)) * s.scale;
            }
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
        for j in t0..t0 + width {
            let (latent, _) = q.keys.key(j, s);
            for h in 0..s.heads {
                let p = probs[h * TILE + (j - t0)];
                part.sum[h] += p;
                let acc = &mut part.acc[h * s.latent..][..s.latent];
                acc.iter_mut()
                    .zip(latent)
                    .for_each(|(x, &c)| *x = p.mul_add(c, *x));
            }
        }
    }
}

/// One tile of one row: scores, the online softmax update, and the probability-weighted
/// latents, positions `t0 .. t0 + width`.
#[inline(always)]
fn tile_step<K: TileOps>(
    q: &LatentQuery<'_>,
    (t0, width): (usize, usize),
    s: LatentShape,
    scores: &mut [f32],
    part: &mut Partial,
) {
    K::scores(q, t0, width, s, scores);
    for h in 0..s.heads {
        let tile_max = scores[h * TILE..][..width]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let m = part.max[h].max(tile_max);
        let a = exp(part.max[h] - m);
        part.max[h] = m;
        // A factor of exactly 1 (the running max held, as it mostly does deep into a long
        // prompt) leaves every value as it is: skipping the products changes no bit.
        if a != 1.0 {
            part.sum[h] *= a;
            part.acc[h * s.latent..][..s.latent]
                .iter_mut()
                .for_each(|x| *x *= a);
        }
    }
    // The tile's probabilities first (a loop that vectorises), in place of the scores.
    for h in 0..s.heads {
        let m = part.max[h];
        scores[h * TILE..][..width]
            .iter_mut()
            .for_each(|v| *v = exp(*v - m));
    }
    K::values(q, t0, width, s, scores, part);
}

/// The partials of block `block` of each row of `qs` (positions `block * BLOCK ..` up to each
/// row's `len`; every row reaches into the block). The rows take each tile in turn, so a tile's
/// keys, read from L3 (or memory) by the first row, are in L2 for the others when the rows share
/// their keys (consecutive rows of a prompt). Each row's own sequence of operations is that of
/// a row alone.
#[inline(always)]
fn block_partials_impl<K: TileOps>(qs: &[LatentQuery<'_>], block: usize, s: LatentShape) -> Vec<Partial> {
    let start = block * BLOCK;
    let mut parts: Vec<Partial> = qs.iter().map(|_| Partial::empty(s)).collect();
    let last = qs.iter().map(|q| q.len).max().unwrap_or(0);
    let mut scores = vec![0.0f32; s.heads * TILE];
    let mut t0 = start;
    while t0 < (start + BLOCK).min(last) {
        for (q, part) in qs.iter().zip(&mut parts) {
            let end = (start + BLOCK).min(q.len);
            if t0 < end {
                let width = (t0 + TILE).min(end) - t0;
                tile_step::<K>(q, (t0, width), s, &mut scores, part);
            }
        }
        t0 += TILE;
    }
    parts
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn block_partials_avx2(qs: &[LatentQuery<'_>], block: usize, s: LatentShape) -> Vec<Partial> {
    block_partials_impl::<Portable>(qs, block, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn block_partials_avx512(qs: &[LatentQuery<'_>], block: usize, s: LatentShape) -> Vec<Partial> {
    block_partials_impl::<super::latent_avx512::Avx512>(qs, block, s)
}

/// The instruction set a block runs on (all give the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Path {
    /// The widest path this CPU runs.
    fn detected() -> Path {
        Path::available().pop().unwrap_or(Path::Portable)
    }

    /// Every path this CPU runs, narrowest first.
    fn available() -> Vec<Path> {
        #[allow(unused_mut)]
        let mut paths = vec![Path::Portable];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            if std::arch::is_x86_feature_detected!("avx2") {
                paths.push(Path::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                paths.push(Path::Avx512);
            }
        }
        paths
    }
}

fn block_partials(qs: &[LatentQuery<'_>], block: usize, s: LatentShape, path: Path) -> Vec<Partial> {
    match path {
        // SAFETY: `Path::available` offers these paths only when the CPU reports their features.
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        Path::Avx2 => unsafe { block_partials_avx2(qs, block, s) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        Path::Avx512 => unsafe { block_partials_avx512(qs, block, s) },
        Path::Portable => block_partials_impl::<Portable>(qs, block, s),
    }
}

/// The partial of block `block` of one row.
fn block_partial(q: &LatentQuery<'_>, block: usize, s: LatentShape, path: Path) -> Partial {
    let mut parts = block_partials(std::slice::from_ref(q), block, s, path);
    parts.pop().expect("one partial per row")
}

/// The most rows attended together over each key tile on the row-parallel path.
const GROUP: usize = 8;

/// A group of rows, each its blocks in order (the row-parallel path): block `b` of every row
/// that reaches it is computed together, and folded into that row's total.
fn attend_group(qs: &[LatentQuery<'_>], s: LatentShape, path: Path, out: &mut [f32]) {
    let mut totals: Vec<Option<Partial>> = vec![None; qs.len()];
    let blocks = qs.iter().map(|q| q.len.div_ceil(BLOCK)).max().unwrap_or(0);
    for b in 0..blocks {
        let reach: Vec<usize> = (0..qs.len()).filter(|&i| qs[i].len > b * BLOCK).collect();
        let rows: Vec<LatentQuery<'_>> = reach.iter().map(|&i| qs[i]).collect();
        for (&i, part) in reach.iter().zip(block_partials(&rows, b, s, path)) {
            match &mut totals[i] {
                Some(total) => total.merge(&part, s),
                none => *none = Some(part),
            }
        }
    }
    for (total, o) in totals.iter().zip(out.chunks_mut(s.heads * s.latent)) {
        total.as_ref().expect("every row attends to a block").finish(s, o);
    }
}

/// Each row's per-head latent context into `out` `[rows, heads, latent]`.
///
/// # Panics
/// If a row attends to no position or to more than its keys hold, or `out` has the wrong size.
pub fn attend(queries: &[LatentQuery<'_>], s: LatentShape, out: &mut [f32]) {
    let width = s.heads * s.latent;
    assert_eq!(
        out.len(),
        queries.len() * width,
        "out must hold rows × heads × latent"
    );
    for q in queries {
        assert!(
            q.len >= 1 && q.len <= q.keys.len(s),
            "a row attends to 1..=keys positions"
        );
    }
    let path = Path::detected();
    let threads = rayon::current_num_threads();
    if queries.len() >= threads || queries.iter().all(|q| q.len <= BLOCK) {
        // Groups small enough that every thread gets rows.
        let group = (queries.len() / threads).clamp(1, GROUP);
        out.par_chunks_mut(width * group)
            .zip(queries.par_chunks(group))
            .for_each(|(o, qs)| attend_group(qs, s, path, o));
        return;
    }
    // Few rows over long caches: every (row, block) is a task; blocks merge in order.
    let tasks: Vec<(usize, usize)> = queries
        .iter()
        .enumerate()
        .flat_map(|(i, q)| (0..q.len.div_ceil(BLOCK)).map(move |b| (i, b)))
        .collect();
    let partials: Vec<Partial> = tasks
        .par_iter()
        .map(|&(i, b)| block_partial(&queries[i], b, s, path))
        .collect();
    let mut next = partials.into_iter();
    for (q, o) in queries.iter().zip(out.chunks_mut(width)) {
        let mut total = next.next().expect("one partial per block");
        for _ in 1..q.len.div_ceil(BLOCK) {
            total.merge(&next.next().expect("one partial per block"), s);
        }
        total.finish(s, o);
    }
}

/// The scalar twin: per head, an exact two-pass softmax over all positions in order.
pub fn attend_reference(queries: &[LatentQuery<'_>], s: LatentShape, out: &mut [f32]) {
    let width = s.heads * s.latent;
    for (q, o) in queries.iter().zip(out.chunks_mut(width)) {
        for h in 0..s.heads {
            let qa = &q.q_abs[h * s.latent..][..s.latent];
            let qr = &q.q_rope[h * s.rope..][..s.rope];
            let scores: Vec<f32> = (0..q.len)
                .map(|j| {
                    let (latent, rope) = q.keys.key(j, s);
                    let d = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
                    (d(qa, latent) + d(qr, rope)) * s.scale
                })
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = scores.iter().map(|x| exp(x - max)).collect();
            let sum: f32 = exps.iter().sum();
            let oh = &mut o[h * s.latent..][..s.latent];
            oh.iter_mut().for_each(|x| *x = 0.0);
            for (j, &e) in exps.iter().enumerate() {
                let (latent, _) = q.keys.key(j, s);
                oh.iter_mut().zip(latent).for_each(|(x, &c)| *x += e / sum * c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> LatentShape {
        LatentShape {
            heads: 3,
            latent: 20,
            rope: 5,
            scale: 0.3,
        }
    }

    /// Deterministic values in [-2, 2) (xorshift).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 22) as f32 - 2.0
            })
            .collect()
    }

    struct Case {
        latent: Vec<f32>,
        rope: Vec<f32>,
        q_abs: Vec<f32>,
        q_rope: Vec<f32>,
    }

    fn case(positions: usize, rows: usize) -> Case {
        let s = shape();
        Case {
            latent: values(positions * s.latent, 1),
            rope: values(positions * s.rope, 2),
            q_abs: values(rows * s.heads * s.latent, 3),
            q_rope: values(rows * s.heads * s.rope, 4),
        }
    }

    fn queries<'a>(c: &'a Case, lens: &[usize]) -> Vec<LatentQuery<'a>> {
        let s = shape();
        let keys = LatentKeys::one(&c.latent, &c.rope, s);
        lens.iter()
            .enumerate()
            .map(|(i, &len)| LatentQuery {
                q_abs: &c.q_abs[i * s.heads * s.latent..][..s.heads * s.latent],
                q_rope: &c.q_rope[i * s.heads * s.rope..][..s.heads * s.rope],
                keys,
                len,
            })
            .collect()
    }

    fn run(qs: &[LatentQuery<'_>], threads: usize) -> Vec<f32> {
        let s = shape();
        let mut out = vec![0.0; qs.len() * s.heads * s.latent];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| attend(qs, s, &mut out));
        out
    }

    #[test]
    fn tiled_attention_matches_the_two_pass_reference() {
        let lens = [1, 63, 64, 65, 1023, 1025, 2500];
        let c = case(2500, lens.len());
        let qs = queries(&c, &lens);
        let got = run(&qs, 2);
        let mut want = vec![0.0; got.len()];
        attend_reference(&qs, shape(), &mut want);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }

    /// Chosen positions read in place (sparse attention) give the bits of a run holding a copy
    /// of just those positions, on the tile path (many rows) and the block path (one row).
    #[test]
    fn chosen_keys_are_a_copied_run_bit_for_bit() {
        let s = shape();
        let c = case(3000, 3);
        let chosen: Vec<u32> = (0..3000u32).filter(|p| p % 7 == 3 || p % 11 == 0).collect();
        let copy = |src: &[f32], w: usize| -> Vec<f32> {
            chosen
                .iter()
                .flat_map(|&p| src[p as usize * w..][..w].to_vec())
                .collect()
        };
        let (latent, rope) = (copy(&c.latent, s.latent), copy(&c.rope, s.rope));
        let rows = |keys: LatentKeys<'_>| -> Vec<f32> {
            let qs: Vec<LatentQuery<'_>> = (0..3)
                .map(|i| LatentQuery {
                    q_abs: &c.q_abs[i * s.heads * s.latent..][..s.heads * s.latent],
                    q_rope: &c.q_rope[i * s.heads * s.rope..][..s.heads * s.rope],
                    keys,
                    len: chosen.len() - i * 100,
                })
                .collect();
            let mut all = run(&qs, 2);
            all.extend(run(&qs[..1], 2));
            all
        };
        let got = rows(LatentKeys::chosen(&c.latent, &c.rope, &chosen, s));
        assert_eq!(got, rows(LatentKeys::one(&latent, &rope, s)));
    }

    #[test]
    fn results_are_bit_identical_for_any_thread_count_and_company() {
        let lens = [3000, 2999, 1500, 7];
        let c = case(3000, lens.len());
        let qs = queries(&c, &lens);
        let base = run(&qs, 1);
        for threads in [2, 3, 8] {
            assert_eq!(run(&qs, threads), base, "threads = {threads}");
        }
        // Alone (one row over a long cache takes the per-block path), each row is the same.
        let width = shape().heads * shape().latent;
        for (i, q) in qs.iter().enumerate() {
            for threads in [1, 4] {
                assert_eq!(run(&[*q], threads), base[i * width..][..width], "row {i} alone");
            }
        }
    }

    #[test]
    fn keys_beyond_a_row_do_not_change_it_and_two_runs_equal_one() {
        let s = shape();
        let c = case(2100, 1);
        let q = queries(&c, &[1800])[0];
        let short_cache = LatentKeys::one(&c.latent[..1800 * s.latent], &c.rope[..1800 * s.rope], s);
        let split = LatentKeys::two(
            (c.latent[..1000 * s.latent].into(), c.rope[..1000 * s.rope].into()),
            (c.latent[1000 * s.latent..].into(), c.rope[1000 * s.rope..].into()),
            s,
        );
        // The cache's blocks (a run split every 64 positions) read the same keys.
        let (latent, rope) = (
            crate::state::Paged::from_rows(&c.latent, s.latent),
            crate::state::Paged::from_rows(&c.rope, s.rope),
        );
        let paged = LatentKeys::one(&latent, &rope, s);
        let base = run(&[q], 2);
        assert_eq!(
            run(
                &[LatentQuery {
                    keys: short_cache,
                    ..q
                }],
                2
            ),
            base
        );
        assert_eq!(run(&[LatentQuery { keys: split, ..q }], 2), base);
        assert_eq!(run(&[LatentQuery { keys: paged, ..q }], 2), base, "paged keys");
    }

    /// Every instantiation this CPU runs gives the portable bits: widths with and without
    /// partial 16-lane chunks, head counts that do not fill a register tile, tiles cut short.
    #[test]
    fn every_instruction_set_gives_the_portable_bits() {
        let paths = Path::available();
        assert!(paths.len() >= 2 || !cfg!(target_arch = "x86_64"), "{paths:?}");
        for (heads, latent, rope) in [(3, 20, 5), (16, 256, 64), (5, 512, 64), (2, 33, 16), (1, 300, 7)] {
            let s = LatentShape {
                heads,
                latent,
                rope,
                scale: 0.07,
            };
            let positions = 2100;
            let c = Case {
                latent: values(positions * latent, 1),
                rope: values(positions * rope, 2),
                q_abs: values(heads * latent, 3),
                q_rope: values(heads * rope, 4),
            };
            let keys = LatentKeys::one(&c.latent, &c.rope, s);
            for len in [1, 7, 64, 100, 2100] {
                let q = LatentQuery {
                    q_abs: &c.q_abs,
                    q_rope: &c.q_rope,
                    keys,
                    len,
                };
                let width = heads * latent;
                let mut want = vec![0.0; width];
                attend_group(std::slice::from_ref(&q), s, Path::Portable, &mut want);
                for &path in &paths {
                    let mut got = vec![0.0; width];
                    attend_group(std::slice::from_ref(&q), s, path, &mut got);
                    let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{path:?}: heads {heads}, latent {latent}, rope {rope}, len {len}"
                    );
                }
            }
        }
    }
}
