//! The `/v1` handlers: validate → tokenize → submit → JSON body or SSE stream. Everything that
//! can be refused is refused before a stream starts, so errors carry real HTTP statuses.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use deltafin_engine::generate::Sampling;
use deltafin_engine::scheduler::GenRequest;
use deltafin_engine::spec::RequestKind;
use deltafin_engine::tokenizer::ChatOptions;
use futures_util::Stream;

use super::generation::{Generation, Step};
use super::output::{Delta, OutputParser};
use super::request::{ChatRequest, Common, CompletionRequest, PromptInput, parse_chat, parse_completion};
use super::types::{
    AssistantMessage, ChatChoice, ChatCompletion, ChunkHeader, Completion, CompletionChoice, ModelCard,
    ModelList,
};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::state::{AppState, Loaded};

/// `GET /v1/models`.
pub async fn models(State(app): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    let loaded = app
        .loaded()
        .inspect_err(|e| app.metrics().request(Endpoint::Models, e.outcome()))?;
    app.metrics().request(Endpoint::Models, "success");
    let card = ModelCard {
        id: loaded.model_id.clone(),
        object: "model",
        created: loaded.created,
        owned_by: "deltafin",
        max_model_len: loaded.engine.context_limit(),
    };
    Ok(Json(ModelList {
        object: "list",
        data: vec![card],
    }))
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(app): State<AppState>, body: Result<JsonBody, ApiError>) -> Response {
    let started = Instant::now();
    match start_chat(&app, body, started) {
        Ok(run) => run.respond(&app).await,
        Err(e) => refuse(&app, Endpoint::Chat, e),
    }
}

/// `POST /v1/completions`.
pub async fn completions(State(app): State<AppState>, body: Result<JsonBody, ApiError>) -> Response {
    let started = Instant::now();
    match start_completion(&app, body, started) {
        Ok(run) => run.respond(&app).await,
        Err(e) => refuse(&app, Endpoint::Completions, e),
    }
}

fn refuse(app: &AppState, endpoint: Endpoint, e: ApiError) -> Response {
    app.metrics().request(endpoint, e.outcome());
    tracing::info!(endpoint = endpoint.label(), status = e.status().as_u16(), error = %e, "request refused");
    e.into_response()
}

/// A submitted request and how to present it.
struct Run {
    generation: Generation,
    header: ChunkHeader,
    endpoint: Endpoint,
    stream: bool,
}

fn check_model(loaded: &Loaded, common: &Common) -> Result<(), ApiError> {
    match &common.model {
        Some(m) if m != &loaded.model_id => Err(ApiError::ModelNotFound(m.chars().take(128).collect())),
        _ => Ok(()),
    }
}

fn sampling(common: &Common) -> Result<Sampling, ApiError> {
    let s = common.sampling;
    let seed = s.seed.unwrap_or_else(random_seed);
    Sampling::new(s.temperature, s.top_p, s.top_k, seed)
        .map_err(|e| ApiError::field("temperature", e.to_string()))
}

/// A seed for requests that did not ask for reproducibility.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn response_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", random_seed())
}

fn build(
    app: &AppState,
    loaded: &Loaded,
    endpoint: Endpoint,
    common: &Common,
    prompt: Vec<u32>,
    parser: OutputParser,
    started: Instant,
) -> Result<Run, ApiError> {
    let limit = loaded.engine.context_limit();
    if prompt.len() > limit {
        let param = if endpoint == Endpoint::Chat {
            "messages"
        } else {
            "prompt"
        };
        return Err(ApiError::ContextLength {
            param,
            needed: prompt.len(),
            limit,
        });
    }
    let mut stop_ids = Vec::new();
    if !common.ignore_eos {
        stop_ids.extend(&loaded.stop_ids);
        if endpoint == Endpoint::Chat {
            stop_ids.extend(&loaded.chat_stop_ids);
        }
    }
    let req = GenRequest {
        prompt,
        max_new_tokens: common.max_tokens.unwrap_or(app.config().limits.max_tokens),
        sampling: sampling(common)?,
        stop_ids,
        reuse_state: true,
        kind: if endpoint == Endpoint::Chat {
            RequestKind::Chat
        } else {
            RequestKind::Completion
        },
        spec: app.config().spec,
    };
    let generation = Generation::submit(app, loaded, endpoint, req, parser, started)?;
    let prefix = if endpoint == Endpoint::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let header = ChunkHeader {
        id: response_id(prefix),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: loaded.model_id.clone(),
        include_usage: common.include_usage,
    };
    Ok(Run {
        generation,
        header,
        endpoint,
        stream: common.stream,
    })
}

fn start_chat(app: &AppState, body: Result<JsonBody, ApiError>, started: Instant) -> Result<Run, ApiError> {
    let loaded = app.loaded()?;
    let JsonBody(body) = body?;
    let req: ChatRequest = parse_chat(&body, &app.config().limits)?;
    check_model(&loaded, &req.common)?;
    let opts = ChatOptions {
        add_generation_prompt: true,
        extra: req.template_kwargs.clone(),
        ..Default::default()
    };
    let prompt = loaded.tokenizer.encode_chat(&req.messages, &opts).map_err(|e| {
        ApiError::field(
            "messages",
            format!("the chat template cannot render these messages: {e}"),
        )
    })?;
    if app.config().log_prompts {
        tracing::info!(messages = ?req.messages, "chat prompt");
    }
    let parser = OutputParser::new(
        Arc::clone(&loaded.tokenizer),
        loaded.markers.clone(),
        &prompt,
        req.common.stop.clone(),
    );
    build(app, &loaded, Endpoint::Chat, &req.common, prompt, parser, started)
}

fn start_completion(
    app: &AppState,
    body: Result<JsonBody, ApiError>,
    started: Instant,
) -> Result<Run, ApiError> {
    let loaded = app.loaded()?;
    let JsonBody(body) = body?;
    let req: CompletionRequest = parse_completion(&body, &app.config().limits)?;
    check_model(&loaded, &req.common)?;
    let prompt = match &req.prompt {
        PromptInput::Ids(ids) => ids.clone(),
        PromptInput::Text(text) => {
            if app.config().log_prompts {
                tracing::info!(prompt = %text, "completion prompt");
            }
            loaded
                .bos
                .into_iter()
                .chain(loaded.tokenizer.encode(text))
                .collect()
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::field("prompt", "`prompt` must not be empty"));
    }
    let parser = OutputParser::new(Arc::clone(&loaded.tokenizer), None, &[], req.common.stop.clone());
    build(
        app,
        &loaded,
        Endpoint::Completions,
        &req.common,
        prompt,
        parser,
        started,
    )
}

impl Run {
    async fn respond(self, app: &AppState) -> Response {
        if self.stream {
            let keep_alive = KeepAlive::new()
                .interval(app.config().keep_alive)
                .text("keep-alive");
            return Sse::new(self.into_stream())
                .keep_alive(keep_alive)
                .into_response();
        }
        self.collect().await
    }

    async fn collect(mut self) -> Response {
        let mut text = Delta::default();
        while let Some(step) = self.generation.next().await {
            match step {
                Step::Text(d) => text.extend(d),
                Step::Failed(e) => return e.into_response(),
                Step::Finished { reason, usage } => {
                    tracing::info!(
                        endpoint = self.endpoint.label(),
                        prompt_tokens = usage.prompt_tokens,
                        completion_tokens = usage.completion_tokens,
                        cached_tokens = usage.prompt_tokens_details.cached_tokens,
                        finish_reason = reason,
                        "request finished"
                    );
                    let h = &self.header;
                    return match self.endpoint {
                        Endpoint::Chat => {
                            let reasoning = (!text.reasoning.is_empty()).then_some(text.reasoning);
                            let message = AssistantMessage {
                                role: "assistant",
                                content: text.content,
                                reasoning_content: reasoning,
                            };
                            let choice = ChatChoice {
                                index: 0,
                                message,
                                logprobs: None,
                                finish_reason: reason,
                            };
                            let body = ChatCompletion {
                                id: h.id.clone(),
                                object: "chat.completion",
                                created: h.created,
                                model: h.model.clone(),
                                choices: vec![choice],
                                usage,
                            };
                            Json(body).into_response()
                        }
                        _ => {
                            let choice = CompletionChoice {
                                index: 0,
                                text: text.content,
                                logprobs: None,
                                finish_reason: Some(reason),
                            };
                            let body = Completion {
                                id: h.id.clone(),
                                object: "text_completion",
                                created: h.created,
                                model: h.model.clone(),
                                choices: vec![choice],
                                usage: Some(Some(usage)),
                            };
                            Json(body).into_response()
                        }
                    };
                }
            }
        }
        ApiError::Internal("generation ended without a result").into_response()
    }

    /// SSE: `data: {chunk}` events, then `data: [DONE]`. Dropping the stream (a client
    /// disconnect) drops the generation, which cancels it.
    fn into_stream(self) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
        let chat = self.endpoint == Endpoint::Chat;
        let mut first: Vec<String> = Vec::new();
        if chat {
            first.push(self.header.chat_role());
        }
        let state = (self, std::collections::VecDeque::from(first), false);
        futures_util::stream::unfold(state, move |(mut run, mut queue, mut ended)| async move {
            loop {
                if let Some(data) = queue.pop_front() {
                    return Some((Ok(SseEvent::default().data(data)), (run, queue, ended)));
                }
                if ended {
                    return None;
                }
                match run.generation.next().await {
                    Some(Step::Text(d)) => {
                        let h = &run.header;
                        queue.extend(if chat {
                            h.chat_delta(d)
                        } else {
                            h.completion_delta(d)
                        });
                    }
                    Some(Step::Finished { reason, usage }) => {
                        let h = &run.header;
                        queue.extend(if chat {
                            h.chat_finish(reason, usage)
                        } else {
                            h.completion_finish(reason, usage)
                        });
                        queue.push_back("[DONE]".to_string());
                        ended = true;
                    }
                    Some(Step::Failed(e)) => {
                        queue.push_back(e.body().to_string());
                        queue.push_back("[DONE]".to_string());
                        ended = true;
                    }
                    None => return None,
                }
            }
        })
    }
}
