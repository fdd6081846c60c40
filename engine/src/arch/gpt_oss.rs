//! gpt-oss (HF `transformers/models/gpt_oss/modeling_gpt_oss.py`): the GQA MoE decoder
//! ([`super::decoder`]) with biases on all four attention projections, a learned sink logit per
//! head, sliding-window layers alternating with full ones (`layer_types`), `rotate_half` YaRN
//! RoPE whose attention factor scales cos and sin, and on every layer a MoE of MXFP4 experts:
//! a router `x Wᵀ + b`, top-k on the logits, softmax over the chosen logits only; each expert
//! `down(act(gate_up(x) + b) ) + b` with gate/up rows interleaved and the clamped SwiGLU
//! `(clamp(u, ±limit) + 1) · g'σ(α g')`, `g' = min(g, limit)`; outputs summed in ascending
//! expert order. The experts are read as published (`*_blocks`/`*_scales`, groups of 32).

use super::decoder::{DecoderFamily, DecoderPlan, ExpertForm, GqaPlan, MoeNames, MoePlan, Residual};
use super::layers::gqa::{GqaDims, GqaOptions, QkNorm};
use super::layers::mlp::Activation;
use super::layers::moe::{Combine, RouterConfig, Scoring};
use crate::config::GptOssConfig;
use crate::model::NormWeight;

/// Where gpt-oss keeps a MoE layer's tensors: `mlp.router` (with a bias) and the stacked
/// experts under `mlp.experts` (per-expert names unused; no correction bias).
const NAMES: MoeNames = MoeNames {
    block: "mlp",
    expert: ["", "", ""],
    router: "router",
    correction_bias: "",
};

/// The decoder plan of a gpt-oss config.
fn plan(c: &GptOssConfig) -> DecoderPlan {
    let layers = c.num_hidden_layers;
    DecoderPlan {
        arch: "gpt_oss",
        vocab_size: c.vocab_size,
        hidden_size: c.hidden_size,
        dense_width: c.intermediate_size,
        num_layers: layers,
        max_context: c.max_position_embeddings,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: c.tie_word_embeddings,
        bos_token_id: c.bos_token_id.first(),
        eos_token_ids: c.eos_token_id.to_vec(),
        gqa: Some(GqaPlan {
            dims: GqaDims {
                heads: c.num_attention_heads,
                kv_heads: c.num_key_value_heads,
                head_dim: c.head_dim,
                rotary_dim: c.head_dim,
            },
            options: GqaOptions {
                qkv_bias: c.attention_bias,
                o_bias: c.attention_bias,
                qk_norm: QkNorm::None,
                eps: c.rms_norm_eps,
                sinks: true,
                window: None,
                norm_weight: NormWeight::Plain,
                output_gate: false,
            },
        }),
        rope: c.rope.clone(),
        windows: (0..layers).map(|i| c.window(i)).collect(),
        norm_weight: NormWeight::Plain,
        mixers: Vec::new(),
        linear: None,
        mla: None,
        v4: None,
        kda: None,
        residual: Residual::Plain,
        moe_layers: vec![true; layers],
        moe: MoePlan {
            experts: c.num_local_experts,
            width: c.intermediate_size,
            shared_width: 0,
            shared_module: "shared_experts",
            shared_gate: false,
            router: RouterConfig {
                scoring: Scoring::TopKSoftmax,
                top_k: c.num_experts_per_tok,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: false,
                scaling: 1.0,
            },
            correction_bias: false,
            router_bias: true,
            act: Activation::Silu,
            latent: None,
            combine: Combine::Ascending,
            form: ExpertForm::StackedMxfp4 {
                names: NAMES,
                gate_up: "gate_up_proj",
                down: "down_proj",
                act: Activation::ClampedSwiglu {
                    alpha: c.swiglu_alpha,
                    limit: c.swiglu_limit,
                },
            },
        },
    }
}

impl DecoderFamily for GptOssConfig {
    fn plan(&self) -> DecoderPlan {
        plan(self)
    }
}
