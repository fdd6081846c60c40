//! The `/v1/responses` handler (thin I/O shell): validate → the conversation (instructions,
//! a stored previous turn, this turn's input) → [`chat::start`] → a `response` object or the
//! event stream; a finished turn is stored (unless `store: false`) for a later
//! `previous_response_id`. Everything that can be refused is refused before a stream starts.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use deltafin_engine::tokenizer::ChatMessage;
use futures_util::Stream;
use serde_json::json;

use super::object::{Head, output_items, status};
use super::request::parse;
use super::store::ResponseStore;
use super::stream::{Event, ResponseStream};
use crate::http::body::JsonBody;
use crate::http::error::ApiError;
use crate::http::openai::chat::{self, Accumulator, ChatRun, ToolCall};
use crate::http::openai::generation::{Generation, Step};
use crate::metrics::Endpoint;
use crate::state::AppState;

/// `POST /v1/responses`.
pub async fn responses(
    State(app): State<AppState>,
    Extension(store): Extension<Arc<ResponseStore>>,
    body: Result<JsonBody, ApiError>,
) -> Response {
    let started = Instant::now();
    let prep = app.clone();
    match app.prepare(move || start(&prep, store, body, started)).await {
        Ok((turn, run, true)) => stream(&app, turn, run),
        Ok((turn, run, false)) => collect(turn, run).await,
        Err(e) => {
            app.metrics().request(Endpoint::Responses, e.outcome());
            tracing::info!(endpoint = Endpoint::Responses.label(), status = e.status().as_u16(), error = %e, "request refused");
            e.into_response()
        }
    }
}

/// One turn: how to render it, and what to keep when it finishes.
struct Turn {
    head: Head,
    /// The conversation without instructions: the previous turn's and this turn's input.
    conversation: Vec<ChatMessage>,
    store: Option<Arc<ResponseStore>>,
}

impl Turn {
    /// Keep the conversation with this turn's output appended.
    fn save(self, reasoning: &str, content: &str, calls: &[ToolCall]) {
        let Some(store) = self.store else { return };
        let mut answer = ChatMessage::new("assistant", content);
        answer.reasoning_content = (!reasoning.is_empty()).then(|| reasoning.to_string());
        let calls: Vec<_> = calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        answer.tool_calls = (!calls.is_empty()).then_some(calls);
        let mut conversation = self.conversation;
        conversation.push(answer);
        store.put(self.head.id, conversation);
    }
}

/// The chat pipeline's field names and this API's.
const NAMES: &[(&str, &str)] = &[
    ("response_format", "text.format"),
    ("reasoning_effort", "reasoning.effort"),
    ("messages", "input"),
];

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn start(
    app: &AppState,
    store: Arc<ResponseStore>,
    body: Result<JsonBody, ApiError>,
    started: Instant,
) -> Result<(Turn, ChatRun, bool), ApiError> {
    let JsonBody(body) = body?;
    let req = parse(&body, &app.config().limits)?;
    let mut conversation = match &req.previous_response_id {
        Some(id) => store.get(id).map(|c| c.to_vec()).ok_or_else(|| {
            let id: String = id.chars().take(128).collect();
            ApiError::field(
                "previous_response_id",
                format!("Previous response with id '{id}' not found."),
            )
        })?,
        None => Vec::new(),
    };
    conversation.extend(req.chat.messages.iter().cloned());
    let mut chat = req.chat.clone();
    let system = req
        .instructions
        .as_ref()
        .map(|i| ChatMessage::new("system", i.clone()));
    chat.messages = system.into_iter().chain(conversation.iter().cloned()).collect();
    let run = chat::start(app, &chat, Endpoint::Responses, started).map_err(|e| e.renamed(NAMES))?;
    let head = Head::new(format!("resp_{}", run.id), now(), run.model.clone(), &req);
    let turn = Turn {
        head,
        conversation,
        store: req.store.then_some(store),
    };
    Ok((turn, run, chat.common.stream))
}

async fn collect(turn: Turn, run: ChatRun) -> Response {
    let outcome = match run.collect().await {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    let Some(choice) = outcome.choices.first() else {
        return ApiError::Internal("no choice").into_response();
    };
    let items = output_items(&turn.head, choice);
    let body = turn
        .head
        .object(status(choice.finish_reason), items, Some(&outcome.usage), None);
    turn.save(&choice.reasoning, &choice.content, &choice.tool_calls);
    Json(body).into_response()
}

fn sse(e: Event) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().event(e.name).data(e.data.to_string()))
}

/// SSE with `event:` names and no `[DONE]`. Dropping the stream (a client disconnect) drops
/// the generation, which cancels it; a cancelled turn is not stored.
fn stream(app: &AppState, turn: Turn, mut run: ChatRun) -> Response {
    let Some(generation) = run.choices.pop() else {
        return ApiError::Internal("no choice").into_response();
    };
    let mut state = ResponseStream::new(turn.head.clone());
    let queue = VecDeque::from(state.start());
    let keep_alive = KeepAlive::new()
        .interval(app.config().keep_alive)
        .text("keep-alive");
    let flow = Flow {
        generation,
        state,
        queue,
        acc: Accumulator::default(),
        turn: Some(turn),
    };
    Sse::new(events(flow)).keep_alive(keep_alive).into_response()
}

/// The stream's state between events.
struct Flow {
    generation: Generation,
    state: ResponseStream,
    queue: VecDeque<Event>,
    acc: Accumulator,
    /// `None` once the turn ended.
    turn: Option<Turn>,
}

impl Flow {
    /// Turn the next generation step into events; `false` when the generation is gone.
    async fn step(&mut self) -> bool {
        match self.generation.next().await {
            Some(Step::Text(d)) => {
                self.queue.extend(self.state.text(&d.reasoning, &d.content));
                for t in &d.tool_calls {
                    let events = self
                        .state
                        .call(t.index, t.id.as_deref(), t.name.as_deref(), &t.arguments);
                    self.queue.extend(events);
                }
                self.acc.push(&d);
            }
            Some(Step::Finished { reason, usage }) => {
                self.queue.extend(self.state.finish(reason, &usage));
                if let Some(turn) = self.turn.take() {
                    turn.save(&self.acc.reasoning, &self.acc.content, &self.acc.tool_calls);
                }
            }
            Some(Step::Failed(e)) => {
                self.queue.extend(self.state.fail(&e));
                self.turn = None;
            }
            None => return false,
        }
        true
    }
}

fn events(flow: Flow) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    futures_util::stream::unfold(flow, |mut f| async move {
        loop {
            if let Some(e) = f.queue.pop_front() {
                return Some((sse(e), f));
            }
            if f.turn.is_none() || !f.step().await {
                return None;
            }
        }
    })
}
