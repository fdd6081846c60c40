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

use super::latent_attention::dot16;
use super::rope::Rope;
use crate::backend::matmul;
use crate::kernels::Matrix;
use crate::kernels::ops::layer_norm;

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
        keys: &(dyn Fn(usize) -> &'k [f32] + Sync),
    ) -> Selection {
        let IndexerDims {
            heads,
            head_dim,
            topk,
            ..
        } = self.dims;
        if (0..n).all(|i| pos(i) < topk) {
            return vec![None; n];
        }
        let mut q = vec![0.0; n * heads * head_dim];
        matmul(&self.wq_b, q_resid, n, &mut q);
        let mut w = vec![0.0; n * heads];
        matmul(&self.weights_proj, x, n, &mut w);
        let w_scale = (heads as f32).powf(-0.5);
        w.iter_mut().for_each(|v| *v *= w_scale);
        (0..n)
            .into_par_iter()
            .map(|i| {
                let len = pos(i) + 1;
                if len <= topk {
                    return None;
                }
                let qi = &mut q[i * heads * head_dim..][..heads * head_dim].to_vec();
                let mut f = vec![0.0f32; self.dims.rope];
                self.rope.factors_into(pos(i), &mut f);
                for h in qi.chunks_mut(head_dim) {
                    self.rope.apply_factors(&mut h[..self.dims.rope], &f);
                }
                let scores = self.scores(qi, &w[i * heads..][..heads], &keys(i)[..len * head_dim]);
                Some(top_positions(&scores, topk))
            })
            .collect()
    }

    /// `Σ_h w_h · relu(scale · q_h · k_t)` for every key `t` of `keys` (`head_dim` values each).
    fn scores(&self, q: &[f32], w: &[f32], keys: &[f32]) -> Vec<f32> {
        let d = self.dims.head_dim;
        let scale = (d as f32).powf(-0.5);
        let mut scores = vec![0.0f32; keys.len() / d];
        scores
            .par_chunks_mut(SCORE_CHUNK)
            .zip(keys.par_chunks(SCORE_CHUNK * d))
            .for_each(|(out, keys)| {
                for (s, k) in out.iter_mut().zip(keys.chunks(d)) {
                    *s = q.chunks(d).zip(w).fold(0.0f32, |acc, (qh, &wh)| {
                        acc + wh * (dot16(qh, k) * scale).max(0.0)
                    });
                }
            });
        scores
    }
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
    use crate::kernels::Format;
    use crate::weights::Blob;

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
        let zeros = |rows: usize| {
            let bytes = vec![0u8; rows * 4];
            Matrix::new(Format::F32, rows, 1, Blob::from_vec(bytes), None).unwrap()
        };
        let ix = Indexer {
            dims,
            wq_b: zeros(dims.heads * dims.head_dim),
            wk: zeros(dims.head_dim),
            k_norm: vec![1.0; dims.head_dim],
            k_bias: vec![0.0; dims.head_dim],
            weights_proj: zeros(dims.heads),
            rope: Rope::new(&Default::default(), dims.rope, true),
        };
        let got = ix.scores(&q, &w, &keys);
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
}
