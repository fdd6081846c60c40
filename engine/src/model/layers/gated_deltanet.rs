//! Gated DeltaNet linear attention (HF `Qwen3NextGatedDeltaNet`, `Qwen3_5MoeGatedDeltaNet`): the
//! delta rule of KDA (`kda.rs`) with one decay per head instead of one per key channel, keys and
//! queries shared by groups of value heads, and a SiLU-gated output norm.
//!
//! For a normalised input row `x` (all f32), with `Hk` key heads, `Hv = r·Hk` value heads and
//! head width `d` (keys and values alike):
//! 1. `q, k` (`Hk·d` each), `v`, `z` (`Hv·d` each) and `b`, `a` (`Hv` each) from the input
//!    projections: Qwen3-Next's fused `in_proj_qkvz` / `in_proj_ba`, whose rows are grouped per
//!    key head (`[q_h, k_h, v_{h·r..}, z_{h·r..}]` and `[b_{h·r..}, a_{h·r..}]`), or Qwen3.5's
//!    `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`;
//! 2. key head `h` serves value heads `h·r .. h·r + r` (HF `repeat_interleave`). The repeat is
//!    taken before the depthwise convolution, on the raw channels and the convolution weights
//!    alike: a depthwise convolution of a repeated channel is the repeated convolution, so the
//!    values are those of convolving first. From there on the layer is KDA with `Hv` heads:
//!    convolution + SiLU, L2 norms of `q` and `k` per head, `q · d^-½`, the log-decay
//!    `g = −exp(A_log)·softplus(a + dt_bias)` (the head's value on each of its key channels),
//!    `β = σ(b)`, the delta rule and read-out;
//! 3. per value head `o ← w ⊙ RMS(o) ⊙ silu(z)`; `y = out_proj o`.
//!
//! The recurrence, its state ([`crate::state::KdaCache`]: convolution history and `[Hv, d, d]`
//! matrices), its replay for partial commits and its prefix checkpoints are KDA's, so a prefill is
//! bit-identical to token-by-token decoding whatever the split, and prefixes are reused.

use super::kda::{DeltaCore, GateActivation, KdaProjected, KdaRows, L2Norm, Projections};
use super::ops::{Host, Ops};
use crate::backend::WeightClass;
use crate::config::KdaDecay;
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kernels::math::exp;
use crate::model::Loader;
use crate::state::KdaShape;

/// The epsilon of the q/k L2 norm: a constant of the published kernels (HF's `l2norm` and FLA's
/// `use_qk_l2norm_in_kernel`), not a config key.
const L2_EPS: f32 = 1e-6;

/// The input projections as stored (one per layer, built at load: the size difference between
/// the variants costs nothing).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum GdnProjection {
    /// Qwen3-Next: `in_proj_qkvz` `[2·Hk·d + 2·Hv·d, hidden]` and `in_proj_ba` `[2·Hv, hidden]`,
    /// rows grouped per key head.
    Fused { qkvz: Matrix, ba: Matrix },
    /// Qwen3.5: `in_proj_qkv` `[2·Hk·d + Hv·d, hidden]` (`[q | k | v]`), `in_proj_z` `[Hv·d,
    /// hidden]`, `in_proj_b` and `in_proj_a` `[Hv, hidden]`.
    Split {
        qkv: Matrix,
        z: Matrix,
        b: Matrix,
        a: Matrix,
    },
}

/// One gated-DeltaNet layer's weights, the per-head constants already widened to the `Hv·d`
/// channels the shared recurrence reads.
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    /// `Hv` heads of width `d`, convolution width `K`.
    pub shape: KdaShape,
    pub key_heads: usize,
    pub proj: GdnProjection,
    /// Depthwise conv weights widened to `[3·Hv·d, K]` (q, then k, then v channels).
    pub conv: Vec<f32>,
    /// `dt_bias` per channel.
    pub dt_bias: Vec<f32>,
    /// `exp(A_log)` per channel.
    pub decay_rate: Vec<f32>,
    /// `norm.weight` `[d]` and its epsilon.
    pub norm: Vec<f32>,
    pub eps: f32,
    pub out: Matrix,
}

/// A gated-DeltaNet layer's shape, from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    pub key_heads: usize,
    pub value_heads: usize,
    /// Key and value width per head.
    pub head_dim: usize,
    /// `linear_conv_kernel_dim`.
    pub kernel: usize,
    /// Qwen3-Next's fused `in_proj_qkvz` / `in_proj_ba` (else Qwen3.5's four projections).
    pub fused: bool,
}

impl GdnDims {
    /// The recurrent state's shape (value heads).
    pub fn shape(self) -> KdaShape {
        KdaShape {
            heads: self.value_heads,
            head_dim: self.head_dim,
            kernel: self.kernel,
        }
    }
}

impl GatedDeltaNet {
    /// Load `{prefix}.{in_proj_*, conv1d, dt_bias, A_log, norm, out_proj}` for a model of width
    /// `hidden`; `eps` is the gated norm's epsilon.
    pub fn load(ld: &Loader<'_>, prefix: &str, hidden: usize, dims: GdnDims, eps: f32) -> Result<Self> {
        let shape = dims.shape();
        let (d, hv) = (dims.head_dim, dims.value_heads);
        let (key_dim, value_dim) = (dims.key_heads * d, hv * d);
        let name = |n: &str| format!("{prefix}.{n}");
        let proj = if dims.fused {
            GdnProjection::Fused {
                qkvz: ld.linear(&name("in_proj_qkvz"), 2 * key_dim + 2 * value_dim, hidden)?,
                ba: ld.linear(&name("in_proj_ba"), 2 * hv, hidden)?,
            }
        } else {
            GdnProjection::Split {
                qkv: ld.linear(&name("in_proj_qkv"), 2 * key_dim + value_dim, hidden)?,
                z: ld.linear(&name("in_proj_z"), value_dim, hidden)?,
                b: ld.linear(&name("in_proj_b"), hv, hidden)?,
                a: ld.linear(&name("in_proj_a"), hv, hidden)?,
            }
        };
        let conv_channels = 2 * key_dim + value_dim;
        let conv = ld.floats(&name("conv1d.weight"), &[conv_channels, 1, dims.kernel])?;
        Ok(GatedDeltaNet {
            shape,
            key_heads: dims.key_heads,
            proj,
            conv: Self::widen_conv(&conv, shape, dims.key_heads),
            dt_bias: Self::per_channel(&ld.vector(&name("dt_bias"), hv)?, d),
            decay_rate: decay_rate(&ld.vector(&name("A_log"), hv)?, d),
            norm: ld.vector(&name("norm.weight"), d)?,
            eps,
            out: ld.linear(&name("out_proj"), hidden, value_dim)?,
        })
    }

    /// Value heads per key head.
    fn group(&self) -> usize {
        self.shape.heads / self.key_heads
    }

    /// Widen per-head values `[Hv]` to channels `[Hv·d]`.
    pub fn per_channel(per_head: &[f32], d: usize) -> Vec<f32> {
        per_head.iter().flat_map(|&x| std::iter::repeat_n(x, d)).collect()
    }

    /// Widen the stored conv weights `[2·Hk·d + Hv·d, K]` to `[3·Hv·d, K]`: value channel `c` of
    /// q (or k) reads key channel `(c / d / r)·d + c % d`.
    pub fn widen_conv(stored: &[f32], shape: KdaShape, key_heads: usize) -> Vec<f32> {
        let (d, kernel, p) = (shape.head_dim, shape.kernel, shape.channels());
        let r = shape.heads / key_heads;
        let key_dim = key_heads * d;
        let row = |c: usize| &stored[c * kernel..(c + 1) * kernel];
        let mut out = Vec::with_capacity(3 * p * kernel);
        for part in 0..2 {
            for c in 0..p {
                out.extend_from_slice(row(part * key_dim + (c / d / r) * d + c % d));
            }
        }
        for c in 0..p {
            out.extend_from_slice(row(2 * key_dim + c));
        }
        out
    }

    /// The layer over `n` normalised rows `x` on `o`'s device, written once: the projections
    /// rearranged into the shared recurrence's layout ([`KdaProjected`]: raw `[q | k | v]`
    /// widened to value heads, `a` per head (before `dt_bias`), the `b` logits per head and `z`)
    /// go to the device's delta-rule `core` (the read-out `[n, P]`), then `out_proj`.
    pub fn run<O: Ops>(
        &self,
        o: &O,
        x: &O::Buf,
        n: usize,
        core: impl FnOnce(KdaProjected<O::Buf>) -> Result<O::Buf>,
    ) -> Result<O::Buf> {
        let s = self.shape;
        let (d, hv, hk, r) = (s.head_dim, s.heads, self.key_heads, self.group());
        let (p, key_dim, spine) = (s.channels(), self.key_heads * d, WeightClass::Spine);
        let projected = match &self.proj {
            GdnProjection::Fused { qkvz, ba } => {
                // Rows grouped per key head: [q_h, k_h, v_{h·r..}, z_{h·r..}] and [b_{h·r..}, a_{h·r..}].
                let (qkvz, ba) = (o.project(qkvz, spine, x, n)?, o.project(ba, spine, x, n)?);
                let (group, width) = (2 * d + 2 * r * d, 2 * key_dim + 2 * p);
                let at = |h: usize, col: usize, w: usize| (&qkvz, (width, h * group + col, w));
                let mut qkv: Vec<_> = (0..hv).map(|vh| at(vh / r, 0, d)).collect();
                qkv.extend((0..hv).map(|vh| at(vh / r, d, d)));
                qkv.extend((0..hk).map(|h| at(h, 2 * d, r * d)));
                let z: Vec<_> = (0..hk).map(|h| at(h, 2 * d + r * d, r * d)).collect();
                let b: Vec<_> = (0..hk).map(|h| (&ba, (2 * hv, h * 2 * r, r))).collect();
                let a: Vec<_> = (0..hk).map(|h| (&ba, (2 * hv, h * 2 * r + r, r))).collect();
                KdaProjected {
                    qkv: o.assemble(n, &qkv)?,
                    f: o.assemble(n, &a)?,
                    beta: o.assemble(n, &b)?,
                    gate: o.assemble(n, &z)?,
                }
            }
            GdnProjection::Split { qkv, z, b, a } => {
                let qkv = o.project(qkv, spine, x, n)?;
                let width = 2 * key_dim + p;
                let mut parts: Vec<_> = (0..hv).map(|vh| (&qkv, (width, (vh / r) * d, d))).collect();
                parts.extend((0..hv).map(|vh| (&qkv, (width, key_dim + (vh / r) * d, d))));
                parts.push((&qkv, (width, 2 * key_dim, p)));
                KdaProjected {
                    qkv: o.assemble(n, &parts)?,
                    f: o.project(a, spine, x, n)?,
                    beta: o.project(b, spine, x, n)?,
                    gate: o.project(z, spine, x, n)?,
                }
            }
        };
        let read = core(projected)?;
        o.project(&self.out, spine, &read, n)
    }

    /// The recurrence's constants (KDA's core with DeltaNet's norms, decay and gate).
    fn core(&self) -> DeltaCore<'_> {
        DeltaCore {
            shape: self.shape,
            conv: &self.conv,
            l2: self.l2(),
            q_scale: self.q_scale(),
            decay_rate: &self.decay_rate,
            decay: KdaDecay::Softplus,
            o_norm: &self.norm,
            eps: self.eps,
            gate: GateActivation::Silu,
        }
    }

    /// The q/k L2 norm.
    pub fn l2(&self) -> L2Norm {
        L2Norm::EpsInside(L2_EPS)
    }

    /// The query scale `d^-½`.
    pub fn q_scale(&self) -> f32 {
        1.0 / (self.shape.head_dim as f32).sqrt()
    }

    /// Attention output `[n, hidden]` for normalised rows `x` on the CPU, advancing each row's
    /// sequence state (rows of one sequence are consecutive positions, in order).
    pub fn forward(&self, x: &[f32], n: usize, rows: &mut KdaRows<'_, '_>) -> Vec<f32> {
        self.run(&Host, &x.to_vec(), n, |proj| self.host_core(proj, n, rows))
            .expect("the CPU runs every gated DeltaNet form")
    }

    /// The CPU's delta-rule core over `n` projected rows, advancing each row's host state (the
    /// read-out `[n, P]`, before `o_proj`).
    pub(crate) fn host_core(
        &self,
        proj: KdaProjected<Vec<f32>>,
        n: usize,
        rows: &mut KdaRows<'_, '_>,
    ) -> Result<Vec<f32>> {
        let (d, p) = (self.shape.head_dim, self.shape.channels());
        // The decay input per channel: its head's `a` plus the channel's `dt_bias`.
        let mut f = Vec::with_capacity(n * p);
        for row in proj.f.chunks(self.shape.heads.max(1)).take(n) {
            f.extend(
                self.dt_bias
                    .iter()
                    .enumerate()
                    .map(|(c, &bias)| row[c / d] + bias),
            );
        }
        let proj = Projections {
            qkv: proj.qkv,
            f,
            beta: proj.beta,
            gate: proj.gate,
        };
        self.core().run(&proj, n, rows)
    }
}

/// `exp(A_log)` per head, widened to channels.
pub fn decay_rate(a_log: &[f32], d: usize) -> Vec<f32> {
    GatedDeltaNet::per_channel(&a_log.iter().map(|&x| exp(x)).collect::<Vec<_>>(), d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Widening the conv weights then convolving equals HF's order (convolve the `Hk` key
    /// channels, then `repeat_interleave` to value heads): key channel `c` of head `h` lands on
    /// channel `c` of heads `h·r .. h·r + r`.
    #[test]
    fn conv_weights_widen_as_repeat_interleave() {
        let shape = KdaShape {
            heads: 4,
            head_dim: 2,
            kernel: 2,
        };
        // Stored channels: q (2 key heads × 2), k (2 × 2), v (4 × 2); weight = channel id.
        let stored: Vec<f32> = (0..16).flat_map(|c| [c as f32, 100.0 + c as f32]).collect();
        let wide = GatedDeltaNet::widen_conv(&stored, shape, 2);
        let firsts: Vec<f32> = wide.chunks(2).map(|w| w[0]).collect();
        // q: heads 0,1 <- key head 0 (channels 0,1); heads 2,3 <- key head 1 (channels 2,3).
        assert_eq!(firsts[..8], [0.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0, 3.0]);
        assert_eq!(firsts[8..16], [4.0, 5.0, 4.0, 5.0, 6.0, 7.0, 6.0, 7.0]);
        assert_eq!(firsts[16..], [8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0]);
        assert!(wide.chunks(2).all(|w| w[1] == w[0] + 100.0));
    }
}
