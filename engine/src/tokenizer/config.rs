//! `tokenizer_config.json`: added-token names, the special-token attributes (`bos_token`, …), the
//! chat template and `chat_control_tokens`. Parsed leniently in shape (a token may be a string or
//! an `AddedToken` object) but strictly in meaning: a malformed field is an error naming the file.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// One entry of `added_tokens_decoder`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddedTokenEntry {
    pub id: u32,
    pub content: String,
    pub special: bool,
}

/// The fields of tokenizer_config.json that the engine uses.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenizerConfig {
    pub path: PathBuf,
    pub added_tokens: Vec<AddedTokenEntry>,
    /// `(attribute, token)` for the special-token attributes present, e.g. `("bos_token", "[BOS]")`,
    /// in the order of [`SPECIAL_ATTRIBUTES`]. These are also chat-template variables.
    pub special_attributes: Vec<(String, String)>,
    pub chat_template: Option<String>,
    pub chat_control_tokens: Option<Vec<String>>,
}

/// transformers' special-token attributes (`SPECIAL_TOKENS_ATTRIBUTES`).
const SPECIAL_ATTRIBUTES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

impl TokenizerConfig {
    /// Read and validate `path`.
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| Error::Json {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::from_value(path, &value)
    }

    fn from_value(path: &Path, value: &Value) -> Result<Self> {
        let bad = |reason: String| Error::Tokenizer {
            path: path.to_path_buf(),
            reason,
        };
        let obj = value
            .as_object()
            .ok_or_else(|| bad("expected a JSON object".into()))?;
        let mut added_tokens = Vec::new();
        if let Some(decoder) = obj.get("added_tokens_decoder").filter(|v| !v.is_null()) {
            let decoder = decoder
                .as_object()
                .ok_or_else(|| bad("`added_tokens_decoder` must be an object".into()))?;
            for (key, entry) in decoder {
                let id: u32 = key
                    .parse()
                    .map_err(|_| bad(format!("`added_tokens_decoder` key `{key}` is not an id")))?;
                let content = token_content(entry)
                    .ok_or_else(|| bad(format!("`added_tokens_decoder[{key}]` has no string `content`")))?;
                let special = entry.get("special").and_then(Value::as_bool).unwrap_or(false);
                added_tokens.push(AddedTokenEntry { id, content, special });
            }
        }
        added_tokens.sort_by_key(|t| t.id);
        let mut special_attributes = Vec::new();
        for attr in SPECIAL_ATTRIBUTES {
            match obj.get(attr) {
                None | Some(Value::Null) => {}
                Some(v) => {
                    let token = token_content(v)
                        .ok_or_else(|| bad(format!("`{attr}` must be a string or token object")))?;
                    special_attributes.push((attr.to_owned(), token));
                }
            }
        }
        let chat_template = match obj.get("chat_template") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => Some(default_named_template(list).map_err(bad)?),
            Some(_) => {
                return Err(bad(
                    "`chat_template` must be a string or a list of named templates".into(),
                ));
            }
        };
        let chat_control_tokens = match obj.get("chat_control_tokens") {
            None | Some(Value::Null) => None,
            Some(Value::Array(list)) => Some(
                list.iter()
                    .map(|v| v.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad("`chat_control_tokens` must be a list of strings".into()))?,
            ),
            Some(_) => return Err(bad("`chat_control_tokens` must be a list of strings".into())),
        };
        Ok(TokenizerConfig {
            path: path.to_path_buf(),
            added_tokens,
            special_attributes,
            chat_template,
            chat_control_tokens,
        })
    }

    /// The token string of a special-token attribute such as `bos_token`.
    pub(crate) fn attribute(&self, name: &str) -> Option<&str> {
        self.special_attributes
            .iter()
            .find(|(a, _)| a == name)
            .map(|(_, t)| t.as_str())
    }
}

/// A token given as `"text"` or as `{"content": "text", ...}`.
fn token_content(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// transformers' list form `[{"name": …, "template": …}]`: the one named `default`.
fn default_named_template(list: &[Value]) -> std::result::Result<String, String> {
    for entry in list {
        let name = entry.get("name").and_then(Value::as_str);
        let template = entry.get("template").and_then(Value::as_str);
        match (name, template) {
            (Some("default"), Some(t)) => return Ok(t.to_owned()),
            (Some(_), Some(_)) => {}
            _ => return Err("`chat_template` list entries need string `name` and `template`".into()),
        }
    }
    Err("`chat_template` is a list without a `default` template".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_token_shapes_and_template_lists() {
        let v = serde_json::json!({
            "added_tokens_decoder": {"5": {"content": "<x>", "special": true}},
            "bos_token": {"__type": "AddedToken", "content": "<s>"},
            "eos_token": "</s>",
            "unk_token": null,
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
        });
        let c = TokenizerConfig::from_value(Path::new("cfg.json"), &v).unwrap();
        assert_eq!(
            c.added_tokens,
            vec![AddedTokenEntry {
                id: 5,
                content: "<x>".into(),
                special: true
            }]
        );
        assert_eq!(c.attribute("bos_token"), Some("<s>"));
        assert_eq!(c.attribute("eos_token"), Some("</s>"));
        assert_eq!(c.attribute("unk_token"), None);
        assert_eq!(c.chat_template.as_deref(), Some("D"));
        let bad = serde_json::json!({"added_tokens_decoder": {"x": {"content": "a"}}});
        let err = TokenizerConfig::from_value(Path::new("cfg.json"), &bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cfg.json") && err.contains("not an id"), "{err}");
    }
}
