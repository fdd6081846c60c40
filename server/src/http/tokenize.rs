//! `POST /tokenize` and `POST /detokenize`, as vLLM serves them: the exact ids a request
//! becomes, for agents and operators counting context and for prompt-parity tests against each
//! model's own tokenizer and chat template.
//!
//! * `{model?, prompt, add_special_tokens = true, return_token_strs = false}`: the ids of a raw
//!   prompt as `/v1/completions` encodes it (`tokenizer(text)["input_ids"]`: the model's own
//!   tokenizer adds what it adds); with `add_special_tokens: false` nothing is added.
//! * `{model?, messages, tools?, tool_choice?, chat_template_kwargs?, add_generation_prompt =
//!   true, …}`: the ids of a chat request rendered through the model's own chat template exactly
//!   as `/v1/chat/completions` renders it (the same validation and rendering code).
//! * Both return `{count, max_model_len, tokens}` (and `token_strs` when asked).
//! * `{model?, tokens}` to `/detokenize` returns `{prompt}`: the text of the ids, special tokens
//!   included.
//!
//! Behind the same key as `/v1`; prepared on the blocking pool like a generation request.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::http::body::JsonBody;
use crate::http::error::ApiError;
use crate::http::openai::chat;
use crate::http::openai::handlers::check_model;
use crate::http::openai::request::{ChatRequest, Common, parse_chat};
use crate::state::{AppState, Loaded};

/// Fields of `/tokenize` beyond the chat request's own.
const TOKENIZE_ONLY: &[&str] = &[
    "add_generation_prompt",
    "add_special_tokens",
    "return_token_strs",
    "continue_final_message",
];

/// `POST /tokenize`.
pub async fn tokenize(State(app): State<AppState>, body: Result<JsonBody, ApiError>) -> Response {
    answer(app, body, tokenize_body).await
}

/// `POST /detokenize`.
pub async fn detokenize(State(app): State<AppState>, body: Result<JsonBody, ApiError>) -> Response {
    answer(app, body, |_, loaded, body| detokenize_body(loaded, body)).await
}

/// `f`'s answer to the body, computed on the preparation pool.
async fn answer(
    app: AppState,
    body: Result<JsonBody, ApiError>,
    f: fn(&AppState, &Loaded, &Value) -> Result<Value, ApiError>,
) -> Response {
    let prep = app.clone();
    let answer = app
        .prepare(move || {
            let JsonBody(body) = body?;
            let loaded = prep.loaded()?;
            f(&prep, &loaded, &body)
        })
        .await;
    match answer {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn object(body: &Value) -> Result<&Map<String, Value>, ApiError> {
    body.as_object()
        .ok_or_else(|| ApiError::field("body", "the body must be a JSON object"))
}

fn flag(body: &Map<String, Value>, key: &str, default: bool) -> Result<bool, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::field(key, format!("`{key}` must be a boolean"))),
    }
}

fn model_of(body: &Map<String, Value>) -> Result<Common, ApiError> {
    let model = match body.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::field("model", "`model` must be a string")),
    };
    let mut common = ChatRequest::new(Vec::new()).common;
    common.model = model;
    Ok(common)
}

/// The answer to a `/tokenize` body.
pub fn tokenize_body(app: &AppState, loaded: &Loaded, body: &Value) -> Result<Value, ApiError> {
    let fields = object(body)?;
    check_model(loaded, &model_of(fields)?)?;
    let strs = flag(fields, "return_token_strs", false)?;
    let tokens = match (fields.get("messages"), fields.get("prompt")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "prompt",
                "send either `prompt` or `messages`, not both",
            ));
        }
        (Some(_), None) => chat_ids(app, loaded, fields)?,
        (None, Some(Value::String(text))) => {
            check_only(
                fields,
                &["model", "prompt", "add_special_tokens", "return_token_strs"],
            )?;
            match flag(fields, "add_special_tokens", true)? {
                true => loaded.tokenizer.encode_prompt(text),
                false => loaded.tokenizer.encode_with_special(text),
            }
        }
        (None, Some(_)) => return Err(ApiError::field("prompt", "`prompt` must be a string")),
        (None, None) => {
            return Err(ApiError::field(
                "prompt",
                "`prompt` (a string) or `messages` is required",
            ));
        }
    };
    let mut answer = json!({
        "count": tokens.len(),
        "max_model_len": loaded.engine.context_limit(),
        "tokens": tokens,
    });
    if strs {
        let text: Vec<String> = tokens
            .iter()
            .map(|&t| loaded.tokenizer.id_to_token(t).unwrap_or_default())
            .collect();
        answer["token_strs"] = json!(text);
    }
    Ok(answer)
}

/// Refuse a field outside `allowed` (a raw prompt takes no chat fields).
fn check_only(fields: &Map<String, Value>, allowed: &[&str]) -> Result<(), ApiError> {
    match fields.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(ApiError::unsupported(
            k.as_str(),
            format!("`{k}` is not a field of a `prompt` tokenize request"),
        )),
        None => Ok(()),
    }
}

/// A chat request's ids, validated and rendered as `/v1/chat/completions` does.
fn chat_ids(app: &AppState, loaded: &Loaded, fields: &Map<String, Value>) -> Result<Vec<u32>, ApiError> {
    if flag(fields, "continue_final_message", false)? {
        return Err(ApiError::unsupported(
            "continue_final_message",
            "`continue_final_message` is not supported: the prompt always ends after the last message",
        ));
    }
    if flag(fields, "add_special_tokens", false)? {
        return Err(ApiError::unsupported(
            "add_special_tokens",
            "`add_special_tokens` must be false with `messages`: the chat template already writes the model's special tokens",
        ));
    }
    let generation_prompt = flag(fields, "add_generation_prompt", true)?;
    let chat_fields: Map<String, Value> = fields
        .iter()
        .filter(|(k, _)| !TOKENIZE_ONLY.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let req = parse_chat(&Value::Object(chat_fields), &app.config().limits)?;
    Ok(chat::render_with(loaded, &req, generation_prompt)?.0)
}

/// The answer to a `/detokenize` body.
pub fn detokenize_body(loaded: &Loaded, body: &Value) -> Result<Value, ApiError> {
    let fields = object(body)?;
    check_model(loaded, &model_of(fields)?)?;
    check_only(fields, &["model", "tokens"])?;
    let Some(Value::Array(items)) = fields.get("tokens") else {
        return Err(ApiError::field(
            "tokens",
            "`tokens` (an array of token ids) is required",
        ));
    };
    let size = loaded.vocab_size;
    let ids = items
        .iter()
        .map(|v| match v.as_u64() {
            Some(id) if id < size as u64 && loaded.tokenizer.id_to_token(id as u32).is_some() => {
                Ok(id as u32)
            }
            _ => Err(ApiError::field(
                "tokens",
                format!("`tokens` holds {v}, not a token id of this model's vocabulary"),
            )),
        })
        .collect::<Result<Vec<u32>, ApiError>>()?;
    Ok(json!({"prompt": loaded.tokenizer.decode(&ids)}))
}
