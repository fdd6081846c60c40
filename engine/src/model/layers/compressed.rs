//! DeepSeek-V4's attention (HF `DeepseekV4Attention`, `reference/models-2026.md` §DeepSeek-V4):
//! shared-KV multi-query attention over a sliding window plus, per layer kind, compressed
//! entries of the whole history.
//!
//! * Queries: `q_resid = RMSNorm(W_qa x)`, `q = W_qb q_resid` per head, an unweighted RMSNorm
//!   per head, interleaved RoPE on each head's trailing `rope` channels.
//! * One K=V head: `kv = RoPE(RMSNorm(W_kv x))`, keys and values alike.
//! * A compressor (compressed layers) pools each window of `ratio` positions into one entry:
//!   per channel, the softmax over the window's slots of `gate + ape` weights the slots' `kv`,
//!   then RMSNorm and RoPE at the window's first position. With overlap (compressed sparse
//!   attention) each entry also pools the previous window's second series (`2·ratio` slots).
//! * Compressed sparse attention keeps the `top_k` entries the lightning indexer scores
//!   highest (`Σ_h w_h · relu(q_h·k)·d^-½`, keys from its own compressor); heavily compressed
//!   attention attends to every closed entry.
//! * Row `t` sees the last `window` positions and the entries of windows that closed by `t`,
//!   with a per-head sink in the softmax. The output's rope channels are rotated back by the
//!   query's position, and heads are projected in `o_groups` groups through `W_oa` (a rank
//!   `o_rank` each) and then `W_ob`.
//!
//! The cache ([`CompressedCache`]) keeps every position's kv and compressor inputs, so an entry
//! is computed from the same values whatever the chunking, and each row's result does not
//! depend on the other rows of the pass.

use rayon::prelude::*;

use super::ops::{Host, Ops};
use super::rope::Rope;
use crate::backend::WeightClass;
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kernels::math::exp;
use crate::kernels::ops::{dot16, rms_inv, rms_norm_rows};
use crate::model::Loader;
use crate::state::{CompressedCache, Paged};

/// Shapes of a DeepSeek-V4 attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressedDims {
    pub heads: usize,
    pub head_dim: usize,
    /// Rotated trailing channels of each head.
    pub rope: usize,
    pub q_lora: usize,
    pub o_groups: usize,
    pub o_rank: usize,
    pub window: usize,
}

/// The lightning indexer's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct V4IndexerDims {
    pub heads: usize,
    pub head_dim: usize,
    pub top_k: usize,
}

/// A layer's attention kind (`layer_types`, or `compress_ratios`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// The sliding window only.
    Sliding,
    /// Compressed sparse attention: overlapping windows and the indexer.
    Sparse { ratio: usize },
    /// Heavily compressed attention: disjoint windows, every entry attended.
    Heavy { ratio: usize },
}

impl AttentionKind {
    /// Positions per compressed entry (0: none).
    pub fn ratio(self) -> usize {
        match self {
            AttentionKind::Sliding => 0,
            AttentionKind::Sparse { ratio } | AttentionKind::Heavy { ratio } => ratio,
        }
    }
}

/// Rotate the trailing `2·(factors.len()/2)` channels of `x` by interleaved pairs
/// (`x_{2i}, x_{2i+1}`), with `(cos, sin)` factors ([`Rope::factors_into`]); `inverse` rotates
/// by `-sin`. HF `apply_rotary_pos_emb`: `x·cos + rotate_half(x)·sin`, pairs kept in place.
fn rotate(x: &mut [f32], factors: &[f32], inverse: bool) {
    let off = x.len() - factors.len();
    for (i, f) in factors.chunks_exact(2).enumerate() {
        let (cos, sin) = (f[0], if inverse { -f[1] } else { f[1] });
        let (a, b) = (x[off + 2 * i], x[off + 2 * i + 1]);
        x[off + 2 * i] = a * cos + -b * sin;
        x[off + 2 * i + 1] = b * cos + a * sin;
    }
}

fn factors(rope: &Rope, pos: usize, dim: usize) -> Vec<f32> {
    let mut f = vec![0.0f32; dim];
    rope.factors_into(pos, &mut f);
    f
}

/// A window pooler (HF `DeepseekV4{CSA,HCA}Compressor`, the indexer's own).
#[derive(Debug)]
pub struct Compressor {
    /// `[c·d, H]` kv and gate projections (`c = 2` with overlap).
    pub wkv: Matrix,
    pub wgate: Matrix,
    /// `[ratio, c·d]` position bias on the gate.
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
    pub ratio: usize,
    pub overlap: bool,
    /// Entry width `d`.
    pub dim: usize,
}

impl Compressor {
    fn load(ld: &Loader<'_>, p: &str, (h, dim, ratio, overlap): (usize, usize, usize, bool)) -> Result<Self> {
        let c = if overlap { 2 } else { 1 };
        Ok(Compressor {
            wkv: ld.linear(&format!("{p}.kv_proj"), c * dim, h)?,
            wgate: ld.linear(&format!("{p}.gate_proj"), c * dim, h)?,
            ape: ld.floats(&format!("{p}.position_bias"), &[ratio, c * dim])?,
            norm: ld.vector(&format!("{p}.kv_norm.weight"), dim)?,
            ratio,
            overlap,
            dim,
        })
    }

    /// Each row's inputs: its kv projection then its gate projection.
    fn inputs<O: Ops>(&self, o: &O, x: &O::Buf, n: usize) -> Result<O::Buf> {
        let w = self.wkv.rows;
        let kv = o.project(&self.wkv, WeightClass::Spine, x, n)?;
        let gate = o.project(&self.wgate, WeightClass::Spine, x, n)?;
        o.assemble(n, &[(&kv, (w, 0, w)), (&gate, (w, 0, w))])
    }

    /// Entry `w` from the inputs held (the window's positions, and the previous window's with
    /// overlap), normalised and rotated to position `w·ratio`.
    fn entry(&self, inputs: &Paged, w: usize, rope: &Rope, eps: f32) -> Vec<f32> {
        let (d, r) = (self.dim, self.ratio);
        let c = if self.overlap { 2 } else { 1 };
        // (position, slot in the window, channel offset in kv / gate) per pooled slot, in order.
        let mut slots = Vec::with_capacity(2 * r);
        if self.overlap && w > 0 {
            slots.extend((0..r).map(|j| ((w - 1) * r + j, j, 0)));
        }
        let second = if self.overlap { d } else { 0 };
        slots.extend((0..r).map(|j| (w * r + j, j, second)));
        let rows: Vec<&[f32]> = slots.iter().map(|&(pos, _, _)| inputs.row(pos)).collect();
        let mut out = vec![0.0f32; d];
        let mut logits = vec![0.0f32; slots.len()];
        for (ch, o) in out.iter_mut().enumerate() {
            let mut max = f32::NEG_INFINITY;
            for ((l, &(_, j, off)), row) in logits.iter_mut().zip(&slots).zip(&rows) {
                *l = row[c * d + off + ch] + self.ape[j * c * d + off + ch];
                max = max.max(*l);
            }
            let mut sum = 0.0f32;
            for l in logits.iter_mut() {
                *l = exp(*l - max);
                sum += *l;
            }
            let mut acc = 0.0f32;
            for ((l, &(_, _, off)), row) in logits.iter().zip(&slots).zip(&rows) {
                acc += row[off + ch] * (l / sum);
            }
            *o = acc;
        }
        let mut out = rms_norm_rows(&out, &self.norm, eps, d);
        rotate(&mut out, &factors(rope, w * r, rope.dim()), false);
        out
    }
}

/// The lightning indexer of compressed sparse attention.
#[derive(Debug)]
pub struct V4Indexer {
    pub compressor: Compressor,
    /// `[heads·head_dim, q_lora]`.
    pub wq_b: Matrix,
    /// `[heads, H]`.
    pub weights_proj: Matrix,
    pub dims: V4IndexerDims,
}

/// A DeepSeek-V4 attention layer.
#[derive(Debug)]
pub struct CompressedAttention {
    pub dims: CompressedDims,
    pub kind: AttentionKind,
    pub wq_a: Matrix,
    pub q_norm: Vec<f32>,
    pub wq_b: Matrix,
    pub wkv: Matrix,
    pub kv_norm: Vec<f32>,
    /// `[o_groups·o_rank, heads·head_dim / o_groups]`.
    pub wo_a: Matrix,
    /// `wo_a`'s rows of each group, viewing its bytes, when its format can split there (block
    /// FP8 needs `o_rank` a multiple of the block rows; V4-Flash's 1024 is).
    pub wo_a_groups: Option<Vec<Matrix>>,
    pub wo_b: Matrix,
    pub sinks: Vec<f32>,
    /// The queries' and keys' RoPE (plain on sliding layers, the compressed one otherwise).
    pub rope: Rope,
    /// The compressors' and indexer's RoPE.
    pub compress_rope: Rope,
    pub compressor: Option<Compressor>,
    pub indexer: Option<V4Indexer>,
    pub eps: f32,
}

/// A pass's projections of a DeepSeek-V4 attention layer (on the device that ran them), for
/// its host core: the query heads before their norm and RoPE, the normalised kv before RoPE,
/// the compressor's inputs (kv then gate per row) and the indexer's projections.
#[derive(Debug)]
pub struct CompressedProjected<B> {
    pub q: B,
    pub kv: B,
    pub inputs: Option<B>,
    pub index: Option<IndexProjected<B>>,
}

impl<B> CompressedProjected<B> {
    /// Every buffer through `f` (e.g. a device's down to the host).
    pub fn map<C>(self, mut f: impl FnMut(B) -> Result<C>) -> Result<CompressedProjected<C>> {
        let index = match self.index {
            Some(ix) => Some(IndexProjected {
                q: f(ix.q)?,
                weights: f(ix.weights)?,
                inputs: f(ix.inputs)?,
            }),
            None => None,
        };
        Ok(CompressedProjected {
            q: f(self.q)?,
            kv: f(self.kv)?,
            inputs: self.inputs.map(&mut f).transpose()?,
            index,
        })
    }
}

/// The lightning indexer's projections of a pass: its queries (before RoPE), head weights
/// (before scaling) and its compressor's inputs.
#[derive(Debug)]
pub struct IndexProjected<B> {
    pub q: B,
    pub weights: B,
    pub inputs: B,
}

/// A pass's rows ready for the attention ([`CompressedAttention::prepare`]): their rotated,
/// normalised query heads `[n, heads·head_dim]` and each row's compressed entries, ascending.
#[derive(Debug)]
pub struct Prepared {
    pub q: Vec<f32>,
    pub selected: Vec<Vec<usize>>,
}

/// The indexer's choice for a pass made outside the host core (a device): each of `sparse`'s
/// rows' chosen entries, ascending ([`top_k`] of [`index_scores`]).
pub type IndexChoose<'a> = &'a mut dyn FnMut(IndexRows<'_, '_>) -> Result<Vec<Vec<usize>>>;

/// A pass's rows as the indexer sees them once the pass's entries are in the caches.
#[derive(Debug)]
pub struct IndexRows<'a, 'b> {
    /// The rows (ascending) with more closed entries than the indexer keeps.
    pub sparse: &'a [usize],
    /// Every row's rotated queries `[n, heads·head_dim]` and scaled head weights `[n, heads]`.
    pub q: &'a [f32],
    pub w: &'a [f32],
    pub seq: &'a [usize],
    pub pos: &'a [usize],
    pub caches: &'a [&'b mut CompressedCache],
}

/// The rows of one pass: each row's sequence cache and position.
#[derive(Debug)]
pub struct CompressedRows<'a, 'b> {
    pub caches: &'a mut [&'b mut CompressedCache],
    pub seq: &'a [usize],
    pub pos: &'a [usize],
}

/// Everything the loader needs beyond the layer's names.
#[derive(Debug, Clone, Copy)]
pub struct CompressedSpec<'r> {
    pub hidden: usize,
    pub dims: CompressedDims,
    pub kind: AttentionKind,
    pub indexer: V4IndexerDims,
    pub rope: &'r Rope,
    pub compress_rope: &'r Rope,
    pub eps: f32,
}

impl CompressedAttention {
    /// Load the layer below `a` (HF names: `q_a_proj`, `compressor.indexer.q_b_proj`, ...).
    pub fn load(ld: &Loader<'_>, a: &str, spec: CompressedSpec<'_>) -> Result<Self> {
        let (h, d) = (spec.hidden, spec.dims);
        let (hd, g) = (d.heads * d.head_dim, d.o_groups);
        let c = format!("{a}.compressor");
        let (compressor, indexer) = match spec.kind {
            AttentionKind::Sliding => (None, None),
            AttentionKind::Heavy { ratio } => (
                Some(Compressor::load(ld, &c, (h, d.head_dim, ratio, false))?),
                None,
            ),
            AttentionKind::Sparse { ratio } => {
                let i = spec.indexer;
                let ix = format!("{c}.indexer");
                let indexer = V4Indexer {
                    compressor: Compressor::load(ld, &ix, (h, i.head_dim, ratio, true))?,
                    wq_b: ld.linear(&format!("{ix}.q_b_proj"), i.heads * i.head_dim, d.q_lora)?,
                    weights_proj: ld.linear(&format!("{ix}.scorer.weights_proj"), i.heads, h)?,
                    dims: i,
                };
                let comp = Compressor::load(ld, &c, (h, d.head_dim, ratio, true))?;
                (Some(comp), Some(indexer))
            }
        };
        let wo_a = ld.linear(&format!("{a}.o_a_proj"), g * d.o_rank, hd / g)?;
        let wo_a_groups = (0..g)
            .map(|i| wo_a.row_block(i * d.o_rank..(i + 1) * d.o_rank))
            .collect();
        Ok(CompressedAttention {
            dims: d,
            kind: spec.kind,
            wq_a: ld.linear(&format!("{a}.q_a_proj"), d.q_lora, h)?,
            q_norm: ld.vector(&format!("{a}.q_a_norm.weight"), d.q_lora)?,
            wq_b: ld.linear(&format!("{a}.q_b_proj"), hd, d.q_lora)?,
            wkv: ld.linear(&format!("{a}.kv_proj"), d.head_dim, h)?,
            kv_norm: ld.vector(&format!("{a}.kv_norm.weight"), d.head_dim)?,
            wo_a,
            wo_a_groups,
            wo_b: ld.linear(&format!("{a}.o_b_proj"), h, g * d.o_rank)?,
            sinks: ld.vector(&format!("{a}.sinks"), d.heads)?,
            rope: spec.rope.clone(),
            compress_rope: spec.compress_rope.clone(),
            compressor,
            indexer,
            eps: spec.eps,
        })
    }

    /// The layer over `n` rows of `x` (already normalised) on the CPU, appending each row to
    /// its cache.
    pub fn forward(&self, x: &[f32], n: usize, rows: &mut CompressedRows<'_, '_>) -> Vec<f32> {
        self.run(&Host, &x.to_vec(), n, |p| self.core(p, n, rows, None))
            .expect("the CPU runs every DeepSeek-V4 attention form")
    }

    /// The layer over `n` rows of `x` on `o`'s device: the projections there, then `core` (the
    /// rest: [`CompressedAttention::core`] over the rows' caches on the host, or
    /// [`CompressedAttention::prepare`] and a device's attention) gives the heads' outputs on
    /// the device, which go through the grouped output projection there.
    pub fn run<O: Ops>(
        &self,
        o: &O,
        x: &O::Buf,
        n: usize,
        core: impl FnOnce(CompressedProjected<O::Buf>) -> Result<O::Buf>,
    ) -> Result<O::Buf> {
        let (d, spine) = (self.dims, WeightClass::Spine);
        let q_a = o.project(&self.wq_a, spine, x, n)?;
        let q_resid = o.rms_norm(&q_a, &o.constant(&self.q_norm)?, n, d.q_lora, self.eps)?;
        let kv = o.project(&self.wkv, spine, x, n)?;
        let index = match &self.indexer {
            Some(ix) => Some(IndexProjected {
                q: o.project(&ix.wq_b, spine, &q_resid, n)?,
                weights: o.project(&ix.weights_proj, spine, x, n)?,
                inputs: ix.compressor.inputs(o, x, n)?,
            }),
            None => None,
        };
        let heads = core(CompressedProjected {
            q: o.project(&self.wq_b, spine, &q_resid, n)?,
            kv: o.rms_norm(&kv, &o.constant(&self.kv_norm)?, n, d.head_dim, self.eps)?,
            inputs: self.compressor.as_ref().map(|c| c.inputs(o, x, n)).transpose()?,
            index,
        })?;
        self.output(o, &heads, n)
    }

    /// The host part of a pass over `n` projected rows: [`CompressedAttention::prepare`], then
    /// the attention here; the heads' outputs `[n, heads·head_dim]`.
    pub fn core(
        &self,
        p: CompressedProjected<Vec<f32>>,
        n: usize,
        rows: &mut CompressedRows<'_, '_>,
        choose: Option<IndexChoose<'_>>,
    ) -> Result<Vec<f32>> {
        let prepared = self.prepare(p, n, rows, choose)?;
        let (d, caches) = (self.dims, &*rows.caches);
        let width = d.heads * d.head_dim;
        let per_row: Vec<Vec<f32>> = (0..n)
            .into_par_iter()
            .map(|r| {
                let q = &prepared.q[r * width..(r + 1) * width];
                self.attend(q, caches[rows.seq[r]], rows.pos[r], &prepared.selected[r])
            })
            .collect();
        Ok(per_row.concat())
    }

    /// Everything of a pass before the attention, on the host: the query heads' norm and RoPE,
    /// the keys' RoPE, the rows appended to their caches (entries pooled as windows close) and
    /// each row's entries (the indexer's choice by `choose` where given, e.g. on a device, else
    /// here; every closed entry on heavily compressed layers; none on sliding ones).
    pub fn prepare(
        &self,
        p: CompressedProjected<Vec<f32>>,
        n: usize,
        rows: &mut CompressedRows<'_, '_>,
        choose: Option<IndexChoose<'_>>,
    ) -> Result<Prepared> {
        let d = self.dims;
        let hd = d.head_dim;
        let (mut q, mut kv) = (p.q, p.kv);
        for r in 0..n {
            let f = factors(&self.rope, rows.pos[r], d.rope);
            for head in q[r * d.heads * hd..(r + 1) * d.heads * hd].chunks_mut(hd) {
                let inv = rms_inv(head, self.eps);
                head.iter_mut().for_each(|v| *v *= inv);
                rotate(head, &f, false);
            }
            rotate(&mut kv[r * hd..(r + 1) * hd], &f, false);
        }
        let (index_inputs, index_q) = match p.index {
            Some(ix) => (
                Some(ix.inputs),
                Some(self.index_queries(ix.q, ix.weights, rows.pos)),
            ),
            None => (None, None),
        };
        self.append(n, &kv, (p.inputs, index_inputs), rows);
        let caches: &[&mut CompressedCache] = rows.caches;
        let index = index_q.as_ref().map(|(q, w)| (&q[..], &w[..]));
        let mut chosen = vec![None; n];
        if let (Some(choose), Some((q, w)), Some(ix)) = (choose, index, &self.indexer) {
            let ratio = self.kind.ratio().max(1);
            let sparse: Vec<usize> = (0..n)
                .filter(|&r| (rows.pos[r] + 1) / ratio > ix.dims.top_k)
                .collect();
            let picked = choose(IndexRows {
                sparse: &sparse,
                q,
                w,
                seq: rows.seq,
                pos: rows.pos,
                caches,
            })?;
            for (&r, c) in sparse.iter().zip(picked) {
                chosen[r] = Some(c);
            }
        }
        let selected = chosen
            .into_par_iter()
            .enumerate()
            .map(|(r, c)| match c {
                Some(c) => c,
                None => self.selection(caches[rows.seq[r]], rows.pos[r], index, r),
            })
            .collect();
        Ok(Prepared { q, selected })
    }

    /// Append the rows' kv and compressor inputs to their caches, and each entry whose window
    /// the rows close.
    fn append(
        &self,
        n: usize,
        kv: &[f32],
        (inputs, index_inputs): (Option<Vec<f32>>, Option<Vec<f32>>),
        rows: &mut CompressedRows<'_, '_>,
    ) {
        let hd = self.dims.head_dim;
        for r in 0..n {
            let cache = &mut *rows.caches[rows.seq[r]];
            debug_assert_eq!(cache.kv.len(), rows.pos[r], "rows of a sequence come in order");
            cache.kv.push(&kv[r * hd..(r + 1) * hd]);
            let closes = |c: &Compressor| (rows.pos[r] + 1).is_multiple_of(c.ratio);
            if let (Some(c), Some(inp)) = (&self.compressor, &inputs) {
                let w = inp.len() / n;
                cache.inputs.push(&inp[r * w..(r + 1) * w]);
                if closes(c) {
                    let e = c.entry(
                        &cache.inputs,
                        rows.pos[r] / c.ratio,
                        &self.compress_rope,
                        self.eps,
                    );
                    cache.entries.push(&e);
                }
            }
            if let (Some(ix), Some(inp)) = (&self.indexer, &index_inputs) {
                let w = inp.len() / n;
                cache.index_inputs.push(&inp[r * w..(r + 1) * w]);
                let c = &ix.compressor;
                if closes(c) {
                    let e = c.entry(
                        &cache.index_inputs,
                        rows.pos[r] / c.ratio,
                        &self.compress_rope,
                        self.eps,
                    );
                    cache.index_keys.push(&e);
                }
            }
        }
    }

    /// The indexer's rotated queries `[n, heads·head_dim]` and head weights `[n, heads]`
    /// (`weights_proj(x)·heads^-½`) from their projections `q` and `w`.
    fn index_queries(&self, mut q: Vec<f32>, mut w: Vec<f32>, pos: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let Some(ix) = &self.indexer else {
            return (q, w);
        };
        let i = ix.dims;
        for (r, row) in q.chunks_mut(i.heads * i.head_dim).enumerate() {
            let f = factors(&self.compress_rope, pos[r], self.dims.rope);
            row.chunks_mut(i.head_dim).for_each(|h| rotate(h, &f, false));
        }
        let scale = (i.heads as f32).powf(-0.5);
        w.iter_mut().for_each(|v| *v *= scale);
        (q, w)
    }

    /// The compressed entries row `pos` attends to, ascending: none on sliding layers, every
    /// closed one on heavily compressed layers, the indexer's top `k` otherwise.
    fn selection(
        &self,
        cache: &CompressedCache,
        pos: usize,
        index: Option<(&[f32], &[f32])>,
        r: usize,
    ) -> Vec<usize> {
        let closed = match self.kind {
            AttentionKind::Sliding => return Vec::new(),
            AttentionKind::Sparse { ratio } | AttentionKind::Heavy { ratio } => (pos + 1) / ratio,
        };
        let (Some(ix), Some((q, w))) = (&self.indexer, index) else {
            return (0..closed).collect();
        };
        let i = ix.dims;
        let q = &q[r * i.heads * i.head_dim..(r + 1) * i.heads * i.head_dim];
        let w = &w[r * i.heads..(r + 1) * i.heads];
        let scores = index_scores((q, w), |s| cache.index_keys.row(s), closed, i.head_dim);
        top_k(&scores, i.top_k)
    }

    /// One row's attention: its heads over the window and the selected entries, with sinks;
    /// each head's output rotated back by the query's position.
    fn attend(&self, q: &[f32], cache: &CompressedCache, pos: usize, selected: &[usize]) -> Vec<f32> {
        let d = self.dims;
        let hd = d.head_dim;
        let lo = (pos + 1).saturating_sub(d.window);
        let keys: Vec<&[f32]> = (lo..=pos)
            .map(|j| cache.kv.row(j))
            .chain(selected.iter().map(|&s| cache.entries.row(s)))
            .collect();
        let scale = (hd as f32).powf(-0.5);
        let back = factors(&self.rope, pos, d.rope);
        let mut out = vec![0.0f32; d.heads * hd];
        let mut logits = vec![0.0f32; keys.len()];
        for (h, (qh, oh)) in q.chunks(hd).zip(out.chunks_mut(hd)).enumerate() {
            attend_head(qh, &keys, (self.sinks[h], scale), &mut logits, oh);
            rotate(oh, &back, true);
        }
        out
    }

    /// The grouped low-rank output projection of `n` rows of head outputs.
    fn output<O: Ops>(&self, o: &O, heads: &O::Buf, n: usize) -> Result<O::Buf> {
        let d = self.dims;
        let low = grouped(
            o,
            (&self.wo_a, self.wo_a_groups.as_deref()),
            heads,
            (n, d.o_groups, d.o_rank),
        )?;
        o.project(&self.wo_b, WeightClass::Spine, &low, n)
    }
}

/// One head's attention over `keys` (K = V) with a `sink` into `out` (zeros on entry): scores
/// `dot16(q, k)·scale`; the maximum over the sink and the scores; the sum from the sink's term,
/// then the keys' in order; `out = Σ_j (e_j / sum)·k_j` in key order. `logits` holds a score per
/// key. The device's `deltafin_v4_attend` computes the same bits.
pub fn attend_head(
    q: &[f32],
    keys: &[&[f32]],
    (sink, scale): (f32, f32),
    logits: &mut [f32],
    out: &mut [f32],
) {
    let mut max = sink;
    for (l, k) in logits.iter_mut().zip(keys) {
        *l = dot16(q, k) * scale;
        max = max.max(*l);
    }
    let mut sum = exp(sink - max);
    for l in logits.iter_mut() {
        *l = exp(*l - max);
        sum += *l;
    }
    for (l, k) in logits.iter().zip(keys) {
        let p = l / sum;
        out.iter_mut().zip(k.iter()).for_each(|(o, v)| *o += p * v);
    }
}

/// HF `DeepseekV4GroupedLinear`: group `i` of each of `n` rows of `heads` (`g` equal groups)
/// through `wo_a`'s rows `i·rank..(i+1)·rank`, the `g·rank` results of a row side by side.
/// With `groups` (those rows as their own matrices) each group's rows go through its own only;
/// else every group's input goes through the whole `wo_a` and keeps its rows (`g` times the
/// work, the same values: each output is its row's dot product either way).
fn grouped<O: Ops>(
    o: &O,
    (wo_a, groups): (&Matrix, Option<&[Matrix]>),
    heads: &O::Buf,
    (n, g, rank): (usize, usize, usize),
) -> Result<O::Buf> {
    let width = wo_a.cols;
    let Some(groups) = groups else {
        let r = wo_a.rows;
        let all = o.project(wo_a, WeightClass::Spine, heads, n * g)?;
        let parts: Vec<_> = (0..g).map(|i| (&all, (g * r, i * r + i * rank, rank))).collect();
        return o.assemble(n, &parts);
    };
    let ys = groups
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let x = o.assemble(n, &[(heads, (g * width, i * width, width))])?;
            o.project(m, WeightClass::Spine, &x, n)
        })
        .collect::<Result<Vec<_>>>()?;
    let parts: Vec<_> = ys.iter().map(|y| (y, (rank, 0, rank))).collect();
    o.assemble(n, &parts)
}

/// One row's indexer scores over its `closed` entries' keys (`keys(s)`): per entry
/// `Σ_h relu(q_h·k)·d^-½·w_h` (16-lane dots, heads summed in order; `w` already scaled by
/// `heads^-½`). The device's `deltafin_dsa_scores` in V4's order computes the same bits.
pub fn index_scores<'k>(
    (q, w): (&[f32], &[f32]),
    keys: impl Fn(usize) -> &'k [f32],
    closed: usize,
    d: usize,
) -> Vec<f32> {
    let scale = (d as f32).powf(-0.5);
    (0..closed)
        .map(|s| {
            let k = keys(s);
            q.chunks(d)
                .zip(w)
                .map(|(qh, &wh)| dot16(qh, k).max(0.0) * scale * wh)
                .sum()
        })
        .collect()
}

/// The indices of the `k` largest scores, ascending (ties to the lower index; all of them when
/// there are at most `k`).
///
/// The order (score descending, then index ascending) is total, so a selection in linear time
/// (`select_nth_unstable_by`) keeps exactly the set a full sort would (at 32k tokens a sparse
/// layer scores 8k entries per row; measured, the prefill time did not change beyond noise).
pub fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..scores.len()).collect();
    if ids.len() > k {
        if k == 0 {
            return Vec::new();
        }
        ids.select_nth_unstable_by(k - 1, |&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        ids.truncate(k);
        ids.sort_unstable();
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_keeps_the_largest_and_breaks_ties_to_the_lower_index() {
        assert_eq!(top_k(&[0.5, 2.0, 1.0, 2.0, -1.0], 2), vec![1, 3]);
        assert_eq!(top_k(&[1.0, 1.0, 1.0], 2), vec![0, 1]);
        assert_eq!(top_k(&[3.0, 1.0], 4), vec![0, 1]);
        assert_eq!(top_k(&[3.0, 1.0], 0), Vec::<usize>::new());
    }

    /// The linear-time selection keeps the set a full sort keeps, on scores with many ties.
    #[test]
    fn top_k_selection_equals_the_full_sort() {
        let sorted = |scores: &[f32], k: usize| {
            let mut ids: Vec<usize> = (0..scores.len()).collect();
            ids.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            ids.truncate(k);
            ids.sort_unstable();
            ids
        };
        for n in [1usize, 7, 64, 1000] {
            let scores: Vec<f32> = (0..n).map(|i| ((i * 7919 % 13) as f32 - 6.0) / 4.0).collect();
            for k in [1, 3, 8, 512] {
                assert_eq!(top_k(&scores, k), sorted(&scores, k), "n {n} k {k}");
            }
        }
    }

    /// Each group through its own rows of `W_oa` gives the bits of every group through the
    /// whole matrix (BF16, and block FP8 split on block rows); FP8 rows that split a block
    /// cannot be viewed on their own.
    #[test]
    fn grouped_projection_through_row_blocks_gives_the_same_bits() {
        use crate::kernels::Format;
        use crate::weights::Blob;
        let (n, g, rank, width) = (3, 2, 128, 40);
        let bf16: Vec<u8> = (0..g * rank * width)
            .flat_map(|i| half::bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 64.0).to_le_bytes())
            .collect();
        let codes: Vec<u8> = (0..g * rank * width).map(|i| ((i * 53) % 120) as u8).collect();
        let scales: Vec<u8> = [0.5f32, 0.25].iter().flat_map(|v| v.to_le_bytes()).collect();
        let fp8 = Format::Fp8Block {
            block_rows: 128,
            block_cols: 128,
        };
        let heads: Vec<f32> = (0..n * g * width)
            .map(|i| ((i * 17 % 23) as f32 - 11.0) / 7.0)
            .collect();
        for m in [
            Matrix::new(Format::Bf16, g * rank, width, Blob::from_vec(bf16), None).unwrap(),
            Matrix::new(
                fp8,
                g * rank,
                width,
                Blob::from_vec(codes),
                Some(Blob::from_vec(scales)),
            )
            .unwrap(),
        ] {
            let groups: Option<Vec<Matrix>> = (0..g).map(|i| m.row_block(i * rank..(i + 1) * rank)).collect();
            let groups = groups.expect("both formats split at 128 rows");
            let whole = grouped(&Host, (&m, None), &heads, (n, g, rank)).unwrap();
            let split = grouped(&Host, (&m, Some(&groups)), &heads, (n, g, rank)).unwrap();
            assert_eq!(
                whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                split.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{:?}",
                m.format
            );
            assert!(
                m.row_block(64..192).is_none() || m.format == Format::Bf16,
                "an FP8 block split"
            );
        }
    }

    #[test]
    fn the_inverse_rotation_undoes_the_rotation() {
        let rope = Rope::new(&crate::config::RopeConfig::default(), 4, true);
        let f = factors(&rope, 37, 4);
        let x = vec![0.3f32, -1.2, 0.7, 2.5, -0.4, 1.1];
        let mut y = x.clone();
        rotate(&mut y, &f, false);
        assert_ne!(y, x);
        assert_eq!(&y[..2], &x[..2], "only the trailing rope channels turn");
        rotate(&mut y, &f, true);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-6, "{a} {b}");
        }
    }
}
