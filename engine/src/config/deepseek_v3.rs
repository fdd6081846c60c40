//! DeepSeek-V3 / Kimi-K2 config (HF `DeepseekV3Config`; `kimi_k2` is the same architecture).

use super::{Fields, RopeConfig};
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

impl DeepseekV3Config {
    pub(crate) fn parse(f: Fields<'_>) -> Result<Self> {
        let max_position_embeddings = f.usize("max_position_embeddings")?;
        let c = DeepseekV3Config {
            vocab_size: f.usize("vocab_size")?,
            hidden_size: f.usize("hidden_size")?,
            intermediate_size: f.usize("intermediate_size")?,
            moe_intermediate_size: f.usize("moe_intermediate_size")?,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            num_attention_heads: f.usize("num_attention_heads")?,
            q_lora_rank: f.opt_usize("q_lora_rank")?,
            kv_lora_rank: f.usize("kv_lora_rank")?,
            qk_nope_head_dim: f.usize("qk_nope_head_dim")?,
            qk_rope_head_dim: f.usize("qk_rope_head_dim")?,
            v_head_dim: f.usize("v_head_dim")?,
            n_routed_experts: f.usize("n_routed_experts")?,
            num_experts_per_tok: f.usize("num_experts_per_tok")?,
            n_shared_experts: f.opt_usize("n_shared_experts")?.unwrap_or(1),
            n_group: f.usize("n_group")?,
            topk_group: f.usize("topk_group")?,
            norm_topk_prob: f.opt_bool("norm_topk_prob")?.unwrap_or(true),
            routed_scaling_factor: f.opt_f64("routed_scaling_factor")?.unwrap_or(2.5) as f32,
            first_k_dense_replace: f.usize("first_k_dense_replace")?,
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            max_position_embeddings,
            rope: RopeConfig::parse(f, max_position_embeddings)?,
            rope_interleave: f.opt_bool("rope_interleave")?.unwrap_or(true),
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
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("v_head_dim", self.v_head_dim),
            ("n_group", self.n_group),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(f.err(field, "must be positive"));
            }
        }
        if !self.qk_rope_head_dim.is_multiple_of(2) {
            return Err(f.err(
                "qk_rope_head_dim",
                format!("must be even, found {}", self.qk_rope_head_dim),
            ));
        }
        if let Some(kv) = f.opt_usize("num_key_value_heads")?
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
            if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.n_routed_experts {
                return Err(f.err(
                    "num_experts_per_tok",
                    format!("must be in 1..={}", self.n_routed_experts),
                ));
            }
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
        if let Some(freq) = f.opt_usize("moe_layer_freq")?
            && freq != 1
        {
            return Err(f.err(
                "moe_layer_freq",
                format!("{freq} is not supported (HF ignores it, the remote code does not)"),
            ));
        }
        let checks = [
            ("hidden_act", "silu"),
            ("scoring_func", "sigmoid"),
            ("topk_method", "noaux_tc"),
        ];
        for (field, want) in checks {
            if let Some(v) = f.opt_str(field)?
                && v != want
            {
                return Err(f.err(field, format!("`{v}` is not supported (supported: {want})")));
            }
        }
        if f.opt_bool("attention_bias")? == Some(true) {
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
