//! One generation in flight, seen from a handler: submit to the engine loop, then turn engine
//! events into output steps (text deltas, then a finish with usage, or a failure). Dropping a
//! `Generation` drops its receiver, which the engine loop sees as a cancellation before its
//! next step; the metrics timer inside records the request as `cancelled` unless it finished.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use deltafin_engine::generate::TokenLogprobs;
use deltafin_engine::scheduler::{Event, EventSink, FinishReason, GenRequest};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::output::{Delta, OutputParser};
use super::types::Usage;
use crate::http::error::ApiError;
use crate::metrics::{Endpoint, Metrics, RequestTimer};
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
    /// Output text and tool-call fragments; with `logprobs`, the log-probabilities of the
    /// tokens that made them arrive in [`Generation::take_logprobs`].
    Text(Delta),
    Finished {
        reason: &'static str,
        usage: Usage,
    },
    Failed(ApiError),
}

/// A submitted request and its output state.
#[derive(Debug)]
pub struct Generation {
    rx: UnboundedReceiver<Event>,
    parser: OutputParser,
    /// Choice 0 times the request; further choices of the same request do not count again.
    timer: Option<RequestTimer>,
    /// Log-probabilities of the tokens received so far and not yet taken.
    logprobs: Vec<TokenLogprobs>,
    pending_logprob: Option<TokenLogprobs>,
    /// Named tool choice: OpenAI reports `stop`, not `tool_calls`.
    named_choice: bool,
    metrics: Arc<Metrics>,
    endpoint: Endpoint,
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
    /// Every generated id so far (in-process callers read them: `deltafin run`).
    ids: Vec<u32>,
    /// The engine's own message when the generation failed (HTTP answers keep it in the log).
    failure: Option<String>,
    pending: VecDeque<Step>,
    done: bool,
}

impl Generation {
    /// Submit `req` for one choice per parser (`n` choices sharing one prefill); a full queue
    /// or an invalid request fails here (before any response).
    pub fn submit_choices(
        app: &AppState,
        loaded: &Loaded,
        endpoint: Endpoint,
        req: GenRequest,
        parsers: Vec<OutputParser>,
        started: Instant,
    ) -> Result<Vec<Generation>, ApiError> {
        // Weights that cannot be read as published fail the request before it runs (and the
        // check retries a failed range, so a repaired file is noticed here).
        loaded.weights_health()?;
        let prompt_tokens = req.prompt.len();
        let (sinks, receivers): (Vec<Box<dyn EventSink>>, Vec<_>) = parsers
            .iter()
            .map(|_| {
                let (tx, rx) = unbounded_channel();
                (Box::new(ChannelSink(tx)) as Box<dyn EventSink>, rx)
            })
            .unzip();
        loaded.engine.submit_choices(req, sinks)?;
        Ok(receivers
            .into_iter()
            .zip(parsers)
            .enumerate()
            .map(|(i, (rx, parser))| Generation {
                rx,
                parser,
                timer: (i == 0).then(|| RequestTimer::new(Arc::clone(app.metrics()), endpoint, started)),
                logprobs: Vec::new(),
                pending_logprob: None,
                named_choice: false,
                metrics: Arc::clone(app.metrics()),
                endpoint,
                prompt_tokens,
                cached_tokens: 0,
                completion_tokens: 0,
                ids: Vec::new(),
                failure: None,
                pending: VecDeque::new(),
                done: false,
            })
            .collect())
    }

    /// Report `stop` rather than `tool_calls` when calls end the output (a named tool choice).
    pub fn set_named_choice(&mut self, named: bool) {
        self.named_choice = named;
    }

    /// The engine's message of a failed generation.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Every id generated so far, stop ids included.
    pub fn output_ids(&self) -> &[u32] {
        &self.ids
    }

    /// The log-probabilities of the tokens behind the steps returned so far (drained).
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprobs> {
        std::mem::take(&mut self.logprobs)
    }

    /// Calls parsed, malformed and withheld (cut off) so far.
    pub fn tool_call_counts(&self) -> (usize, usize, usize) {
        let p = &self.parser;
        (p.tool_calls_seen(), p.malformed_calls(), p.withheld_calls())
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
        if let Some(t) = self.timer.as_mut() {
            t.finish("success", self.prompt_tokens);
        }
        let (parsed, malformed, withheld) = self.tool_call_counts();
        if parsed + malformed + withheld > 0 {
            let format = self.parser.tool_format_label();
            self.metrics
                .tool_calls(self.endpoint, format, parsed, malformed, withheld);
        }
        self.done = true;
        // A stop string may end output before the engine does: stop its work now.
        self.rx.close();
    }

    fn fail(&mut self, error: ApiError) {
        if let Some(t) = self.timer.as_mut() {
            t.finish(error.outcome(), self.prompt_tokens);
        }
        self.pending.push_back(Step::Failed(error));
        self.done = true;
        self.rx.close();
    }

    /// The next step; `None` after the finish or failure was returned.
    pub async fn next(&mut self) -> Option<Step> {
        while self.pending.is_empty() && !self.done {
            match self.rx.recv().await {
                Some(Event::Started { cached_tokens }) => self.cached_tokens = cached_tokens,
                Some(Event::Logprobs(lp)) => self.pending_logprob = Some(lp),
                Some(Event::Token(id)) => {
                    self.completion_tokens += 1;
                    self.ids.push(id);
                    if let Some(t) = self.timer.as_mut() {
                        t.token();
                    }
                    self.logprobs.extend(self.pending_logprob.take());
                    let delta = self.parser.push(id);
                    if self.parser.stopped() {
                        self.end(delta, "stop");
                    } else if !delta.is_empty() {
                        self.pending.push_back(Step::Text(delta));
                    }
                }
                Some(Event::Done(c)) => {
                    let tail = self.parser.finish();
                    let reason = match c.finish_reason {
                        FinishReason::Stop if self.parser.tool_calls_seen() > 0 && !self.named_choice => {
                            "tool_calls"
                        }
                        FinishReason::Stop => "stop",
                        _ => "length",
                    };
                    self.end(tail, reason);
                }
                Some(Event::Failed { kind, message }) => {
                    tracing::error!(kind, %message, "generation failed");
                    self.failure = Some(message.clone());
                    self.fail(match kind {
                        "shutdown" => ApiError::ShuttingDown,
                        "budget" => ApiError::MemoryExhausted(message),
                        "weights_unavailable" => ApiError::WeightsUnavailable(message),
                        _ => ApiError::Internal("generation"),
                    });
                }
                None => self.fail(ApiError::Internal("engine stopped")),
            }
        }
        self.pending.pop_front()
    }
}
