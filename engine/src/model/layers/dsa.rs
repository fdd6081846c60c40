//! DeepSeek Sparse Attention (DSA: DeepSeek-V3.2, GLM-5): the lightning indexer, which picks for
//! each query row the `topk` earlier positions its MLA layer attends to (HF
//! `DeepseekV32Indexer`, `GlmMoeDsaIndexer`).
//!
//! For a row at position `p`, with the layer's normalised input `x` and the MLA's normalised
//! query latent `q_resid = RMSNorm(q_a_proj x)`:
//! - `q = wq_b q_resid` (`heads × head_dim`) and `k_p = LayerNorm(wk x)` (`head_dim`, with bias,
//!   eps 1e-6), RoPE on the first `rope` values of each head and of the key (interleaved pairs
//!   for GLM-5, halves for V3.2), with the MLA's frequencies;
//! - `score_t = Σ_h w_h · relu(scale · q_h · k_t)` for every `t ≤ p`, with
//!   `w = weights_proj x · heads^-½` and `scale = head_dim^-½`;
//! - the row attends to the `topk` positions of highest score, or to all of `0..=p` when
//!   `p < topk`.
//!
//! Keys `k_t` are cached per sequence ([`crate::state::MlaCache::index_keys`]). A "shared" layer
//! (GLM-5.2's IndexShare) has no indexer and reuses the selection of the last full layer of the
//! same pass ([`Sparse::Shared`]).
//!
//! ## Exact and batch invariant
//! Each score is its own sum in a fixed order (a 16-lane dot per head, heads in order), so a
//! row's selection depends only on its own inputs and its sequence's keys `0..=p`: not on the
//! batch, the chunking or the thread count. Equal scores are broken towards the earlier
//! position (HF's `torch.topk` leaves their order unspecified; the fixtures have no tie at the
//! boundary). The chosen positions are attended in ascending order, read in place from the cache
//! (`LatentKeys::chosen`: nothing is copied), so a row whose selection is every position
//! computes exactly what dense MLA computes.

use rayon::prelude::*;

use super::rope::Rope;
use crate::backend::matmul;
use crate::kernels::Matrix;
use crate::kernels::ops::layer_norm;
use crate::state::{BLOCK_POSITIONS, Rows};

/// `nn.LayerNorm(head_dim, eps=1e-6)`: the published indexers fix this epsilon.
const K_NORM_EPS: f32 = 1e-6;

/// Positions scored per parallel task of one row.
const SCORE_CHUNK: usize = 256;

/// The indexer's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerDims {
    /// `index_n_heads`.
    pub heads: usize,
    /// `index_head_dim`.
    pub head_dim: usize,
    /// The rotated part of each head (`qk_rope_head_dim`).
    pub rope: usize,
    /// `index_topk`: positions each row attends to once its context is longer.
    pub topk: usize,
}

/// Which positions each row of a pass attends to: `None` is every position up to the row's
/// own; `Some` lists the chosen ones in ascending order.
pub type Selection = Vec<Option<Vec<u32>>>;

/// A DSA layer's choice of positions (one per layer, built at load: the variants' size
/// difference costs nothing).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Sparse {
    /// The layer runs its own indexer.
    Index(Indexer),
    /// The layer reuses the selection of the previous full layer in the same pass.
    Shared,
}

/// One layer's lightning indexer.
#[derive(Debug, Clone)]
pub struct Indexer {
    dims: IndexerDims,
    wq_b: Matrix,
    wk: Matrix,
    k_norm: Vec<f32>,
    k_bias: Vec<f32>,
    weights_proj: Matrix,
    rope: Rope,
}

impl Indexer {
    /// Load `{prefix}.wq_b` `[heads·head_dim, q_lora]`, `{prefix}.wk` `[head_dim, hidden]`,
    /// `{prefix}.k_norm.{weight,bias}` and `{prefix}.weights_proj` `[heads, hidden]`.
    pub fn load(
        ld: &crate::model::Loader<'_>,
        prefix: &str,
        hidden: usize,
        q_lora: usize,
        dims: IndexerDims,
        rope: Rope,
    ) -> crate::Result<Indexer> {
        Ok(Indexer {
            wq_b: ld.linear(&format!("{prefix}.wq_b"), dims.heads * dims.head_dim, q_lora)?,
            wk: ld.linear(&format!("{prefix}.wk"), dims.head_dim, hidden)?,
            k_norm: ld.vector(&format!("{prefix}.k_norm.weight"), dims.head_dim)?,
            k_bias: ld.vector(&format!("{prefix}.k_norm.bias"), dims.head_dim)?,
            weights_proj: ld.linear(&format!("{prefix}.weights_proj"), dims.heads, hidden)?,
            dims,
            rope,
        })
    }

    pub fn dims(&self) -> IndexerDims {
        self.dims
    }

    /// The keys `[n, head_dim]` of normalised rows `x` at positions `pos`: the entries those rows
    /// add to the indexer cache.
    pub fn keys(&self, x: &[f32], n: usize, pos: &dyn Fn(usize) -> usize) -> Vec<f32> {
        let d = self.dims.head_dim;
        let mut raw = vec![0.0; n * d];
        matmul(&self.wk, x, n, &mut raw);
        let mut k = vec![0.0; n * d];
        for (i, (src, dst)) in raw.chunks(d).zip(k.chunks_mut(d)).enumerate() {
            layer_norm(src, &self.k_norm, &self.k_bias, K_NORM_EPS, dst);
            self.rope.apply(&mut dst[..self.dims.rope], pos(i));
        }
        k
    }

    /// Each row's selection. Row `i` is at position `pos(i)` and scores the first
    /// `pos(i) + 1` keys of `keys(i)` (its sequence's indexer cache, this pass's keys included).
    pub fn select<'k>(
        &self,
        x: &[f32],
        q_resid: &[f32],
        n: usize,
        pos: &(dyn Fn(usize) -> usize + Sync),
        keys: &(dyn Fn(usize) -> Rows<'k> + Sync),
    ) -> Selection {
        let IndexerDims {
            heads,
            head_dim,
            topk,
            ..
        } = self.dims;
        let cpu = |sparse: &[usize], q: &[f32], w: &[f32]| -> crate::Result<Vec<Vec<u32>>> {
            // Rows of one sequence are consecutive and share its keys: score them together, so
            // each tile of keys is laid out once for up to ROW_GROUP rows.
            let mut chosen = Vec::with_capacity(sparse.len());
            for rows in sparse.chunk_by(|&a, &b| keys(a).same(keys(b))) {
                let queries: Vec<RowQuery<'_>> = rows
                    .iter()
                    .map(|&i| RowQuery {
                        q: &q[i * heads * head_dim..][..heads * head_dim],
                        w: &w[i * heads..][..heads],
                        len: pos(i) + 1,
                    })
                    .collect();
                chosen.extend(choose(&queries, keys(rows[0]), head_dim, topk));
            }
            Ok(chosen)
        };
        self.select_with(x, q_resid, n, pos, cpu)
            .expect("the CPU scores every row")
    }

    /// [`Indexer::select`] with the rows' choice from `choose`: given the rows past the top-k
    /// (ascending) and every row's rotated queries `[n, heads · head_dim]` and scaled head
    /// weights `[n, heads]`, each such row's [`top_positions`] of its scores over its keys
    /// `0..=pos(i)` in the order of [`index_scores_reference`] ([`choose`] on the CPU, a scores
    /// kernel on a device), a bounded group of rows' scores at a time ([`ROW_GROUP`]).
    pub fn select_with(
        &self,
        x: &[f32],
        q_resid: &[f32],
        n: usize,
        pos: &(dyn Fn(usize) -> usize + Sync),
        choose: impl FnOnce(&[usize], &[f32], &[f32]) -> crate::Result<Vec<Vec<u32>>>,
    ) -> crate::Result<Selection> {
        if (0..n).all(|i| pos(i) < self.dims.topk) {
            return Ok(vec![None; n]);
        }
        let (q, w) = self.queries(x, q_resid, n, pos);
        let sparse: Vec<usize> = (0..n).filter(|&i| pos(i) >= self.dims.topk).collect();
        let chosen = choose(&sparse, &q, &w)?;
        let mut selection: Selection = vec![None; n];
        for (&i, c) in sparse.iter().zip(chosen) {
            selection[i] = Some(c);
        }
        Ok(selection)
    }

    /// The rotated queries `[n, heads · head_dim]` and the head weights `[n, heads]` (scaled by
    /// `heads^-½`) of `n` rows.
    fn queries(
        &self,
        x: &[f32],
        q_resid: &[f32],
        n: usize,
        pos: &(dyn Fn(usize) -> usize + Sync),
    ) -> (Vec<f32>, Vec<f32>) {
        let IndexerDims { heads, head_dim, .. } = self.dims;
        let mut q = vec![0.0; n * heads * head_dim];
        matmul(&self.wq_b, q_resid, n, &mut q);
        let mut w = vec![0.0; n * heads];
        matmul(&self.weights_proj, x, n, &mut w);
        let w_scale = (heads as f32).powf(-0.5);
        w.iter_mut().for_each(|v| *v *= w_scale);
        q.par_chunks_mut(heads * head_dim)
            .enumerate()
            .for_each(|(i, qi)| {
                let mut f = vec![0.0f32; self.dims.rope];
                self.rope.factors_into(pos(i), &mut f);
                for h in qi.chunks_mut(head_dim) {
                    self.rope.apply_factors(&mut h[..self.dims.rope], &f);
                }
            });
        (q, w)
    }
}

/// Each row's `topk` positions ([`top_positions`] of its [`index_scores_rows`]), for rows over
/// the same keys, [`ROW_GROUP`] rows at a time.
pub fn choose(rows: &[RowQuery<'_>], keys: Rows<'_>, head_dim: usize, topk: usize) -> Vec<Vec<u32>> {
    let mut out = Vec::with_capacity(rows.len());
    for group in rows.chunks(ROW_GROUP) {
        let scores = index_scores_rows(group, keys, head_dim);
        out.extend(
            scores
                .par_iter()
                .map(|s| top_positions(s, topk))
                .collect::<Vec<_>>(),
        );
    }
    out
}

/// Rows scored together per tile of keys (their scores are held at once).
pub const ROW_GROUP: usize = 32;

/// One row to score: its rotated queries `[heads, head_dim]`, head weights, and how many keys
/// it reaches.
#[derive(Debug, Clone, Copy)]
pub struct RowQuery<'a> {
    pub q: &'a [f32],
    pub w: &'a [f32],
    pub len: usize,
}

/// Index scores of rows over the same keys (one sequence's rows of a pass): for each row,
/// `Σ_h w_h · relu(scale · q_h · k_t)` for every key `t < len` of `keys` (`head_dim` values each,
/// `scale = head_dim^-½`), with `q` the row's rotated queries `[heads, head_dim]` and `w` its
/// head weights (`weights_proj x · heads^-½`).
///
/// The canonical order, which [`index_scores_reference`] spells out: each `q_h · k_t` is one
/// chain of fused multiply-adds over the dimensions in order, and the heads are added in order.
/// The tiled kernel keeps 16 keys in the lanes of a vector and [`HEAD_GROUP`] heads in flight,
/// so every lane runs exactly that chain: the same bits on every CPU and for any split of the
/// keys over threads.
///
/// Each tile of keys is laid out once for all the rows; every row's scores are the bits it gets
/// alone.
pub fn index_scores_rows(rows: &[RowQuery<'_>], keys: Rows<'_>, d: usize) -> Vec<Vec<f32>> {
    let longest = rows.iter().map(|r| r.len).max().unwrap_or(0);
    let parts: Vec<Vec<Vec<f32>>> = (0..longest.div_ceil(SCORE_CHUNK))
        .into_par_iter()
        .map(|c| {
            let (lo, hi) = (c * SCORE_CHUNK, ((c + 1) * SCORE_CHUNK).min(longest));
            let mut tile = vec![0.0f32; d * KEY_LANES];
            let mut out: Vec<Vec<f32>> = rows.iter().map(|_| Vec::with_capacity(hi - lo)).collect();
            for t0 in (lo..hi).step_by(KEY_LANES) {
                let t1 = (t0 + KEY_LANES).min(hi);
                transpose_tile(keys.span(t0, t1, d), d, &mut tile);
                for (r, o) in rows.iter().zip(&mut out).filter(|(r, _)| r.len > t0) {
                    let got = score_tile(r.q, r.w, &tile, d);
                    o.extend_from_slice(&got[..r.len.min(t1) - t0]);
                }
            }
            out
        })
        .collect();
    (0..rows.len())
        .map(|i| parts.iter().flat_map(|p| p[i].iter().copied()).collect())
        .collect()
}

/// Keys scored together, one per vector lane.
const KEY_LANES: usize = 16;
// A tile of keys starts at a multiple of 16 and never straddles two cache blocks.
const _: () = assert!(BLOCK_POSITIONS.is_multiple_of(KEY_LANES) && SCORE_CHUNK.is_multiple_of(KEY_LANES));
/// Heads whose chains run at once (independent accumulators hide the FMA latency).
pub const HEAD_GROUP: usize = 8;

/// Up to [`KEY_LANES`] keys (`d` values each) as `[d][KEY_LANES]`, missing keys zero.
fn transpose_tile(keys: &[f32], d: usize, tile: &mut [f32]) {
    tile.fill(0.0);
    for (j, k) in keys.chunks(d).enumerate() {
        for (dd, &v) in k.iter().enumerate() {
            tile[dd * KEY_LANES + j] = v;
        }
    }
}

/// The scores of one transposed tile of keys, on the widest vector unit this CPU has (the same
/// bits on each: every lane is the canonical chain).
fn score_tile(q: &[f32], w: &[f32], tile: &[f32], d: usize) -> [f32; KEY_LANES] {
    #[cfg(target_arch = "x86_64")]
    {
        static PATH: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
        let path = *PATH.get_or_init(|| {
            use std::arch::is_x86_feature_detected as has;
            match (has!("avx512f") && has!("fma"), has!("avx2") && has!("fma")) {
                (true, _) => 2,
                (false, true) => 1,
                _ => 0,
            }
        });
        // SAFETY: each path runs only where the CPU reports its features (checked above).
        #[allow(unsafe_code)]
        match path {
            2 => return unsafe { score_tile_avx512(q, w, tile, d) },
            1 => return unsafe { score_tile_avx2(q, w, tile, d) },
            _ => {}
        }
    }
    score_tile_portable(q, w, tile, d)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn score_tile_avx512(q: &[f32], w: &[f32], tile: &[f32], d: usize) -> [f32; KEY_LANES] {
    score_tile_portable(q, w, tile, d)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn score_tile_avx2(q: &[f32], w: &[f32], tile: &[f32], d: usize) -> [f32; KEY_LANES] {
    score_tile_portable(q, w, tile, d)
}

/// [`score_tile`] in portable code: groups of [`HEAD_GROUP`] heads, each head's chain over the
/// dimensions in order in every lane, heads added in order.
#[inline(always)]
fn score_tile_portable(q: &[f32], w: &[f32], tile: &[f32], d: usize) -> [f32; KEY_LANES] {
    let scale = (d as f32).powf(-0.5);
    let mut total = [0.0f32; KEY_LANES];
    for (qg, wg) in q.chunks(HEAD_GROUP * d).zip(w.chunks(HEAD_GROUP)) {
        let mut acc = [[0.0f32; KEY_LANES]; HEAD_GROUP];
        for (dd, k) in tile.chunks_exact(KEY_LANES).enumerate() {
            for (g, a) in acc.iter_mut().enumerate().take(wg.len()) {
                let qv = qg[g * d + dd];
                for j in 0..KEY_LANES {
                    a[j] = qv.mul_add(k[j], a[j]);
                }
            }
        }
        for (a, &wh) in acc.iter().zip(wg) {
            for j in 0..KEY_LANES {
                total[j] += wh * (a[j] * scale).max(0.0);
            }
        }
    }
    total
}

/// The scalar twin of [`index_scores_rows`] for one row: one key and one head at a time, in the
/// canonical order.
pub fn index_scores_reference(q: &[f32], w: &[f32], keys: &[f32], head_dim: usize) -> Vec<f32> {
    let d = head_dim;
    let scale = (d as f32).powf(-0.5);
    keys.chunks(d)
        .map(|k| {
            q.chunks(d).zip(w).fold(0.0f32, |total, (qh, &wh)| {
                let dot = qh.iter().zip(k).fold(0.0f32, |acc, (&a, &b)| a.mul_add(b, acc));
                total + wh * (dot * scale).max(0.0)
            })
        })
        .collect()
}

/// The `k` positions of highest score in ascending order; equal scores prefer the earlier
/// position. All positions when there are at most `k`.
pub fn top_positions(scores: &[f32], k: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..scores.len() as u32).collect();
    if scores.len() > k {
        let rank = |a: &u32, b: &u32| {
            let (sa, sb) = (scores[*a as usize], scores[*b as usize]);
            sb.total_cmp(&sa).then(a.cmp(b))
        };
        order.select_nth_unstable_by(k, rank);
        order.truncate(k);
        order.sort_unstable();
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_row(q: &[f32], w: &[f32], keys: &[f32], d: usize) -> Vec<f32> {
        let len = keys.len() / d;
        index_scores_rows(&[RowQuery { q, w, len }], keys.into(), d).remove(0)
    }

    #[test]
    fn top_positions_keeps_the_highest_in_ascending_order() {
        let s = [0.5, 3.0, -1.0, 2.0, 2.5, 0.0];
        assert_eq!(top_positions(&s, 3), vec![1, 3, 4]);
        assert_eq!(top_positions(&s, 1), vec![1]);
        assert_eq!(top_positions(&s, 6), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(top_positions(&s, 9), vec![0, 1, 2, 3, 4, 5]);
    }

    /// Equal scores at the boundary go to the earlier position, whatever the input order.
    #[test]
    fn ties_prefer_the_earlier_position() {
        let s = [1.0, 0.0, 0.0, 2.0, 0.0, 0.0];
        assert_eq!(top_positions(&s, 3), vec![0, 1, 3]);
        assert_eq!(top_positions(&s, 4), vec![0, 1, 2, 3]);
        let all_zero = [0.0f32; 10];
        assert_eq!(top_positions(&all_zero, 4), vec![0, 1, 2, 3]);
        // -0.0 and 0.0 are ordered by total_cmp: +0 ranks above -0.
        assert_eq!(top_positions(&[-0.0, 0.0], 1), vec![1]);
    }

    /// The selection against a scalar f64 recomputation of the published formula, on a
    /// random indexer: the same positions whenever the k-th and (k+1)-th scores are apart.
    #[test]
    fn scores_follow_the_published_formula() {
        let dims = IndexerDims {
            heads: 3,
            head_dim: 8,
            rope: 4,
            topk: 5,
        };
        let mut x = 0x1234_5678u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let q: Vec<f32> = (0..dims.heads * dims.head_dim).map(|_| next()).collect();
        let w: Vec<f32> = (0..dims.heads).map(|_| next()).collect();
        let keys: Vec<f32> = (0..20 * dims.head_dim).map(|_| next()).collect();
        let got = one_row(&q, &w, &keys, dims.head_dim);
        for (t, k) in keys.chunks(dims.head_dim).enumerate() {
            let want: f64 = (0..dims.heads)
                .map(|h| {
                    let dot: f64 = (0..dims.head_dim)
                        .map(|j| q[h * dims.head_dim + j] as f64 * k[j] as f64)
                        .sum();
                    w[h] as f64 * (dot / (dims.head_dim as f64).sqrt()).max(0.0)
                })
                .sum();
            assert!((got[t] as f64 - want).abs() < 1e-6, "{t}: {} vs {want}", got[t]);
        }
    }

    /// The tiled kernel gives its scalar twin's bits, for head counts around the group size and
    /// key counts around the tile and chunk sizes.
    #[test]
    fn tiled_scores_are_the_reference_bits() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for (heads, d, keys) in [
            (1, 8, 1),
            (3, 16, 15),
            (8, 32, 16),
            (9, 24, 17),
            (16, 128, 300),
            (32, 128, 515),
        ] {
            let q: Vec<f32> = (0..heads * d).map(|_| next()).collect();
            let w: Vec<f32> = (0..heads).map(|_| next()).collect();
            let k: Vec<f32> = (0..keys * d).map(|_| next()).collect();
            let got = one_row(&q, &w, &k, d);
            let want = index_scores_reference(&q, &w, &k, d);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "heads {heads} dim {d} keys {keys}"
            );
        }
    }

    /// Rows scored together over shared keys get the bits each gets alone, whatever their
    /// lengths (shorter than, within and past a tile and a chunk).
    #[test]
    fn rows_scored_together_get_their_bits_alone() {
        let (heads, d, keys) = (5, 32, 700);
        let v = |n: usize, seed: u32| -> Vec<f32> {
            (0..n as u32)
                .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 2000) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let k = v(keys * d, 7);
        let qs: Vec<Vec<f32>> = (0..6).map(|r| v(heads * d, 100 + r)).collect();
        let ws: Vec<Vec<f32>> = (0..6).map(|r| v(heads, 200 + r)).collect();
        let lens = [1, 15, 16, 257, 512, 700];
        let rows: Vec<RowQuery<'_>> = (0..6)
            .map(|r| RowQuery {
                q: &qs[r],
                w: &ws[r],
                len: lens[r],
            })
            .collect();
        let together = index_scores_rows(&rows, (&k).into(), d);
        for (r, got) in together.iter().enumerate() {
            let alone = index_scores_reference(&qs[r], &ws[r], &k[..lens[r] * d], d);
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                alone.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "row {r}"
            );
        }
    }
}
