//! The single engine loop: one thread owns the model; callers submit validated requests through
//! a [`SchedulerHandle`] and receive [`Event`]s through an [`EventSink`].
//!
//! * **Continuous batching.** Every step runs one batched pass over all running sequences:
//!   decoding ones contribute their pending token, prefilling ones a chunk of their prompt
//!   ([`plan`]). Requests join and leave between steps. The kernels are batch-invariant, so each
//!   request's tokens are exactly those it would get alone.
//! * **Bounded admission.** At most `max_batch` run and `max_queue` wait; beyond that
//!   [`SchedulerHandle::submit`] fails at once with [`SubmitError::Busy`] (the caller's 429).
//! * **Cancellation.** A sink whose receiver is gone ([`EventSink::is_closed`], or a failed
//!   send) is dropped before the next step: a disconnected client costs at most one more step.
//! * **State reuse.** A sequence's state enters a small LRU ([`reuse`]) once its prompt is
//!   prefilled and again when it finishes; a new prompt sharing a prefix with a cached one
//!   starts from it instead of re-running prefill. Recurrent (KDA) states are checkpointed at
//!   prefill chunk ends, so K3 and Kimi-Linear prompts that share only a prefix reuse it too.
//!
//! * **Speculative decoding.** A decoding request may contribute its pending token plus drafts
//!   from its proposers ([`crate::spec`]); the pass verifies them and commits the accepted rows.
//!
//! Token selection is `Sampling::pick(logits, position)`, exactly as in
//! [`crate::generate::generate`], so the server, `deltafin run`, every batch composition and
//! every draft agree.

mod fault;
mod memory;
mod pace;
mod plan;
mod reuse;
mod stats;
mod worker;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use fault::Faults;
pub use memory::{AUTO_CONTEXT_TOKENS, auto_context_bytes, longest_context};
pub use stats::{
    ExpertIoStats, ExpertSource, HistogramSnapshot, PREFILL_ROW_BOUNDS, QUEUE_WAIT_BOUNDS,
    STEP_SECONDS_BOUNDS, SchedulerStats, Stall, StatsSnapshot,
};

use crate::arch::Model;
use crate::error::Error;
pub use crate::generate::FinishReason;
use crate::generate::{DecodeOptions, Sampling, TokenLogprobs};
use crate::spec::{Drafts, RequestKind, SpecMode};

/// A validated generation request, in token ids.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// Prompt ids (non-empty, within the context limit, inside the vocabulary).
    pub prompt: Vec<u32>,
    /// Upper bound on generated tokens (>= 1); the context limit may end generation earlier.
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Ids that end generation (included in the output, like [`crate::generate::generate`]).
    pub stop_ids: Vec<u32>,
    /// Whether the request may start from (and commit to) the state-reuse cache.
    pub reuse_state: bool,
    /// Chat or raw completion (which draft proposer it prefers).
    pub kind: RequestKind,
    /// Whether it drafts (drafts never change its tokens).
    pub spec: SpecMode,
    /// Bias, penalties, grammar constraint and log-probabilities ([`DecodeOptions::default`]:
    /// none).
    pub decode: DecodeOptions,
}

/// How a finished request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// `Stop` (a stop id) or `Length` (max tokens or context limit).
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt tokens taken from a reused state instead of being computed.
    pub cached_tokens: usize,
}

/// What a request's sink receives, in order: `Started` (when it joins the batch), `Token`*,
/// then exactly one `Done` or `Failed` (a request failed or shut down while queued gets only
/// `Failed`).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The request left the queue; `cached_tokens` prompt tokens come from a reused state.
    Started {
        cached_tokens: usize,
    },
    Token(u32),
    /// The log-probabilities of the next `Token` (sent just before it, only when requested).
    Logprobs(TokenLogprobs),
    Done(Completion),
    /// The pass failed or the engine is shutting down. `kind` is a stable label.
    Failed {
        kind: &'static str,
        message: String,
    },
}

/// Where a request's events go. Implemented by the server over its async channels.
pub trait EventSink: Send + 'static {
    /// Deliver an event; `false` means the receiver is gone (the request is cancelled).
    fn send(&self, event: Event) -> bool;
    /// Whether the receiver is gone.
    fn is_closed(&self) -> bool;
}

impl EventSink for mpsc::Sender<Event> {
    fn send(&self, event: Event) -> bool {
        mpsc::Sender::send(self, event).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// Default prompt tokens per pass for a prompt prefilling alone.
pub const DEFAULT_PREFILL_CHUNK_SOLO: usize = 1024;

/// Default time a step may add for prefill.
pub const DEFAULT_PREFILL_STEP: Duration = Duration::from_millis(250);

/// Default recurrent-state checkpoints per sequence.
pub const DEFAULT_STATE_CHECKPOINTS: usize = 32;

/// Default attended positions per prefill step: 256 rows at a depth of 4,096 positions.
pub const DEFAULT_PREFILL_POSITIONS: usize = 256 * 4096;

/// Settings of the engine loop.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Sequences per batched pass.
    pub max_batch: usize,
    /// Accepted requests that may wait for a batch slot.
    pub max_queue: usize,
    /// Prompt tokens per pass, shared by all prefilling sequences (shortest remaining first).
    pub prefill_chunk: usize,
    /// Prompt tokens per pass for a prompt prefilling alone (no decode rows, no other prompt,
    /// nobody waiting): it delays no one, and larger chunks cost less per token (out of core,
    /// each chunk reads the experts it touches once). The positions budget scales alike.
    pub prefill_chunk_solo: usize,
    /// Attended positions per pass for prefill rows (`Σ (p + 1)` over rows at positions `p`):
    /// bounds a step's attention cost, so chunks deep into a long prompt get shorter and a long
    /// prefill delays the other requests' steps by a bounded time.
    pub prefill_positions: usize,
    /// Time a step may add for prefill (`None`: always the whole `prefill_chunk` /
    /// `prefill_positions` budget). The budget is scaled down by the measured cost of recent
    /// steps ([`pace`]), so a long prompt delays running streams and new requests by about
    /// this much per step.
    pub prefill_step: Option<Duration>,
    /// Context limit (capped by the model's); `None` = the model's.
    pub context_limit: Option<usize>,
    /// Committed states kept for reuse (0 disables reuse).
    pub state_cache_entries: usize,
    /// Bytes the kept states may hold.
    pub state_cache_bytes: usize,
    /// Bytes every sequence state may hold together — running requests' caches and recurrent
    /// states, their checkpoints and the reuse cache ([`memory`]): the pool planned inside the
    /// memory budget. `None`: unbounded (no budget).
    pub context_memory: Option<u64>,
    /// Shortest shared prefix worth reusing.
    pub min_reuse_tokens: usize,
    /// Recurrent-state checkpoints a prefilling sequence keeps (taken at its chunk ends), so a
    /// K3 or Kimi-Linear prompt sharing only a prefix with a cached one can rewind to it (0: a
    /// recurrent state is reused only by exact extensions). Fewer when they would not fit in
    /// half of `state_cache_bytes`.
    pub state_checkpoints: usize,
    /// Sleep before every pass (testing and demonstrations only: simulates a slow model).
    pub step_delay: Duration,
    /// Draft models and drafting settings for speculative decoding.
    pub drafts: Drafts,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch: 8,
            max_queue: 32,
            prefill_chunk: 256,
            prefill_chunk_solo: DEFAULT_PREFILL_CHUNK_SOLO,
            prefill_positions: DEFAULT_PREFILL_POSITIONS,
            prefill_step: Some(DEFAULT_PREFILL_STEP),
            context_limit: None,
            state_cache_entries: 4,
            state_cache_bytes: 1 << 30,
            context_memory: None,
            min_reuse_tokens: 16,
            state_checkpoints: DEFAULT_STATE_CHECKPOINTS,
            step_delay: Duration::ZERO,
            drafts: Drafts::default(),
        }
    }
}

/// Why a request was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Every batch slot and queue slot is taken.
    #[error("the server is busy: {in_flight} requests in flight (capacity {capacity}); retry later")]
    Busy { in_flight: u64, capacity: u64 },
    /// The engine loop is gone.
    #[error("the engine is not running")]
    Stopped,
    /// The request breaks a limit (context, vocabulary, empty prompt).
    #[error(transparent)]
    Invalid(#[from] Error),
}

impl SubmitError {
    /// A stable label.
    pub fn kind(&self) -> &'static str {
        match self {
            SubmitError::Busy { .. } => "busy",
            SubmitError::Stopped => "stopped",
            SubmitError::Invalid(e) => e.kind(),
        }
    }
}

/// Counts a request as in flight until dropped (queued, running, or finished).
#[derive(Debug)]
struct Slot(Arc<SchedulerStats>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Job {
    req: GenRequest,
    sink: Box<dyn EventSink>,
    /// Further choices of the same request (`n` > 1): each gets a copy of this job's state
    /// once its prompt is prefilled, and samples with the seed of its choice index.
    forks: Vec<Box<dyn EventSink>>,
    /// The in-flight count of the request (forks hold none: the request counts once).
    _slot: Option<Slot>,
    /// When it was accepted (its queue wait ends when it joins the batch).
    submitted: std::time::Instant,
}

enum Command {
    Submit(Box<Job>),
    CancelAll,
}

/// The callers' side of the engine loop. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<Command>,
    stats: Arc<SchedulerStats>,
    capacity: u64,
    context_limit: usize,
    vocab_size: usize,
    /// The context-memory pool and what a request's state costs in it.
    pool: Option<Pool>,
}

/// The context-memory pool of a budgeted engine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pool {
    pub bytes: u64,
    pub size: crate::arch::StateSize,
    /// Checkpoints a sequence may hold (what its reservation counts).
    pub checkpoints: usize,
}

impl Pool {
    /// Bytes a request reserves to join: its prompt plus the first sampled position, with its
    /// checkpoints, for each choice.
    pub(crate) fn need(&self, prompt: usize, choices: usize) -> u64 {
        memory::state_bytes(self.size, prompt + 1, self.checkpoints, choices)
    }
}

/// Recurrent-state checkpoints one sequence keeps: the configured number, fewer when they would
/// not fit in half the reuse cache's byte budget (or of the context memory).
pub(crate) fn checkpoint_limit(cfg: &SchedulerConfig, size: crate::arch::StateSize) -> usize {
    if cfg.state_cache_entries == 0 || size.per_sequence == 0 {
        return 0;
    }
    let cap = cfg.context_memory.map_or(cfg.state_cache_bytes as u64, |p| {
        p.min(cfg.state_cache_bytes as u64)
    });
    cfg.state_checkpoints.min((cap / 2 / size.per_sequence) as usize)
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Submit(_) => "Submit",
            Command::CancelAll => "CancelAll",
        })
    }
}

impl SchedulerHandle {
    /// Queue `req`; its events go to `sink`. Fails at once when full or invalid.
    pub fn submit(&self, req: GenRequest, sink: Box<dyn EventSink>) -> Result<(), SubmitError> {
        self.submit_choices(req, vec![sink])
    }

    /// Queue `req` for `sinks.len()` choices that share one prefill: choice `i` samples with
    /// [`choice_seed`]`(seed, i)` (choice 0 with the request's own seed) and its events go to
    /// `sinks[i]`.
    pub fn submit_choices(
        &self,
        req: GenRequest,
        mut sinks: Vec<Box<dyn EventSink>>,
    ) -> Result<(), SubmitError> {
        self.check(&req)?;
        req.decode.validate(self.vocab_size)?;
        if sinks.is_empty() {
            return Err(SubmitError::Invalid(Error::InvalidArgument {
                field: "n",
                reason: "must be at least 1".into(),
            }));
        }
        if let Some(pool) = self.pool
            && pool.need(req.prompt.len(), sinks.len()) > pool.bytes
        {
            return Err(SubmitError::Invalid(memory::too_long(
                pool.size,
                pool.bytes,
                req.prompt.len() + 1,
                pool.checkpoints,
                sinks.len(),
                self.context_limit,
            )));
        }
        let sink = sinks.remove(0);
        let taken = self
            .stats
            .in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.capacity).then_some(n + 1)
            });
        if let Err(in_flight) = taken {
            return Err(SubmitError::Busy {
                in_flight,
                capacity: self.capacity,
            });
        }
        let job = Job {
            req,
            sink,
            forks: sinks,
            _slot: Some(Slot(self.stats.clone())),
            submitted: std::time::Instant::now(),
        };
        self.stats.submitted();
        self.tx
            .send(Command::Submit(Box::new(job)))
            .map_err(|_| SubmitError::Stopped)
    }

    fn check(&self, req: &GenRequest) -> Result<(), Error> {
        if req.prompt.is_empty() {
            return Err(Error::InvalidArgument {
                field: "prompt",
                reason: "must contain at least one token".into(),
            });
        }
        if req.max_new_tokens == 0 {
            return Err(Error::InvalidArgument {
                field: "max_tokens",
                reason: "must be at least 1".into(),
            });
        }
        if req.prompt.len() > self.context_limit {
            return Err(Error::ContextOverflow {
                needed: req.prompt.len(),
                limit: self.context_limit,
            });
        }
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(Error::InvalidArgument {
                field: "prompt",
                reason: format!(
                    "token id {bad} is outside the vocabulary (size {})",
                    self.vocab_size
                ),
            });
        }
        Ok(())
    }

    /// Fail every queued and running request (shutdown past its deadline).
    pub fn cancel_all(&self) {
        let _ = self.tx.send(Command::CancelAll);
    }

    /// Whether the engine loop is live ([`SchedulerStats::liveness`]): `/livez`.
    pub fn liveness(&self, stall: Duration) -> Result<(), Stall> {
        self.stats.liveness(stall)
    }

    /// The loop's live counters.
    pub fn stats(&self) -> &Arc<SchedulerStats> {
        &self.stats
    }

    /// Longest sequence (prompt + generated) a request may reach.
    pub fn context_limit(&self) -> usize {
        self.context_limit
    }

    /// Requests that may be in flight at once (batch + queue).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The context memory in words (`None` without a budget): its size, the longest context
    /// one request holds in it, and what `tokens` tokens of this model need.
    pub fn describe_memory(&self, tokens: usize) -> Option<String> {
        let pool = self.pool?;
        let human = crate::cache::plan::human;
        Some(format!(
            "context memory {}: longest context {} tokens for one request ({} per token, {} per \
             sequence, {} checkpoint(s) of recurrent state); {tokens} tokens need {}",
            human(pool.bytes),
            longest_context(pool.size, pool.bytes, pool.checkpoints, self.context_limit),
            human(pool.size.per_token),
            human(pool.size.per_sequence),
            pool.checkpoints,
            human(pool.size.bytes(tokens, 0)),
        ))
    }
}

/// The seed of choice `index` of a request seeded with `seed` (choice 0 keeps it).
pub fn choice_seed(seed: u64, index: usize) -> u64 {
    if index == 0 {
        return seed;
    }
    let mut z = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 27)
}

/// Start the engine loop on its own thread. It ends when every handle is dropped and its work
/// is done.
pub fn start(
    model: Box<dyn Model>,
    cfg: SchedulerConfig,
) -> std::io::Result<(SchedulerHandle, JoinHandle<()>)> {
    start_with_faults(model, cfg, Faults::default())
}

/// [`start`] with fault points armed (tests; see [`Faults`]).
pub fn start_with_faults(
    model: Box<dyn Model>,
    cfg: SchedulerConfig,
    faults: Faults,
) -> std::io::Result<(SchedulerHandle, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let stats = Arc::new(SchedulerStats::default());
    let info = model.info();
    let context_limit = cfg
        .context_limit
        .map_or(info.max_context, |l| l.min(info.max_context))
        .max(1);
    let pool = cfg.context_memory.map(|bytes| Pool {
        bytes,
        size: info.state,
        checkpoints: checkpoint_limit(&cfg, info.state),
    });
    let handle = SchedulerHandle {
        tx,
        stats: stats.clone(),
        capacity: (cfg.max_batch.max(1) + cfg.max_queue) as u64,
        context_limit,
        vocab_size: info.vocab_size,
        pool,
    };
    let worker = worker::Worker::new(model, cfg, rx, stats, context_limit, pool).with_faults(faults);
    let thread = std::thread::Builder::new()
        .name("deltafin-engine".into())
        .spawn(move || worker.run())?;
    Ok((handle, thread))
}

#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod tests;
