//! The `/v1` handlers: validate → tokenize → submit → JSON body or SSE stream. Everything that
//! can be refused is refused before a stream starts, so errors carry real HTTP statuses.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use std::collections::VecDeque;
use std::sync::Mutex;

use deltafin_engine::generate::{DecodeOptions, Sampling};
use deltafin_engine::scheduler::GenRequest;
use deltafin_engine::tokenizer::Tokenizer;
use futures_util::{Stream, StreamExt};

use super::chat::{self, ChatOutcome, ChatRun};
use super::generation::{Generation, Step};
use super::logprobs;
use super::output::{Delta, OutputParser};
use super::request::{Common, CompletionRequest, PromptInput, parse_chat, parse_completion};
use super::types::{
    AssistantMessage, ChatChoice, ChatCompletion, ChunkHeader, Completion, CompletionChoice, FunctionOut,
    ModelCard, ModelList, ToolCallOut, Usage,
};
use crate::http::body::JsonBody;
use crate::http::error::ApiError;
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
    let prep = app.clone();
    let run = app
        .prepare(move || {
            let JsonBody(body) = body?;
            let req = parse_chat(&body, &prep.config().limits)?;
            let run = chat::start(&prep, &req, Endpoint::Chat, started)?;
            Ok((run, Shape::of(&req.common)))
        })
        .await;
    match run {
        Ok((run, shape)) => respond(&app, Endpoint::Chat, run, shape).await,
        Err(e) => refuse(&app, Endpoint::Chat, e),
    }
}

/// `POST /v1/completions`.
pub async fn completions(State(app): State<AppState>, body: Result<JsonBody, ApiError>) -> Response {
    let started = Instant::now();
    let prep = app.clone();
    let run = app
        .prepare(move || {
            let JsonBody(body) = body?;
            let req = parse_completion(&body, &prep.config().limits)?;
            let run = start_completion(&prep, &req, started)?;
            Ok((run, Shape::of(&req.common)))
        })
        .await;
    match run {
        Ok((run, shape)) => respond(&app, Endpoint::Completions, run, shape).await,
        Err(e) => refuse(&app, Endpoint::Completions, e),
    }
}

fn refuse(app: &AppState, endpoint: Endpoint, e: ApiError) -> Response {
    app.metrics().request(endpoint, e.outcome());
    tracing::info!(endpoint = endpoint.label(), status = e.status().as_u16(), error = %e, "request refused");
    e.into_response()
}

/// A request's `model` must be the served one.
pub fn check_model(loaded: &Loaded, common: &Common) -> Result<(), ApiError> {
    match &common.model {
        Some(m) if m != &loaded.model_id => Err(ApiError::ModelNotFound(m.chars().take(128).collect())),
        _ => Ok(()),
    }
}

fn sampling(common: &Common) -> Result<Sampling, ApiError> {
    let s = &common.sampling;
    let seed = s.seed.unwrap_or_else(random_seed);
    Sampling::new(s.temperature, s.top_p, s.top_k, seed)
        .and_then(|x| x.with_min_p(s.min_p))
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

/// A fresh 16-digit hex id.
pub fn random_hex() -> String {
    format!("{:016x}", random_seed())
}

/// The engine request for a rendered `prompt`: limits, stop ids, sampling and `decode`.
pub fn gen_request(
    app: &AppState,
    loaded: &Loaded,
    endpoint: Endpoint,
    common: &Common,
    prompt: Vec<u32>,
    decode: DecodeOptions,
) -> Result<GenRequest, ApiError> {
    let limit = loaded.engine.context_limit();
    if prompt.len() > limit {
        let param = if endpoint == Endpoint::Completions {
            "prompt"
        } else {
            "messages"
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
        if endpoint != Endpoint::Completions {
            stop_ids.extend(&loaded.chat_stop_ids);
        }
    }
    Ok(GenRequest {
        prompt,
        max_new_tokens: common.max_tokens.unwrap_or(app.config().limits.max_tokens),
        sampling: sampling(common)?,
        stop_ids,
        reuse_state: true,
        kind: chat::kind_of(endpoint),
        spec: app.config().spec,
        decode,
    })
}

pub fn start_completion(
    app: &AppState,
    req: &CompletionRequest,
    started: Instant,
) -> Result<ChatRun, ApiError> {
    let loaded = app.loaded()?;
    check_model(&loaded, &req.common)?;
    let prompt = match &req.prompt {
        PromptInput::Ids(ids) => ids.clone(),
        PromptInput::Text(text) => {
            if app.config().log_prompts {
                tracing::info!(prompt = %text, "completion prompt");
            }
            loaded.tokenizer.encode_prompt(text)
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::field("prompt", "`prompt` must not be empty"));
    }
    let parsers = (0..req.common.n)
        .map(|_| OutputParser::new(Arc::clone(&loaded.tokenizer), None, &[], req.common.stop.clone()))
        .collect();
    let prompt_tokens = prompt.len();
    let prompt_ids = prompt.clone();
    let decode = chat::sampling_options(&req.common);
    let gen_req = gen_request(app, &loaded, Endpoint::Completions, &req.common, prompt, decode)?;
    let choices = Generation::submit_choices(app, &loaded, Endpoint::Completions, gen_req, parsers, started)?;
    Ok(ChatRun {
        choices,
        model: loaded.model_id.clone(),
        id: random_hex(),
        prompt_tokens,
        prompt: prompt_ids,
        tools: false,
    })
}

fn header(run: &ChatRun, endpoint: Endpoint, include_usage: bool) -> ChunkHeader {
    let prefix = if endpoint == Endpoint::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    ChunkHeader {
        id: format!("{prefix}-{}", run.id),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: run.model.clone(),
        include_usage,
    }
}

/// How a response is shaped, from the request.
#[derive(Debug, Clone, Copy)]
struct Shape {
    stream: bool,
    include_usage: bool,
    token_ids: bool,
}

impl Shape {
    fn of(common: &Common) -> Shape {
        Shape {
            stream: common.stream,
            include_usage: common.include_usage,
            token_ids: common.return_token_ids,
        }
    }
}

async fn respond(app: &AppState, endpoint: Endpoint, run: ChatRun, shape: Shape) -> Response {
    let Shape {
        stream,
        include_usage,
        token_ids,
    } = shape;
    let h = header(&run, endpoint, include_usage);
    let tok = match app.loaded_any() {
        Some(l) => Arc::clone(&l.tokenizer),
        None => return ApiError::Loading.into_response(),
    };
    if stream {
        let keep_alive = KeepAlive::new()
            .interval(app.config().keep_alive)
            .text("keep-alive");
        return Sse::new(into_stream(run, h, endpoint, tok))
            .keep_alive(keep_alive)
            .into_response();
    }
    let out = match run.collect().await {
        Ok(out) => out,
        Err(e) => return e.into_response(),
    };
    tracing::info!(
        endpoint = endpoint.label(),
        prompt_tokens = out.usage.prompt_tokens,
        completion_tokens = out.usage.completion_tokens,
        cached_tokens = out.usage.prompt_tokens_details.cached_tokens,
        "request finished"
    );
    let ids = token_ids.then(|| (out.prompt_token_ids.clone(), out.token_ids.clone()));
    // Serialised once as the typed body (f32 log-probabilities keep their shortest form); the
    // ids are added to that text's value when asked for.
    let text = match endpoint {
        Endpoint::Chat => serde_json::to_string(&chat_body(&h, &tok, out)),
        _ => serde_json::to_string(&completion_body(&h, &tok, out)),
    };
    let Ok(text) = text else {
        return ApiError::Internal("response serialisation").into_response();
    };
    let Some((prompt, outputs)) = ids else {
        return ([(axum::http::header::CONTENT_TYPE, "application/json")], text).into_response();
    };
    let mut body: serde_json::Value = serde_json::from_str(&text).expect("just serialised");
    body["prompt_token_ids"] = serde_json::json!(prompt);
    for (choice, ids) in body["choices"].as_array_mut().into_iter().flatten().zip(outputs) {
        choice["token_ids"] = serde_json::json!(ids);
    }
    Json(body).into_response()
}

fn chat_body(h: &ChunkHeader, tok: &Tokenizer, out: ChatOutcome) -> ChatCompletion {
    let choices = out
        .choices
        .into_iter()
        .map(|c| {
            let calls: Vec<ToolCallOut> = c
                .tool_calls
                .into_iter()
                .map(|t| ToolCallOut {
                    id: t.id,
                    kind: "function",
                    function: FunctionOut {
                        name: t.name,
                        arguments: t.arguments,
                    },
                })
                .collect();
            // `null` content when the turn is only tool calls.
            let content = (!c.content.is_empty() || calls.is_empty()).then_some(c.content);
            ChatChoice {
                index: c.index as u32,
                message: AssistantMessage {
                    role: "assistant",
                    content,
                    reasoning_content: (!c.reasoning.is_empty()).then_some(c.reasoning),
                    tool_calls: (!calls.is_empty()).then_some(calls),
                },
                logprobs: logprobs::chat(tok, &c.logprobs),
                finish_reason: c.finish_reason,
            }
        })
        .collect();
    ChatCompletion {
        id: h.id.clone(),
        object: "chat.completion",
        created: h.created,
        model: h.model.clone(),
        choices,
        usage: out.usage,
    }
}

fn completion_body(h: &ChunkHeader, tok: &Tokenizer, out: ChatOutcome) -> Completion {
    let choices = out
        .choices
        .into_iter()
        .map(|c| CompletionChoice {
            index: c.index as u32,
            text: c.content,
            logprobs: logprobs::completion(tok, &c.logprobs, &mut 0),
            finish_reason: Some(c.finish_reason),
        })
        .collect();
    Completion {
        id: h.id.clone(),
        object: "text_completion",
        created: h.created,
        model: h.model.clone(),
        choices,
        usage: Some(Some(out.usage)),
    }
}

/// One choice's SSE data lines, in order; the usage of a finished choice is added to `total`.
fn choice_stream(
    index: u32,
    g: Generation,
    h: ChunkHeader,
    endpoint: Endpoint,
    tok: Arc<Tokenizer>,
    total: Arc<Mutex<Usage>>,
) -> impl Stream<Item = String> + Send + 'static {
    let chat_api = endpoint == Endpoint::Chat;
    let first = if chat_api {
        vec![h.chat_role(index)]
    } else {
        vec![]
    };
    let state = (g, VecDeque::from(first), false, 0usize);
    futures_util::stream::unfold(state, move |(mut g, mut queue, mut ended, mut offset)| {
        let (h, tok, total) = (h.clone(), tok.clone(), total.clone());
        async move {
            loop {
                if let Some(data) = queue.pop_front() {
                    return Some((data, (g, queue, ended, offset)));
                }
                if ended {
                    return None;
                }
                match g.next().await {
                    Some(Step::Text(d)) => {
                        let lps = g.take_logprobs();
                        queue.extend(if chat_api {
                            h.chat_delta(index, d, logprobs::chat(&tok, &lps))
                        } else {
                            h.completion_delta(index, d, logprobs::completion(&tok, &lps, &mut offset))
                        });
                    }
                    Some(Step::Finished { reason, usage }) => {
                        let lps = g.take_logprobs();
                        if chat_api {
                            queue.extend(h.chat_delta(index, Delta::default(), logprobs::chat(&tok, &lps)));
                            queue.push_back(h.chat_finish(index, reason));
                        } else {
                            let lp = logprobs::completion(&tok, &lps, &mut offset);
                            queue.extend(h.completion_delta(index, Delta::default(), lp));
                            queue.push_back(h.completion_finish(index, reason));
                        }
                        let mut t = total.lock().unwrap_or_else(|p| p.into_inner());
                        *t = Usage::new(
                            usage.prompt_tokens,
                            t.completion_tokens + usage.completion_tokens,
                            t.prompt_tokens_details
                                .cached_tokens
                                .max(usage.prompt_tokens_details.cached_tokens),
                        );
                        ended = true;
                    }
                    Some(Step::Failed(e)) => {
                        queue.push_back(e.body().to_string());
                        ended = true;
                    }
                    None => return None,
                }
            }
        }
    })
}

/// SSE: every choice's `data: {chunk}` events interleaved as they come, then the usage chunk
/// (with `include_usage`) and `data: [DONE]`. Dropping the stream (a client disconnect) drops
/// the generations, which cancels them.
fn into_stream(
    run: ChatRun,
    h: ChunkHeader,
    endpoint: Endpoint,
    tok: Arc<Tokenizer>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let total = Arc::new(Mutex::new(Usage::new(run.prompt_tokens, 0, 0)));
    let streams: Vec<_> = run
        .choices
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            Box::pin(choice_stream(
                i as u32,
                g,
                h.clone(),
                endpoint,
                tok.clone(),
                total.clone(),
            ))
        })
        .collect();
    let tail = {
        let h = h.clone();
        futures_util::stream::once(async move {
            let usage = *total.lock().unwrap_or_else(|p| p.into_inner());
            let mut out: Vec<String> = match endpoint {
                Endpoint::Chat => h.chat_usage(usage).into_iter().collect(),
                _ => h.completion_usage(usage).into_iter().collect(),
            };
            out.push("[DONE]".to_string());
            futures_util::stream::iter(out)
        })
        .flatten()
    };
    futures_util::stream::select_all(streams)
        .chain(tail)
        .map(|data| Ok(SseEvent::default().data(data)))
}
