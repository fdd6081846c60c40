//! DeepSeek-V3 / V3.1 / Kimi-K2 (HF `transformers/models/deepseek_v3/modeling_deepseek_v3.py`):
//! the shared decoder ([`super::decoder`]) with MLA on every layer (low-rank or full `q_proj`,
//! the compressed latent cache, RoPE on the shared key part, YaRN's softmax-scale multiplier),
//! dense MLPs on the first `first_k_dense_replace` layers and after them a sigmoid-routed MoE
//! with a selection-only `e_score_correction_bias`, group-limited top-k, optional
//! renormalisation, `routed_scaling_factor` and `n_shared_experts` shared experts; untied head.
//! The decoder's device session runs these stacks whole on a GPU (`decoder_device.rs`).

use super::decoder::{
    Decoder, DecoderFamily, DecoderPlan, ExpertForm, MixerKind, MlaPlan, MoeNames, MoePlan, Residual,
};
use super::layers::mla::MlaDims;
use super::layers::mlp::Activation;
use super::layers::moe::{Combine, RouterConfig, Scoring};
use crate::config::DeepseekV3Config;
use crate::error::Result;
use crate::model::{Loader, NormWeight};

/// The decoder plan of a DeepSeek-V3 config (GLM-5's base, [`super::glm_moe_dsa`]).
pub(super) fn plan(c: &DeepseekV3Config) -> DecoderPlan {
    let (layers, qk) = (c.num_hidden_layers, c.qk_head_dim());
    DecoderPlan {
        arch: "deepseek_v3",
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
        rope: c.rope.clone(),
        windows: Vec::new(),
        norm_weight: NormWeight::Plain,
        mixers: vec![MixerKind::Mla; layers],
        linear: None,
        mla: Some(MlaPlan {
            q_lora_rank: c.q_lora_rank,
            dims: MlaDims {
                heads: c.num_attention_heads,
                nope: c.qk_nope_head_dim,
                rope: c.qk_rope_head_dim,
                v: c.v_head_dim,
                kv_lora: c.kv_lora_rank,
                eps: c.rms_norm_eps,
                scale: ((qk as f64).powf(-0.5) * c.rope.softmax_scale_multiplier()) as f32,
            },
            rotary: true,
            out_gate: false,
            interleave: c.rope_interleave,
            sparse: None,
        }),
        v4: None,
        kda: None,
        residual: Residual::Plain,
        moe_layers: (0..layers).map(|i| c.is_moe_layer(i)).collect(),
        moe: MoePlan {
            experts: c.n_routed_experts,
            width: c.moe_intermediate_size,
            shared_width: c.moe_intermediate_size * c.n_shared_experts,
            shared_module: "shared_experts",
            shared_gate: false,
            router: RouterConfig {
                scoring: Scoring::Sigmoid,
                top_k: c.num_experts_per_tok,
                n_group: c.n_group,
                topk_group: c.topk_group,
                norm_topk_prob: c.norm_topk_prob,
                scaling: c.routed_scaling_factor,
            },
            correction_bias: true,
            router_bias: false,
            act: Activation::Silu,
            latent: None,
            combine: Combine::Ascending,
            form: ExpertForm::Hf(MoeNames::HF),
        },
    }
}

impl DecoderFamily for DeepseekV3Config {
    fn plan(&self) -> DecoderPlan {
        plan(self)
    }
}

/// The in-memory model of `cfg` (the device tests open sessions on it).
pub fn load(cfg: &DeepseekV3Config, ld: &Loader<'_>) -> Result<Decoder> {
    Decoder::load(plan(cfg), ld)
}
