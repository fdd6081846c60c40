//! The DeepSeek Sparse Attention families: GLM-5 / 5.1 / 5.2 (`glm_moe_dsa`, HF
//! `transformers/models/glm_moe_dsa/modular_glm_moe_dsa.py`) and DeepSeek-V3.2 (`deepseek_v32`,
//! `models/deepseek_v32/modeling_deepseek_v32.py`). Both are DeepSeek-V3's decoder
//! ([`super::deepseek_v3`]: MLA with Q-LoRA, dense MLPs on the first layers, sigmoid routing
//! with correction bias and group limit, shared experts) with a lightning indexer
//! ([`super::layers::dsa`]) of `index_n_heads` heads of `index_head_dim` values choosing the
//! `index_topk` positions each row attends to. The MLA always rotates interleaved pairs here (HF
//! ignores `rope_interleave` for both). They differ in two places ([`Flavor`]):
//! - the indexer's RoPE: interleaved pairs on GLM-5, halves (`rotate_half`) on V3.2;
//! - GLM-5's `indexer_types` says per layer whether it runs its own indexer (`"full"`) or
//!   reuses the previous full layer's choice (`"shared"`, GLM-5.2's IndexShare). Absent, HF
//!   derives it from `index_topk_pattern` (`"F"`/`"S"` per layer) or from `index_topk_freq` and
//!   `index_skip_topk_offset`; this file derives it the same way. V3.2 runs an indexer on every
//!   layer (HF reads no such key for it).
//!
//! `mlp_layer_types` (`"dense"` / `"sparse"` per layer) overrides `first_k_dense_replace` when
//! present. The multi-token-prediction layer published after the last decoder layer is not
//! read.

use serde::Deserialize;

use super::decoder::{DecoderFamily, DecoderPlan, DsaPlan};
use super::layers::dsa::IndexerDims;
use crate::config::{DeepseekV3Config, FamilyInput, Fields, Nesting, TextConfig};
use crate::error::Result;

fn index_topk() -> usize {
    2048
}

fn index_head_dim() -> usize {
    128
}

/// The DSA keys of `config.json` (HF `GlmMoeDsaConfig` defaults).
#[derive(Debug, Deserialize)]
struct RawDsa {
    #[serde(default = "index_topk")]
    index_topk: usize,
    #[serde(default = "index_head_dim")]
    index_head_dim: usize,
    #[serde(default)]
    index_n_heads: Option<usize>,
    #[serde(default)]
    indexer_types: Option<Vec<String>>,
    #[serde(default)]
    index_topk_pattern: Option<serde_json::Value>,
    #[serde(default)]
    index_topk_freq: Option<usize>,
    #[serde(default)]
    index_skip_topk_offset: Option<usize>,
    #[serde(default)]
    mlp_layer_types: Option<Vec<String>>,
}

/// Which of the two DSA families a config is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// GLM-5 (`glm_moe_dsa`): interleaved indexer RoPE, shared indexer layers, 32 index heads
    /// by default.
    Glm5,
    /// DeepSeek-V3.2 (`deepseek_v32`): `rotate_half` indexer RoPE, an indexer on every layer,
    /// 64 index heads by default.
    DeepseekV32,
}

/// Validated GLM-5 / DeepSeek-V3.2 hyperparameters: DeepSeek-V3's, plus the indexer.
#[derive(Debug, Clone)]
pub struct GlmMoeDsaConfig {
    pub flavor: Flavor,
    pub base: DeepseekV3Config,
    pub index: IndexerDims,
    /// Per layer: it shares the previous full layer's selection.
    pub shared: Vec<bool>,
    /// Per layer: its FFN is the routed MoE.
    pub moe_layers: Vec<bool>,
}

impl TextConfig for GlmMoeDsaConfig {
    const MODEL_TYPES: &'static [&'static str] = &["glm_moe_dsa", "deepseek_v32"];
    const NESTING: Nesting = Nesting::Flat;

    fn parse(i: FamilyInput<'_>) -> Result<Self> {
        let f = i.text;
        let flavor = match f.opt_str("model_type")? {
            Some("deepseek_v32") => Flavor::DeepseekV32,
            _ => Flavor::Glm5,
        };
        let mut base = DeepseekV3Config::parse(f)?;
        base.rope_interleave = true;
        let raw: RawDsa = f.deserialize()?;
        let layers = base.num_hidden_layers;
        let heads = raw.index_n_heads.unwrap_or(match flavor {
            Flavor::Glm5 => 32,
            Flavor::DeepseekV32 => 64,
        });
        f.positive(&[
            ("index_topk", raw.index_topk),
            ("index_head_dim", raw.index_head_dim),
            ("index_n_heads", heads),
        ])?;
        if raw.index_head_dim < base.qk_rope_head_dim {
            return Err(f.err(
                "index_head_dim",
                format!(
                    "must hold the rotated part (qk_rope_head_dim {})",
                    base.qk_rope_head_dim
                ),
            ));
        }
        if base.q_lora_rank.is_none() {
            return Err(f.err(
                "q_lora_rank",
                "the DSA indexer reads the query latent: it must be set",
            ));
        }
        let shared = match flavor {
            Flavor::Glm5 => indexer_types(f, &raw, layers)?,
            Flavor::DeepseekV32 => vec![false; layers],
        };
        let moe_layers = match &raw.mlp_layer_types {
            None => (0..layers).map(|l| base.is_moe_layer(l)).collect(),
            Some(kinds) => per_layer(f, "mlp_layer_types", kinds, layers, ("dense", "sparse"))?,
        };
        let index = IndexerDims {
            heads,
            head_dim: raw.index_head_dim,
            rope: base.qk_rope_head_dim,
            topk: raw.index_topk,
        };
        Ok(GlmMoeDsaConfig {
            flavor,
            base,
            index,
            shared,
            moe_layers,
        })
    }
}

/// Per layer: whether it shares the previous full layer's selection, from `indexer_types`, else
/// `index_topk_pattern`, else `index_topk_freq` / `index_skip_topk_offset` (HF's derivation).
fn indexer_types(f: Fields<'_>, raw: &RawDsa, layers: usize) -> Result<Vec<bool>> {
    let shared = match (&raw.indexer_types, &raw.index_topk_pattern) {
        (Some(kinds), _) => per_layer(f, "indexer_types", kinds, layers, ("full", "shared"))?,
        (None, Some(serde_json::Value::String(p))) => {
            let kinds: Vec<String> = p
                .chars()
                .map(|c| match c {
                    'F' => "full".to_string(),
                    'S' => "shared".to_string(),
                    other => other.to_string(),
                })
                .collect();
            per_layer(f, "index_topk_pattern", &kinds, layers, ("full", "shared"))?
        }
        (None, Some(list)) => {
            let kinds: Vec<String> = serde_json::from_value(list.clone()).map_err(|e| {
                f.err(
                    "index_topk_pattern",
                    format!("a string or a list of strings: {e}"),
                )
            })?;
            per_layer(f, "index_topk_pattern", &kinds, layers, ("full", "shared"))?
        }
        (None, None) => {
            let freq = raw.index_topk_freq.unwrap_or(1).max(1);
            let offset = raw.index_skip_topk_offset.unwrap_or(2);
            (0..layers)
                .map(|i| !(i + 1).saturating_sub(offset).is_multiple_of(freq))
                .collect()
        }
    };
    if shared.first() == Some(&true) {
        return Err(f.err(
            "indexer_types",
            "the first layer shares a selection no earlier layer made (it must be \"full\")",
        ));
    }
    Ok(shared)
}

/// A per-layer list of two kinds as `kind == second`, refusing a wrong length or another kind.
fn per_layer(
    f: Fields<'_>,
    field: &str,
    kinds: &[String],
    layers: usize,
    (a, b): (&str, &str),
) -> Result<Vec<bool>> {
    if kinds.len() != layers {
        return Err(f.err(field, format!("{} entries for {layers} layers", kinds.len())));
    }
    kinds
        .iter()
        .map(|k| match k.as_str() {
            k if k == a => Ok(false),
            k if k == b => Ok(true),
            other => Err(f.err(field, format!("`{other}` is neither `{a}` nor `{b}`"))),
        })
        .collect()
}

impl DecoderFamily for GlmMoeDsaConfig {
    fn plan(&self) -> DecoderPlan {
        let mut plan = super::deepseek_v3::plan(&self.base);
        plan.arch = match self.flavor {
            Flavor::Glm5 => "glm_moe_dsa",
            Flavor::DeepseekV32 => "deepseek_v32",
        };
        plan.moe_layers = self.moe_layers.clone();
        if let Some(mla) = plan.mla.as_mut() {
            mla.sparse = Some(DsaPlan {
                dims: self.index,
                interleave: self.flavor == Flavor::Glm5,
                shared: self.shared.clone(),
            });
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Spec;

    /// GLM-5's published config shape (tiny sizes), as `config.json` holds it.
    fn config(extra: serde_json::Value) -> serde_json::Value {
        let mut c = serde_json::json!({
            "model_type": "glm_moe_dsa", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 4,
            "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 24,
            "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1,
            "topk_group": 1, "first_k_dense_replace": 1, "max_position_embeddings": 512,
            "index_topk": 8, "index_head_dim": 8, "index_n_heads": 2, "rope_interleave": true,
            "scoring_func": "sigmoid", "topk_method": "noaux_tc",
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        });
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    }

    fn parse(extra: serde_json::Value) -> Result<GlmMoeDsaConfig> {
        let v = config(extra);
        let spec = Spec::<GlmMoeDsaConfig>::from_value_typed(&v, std::path::Path::new("config.json"))?;
        Ok(spec.arch)
    }

    #[test]
    fn published_shape_parses_with_every_layer_full() {
        let c = parse(serde_json::json!({})).unwrap();
        assert_eq!(c.shared, vec![false; 4]);
        assert_eq!(c.moe_layers, vec![false, true, true, true]);
        assert_eq!(
            c.index,
            IndexerDims {
                heads: 2,
                head_dim: 8,
                rope: 4,
                topk: 8
            }
        );
        let plan = c.plan();
        assert_eq!(plan.arch, "glm_moe_dsa");
        assert!(plan.mla.unwrap().interleave);
    }

    /// DeepSeek-V3.2: an indexer on every layer whatever `indexer_types` says (HF reads no such
    /// key for it), halves RoPE in the indexer, 64 index heads unless given.
    #[test]
    fn deepseek_v32_runs_an_indexer_everywhere() {
        let c = parse(serde_json::json!({
            "model_type": "deepseek_v32", "index_n_heads": null,
            "indexer_types": ["full", "shared", "shared", "shared"], "rope_interleave": false,
        }))
        .unwrap();
        assert_eq!(
            (c.flavor, c.shared.clone(), c.index.heads),
            (Flavor::DeepseekV32, vec![false; 4], 64)
        );
        let plan = c.plan();
        let mla = plan.mla.unwrap();
        assert_eq!(plan.arch, "deepseek_v32");
        assert!(mla.interleave && !mla.sparse.unwrap().interleave);
    }

    /// HF's derivations of `indexer_types`: a pattern, or a frequency after an offset.
    #[test]
    fn indexer_types_follow_hf() {
        let c = parse(serde_json::json!({"index_topk_pattern": "FFSF"})).unwrap();
        assert_eq!(c.shared, vec![false, false, true, false]);
        let c = parse(serde_json::json!({"index_topk_freq": 2, "index_skip_topk_offset": 2})).unwrap();
        // HF: "full" if max(i - offset + 1, 0) % freq == 0.
        assert_eq!(c.shared, vec![false, false, true, false]);
        let c = parse(serde_json::json!({"indexer_types": ["full", "shared", "shared", "full"]})).unwrap();
        assert_eq!(c.shared, vec![false, true, true, false]);
        let c =
            parse(serde_json::json!({"mlp_layer_types": ["dense", "dense", "sparse", "sparse"]})).unwrap();
        assert_eq!(c.moe_layers, vec![false, false, true, true]);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let cases = [
            (
                serde_json::json!({"indexer_types": ["shared", "full", "full", "full"]}),
                "indexer_types",
            ),
            (
                serde_json::json!({"indexer_types": ["full", "full"]}),
                "indexer_types",
            ),
            (
                serde_json::json!({"index_topk_pattern": "FFXF"}),
                "index_topk_pattern",
            ),
            (
                serde_json::json!({"mlp_layer_types": ["dense", "moe", "sparse", "sparse"]}),
                "mlp_layer_types",
            ),
            (serde_json::json!({"index_head_dim": 2}), "index_head_dim"),
            (serde_json::json!({"index_topk": 0}), "index_topk"),
            (serde_json::json!({"q_lora_rank": null}), "q_lora_rank"),
        ];
        for (extra, field) in cases {
            let e = parse(extra.clone()).unwrap_err().to_string();
            assert!(e.contains(field), "{extra}: {e}");
        }
    }
}
