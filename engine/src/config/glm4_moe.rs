//! GLM-4.5 / GLM-4.6 config (HF `Glm4MoeConfig`, `model_type` `glm4_moe`). Serde-derived with
//! HF's defaults for the fields a checkpoint may omit; every dimension must be written.

use serde::Deserialize;

use super::{Fields, RopeConfig, TokenIds};
use crate::error::Result;

fn one() -> usize {
    1
}

fn eight() -> usize {
    8
}

fn eps() -> f32 {
    1e-5
}

fn yes() -> bool {
    true
}

fn unit() -> f32 {
    1.0
}

fn silu() -> String {
    "silu".into()
}

/// Validated GLM-4.5 hyperparameters.
#[derive(Debug, Clone, Deserialize)]
pub struct Glm4MoeConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the dense MLP of the first `first_k_dense_replace` layers.
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "eight")]
    pub num_key_value_heads: usize,
    /// `hidden_size / num_attention_heads` when absent (HF's `getattr` fallback).
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    #[serde(default = "one")]
    pub n_shared_experts: usize,
    #[serde(default = "one")]
    pub n_group: usize,
    #[serde(default = "one")]
    pub topk_group: usize,
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    #[serde(default = "unit")]
    pub routed_scaling_factor: f32,
    /// Layers `i < first_k_dense_replace` use the dense MLP.
    #[serde(default = "one")]
    pub first_k_dense_replace: usize,
    #[serde(default = "eps")]
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on `q/k/v_proj` (never on `o_proj`).
    #[serde(default)]
    pub attention_bias: bool,
    /// Per-head RMSNorm of queries and keys.
    #[serde(default)]
    pub use_qk_norm: bool,
    #[serde(default = "silu")]
    hidden_act: String,
    #[serde(default)]
    pub bos_token_id: TokenIds,
    #[serde(default)]
    pub eos_token_id: TokenIds,
    /// From `rope_parameters` (or legacy `rope_theta`/`rope_scaling`).
    #[serde(skip)]
    pub rope: RopeConfig,
    /// Fraction of each head that is rotated: `rope_parameters.partial_rotary_factor`, else the
    /// top-level field, else HF's default 0.5.
    #[serde(skip)]
    pub partial_rotary_factor: f64,
}

impl Glm4MoeConfig {
    pub(crate) fn parse(f: Fields<'_>) -> Result<Self> {
        let mut c: Glm4MoeConfig = f.deserialize()?;
        c.rope = RopeConfig::parse(f, c.max_position_embeddings)?;
        c.partial_rotary_factor = RopeConfig::partial_rotary_factor(f, 0.5)?;
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
            ("n_group", self.n_group),
        ];
        f.positive(&positive)?;
        f.kv_heads_divide(self.num_attention_heads, self.num_key_value_heads)?;
        let rotary = self.rotary_dim();
        if rotary == 0 || !rotary.is_multiple_of(2) || rotary > self.head_dim() {
            return Err(f.err(
                "partial_rotary_factor",
                format!(
                    "{} of head_dim {} gives a rotary width of {rotary}; it must be even and in 2..=head_dim",
                    self.partial_rotary_factor,
                    self.head_dim()
                ),
            ));
        }
        if self.first_k_dense_replace > self.num_hidden_layers {
            return Err(f.err("first_k_dense_replace", "exceeds num_hidden_layers"));
        }
        if self.first_k_dense_replace < self.num_hidden_layers {
            self.validate_routing(f)?;
        }
        if self.hidden_act != "silu" {
            return Err(f.err(
                "hidden_act",
                format!("`{}` is not supported (supported: silu)", self.hidden_act),
            ));
        }
        Ok(())
    }

    fn validate_routing(&self, f: Fields<'_>) -> Result<()> {
        let (e, k) = (self.n_routed_experts, self.num_experts_per_tok);
        if k == 0 || k > e {
            return Err(f.err("num_experts_per_tok", format!("must be in 1..={e}")));
        }
        if !e.is_multiple_of(self.n_group) {
            return Err(f.err("n_group", format!("must divide n_routed_experts ({e})")));
        }
        if self.topk_group == 0 || self.topk_group > self.n_group {
            return Err(f.err("topk_group", format!("must be in 1..={}", self.n_group)));
        }
        if self.n_group > 1 && e / self.n_group < 2 {
            return Err(f.err(
                "n_group",
                "group-limited routing needs at least 2 experts per group",
            ));
        }
        if self.topk_group * (e / self.n_group) < k {
            return Err(f.err(
                "topk_group",
                "the kept groups hold fewer experts than num_experts_per_tok",
            ));
        }
        Ok(())
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Rotated values per head (`int(head_dim * partial_rotary_factor)`, as HF).
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim() as f64 * self.partial_rotary_factor) as usize
    }

    /// Whether layer `i` uses the routed MoE block.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        i >= self.first_k_dense_replace
    }
}

impl super::TextConfig for Glm4MoeConfig {
    const MODEL_TYPES: &'static [&'static str] = &["glm4_moe"];
    const NESTING: super::Nesting = super::Nesting::Flat;

    fn parse(i: super::FamilyInput<'_>) -> Result<Self> {
        Self::parse(i.text)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use crate::config::Spec;

    /// GLM-4.5's published config.json shape: `partial_rotary_factor` and `rope_theta` at the
    /// top level, `rope_scaling` null.
    fn published() -> Value {
        json!({
            "model_type": "glm4_moe", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
            "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
            "routed_scaling_factor": 2.5, "attention_bias": true, "use_qk_norm": true,
            "partial_rotary_factor": 0.5, "rope_theta": 1000000, "rope_scaling": null,
            "max_position_embeddings": 4096, "num_nextn_predict_layers": 1,
            "eos_token_id": [151329, 151336, 151338]
        })
    }

    fn parse(v: &Value) -> crate::Result<super::Glm4MoeConfig> {
        Ok(Spec::<super::Glm4MoeConfig>::from_value_typed(v, Path::new("config.json"))?.arch)
    }

    #[test]
    fn partial_rotary_comes_from_either_spelling_and_defaults_to_half() {
        assert_eq!(parse(&published()).unwrap().rotary_dim(), 16);
        let mut v = published();
        v.as_object_mut().unwrap().remove("partial_rotary_factor");
        assert_eq!(parse(&v).unwrap().rotary_dim(), 16, "HF's default is 0.5");
        v["rope_parameters"] =
            json!({"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25});
        assert_eq!(parse(&v).unwrap().rotary_dim(), 8);
    }

    #[test]
    fn bad_routing_and_rotary_fields_are_named() {
        for (field, value) in [
            ("num_experts_per_tok", json!(9)),
            ("n_group", json!(3)),
            ("partial_rotary_factor", json!(0.01)),
            ("first_k_dense_replace", json!(4)),
            ("hidden_size", json!(-1)),
        ] {
            let mut v = published();
            v[field] = value;
            let err = parse(&v).unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }
}
