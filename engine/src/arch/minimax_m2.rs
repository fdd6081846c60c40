//! MiniMax-M2 (HF `transformers/models/minimax_m2/modeling_minimax_m2.py`; MiniMax-M2, M2.1,
//! M2.5): the shared decoder ([`super::decoder`]) with RMSNorm of queries and keys over the
//! whole projection (`q_norm [heads * head_dim]`, `k_norm [kv_heads * head_dim]`), `rotate_half`
//! RoPE on the first `rotary_dim` of each head, no attention biases, and on every layer a
//! Mixtral-style MoE (`block_sparse_moe.experts.{e}.{w1,w3,w2}`, SwiGLU) with a sigmoid router
//! whose `e_score_correction_bias` only selects: top-k of `σ(logit) + bias`, weights `σ / Σσ`.
//! The published weights are block FP8 with the router, bias and `lm_head` unquantised; the
//! multi-token-prediction modules are not read (they are a drafter, not the target).
//!
//! The config's semantic keys must hold what this file implements, or the load is refused
//! naming the key: `scoring_func` sigmoid, `use_qk_norm` with `qk_norm_type` per_layer, every
//! `attn_type_list` entry 1 (full softmax attention; 0 is MiniMax-01's lightning attention),
//! `shared_intermediate_size` 0, no `sliding_window`, `hidden_act` silu.

use serde::Deserialize;

use super::decoder::{DecoderFamily, DecoderPlan, ExpertForm, GqaPlan, MoeNames, MoePlan, Residual};
use super::layers::gqa::{GqaDims, GqaOptions, QkNorm};
use super::layers::mlp::Activation;
use super::layers::moe::{Combine, RouterConfig, Scoring};
use crate::config::{FamilyInput, Fields, Nesting, RopeConfig, TextConfig, TokenIds};
use crate::error::Result;
use crate::model::NormWeight;

fn default_eps() -> f32 {
    1e-6
}

fn default_silu() -> String {
    "silu".into()
}

fn default_sigmoid() -> String {
    "sigmoid".into()
}

fn default_per_layer() -> String {
    "per_layer".into()
}

fn default_true() -> bool {
    true
}

/// Validated MiniMax-M2 hyperparameters.
#[derive(Debug, Clone, Deserialize)]
pub struct MiniMaxM2Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Each routed expert's width.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    #[serde(alias = "num_experts")]
    pub num_local_experts: usize,
    pub num_experts_per_tok: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub bos_token_id: TokenIds,
    #[serde(default)]
    pub eos_token_id: TokenIds,
    /// Leading values of each head that are rotated (published spelling; else
    /// `partial_rotary_factor`, else the whole head).
    #[serde(default)]
    rotary_dim: Option<usize>,
    #[serde(default = "default_silu")]
    hidden_act: String,
    #[serde(default = "default_sigmoid")]
    scoring_func: String,
    #[serde(default = "default_true")]
    use_routing_bias: bool,
    #[serde(default = "default_true")]
    use_qk_norm: bool,
    #[serde(default = "default_per_layer")]
    qk_norm_type: String,
    #[serde(default)]
    attn_type_list: Option<Vec<u8>>,
    #[serde(default)]
    shared_intermediate_size: usize,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(skip)]
    pub rope: RopeConfig,
}

impl TextConfig for MiniMaxM2Config {
    const MODEL_TYPES: &'static [&'static str] = &["minimax_m2"];
    const NESTING: Nesting = Nesting::Flat;

    fn parse(i: FamilyInput<'_>) -> Result<Self> {
        let f = i.text;
        let mut c: MiniMaxM2Config = f.deserialize()?;
        c.rope = RopeConfig::parse(f, c.max_position_embeddings)?;
        if c.rotary_dim.is_none() {
            let factor = RopeConfig::partial_rotary_factor(f, 1.0)?;
            c.rotary_dim = Some((c.head_dim as f64 * factor) as usize);
        }
        c.validate(f)?;
        Ok(c)
    }
}

impl MiniMaxM2Config {
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
        let rotary = self.rotary_dim();
        if rotary == 0 || !rotary.is_multiple_of(2) || rotary > self.head_dim {
            return Err(f.err("rotary_dim", format!("{rotary} must be even and in 2..=head_dim")));
        }
        f.top_k_within(self.num_experts_per_tok, self.num_local_experts)?;
        let unsupported = |key: &str, value: &dyn std::fmt::Debug, supported: &str| {
            Err(f.err(
                key,
                format!("{value:?} is not supported (supported: {supported})"),
            ))
        };
        if self.hidden_act != "silu" {
            return unsupported("hidden_act", &self.hidden_act, "silu");
        }
        if self.scoring_func != "sigmoid" {
            return unsupported("scoring_func", &self.scoring_func, "sigmoid");
        }
        if !self.use_qk_norm || self.qk_norm_type != "per_layer" {
            let key = if self.use_qk_norm {
                "qk_norm_type"
            } else {
                "use_qk_norm"
            };
            return unsupported(
                key,
                &(self.use_qk_norm, &self.qk_norm_type),
                "use_qk_norm true, per_layer",
            );
        }
        if let Some(types) = &self.attn_type_list
            && (types.len() != self.num_hidden_layers || types.iter().any(|&t| t != 1))
        {
            return unsupported("attn_type_list", types, "1 (full attention) on every layer");
        }
        if self.shared_intermediate_size != 0 {
            return unsupported("shared_intermediate_size", &self.shared_intermediate_size, "0");
        }
        if let Some(w) = self.sliding_window {
            return unsupported("sliding_window", &w, "none");
        }
        Ok(())
    }

    fn rotary_dim(&self) -> usize {
        self.rotary_dim.unwrap_or(self.head_dim)
    }
}

/// Where MiniMax-M2 keeps a MoE layer's tensors.
const NAMES: MoeNames = MoeNames {
    block: "block_sparse_moe",
    expert: ["w1", "w3", "w2"],
    router: "gate",
    correction_bias: "e_score_correction_bias",
};

/// The decoder plan of a MiniMax-M2 config.
fn plan(c: &MiniMaxM2Config) -> DecoderPlan {
    let layers = c.num_hidden_layers;
    DecoderPlan {
        arch: "minimax_m2",
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
                qkv_bias: false,
                o_bias: false,
                qk_norm: QkNorm::Whole,
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
        moe_layers: vec![true; layers],
        moe: MoePlan {
            experts: c.num_local_experts,
            width: c.intermediate_size,
            shared_width: 0,
            shared_module: "shared_experts",
            shared_gate: false,
            router: RouterConfig {
                scoring: Scoring::Sigmoid,
                top_k: c.num_experts_per_tok,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: true,
                scaling: 1.0,
            },
            correction_bias: c.use_routing_bias,
            router_bias: false,
            act: Activation::Silu,
            latent: None,
            combine: Combine::Ascending,
            form: ExpertForm::Hf(NAMES),
        },
    }
}

impl DecoderFamily for MiniMaxM2Config {
    fn plan(&self) -> DecoderPlan {
        plan(self)
    }
}
