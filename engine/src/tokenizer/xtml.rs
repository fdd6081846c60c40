//! Kimi K3's native prompt encoder (XTML), as segments.
//!
//! K3 ships no Jinja template: its release renders prompts with a Python program
//! (`encoding_k3.py`, `build_chat_segments`; reference/agent-api.md §2). This module renders the
//! same structure as a list of [`Segment`]s `(text, special)`:
//! * only renderer-owned markers (`<|open|>`, `<|close|>`, `<|sep|>`, `<|end_of_msg|>`) are
//!   special segments; every other segment — tag names, attributes, message text, tool JSON —
//!   is encoded with specials disabled, so user or tool text cannot forge structure;
//! * segments are encoded **one at a time**, never concatenated first (BPE merges never cross a
//!   segment boundary); empty segments are dropped;
//! * an attribute is four segments, ` {key}`, `="`, the escaped value (`&`→`&amp;`, then
//!   `"`→`&quot;`), `"` — the vLLM-vendored form. agent-api.md §2 records a CONFLICT with a
//!   one-segment copy; the K3 fixture (`tests/fixtures/k3/golden.json`, rendered segment by
//!   segment between specials) only has `role` attributes, whose ids are the same either way
//!   under Kimi's pre-tokenizer, so it does not decide; `tests/tokenizer_xtml.rs` pins the
//!   four-segment form against an independent Python oracle.
//!
//! Render order: tool-declare note (tools deep-sorted, compact JSON), thinking-effort note, the
//! conversation (tool results re-ordered by [`order_tool_results`]), tool-choice note,
//! response-format note, generation prompt. Options come from [`ChatOptions`]: `thinking`
//! (bool, default true) and `thinking_effort` (`low` | `high` | `max`; `medium` is refused as
//! upstream refuses it) through `extra`, and `tool_choice` / `response_format`.
//!
//! Deliberate difference: a role other than system/user/assistant/tool is an error (upstream
//! skips such messages silently). Message content is text only (no image parts).

use serde_json::{Map, Value};

use super::chat::{ChatMessage, ChatOptions, deep_sorted, py_dumps as dumps};
use super::pretok::py_isspace;
use crate::error::{Error, Result};

/// The structural special tokens; a tokenizer defining all four is an XTML tokenizer.
pub(crate) const MARKERS: [&str; 4] = [OPEN, CLOSE, SEP, END_OF_MSG];
const OPEN: &str = "<|open|>";
const CLOSE: &str = "<|close|>";
const SEP: &str = "<|sep|>";
const END_OF_MSG: &str = "<|end_of_msg|>";

/// Accepted `thinking_effort` values (the note advertises `medium` too; upstream refuses it).
const EFFORTS: [&str; 3] = ["low", "high", "max"];

const TOOLS_HEADER: &str = "# Tools\nHere are the available tools, described in JSONSchema.\n\n";
const EFFORT_NOTE: &str = "`thinking_effort` guides on how much to think in your thinking channel \
(not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\n";
const RAW_JSON_NOTE: &str = "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";

/// One piece of a rendered prompt: `special` pieces are marker strings, the others plain text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    pub text: String,
    pub special: bool,
}

/// The options the encoder reads, validated.
struct Settings<'a> {
    thinking: bool,
    effort: Option<&'a str>,
    tool_choice: Option<&'a str>,
    response_format: Option<&'a Value>,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        field,
        reason: reason.into(),
    }
}

impl<'a> Settings<'a> {
    fn new(opts: &'a ChatOptions) -> Result<Self> {
        let thinking = match opts.extra.get("thinking") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(invalid("thinking", format!("must be a boolean, got {other}"))),
        };
        let effort = match opts.extra.get("thinking_effort") {
            None | Some(Value::Null) => None,
            Some(_) if !thinking => None,
            Some(Value::String(s)) if EFFORTS.contains(&s.as_str()) => Some(s.as_str()),
            Some(other) => {
                return Err(invalid(
                    "thinking_effort",
                    format!("unsupported value {other}; Kimi K3 accepts \"low\", \"high\" or \"max\""),
                ));
            }
        };
        Ok(Settings {
            thinking,
            effort,
            tool_choice: opts.tool_choice.as_deref(),
            response_format: opts.response_format.as_ref(),
        })
    }
}

/// Builds the segment list.
#[derive(Default)]
struct Renderer {
    out: Vec<Segment>,
}

impl Renderer {
    fn special(&mut self, marker: &str) {
        self.out.push(Segment {
            text: marker.to_owned(),
            special: true,
        });
    }

    fn text(&mut self, text: &str) {
        if !text.is_empty() {
            self.out.push(Segment {
                text: text.to_owned(),
                special: false,
            });
        }
    }

    fn open(&mut self, tag: &str, attrs: &[(&str, &str)]) {
        self.special(OPEN);
        self.text(tag);
        for (key, value) in attrs {
            self.text(&format!(" {key}"));
            self.text("=\"");
            self.text(&escape_attr(value));
            self.text("\"");
        }
        self.special(SEP);
    }

    fn close(&mut self, tag: &str) {
        self.special(CLOSE);
        self.text(tag);
        self.special(SEP);
    }

    /// A whole message: open tag, body text, close tag, end of message.
    fn message(&mut self, attrs: &[(&str, &str)], body: &str) {
        self.open("message", attrs);
        self.text(body);
        self.close("message");
        self.special(END_OF_MSG);
    }

    /// A system note the encoder synthesises (`type="…"`); the body is stripped.
    fn note(&mut self, kind: &str, body: &str) {
        self.message(&[("role", "system"), ("type", kind)], py_strip(body));
    }
}

/// Attribute-value escaping: `&` first, then `"` (`<` and `>` stay literal).
fn escape_attr(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;")
}

/// Python's `str.strip()`.
fn py_strip(s: &str) -> &str {
    s.trim_matches(py_isspace)
}

/// Render a conversation into XTML segments.
pub(crate) fn render(
    messages: &[ChatMessage],
    opts: &ChatOptions,
    tools: Option<&[Value]>,
) -> Result<Vec<Segment>> {
    let settings = Settings::new(opts)?;
    let mut r = Renderer::default();
    if let Some(tools) = tools.filter(|t| !t.is_empty()) {
        let sorted = deep_sorted(&Value::Array(tools.to_vec()));
        let body = format!("{TOOLS_HEADER}```json\n{}\n```", dumps(&sorted, true)?);
        r.note("tool-declare", &body);
    }
    if let Some(effort) = settings.effort {
        let body = format!("{EFFORT_NOTE}Now the system is invoked with `thinking_effort={effort}`.");
        r.note("thinking-effort", &body);
    }
    render_conversation(&mut r, messages, settings.thinking)?;
    match settings.tool_choice {
        Some("required") => r.note(
            "tool-choice",
            "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
        ),
        Some("none") => r.note(
            "tool-choice",
            "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.",
        ),
        _ => {}
    }
    if let Some(rf) = settings.response_format {
        response_format_note(&mut r, rf)?;
    }
    if opts.add_generation_prompt {
        r.open("message", &[("role", "assistant")]);
        r.open(if settings.thinking { "think" } else { "response" }, &[]);
    }
    Ok(r.out)
}

/// The `response-format` note for `json_object` / `json_schema` (other types render nothing).
fn response_format_note(r: &mut Renderer, rf: &Value) -> Result<()> {
    let kind = match rf {
        Value::Object(o) => o.get("type").unwrap_or(rf),
        other => other,
    };
    match kind.as_str() {
        Some("json_object") => r.note(
            "response-format",
            &format!("The system is invoked with `response_format=json_object`.\n{RAW_JSON_NOTE}"),
        ),
        Some("json_schema") => {
            let schema = response_schema(rf).map_or(Value::Null, deep_sorted);
            let body = format!(
                "The system is invoked with `response_format=json_schema`.\n{RAW_JSON_NOTE}\n\
                 The JSON data must match the following schema:\n```json\n{}\n```",
                dumps(&schema, true)?
            );
            r.note("response-format", &body);
        }
        _ => {}
    }
    Ok(())
}

/// The schema of a `json_schema` response format: `json_schema.schema`, else
/// `json_schema.json_schema`, else `json_schema` itself.
fn response_schema(rf: &Value) -> Option<&Value> {
    let js = rf.get("json_schema").filter(|v| !v.is_null())?;
    match js {
        Value::Object(o) => Some(o.get("schema").or_else(|| o.get("json_schema")).unwrap_or(js)),
        other => Some(other),
    }
}

fn render_conversation(r: &mut Renderer, messages: &[ChatMessage], thinking: bool) -> Result<()> {
    let mut calls: Option<&[Value]> = None;
    let mut tool_index = 0usize;
    for (i, (m, resolved)) in order_tool_results(messages).into_iter().enumerate() {
        let named = |role: &'static str| -> Vec<(&str, &str)> {
            let mut attrs = vec![("role", role)];
            if let Some(name) = m.name.as_deref().filter(|n| !n.is_empty()) {
                attrs.push(("name", name));
            }
            attrs
        };
        match m.role.as_str() {
            "user" => r.message(&named("user"), &m.content),
            "system" => r.message(&named("system"), &m.content),
            "tool" => {
                tool_index += 1;
                let name = tool_name(m, resolved.as_deref(), calls, tool_index)?;
                let index = tool_index.to_string();
                r.message(
                    &[("role", "tool"), ("tool", &name), ("index", &index)],
                    &m.content,
                );
            }
            "assistant" => {
                calls = m.tool_calls.as_deref();
                tool_index = 0;
                r.open("message", &named("assistant"));
                render_assistant(r, m, thinking)?;
                r.close("message");
                r.special(END_OF_MSG);
            }
            other => {
                return Err(invalid(
                    "messages",
                    format!("message {i}: role `{other}` is not one of system, user, assistant, tool"),
                ));
            }
        }
    }
    Ok(())
}

/// A tool message's `tool` attribute: the call matched by id, else its `name`, else the call
/// at its position in the preceding assistant turn.
fn tool_name(
    m: &ChatMessage,
    resolved: Option<&str>,
    calls: Option<&[Value]>,
    index: usize,
) -> Result<String> {
    if let Some(name) = resolved.or(m.name.as_deref()) {
        return Ok(name.to_owned());
    }
    let positional = calls
        .and_then(|c| c.get(index - 1))
        .map(|call| call.get("function").unwrap_or(call))
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str);
    positional.map(str::to_owned).ok_or_else(|| {
        invalid(
            "messages",
            format!(
                "tool message {index} after the last assistant message has no resolvable tool name: \
                 give it a `name` or a `tool_call_id` of a preceding assistant tool call"
            ),
        )
    })
}

fn render_assistant(r: &mut Renderer, m: &ChatMessage, thinking: bool) -> Result<()> {
    if thinking {
        r.open("think", &[]);
        if let Some(reasoning) = m.reasoning_content.as_deref().filter(|s| !py_strip(s).is_empty()) {
            r.text(reasoning);
        }
        r.close("think");
    }
    r.open("response", &[]);
    r.text(&m.content);
    r.close("response");
    let Some(calls) = m.tool_calls.as_deref().filter(|c| !c.is_empty()) else {
        return Ok(());
    };
    r.open("tools", &[]);
    for (i, call) in calls.iter().enumerate() {
        render_call(r, call, i + 1)?;
    }
    r.close("tools");
    Ok(())
}

/// The arguments of a call: an object, or text that is not JSON (kept raw).
enum Arguments {
    Object(Map<String, Value>),
    Raw(String),
}

fn render_call(r: &mut Renderer, call: &Value, index: usize) -> Result<()> {
    let bad = |reason: &str| invalid("tool_calls", format!("tool call {index}: {reason}"));
    if !call.is_object() {
        return Err(bad("must be an object"));
    }
    let function = call.get("function").unwrap_or(call);
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("needs a non-empty function name"))?;
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => Arguments::Object(Map::new()),
        Some(Value::Object(o)) => Arguments::Object(o.clone()),
        Some(Value::String(s)) if py_strip(s).is_empty() => Arguments::Object(Map::new()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(o)) => Arguments::Object(o),
            Ok(_) => return Err(bad("arguments must be a JSON object")),
            Err(_) => Arguments::Raw(s.clone()),
        },
        Some(_) => return Err(bad("arguments must be a JSON object or a string")),
    };
    let index = index.to_string();
    r.open("call", &[("tool", name), ("index", &index)]);
    match arguments {
        Arguments::Raw(raw) => {
            r.open("json", &[("type", "object")]);
            r.text(&raw);
            r.close("json");
        }
        Arguments::Object(args) => {
            for (key, value) in &args {
                r.open("argument", &[("key", key), ("type", value_type(value))]);
                match value {
                    Value::String(s) => r.text(s),
                    other => r.text(&dumps(other, false)?),
                }
                r.close("argument");
            }
        }
    }
    r.close("call");
    Ok(())
}

/// The `type` attribute of an argument.
fn value_type(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "boolean",
        Value::Null => "null",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Object(_) => "object",
        Value::Array(_) => "array",
    }
}

/// Each message with the tool name resolved by id: every run of consecutive tool messages is
/// re-ordered into the order of the preceding assistant's `tool_calls` (matched by
/// `tool_call_id`; ties keep their order) and takes the matched call's function name. A run
/// with any unmatched id keeps its order and names (upstream `normalize_xtml_tool_result_messages`).
pub(crate) fn order_tool_results(messages: &[ChatMessage]) -> Vec<(&ChatMessage, Option<String>)> {
    let mut out = Vec::with_capacity(messages.len());
    let mut index: Vec<(String, usize, Option<String>)> = Vec::new();
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        if m.role != "tool" {
            if m.role == "assistant" {
                index = call_index(m.tool_calls.as_deref().unwrap_or_default());
            }
            out.push((m, None));
            i += 1;
            continue;
        }
        let end = messages[i..]
            .iter()
            .position(|m| m.role != "tool")
            .map_or(messages.len(), |k| i + k);
        let run: Vec<Option<&(String, usize, Option<String>)>> = messages[i..end]
            .iter()
            .map(|m| {
                let id = m.tool_call_id.as_deref()?;
                index.iter().find(|(key, _, _)| key == id)
            })
            .collect();
        if run.iter().any(Option::is_none) {
            out.extend(messages[i..end].iter().map(|m| (m, None)));
        } else {
            let mut sorted: Vec<(usize, usize, Option<String>)> = run
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(offset, (_, pos, name))| (*pos, offset, name.clone()))
                .collect();
            sorted.sort_by_key(|(pos, offset, _)| (*pos, *offset));
            out.extend(
                sorted
                    .into_iter()
                    .map(|(_, offset, name)| (&messages[i + offset], name)),
            );
        }
        i = end;
    }
    out
}

/// `tool_calls[].id` → (1-based position, function name); the first of duplicate ids wins.
fn call_index(calls: &[Value]) -> Vec<(String, usize, Option<String>)> {
    let mut index: Vec<(String, usize, Option<String>)> = Vec::new();
    for (pos, call) in calls.iter().enumerate() {
        let id = match call.get("id") {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        if index.iter().any(|(key, _, _)| *key == id) {
            continue;
        }
        let name = match call.get("function") {
            Some(f @ Value::Object(_)) => f.get("name"),
            _ => call.get("name"),
        };
        index.push((id, pos + 1, name.and_then(Value::as_str).map(str::to_owned)));
    }
    index
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn text(segments: &[Segment]) -> String {
        segments.iter().map(|s| s.text.as_str()).collect()
    }

    #[test]
    fn attributes_are_four_escaped_segments() {
        let mut r = Renderer::default();
        r.open("call", &[("tool", "a&\"b<c>")]);
        let got: Vec<(&str, bool)> = r.out.iter().map(|s| (s.text.as_str(), s.special)).collect();
        assert_eq!(
            got,
            [
                (OPEN, true),
                ("call", false),
                (" tool", false),
                ("=\"", false),
                ("a&amp;&quot;b<c>", false),
                ("\"", false),
                (SEP, true)
            ]
        );
    }

    #[test]
    fn effort_medium_is_refused_and_ignored_without_thinking() {
        let mut opts = ChatOptions::default();
        opts.extra.insert("thinking_effort".into(), json!("medium"));
        let msgs = [ChatMessage::new("user", "x")];
        let err = render(&msgs, &opts, None).unwrap_err();
        assert_eq!(err.kind(), "invalid_argument");
        opts.extra.insert("thinking".into(), json!(false));
        assert!(render(&msgs, &opts, None).is_ok());
    }

    #[test]
    fn tool_results_follow_call_order_unless_an_id_is_unmatched() {
        let call = |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}});
        let mut a = ChatMessage::new("assistant", "");
        a.tool_calls = Some(vec![call("x", "f"), call("y", "g")]);
        let tool = |id: &str, content: &str| ChatMessage {
            tool_call_id: Some(id.into()),
            ..ChatMessage::new("tool", content)
        };
        let msgs = [a.clone(), tool("y", "G"), tool("x", "F")];
        let got: Vec<(&str, Option<String>)> = order_tool_results(&msgs)
            .into_iter()
            .map(|(m, n)| (m.content.as_str(), n))
            .collect();
        assert_eq!(
            got,
            [("", None), ("F", Some("f".into())), ("G", Some("g".into()))]
        );
        let msgs = [a, tool("y", "G"), tool("zz", "Z")];
        let got: Vec<&str> = order_tool_results(&msgs)
            .iter()
            .map(|(m, _)| m.content.as_str())
            .collect();
        assert_eq!(got, ["", "G", "Z"]);
    }

    #[test]
    fn call_arguments_render_typed_raw_or_refused() {
        let mut a = ChatMessage::new("assistant", "ok");
        a.tool_calls = Some(vec![
            json!({"function": {"name": "f", "arguments": "{\"b\": true, \"n\": 1.5, \"s\": \"x\", \"o\": {\"k\": [1, null]}}"}}),
        ]);
        let segs = render(&[a.clone()], &ChatOptions::default(), None).unwrap();
        let t = text(&segs);
        assert!(
            t.contains("key=\"b\" type=\"boolean\"<|sep|>true<|close|>"),
            "{t}"
        );
        assert!(t.contains("key=\"s\" type=\"string\"<|sep|>x<|close|>"), "{t}");
        assert!(
            t.contains("type=\"object\"<|sep|>{\"k\": [1, null]}<|close|>"),
            "{t}"
        );
        a.tool_calls = Some(vec![json!({"function": {"name": "f", "arguments": "{oops"}})]);
        let t = text(&render(&[a.clone()], &ChatOptions::default(), None).unwrap());
        assert!(
            t.contains("<|open|>json type=\"object\"<|sep|>{oops<|close|>json<|sep|>"),
            "{t}"
        );
        a.tool_calls = Some(vec![json!({"function": {"name": "f", "arguments": "[1]"}})]);
        let err = render(&[a], &ChatOptions::default(), None).unwrap_err();
        assert_eq!(err.kind(), "invalid_argument");
    }
}
