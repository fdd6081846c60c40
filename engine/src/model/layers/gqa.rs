//! Grouped-query attention of the Llama family (HF `LlamaAttention` and its descendants: Qwen3,
//! Qwen3-MoE, GLM-4.5, gpt-oss, MiniMax-M2): `q/k/v_proj` (optional biases), an optional RMSNorm
//! of queries and keys (`q_norm`, `k_norm`: per head over `head_dim`, or over the whole
//! projection as MiniMax-M2 does), `rotate_half` RoPE on the first `rotary_dim` values of each
//! head (partial rotary: the rest pass through), causal softmax with scale
//! `head_dim^-0.5`, query head `h` reading key/value head `h / (heads / kv_heads)`, then `o_proj`.
//! gpt-oss adds two options: a learned per-head *sink* logit that joins each softmax's
//! normaliser but has no value (HF `eager_attention_forward` with `s_aux`), and a sliding window
//! (a row at position `p` sees positions `p - window + 1 ..= p`, HF `sliding_window_overlay`).
//!
//! The cache ([`KvCache`]) holds every position's rotated keys and values. A pass appends all its
//! rows first, then each `(row, head)` attends over positions `0..=pos` in ascending order, by
//! the same operations whatever the thread count, the batch or the chunking of the prompt: each
//! task reads only its own query and the cache prefix it may see, so results are batch invariant
//! and chunk invariant. Tasks run on the rayon pool when a pass is large enough to pay for it.

use rayon::prelude::*;

use super::ops::{Host, Ops};
use super::rope::Rope;
use crate::backend::WeightClass;
use crate::backend::abi::RopeLayout;
use crate::config::RopeConfig;
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kernels::math::exp;
use crate::model::{Loader, NormWeight};
use crate::state::KvCache;

/// Below this many score multiply-adds a pass attends on the calling thread.
const PARALLEL_WORK: usize = 1 << 16;

/// Head layout and norm epsilon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GqaDims {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Leading values of each head that are rotated (`head_dim` unless partial rotary).
    pub rotary_dim: usize,
}

impl GqaDims {
    /// The softmax scale `head_dim^-0.5`.
    pub fn scale(&self) -> f32 {
        (self.head_dim as f32).powf(-0.5)
    }
}

/// Which optional tensors a checkpoint's attention has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GqaOptions {
    /// `q_proj`/`k_proj`/`v_proj` carry biases (`attention_bias`).
    pub qkv_bias: bool,
    /// `o_proj` carries a bias (Qwen3-MoE with `attention_bias`; never in GLM-4.5).
    pub o_bias: bool,
    /// RMSNorms of queries and keys (`q_norm`, `k_norm`) before RoPE.
    pub qk_norm: QkNorm,
    /// RMSNorm epsilon of the q/k norms.
    pub eps: f32,
    /// How the q/k norm weights are stored.
    pub norm_weight: NormWeight,
    /// A per-head sink logit `{prefix}.sinks` (gpt-oss).
    pub sinks: bool,
    /// Sliding-window width of this layer (`None`: full causal attention).
    pub window: Option<usize>,
    /// `q_proj` also yields a per-channel output gate (Qwen3-Next, Qwen3.5: each head's `d` query
    /// rows are followed by its `d` gate rows); the attention output is scaled by `σ(gate)`
    /// before `o_proj`.
    pub output_gate: bool,
}

/// Where the q/k RMSNorms normalise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Over each head (`head_dim` weights: Qwen3, GLM-4.5 `use_qk_norm`).
    PerHead,
    /// Over the whole projection, all heads at once (`heads * head_dim` weights: MiniMax-M2).
    Whole,
}

/// One attention layer.
#[derive(Debug, Clone)]
pub struct Gqa {
    q: Matrix,
    k: Matrix,
    v: Matrix,
    o: Matrix,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    o_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    qk_norm: QkNorm,
    sinks: Option<Vec<f32>>,
    window: Option<usize>,
    output_gate: bool,
    eps: f32,
    rope: Rope,
    dims: GqaDims,
}

/// The rows of a pass: the caches of its sequences, and each row's sequence and position.
#[derive(Debug)]
pub struct KvRows<'a, 'c> {
    pub caches: &'a mut [&'c mut KvCache],
    pub seq: &'a [usize],
    pub pos: &'a [usize],
}

impl Gqa {
    /// Load `{prefix}.{q,k,v,o}_proj` (+ biases, norms as `opts` says) for a model of width
    /// `hidden`.
    pub fn load(
        ld: &Loader<'_>,
        prefix: &str,
        hidden: usize,
        dims: GqaDims,
        rope: &RopeConfig,
        opts: GqaOptions,
    ) -> Result<Gqa> {
        let (qw, kw, d) = (
            dims.heads * dims.head_dim,
            dims.kv_heads * dims.head_dim,
            dims.head_dim,
        );
        let bias = |name: &str, len, present| -> Result<Option<Vec<f32>>> {
            match present {
                true => Ok(Some(ld.vector(&format!("{prefix}.{name}.bias"), len)?)),
                false => Ok(None),
            }
        };
        let norm = |name: &str, width: usize| -> Result<Option<Vec<f32>>> {
            let len = match opts.qk_norm {
                QkNorm::None => return Ok(None),
                QkNorm::PerHead => d,
                QkNorm::Whole => width,
            };
            Ok(Some(ld.norm(
                &format!("{prefix}.{name}.weight"),
                len,
                opts.norm_weight,
            )?))
        };
        let q_rows = if opts.output_gate { 2 * qw } else { qw };
        Ok(Gqa {
            q: ld.linear(&format!("{prefix}.q_proj"), q_rows, hidden)?,
            k: ld.linear(&format!("{prefix}.k_proj"), kw, hidden)?,
            v: ld.linear(&format!("{prefix}.v_proj"), kw, hidden)?,
            o: ld.linear(&format!("{prefix}.o_proj"), hidden, qw)?,
            q_bias: bias("q_proj", q_rows, opts.qkv_bias)?,
            k_bias: bias("k_proj", kw, opts.qkv_bias)?,
            v_bias: bias("v_proj", kw, opts.qkv_bias)?,
            o_bias: bias("o_proj", hidden, opts.o_bias)?,
            q_norm: norm("q_norm", qw)?,
            k_norm: norm("k_norm", kw)?,
            qk_norm: opts.qk_norm,
            sinks: match opts.sinks {
                true => Some(ld.vector(&format!("{prefix}.sinks"), dims.heads)?),
                false => None,
            },
            window: opts.window,
            output_gate: opts.output_gate,
            eps: opts.eps,
            rope: Rope::new(rope, dims.rotary_dim, false),
            dims,
        })
    }

    /// The layer over `n` normalised rows `x` at positions `pos` on `o`'s device, written once:
    /// the projected, normalised and rotated queries, keys and values ([`GqaProjected`]) go to
    /// the device's attention `core` (which appends the keys and values to the rows' caches and
    /// returns each row's attention output `[n, heads * head_dim]`), then the output gate,
    /// `o_proj` and its bias.
    pub fn run<O: Ops>(
        &self,
        o: &O,
        x: &O::Buf,
        n: usize,
        pos: &[usize],
        core: impl FnOnce(GqaProjected<O::Buf>) -> Result<O::Buf>,
    ) -> Result<O::Buf> {
        let spine = WeightClass::Spine;
        let (q, gate) = self.queries(o, x, n, pos)?;
        let k = o.project(&self.k, spine, x, n)?;
        let k_norm = (self.k_norm.as_deref(), self.dims.kv_heads);
        let k = self.finish(o, bias(o, k, &self.k_bias, n)?, k_norm, n, pos)?;
        let v = o.project(&self.v, spine, x, n)?;
        let v = bias(o, v, &self.v_bias, n)?;
        let mut out = core(GqaProjected { q, k, v })?;
        if let Some(g) = gate {
            out = o.mul_sigmoid(out, &g, n * self.dims.heads * self.dims.head_dim)?;
        }
        let y = o.project(&self.o, spine, &out, n)?;
        bias(o, y, &self.o_bias, n)
    }

    /// Project, normalise and rotate `n` rows, append their keys and values to the caches, and
    /// return each row's attention output through `o_proj` (`hidden` values per row), on the
    /// CPU.
    pub fn forward(&self, xn: &[f32], n: usize, rows: &mut KvRows<'_, '_>) -> Vec<f32> {
        self.run(&Host, &xn.to_vec(), n, rows.pos, |p| Ok(self.attend(&p, n, rows)))
            .expect("the CPU runs every attention form")
    }

    /// The CPU's attention core: the rows' keys and values into their caches, then every
    /// `(row, head)` over the positions it sees.
    fn attend(&self, p: &GqaProjected<Vec<f32>>, n: usize, rows: &mut KvRows<'_, '_>) -> Vec<f32> {
        let d = self.dims;
        let (qw, kw) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
        for i in 0..n {
            let cache = &mut rows.caches[rows.seq[i]];
            cache.k.push(&p.k[i * kw..(i + 1) * kw]);
            cache.v.push(&p.v[i * kw..(i + 1) * kw]);
        }
        let caches: Vec<&KvCache> = rows.caches.iter().map(|c| &**c).collect();
        let mut out = vec![0.0f32; n * qw];
        // `scores` is the per-thread scratch of one head's softmax (reused across heads).
        let task = |scores: &mut Vec<f32>, (t, o): (usize, &mut [f32])| {
            let (i, h) = (t / d.heads, t % d.heads);
            let qh = &p.q[i * qw + h * d.head_dim..][..d.head_dim];
            let (start, end) = self.seen(rows.pos[i]);
            let seen = Seen {
                start,
                end,
                sink: self.sinks.as_ref().map(|s| s[h]),
            };
            attend_head(
                qh,
                caches[rows.seq[i]],
                seen,
                h / (d.heads / d.kv_heads),
                d,
                (scores, o),
            );
        };
        let work: usize = rows
            .pos
            .iter()
            .map(|&p| self.seen(p))
            .map(|(s, e)| e - s)
            .sum::<usize>()
            * qw;
        if work >= PARALLEL_WORK {
            out.par_chunks_mut(d.head_dim)
                .enumerate()
                .for_each_init(Vec::new, task);
        } else {
            let mut scores = Vec::new();
            out.chunks_mut(d.head_dim)
                .enumerate()
                .for_each(|x| task(&mut scores, x));
        }
        out
    }

    /// The positions `start..end` a row at position `p` attends to (its window, or all).
    pub fn seen(&self, p: usize) -> (usize, usize) {
        let end = p + 1;
        (self.window.map_or(0, |w| end.saturating_sub(w)), end)
    }

    /// The layer's shape.
    pub fn dims(&self) -> GqaDims {
        self.dims
    }

    /// gpt-oss's per-head sink logits.
    pub fn sinks(&self) -> Option<&[f32]> {
        self.sinks.as_deref()
    }

    /// The queries of `n` rows (projected, normalised, rotated) and, with an output gate, the
    /// gate values (`heads * head_dim` per row, head order).
    fn queries<O: Ops>(
        &self,
        o: &O,
        x: &O::Buf,
        n: usize,
        pos: &[usize],
    ) -> Result<(O::Buf, Option<O::Buf>)> {
        let y = o.project(&self.q, WeightClass::Spine, x, n)?;
        let y = bias(o, y, &self.q_bias, n)?;
        let norm = (self.q_norm.as_deref(), self.dims.heads);
        if !self.output_gate {
            return Ok((self.finish(o, y, norm, n, pos)?, None));
        }
        // Per head: `d` query values, then `d` gate values.
        let (hd, heads) = (self.dims.head_dim, self.dims.heads);
        let q = o.assemble(n * heads, &[(&y, (2 * hd, 0, hd))])?;
        let gate = o.assemble(n * heads, &[(&y, (2 * hd, hd, hd))])?;
        Ok((self.finish(o, q, norm, n, pos)?, Some(gate)))
    }

    /// Projected rows (`n` of whole heads) at positions `pos`: the q/k RMSNorm (whole, or per
    /// head) when configured, then RoPE on each head's rotary part.
    fn finish<O: Ops>(
        &self,
        o: &O,
        y: O::Buf,
        (norm, heads): (Option<&[f32]>, usize),
        n: usize,
        pos: &[usize],
    ) -> Result<O::Buf> {
        let hd = self.dims.head_dim;
        let y = match (norm, self.qk_norm) {
            (Some(w), QkNorm::Whole) => o.rms_norm(&y, &o.constant(w)?, n, heads * hd, self.eps)?,
            (Some(w), QkNorm::PerHead) => o.rms_norm(&y, &o.constant(w)?, n * heads, hd, self.eps)?,
            _ => y,
        };
        let layout = RopeLayout {
            vecs: heads,
            row_stride: heads * hd,
            offset: 0,
            vec_stride: hd,
        };
        o.rope(y, n, layout, &self.rope, pos)
    }
}

/// What [`Gqa::run`] hands its attention core: the rotated queries `[n, heads * head_dim]`
/// and the rows' rotated keys and values `[n, kv_heads * head_dim]`.
#[derive(Debug)]
pub struct GqaProjected<B> {
    pub q: B,
    pub k: B,
    pub v: B,
}

/// `x` with `b` added to each of its `n` rows (unchanged without a bias).
fn bias<O: Ops>(o: &O, x: O::Buf, b: &Option<Vec<f32>>, n: usize) -> Result<O::Buf> {
    match b {
        Some(b) => o.add_rows(x, b, n, b.len()),
        None => Ok(x),
    }
}

/// The positions one query row attends to, and its head's sink logit.
#[derive(Debug, Clone, Copy)]
struct Seen {
    start: usize,
    end: usize,
    sink: Option<f32>,
}

/// One query head over positions `start..end` of key/value head `kv`: exact two-pass softmax
/// (max, then `exp(s - max)` summed in position order, the sink's term last), then `Σ_j p_j v_j`
/// in position order. `scores` is scratch (its contents are overwritten).
fn attend_head(
    q: &[f32],
    cache: &KvCache,
    seen: Seen,
    kv: usize,
    d: GqaDims,
    (scores, out): (&mut Vec<f32>, &mut [f32]),
) {
    let hd = d.head_dim;
    let scale = d.scale();
    scores.clear();
    scores.extend((seen.start..seen.end).map(|j| {
        let k = &cache.k.row(j)[kv * hd..][..hd];
        q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale
    }));
    let mut max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if let Some(s) = seen.sink {
        max = max.max(s);
    }
    let mut sum = 0.0f32;
    crate::kernels::math::fma_scope(|| {
        for s in scores.iter_mut() {
            *s = exp(*s - max);
            sum += *s;
        }
        if let Some(s) = seen.sink {
            sum += exp(s - max);
        }
    });
    out.fill(0.0);
    for (j, s) in (seen.start..).zip(scores.iter()) {
        let p = s / sum;
        let v = &cache.v.row(j)[kv * hd..][..hd];
        out.iter_mut().zip(v).for_each(|(o, v)| *o += p * v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Paged;

    fn dims() -> GqaDims {
        GqaDims {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            rotary_dim: 4,
        }
    }

    fn cache(len: usize, seed: u32) -> KvCache {
        let kw = 2 * 8;
        let val = |i: usize| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        };
        let k: Vec<f32> = (0..len * kw).map(val).collect();
        let v: Vec<f32> = (0..len * kw).map(|i| val(i + 7)).collect();
        KvCache {
            k: Paged::from_rows(&k, kw),
            v: Paged::from_rows(&v, kw),
        }
    }

    #[test]
    fn a_head_sees_only_the_positions_up_to_its_own() {
        let d = dims();
        let short = cache(5, 1);
        let mut long = short.clone();
        let extra = cache(9, 2);
        long.k.extend(&extra.k.to_vec()[5 * 16..], 16);
        long.v.extend(&extra.v.to_vec()[5 * 16..], 16);
        let q: Vec<f32> = (0..8).map(|i| i as f32 * 0.1 - 0.3).collect();
        let (mut a, mut b) = (vec![0.0; 8], vec![0.0; 8]);
        attend_head(&q, &short, all(5), 1, d, (&mut Vec::new(), &mut a));
        attend_head(&q, &long, all(5), 1, d, (&mut vec![7.0; 3], &mut b));
        assert_eq!(a, b);
    }

    #[test]
    fn one_position_returns_its_value() {
        let d = dims();
        let c = cache(1, 3);
        let q = vec![0.5; 8];
        let mut o = vec![9.0; 8];
        attend_head(&q, &c, all(1), 1, d, (&mut Vec::new(), &mut o));
        assert_eq!(o, c.v.to_vec()[8..16].to_vec());
    }

    fn all(end: usize) -> Seen {
        Seen {
            start: 0,
            end,
            sink: None,
        }
    }

    #[test]
    fn a_window_sees_only_its_last_positions_and_a_sink_only_scales() {
        let d = dims();
        let c = cache(9, 4);
        let q: Vec<f32> = (0..8).map(|i| 0.2 - i as f32 * 0.05).collect();
        let (mut a, mut b) = (vec![0.0; 8], vec![0.0; 8]);
        let window = Seen {
            start: 6,
            end: 9,
            sink: None,
        };
        attend_head(&q, &c, window, 0, d, (&mut Vec::new(), &mut a));
        // The same three positions alone (a cache holding only them) give the same result.
        let tail = KvCache {
            k: Paged::from_rows(&c.k.to_vec()[6 * 16..], 16),
            v: Paged::from_rows(&c.v.to_vec()[6 * 16..], 16),
        };
        attend_head(&q, &tail, all(3), 0, d, (&mut Vec::new(), &mut b));
        assert_eq!(a, b);
        // A sink far below every score changes nothing; a huge one takes all the weight.
        let low = Seen {
            sink: Some(-1e4),
            ..window
        };
        attend_head(&q, &c, low, 0, d, (&mut Vec::new(), &mut b));
        assert_eq!(a, b);
        let high = Seen {
            sink: Some(1e4),
            ..window
        };
        attend_head(&q, &c, high, 0, d, (&mut Vec::new(), &mut b));
        assert!(b.iter().all(|v| v.abs() < 1e-30), "{b:?}");
    }
}
