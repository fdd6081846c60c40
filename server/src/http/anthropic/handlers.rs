//! The Messages API handlers (thin I/O shell): validate → [`chat::start`] → a `message` or the
//! event stream. Everything that can be refused is refused before a stream starts.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde_json::json;

use super::error::AnthropicError;
use super::request::{parse, thinking_shown};
use super::response::message;
use super::stream::{Event, MessageStream};
use crate::http::body::JsonBody;
use crate::http::error::ApiError;
use crate::http::openai::chat::{self, ChatRun};
use crate::http::openai::generation::{Generation, Step};
use crate::http::openai::handlers::check_model;
use crate::http::openai::request::ChatRequest;
use crate::metrics::Endpoint;
use crate::state::{AppState, Loaded};

/// `POST /v1/messages`.
pub async fn messages(State(app): State<AppState>, body: Result<JsonBody, ApiError>) -> Response {
    let started = Instant::now();
    let prep = app.clone();
    let start = move || -> Result<(bool, bool, ChatRun), ApiError> {
        let JsonBody(body) = body?;
        let req = parse(&body, &prep.config().limits, false)?;
        let run = chat::start(&prep, &req, Endpoint::Messages, started).map_err(|e| e.renamed(NAMES))?;
        Ok((req.common.stream, thinking_shown(&req), run))
    };
    match app.prepare(start).await {
        Ok((true, show, run)) => stream(&app, run, show),
        Ok((false, show, run)) => collect(run, show).await,
        Err(e) => refuse(&app, e),
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's length as this model renders it.
pub async fn count_tokens(State(app): State<AppState>, body: Result<JsonBody, ApiError>) -> Response {
    let prep = app.clone();
    let count = move || -> Result<usize, ApiError> {
        let loaded = prep.loaded()?;
        let JsonBody(body) = body?;
        let req = parse(&body, &prep.config().limits, true)?;
        check_model(&loaded, &req.common)?;
        prompt_len(&loaded, &req)
    };
    match app.prepare(count).await {
        Ok(n) => {
            app.metrics().request(Endpoint::Messages, "success");
            Json(json!({"input_tokens": n})).into_response()
        }
        Err(e) => refuse(&app, e),
    }
}

/// The chat pipeline's field names and this API's.
const NAMES: &[(&str, &str)] = &[
    ("response_format", "output_config.format"),
    ("reasoning_effort", "output_config.effort"),
];

fn refuse(app: &AppState, e: ApiError) -> Response {
    app.metrics().request(Endpoint::Messages, e.outcome());
    tracing::info!(endpoint = Endpoint::Messages.label(), status = e.status().as_u16(), error = %e, "request refused");
    AnthropicError(e).into_response()
}

/// The rendered prompt's token count, exactly as the chat pipeline renders it.
fn prompt_len(loaded: &Loaded, req: &ChatRequest) -> Result<usize, ApiError> {
    let (prompt, _) = crate::http::openai::chat::render(loaded, req).map_err(|e| e.renamed(NAMES))?;
    Ok(prompt.len())
}

/// The whole message; `show_thinking`: the request enabled thinking (else reasoning is dropped).
async fn collect(run: ChatRun, show_thinking: bool) -> Response {
    let id = format!("msg_{}", run.id);
    let model = run.model.clone();
    match run.collect().await {
        Ok(mut outcome) => match outcome.choices.first_mut() {
            Some(choice) => {
                if !show_thinking {
                    choice.reasoning.clear();
                }
                Json(message(&id, &model, choice, &outcome.usage)).into_response()
            }
            None => AnthropicError(ApiError::Internal("no choice")).into_response(),
        },
        Err(e) => AnthropicError(e).into_response(),
    }
}

fn sse(e: Event) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().event(e.name).data(e.data.to_string()))
}

/// SSE with `event:` names. Dropping the stream (a client disconnect) drops the generation,
/// which cancels it.
fn stream(app: &AppState, mut run: ChatRun, show_thinking: bool) -> Response {
    let Some(generation) = run.choices.pop() else {
        return AnthropicError(ApiError::Internal("no choice")).into_response();
    };
    let state = MessageStream::new(format!("msg_{}", run.id), run.model.clone());
    let queue = VecDeque::from(state.start(run.prompt_tokens));
    let keep_alive = KeepAlive::new()
        .interval(app.config().keep_alive)
        .text("keep-alive");
    Sse::new(events(generation, state, queue, show_thinking))
        .keep_alive(keep_alive)
        .into_response()
}

fn events(
    generation: Generation,
    state: MessageStream,
    queue: VecDeque<Event>,
    show_thinking: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let init = (generation, state, queue, false);
    futures_util::stream::unfold(init, move |(mut g, mut st, mut q, mut ended)| async move {
        loop {
            if let Some(e) = q.pop_front() {
                return Some((sse(e), (g, st, q, ended)));
            }
            if ended {
                return None;
            }
            match g.next().await {
                Some(Step::Text(d)) => {
                    let reasoning = if show_thinking { d.reasoning.as_str() } else { "" };
                    q.extend(st.text(reasoning, &d.content));
                    for t in &d.tool_calls {
                        st.call(t.index, t.id.as_deref(), t.name.as_deref(), &t.arguments);
                    }
                }
                Some(Step::Finished { reason, usage }) => {
                    q.extend(st.finish(reason, usage.completion_tokens));
                    ended = true;
                }
                Some(Step::Failed(e)) => {
                    q.push_back(MessageStream::error(&AnthropicError(e)));
                    ended = true;
                }
                None => return None,
            }
        }
    })
}
