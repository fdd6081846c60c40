//! Qwen3-MoE (HF `transformers/models/qwen3_moe/modeling_qwen3_moe.py`): the GQA MoE decoder
//! ([`super::decoder`]) with per-head q/k RMSNorm, full-width `rotate_half` RoPE, biases on all
//! four projections when `attention_bias`, a softmax router (`softmax` over all experts in f32,
//! plain top-k, optional `norm_topk_prob` renormalisation, no scaling, no shared experts), and
//! dense MLPs on `mlp_only_layers` and layers off `decoder_sparse_step`.

use super::decoder::{DecoderFamily, DecoderPlan, ExpertForm, GqaPlan, MoeNames, MoePlan, Residual};
use super::layers::gqa::{GqaDims, GqaOptions, QkNorm};
use super::layers::mlp::Activation;
use super::layers::moe::{Combine, RouterConfig, Scoring};
use crate::config::Qwen3MoeConfig;
use crate::model::NormWeight;

/// The decoder plan of a Qwen3-MoE config.
fn plan(c: &Qwen3MoeConfig) -> DecoderPlan {
    let d = c.head_dim();
    DecoderPlan {
        arch: "qwen3_moe",
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
                head_dim: d,
                rotary_dim: d,
            },
            options: GqaOptions {
                qkv_bias: c.attention_bias,
                o_bias: c.attention_bias,
                qk_norm: QkNorm::PerHead,
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
            experts: c.num_experts,
            width: c.moe_intermediate_size,
            shared_width: 0,
            shared_module: "shared_experts",
            shared_gate: false,
            router: RouterConfig {
                scoring: Scoring::Softmax,
                top_k: c.num_experts_per_tok,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: c.norm_topk_prob,
                scaling: 1.0,
            },
            correction_bias: false,
            router_bias: false,
            act: Activation::Silu,
            latent: None,
            combine: Combine::Ascending,
            form: ExpertForm::Hf(MoeNames::HF),
        },
    }
}

impl DecoderFamily for Qwen3MoeConfig {
    fn plan(&self) -> DecoderPlan {
        plan(self)
    }

    fn raw_completion_drafter(&self) -> bool {
        true
    }
}
