//! gpt-oss config (HF `GptOssConfig`: gpt-oss-20b, gpt-oss-120b). Serde-derived with HF's
//! defaults for what a checkpoint may omit; `layer_types` defaults to HF's alternation (sliding
//! on even layers) and every value must be one the decoder implements.

use serde::Deserialize;

use super::{Fields, RopeConfig, TokenIds};
use crate::error::Result;

fn default_experts_per_tok() -> usize {
    4
}

fn default_eps() -> f32 {
    1e-5
}

fn default_alpha() -> f32 {
    1.702
}

fn default_limit() -> f32 {
    7.0
}

fn default_true() -> bool {
    true
}

fn default_head_dim() -> usize {
    64
}

fn default_silu() -> String {
    "silu".into()
}

/// What a layer's attention sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GptOssLayer {
    /// The last `sliding_window` positions.
    SlidingAttention,
    /// Every earlier position.
    FullAttention,
}

/// Validated gpt-oss hyperparameters.
#[derive(Debug, Clone, Deserialize)]
pub struct GptOssConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Each routed expert's width.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    #[serde(default = "default_head_dim")]
    pub head_dim: usize,
    #[serde(alias = "num_experts")]
    pub num_local_experts: usize,
    #[serde(default = "default_experts_per_tok", alias = "experts_per_token")]
    pub num_experts_per_tok: usize,
    #[serde(default)]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    layer_types: Option<Vec<GptOssLayer>>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "default_alpha")]
    pub swiglu_alpha: f32,
    #[serde(default = "default_limit")]
    pub swiglu_limit: f32,
    #[serde(default = "default_true")]
    pub attention_bias: bool,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_silu")]
    hidden_act: String,
    #[serde(default)]
    pub bos_token_id: TokenIds,
    #[serde(default)]
    pub eos_token_id: TokenIds,
    /// From `rope_parameters` (or legacy `rope_theta`/`rope_scaling`); HF's YaRN default when
    /// absent.
    #[serde(skip)]
    pub rope: RopeConfig,
}

impl GptOssConfig {
    pub(crate) fn parse(f: Fields<'_>) -> Result<Self> {
        let mut c: GptOssConfig = f.deserialize()?;
        c.rope = match (f.get("rope_parameters"), f.get("rope_scaling")) {
            (None, None) => hf_default_rope(f.opt_f64("rope_theta")?.unwrap_or(150_000.0)),
            _ => RopeConfig::parse(f, c.max_position_embeddings)?,
        };
        c.validate(f)?;
        Ok(c)
    }

    fn validate(&self, f: Fields<'_>) -> Result<()> {
        f.positive(&[
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("num_local_experts", self.num_local_experts),
        ])?;
        f.kv_heads_divide(self.num_attention_heads, self.num_key_value_heads)?;
        if !self.head_dim.is_multiple_of(2) {
            return Err(f.err("head_dim", "must be even (rotary pairs)"));
        }
        f.top_k_within(self.num_experts_per_tok, self.num_local_experts)?;
        if self.hidden_act != "silu" {
            return Err(f.err(
                "hidden_act",
                format!("`{}` is not supported (supported: silu)", self.hidden_act),
            ));
        }
        if let Some(types) = &self.layer_types
            && types.len() != self.num_hidden_layers
        {
            return Err(f.err(
                "layer_types",
                format!("{} entries for {} layers", types.len(), self.num_hidden_layers),
            ));
        }
        if self.layer_types().contains(&GptOssLayer::SlidingAttention)
            && self.sliding_window.is_none_or(|w| w == 0)
        {
            return Err(f.err("sliding_window", "sliding layers need a positive window"));
        }
        if self.swiglu_limit.is_nan() || self.swiglu_limit <= 0.0 {
            return Err(f.err("swiglu_limit", "must be positive"));
        }
        Ok(())
    }

    /// Each layer's attention kind (HF's default alternation when the config has none).
    pub fn layer_types(&self) -> Vec<GptOssLayer> {
        match &self.layer_types {
            Some(t) => t.clone(),
            None => (0..self.num_hidden_layers)
                .map(|i| match (i + 1) % 2 {
                    1 => GptOssLayer::SlidingAttention,
                    _ => GptOssLayer::FullAttention,
                })
                .collect(),
        }
    }

    /// Layer `i`'s sliding window (`None`: full attention).
    pub fn window(&self, i: usize) -> Option<usize> {
        match self.layer_types()[i] {
            GptOssLayer::SlidingAttention => self.sliding_window,
            GptOssLayer::FullAttention => None,
        }
    }
}

/// HF `GptOssConfig.__post_init__`'s RoPE when the config names none: YaRN, factor 32 over
/// 4096 positions, β 32 / 1, not truncated.
fn hf_default_rope(theta: f64) -> RopeConfig {
    RopeConfig {
        theta,
        scaling: super::RopeScaling::Yarn {
            factor: 32.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: None,
            mscale_all_dim: None,
            original_max_position_embeddings: 4096,
            attention_factor: None,
            truncate: false,
        },
    }
}

impl super::TextConfig for GptOssConfig {
    const MODEL_TYPES: &'static [&'static str] = &["gpt_oss"];
    const NESTING: super::Nesting = super::Nesting::Flat;

    fn parse(i: super::FamilyInput<'_>) -> Result<Self> {
        Self::parse(i.text)
    }
}
