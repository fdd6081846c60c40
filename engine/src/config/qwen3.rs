//! Qwen3 dense config (HF `Qwen3Config`), used for raw-completion drafters.

use super::{Fields, RopeConfig};
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

impl Qwen3Config {
    pub(crate) fn parse(f: Fields<'_>) -> Result<Self> {
        let max_position_embeddings = f.usize("max_position_embeddings")?;
        let heads = f.usize("num_attention_heads")?;
        let hidden_size = f.usize("hidden_size")?;
        let c = Qwen3Config {
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            intermediate_size: f.usize("intermediate_size")?,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: f.opt_usize("num_key_value_heads")?.unwrap_or(heads),
            head_dim: match f.opt_usize("head_dim")? {
                Some(d) => d,
                None if heads > 0 => hidden_size / heads,
                None => 0,
            },
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            max_position_embeddings,
            rope: RopeConfig::parse(f, max_position_embeddings)?,
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            bos_token_id: f.opt_token_ids("bos_token_id")?.first().copied(),
            eos_token_ids: f.opt_token_ids("eos_token_id")?,
        };
        c.validate(f)?;
        Ok(c)
    }

    fn validate(&self, f: Fields<'_>) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(f.err(field, "must be positive"));
            }
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(f.err(
                "num_key_value_heads",
                format!("must divide num_attention_heads ({})", self.num_attention_heads),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(f.err("head_dim", "must be even (rotary pairs)"));
        }
        if let Some(act) = f.opt_str("hidden_act")?
            && act != "silu"
        {
            return Err(f.err(
                "hidden_act",
                format!("`{act}` is not supported (supported: silu)"),
            ));
        }
        if f.opt_bool("attention_bias")? == Some(true) {
            return Err(f.err("attention_bias", "attention biases are not supported"));
        }
        if f.opt_bool("use_sliding_window")? == Some(true) {
            return Err(f.err("use_sliding_window", "sliding-window attention is not supported"));
        }
        if let Some(types) = f.get("layer_types") {
            let all_full = types
                .as_array()
                .is_some_and(|a| a.iter().all(|t| t.as_str() == Some("full_attention")));
            if !all_full {
                return Err(f.err("layer_types", "only full_attention layers are supported"));
            }
        }
        Ok(())
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}
