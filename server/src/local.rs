//! In-process requests: an OpenAI `/v1/chat/completions` or `/v1/completions` body taken
//! through exactly what the HTTP handlers do (the same parsing and validation, prompt rendering,
//! decode options, engine loop and output parsing), without HTTP. `deltafin run` is a client of
//! this, so `run` and `serve` are one program: the same request gives the same ids.

use std::time::Instant;

use deltafin_engine::generate::GenerationStats;
use serde_json::Value;

use crate::http::error::ApiError;
use crate::http::openai::chat;
use crate::http::openai::generation::Step;
use crate::http::openai::handlers::start_completion;
use crate::http::openai::request::{parse_chat, parse_completion};
use crate::metrics::Endpoint;
use crate::state::AppState;

/// Which endpoint the body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalEndpoint {
    Chat,
    Completions,
}

/// What one in-process request produced (its first choice).
#[derive(Debug, Clone)]
pub struct LocalOutcome {
    pub prompt_ids: Vec<u32>,
    /// Every generated id, stop ids included.
    pub output_ids: Vec<u32>,
    /// The OpenAI finish reason (`stop`, `length`, `tool_calls`).
    pub finish_reason: &'static str,
    /// Prefill from submission to the first generated token, decode from there to the end.
    pub stats: GenerationStats,
}

/// Why an in-process request failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// Refused or failed as the HTTP endpoint would answer it.
    #[error("{0}")]
    Api(#[from] ApiError),
    /// The engine failed the generation; its own message (an HTTP client sees a generic 500).
    #[error("{0}")]
    Engine(String),
}

/// Run `body` as `endpoint` would. `on_ids` sees the ids generated so far after each step and
/// returns `false` to stop (the request is then cancelled, as a disconnected client's is).
pub async fn request(
    app: &AppState,
    endpoint: LocalEndpoint,
    body: &Value,
    mut on_ids: impl FnMut(&[u32]) -> bool,
) -> Result<LocalOutcome, LocalError> {
    let started = Instant::now();
    let limits = &app.config().limits;
    let mut run = match endpoint {
        LocalEndpoint::Chat => chat::start(app, &parse_chat(body, limits)?, Endpoint::Chat, started)?,
        LocalEndpoint::Completions => start_completion(app, &parse_completion(body, limits)?, started)?,
    };
    let mut generation = run.choices.swap_remove(0);
    let mut first_token: Option<Instant> = None;
    let mut finish_reason = "length";
    while let Some(step) = generation.next().await {
        if first_token.is_none() && !generation.output_ids().is_empty() {
            first_token = Some(Instant::now());
        }
        match step {
            Step::Text(_) => {}
            Step::Finished { reason, .. } => finish_reason = reason,
            Step::Failed(e) => {
                return Err(match generation.failure() {
                    Some(message) => LocalError::Engine(message.to_string()),
                    None => LocalError::Api(e),
                });
            }
        }
        if !on_ids(generation.output_ids()) {
            break;
        }
    }
    let first = first_token.unwrap_or_else(Instant::now);
    let output_ids = generation.output_ids().to_vec();
    Ok(LocalOutcome {
        stats: GenerationStats::from_timings(
            run.prompt.len(),
            output_ids.len(),
            first.duration_since(started),
            first.elapsed(),
        ),
        prompt_ids: run.prompt,
        output_ids,
        finish_reason,
    })
}
