//! Typed model configs parsed from a Hugging Face `config.json`.
//!
//! [`ModelSpec::load`] reads the file once, unwraps the nested `text_config` form of the newer
//! Kimi releases (whose tensors carry a `language_model.` prefix), dispatches on `model_type`
//! and validates every field the architecture depends on into a per-architecture struct. An
//! unknown `model_type` or an inconsistent field is a typed error naming the field.

mod deepseek_v3;
mod glm4_moe;
mod kimi_k3;
mod kimi_linear;
mod quant;
mod qwen3;
mod qwen3_moe;
mod rope;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

pub use deepseek_v3::DeepseekV3Config;
pub use glm4_moe::Glm4MoeConfig;
pub use kimi_k3::KimiK3Config;
pub use kimi_linear::{AttnKind, KdaConfig, KdaDecay, KimiLinearConfig};
pub use quant::{IgnoreRule, Quantization};
pub use qwen3::Qwen3Config;
pub use qwen3_moe::Qwen3MoeConfig;
pub use rope::{RopeConfig, RopeScaling};

use crate::error::{Error, Result};

/// The architectures this build implements.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ArchConfig {
    /// DeepSeek-V3 and the Kimi-K2 family (`deepseek_v3`, `kimi_k2`).
    DeepseekV3(DeepseekV3Config),
    /// Kimi-Linear (`kimi_linear`): KDA + NoPE MLA layers, MoE.
    KimiLinear(KimiLinearConfig),
    /// Kimi K3 (`kimi_k3` with a `kimi_linear` text config).
    KimiK3(KimiK3Config),
    /// Qwen3 dense (`qwen3`), used as a raw-completion drafter.
    Qwen3(Qwen3Config),
    /// Qwen3-MoE (`qwen3_moe`): GQA with q/k norm, softmax-routed experts.
    Qwen3Moe(Qwen3MoeConfig),
    /// GLM-4.5 / GLM-4.6 (`glm4_moe`): GQA with biases and partial rotary, sigmoid-routed experts.
    Glm4Moe(Glm4MoeConfig),
}

/// Everything `config.json` says about a checkpoint.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The validated architecture config.
    pub arch: ArchConfig,
    /// Prefix of every tensor name (`""`, or `"language_model."` for nested configs).
    pub tensor_prefix: String,
    /// How weights are quantised.
    pub quant: Quantization,
    /// The outer `model_type` as written in the file.
    pub model_type: String,
    /// Path of the parsed file (for error messages).
    pub path: PathBuf,
}

/// Model types accepted at the top level, listed in errors.
pub const SUPPORTED_MODEL_TYPES: &str = "deepseek_v3, kimi_k2, kimi_k25 (text_config deepseek_v3/kimi_k2), kimi_linear, kimi_k3 (text_config kimi_linear), qwen3, qwen3_moe, glm4_moe";

/// Field access with errors that name the field and the file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fields<'a> {
    pub map: &'a Map<String, Value>,
    pub path: &'a Path,
    /// Prefix for field names in messages (`"text_config."` for nested configs).
    pub scope: &'a str,
}

impl<'a> Fields<'a> {
    pub fn err(&self, field: &str, reason: impl Into<String>) -> Error {
        Error::config(self.path, format!("{}{field}", self.scope), reason)
    }

    /// The first of `fields` whose value is zero, as a "must be positive" error naming it.
    pub fn positive(&self, fields: &[(&str, usize)]) -> Result<()> {
        match fields.iter().find(|(_, v)| *v == 0) {
            Some((field, _)) => Err(self.err(field, "must be positive")),
            None => Ok(()),
        }
    }

    pub fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    pub fn usize(&self, field: &str) -> Result<usize> {
        self.opt_usize(field)?.ok_or_else(|| self.err(field, "missing"))
    }

    pub fn opt_usize(&self, field: &str) -> Result<Option<usize>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.err(field, format!("expected a non-negative integer, found {v}"))),
        }
    }

    pub fn f64(&self, field: &str) -> Result<f64> {
        self.opt_f64(field)?.ok_or_else(|| self.err(field, "missing"))
    }

    pub fn opt_f64(&self, field: &str) -> Result<Option<f64>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a number, found {v}"))),
        }
    }

    pub fn opt_bool(&self, field: &str) -> Result<Option<bool>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a boolean, found {v}"))),
        }
    }

    pub fn opt_str(&self, field: &str) -> Result<Option<&'a str>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, found {v}"))),
        }
    }

    /// The whole (text) config deserialised into `T` (a serde-derived config): an error names
    /// the field path and what was wrong with it.
    pub fn deserialize<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_path_to_error::deserialize(Value::Object(self.map.clone())).map_err(|e| {
            // serde reports a missing field at its parent (the root renders as `.`) and names
            // it only in the message: name the field itself, as the hand-written parsers do.
            let (path, message) = (e.path().to_string(), e.inner().to_string());
            let parent = if path == "." {
                String::new()
            } else {
                format!("{path}.")
            };
            match message
                .strip_prefix("missing field `")
                .and_then(|m| m.strip_suffix('`'))
            {
                Some(name) => self.err(&format!("{parent}{name}"), "missing"),
                None if path == "." => self.err("<root>", message),
                None => self.err(&path, message),
            }
        })
    }

    /// A token id that may be written as an integer or a list of integers (first wins).
    pub fn opt_token_ids(&self, field: &str) -> Result<Vec<u32>> {
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Number(n)) => Ok(vec![
                n.as_u64().ok_or_else(|| self.err(field, "expected a token id"))? as u32,
            ]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as u32)
                        .ok_or_else(|| self.err(field, "expected token ids"))
                })
                .collect(),
            Some(v) => Err(self.err(field, format!("expected a token id, found {v}"))),
        }
    }
}

/// A token id field written as one integer, a list of integers, or null (HF accepts all three
/// for `bos_token_id` / `eos_token_id`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    #[default]
    None,
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    /// Every id, in order.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::None => Vec::new(),
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }

    /// The first id (HF's `bos_token_id` when a list is given).
    pub fn first(&self) -> Option<u32> {
        self.to_vec().first().copied()
    }
}

impl ModelSpec {
    /// Read and validate `dir/config.json`.
    pub fn load(dir: &Path) -> Result<ModelSpec> {
        let path = dir.join("config.json");
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
        Self::from_value(&value, &path)
    }

    /// Validate an already-parsed `config.json` value.
    pub fn from_value(value: &Value, path: &Path) -> Result<ModelSpec> {
        let outer = value
            .as_object()
            .ok_or_else(|| Error::config(path, "<root>", "expected a JSON object"))?;
        let top = Fields {
            map: outer,
            path,
            scope: "",
        };
        let model_type = top
            .opt_str("model_type")?
            .ok_or_else(|| top.err("model_type", "missing"))?
            .to_string();
        let (text, scope, prefix) = match top.get("text_config") {
            Some(Value::Object(text)) => (text, "text_config.", "language_model."),
            Some(_) => return Err(top.err("text_config", "expected an object")),
            None => (outer, "", ""),
        };
        let fields = Fields {
            map: text,
            path,
            scope,
        };
        let inner_type = fields.opt_str("model_type")?.unwrap_or(&model_type).to_string();
        // Quantisation is declared in the text config by some releases and at the top by others.
        let quant = match fields
            .get("quantization_config")
            .or_else(|| top.get("quantization_config"))
        {
            Some(q) => Quantization::parse(q, path)?,
            None => Quantization::None,
        };
        let nested_ok = matches!(
            model_type.as_str(),
            "kimi_k25" | "kimi_k2_5" | "kimi_vl" | "deepseek_v3" | "kimi_k2"
        );
        let arch = match inner_type.as_str() {
            "deepseek_v3" | "kimi_k2" if nested_ok => {
                ArchConfig::DeepseekV3(DeepseekV3Config::parse(fields)?)
            }
            "kimi_linear" if model_type == "kimi_linear" && scope.is_empty() => ArchConfig::KimiLinear(
                KimiLinearConfig::parse(fields, kimi_linear::Dialect::Linear, &[])?,
            ),
            "kimi_linear" if model_type == "kimi_k3" && !scope.is_empty() => {
                ArchConfig::KimiK3(KimiK3Config::parse(top, fields)?)
            }
            "qwen3" if scope.is_empty() => ArchConfig::Qwen3(Qwen3Config::parse(fields)?),
            "qwen3_moe" if scope.is_empty() => ArchConfig::Qwen3Moe(Qwen3MoeConfig::parse(fields)?),
            "glm4_moe" if scope.is_empty() => ArchConfig::Glm4Moe(Glm4MoeConfig::parse(fields)?),
            _ => {
                return Err(Error::UnknownModelType {
                    path: path.to_path_buf(),
                    model_type: if scope.is_empty() {
                        model_type
                    } else {
                        format!("{model_type}/{inner_type}")
                    },
                    supported: SUPPORTED_MODEL_TYPES,
                });
            }
        };
        Ok(ModelSpec {
            arch,
            tensor_prefix: prefix.to_string(),
            quant,
            model_type,
            path: path.to_path_buf(),
        })
    }
}

#[cfg(test)]
mod tests;
