//! DeepSeek-V3 / Kimi-K2 config (HF `DeepseekV3Config`; `kimi_k2` is the same architecture).
//! Deserialised with serde (HF's defaults for what a checkpoint may omit), then validated.

use serde::Deserialize;

use super::{Fields, RopeConfig, TokenIds};
use crate::error::Result;

/// Validated DeepSeek-V3 hyperparameters.
#[derive(Debug, Clone)]
pub struct DeepseekV3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// `None`: plain `q_proj`; `Some(r)`: `q_a_proj` -> RMSNorm -> `q_b_proj`.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
    /// Layers `i < first_k_dense_replace` use the dense MLP.
    pub first_k_dense_replace: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub rope: RopeConfig,
    /// DeepSeek's interleaved rotary pair layout (HF default true).
    pub rope_interleave: bool,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

fn scaling() -> f32 {
    2.5
}

fn eps() -> f32 {
    1e-6
}

/// `config.json` as written; [`DeepseekV3Config::parse`] resolves and validates it. The fields
/// after `eos_token_id` are only checked (values this implementation does not support fail).
#[derive(Debug, Deserialize)]
struct Raw {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    moe_intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    q_lora_rank: Option<usize>,
    kv_lora_rank: usize,
    qk_nope_head_dim: usize,
    qk_rope_head_dim: usize,
    v_head_dim: usize,
    n_routed_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default = "one")]
    n_shared_experts: usize,
    n_group: usize,
    topk_group: usize,
    #[serde(default = "yes")]
    norm_topk_prob: bool,
    #[serde(default = "scaling")]
    routed_scaling_factor: f32,
    first_k_dense_replace: usize,
    #[serde(default = "eps")]
    rms_norm_eps: f32,
    max_position_embeddings: usize,
    #[serde(default = "yes")]
    rope_interleave: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    bos_token_id: TokenIds,
    #[serde(default)]
    eos_token_id: TokenIds,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default)]
    moe_layer_freq: Option<usize>,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    scoring_func: Option<String>,
    #[serde(default)]
    topk_method: Option<String>,
    #[serde(default)]
    attention_bias: Option<bool>,
}

impl DeepseekV3Config {
    pub(crate) fn parse(f: Fields<'_>) -> Result<Self> {
        let raw: Raw = f.deserialize()?;
        let c = DeepseekV3Config {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            moe_intermediate_size: raw.moe_intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            q_lora_rank: raw.q_lora_rank,
            kv_lora_rank: raw.kv_lora_rank,
            qk_nope_head_dim: raw.qk_nope_head_dim,
            qk_rope_head_dim: raw.qk_rope_head_dim,
            v_head_dim: raw.v_head_dim,
            n_routed_experts: raw.n_routed_experts,
            num_experts_per_tok: raw.num_experts_per_tok,
            n_shared_experts: raw.n_shared_experts,
            n_group: raw.n_group,
            topk_group: raw.topk_group,
            norm_topk_prob: raw.norm_topk_prob,
            routed_scaling_factor: raw.routed_scaling_factor,
            first_k_dense_replace: raw.first_k_dense_replace,
            rms_norm_eps: raw.rms_norm_eps,
            max_position_embeddings: raw.max_position_embeddings,
            rope: RopeConfig::parse(f, raw.max_position_embeddings)?,
            rope_interleave: raw.rope_interleave,
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
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("v_head_dim", self.v_head_dim),
            ("n_group", self.n_group),
        ];
        f.positive(&positive)?;
        if !self.qk_rope_head_dim.is_multiple_of(2) {
            return Err(f.err(
                "qk_rope_head_dim",
                format!("must be even, found {}", self.qk_rope_head_dim),
            ));
        }
        if let Some(kv) = raw.num_key_value_heads
            && kv != self.num_attention_heads
        {
            return Err(f.err(
                "num_key_value_heads",
                format!(
                    "MLA needs {} (= num_attention_heads), found {kv}",
                    self.num_attention_heads
                ),
            ));
        }
        if self.first_k_dense_replace > self.num_hidden_layers {
            return Err(f.err("first_k_dense_replace", "exceeds num_hidden_layers"));
        }
        let has_moe = self.first_k_dense_replace < self.num_hidden_layers;
        if has_moe {
            f.top_k_within(self.num_experts_per_tok, self.n_routed_experts)?;
            if !self.n_routed_experts.is_multiple_of(self.n_group) {
                return Err(f.err(
                    "n_group",
                    format!("must divide n_routed_experts ({})", self.n_routed_experts),
                ));
            }
            if self.topk_group == 0 || self.topk_group > self.n_group {
                return Err(f.err("topk_group", format!("must be in 1..={}", self.n_group)));
            }
            let per_group = self.n_routed_experts / self.n_group;
            if self.n_group > 1 && per_group < 2 {
                return Err(f.err(
                    "n_group",
                    "group-limited routing needs at least 2 experts per group",
                ));
            }
            if self.topk_group * per_group < self.num_experts_per_tok {
                return Err(f.err(
                    "topk_group",
                    "the kept groups hold fewer experts than num_experts_per_tok",
                ));
            }
        }
        if let Some(freq) = raw.moe_layer_freq
            && freq != 1
        {
            return Err(f.err(
                "moe_layer_freq",
                format!("{freq} is not supported (HF ignores it, the remote code does not)"),
            ));
        }
        let checks = [
            ("hidden_act", &raw.hidden_act, "silu"),
            ("scoring_func", &raw.scoring_func, "sigmoid"),
            ("topk_method", &raw.topk_method, "noaux_tc"),
        ];
        for (field, value, want) in checks {
            if let Some(v) = value
                && v != want
            {
                return Err(f.err(field, format!("`{v}` is not supported (supported: {want})")));
            }
        }
        if raw.attention_bias == Some(true) {
            return Err(f.err("attention_bias", "attention biases are not supported"));
        }
        Ok(())
    }

    /// Whether layer `i` uses the routed MoE block.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        i >= self.first_k_dense_replace
    }

    /// `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

impl super::TextConfig for DeepseekV3Config {
    const MODEL_TYPES: &'static [&'static str] = &["deepseek_v3", "kimi_k2"];
    const NESTING: super::Nesting =
        super::Nesting::FlatOrNestedIn(&["kimi_k25", "kimi_k2_5", "kimi_vl", "deepseek_v3", "kimi_k2"]);

    fn parse(i: super::FamilyInput<'_>) -> Result<Self> {
        Self::parse(i.text)
    }
}
