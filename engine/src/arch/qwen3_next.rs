//! Qwen3-Next and Qwen3.5/3.6-MoE (HF `transformers/models/qwen3_next/modeling_qwen3_next.py`,
//! `qwen3_5_moe/modeling_qwen3_5_moe.py`): the shared decoder ([`super::decoder`]) with
//! `layer_types` choosing each layer's sequence mixer — gated DeltaNet linear attention
//! ([`super::layers::gated_deltanet`]) or gated full attention (`q_proj` yields each head's query
//! and a sigmoid output gate; per-head q/k RMSNorm; `rotate_half` RoPE on the first
//! `partial_rotary_factor` of each head) — and on every layer a softmax top-k MoE plus one shared
//! expert scaled by `σ(shared_expert_gate · x)`. Every RMSNorm of the decoder is zero-centred
//! (it multiplies by `1 + w`); the DeltaNet's gated output norm is not.
//!
//! The two releases differ in what this file reads from their `model_type`:
//! * `qwen3_next` (Qwen3-Next-80B-A3B): fused `in_proj_qkvz` / `in_proj_ba` projections, dense
//!   MLPs on `mlp_only_layers` and off `decoder_sparse_step`, `norm_topk_prob` as written;
//! * `qwen3_5_moe_text`, flat or as the `text_config` of the `qwen3_5_moe` vision-language
//!   wrapper (tensors `model.language_model.…`, `lm_head.weight`): four separate DeltaNet
//!   projections, every layer MoE, the top-k always renormalised (HF's router ignores the keys).
//!
//! Experts are read per expert or in HF's fused layout, whichever the checkpoint holds, in BF16
//! or block FP8. The vision tower (`model.visual.…`) and the multi-token-prediction layers
//! (`mtp.…`) are not read: they are not part of the text decoder (the MTP layers are a drafter).
//!
//! The config's semantic keys must hold what this file implements, or the load is refused
//! naming the key: every `layer_types` entry `linear_attention` or `full_attention` (one per
//! layer), `hidden_act` silu, `linear_key_head_dim` equal to `linear_value_head_dim`, value
//! heads a multiple of key heads.

use serde::Deserialize;

use super::decoder::{
    DecoderFamily, DecoderPlan, ExpertForm, GqaPlan, MixerKind, MoeNames, MoePlan, Residual,
};
use super::layers::gated_deltanet::GdnDims;
use super::layers::gqa::{GqaDims, GqaOptions, QkNorm};
use super::layers::mlp::Activation;
use super::layers::moe::{Combine, RouterConfig, Scoring};
use crate::config::{FamilyInput, Fields, NestedNames, Nesting, RopeConfig, TextConfig, TokenIds};
use crate::error::Result;
use crate::model::NormWeight;

fn default_eps() -> f32 {
    1e-6
}

fn default_silu() -> String {
    "silu".into()
}

fn default_true() -> bool {
    true
}

fn default_one() -> usize {
    1
}

fn default_interval() -> usize {
    4
}

/// Which release a config is, from its `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// `qwen3_next`.
    Next,
    /// `qwen3_5_moe_text` (Qwen3.5, Qwen3.6).
    Qwen35,
}

/// Validated Qwen3-Next / Qwen3.5-MoE hyperparameters.
#[derive(Debug, Clone, Deserialize)]
pub struct Qwen3NextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the dense MLPs (Qwen3-Next's `mlp_only_layers`; Qwen3.5 has none).
    #[serde(default)]
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    #[serde(default = "default_true")]
    norm_topk_prob: bool,
    #[serde(default = "default_one")]
    decoder_sparse_step: usize,
    #[serde(default)]
    mlp_only_layers: Option<Vec<usize>>,
    /// `linear_attention` / `full_attention` per layer; absent: HF's pattern from
    /// `full_attention_interval`.
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default = "default_interval")]
    full_attention_interval: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default = "default_silu")]
    hidden_act: String,
    #[serde(default)]
    pub bos_token_id: TokenIds,
    #[serde(default)]
    pub eos_token_id: TokenIds,
    #[serde(skip)]
    pub rope: RopeConfig,
    #[serde(skip)]
    partial_rotary_factor: f64,
    #[serde(skip, default = "default_release")]
    pub release: Release,
    /// Each layer's mixer, from `layer_types`.
    #[serde(skip)]
    pub mixers: Vec<MixerKind>,
}

fn default_release() -> Release {
    Release::Next
}

impl TextConfig for Qwen3NextConfig {
    const MODEL_TYPES: &'static [&'static str] = &["qwen3_next", "qwen3_5_moe_text"];
    const NESTING: Nesting = Nesting::FlatOrNestedIn(&["qwen3_5_moe"]);
    const NESTED_NAMES: NestedNames = NestedNames::ModelInfix("language_model.");

    fn parse(i: FamilyInput<'_>) -> Result<Self> {
        let f = i.text;
        let mut c: Qwen3NextConfig = f.deserialize()?;
        c.rope = RopeConfig::parse(f, c.max_position_embeddings)?;
        c.partial_rotary_factor = RopeConfig::partial_rotary_factor(f, 0.25)?;
        c.release = match f.opt_str("model_type")?.or(i.top.opt_str("model_type")?) {
            Some("qwen3_next") => Release::Next,
            _ => Release::Qwen35,
        };
        c.mixers = c.parse_mixers(f)?;
        c.validate(f)?;
        Ok(c)
    }
}

impl Qwen3NextConfig {
    /// `layer_types` (or HF's default pattern: every `full_attention_interval`-th layer full).
    fn parse_mixers(&self, f: Fields<'_>) -> Result<Vec<MixerKind>> {
        let Some(types) = &self.layer_types else {
            let every = self.full_attention_interval.max(1);
            return Ok((0..self.num_hidden_layers)
                .map(|i| match (i + 1).is_multiple_of(every) {
                    true => MixerKind::Attention,
                    false => MixerKind::DeltaNet,
                })
                .collect());
        };
        if types.len() != self.num_hidden_layers {
            return Err(f.err(
                "layer_types",
                format!("{} entries for {} layers", types.len(), self.num_hidden_layers),
            ));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                "linear_attention" => Ok(MixerKind::DeltaNet),
                "full_attention" => Ok(MixerKind::Attention),
                other => Err(f.err(
                    "layer_types",
                    format!("`{other}` is not supported (supported: linear_attention, full_attention)"),
                )),
            })
            .collect()
    }

    fn validate(&self, f: Fields<'_>) -> Result<()> {
        f.positive(&[
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("num_experts", self.num_experts),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("decoder_sparse_step", self.decoder_sparse_step),
        ])?;
        f.kv_heads_divide(self.num_attention_heads, self.num_key_value_heads)?;
        f.top_k_within(self.num_experts_per_tok, self.num_experts)?;
        let rotary = self.rotary_dim();
        if rotary == 0 || !rotary.is_multiple_of(2) || rotary > self.head_dim {
            return Err(f.err(
                "partial_rotary_factor",
                format!(
                    "rotates {rotary} of {} values per head: must be even and in 2..=head_dim",
                    self.head_dim
                ),
            ));
        }
        if self.hidden_act != "silu" {
            return Err(f.err(
                "hidden_act",
                format!("`{}` is not supported (supported: silu)", self.hidden_act),
            ));
        }
        if self.linear_value_head_dim != self.linear_key_head_dim {
            return Err(f.err(
                "linear_value_head_dim",
                format!(
                    "{} differs from linear_key_head_dim {}: not supported",
                    self.linear_value_head_dim, self.linear_key_head_dim
                ),
            ));
        }
        if !self
            .linear_num_value_heads
            .is_multiple_of(self.linear_num_key_heads)
        {
            return Err(f.err(
                "linear_num_value_heads",
                format!(
                    "must be a multiple of linear_num_key_heads {}",
                    self.linear_num_key_heads
                ),
            ));
        }
        let dense = (0..self.num_hidden_layers).any(|i| !self.is_moe_layer(i));
        if dense && self.intermediate_size == 0 {
            return Err(f.err("intermediate_size", "must be positive: some layers are dense"));
        }
        Ok(())
    }

    fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor) as usize
    }

    /// Whether layer `i`'s FFN is the MoE (HF `Qwen3NextDecoderLayer`; Qwen3.5: every layer).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        match self.release {
            Release::Qwen35 => true,
            Release::Next => {
                let mlp_only = self.mlp_only_layers.as_deref().unwrap_or(&[]).contains(&i);
                !mlp_only && (i + 1).is_multiple_of(self.decoder_sparse_step)
            }
        }
    }
}

/// The decoder plan of a Qwen3-Next / Qwen3.5-MoE config.
fn plan(c: &Qwen3NextConfig) -> DecoderPlan {
    let layers = c.num_hidden_layers;
    DecoderPlan {
        arch: match c.release {
            Release::Next => "qwen3_next",
            Release::Qwen35 => "qwen3_5_moe",
        },
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
                rotary_dim: c.rotary_dim(),
            },
            options: GqaOptions {
                qkv_bias: c.attention_bias,
                o_bias: c.attention_bias,
                qk_norm: QkNorm::PerHead,
                eps: c.rms_norm_eps,
                norm_weight: NormWeight::Centred,
                sinks: false,
                window: None,
                output_gate: true,
            },
        }),
        rope: c.rope.clone(),
        windows: Vec::new(),
        norm_weight: NormWeight::Centred,
        mixers: c.mixers.clone(),
        linear: Some(GdnDims {
            key_heads: c.linear_num_key_heads,
            value_heads: c.linear_num_value_heads,
            head_dim: c.linear_key_head_dim,
            kernel: c.linear_conv_kernel_dim,
            fused: c.release == Release::Next,
        }),
        mla: None,
        v4: None,
        kda: None,
        residual: Residual::Plain,
        moe_layers: (0..layers).map(|i| c.is_moe_layer(i)).collect(),
        moe: MoePlan {
            experts: c.num_experts,
            width: c.moe_intermediate_size,
            shared_width: c.shared_expert_intermediate_size,
            shared_module: "shared_expert",
            shared_gate: true,
            router: RouterConfig {
                scoring: Scoring::Softmax,
                top_k: c.num_experts_per_tok,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: c.norm_topk_prob || c.release == Release::Qwen35,
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

impl DecoderFamily for Qwen3NextConfig {
    fn plan(&self) -> DecoderPlan {
        plan(self)
    }
}
