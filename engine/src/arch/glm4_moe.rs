//! GLM-4.5 / GLM-4.6 (HF `transformers/models/glm4_moe/modeling_glm4_moe.py`): the GQA MoE
//! decoder ([`super::decoder`]) with biases on `q/k/v_proj` when `attention_bias` (none on
//! `o_proj`), per-head q/k RMSNorm when `use_qk_norm`, `rotate_half` RoPE on the first
//! `head_dim · partial_rotary_factor` values of each head, dense MLPs on the first
//! `first_k_dense_replace` layers, and DeepSeek-V3's router: sigmoid scores, selection on
//! `score + e_score_correction_bias` limited to the best `topk_group` of `n_group` groups,
//! renormalised (`norm_topk_prob`) and scaled by `routed_scaling_factor`, plus shared experts.
//! The multi-token-prediction layer GLM ships after the last decoder layer is not read.

use super::decoder::{DecoderFamily, DecoderPlan, ExpertForm, GqaPlan, MoeNames, MoePlan, Residual};
use super::layers::gqa::{GqaDims, GqaOptions, QkNorm};
use super::layers::mlp::Activation;
use super::layers::moe::{Combine, RouterConfig, Scoring};
use crate::config::Glm4MoeConfig;
use crate::model::NormWeight;

/// The decoder plan of a GLM-4.5 config.
fn plan(c: &Glm4MoeConfig) -> DecoderPlan {
    DecoderPlan {
        arch: "glm4_moe",
        vocab_size: c.vocab_size,
        hidden_size: c.hidden_size,
        dense_width: c.intermediate_size,
        num_layers: c.num_hidden_layers,
        max_context: c.max_position_embeddings,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: c.tie_word_embeddings,
        bos_token_id: c.bos_token_id.first(),
        eos_token_ids: c.eos_token_id.to_vec(),
        gqa: Some(GqaPlan {
            dims: GqaDims {
                heads: c.num_attention_heads,
                kv_heads: c.num_key_value_heads,
                head_dim: c.head_dim(),
                rotary_dim: c.rotary_dim(),
            },
            options: GqaOptions {
                qkv_bias: c.attention_bias,
                o_bias: false,
                qk_norm: match c.use_qk_norm {
                    true => QkNorm::PerHead,
                    false => QkNorm::None,
                },
                eps: c.rms_norm_eps,
                sinks: false,
                window: None,
                norm_weight: NormWeight::Plain,
                output_gate: false,
            },
        }),
        rope: c.rope.clone(),
        windows: Vec::new(),
        norm_weight: NormWeight::Plain,
        mixers: Vec::new(),
        linear: None,
        mla: None,
        v4: None,
        kda: None,
        residual: Residual::Plain,
        moe_layers: (0..c.num_hidden_layers).map(|i| c.is_moe_layer(i)).collect(),
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

impl DecoderFamily for Glm4MoeConfig {
    fn plan(&self) -> DecoderPlan {
        plan(self)
    }
}
