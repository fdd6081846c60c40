//! The decoder's plan: what a family's config says about its stack (per-layer mixers and FFNs,
//! the router, the experts' stored form and names, norms, the residual form), and the pure
//! questions the loader and the passes ask of it.

use super::super::layers::compressed::{AttentionKind, CompressedDims, V4IndexerDims};
use super::super::layers::dsa::IndexerDims;
use super::super::layers::gated_deltanet::GdnDims;
use super::super::layers::gqa::{GqaDims, GqaOptions};
use super::super::layers::kda::L2Norm;
use super::super::layers::mla::MlaDims;
use super::super::layers::mlp::Activation;
use super::super::layers::moe::{Combine, RouterConfig};
use crate::config::{KdaConfig, RopeConfig};
use crate::error::Result;
use crate::model::{Loader, NormWeight};
use crate::state::KdaShape;

/// The routed part of a MoE layer.
#[derive(Debug, Clone)]
pub(crate) struct MoePlan {
    pub experts: usize,
    /// Each routed expert's width (`moe_intermediate_size`).
    pub width: usize,
    /// The shared experts' combined width (`0`: none).
    pub shared_width: usize,
    /// The shared experts' module below the block (`shared_experts`; Qwen3-Next and Qwen3.5:
    /// `shared_expert`).
    pub shared_module: &'static str,
    /// The shared experts' output is scaled by `σ({block}.shared_expert_gate · x)`.
    pub shared_gate: bool,
    pub router: RouterConfig,
    /// The router has an `e_score_correction_bias`.
    pub correction_bias: bool,
    /// The router Linear has a bias, added to its logits (gpt-oss `router.bias`).
    pub router_bias: bool,
    /// The activation of every FFN (dense, shared and routed experts).
    pub act: Activation,
    /// K3's latent MoE: the routed experts run at this width between
    /// `{block}.routed_expert_down_proj` and `routed_expert_up_proj`, the sum normalised by
    /// `routed_expert_norm` when the flag says so.
    pub latent: Option<(usize, bool)>,
    /// The order a row's weighted expert outputs are summed in.
    pub combine: Combine,
    /// How the experts and router are stored and what the experts compute.
    pub form: ExpertForm,
}

/// Where a MoE layer's tensors are, below `model.layers.{i}.`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MoeNames {
    /// The block (`mlp`; Mixtral-style checkpoints: `block_sparse_moe`).
    pub block: &'static str,
    /// Each expert's gate, up and down Linear below `{block}.experts.{e}`.
    pub expert: [&'static str; 3],
    /// The router Linear below the block.
    pub router: &'static str,
    /// The selection-only correction bias below the block.
    pub correction_bias: &'static str,
}

impl MoeNames {
    /// The HF layout: `mlp.experts.{e}.{gate,up,down}_proj`, router `mlp.gate` with its
    /// `e_score_correction_bias`.
    pub(crate) const HF: MoeNames = MoeNames {
        block: "mlp",
        expert: ["gate_proj", "up_proj", "down_proj"],
        router: "gate",
        correction_bias: "gate.e_score_correction_bias",
    };
}

/// How a MoE layer's experts and router are stored, and the experts' activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ExpertForm {
    /// SwiGLU experts in either of HF's layouts, whichever the checkpoint holds: one Linear per
    /// expert projection (`{block}.experts.{e}.{gate,up,down}`, any stored format), or the
    /// fused tensors some Qwen releases publish, `{block}.experts.gate_up_proj` `[E, 2I, H]`
    /// (each expert's gate rows, then its up rows) and `{block}.experts.down_proj` `[E, H, I]`
    /// (BF16 or F32).
    Hf(MoeNames),
    /// Experts stacked over the expert axis in MXFP4 (gpt-oss):
    /// `{block}.experts.{gate_up}_{blocks,scales}` with gate and up rows interleaved, and
    /// `{block}.experts.{down}_{blocks,scales}`, each with its `…_bias`; `act` on gate and up.
    StackedMxfp4 {
        names: MoeNames,
        gate_up: &'static str,
        down: &'static str,
        act: Activation,
    },
}

/// Everything the decoder needs, derived from an architecture's config.
#[derive(Debug, Clone)]
pub(crate) struct DecoderPlan {
    /// Architecture name reported in [`ModelInfo::arch`].
    pub arch: &'static str,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Dense FFN width (`intermediate_size`).
    pub dense_width: usize,
    pub num_layers: usize,
    pub max_context: usize,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The grouped-query attention layers' shape and options (`None`: the stack has none).
    pub gqa: Option<GqaPlan>,
    pub rope: RopeConfig,
    /// Per layer: its sliding window (empty: every layer attends to every earlier position).
    pub windows: Vec<Option<usize>>,
    /// How every RMSNorm weight of the decoder is stored (layers, final norm, q/k norms).
    pub norm_weight: NormWeight,
    /// Per layer: its sequence mixer (empty: attention on every layer).
    pub mixers: Vec<MixerKind>,
    /// The gated-DeltaNet layers' shape (required when `mixers` names any).
    pub linear: Option<GdnDims>,
    /// The MLA layers' shape (required when `mixers` names any).
    pub mla: Option<MlaPlan>,
    /// The KDA layers' shape (required when `mixers` names any).
    pub kda: Option<KdaPlan>,
    /// DeepSeek-V4's attention shape and hash-routed layers (required when `mixers` names
    /// [`MixerKind::Compressed`]).
    pub v4: Option<V4Plan>,
    /// How a layer's sub-layers add to the residual stream.
    pub residual: Residual,
    /// Per layer: whether its FFN is the routed MoE.
    pub moe_layers: Vec<bool>,
    pub moe: MoePlan,
}

/// A layer's sequence mixer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MixerKind {
    /// Grouped-query softmax attention (`self_attn`).
    Attention,
    /// Gated DeltaNet linear attention (`linear_attn`).
    DeltaNet,
    /// Multi-head latent attention (`self_attn`, DeepSeek-V3, Kimi).
    Mla,
    /// Kimi Delta Attention (`self_attn`, Kimi-Linear).
    Kda,
    /// DeepSeek-V4's sliding-window / compressed attention (`self_attn`).
    Compressed(AttentionKind),
}

/// DeepSeek-V4's attention shape (the per-layer kinds are in the mixers) and its hash-routed
/// MoE layers.
#[derive(Debug, Clone)]
pub(crate) struct V4Plan {
    pub dims: CompressedDims,
    pub indexer: V4IndexerDims,
    /// The RoPE of compressed layers, their compressors and indexers (`compress_rope_theta`,
    /// YaRN with attention factor 1); sliding layers use the plan's `rope`.
    pub compress_rope: RopeConfig,
    /// Per layer: its MoE routes by the token-id table `tid2eid`.
    pub hash_layers: Vec<bool>,
    /// The attention kind of the multi-token-prediction block (`compress_ratios` after the last
    /// layer; the sliding window unless given).
    pub mtp_kind: AttentionKind,
}

/// The KDA layers' shape and choices.
#[derive(Debug, Clone)]
pub(crate) struct KdaPlan {
    pub config: KdaConfig,
    pub l2: L2Norm,
}

impl KdaPlan {
    pub(super) fn shape(&self) -> KdaShape {
        KdaShape {
            heads: self.config.num_heads,
            head_dim: self.config.head_dim,
            kernel: self.config.short_conv_kernel_size,
        }
    }
}

/// The grouped-query attention layers' shape and options (per-layer windows apart).
#[derive(Debug, Clone)]
pub(crate) struct GqaPlan {
    pub dims: GqaDims,
    pub options: GqaOptions,
}

/// How sub-layer outputs join the residual stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Residual {
    /// `x += mixer(norm(x)); x += ffn(norm(x))`.
    Plain,
    /// Kimi K3's Block Attention Residuals over blocks of `block` layers
    /// (`decoder_attn_res.rs`).
    AttnRes { block: usize },
    /// DeepSeek-V4's manifold-constrained hyper-connections: `streams` residual streams mixed
    /// around every sub-layer (`hyper.rs`), Sinkhorn-normalised with `iters` iterations.
    Hyper { streams: usize, iters: usize, eps: f32 },
}

/// The MLA layers' shape.
#[derive(Debug, Clone)]
pub(crate) struct MlaPlan {
    /// `q_lora_rank` (`None`: a full-rank `q_proj`).
    pub q_lora_rank: Option<usize>,
    pub dims: MlaDims,
    /// RoPE on the shared key part (`false`: NoPE, Kimi).
    pub rotary: bool,
    /// A sigmoid output gate `g_proj` on the MLA output (K3).
    pub out_gate: bool,
    /// RoPE pairs interleaved (`rope_interleave`) rather than `rotate_half`.
    pub interleave: bool,
    /// DeepSeek Sparse Attention (`None`: every row attends to every earlier position).
    pub sparse: Option<DsaPlan>,
}

/// DeepSeek Sparse Attention's lightning indexer on MLA layers.
#[derive(Debug, Clone)]
pub(crate) struct DsaPlan {
    pub dims: IndexerDims,
    /// The indexer's RoPE pairs are interleaved (GLM-5) rather than halves (DeepSeek-V3.2).
    pub interleave: bool,
    /// Per layer: it reuses the previous full layer's selection instead of running an indexer
    /// (GLM-5.2's IndexShare; `indexer_types` `"shared"`). The first layer is never shared.
    pub shared: Vec<bool>,
}

impl MlaPlan {
    /// Indexer key values layer `l` caches per position.
    pub(super) fn index_keys(&self, l: usize) -> usize {
        match &self.sparse {
            Some(s) if !s.shared.get(l).copied().unwrap_or(false) => s.dims.head_dim,
            _ => 0,
        }
    }
}

impl MoePlan {
    /// Where the block's tensors are.
    pub(super) fn names(&self) -> MoeNames {
        match self.form {
            ExpertForm::Hf(n) | ExpertForm::StackedMxfp4 { names: n, .. } => n,
        }
    }

    /// The MoE block's module below `model.layers.{i}`.
    pub(super) fn block(&self) -> &'static str {
        self.names().block
    }

    /// The plan of a model without routed experts (every layer dense).
    pub(crate) fn none() -> MoePlan {
        MoePlan {
            experts: 0,
            width: 0,
            shared_width: 0,
            shared_module: "shared_experts",
            shared_gate: false,
            router_bias: false,
            act: Activation::Silu,
            latent: None,
            combine: Combine::Ascending,
            router: RouterConfig {
                scoring: Default::default(),
                top_k: 0,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: false,
                scaling: 1.0,
            },
            correction_bias: false,
            form: ExpertForm::Hf(MoeNames::HF),
        }
    }
}

impl DecoderPlan {
    pub(super) fn is_moe(&self, l: usize) -> bool {
        self.moe_layers[l]
    }

    /// The checkpoint's naming: DeepSeek-V4's published names for a V4 stack, HF's otherwise.
    pub(super) fn naming(&self) -> crate::model::Naming {
        match self.v4 {
            Some(_) => crate::model::Naming::DeepSeekV4,
            None => crate::model::Naming::Hf,
        }
    }

    /// Whether layer `l`'s MoE routes by the token-id table.
    pub(super) fn is_hash(&self, l: usize) -> bool {
        self.v4
            .as_ref()
            .is_some_and(|v| v.hash_layers.get(l).copied().unwrap_or(false))
    }

    pub(super) fn mixer(&self, l: usize) -> MixerKind {
        self.mixers.get(l).copied().unwrap_or(MixerKind::Attention)
    }

    /// Layer `l`'s recurrent state shape, when it has one (DeltaNet, KDA).
    pub(super) fn recurrent_shape(&self, l: usize) -> Option<KdaShape> {
        match (self.mixer(l), &self.linear, &self.kda) {
            (MixerKind::DeltaNet, Some(d), _) => Some(d.shape()),
            (MixerKind::Kda, _, Some(k)) => Some(k.shape()),
            _ => None,
        }
    }

    pub(super) fn norm(&self, ld: &Loader<'_>, name: &str) -> Result<Vec<f32>> {
        ld.norm(name, self.hidden_size, self.norm_weight)
    }

    /// Layer `l`'s attention options.
    pub(super) fn attn_options(&self, l: usize, options: GqaOptions) -> GqaOptions {
        GqaOptions {
            window: self.windows.get(l).copied().flatten(),
            ..options
        }
    }
}
