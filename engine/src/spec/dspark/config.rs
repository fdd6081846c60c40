//! The draft head's `config.json` (`architectures: ["K3DSparkModel"]`): shapes, the target
//! layers whose hidden rows feed it, the mask token and block size, the Markov rank and YaRN
//! RoPE. Every field is validated; a field this implementation does not understand is an error
//! (a new draft format must not be run as if it were this one).

use std::path::Path;

use serde_json::Value;

use crate::config::{Fields, RopeConfig};
use crate::error::{Error, Result};

/// Fields accepted without effect (metadata written by training and export tools).
const METADATA: &[&str] = &[
    "architectures",
    "model_type",
    "_torchspec_version",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "initializer_range",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "target_model_revision",
    "attention_dropout",
];

/// Fields this implementation reads.
const KNOWN: &[&str] = &[
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rope_interleave",
    "max_position_embeddings",
    "vocab_size",
    "target_layer_ids",
    "target_hidden_size",
    "mask_token_id",
    "block_size",
    "markov_rank",
    "hidden_act",
    "tie_word_embeddings",
    "attention_bias",
];

/// A validated DSpark draft-head config.
#[derive(Debug, Clone)]
pub struct DSparkConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub heads: usize,
    /// `None`: a plain `q_proj`.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub eps: f32,
    pub rope_config: RopeConfig,
    pub rope_interleave: bool,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    /// Zero-based target layers whose output hidden rows are captured, in concatenation order.
    pub target_layer_ids: Vec<usize>,
    /// Width of each captured row.
    pub target_hidden_size: usize,
    pub mask_token_id: u32,
    /// Query rows per proposal: the anchor and `block_size - 1` mask tokens.
    pub block_size: usize,
    pub markov_rank: usize,
}

impl DSparkConfig {
    /// Read and validate `dir/config.json`.
    pub fn load(dir: &Path) -> Result<DSparkConfig> {
        let path = dir.join("config.json");
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
        Self::from_value(&value, &path)
    }

    /// Validate a parsed config.
    pub fn from_value(value: &Value, path: &Path) -> Result<DSparkConfig> {
        let map = value
            .as_object()
            .ok_or_else(|| Error::config(path, "<root>", "expected a JSON object"))?;
        let f = Fields { map, path, scope: "" };
        let archs = f.get("architectures").and_then(Value::as_array);
        if !archs.is_some_and(|a| a.iter().any(|v| v.as_str() == Some("K3DSparkModel"))) {
            return Err(f.err(
                "architectures",
                "expected [\"K3DSparkModel\"] (a DSpark draft head)",
            ));
        }
        if let Some(unknown) = map
            .keys()
            .find(|k| !KNOWN.contains(&k.as_str()) && !METADATA.contains(&k.as_str()))
        {
            return Err(f.err(
                unknown,
                "not understood by this implementation of the DSpark format",
            ));
        }
        if f.opt_str("hidden_act")?.is_some_and(|a| a != "silu") {
            return Err(f.err("hidden_act", "only silu is supported"));
        }
        if f.opt_bool("tie_word_embeddings")? == Some(true) {
            return Err(f.err(
                "tie_word_embeddings",
                "a DSpark head uses the target's output head; must be false",
            ));
        }
        if f.opt_bool("attention_bias")? == Some(true) {
            return Err(f.err(
                "attention_bias",
                "biased attention projections are not part of the format",
            ));
        }
        let max_position_embeddings = f.usize("max_position_embeddings")?;
        let hidden_size = positive(&f, "hidden_size")?;
        let target_layer_ids: Vec<usize> = match f.get("target_layer_ids") {
            Some(Value::Array(a)) if !a.is_empty() => a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| f.err("target_layer_ids", "expected layer indices"))
                })
                .collect::<Result<_>>()?,
            _ => {
                return Err(f.err(
                    "target_layer_ids",
                    "expected a non-empty list of target layer indices",
                ));
            }
        };
        let mask = f.usize("mask_token_id")?;
        let cfg = DSparkConfig {
            hidden_size,
            intermediate_size: positive(&f, "intermediate_size")?,
            num_layers: positive(&f, "num_hidden_layers")?,
            heads: positive(&f, "num_attention_heads")?,
            q_lora_rank: f.opt_usize("q_lora_rank")?,
            kv_lora_rank: positive(&f, "kv_lora_rank")?,
            nope: positive(&f, "qk_nope_head_dim")?,
            rope: positive(&f, "qk_rope_head_dim")?,
            v: positive(&f, "v_head_dim")?,
            eps: f.f64("rms_norm_eps")? as f32,
            rope_config: RopeConfig::parse(f, max_position_embeddings)?,
            rope_interleave: f.opt_bool("rope_interleave")?.unwrap_or(true),
            max_position_embeddings,
            vocab_size: positive(&f, "vocab_size")?,
            target_layer_ids,
            target_hidden_size: f.opt_usize("target_hidden_size")?.unwrap_or(hidden_size),
            mask_token_id: u32::try_from(mask).map_err(|_| f.err("mask_token_id", "out of range"))?,
            block_size: positive(&f, "block_size")?,
            markov_rank: positive(&f, "markov_rank")?,
        };
        if cfg.mask_token_id as usize >= cfg.vocab_size {
            return Err(f.err(
                "mask_token_id",
                format!(
                    "{} is outside the vocabulary ({})",
                    cfg.mask_token_id, cfg.vocab_size
                ),
            ));
        }
        if cfg.block_size < 2 {
            return Err(f.err("block_size", "must be at least 2 (the anchor and one mask row)"));
        }
        if !cfg.rope.is_multiple_of(2) {
            return Err(f.err("qk_rope_head_dim", "must be even"));
        }
        Ok(cfg)
    }

    /// Names of the target trace tensors to capture (`layers.{l}`).
    pub fn capture_names(&self) -> Vec<String> {
        self.target_layer_ids
            .iter()
            .map(|l| format!("layers.{l}"))
            .collect()
    }

    /// Query/key width per head.
    pub fn qk_head_dim(&self) -> usize {
        self.nope + self.rope
    }
}

fn positive(f: &Fields<'_>, field: &str) -> Result<usize> {
    match f.usize(field)? {
        0 => Err(f.err(field, "must be positive")),
        n => Ok(n),
    }
}
