//! One generation in flight, seen from a handler: submit to the engine loop, then turn engine
//! events into output steps (text deltas, then a finish with usage, or a failure). Dropping a
//! `Generation` drops its receiver, which the engine loop sees as a cancellation before its
//! next step; the metrics timer inside records the request as `cancelled` unless it finished.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use deltafin_engine::scheduler::{Event, EventSink, FinishReason, GenRequest};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::output::{Delta, OutputParser};
use super::types::Usage;
use crate::error::ApiError;
use crate::metrics::{Endpoint, RequestTimer};
use crate::state::{AppState, Loaded};

/// Engine events into a tokio channel; a dropped receiver reads as closed.
#[derive(Debug)]
struct ChannelSink(UnboundedSender<Event>);

impl EventSink for ChannelSink {
    fn send(&self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// What the handler does next.
#[derive(Debug)]
pub enum Step {
    Text(Delta),
    Finished { reason: &'static str, usage: Usage },
    Failed(ApiError),
}

/// A submitted request and its output state.
#[derive(Debug)]
pub struct Generation {
    rx: UnboundedReceiver<Event>,
    parser: OutputParser,
    timer: RequestTimer,
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
    pending: VecDeque<Step>,
    done: bool,
}

impl Generation {
    /// Submit `req`; a full queue or an invalid request fails here (before any response).
    pub fn submit(
        app: &AppState,
        loaded: &Loaded,
        endpoint: Endpoint,
        req: GenRequest,
        parser: OutputParser,
        started: Instant,
    ) -> Result<Generation, ApiError> {
        let (tx, rx) = unbounded_channel();
        let prompt_tokens = req.prompt.len();
        loaded.engine.submit(req, Box::new(ChannelSink(tx)))?;
        Ok(Generation {
            rx,
            parser,
            timer: RequestTimer::new(Arc::clone(app.metrics()), endpoint, started),
            prompt_tokens,
            cached_tokens: 0,
            completion_tokens: 0,
            pending: VecDeque::new(),
            done: false,
        })
    }

    fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.completion_tokens, self.cached_tokens)
    }

    fn end(&mut self, text: Delta, reason: &'static str) {
        if !text.is_empty() {
            self.pending.push_back(Step::Text(text));
        }
        self.pending.push_back(Step::Finished {
            reason,
            usage: self.usage(),
        });
        self.timer.finish("success", self.prompt_tokens);
        self.done = true;
        // A stop string may end output before the engine does: stop its work now.
        self.rx.close();
    }

    fn fail(&mut self, error: ApiError) {
        self.timer.finish(error.outcome(), self.prompt_tokens);
        self.pending.push_back(Step::Failed(error));
        self.done = true;
        self.rx.close();
    }

    /// The next step; `None` after the finish or failure was returned.
    pub async fn next(&mut self) -> Option<Step> {
        while self.pending.is_empty() && !self.done {
            match self.rx.recv().await {
                Some(Event::Started { cached_tokens }) => self.cached_tokens = cached_tokens,
                Some(Event::Token(id)) => {
                    self.completion_tokens += 1;
                    self.timer.token();
                    let delta = self.parser.push(id);
                    if self.parser.stopped() {
                        self.end(delta, "stop");
                    } else if !delta.is_empty() {
                        self.pending.push_back(Step::Text(delta));
                    }
                }
                Some(Event::Done(c)) => {
                    let tail = self.parser.finish();
                    self.end(
                        tail,
                        if c.finish_reason == FinishReason::Stop {
                            "stop"
                        } else {
                            "length"
                        },
                    );
                }
                Some(Event::Failed { kind, message }) => {
                    tracing::error!(kind, %message, "generation failed");
                    self.fail(if kind == "shutdown" {
                        ApiError::ShuttingDown
                    } else {
                        ApiError::Internal("generation")
                    });
                }
                None => self.fail(ApiError::Internal("engine stopped")),
            }
        }
        self.pending.pop_front()
    }
}
