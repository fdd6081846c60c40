//! Typed model configs parsed from a Hugging Face `config.json`.
//!
//! [`Spec::load_with`] reads the file once, unwraps the nested `text_config` form (whose
//! tensors carry a `language_model.` prefix), finds the family row that takes its `model_type`
//! ([`family`]; the rows live in `arch::registry`) and lets it validate every field the
//! architecture depends on into its typed struct. An unknown `model_type` or an inconsistent
//! field is a typed error naming the field.

mod deepseek_v3;
mod family;
mod glm4_moe;
mod gpt_oss;
mod kimi_k3;
mod kimi_linear;
mod quant;
mod qwen3;
mod qwen3_moe;
mod rope;

use std::path::Path;

use serde_json::{Map, Value};

pub use deepseek_v3::DeepseekV3Config;
pub use family::{Checkpoint, Family, FamilyInput, NestedNames, Nesting, Spec, TextConfig, supported};
pub use glm4_moe::Glm4MoeConfig;
pub use gpt_oss::{GptOssConfig, GptOssLayer};
pub use kimi_k3::KimiK3Config;
pub use kimi_linear::{AttnKind, KdaConfig, KdaDecay, KimiLinearConfig};
pub use quant::{IgnoreRule, Quantization};
pub use qwen3::Qwen3Config;
pub use qwen3_moe::Qwen3MoeConfig;
pub use rope::{RopeConfig, RopeScaling};

use crate::error::{Error, Result};

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

    /// `num_key_value_heads` must divide `num_attention_heads` (grouped-query attention).
    pub fn kv_heads_divide(&self, heads: usize, kv_heads: usize) -> Result<()> {
        match kv_heads > 0 && heads.is_multiple_of(kv_heads) {
            true => Ok(()),
            false => Err(self.err(
                "num_key_value_heads",
                format!("must divide num_attention_heads ({heads})"),
            )),
        }
    }

    /// `num_experts_per_tok` must be in `1..=experts`.
    pub fn top_k_within(&self, top_k: usize, experts: usize) -> Result<()> {
        match (1..=experts).contains(&top_k) {
            true => Ok(()),
            false => Err(self.err("num_experts_per_tok", format!("must be in 1..={experts}"))),
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
        let (parsed, unknown) = self.deserialize_noting::<T>()?;
        if !unknown.is_empty() {
            tracing::debug!(path = %self.path.display(), scope = self.scope, keys = ?unknown, "config keys not read");
        }
        Ok(parsed)
    }

    /// [`Fields::deserialize`], and the keys of this object that neither `T` nor the shared
    /// bookkeeping reads.
    pub fn deserialize_noting<T: serde::de::DeserializeOwned>(&self) -> Result<(T, Vec<String>)> {
        let fields = std::cell::Cell::new(&[][..]);
        let recording = Recording {
            value: Value::Object(self.map.clone()),
            fields: &fields,
        };
        let parsed = serde_path_to_error::deserialize(recording).map_err(|e| {
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
        })?;
        let unknown = self.unknown_keys(&[fields.get(), BOOKKEEPING]);
        Ok((parsed, unknown.into_iter().map(String::from).collect()))
    }

    /// The keys of this object that no list names.
    pub fn unknown_keys(&self, lists: &[&[&str]]) -> Vec<&'a str> {
        let mut keys: Vec<&str> = self
            .map
            .keys()
            .map(String::as_str)
            .filter(|k| !lists.iter().any(|l| l.contains(k)))
            .collect();
        keys.sort();
        keys
    }

    /// List at debug level the keys of this object that no list names: they are not read
    /// (one policy for every family: unknown keys are ignored; the keys that change the
    /// computation are validated by each family's parser).
    pub fn note_unknown(&self, lists: &[&[&str]]) {
        let unknown = self.unknown_keys(lists);
        if !unknown.is_empty() {
            tracing::debug!(path = %self.path.display(), scope = self.scope, keys = ?unknown, "config keys not read");
        }
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

/// Keys every family reads outside its own struct (dispatch, quantisation, RoPE).
const BOOKKEEPING: &[&str] = &[
    "model_type",
    "quantization_config",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "partial_rotary_factor",
];

/// A JSON value deserializer that records the field names of the struct it is read into (for
/// [`Fields::note_unknown`]); everything else is the value's own deserializer.
struct Recording<'a> {
    value: Value,
    fields: &'a std::cell::Cell<&'static [&'static str]>,
}

impl<'de> serde::Deserializer<'de> for Recording<'_> {
    type Error = serde_json::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, Self::Error> {
        serde::Deserializer::deserialize_any(self.value, visitor)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> std::result::Result<V::Value, Self::Error> {
        self.fields.set(fields);
        serde::Deserializer::deserialize_struct(self.value, name, fields, visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
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

#[cfg(test)]
mod tests;
