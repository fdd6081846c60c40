//! Kimi-Linear: KDA and NoPE-MLA layers as listed in `linear_attn_config`, a dense first
//! FFN, then sigmoid-routed MoE with shared experts; untied head. Reference: HF transformers
//! `models/kimi_linear/modeling_kimi_linear.py` (float32 path) and `model-formats.md` §3.
//!
//! Layer `i`: `x += Attn_i(RMSNorm_in(x)); x += FFN_i(RMSNorm_post(x))`; logits
//! `lm_head(RMSNorm(x))`: a plan over the shared decoder ([`super::decoder`]), which runs it in
//! memory, out of core and (its MLA and KDA layers) on a device. Tensor names are the released
//! checkpoint's (pre-HF-conversion): `self_attn.{q,k,v}_conv1d`,
//! `self_attn.{f_a_proj,f_b_proj,dt_bias,A_log}`,
//! `block_sparse_moe.{gate,experts.{e}.w1/w2/w3,shared_experts}`.
//!
//! Kimi K3 ([`super::kimi_k3`]) is the same plan with its own variant choices ([`Variant`])
//! and Block Attention Residuals.

use super::Loader;
use super::decoder::{
    Decoder, DecoderFamily, DecoderPlan, ExpertForm, KdaPlan, MixerKind, MlaPlan, MoeNames, MoePlan, Residual,
};
use super::layers::kda::L2Norm;
use super::layers::mla::MlaDims;
use super::layers::mlp::Activation;
use super::layers::moe::{Combine, RouterConfig, Scoring};
use crate::config::{AttnKind, KimiLinearConfig, RopeConfig};
use crate::error::Result;
use crate::model::NormWeight;

/// HF `KimiLinearRMSNorm`'s default epsilon, which `KimiLinearAttention` uses for
/// `q_a_layernorm` and `kv_a_layernorm` (it does not pass `rms_norm_eps`).
const HF_MLA_NORM_EPS: f32 = 1e-6;

/// Architecture choices that differ between Kimi-Linear and K3.
#[derive(Debug, Clone)]
pub(crate) struct Variant {
    /// FFN activation (dense, shared and routed experts).
    pub act: Activation,
    /// q/k normalisation in KDA.
    pub l2: L2Norm,
    /// Epsilon of the MLA `q_a_layernorm` / `kv_a_layernorm`.
    pub mla_norm_eps: f32,
    /// Sigmoid output gate on MLA.
    pub mla_gate: bool,
    /// Latent MoE width and whether the expert sum is normalised.
    pub latent: Option<(usize, bool)>,
    pub combine: Combine,
}

/// The MLA shape of a config (NoPE: no rotary part is rotated).
pub(crate) fn mla_dims(cfg: &KimiLinearConfig, v: &Variant) -> MlaDims {
    MlaDims {
        heads: cfg.num_attention_heads,
        nope: cfg.qk_nope_head_dim,
        rope: cfg.qk_rope_head_dim,
        v: cfg.v_head_dim,
        kv_lora: cfg.kv_lora_rank,
        eps: v.mla_norm_eps,
        scale: (cfg.qk_head_dim() as f64).powf(-0.5) as f32,
    }
}

/// Kimi-Linear's choices of the shared Kimi layers.
fn variant() -> Variant {
    Variant {
        act: Activation::Silu,
        l2: L2Norm::EpsInside(1e-6),
        mla_norm_eps: HF_MLA_NORM_EPS,
        mla_gate: false,
        latent: None,
        combine: Combine::Ascending,
    }
}

/// Where Kimi keeps a MoE layer's tensors.
const NAMES: MoeNames = MoeNames {
    block: "block_sparse_moe",
    expert: ["w1", "w3", "w2"],
    router: "gate",
    correction_bias: "gate.e_score_correction_bias",
};

/// The decoder plan of a Kimi-Linear config.
fn plan(c: &KimiLinearConfig) -> DecoderPlan {
    plan_with(c, &variant(), "kimi_linear", Residual::Plain)
}

/// The decoder plan of a Kimi text config with `v`'s layer choices (Kimi-Linear's, or K3's with
/// its Block Attention Residuals).
pub(crate) fn plan_with(
    c: &KimiLinearConfig,
    v: &Variant,
    arch: &'static str,
    residual: Residual,
) -> DecoderPlan {
    let layers = c.num_hidden_layers;
    DecoderPlan {
        arch,
        vocab_size: c.vocab_size,
        hidden_size: c.hidden_size,
        dense_width: c.intermediate_size,
        num_layers: layers,
        max_context: c.max_position_embeddings,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: c.tie_word_embeddings,
        bos_token_id: c.bos_token_id,
        eos_token_ids: c.eos_token_ids.clone(),
        gqa: None,
        rope: RopeConfig::default(),
        windows: Vec::new(),
        norm_weight: NormWeight::Plain,
        mixers: c
            .layer_kinds
            .iter()
            .map(|k| match k {
                AttnKind::Kda => MixerKind::Kda,
                AttnKind::Mla => MixerKind::Mla,
            })
            .collect(),
        linear: None,
        mla: Some(MlaPlan {
            q_lora_rank: c.q_lora_rank,
            dims: mla_dims(c, v),
            rotary: false,
            out_gate: v.mla_gate,
            interleave: false,
            sparse: None,
        }),
        v4: None,
        kda: Some(KdaPlan {
            config: c.kda.clone(),
            l2: v.l2,
        }),
        residual,
        moe_layers: c.moe_layers.clone(),
        moe: MoePlan {
            experts: c.num_experts,
            width: c.moe_intermediate_size,
            shared_width: c.moe_intermediate_size * c.num_shared_experts,
            shared_module: "shared_experts",
            shared_gate: false,
            router: RouterConfig {
                scoring: Scoring::Sigmoid,
                top_k: c.num_experts_per_token,
                n_group: c.num_expert_group,
                topk_group: c.topk_group,
                norm_topk_prob: c.moe_renormalize,
                scaling: c.routed_scaling_factor,
            },
            correction_bias: true,
            router_bias: false,
            act: v.act,
            latent: v.latent,
            combine: v.combine,
            form: ExpertForm::Hf(NAMES),
        },
    }
}

impl DecoderFamily for KimiLinearConfig {
    fn plan(&self) -> DecoderPlan {
        plan(self)
    }
}

/// The in-memory model of `cfg` (the device tests open sessions on it).
pub fn load(cfg: &KimiLinearConfig, ld: &Loader<'_>) -> Result<Decoder> {
    Decoder::load(plan(cfg), ld)
}
