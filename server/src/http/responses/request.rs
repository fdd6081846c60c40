//! A Responses API body becomes a typed [`ResponsesRequest`]: the [`ChatRequest`] the chat
//! pipeline runs (its messages are this turn's input only; the handler prepends the
//! instructions and a previous response's conversation), plus what the response object echoes.
//! Fail closed: non-function tools, images and files, `conversation`, `background` and
//! anything else this server cannot honour is a 400 naming the field (agent-api.md §6).

use serde_json::{Map, Value};

use super::input::parse_input;
use crate::http::error::ApiError;
use crate::http::openai::request::agent::{self, FunctionTool, ResponseFormat, ToolChoice};
use crate::http::openai::request::fields::{boolean, neutral, number, obj, only, string};
use crate::http::openai::request::{ChatRequest, Limits};

/// A validated `/v1/responses` request.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    /// Sampling, tools and format; `messages` holds this turn's input items.
    pub chat: ChatRequest,
    pub instructions: Option<String>,
    pub previous_response_id: Option<String>,
    /// Keep the finished response for a later `previous_response_id` (default true).
    pub store: bool,
    pub metadata: Map<String, Value>,
    /// The request's `tools` and `tool_choice`, echoed in the response object.
    pub tools_echo: Value,
    pub tool_choice_echo: Value,
}

const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "text",
    "reasoning",
    "stream",
    "store",
    "previous_response_id",
    "metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "truncation",
    "service_tier",
    "include",
    "top_logprobs",
    "background",
];

/// Validate a `/v1/responses` body.
pub fn parse(body: &Value, limits: &Limits) -> Result<ResponsesRequest, ApiError> {
    let body = obj(body, "body")?;
    if let Some(k) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        let k: String = k.chars().take(64).collect();
        return Err(ApiError::unsupported(
            k.clone(),
            format!("unknown or unsupported field `{k}`"),
        ));
    }
    let mut out = ResponsesRequest {
        chat: ChatRequest::new(Vec::new()),
        instructions: None,
        previous_response_id: None,
        store: true,
        metadata: Map::new(),
        tools_echo: Value::Array(Vec::new()),
        tool_choice_echo: Value::from("auto"),
    };
    let mut input = None;
    let mut tool_choice = None;
    for (key, v) in body.iter().filter(|(_, v)| !v.is_null()) {
        let req = &mut out.chat;
        match key.as_str() {
            "model" => req.common.model = Some(string(v, key)?.to_string()),
            "input" => input = Some(parse_input(v)?),
            "instructions" => out.instructions = Some(string(v, key)?.to_string()),
            "tools" => {
                req.tools = parse_tools(v)?;
                out.tools_echo = v.clone();
            }
            "tool_choice" => tool_choice = Some(v),
            "parallel_tool_calls" => req.parallel_tool_calls = boolean(v, key)?,
            "max_output_tokens" => match v.as_u64() {
                Some(n) if (1..=limits.max_tokens as u64).contains(&n) => {
                    req.common.max_tokens = Some(n as usize)
                }
                _ => {
                    return Err(ApiError::field(
                        key,
                        format!("`{key}` must be an integer between 1 and {}", limits.max_tokens),
                    ));
                }
            },
            "temperature" => req.common.sampling.temperature = number(v, key, 0.0, 2.0)? as f32,
            "top_p" => match number(v, key, 0.0, 1.0)? {
                p if p > 0.0 => req.common.sampling.top_p = p as f32,
                _ => return Err(ApiError::field(key, "`top_p` must be greater than 0")),
            },
            "text" => req.response_format = parse_text(v)?,
            "reasoning" => req.reasoning_effort = parse_reasoning(v)?,
            "stream" => req.common.stream = boolean(v, key)?,
            "store" => out.store = boolean(v, key)?,
            "previous_response_id" => out.previous_response_id = Some(string(v, key)?.to_string()),
            "metadata" => out.metadata = obj(v, key)?.clone(),
            "user" | "safety_identifier" | "prompt_cache_key" => drop(string(v, key)?),
            "truncation" => neutral(key, v.as_str() == Some("disabled"), "\"disabled\"")?,
            "service_tier" => neutral(key, matches!(v.as_str(), Some("auto" | "default")), "\"auto\"")?,
            "include" => neutral(key, v.as_array().is_some_and(Vec::is_empty), "[]")?,
            "top_logprobs" => neutral(key, v.as_u64() == Some(0), "0")?,
            "background" => neutral(key, v == &Value::Bool(false), "false")?,
            other => neutral(other, false, "null")?,
        }
    }
    let chat = &mut out.chat;
    chat.tool_choice = match tool_choice {
        Some(v) => {
            out.tool_choice_echo = v.clone();
            parse_tool_choice(v, &chat.tools)?
        }
        None if chat.tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
    };
    chat.messages = input.ok_or_else(|| ApiError::field("input", "`input` is required"))?;
    Ok(out)
}

/// Flat function tools `{type: "function", name, description?, parameters?, strict?}`.
fn parse_tools(v: &Value) -> Result<Vec<FunctionTool>, ApiError> {
    agent::tool_list(v, "name", |o, at| {
        agent::function_type(o, at)?;
        only(o, &["type", "name", "description", "parameters", "strict"], at)?;
        agent::function_from_parts(
            o.get("name"),
            o.get("description"),
            o.get("parameters"),
            o.get("strict"),
            at,
            "parameters",
        )
    })
}

/// `none` | `auto` | `required` | `{type: "function", name}`.
fn parse_tool_choice(v: &Value, tools: &[FunctionTool]) -> Result<ToolChoice, ApiError> {
    let invalid = || ApiError::field("tool_choice", "$.tool_choice is invalid");
    let choice = match v {
        Value::String(s) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" if tools.is_empty() => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => return Err(invalid()),
        },
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            only(o, &["type", "name"], "tool_choice")?;
            let name = o.get("name").and_then(Value::as_str).ok_or_else(invalid)?;
            ToolChoice::Named(name.to_string())
        }
        _ => return Err(invalid()),
    };
    agent::check_choice(&choice, tools, "tool_choice")?;
    Ok(choice)
}

/// `text: {format?: {type: text | json_object | json_schema, …}, verbosity?: "medium"}`.
fn parse_text(v: &Value) -> Result<ResponseFormat, ApiError> {
    let o = obj(v, "text")?;
    only(o, &["format", "verbosity"], "text")?;
    if let Some(verbosity) = o.get("verbosity").filter(|v| !v.is_null()) {
        neutral(
            "text.verbosity",
            verbosity.as_str() == Some("medium"),
            "\"medium\"",
        )?;
    }
    let Some(f) = o.get("format").filter(|f| !f.is_null()) else {
        return Ok(ResponseFormat::Text);
    };
    let fo = obj(f, "text.format")?;
    match fo.get("type").and_then(Value::as_str) {
        Some("text") => only(fo, &["type"], "text.format").map(|_| ResponseFormat::Text),
        Some("json_object") => only(fo, &["type"], "text.format").map(|_| ResponseFormat::JsonObject),
        Some("json_schema") => agent::json_schema_format(f, "text.format"),
        _ => Err(ApiError::field(
            "text.format.type",
            "`text.format.type` must be one of text, json_object, json_schema",
        )),
    }
}

/// `reasoning: {effort?, summary?}` → `reasoning_effort` (`None`: the model's default).
/// Summaries are not generated: the reasoning comes back as `reasoning_text` content.
fn parse_reasoning(v: &Value) -> Result<Option<Option<String>>, ApiError> {
    let o = obj(v, "reasoning")?;
    only(o, &["effort", "summary", "generate_summary"], "reasoning")?;
    for key in ["summary", "generate_summary"] {
        if let Some(s) = o.get(key).filter(|s| !s.is_null()) {
            let ok = matches!(s.as_str(), Some("auto" | "concise" | "detailed"));
            if !ok {
                return Err(ApiError::field(
                    format!("reasoning.{key}"),
                    format!("`reasoning.{key}` must be one of auto, concise, detailed"),
                ));
            }
        }
    }
    match o.get("effort").filter(|e| !e.is_null()) {
        Some(e) => agent::parse_reasoning_effort(e).map(Some).map_err(|e| {
            ApiError::field(
                "reasoning.effort",
                e.to_string().replace("reasoning_effort", "reasoning.effort"),
            )
        }),
        None => Ok(None),
    }
}
