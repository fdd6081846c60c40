//! Qwen3-MoE config (HF `Qwen3MoeConfig`: Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B-A35B).
//! Serde-derived with HF's defaults for the fields a checkpoint may omit; every dimension must
//! be written.

use serde::Deserialize;

use super::{Fields, RopeConfig, TokenIds};
use crate::error::Result;

fn one() -> usize {
    1
}

fn four() -> usize {
    4
}

fn eps() -> f32 {
    1e-6
}

fn silu() -> String {
    "silu".into()
}

/// Validated Qwen3-MoE hyperparameters.
#[derive(Debug, Clone, Deserialize)]
pub struct Qwen3MoeConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the dense MLP of `mlp_only_layers` (and of layers off `decoder_sparse_step`).
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "four")]
    pub num_key_value_heads: usize,
    /// `hidden_size / num_attention_heads` when absent (HF's `getattr` fallback).
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(alias = "num_local_experts")]
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    /// Layer `i` is MoE when `(i + 1) % decoder_sparse_step == 0` and it is not MLP-only.
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Option<Vec<usize>>,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default = "eps")]
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on `q/k/v/o_proj`.
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    use_sliding_window: bool,
    #[serde(default = "silu")]
    hidden_act: String,
    #[serde(default)]
    pub bos_token_id: TokenIds,
    #[serde(default)]
    pub eos_token_id: TokenIds,
    /// From `rope_parameters` (or legacy `rope_theta`/`rope_scaling`).
    #[serde(skip)]
    pub rope: RopeConfig,
}

impl Qwen3MoeConfig {
    pub(crate) fn parse(f: Fields<'_>) -> Result<Self> {
        let mut c: Qwen3MoeConfig = f.deserialize()?;
        c.rope = RopeConfig::parse(f, c.max_position_embeddings)?;
        c.validate(f)?;
        Ok(c)
    }

    fn validate(&self, f: Fields<'_>) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim()),
            ("decoder_sparse_step", self.decoder_sparse_step),
        ];
        f.positive(&positive)?;
        f.kv_heads_divide(self.num_attention_heads, self.num_key_value_heads)?;
        if !self.head_dim().is_multiple_of(2) {
            return Err(f.err("head_dim", "must be even (rotary pairs)"));
        }
        let has_moe = (0..self.num_hidden_layers).any(|i| self.is_moe_layer(i));
        if has_moe {
            f.top_k_within(self.num_experts_per_tok, self.num_experts)?;
        }
        if self.hidden_act != "silu" {
            return Err(f.err(
                "hidden_act",
                format!("`{}` is not supported (supported: silu)", self.hidden_act),
            ));
        }
        if self.use_sliding_window {
            return Err(f.err("use_sliding_window", "sliding-window attention is not supported"));
        }
        Ok(())
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Whether layer `i` uses the routed MoE block (HF `Qwen3MoeDecoderLayer`).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        let mlp_only = self.mlp_only_layers.as_deref().unwrap_or(&[]).contains(&i);
        !mlp_only && self.num_experts > 0 && (i + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

impl super::TextConfig for Qwen3MoeConfig {
    const MODEL_TYPES: &'static [&'static str] = &["qwen3_moe"];
    const NESTING: super::Nesting = super::Nesting::Flat;

    fn parse(i: super::FamilyInput<'_>) -> Result<Self> {
        Self::parse(i.text)
    }
}
