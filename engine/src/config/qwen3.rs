//! Qwen3 dense config (HF `Qwen3Config`), used for raw-completion drafters. Deserialised with
//! serde (HF's defaults for what a checkpoint may omit), then validated.

use serde::Deserialize;

use super::{Fields, RopeConfig, TokenIds};
use crate::error::Result;

/// Validated Qwen3 hyperparameters.
#[derive(Debug, Clone)]
pub struct Qwen3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub rope: RopeConfig,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn eps() -> f32 {
    1e-6
}

fn silu() -> String {
    "silu".into()
}

/// `config.json` as written; [`Qwen3Config::parse`] resolves and validates it.
#[derive(Debug, Deserialize)]
struct Raw {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    /// `num_attention_heads` when absent.
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    /// `hidden_size / num_attention_heads` when absent.
    #[serde(default)]
    head_dim: Option<usize>,
    #[serde(default = "eps")]
    rms_norm_eps: f32,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    bos_token_id: TokenIds,
    #[serde(default)]
    eos_token_id: TokenIds,
    #[serde(default = "silu")]
    hidden_act: String,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    use_sliding_window: bool,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
}

impl Qwen3Config {
    pub(crate) fn parse(f: Fields<'_>) -> Result<Self> {
        let raw: Raw = f.deserialize()?;
        let heads = raw.num_attention_heads;
        let c = Qwen3Config {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(heads),
            head_dim: raw.head_dim.unwrap_or(raw.hidden_size / heads.max(1)),
            rms_norm_eps: raw.rms_norm_eps,
            max_position_embeddings: raw.max_position_embeddings,
            rope: RopeConfig::parse(f, raw.max_position_embeddings)?,
            tie_word_embeddings: raw.tie_word_embeddings,
            bos_token_id: raw.bos_token_id.first(),
            eos_token_ids: raw.eos_token_id.to_vec(),
        };
        c.validate(f, &raw)?;
        Ok(c)
    }

    fn validate(&self, f: Fields<'_>, raw: &Raw) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        f.positive(&positive)?;
        f.kv_heads_divide(self.num_attention_heads, self.num_key_value_heads)?;
        if !self.head_dim.is_multiple_of(2) {
            return Err(f.err("head_dim", "must be even (rotary pairs)"));
        }
        if raw.hidden_act != "silu" {
            return Err(f.err(
                "hidden_act",
                format!("`{}` is not supported (supported: silu)", raw.hidden_act),
            ));
        }
        if raw.attention_bias {
            return Err(f.err("attention_bias", "attention biases are not supported"));
        }
        if raw.use_sliding_window {
            return Err(f.err("use_sliding_window", "sliding-window attention is not supported"));
        }
        if let Some(types) = &raw.layer_types
            && types.iter().any(|t| t != "full_attention")
        {
            return Err(f.err("layer_types", "only full_attention layers are supported"));
        }
        Ok(())
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}

impl super::TextConfig for Qwen3Config {
    const MODEL_TYPES: &'static [&'static str] = &["qwen3"];
    const NESTING: super::Nesting = super::Nesting::Flat;

    fn parse(i: super::FamilyInput<'_>) -> Result<Self> {
        Self::parse(i.text)
    }
}
