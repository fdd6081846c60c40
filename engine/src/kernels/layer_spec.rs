//! The small value types that name a layer kernel's variant: the gated activation, the
//! router's scoring and selection, the KDA q/k L2 norm, the MLA shapes and the latent
//! attention's position block. The CPU layers (`model::layers`) run them and the device launch
//! builder (`backend::abi`) encodes them, so they live below both.

use super::math::{exp, sigmoid, tanh};

/// Gate activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `silu(g) * u`, with `silu(x) = x / (1 + e^-x)` as torch computes it.
    Silu,
    /// SiTU: `(β·tanh(g/β))·σ(g) · U` with `U = β_l·tanh(u/β_l)` (or `u` when `linear_beta` is
    /// `None`), in exactly this f32 order.
    Situ { beta: f32, linear_beta: Option<f32> },
    /// gpt-oss's clamped SwiGLU: `g' = min(g, limit)`, `u' = clamp(u, ±limit)`,
    /// `(u' + 1) · g' · σ(α · g')`, in exactly this f32 order (HF `GptOssExperts._apply_gate`).
    ClampedSwiglu { alpha: f32, limit: f32 },
    /// DeepSeek-V4's clamped SiLU: `g' = min(g, limit)`, `u' = clamp(u, ±limit)`, `silu(g') · u'`
    /// (HF `DeepseekV4Experts._apply_gate`).
    ClampedSilu { limit: f32 },
}

impl Activation {
    /// The gated activation of one (gate, up) pair.
    #[inline(always)]
    pub fn apply(self, g: f32, u: f32) -> f32 {
        match self {
            Activation::Silu => g / (1.0 + exp(-g)) * u,
            Activation::Situ { beta, linear_beta } => {
                let gate = (beta * tanh(g / beta)) * sigmoid(g);
                let up = match linear_beta {
                    Some(b) => b * tanh(u / b),
                    None => u,
                };
                gate * up
            }
            Activation::ClampedSwiglu { alpha, limit } => {
                let g = g.min(limit);
                let u = u.clamp(-limit, limit);
                let glu = g * sigmoid(g * alpha);
                (u + 1.0) * glu
            }
            Activation::ClampedSilu { limit } => {
                let g = g.min(limit);
                let u = u.clamp(-limit, limit);
                g / (1.0 + exp(-g)) * u
            }
        }
    }
}

/// How router logits become expert scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scoring {
    /// `σ(logit)`, selection on `σ + e_score_correction_bias` (DeepSeek-V3 `noaux_tc`).
    #[default]
    Sigmoid,
    /// `softmax(logits)` over all experts in f32, selection on the probabilities (Qwen3-MoE).
    Softmax,
    /// Selection on the logits, then `softmax` over the `top_k` selected logits only, in
    /// selection order (gpt-oss `GptOssTopKRouter`).
    TopKSoftmax,
    /// `sqrt(softplus(logit))` (softplus as torch: the logit itself above 20), selection on
    /// score + `e_score_correction_bias` (DeepSeek-V4).
    SqrtSoftplus,
}

/// Router hyperparameters.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub scoring: Scoring,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub scaling: f32,
}

/// The L2 normalisation of q/k; the three oracles use different formulas (model-formats §3.4).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum L2Norm {
    /// HF/FLA: `x / sqrt(Σx² + eps)`.
    EpsInside(f32),
    /// `F.normalize` (the K3 reference): `x / max(‖x‖₂, eps)`.
    EpsFloor(f32),
}

impl L2Norm {
    /// Normalise one head's `x` in place (sum of squares in index order).
    pub fn apply(self, x: &mut [f32]) {
        let ss: f32 = x.iter().map(|v| v * v).sum();
        let denom = match self {
            L2Norm::EpsInside(eps) => (ss + eps).sqrt(),
            L2Norm::EpsFloor(eps) => ss.sqrt().max(eps),
        };
        x.iter_mut().for_each(|v| *v /= denom);
    }
}

/// Shapes and constants of an MLA layer.
#[derive(Debug, Clone)]
pub struct MlaDims {
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub kv_lora: usize,
    pub eps: f32,
    /// Softmax scale (`qk_head_dim^-0.5`, times YaRN's mscale² where configured).
    pub scale: f32,
}

/// Positions per block (the unit of the cross-block merge and of decode parallelism).
pub const MLA_BLOCK: usize = 1024;
