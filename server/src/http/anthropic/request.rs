//! A Messages API body becomes the typed [`ChatRequest`] the chat pipeline runs (agent-api.md
//! §7), or a 400 naming the field. Fail closed: what cannot be honoured (images, documents,
//! server tools, an assistant prefill, `redacted_thinking`) is refused; `cache_control` and
//! `citations: null` on blocks are accepted as the hints they are.
//!
//! Translation: `system` → a system message; a user turn's `tool_result` blocks → `tool`
//! messages (`tool_call_id` = `tool_use_id`), its text blocks → a user message, in block order;
//! an assistant turn's `text` → content, `thinking` → `reasoning_content`, `tool_use` →
//! OpenAI-shaped `tool_calls` (`input` serialised as the arguments string). `tools[].input_schema`
//! → the function's parameters; `tool_choice` auto / any / tool / none → Auto / Required /
//! Named / None (`disable_parallel_tool_use` → one call per turn); thinking as Anthropic
//! defines it: only when `thinking` is enabled (or adaptive); otherwise the template variables
//! `thinking: false` / `enable_thinking: false` turn it off where the template can, and
//! [`thinking_shown`] hides what a model reasons anyway; a forced tool (`any` / `tool`) with
//! thinking enabled is refused, as Anthropic refuses it; `output_config.format` (a JSON schema) → the same
//! constrained structured output as `response_format`, `output_config.effort` → the reasoning
//! effort.

use deltafin_engine::tokenizer::ChatMessage;
use serde_json::{Map, Value, json};

use crate::http::error::ApiError;
use crate::http::openai::request::agent::{self, FunctionTool, ResponseFormat, ToolChoice};
use crate::http::openai::request::fields::{integer, number, obj, only_except, string};
use crate::http::openai::request::{ChatRequest, Limits};

/// Most stop sequences per request.
pub const MAX_STOP_SEQUENCES: usize = 16;
const MAX_STOP_BYTES: usize = 256;

const FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "thinking",
    "metadata",
    "service_tier",
    "output_config",
    "cache_control",
];

/// Refuse keys of `o` outside `allowed` (`cache_control` is always allowed and ignored).
fn only(o: &Map<String, Value>, allowed: &[&str], at: &str) -> Result<(), ApiError> {
    only_except(o, allowed, &["cache_control"], at)
}

/// Validate a `/v1/messages` body (`count_only`: a `/v1/messages/count_tokens` body, which has
/// no `max_tokens` and no sampling fields).
pub fn parse(body: &Value, limits: &Limits, count_only: bool) -> Result<ChatRequest, ApiError> {
    let body = obj(body, "body")?;
    if let Some(k) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        unsupported_field(k)?;
    }
    let mut req = ChatRequest::new(Vec::new());
    let mut system = Vec::new();
    let mut messages = None;
    let mut tool_choice = None;
    let mut thinking_on = false;
    for (key, v) in body.iter().filter(|(_, v)| !v.is_null()) {
        let c = &mut req.common;
        match key.as_str() {
            "model" => c.model = Some(string(v, key)?.to_string()),
            "max_tokens" => c.max_tokens = Some(integer(v, key, 1, limits.max_tokens as u64)? as usize),
            "messages" => messages = Some(parse_messages(v)?),
            "system" => system = vec![ChatMessage::new("system", text_blocks(v, "system")?)],
            "tools" => req.tools = parse_tools(v)?,
            "tool_choice" => tool_choice = Some(v),
            "stop_sequences" => c.stop = stop_sequences(v)?,
            "temperature" => c.sampling.temperature = number(v, key, 0.0, 1.0)? as f32,
            "top_p" => match number(v, key, 0.0, 1.0)? {
                p if p > 0.0 => c.sampling.top_p = p as f32,
                _ => return Err(ApiError::field(key, "`top_p` must be greater than 0")),
            },
            "top_k" => c.sampling.top_k = integer(v, key, 0, u32::MAX as u64)? as usize,
            "stream" => {
                c.stream = v
                    .as_bool()
                    .ok_or_else(|| ApiError::field(key, "`stream` must be a boolean"))?
            }
            "thinking" => thinking_on = thinking(v)?,
            "output_config" => output_config(v, &mut req.response_format, &mut req.reasoning_effort)?,
            "cache_control" => drop(obj(v, key)?),
            "metadata" => drop(obj(v, key)?),
            "service_tier" => match v.as_str() {
                Some("auto" | "standard_only") => {}
                _ => {
                    return Err(ApiError::unsupported(
                        key,
                        "`service_tier` must be \"auto\" or \"standard_only\"",
                    ));
                }
            },
            other => unsupported_field(other)?,
        }
    }
    if !count_only && req.common.max_tokens.is_none() {
        return Err(ApiError::field("max_tokens", "`max_tokens` is required"));
    }
    let (choice, parallel) = match tool_choice {
        Some(v) => parse_tool_choice(v, &req.tools)?,
        None if req.tools.is_empty() => (ToolChoice::None, true),
        None => (ToolChoice::Auto, true),
    };
    if thinking_on && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(ApiError::field(
            "thinking",
            "Thinking may not be enabled when tool_choice forces tool use.",
        ));
    }
    if !thinking_on && req.reasoning_effort.is_none() {
        for key in ["thinking", "enable_thinking"] {
            req.template_kwargs.insert(key.into(), Value::Bool(false));
        }
    }
    req.tool_choice = choice;
    req.parallel_tool_calls = parallel;
    let messages = messages.ok_or_else(|| ApiError::field("messages", "`messages` is required"))?;
    req.messages = system.into_iter().chain(messages).collect();
    Ok(req)
}

fn unsupported_field(key: &str) -> Result<(), ApiError> {
    let key: String = key.chars().take(64).collect();
    Err(ApiError::unsupported(
        key.clone(),
        format!("unknown or unsupported field `{key}`"),
    ))
}

/// Whether the response may carry `thinking` blocks: only when the request enabled thinking
/// (a model whose template cannot turn reasoning off still reasons; it is not shown).
pub fn thinking_shown(req: &ChatRequest) -> bool {
    req.template_kwargs.get("thinking") != Some(&Value::Bool(false))
}

/// `thinking: {type: enabled, budget_tokens} | {type: adaptive} | {type: disabled}`: whether
/// thinking is on. The budget is accepted, and the model thinks as its template lets it.
/// `display` may only be `summarized` (thinking is returned as it is).
fn thinking(v: &Value) -> Result<bool, ApiError> {
    let o = obj(v, "thinking")?;
    if let Some(d) = o.get("display").filter(|d| !d.is_null())
        && d.as_str() != Some("summarized")
    {
        return Err(ApiError::unsupported(
            "thinking.display",
            "`thinking.display` must be \"summarized\" (thinking is returned in full)",
        ));
    }
    match o.get("type").and_then(Value::as_str) {
        Some("enabled") => {
            only(o, &["type", "budget_tokens", "display"], "thinking")?;
            if let Some(b) = o.get("budget_tokens").filter(|b| !b.is_null()) {
                integer(b, "thinking.budget_tokens", 1, u32::MAX as u64)?;
            }
        }
        Some("adaptive") => only(o, &["type", "display"], "thinking")?,
        Some("disabled") => {
            only(o, &["type"], "thinking")?;
            return Ok(false);
        }
        _ => {
            return Err(ApiError::field(
                "thinking.type",
                "`thinking.type` must be \"enabled\", \"adaptive\" or \"disabled\"",
            ));
        }
    }
    Ok(true)
}

/// `output_config: {format?: {type: json_schema, schema}, effort?}`: structured output (the
/// same constrained decoding as `response_format`) and the reasoning effort.
fn output_config(
    v: &Value,
    format: &mut ResponseFormat,
    effort: &mut Option<Option<String>>,
) -> Result<(), ApiError> {
    let o = obj(v, "output_config")?;
    only(o, &["format", "effort"], "output_config")?;
    if let Some(f) = o.get("format").filter(|f| !f.is_null()) {
        let fo = obj(f, "output_config.format")?;
        only(fo, &["type", "schema"], "output_config.format")?;
        if fo.get("type").and_then(Value::as_str) != Some("json_schema") {
            return Err(ApiError::field(
                "output_config.format.type",
                "`output_config.format.type` must be \"json_schema\"",
            ));
        }
        let js = json!({"name": "output", "schema": fo.get("schema").cloned().unwrap_or(Value::Null), "strict": true});
        *format = agent::json_schema_format(&js, "output_config.format")?;
    }
    if let Some(e) = o.get("effort").filter(|e| !e.is_null()) {
        let parsed = agent::parse_reasoning_effort(e).map_err(|_| {
            ApiError::field(
                "output_config.effort",
                "`output_config.effort` must be one of low, medium, high, max (which of them a model \
                 takes depends on the model: Kimi K3 low, high, max; gpt-oss low, medium, high)",
            )
        })?;
        *effort = Some(parsed);
    }
    Ok(())
}

fn stop_sequences(v: &Value) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::field(
            "stop_sequences",
            format!(
                "`stop_sequences` must be an array of at most {MAX_STOP_SEQUENCES} non-empty strings of at most {MAX_STOP_BYTES} bytes"
            ),
        )
    };
    let list = v
        .as_array()
        .filter(|a| a.len() <= MAX_STOP_SEQUENCES)
        .ok_or_else(bad)?;
    list.iter()
        .map(|s| match s.as_str() {
            Some(s) if !s.is_empty() && s.len() <= MAX_STOP_BYTES => Ok(s.to_string()),
            _ => Err(bad()),
        })
        .collect()
}

/// `tools: [{name, description?, input_schema, type?: "custom"}]`.
fn parse_tools(v: &Value) -> Result<Vec<FunctionTool>, ApiError> {
    agent::tool_list(v, "name", |o, at| {
        match o.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                let other: String = other.chars().take(64).collect();
                return Err(ApiError::unsupported(
                    format!("{at}.type"),
                    format!("tool type `{other}` is not supported (only client tools with `input_schema`)"),
                ));
            }
        }
        only(
            o,
            &[
                "type",
                "name",
                "description",
                "input_schema",
                "strict",
                "eager_input_streaming",
            ],
            at,
        )?;
        if o.get("input_schema").is_none_or(Value::is_null) {
            return Err(ApiError::field(
                format!("{at}.input_schema"),
                format!("`{at}.input_schema` is required"),
            ));
        }
        agent::function_from_parts(
            o.get("name"),
            o.get("description"),
            o.get("input_schema"),
            o.get("strict"),
            at,
            "input_schema",
        )
    })
}

/// `tool_choice` and whether parallel calls are allowed.
fn parse_tool_choice(v: &Value, tools: &[FunctionTool]) -> Result<(ToolChoice, bool), ApiError> {
    let o = obj(v, "tool_choice")?;
    let kind = o.get("type").and_then(Value::as_str);
    let allowed: &[&str] = match kind {
        Some("tool") => &["type", "name", "disable_parallel_tool_use"],
        Some("none") => &["type"],
        _ => &["type", "disable_parallel_tool_use"],
    };
    only(o, allowed, "tool_choice")?;
    let parallel = match o.get("disable_parallel_tool_use").filter(|d| !d.is_null()) {
        Some(d) => !d.as_bool().ok_or_else(|| {
            ApiError::field(
                "tool_choice.disable_parallel_tool_use",
                "`tool_choice.disable_parallel_tool_use` must be a boolean",
            )
        })?,
        None => true,
    };
    let choice = match kind {
        Some("auto") if tools.is_empty() => ToolChoice::None,
        Some("auto") => ToolChoice::Auto,
        Some("none") => ToolChoice::None,
        Some("any") => ToolChoice::Required,
        Some("tool") => match o.get("name").and_then(Value::as_str) {
            Some(n) => ToolChoice::Named(n.to_string()),
            None => {
                return Err(ApiError::field(
                    "tool_choice.name",
                    "`tool_choice.name` is required",
                ));
            }
        },
        _ => {
            return Err(ApiError::field(
                "tool_choice.type",
                "`tool_choice.type` must be one of auto, any, tool, none",
            ));
        }
    };
    if matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) && tools.is_empty() {
        return Err(ApiError::field(
            "tool_choice",
            "`tool_choice` of type \"any\" or \"tool\" needs `tools`",
        ));
    }
    agent::check_choice(&choice, tools, "tool_choice")?;
    Ok((choice, parallel))
}

/// `system` or a `tool_result`'s content: a string or text blocks (joined with newlines).
fn text_blocks(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let texts = blocks.iter().enumerate().map(|(j, b)| {
                let at = format!("{at}[{j}]");
                let o = obj(b, &at)?;
                match o.get("type").and_then(Value::as_str) {
                    Some("text") => text_of(o, &at),
                    _ => Err(ApiError::unsupported(
                        at.clone(),
                        format!("`{at}`: only text blocks are supported here"),
                    )),
                }
            });
            Ok(texts.collect::<Result<Vec<_>, _>>()?.join("\n"))
        }
        _ => Err(ApiError::field(
            at,
            format!("`{at}` must be a string or an array of text blocks"),
        )),
    }
}

/// A text block's text (`citations` accepted only when empty).
fn text_of(o: &Map<String, Value>, at: &str) -> Result<String, ApiError> {
    only(o, &["type", "text", "citations"], at)?;
    if o.get("citations")
        .is_some_and(|c| !c.is_null() && c != &json!([]))
    {
        return Err(ApiError::unsupported(
            format!("{at}.citations"),
            "citations are not supported",
        ));
    }
    Ok(string(o.get("text").unwrap_or(&Value::Null), &format!("{at}.text"))?.to_string())
}

fn parse_messages(v: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let list = v.as_array().filter(|a| !a.is_empty());
    let list = list.ok_or_else(|| ApiError::field("messages", "`messages` must be a non-empty array"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let o = obj(m, &at)?;
        only(o, &["role", "content"], &at)?;
        let content = o
            .get("content")
            .filter(|c| !c.is_null())
            .ok_or_else(|| ApiError::field(format!("{at}.content"), format!("`{at}.content` is required")))?;
        match o.get("role").and_then(Value::as_str) {
            Some("user") => user_turn(content, &format!("{at}.content"), &mut out)?,
            Some("assistant") if i + 1 == list.len() => {
                return Err(ApiError::unsupported(
                    format!("{at}.role"),
                    "a final assistant message (prefill) is not supported: the last message must be from the user",
                ));
            }
            Some("assistant") => out.push(assistant_turn(content, &format!("{at}.content"))?),
            _ => {
                return Err(ApiError::field(
                    format!("{at}.role"),
                    format!("`{at}.role` must be \"user\" or \"assistant\""),
                ));
            }
        }
    }
    Ok(out)
}

fn refuse_block(kind: &str, at: &str) -> ApiError {
    let kind: String = kind.chars().take(64).collect();
    let what = match kind.as_str() {
        "image" | "document" => {
            format!("`{at}`: {kind} blocks are not supported (this model reads text only)")
        }
        _ => format!("`{at}`: content blocks of type `{kind}` are not supported here"),
    };
    ApiError::unsupported(at, what)
}

/// A user turn: text blocks → user messages, `tool_result` blocks → tool messages, in order.
fn user_turn(content: &Value, at: &str, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let Value::Array(blocks) = content else {
        out.push(ChatMessage::new("user", string(content, at)?));
        return Ok(());
    };
    let mut text: Option<Vec<String>> = None;
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}[{j}]");
        let o = obj(b, &at)?;
        match o.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" => text.get_or_insert_with(Vec::new).push(text_of(o, &at)?),
            "tool_result" => {
                if let Some(t) = text.take() {
                    out.push(ChatMessage::new("user", t.join("\n")));
                }
                out.push(tool_result(o, &at)?);
            }
            kind => return Err(refuse_block(kind, &at)),
        }
    }
    if let Some(t) = text {
        out.push(ChatMessage::new("user", t.join("\n")));
    }
    Ok(())
}

/// `{type: tool_result, tool_use_id, content?, is_error?}` → a `tool` message.
fn tool_result(o: &Map<String, Value>, at: &str) -> Result<ChatMessage, ApiError> {
    only(o, &["type", "tool_use_id", "content", "is_error"], at)?;
    let id = string(
        o.get("tool_use_id").unwrap_or(&Value::Null),
        &format!("{at}.tool_use_id"),
    )?;
    if let Some(e) = o.get("is_error").filter(|e| !e.is_null()) {
        e.as_bool()
            .ok_or_else(|| ApiError::field(format!("{at}.is_error"), "`is_error` must be a boolean"))?;
    }
    let content = match o.get("content").filter(|c| !c.is_null()) {
        Some(c) => text_blocks(c, &format!("{at}.content"))?,
        None => String::new(),
    };
    let mut msg = ChatMessage::new("tool", content);
    msg.tool_call_id = Some(id.to_string());
    Ok(msg)
}

/// An assistant turn: text, thinking and `tool_use` blocks → one assistant message.
fn assistant_turn(content: &Value, at: &str) -> Result<ChatMessage, ApiError> {
    let Value::Array(blocks) = content else {
        return Ok(ChatMessage::new("assistant", string(content, at)?));
    };
    let (mut text, mut thinking, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}[{j}]");
        let o = obj(b, &at)?;
        match o.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" => text.push(text_of(o, &at)?),
            "thinking" => {
                only(o, &["type", "thinking", "signature"], &at)?;
                let t = string(
                    o.get("thinking").unwrap_or(&Value::Null),
                    &format!("{at}.thinking"),
                )?;
                thinking.push(t.to_string());
            }
            "tool_use" => calls.push(tool_use(o, &at)?),
            kind => return Err(refuse_block(kind, &at)),
        }
    }
    let mut msg = ChatMessage::new("assistant", text.join("\n"));
    msg.reasoning_content = (!thinking.is_empty()).then(|| thinking.join("\n"));
    msg.tool_calls = (!calls.is_empty()).then_some(calls);
    Ok(msg)
}

/// `{type: tool_use, id, name, input}` → an OpenAI-shaped call.
fn tool_use(o: &Map<String, Value>, at: &str) -> Result<Value, ApiError> {
    only(o, &["type", "id", "name", "input"], at)?;
    let id = string(o.get("id").unwrap_or(&Value::Null), &format!("{at}.id"))?;
    let name = string(o.get("name").unwrap_or(&Value::Null), &format!("{at}.name"))?;
    let input = match o.get("input") {
        Some(i @ Value::Object(_)) => i.to_string(),
        _ => {
            return Err(ApiError::field(
                format!("{at}.input"),
                format!("`{at}.input` must be an object"),
            ));
        }
    };
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}))
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
