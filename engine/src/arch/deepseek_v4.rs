//! DeepSeek-V4 (`deepseek_v4`, HF `transformers/models/deepseek_v4/modeling_deepseek_v4.py`,
//! V4-Flash / V4-Pro): the shared decoder ([`super::decoder`]) with
//! - per layer one of three attention kinds ([`AttentionKind`], `layers::compressed`): the
//!   sliding window alone, compressed sparse attention (overlapping windows of `ratio` and the
//!   lightning indexer's top-k), heavily compressed attention (disjoint windows, all entries);
//!   shared-KV MQA with the grouped low-rank output projection and per-head sinks;
//! - mHC hyper-connections as the residual ([`Residual::Hyper`]);
//! - a routed MoE on every layer: the first layers hash-routed by a token-id table, the rest
//!   `sqrtsoftplus` scores with the correction bias; clamped SiLU experts and a shared expert.
//!
//! The kinds come from `layer_types` (HF) with `compress_rates`, or from DeepSeek's per-layer
//! `compress_ratios` (0: sliding; the sparse ratio `compress_rate_csa`, 4 unless given;
//! any other ratio: heavily compressed at that ratio), honoured for any ratio. Sliding layers
//! rotate with `rope_theta`; compressed layers, their compressors and indexer with
//! `compress_rope_theta` and the YaRN scaling, its attention factor forced to 1 as HF and
//! DeepSeek's reference do. Weights load under DeepSeek's published names (`model::Naming`):
//! FP4 experts (E2M1 with a UE8M0 scale per 32), block FP8 with UE8M0 `scale`, BF16, F32. The
//! multi-token-prediction block (`mtp.0.*`) is read only as a drafter (`arch/decoder/mtp.rs`).

use serde_json::{Map, Value};

use super::decoder::{
    DecoderFamily, DecoderPlan, ExpertForm, MixerKind, MoeNames, MoePlan, Residual, V4Plan,
};
use super::layers::compressed::{AttentionKind, CompressedDims, V4IndexerDims};
use super::layers::mlp::Activation;
use super::layers::moe::{Combine, RouterConfig, Scoring};
use crate::config::{FamilyInput, Fields, Nesting, RopeConfig, RopeScaling, TextConfig};
use crate::error::Result;
use crate::model::NormWeight;

/// Validated DeepSeek-V4 hyperparameters.
#[derive(Debug, Clone)]
pub struct DeepseekV4Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub attention: CompressedDims,
    pub indexer: V4IndexerDims,
    /// Per layer.
    pub kinds: Vec<AttentionKind>,
    /// Per layer: its MoE is hash-routed.
    pub hash_layers: Vec<bool>,
    /// The MTP block's attention kind (`compress_ratios[num_hidden_layers]`, else sliding).
    pub mtp_kind: AttentionKind,
    pub rope: RopeConfig,
    pub compress_rope: RopeConfig,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub n_shared_experts: usize,
    pub scoring: Scoring,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
    pub swiglu_limit: f32,
}

/// HF `DeepseekV4Config`'s defaults (V4-Flash).
fn or<T>(v: Option<T>, default: T) -> T {
    v.unwrap_or(default)
}

impl TextConfig for DeepseekV4Config {
    const MODEL_TYPES: &'static [&'static str] = &["deepseek_v4"];
    const NESTING: Nesting = Nesting::Flat;

    fn parse(i: FamilyInput<'_>) -> Result<Self> {
        let f = i.text;
        let layers = or(f.opt_usize("num_hidden_layers")?, 43);
        let head_dim = or(f.opt_usize("head_dim")?, 512);
        let heads = or(f.opt_usize("num_attention_heads")?, 64);
        let rope = match f.opt_usize("qk_rope_head_dim")? {
            Some(r) => r,
            None => (head_dim as f64 * or(f.opt_f64("partial_rotary_factor")?, 64.0 / 512.0)) as usize,
        };
        let attention = CompressedDims {
            heads,
            head_dim,
            rope,
            q_lora: or(f.opt_usize("q_lora_rank")?, 1024),
            o_groups: or(f.opt_usize("o_groups")?, 8),
            o_rank: or(f.opt_usize("o_lora_rank")?, 1024),
            window: or(f.opt_usize("sliding_window")?, 128),
        };
        let indexer = V4IndexerDims {
            heads: or(f.opt_usize("index_n_heads")?, 64),
            head_dim: or(f.opt_usize("index_head_dim")?, 128),
            top_k: or(f.opt_usize("index_topk")?, 512),
        };
        let c = DeepseekV4Config {
            vocab_size: or(f.opt_usize("vocab_size")?, 129_280),
            hidden_size: or(f.opt_usize("hidden_size")?, 4096),
            num_hidden_layers: layers,
            max_position_embeddings: or(f.opt_usize("max_position_embeddings")?, 1_048_576),
            rms_norm_eps: or(f.opt_f64("rms_norm_eps")?, 1e-6) as f32,
            tie_word_embeddings: or(f.opt_bool("tie_word_embeddings")?, false),
            bos_token_id: f.opt_usize("bos_token_id")?.map(|b| b as u32),
            eos_token_ids: f.opt_token_ids("eos_token_id")?,
            attention,
            indexer,
            kinds: kinds(f, layers)?,
            mtp_kind: mtp_kind(f, layers)?,
            hash_layers: hash_layers(f, layers)?,
            rope: RopeConfig {
                theta: main_theta(f)?,
                scaling: RopeScaling::Default,
            },
            compress_rope: compress_rope(f)?,
            hc_mult: or(f.opt_usize("hc_mult")?, 4),
            hc_sinkhorn_iters: or(f.opt_usize("hc_sinkhorn_iters")?, 20),
            hc_eps: or(f.opt_f64("hc_eps")?, 1e-6) as f32,
            n_routed_experts: or(f.opt_usize("n_routed_experts")?, 256),
            num_experts_per_tok: or(f.opt_usize("num_experts_per_tok")?, 6),
            moe_intermediate_size: or(f.opt_usize("moe_intermediate_size")?, 2048),
            n_shared_experts: or(f.opt_usize("n_shared_experts")?, 1),
            scoring: match f.opt_str("scoring_func")?.unwrap_or("sqrtsoftplus") {
                "sqrtsoftplus" => Scoring::SqrtSoftplus,
                "sigmoid" => Scoring::Sigmoid,
                "softmax" => Scoring::Softmax,
                other => return Err(f.err("scoring_func", format!("unsupported `{other}`"))),
            },
            norm_topk_prob: or(f.opt_bool("norm_topk_prob")?, true),
            routed_scaling_factor: or(f.opt_f64("routed_scaling_factor")?, 1.5) as f32,
            swiglu_limit: or(f.opt_f64("swiglu_limit")?, 10.0) as f32,
        };
        c.validate(f)?;
        Ok(c)
    }
}

impl DeepseekV4Config {
    fn validate(&self, f: Fields<'_>) -> Result<()> {
        let a = self.attention;
        f.positive(&[
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", a.heads),
            ("head_dim", a.head_dim),
            ("q_lora_rank", a.q_lora),
            ("o_groups", a.o_groups),
            ("o_lora_rank", a.o_rank),
            ("sliding_window", a.window),
            ("index_n_heads", self.indexer.heads),
            ("index_head_dim", self.indexer.head_dim),
            ("index_topk", self.indexer.top_k),
            ("hc_mult", self.hc_mult),
            ("hc_sinkhorn_iters", self.hc_sinkhorn_iters),
            ("n_routed_experts", self.n_routed_experts),
            ("moe_intermediate_size", self.moe_intermediate_size),
        ])?;
        f.top_k_within(self.num_experts_per_tok, self.n_routed_experts)?;
        if f.opt_usize("num_key_value_heads")?.is_some_and(|k| k != 1) {
            return Err(f.err(
                "num_key_value_heads",
                "DeepSeek-V4 attention has one shared K=V head",
            ));
        }
        if !a.heads.is_multiple_of(a.o_groups) {
            return Err(f.err(
                "o_groups",
                format!("must divide num_attention_heads ({})", a.heads),
            ));
        }
        if a.rope == 0 || !a.rope.is_multiple_of(2) || a.rope > a.head_dim.min(self.indexer.head_dim) {
            return Err(f.err(
                "qk_rope_head_dim",
                format!("{}: must be even and fit head_dim and index_head_dim", a.rope),
            ));
        }
        Ok(())
    }
}

/// Per-layer attention kinds: `layer_types` with `compress_rates`, else DeepSeek's
/// `compress_ratios`, else HF's default (two heavily compressed layers, then alternating).
fn kinds(f: Fields<'_>, layers: usize) -> Result<Vec<AttentionKind>> {
    let rates = f.get("compress_rates").and_then(Value::as_object);
    let rate = |key: &str, legacy: &str, default: usize| -> Result<usize> {
        let nested = rates
            .and_then(|r| r.get(key))
            .and_then(Value::as_u64)
            .map(|r| r as usize);
        Ok(f.opt_usize(legacy)?.or(nested).unwrap_or(default))
    };
    let (csa, hca) = (
        rate("compressed_sparse_attention", "compress_rate_csa", 4)?,
        rate("heavily_compressed_attention", "compress_rate_hca", 128)?,
    );
    f.positive(&[("compress_rate_csa", csa), ("compress_rate_hca", hca)])?;
    let list = |field: &str| -> Result<Option<Vec<Value>>> {
        match f.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(v)) if v.len() >= layers => Ok(Some(v[..layers].to_vec())),
            Some(v) => Err(f.err(
                field,
                format!("expected a list of at least {layers} entries, found {v}"),
            )),
        }
    };
    if let Some(types) = list("layer_types")? {
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(AttentionKind::Sliding),
                Some("compressed_sparse_attention") => Ok(AttentionKind::Sparse { ratio: csa }),
                Some("heavily_compressed_attention") => Ok(AttentionKind::Heavy { ratio: hca }),
                _ => Err(f.err("layer_types", format!("unknown attention kind {t}"))),
            })
            .collect();
    }
    if let Some(ratios) = list("compress_ratios")? {
        return ratios
            .iter()
            .map(|r| match r.as_u64().map(|r| r as usize) {
                Some(0) => Ok(AttentionKind::Sliding),
                Some(r) if r == csa => Ok(AttentionKind::Sparse { ratio: r }),
                Some(r) => Ok(AttentionKind::Heavy { ratio: r }),
                None => Err(f.err("compress_ratios", format!("{r} is not a ratio"))),
            })
            .collect();
    }
    Ok((0..layers)
        .map(|l| match l {
            l if l < 2 || l % 2 == 0 => AttentionKind::Heavy { ratio: hca },
            _ => AttentionKind::Sparse { ratio: csa },
        })
        .collect())
}

/// The MTP block's kind: DeepSeek's `compress_ratios` holds it after the last layer (0 on
/// V4-Flash: the sliding window).
fn mtp_kind(f: Fields<'_>, layers: usize) -> Result<AttentionKind> {
    let csa = f.opt_usize("compress_rate_csa")?.unwrap_or(4);
    let ratio = f
        .get("compress_ratios")
        .and_then(Value::as_array)
        .and_then(|r| r.get(layers))
        .and_then(Value::as_u64)
        .map_or(0, |r| r as usize);
    Ok(match ratio {
        0 => AttentionKind::Sliding,
        r if r == csa => AttentionKind::Sparse { ratio: r },
        r => AttentionKind::Heavy { ratio: r },
    })
}

/// Per layer: hash-routed, from `mlp_layer_types` (`hash_moe` / `moe`) or the first
/// `num_hash_layers` (3 unless given).
fn hash_layers(f: Fields<'_>, layers: usize) -> Result<Vec<bool>> {
    match f.get("mlp_layer_types") {
        Some(Value::Array(types)) if types.len() >= layers => types[..layers]
            .iter()
            .map(|t| match t.as_str() {
                Some("hash_moe") => Ok(true),
                Some("moe") => Ok(false),
                _ => Err(f.err("mlp_layer_types", format!("{t} is neither `hash_moe` nor `moe`"))),
            })
            .collect(),
        Some(Value::Null) | None => {
            let n = or(f.opt_usize("num_hash_layers")?, 3);
            Ok((0..layers).map(|l| l < n).collect())
        }
        Some(v) => Err(f.err("mlp_layer_types", format!("expected {layers} entries, found {v}"))),
    }
}

/// The sliding layers' RoPE base: `rope_parameters.main.rope_theta` (HF), else `rope_theta`.
fn main_theta(f: Fields<'_>) -> Result<f64> {
    let nested = f
        .get("rope_parameters")
        .and_then(Value::as_object)
        .and_then(|p| p.get("main"))
        .and_then(|m| m.get("rope_theta"))
        .and_then(Value::as_f64);
    Ok(nested.unwrap_or(or(f.opt_f64("rope_theta")?, 10_000.0)))
}

/// The compressed layers' RoPE: `rope_parameters.compress` (HF), else the scaling in
/// `rope_parameters` / `rope_scaling` with `compress_rope_theta`; YaRN's attention factor 1.
fn compress_rope(f: Fields<'_>) -> Result<RopeConfig> {
    let theta = or(f.opt_f64("compress_rope_theta")?, 160_000.0);
    let nested = f
        .get("rope_parameters")
        .and_then(Value::as_object)
        .and_then(|p| p.get("compress"));
    let scaling = nested.or(f.get("rope_parameters")).or(f.get("rope_scaling"));
    let mut map = Map::new();
    map.insert("rope_theta".into(), theta.into());
    if let Some(Value::Object(s)) = scaling {
        let mut s = s.clone();
        match nested {
            Some(_) => {
                s.entry("rope_theta").or_insert(theta.into());
            }
            None => {
                s.insert("rope_theta".into(), theta.into());
            }
        }
        map.insert("rope_parameters".into(), Value::Object(s));
    }
    let max = or(f.opt_usize("max_position_embeddings")?, 1_048_576);
    let sub = Fields {
        map: &map,
        path: f.path,
        scope: f.scope,
    };
    let mut rope = RopeConfig::parse(sub, max)?;
    if let RopeScaling::Yarn { attention_factor, .. } = &mut rope.scaling {
        *attention_factor = Some(1.0);
    }
    Ok(rope)
}

impl DecoderFamily for DeepseekV4Config {
    fn plan(&self) -> DecoderPlan {
        let layers = self.num_hidden_layers;
        DecoderPlan {
            arch: "deepseek_v4",
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            dense_width: self.moe_intermediate_size,
            num_layers: layers,
            max_context: self.max_position_embeddings,
            rms_norm_eps: self.rms_norm_eps,
            tie_word_embeddings: self.tie_word_embeddings,
            bos_token_id: self.bos_token_id,
            eos_token_ids: self.eos_token_ids.clone(),
            gqa: None,
            rope: self.rope.clone(),
            windows: Vec::new(),
            norm_weight: NormWeight::Plain,
            mixers: self.kinds.iter().map(|&k| MixerKind::Compressed(k)).collect(),
            linear: None,
            mla: None,
            v4: Some(V4Plan {
                dims: self.attention,
                indexer: self.indexer,
                compress_rope: self.compress_rope.clone(),
                hash_layers: self.hash_layers.clone(),
                mtp_kind: self.mtp_kind,
            }),
            kda: None,
            residual: Residual::Hyper {
                streams: self.hc_mult,
                iters: self.hc_sinkhorn_iters,
                eps: self.hc_eps,
            },
            moe_layers: vec![true; layers],
            moe: MoePlan {
                experts: self.n_routed_experts,
                width: self.moe_intermediate_size,
                shared_width: self.moe_intermediate_size * self.n_shared_experts,
                shared_module: "shared_experts",
                shared_gate: false,
                router: RouterConfig {
                    scoring: self.scoring,
                    top_k: self.num_experts_per_tok,
                    n_group: 1,
                    topk_group: 1,
                    norm_topk_prob: self.norm_topk_prob,
                    scaling: self.routed_scaling_factor,
                },
                correction_bias: true,
                router_bias: false,
                act: Activation::ClampedSilu {
                    limit: self.swiglu_limit,
                },
                latent: None,
                combine: Combine::Ascending,
                form: ExpertForm::Hf(MoeNames::HF),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Spec;

    fn parse(c: serde_json::Value) -> Result<DeepseekV4Config> {
        Ok(Spec::<DeepseekV4Config>::from_value_typed(&c, std::path::Path::new("config.json"))?.arch)
    }

    /// DeepSeek's own spelling (as V4-Flash's config.json and the reference `inference/` code
    /// have it): per-layer `compress_ratios` with the MTP layer's entry after the last layer,
    /// `num_hash_layers`, `qk_rope_head_dim`, a YaRN `rope_scaling` and `compress_rope_theta`.
    #[test]
    fn deepseek_spelling_parses_with_any_ratio() {
        let c = parse(serde_json::json!({
            "model_type": "deepseek_v4", "num_hidden_layers": 5, "hidden_size": 64,
            "num_attention_heads": 4, "head_dim": 32, "qk_rope_head_dim": 8, "o_groups": 2,
            "compress_ratios": [0, 4, 128, 16, 4, 0], "num_hash_layers": 2,
            "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                             "beta_fast": 32, "beta_slow": 1},
            "eos_token_id": 1, "bos_token_id": 0,
        }))
        .unwrap();
        use AttentionKind::*;
        assert_eq!(
            c.kinds,
            vec![
                Sliding,
                Sparse { ratio: 4 },
                Heavy { ratio: 128 },
                Heavy { ratio: 16 },
                Sparse { ratio: 4 }
            ]
        );
        assert_eq!(c.hash_layers, vec![true, true, false, false, false]);
        assert_eq!(c.mtp_kind, Sliding, "the entry after the last layer");
        assert_eq!(c.attention.rope, 8);
        assert_eq!(c.rope.theta, 10000.0);
        assert_eq!(c.compress_rope.theta, 160000.0);
        let RopeScaling::Yarn {
            factor,
            attention_factor,
            original_max_position_embeddings,
            ..
        } = c.compress_rope.scaling
        else {
            panic!("compressed layers use YaRN")
        };
        assert_eq!(
            (factor, attention_factor, original_max_position_embeddings),
            (16.0, Some(1.0), 65536)
        );
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let base = serde_json::json!({
            "model_type": "deepseek_v4", "num_hidden_layers": 2, "num_attention_heads": 4,
            "head_dim": 32, "qk_rope_head_dim": 8, "o_groups": 2, "hidden_size": 64,
        });
        for (extra, field) in [
            (serde_json::json!({"o_groups": 3}), "o_groups"),
            (serde_json::json!({"qk_rope_head_dim": 7}), "qk_rope_head_dim"),
            (
                serde_json::json!({"layer_types": ["sliding_attention"]}),
                "layer_types",
            ),
            (
                serde_json::json!({"layer_types": ["sliding_attention", "full"]}),
                "layer_types",
            ),
            (
                serde_json::json!({"mlp_layer_types": ["hash_moe", "dense"]}),
                "mlp_layer_types",
            ),
            (
                serde_json::json!({"num_key_value_heads": 4}),
                "num_key_value_heads",
            ),
            (serde_json::json!({"scoring_func": "tanh"}), "scoring_func"),
        ] {
            let mut c = base.clone();
            for (k, v) in extra.as_object().unwrap() {
                c[k] = v.clone();
            }
            let e = parse(c).unwrap_err().to_string();
            assert!(e.contains(field), "{extra}: {e}");
        }
    }
}
