//! Chat messages, template contexts, and control-token sanitisation.
//!
//! User-supplied strings never produce control tokens. This follows transformers 5's
//! `apply_chat_template(..., sanitize_control_tokens=True)`: every control token inside a
//! user-supplied string (messages, tools, extra template variables; not dict keys) is wrapped in
//! the private-use markers U+F0000 / U+F0001 (markers already in the input are removed first),
//! the template is rendered once, and the rendered text is split at the markers. Marked tokens
//! are encoded as plain text on their own; the text between them is encoded normally, so
//! control tokens written by the template itself become ids. A lone marker (a template string
//! method cut a wrapped token apart) is dropped but still breaks the text. Without control tokens
//! in the input there are no markers, and the ids are those of the whole rendered string.

use std::borrow::Cow;
use std::collections::BTreeMap;

use minijinja::Value;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};

use super::specials::LiteralSet;
use crate::error::{Error, Result};

/// Marker opening a user-supplied control token (transformers' `_CONTROL_TOKEN_START`).
pub(crate) const START: char = '\u{F0000}';
/// Marker closing it (`_CONTROL_TOKEN_END`).
pub(crate) const END: char = '\u{F0001}';

/// One chat message, as the chat template sees it (fields that are `None` are absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, …
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant's reasoning (also given to templates as `thinking`, as transformers does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// OpenAI-shaped tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool or participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with only a role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }
}

/// Options for [`super::Tokenizer::encode_chat`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatOptions {
    /// End with the header of a new assistant turn.
    pub add_generation_prompt: bool,
    /// Tool (function) schemas, passed to the template as `tools` (`None` renders as none).
    pub tools: Option<Vec<serde_json::Value>>,
    /// Extra template variables, e.g. `{"thinking": true}`; they override `bos_token` & co.
    /// The XTML encoder reads `thinking` (bool, default true) and `thinking_effort` (string).
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The request's tool choice: `"auto"`, `"none"`, `"required"` or `"named"` (a specific
    /// function was forced). Only the XTML encoder renders it (`required` / `none` notes).
    pub tool_choice: Option<String>,
    /// The OpenAI `response_format` object. Only the XTML encoder renders it (a
    /// `response-format` note for `json_object` / `json_schema`; a prompt only, not a constraint).
    pub response_format: Option<serde_json::Value>,
}

/// Template variables the caller may not set through `extra`.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// The control tokens of a tokenizer and a chat template, as a matcher.
#[derive(Debug, Clone)]
pub(crate) struct ControlTokens {
    set: LiteralSet,
}

impl ControlTokens {
    pub(crate) fn new(set: LiteralSet) -> Self {
        ControlTokens { set }
    }

    /// Remove markers from `s` and wrap every control token in START/END.
    pub(crate) fn mark<'s>(&self, s: &'s str) -> Cow<'s, str> {
        let cleaned: Cow<'s, str> = if s.contains([START, END]) {
            Cow::Owned(s.replace([START, END], ""))
        } else {
            Cow::Borrowed(s)
        };
        if !self.set.is_match(&cleaned) {
            return cleaned;
        }
        let mut out = String::with_capacity(cleaned.len() + 16);
        let mut pos = 0;
        for found in self.set.find_iter(&cleaned) {
            out.push_str(&cleaned[pos..found.start]);
            out.push(START);
            out.push_str(&cleaned[found.start..found.end]);
            out.push(END);
            pos = found.end;
        }
        out.push_str(&cleaned[pos..]);
        Cow::Owned(out)
    }

    /// Mark every string in a JSON value (not object keys).
    pub(crate) fn mark_json(&self, v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::String(s) => serde_json::Value::String(self.mark(s).into_owned()),
            serde_json::Value::Array(a) => {
                serde_json::Value::Array(a.iter().map(|x| self.mark_json(x)).collect())
            }
            serde_json::Value::Object(o) => {
                serde_json::Value::Object(o.iter().map(|(k, x)| (k.clone(), self.mark_json(x))).collect())
            }
            other => other.clone(),
        }
    }

    /// The id of control token `text`, if it is one.
    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        self.set.get(text)
    }
}

/// A message in template form, with transformers' key order (`thinking` first when present).
#[derive(Serialize)]
struct TemplateMessage<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<&'a str>,
    role: &'a str,
    content: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<&'a [serde_json::Value]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

/// Checks shared by every chat renderer: at least one message, no reserved `extra` key.
pub(crate) fn check_chat_inputs(messages: &[ChatMessage], opts: &ChatOptions) -> Result<()> {
    if messages.is_empty() {
        return Err(Error::InvalidArgument {
            field: "messages",
            reason: "a chat needs at least one message".into(),
        });
    }
    if let Some(key) = RESERVED.iter().find(|k| opts.extra.contains_key(**k)) {
        return Err(Error::InvalidArgument {
            field: "extra",
            reason: format!("`{key}` is set by encode_chat itself"),
        });
    }
    Ok(())
}

/// Template variables for a chat: special-token attributes, then `extra`, then the chat itself.
/// With `control`, every user-supplied string is marked.
pub(crate) fn template_vars(
    messages: &[ChatMessage],
    opts: &ChatOptions,
    special_attributes: &[(String, String)],
    sort_tools: bool,
    control: Option<&ControlTokens>,
) -> Result<BTreeMap<String, Value>> {
    let mark_json = |v: &serde_json::Value| control.map_or_else(|| v.clone(), |c| c.mark_json(v));
    let mut vars = BTreeMap::new();
    for (attr, token) in special_attributes {
        vars.insert(attr.clone(), Value::from(token.as_str()));
    }
    for (k, v) in &opts.extra {
        vars.insert(k.clone(), to_value(mark_json(v)));
    }
    let marked = match control {
        Some(c) => marked_messages(messages, c),
        None => messages.to_vec(),
    };
    let template_messages: Vec<TemplateMessage<'_>> = marked
        .iter()
        .map(|m| TemplateMessage {
            thinking: m.reasoning_content.as_deref(),
            role: &m.role,
            content: &m.content,
            reasoning_content: m.reasoning_content.as_deref(),
            tool_calls: m.tool_calls.as_deref(),
            tool_call_id: m.tool_call_id.as_deref(),
            name: m.name.as_deref(),
        })
        .collect();
    vars.insert("messages".into(), to_value(&template_messages));
    let tools = opts.tools.as_ref().map(|tools| {
        tools
            .iter()
            .map(|t| {
                if sort_tools {
                    deep_sorted(&mark_json(t))
                } else {
                    mark_json(t)
                }
            })
            .collect::<Vec<_>>()
    });
    vars.insert("tools".into(), to_value(&tools));
    vars.insert("documents".into(), Value::from(()));
    vars.insert(
        "add_generation_prompt".into(),
        Value::from(opts.add_generation_prompt),
    );
    Ok(vars)
}

/// `messages` with every user-supplied string marked (see [`ControlTokens::mark`]).
pub(crate) fn marked_messages(messages: &[ChatMessage], c: &ControlTokens) -> Vec<ChatMessage> {
    let mark = |s: &str| c.mark(s).into_owned();
    messages
        .iter()
        .map(|m| ChatMessage {
            role: mark(&m.role),
            content: mark(&m.content),
            reasoning_content: m.reasoning_content.as_deref().map(mark),
            tool_calls: m
                .tool_calls
                .as_ref()
                .map(|calls| calls.iter().map(|v| c.mark_json(v)).collect()),
            tool_call_id: m.tool_call_id.as_deref().map(mark),
            name: m.name.as_deref().map(mark),
        })
        .collect()
}

/// `opts` with its tools and extra values marked, for the native encoders.
pub(crate) fn marked_options(opts: &ChatOptions, c: &ControlTokens) -> ChatOptions {
    ChatOptions {
        add_generation_prompt: opts.add_generation_prompt,
        tools: opts
            .tools
            .as_ref()
            .map(|t| t.iter().map(|v| c.mark_json(v)).collect()),
        extra: opts
            .extra
            .iter()
            .map(|(k, v)| (k.clone(), c.mark_json(v)))
            .collect(),
        tool_choice: opts.tool_choice.clone(),
        response_format: opts.response_format.clone(),
    }
}

/// A serialisable value as a template value (map order is the serialiser's order).
pub(crate) fn to_value<T: Serialize>(v: T) -> Value {
    Value::from(Serde(v))
}

/// Python's `json.dumps(v, ensure_ascii=False)`, compact (`separators=(",", ":")`) or default
/// (`", "` / `": "`), for the native (non-Jinja) encoders.
pub(crate) fn py_dumps(v: &serde_json::Value, compact: bool) -> Result<String> {
    let separators = compact.then(|| (",".to_owned(), ":".to_owned()));
    let opts = super::pyjson::JsonOptions::new(false, None, separators, false);
    super::pyjson::dumps(&to_value(v), &opts).map_err(|e| Error::Template(format!("cannot write JSON: {e}")))
}

/// Kimi's `deep_sort_dict`: object keys sorted at every level (a JSON value's map is ordered
/// as serde_json orders it, so build the sorted form explicitly).
pub(crate) fn deep_sorted(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(o) => {
            let mut entries: Vec<_> = o.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(k, x)| (k.clone(), deep_sorted(x)))
                    .collect(),
            )
        }
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(deep_sorted).collect()),
        other => other.clone(),
    }
}

/// A piece of a rendered, marked chat.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    /// Text to encode normally (control tokens written by the template become ids).
    Text(&'a str),
    /// A user-supplied control token, to encode as plain text.
    Marked(&'a str),
    /// A lone marker: nothing to encode, but the text around it is encoded separately.
    Break,
}

/// Split `rendered` at the markers (transformers' `markers_re.split`).
pub(crate) fn split_marked<'a>(rendered: &'a str, control: &ControlTokens) -> Vec<Piece<'a>> {
    let mut pieces = Vec::new();
    let mut text_start = 0;
    let mut pos = 0;
    while let Some(off) = rendered[pos..].find([START, END]) {
        let at = pos + off;
        pieces.push(Piece::Text(&rendered[text_start..at]));
        let after = at + START.len_utf8();
        let marked = if rendered[at..].starts_with(START) {
            rendered[after..]
                .find([START, END])
                .filter(|&k| rendered[after + k..].starts_with(END))
                .map(|k| &rendered[after..after + k])
                .filter(|token| control.id(token).is_some())
        } else {
            None
        };
        match marked {
            Some(token) => {
                pieces.push(Piece::Marked(token));
                pos = after + token.len() + END.len_utf8();
            }
            None => {
                pieces.push(Piece::Break);
                pos = after;
            }
        }
        text_start = pos;
    }
    pieces.push(Piece::Text(&rendered[text_start..]));
    pieces
}

/// Encode `piece` after a newline and drop the newline's ids, so that a piece in the middle of a
/// chat is encoded as it would be there (transformers' `_encode_chat_piece`).
pub(crate) fn encode_mid_piece(piece: &str, newline: &[u32], encode: impl Fn(&str) -> Vec<u32>) -> Vec<u32> {
    let ids = encode(&format!("\n{piece}"));
    match ids.strip_prefix(newline) {
        Some(rest) => rest.to_vec(),
        None => encode(piece),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control() -> ControlTokens {
        ControlTokens::new(LiteralSet::new([("<|end|>", 7), ("<a>", 8)]).unwrap())
    }

    #[test]
    fn marks_and_splits() {
        let c = control();
        assert_eq!(c.mark("x<|end|>y\u{F0000}z"), format!("x{START}<|end|>{END}yz"));
        assert!(matches!(c.mark("plain"), Cow::Borrowed("plain")));
        let rendered = format!("A<|end|>B{START}<a>{END}C{END}D{START}<b>{END}");
        let pieces = split_marked(&rendered, &c);
        assert_eq!(
            pieces,
            vec![
                Piece::Text("A<|end|>B"),
                Piece::Marked("<a>"),
                Piece::Text("C"),
                Piece::Break,
                Piece::Text("D"),
                Piece::Break,
                Piece::Text("<b>"),
                Piece::Break,
                Piece::Text(""),
            ]
        );
    }
}
