//! Validation at the edge: a JSON body becomes a typed [`ChatRequest`] or [`CompletionRequest`]
//! or an OpenAI-shaped 400 naming the field. Fail closed: a field the server cannot honour
//! exactly is refused unless it has its neutral value (`n: 1`, `logit_bias: {}`,
//! `presence_penalty: 0`, `response_format: {"type": "text"}`, `tools: []` …), and unknown
//! fields are refused. `null` means absent, as OpenAI clients send it.
//!
//! Accepted without effect (documented as harmless): `user`, `metadata`, `service_tier`
//! (`auto`/`default`), `store: false`. Extensions: `top_k`, `min_p`, `repetition_penalty`,
//! `ignore_eos`, `chat_template_kwargs` (extra chat-template variables, e.g.
//! `{"thinking": true}`). The agent fields (`tools`, `tool_choice`, `response_format`,
//! `logit_bias`, `reasoning_effort`, history `tool_calls`) are validated in [`agent`].

use deltafin_engine::tokenizer::ChatMessage;
use serde_json::{Map, Value};

use crate::http::error::ApiError;

pub mod agent;
pub mod fields;
pub use agent::{FunctionTool, ResponseFormat, ToolChoice};

/// Most `n` choices per request.
pub const MAX_CHOICES: usize = 8;
/// Most `top_logprobs` per token.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Server-side bounds applied during validation.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Ceiling for `max_tokens` (and the chat default).
    pub max_tokens: usize,
    /// `max_tokens` default of `/v1/completions` (OpenAI's is 16).
    pub default_completion_tokens: usize,
}

/// Sampling settings (temperature 0 = greedy).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    /// `None`: a fresh random seed per request.
    pub seed: Option<u64>,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// 1 (or 0) = off.
    pub repetition_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
}

/// Fields both endpoints share.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Choices to generate (`n`).
    pub n: usize,
    /// Chat: `logprobs: true`; completions: `logprobs: k` (then `top_logprobs` is `k`).
    pub logprobs: bool,
    pub top_logprobs: usize,
    /// vLLM's `return_token_ids`: the response carries `prompt_token_ids` and each choice's
    /// `token_ids` (non-streamed responses).
    pub return_token_ids: bool,
}

/// A validated `/v1/chat/completions` request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub common: Common,
    pub messages: Vec<ChatMessage>,
    pub template_kwargs: Map<String, Value>,
    pub tools: Vec<FunctionTool>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    pub response_format: ResponseFormat,
    /// `reasoning_effort`: `Some(Some(e))` an effort, `Some(None)` thinking off.
    pub reasoning_effort: Option<Option<String>>,
}

impl ChatRequest {
    /// A request with these messages and every other field at its default.
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        ChatRequest {
            common: Common::new(),
            messages,
            template_kwargs: Map::new(),
            tools: Vec::new(),
            tool_choice: ToolChoice::None,
            parallel_tool_calls: true,
            response_format: ResponseFormat::Text,
            reasoning_effort: None,
        }
    }
}

/// A completions prompt: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

/// A validated `/v1/completions` request.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub common: Common,
    pub prompt: PromptInput,
}

const MAX_STOP: usize = 4;
const MAX_STOP_BYTES: usize = 256;

const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "user",
    "ignore_eos",
    "return_token_ids",
    "min_p",
    "repetition_penalty",
];
const CHAT: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "store",
    "metadata",
    "service_tier",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "functions",
    "function_call",
    "chat_template_kwargs",
];
const COMPLETIONS: &[&str] = &["prompt", "best_of", "echo", "suffix"];

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::field(what, format!("`{what}` must be a JSON object")))
}

fn check_names(body: &Map<String, Value>, extra: &[&str]) -> Result<(), ApiError> {
    match body
        .keys()
        .find(|k| !COMMON.contains(&k.as_str()) && !extra.contains(&k.as_str()))
    {
        Some(k) => Err(ApiError::unsupported(
            k.as_str(),
            format!("unknown or unsupported field `{}`", truncate(k)),
        )),
        None => Ok(()),
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn boolean(v: &Value, param: &str) -> Result<bool, ApiError> {
    v.as_bool()
        .ok_or_else(|| ApiError::field(param, format!("`{param}` must be a boolean")))
}

fn string<'a>(v: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    v.as_str()
        .ok_or_else(|| ApiError::field(param, format!("`{param}` must be a string")))
}

fn integer(v: &Value, param: &str, min: u64, max: u64) -> Result<u64, ApiError> {
    match v.as_u64() {
        Some(u) if (min..=max).contains(&u) => Ok(u),
        _ => Err(ApiError::field(
            param,
            format!("`{param}` must be an integer between {min} and {max}"),
        )),
    }
}

fn number(v: &Value, param: &str, min: f64, max: f64) -> Result<f64, ApiError> {
    match v.as_f64() {
        Some(x) if x.is_finite() && x >= min && x <= max => Ok(x),
        _ => Err(ApiError::field(
            param,
            format!("`{param}` must be a number between {min} and {max}"),
        )),
    }
}

/// A field that is accepted only with its neutral value.
fn neutral(param: &str, ok: bool, neutral: &str) -> Result<(), ApiError> {
    if ok {
        Ok(())
    } else {
        Err(ApiError::unsupported(
            param,
            format!("`{param}` is not supported by this server (only {neutral} is accepted)"),
        ))
    }
}

fn stop_strings(v: &Value) -> Result<Vec<String>, ApiError> {
    let list: Vec<&Value> = match v {
        Value::String(_) => vec![v],
        Value::Array(a) if a.len() <= MAX_STOP => a.iter().collect(),
        _ => {
            return Err(ApiError::field(
                "stop",
                format!("`stop` must be a string or an array of at most {MAX_STOP} strings"),
            ));
        }
    };
    list.into_iter()
        .map(|s| match s.as_str() {
            Some(s) if !s.is_empty() && s.len() <= MAX_STOP_BYTES => Ok(s.to_string()),
            _ => Err(ApiError::field(
                "stop",
                format!("each `stop` entry must be a non-empty string of at most {MAX_STOP_BYTES} bytes"),
            )),
        })
        .collect()
}

fn stream_options(v: &Value) -> Result<bool, ApiError> {
    let o = object(v, "stream_options")?;
    let mut include = false;
    for (k, v) in o {
        match k.as_str() {
            "include_usage" => include = v.is_null() || boolean(v, "stream_options.include_usage")?,
            _ => {
                let param = format!("stream_options.{}", truncate(k));
                return Err(ApiError::unsupported(
                    param.clone(),
                    format!("unknown field `{param}`"),
                ));
            }
        }
    }
    Ok(include)
}

impl Default for Common {
    fn default() -> Self {
        Common::new()
    }
}

impl Common {
    /// Every field at its default (temperature 1, no limits beyond the server's).
    pub fn new() -> Self {
        Common {
            model: None,
            max_tokens: None,
            stream: false,
            include_usage: false,
            sampling: SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                top_k: 0,
                seed: None,
                min_p: 0.0,
                presence_penalty: 0.0,
                frequency_penalty: 0.0,
                repetition_penalty: 1.0,
                logit_bias: Vec::new(),
            },
            stop: Vec::new(),
            ignore_eos: false,
            n: 1,
            logprobs: false,
            top_logprobs: 0,
            return_token_ids: false,
        }
    }

    /// Apply one shared field; `Ok(false)` if `key` is not a shared field.
    fn apply(&mut self, key: &str, v: &Value, limits: &Limits) -> Result<bool, ApiError> {
        match key {
            "model" => self.model = Some(string(v, key)?.to_string()),
            "max_tokens" | "max_completion_tokens" => {
                let n = integer(v, key, 1, limits.max_tokens as u64)? as usize;
                if self.max_tokens.is_some_and(|m| m != n) {
                    return Err(ApiError::field(
                        "max_completion_tokens",
                        "`max_tokens` and `max_completion_tokens` disagree",
                    ));
                }
                self.max_tokens = Some(n);
            }
            "stream" => self.stream = boolean(v, key)?,
            "stream_options" => self.include_usage = stream_options(v)?,
            "temperature" => self.sampling.temperature = number(v, key, 0.0, 2.0)? as f32,
            "top_p" => {
                let p = number(v, key, 0.0, 1.0)?;
                if p == 0.0 {
                    return Err(ApiError::field(
                        key,
                        "`top_p` must be greater than 0 (use temperature 0 for greedy)",
                    ));
                }
                self.sampling.top_p = p as f32;
            }
            "top_k" if v.as_i64() == Some(-1) => self.sampling.top_k = 0,
            "top_k" => self.sampling.top_k = integer(v, key, 0, u32::MAX as u64)? as usize,
            "seed" => self.sampling.seed = Some(seed(v)?),
            "stop" => self.stop = stop_strings(v)?,
            "ignore_eos" => self.ignore_eos = boolean(v, key)?,
            "return_token_ids" => self.return_token_ids = boolean(v, key)?,
            "user" => drop(string(v, key)?),
            "n" => self.n = integer(v, key, 1, MAX_CHOICES as u64)? as usize,
            "frequency_penalty" => self.sampling.frequency_penalty = number(v, key, -2.0, 2.0)? as f32,
            "presence_penalty" => self.sampling.presence_penalty = number(v, key, -2.0, 2.0)? as f32,
            "repetition_penalty" => {
                let r = number(v, key, 0.0, 2.0)?;
                if r == 0.0 {
                    return Err(ApiError::field(
                        key,
                        "`repetition_penalty` must be greater than 0",
                    ));
                }
                self.sampling.repetition_penalty = r as f32;
            }
            "min_p" => self.sampling.min_p = number(v, key, 0.0, 1.0)? as f32,
            "logit_bias" => self.sampling.logit_bias = agent::parse_logit_bias(v)?,
            "logprobs" => self.logprobs = boolean(v, key)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn check(&self) -> Result<(), ApiError> {
        if self.include_usage && !self.stream {
            return Err(ApiError::field(
                "stream_options",
                "`stream_options` is only allowed when `stream` is true",
            ));
        }
        Ok(())
    }
}

fn seed(v: &Value) -> Result<u64, ApiError> {
    match (v.as_u64(), v.as_i64()) {
        (Some(u), _) => Ok(u),
        (None, Some(i)) => Ok(i as u64),
        _ => Err(ApiError::field("seed", "`seed` must be a 64-bit integer")),
    }
}

/// Validate a `/v1/chat/completions` body.
pub fn parse_chat(body: &Value, limits: &Limits) -> Result<ChatRequest, ApiError> {
    let body = object(body, "body")?;
    check_names(body, CHAT)?;
    let mut req = ChatRequest::new(Vec::new());
    let mut messages = None;
    let mut tool_choice = None;
    let mut top_logprobs = None;
    for (key, v) in body.iter().filter(|(_, v)| !v.is_null()) {
        if req.common.apply(key, v, limits)? {
            continue;
        }
        match key.as_str() {
            "messages" => messages = Some(parse_messages(v)?),
            "chat_template_kwargs" => req.template_kwargs = object(v, key)?.clone(),
            "parallel_tool_calls" => req.parallel_tool_calls = boolean(v, key)?,
            "metadata" => drop(object(v, key)?),
            "store" => neutral(key, v == &Value::Bool(false), "false")?,
            "service_tier" => neutral(
                key,
                matches!(v.as_str(), Some("auto" | "default")),
                "\"auto\" or \"default\"",
            )?,
            "top_logprobs" => top_logprobs = Some(integer(v, key, 0, MAX_TOP_LOGPROBS as u64)? as usize),
            "tools" => req.tools = agent::parse_tools(v)?,
            "tool_choice" => tool_choice = Some(v.clone()),
            "response_format" => req.response_format = agent::parse_response_format(v)?,
            "reasoning_effort" => req.reasoning_effort = Some(agent::parse_reasoning_effort(v)?),
            "modalities" => neutral(key, v == &serde_json::json!(["text"]), "[\"text\"]")?,
            other => neutral(other, false, "null")?,
        }
    }
    req.common.check()?;
    if let Some(k) = top_logprobs {
        if k > 0 && !req.common.logprobs {
            return Err(ApiError::field(
                "top_logprobs",
                "`top_logprobs` requires `logprobs` to be true",
            ));
        }
        req.common.top_logprobs = k;
    }
    req.tool_choice = match tool_choice {
        Some(v) => agent::parse_tool_choice(&v, &req.tools)?,
        None if req.tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
    };
    req.messages = messages.ok_or_else(|| ApiError::field("messages", "`messages` is required"))?;
    Ok(req)
}

/// Validate a `/v1/completions` body.
pub fn parse_completion(body: &Value, limits: &Limits) -> Result<CompletionRequest, ApiError> {
    let body = object(body, "body")?;
    check_names(body, COMPLETIONS)?;
    let mut common = Common::new();
    let mut prompt = None;
    for (key, v) in body.iter().filter(|(_, v)| !v.is_null()) {
        if key == "logprobs" {
            let k = integer(v, key, 0, 5)? as usize;
            common.logprobs = true;
            common.top_logprobs = k;
            continue;
        }
        if common.apply(key, v, limits)? {
            continue;
        }
        match key.as_str() {
            "prompt" => prompt = Some(parse_prompt(v)?),
            "best_of" => neutral(key, v.as_u64() == Some(1), "1")?,
            "echo" => neutral(key, v == &Value::Bool(false), "false")?,
            "suffix" => neutral(key, v.as_str() == Some(""), "\"\"")?,
            other => neutral(other, false, "null")?,
        }
    }
    common.check()?;
    common.max_tokens = Some(
        common
            .max_tokens
            .unwrap_or(limits.default_completion_tokens.min(limits.max_tokens)),
    );
    let prompt = prompt.ok_or_else(|| ApiError::field("prompt", "`prompt` is required"))?;
    Ok(CompletionRequest { common, prompt })
}

fn parse_prompt(v: &Value) -> Result<PromptInput, ApiError> {
    let many = || {
        ApiError::unsupported(
            "prompt",
            "`prompt` must be one string or one array of token ids (batches are not supported)",
        )
    };
    match v {
        Value::String(s) => Ok(PromptInput::Text(s.clone())),
        Value::Array(a) if a.len() == 1 && (a[0].is_string() || a[0].is_array()) => parse_prompt(&a[0]),
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_number) => {
            let ids = a
                .iter()
                .map(|x| x.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as u32));
            let ids: Option<Vec<u32>> = ids.collect();
            ids.map(PromptInput::Ids).ok_or_else(|| {
                ApiError::field("prompt", "token ids in `prompt` must be non-negative integers")
            })
        }
        Value::Array(a) if a.len() > 1 => Err(many()),
        _ => Err(ApiError::field(
            "prompt",
            "`prompt` must be a non-empty string or array of token ids",
        )),
    }
}

fn parse_messages(v: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let list = v.as_array().filter(|a| !a.is_empty());
    let list = list.ok_or_else(|| ApiError::field("messages", "`messages` must be a non-empty array"))?;
    list.iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m))
        .collect()
}

fn parse_message(i: usize, v: &Value) -> Result<ChatMessage, ApiError> {
    let at = |f: &str| format!("messages[{i}].{f}");
    let m = v.as_object().ok_or_else(|| {
        ApiError::field(
            format!("messages[{i}]"),
            format!("`messages[{i}]` must be an object"),
        )
    })?;
    let role = match m.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => "system",
        Some(r @ ("user" | "assistant" | "tool")) => r,
        Some("function") => {
            let msg = format!(
                "`{}`: the legacy role `function` is not supported; use `tool`",
                at("role")
            );
            return Err(ApiError::unsupported(at("role"), msg));
        }
        _ => {
            return Err(ApiError::field(
                at("role"),
                format!(
                    "`{}` must be one of system, developer, user, assistant, tool",
                    at("role")
                ),
            ));
        }
    };
    let mut msg = ChatMessage::new(role, String::new());
    for (key, v) in m.iter().filter(|(_, v)| !v.is_null()) {
        match key.as_str() {
            "role" => {}
            "content" => msg.content = content(v, &at("content"))?,
            "name" => msg.name = Some(string(v, &at("name"))?.to_string()),
            "reasoning_content" if role == "assistant" => {
                msg.reasoning_content = Some(string(v, &at("reasoning_content"))?.to_string())
            }
            "tool_calls" if role == "assistant" => {
                let calls = agent::parse_history_calls(v, &at("tool_calls"))?;
                msg.tool_calls = (!calls.is_empty()).then_some(calls);
            }
            "tool_call_id" if role == "tool" => {
                msg.tool_call_id = Some(string(v, &at("tool_call_id"))?.to_string())
            }
            "refusal" if role == "assistant" => drop(string(v, &at("refusal"))?),
            other => {
                let param = at(truncate(other));
                return Err(ApiError::unsupported(
                    param.clone(),
                    format!("unsupported message field `{param}`"),
                ));
            }
        }
    }
    if role == "tool" && msg.tool_call_id.is_none() {
        return Err(ApiError::field(
            at("tool_call_id"),
            format!("`{}` is required for role `tool`", at("tool_call_id")),
        ));
    }
    if !m.contains_key("content") && role != "assistant" {
        return Err(ApiError::field(
            at("content"),
            format!("`{}` is required", at("content")),
        ));
    }
    Ok(msg)
}

/// Message content: a string, or text parts (joined with newlines).
fn content(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let texts = parts.iter().enumerate().map(|(j, p)| {
                let o = p.as_object().filter(|o| o.get("type") == Some(&Value::from("text")));
                match o.and_then(|o| o.get("text")).and_then(Value::as_str) {
                    Some(t) if o.is_some_and(|o| o.len() == 2) => Ok(t),
                    _ => Err(ApiError::unsupported(
                        format!("{param}[{j}]"),
                        format!("`{param}[{j}]`: only text content parts ({{\"type\": \"text\", \"text\": …}}) are supported"),
                    )),
                }
            });
            Ok(texts.collect::<Result<Vec<_>, _>>()?.join("\n"))
        }
        _ => Err(ApiError::field(
            param,
            format!("`{param}` must be a string or an array of text parts"),
        )),
    }
}

#[cfg(test)]
mod tests;
