//! Qwen3 dense (HF `transformers/models/qwen3/modeling_qwen3.py`), the raw-completion drafter:
//! the GQA decoder of [`super::decoder`] with every layer dense — per-head q/k RMSNorm,
//! full-width `rotate_half` RoPE, no biases, tied embeddings when configured. Traced tensors:
//! `embed`, `layers.{l}`, `norm`. Loads in memory only (drafters are small).

use super::decoder::{DecoderFamily, DecoderPlan, GqaPlan, MoePlan, Residual};
use super::layers::gqa::{GqaDims, GqaOptions, QkNorm};
use crate::config::Qwen3Config;
use crate::model::NormWeight;

/// The decoder plan of a Qwen3 dense config.
fn plan(c: &Qwen3Config) -> DecoderPlan {
    DecoderPlan {
        arch: "qwen3",
        vocab_size: c.vocab_size,
        hidden_size: c.hidden_size,
        dense_width: c.intermediate_size,
        num_layers: c.num_hidden_layers,
        max_context: c.max_position_embeddings,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: c.tie_word_embeddings,
        bos_token_id: c.bos_token_id,
        eos_token_ids: c.eos_token_ids.clone(),
        gqa: Some(GqaPlan {
            dims: GqaDims {
                heads: c.num_attention_heads,
                kv_heads: c.num_key_value_heads,
                head_dim: c.head_dim,
                rotary_dim: c.head_dim,
            },
            options: GqaOptions {
                qkv_bias: false,
                o_bias: false,
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
        moe_layers: vec![false; c.num_hidden_layers],
        moe: MoePlan::none(),
    }
}

impl DecoderFamily for Qwen3Config {
    fn plan(&self) -> DecoderPlan {
        plan(self)
    }

    fn raw_completion_drafter(&self) -> bool {
        true
    }

    fn supports_budget(&self) -> bool {
        false
    }
}
