//! The engine loop itself (the I/O shell around [`super::plan`], [`super::reuse`] and
//! [`crate::spec::verify`]): take commands, drop cancelled requests, admit queued ones, ask each
//! decoding request's proposers for drafts, run one batched pass, verify and sample, stream,
//! finish. Runs on one thread that owns the model.
//!
//! A panic anywhere in a turn of the loop fails the requests of that turn (each gets a
//! `Failed` event, never a hang), drops the reuse cache (a state may be half-written) and the
//! loop goes on; queued requests keep their place. The loop ticks a heartbeat every turn
//! ([`SchedulerStats::liveness`]) and marks itself stopped when its thread ends.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use super::memory::{self, Admission};
use super::pace::{Pacer, fraction};
use super::plan::{Phase, PrefillBudget, Work, plan_step, positions};
use super::reuse::StateCache;
use super::{
    Command, Completion, Event, EventSink, Faults, FinishReason, Job, Pool, SchedulerConfig, SchedulerStats,
    checkpoint_limit,
};
use crate::arch::{LogitRows, Model, SeqInput, Trace};
use crate::generate::{Decoder, Pick};
use crate::spec::{Observation, Speculator, draft_budget, verify};
use crate::state::SeqState;

#[path = "worker_recovery.rs"]
mod recovery;
use recovery::Stopped;

/// One running request.
struct Seq {
    job: Job,
    state: SeqState,
    /// Prompt tokens already in `state`.
    fed: usize,
    output: Vec<u32>,
    /// Prompt and output so far (the pending token last while decoding).
    history: Vec<u32>,
    /// The decode rows of the current step: the pending token, then the drafts.
    rows: Vec<u32>,
    spec: Option<Speculator>,
    /// Token selection (bias, penalties, constraint, log-probabilities).
    decoder: Decoder,
    cached: usize,
    /// Context-memory bytes reserved at admission (its prompt's state and checkpoints).
    reserved: u64,
    /// Set when the request leaves the batch after this step.
    end: Option<End>,
}

enum End {
    Finished(FinishReason),
    Cancelled,
    Failed,
}

impl Seq {
    /// Context-memory bytes it holds or has reserved.
    fn held(&self) -> u64 {
        self.reserved.max(self.state.cache_bytes() as u64)
    }

    fn phase(&self) -> Phase {
        let total = self.job.req.prompt.len();
        if self.fed < total {
            Phase::Prefill {
                done: self.fed,
                total,
            }
        } else {
            Phase::Decode
        }
    }
}

pub(super) struct Worker {
    model: Box<dyn Model>,
    cfg: SchedulerConfig,
    rx: Receiver<Command>,
    stats: Arc<SchedulerStats>,
    waiting: VecDeque<Job>,
    running: Vec<Seq>,
    cache: StateCache<SeqState>,
    limit: usize,
    connected: bool,
    /// Choices forked during this step's `advance`, joined once it is done.
    pending_forks: Vec<(Seq, Pick)>,
    /// Sizes each step's prefill budget by measured step times.
    pacer: Pacer,
    /// The context-memory pool (under a memory budget).
    pool: Option<Pool>,
    /// Recurrent-state checkpoints a prefilling sequence keeps.
    checkpoints: usize,
    /// Armed fault points (tests only; empty otherwise).
    faults: Faults,
}

fn add(counter: &AtomicU64, n: usize) {
    SchedulerStats::add(counter, n as u64);
}

impl Worker {
    pub(super) fn new(
        model: Box<dyn Model>,
        cfg: SchedulerConfig,
        rx: Receiver<Command>,
        stats: Arc<SchedulerStats>,
        limit: usize,
        pool: Option<Pool>,
    ) -> Self {
        let checkpoints = checkpoint_limit(&cfg, model.info().state);
        let pacer = Pacer::new(cfg.prefill_step);
        let cache = StateCache::new(
            cfg.state_cache_entries,
            cfg.state_cache_bytes,
            cfg.min_reuse_tokens,
        );
        Worker {
            model,
            cfg,
            rx,
            stats,
            waiting: VecDeque::new(),
            running: Vec::new(),
            cache,
            limit,
            connected: true,
            pending_forks: Vec::new(),
            pacer,
            pool,
            checkpoints,
            faults: Faults::default(),
        }
    }

    /// Arm fault points (tests).
    pub(super) fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    pub(super) fn run(mut self) {
        let _stopped = Stopped(self.stats.clone());
        loop {
            self.intake();
            if !self.connected && self.running.is_empty() && self.waiting.is_empty() {
                return;
            }
            self.stats.tick();
            if let Err(payload) = std::panic::catch_unwind(AssertUnwindSafe(|| self.turn())) {
                self.recover(payload.as_ref());
            }
        }
    }

    /// One turn: drop cancelled requests, admit, run a step, retire.
    fn turn(&mut self) {
        self.drop_cancelled();
        self.admit();
        if self.running.is_empty() {
            return;
        }
        // A simulated slow model: the delay comes before the pass, so even the first token
        // of a request waits for it.
        if !self.cfg.step_delay.is_zero() {
            std::thread::sleep(self.cfg.step_delay);
        }
        // The pass runs on a pool worker, so its parallel loops start there (the engine
        // thread is outside the pool and only waits for requests).
        crate::pool::on_pool(|| self.step());
        self.faults.point("retire");
        self.retire();
        self.trim_cache();
        #[cfg(debug_assertions)]
        self.check_pool();
    }

    /// The context-memory invariant, checked after every step in debug builds (every test
    /// with a pool): what the running states and the reuse cache really hold, shared blocks
    /// counted once, is within the pool.
    #[cfg(debug_assertions)]
    fn check_pool(&self) {
        if let Some(pool) = self.pool {
            let running: Vec<&SeqState> = self.running.iter().map(|s| &s.state).collect();
            let held = self.cache.bytes_with(&running) as u64;
            assert!(
                held <= pool.bytes,
                "context memory {held} B over the pool's {} B",
                pool.bytes
            );
        }
    }

    /// Under a context-memory pool, the reuse cache holds only what the running sequences leave.
    fn trim_cache(&mut self) {
        if let Some(pool) = self.pool {
            let used: u64 = self.running.iter().map(Seq::held).sum();
            self.evict_cache_to(pool.bytes.saturating_sub(used), None);
        }
    }

    /// Evict reuse-cache entries until what only the cache keeps alive, beside the running
    /// sequences' states (and `joining`, a state being admitted), fits in `limit` bytes.
    fn evict_cache_to(&mut self, limit: u64, joining: Option<&SeqState>) {
        let running: Vec<&SeqState> = self.running.iter().map(|s| &s.state).chain(joining).collect();
        self.cache.evict_to(limit as usize, &running);
    }

    /// Take pending commands; block only when there is nothing to do.
    fn intake(&mut self) {
        if self.connected && self.running.is_empty() && self.waiting.is_empty() {
            match self.rx.recv() {
                Ok(cmd) => self.command(cmd),
                Err(_) => self.connected = false,
            }
        }
        while self.connected {
            match self.rx.try_recv() {
                Ok(cmd) => self.command(cmd),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => self.connected = false,
            }
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(job) => self.waiting.push_back(*job),
            Command::CancelAll => {
                let message = "the server is shutting down".to_string();
                for job in self.waiting.drain(..) {
                    job.sink.send(Event::Failed {
                        kind: "shutdown",
                        message: message.clone(),
                    });
                }
                for seq in self.running.drain(..) {
                    seq.job.sink.send(Event::Failed {
                        kind: "shutdown",
                        message: message.clone(),
                    });
                }
                self.stats.running.store(0, Ordering::Relaxed);
            }
        }
    }

    fn drop_cancelled(&mut self) {
        // Counted before they are dropped: dropping a request frees its in-flight slot, and a
        // reader that sees the slot free must also see the cancellation.
        let (closed_jobs, waiting): (VecDeque<Job>, VecDeque<Job>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|j| j.sink.is_closed());
        let (closed_seqs, running): (Vec<Seq>, Vec<Seq>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|s| s.job.sink.is_closed());
        (self.waiting, self.running) = (waiting, running);
        add(&self.stats.cancelled, closed_jobs.len() + closed_seqs.len());
        drop((closed_jobs, closed_seqs));
        self.stats
            .running
            .store(self.running.len() as u64, Ordering::Relaxed);
    }

    /// Move queued requests into the batch (FIFO), starting each from a reused state if any.
    fn admit(&mut self) {
        self.faults.point("admit");
        while self.running.len() < self.cfg.max_batch.max(1) {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let (reserved, cache_limit) = match self.pool {
                Some(pool) => {
                    let need = pool.need(front.req.prompt.len(), 1 + front.forks.len());
                    let used: u64 = self.running.iter().map(Seq::held).sum();
                    match memory::admit(pool.bytes, used, need) {
                        Admission::Now { cache_limit } => (need, Some(cache_limit)),
                        // Running requests hold the memory: wait for one to finish (FIFO).
                        Admission::Wait => break,
                    }
                }
                None => (0, None),
            };
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.stats.record_queue_wait(job.submitted.elapsed());
            let reused = if job.req.reuse_state {
                self.cache.lookup(&job.req.prompt)
            } else {
                None
            };
            // The reuse cache gives way to the new request (whose state shares the entry's blocks).
            if let Some(limit) = cache_limit {
                self.evict_cache_to(limit, reused.as_ref().map(|r| &r.state));
            }
            if job.req.reuse_state {
                add(
                    if reused.is_some() {
                        &self.stats.reuse_hits
                    } else {
                        &self.stats.reuse_misses
                    },
                    1,
                );
            }
            let (state, cached) = match reused {
                Some(r) => (r.state, r.len),
                None => (self.model.new_state(), 0),
            };
            add(&self.stats.reused_tokens, cached);
            if !job.sink.send(Event::Started {
                cached_tokens: cached,
            }) {
                add(&self.stats.cancelled, 1);
                continue;
            }
            let decoder = match Decoder::new(job.req.sampling, job.req.decode.clone(), &job.req.prompt) {
                Ok(d) => d,
                Err(e) => {
                    let (kind, message) = (e.kind(), e.to_string());
                    job.sink.send(Event::Failed {
                        kind,
                        message: message.clone(),
                    });
                    for fork in &job.forks {
                        fork.send(Event::Failed {
                            kind,
                            message: message.clone(),
                        });
                    }
                    continue;
                }
            };
            let spec = self
                .cfg
                .drafts
                .speculator(job.req.kind, job.req.spec, Some(self.stats.spec.clone()));
            self.running.push(Seq {
                history: job.req.prompt.clone(),
                job,
                state,
                fed: cached,
                output: Vec::new(),
                rows: Vec::new(),
                spec,
                decoder,
                cached,
                reserved,
                end: None,
            });
        }
        self.stats
            .running
            .store(self.running.len() as u64, Ordering::Relaxed);
    }

    /// Ask every decoding sequence's proposers for this step's drafts.
    fn plan_drafts(&mut self, phases: &[Phase]) {
        self.faults.point("plan_drafts");
        let model = self.model.as_ref();
        for (seq, phase) in self.running.iter_mut().zip(phases) {
            seq.rows.clear();
            if *phase != Phase::Decode {
                continue;
            }
            seq.rows.push(*seq.history.last().unwrap_or(&0));
            let Some(spec) = seq.spec.as_mut() else { continue };
            let room = self.limit.saturating_sub(seq.state.len());
            let budget = seq
                .job
                .req
                .max_new_tokens
                .saturating_sub(seq.output.len())
                .min(room);
            let plan = spec.plan(model, &seq.history, draft_budget(usize::MAX, budget, room));
            seq.rows.extend_from_slice(&plan.drafts);
        }
    }

    /// One batched pass over every running sequence, then verification and sampling.
    fn step(&mut self) {
        let phases: Vec<Phase> = self.running.iter().map(Seq::phase).collect();
        let max = PrefillBudget {
            tokens: self.cfg.prefill_chunk,
            positions: self.cfg.prefill_positions,
        };
        let prefilling = phases.iter().filter(|p| **p != Phase::Decode).count();
        let contended = prefilling != phases.len() || prefilling > 1 || !self.waiting.is_empty();
        let budget = self
            .pacer
            .step_budget(max, self.cfg.prefill_chunk_solo, contended);
        let mut works = plan_step(&phases, budget);
        self.plan_drafts(&phases);
        self.fit_pass(&mut works, &phases);
        if works.is_empty() {
            return;
        }
        let (prefill_rows, prefill_positions) = works
            .iter()
            .filter(|w| matches!(phases[w.seq], Phase::Prefill { .. }))
            .fold((0, 0), |(r, p), w| (r + w.len, p + positions(w.start, w.len)));
        let mut names: Vec<String> = Vec::new();
        for w in &works {
            for c in self.running[w.seq]
                .spec
                .as_ref()
                .map(Speculator::captures)
                .unwrap_or(&[])
            {
                if !names.contains(c) {
                    names.push(c.clone());
                }
            }
        }
        let mut trace = (!names.is_empty()).then(|| Trace::capture(&names));
        let started = Instant::now();
        let result = {
            let mut inputs = Vec::with_capacity(works.len());
            let mut next = works.iter().peekable();
            for (i, seq) in self.running.iter_mut().enumerate() {
                let Some(w) = next.next_if(|w| w.seq == i) else {
                    continue;
                };
                let (tokens, logits): (&[u32], LogitRows) = match phases[i] {
                    Phase::Prefill { .. } => {
                        let rows = if w.logits {
                            LogitRows::Last
                        } else {
                            LogitRows::None
                        };
                        (&seq.job.req.prompt[w.start..w.start + w.len], rows)
                    }
                    Phase::Decode if seq.rows.len() > 1 => (&seq.rows, LogitRows::All),
                    Phase::Decode => (&seq.rows, LogitRows::Last),
                };
                inputs.push(SeqInput {
                    state: &mut seq.state,
                    tokens,
                    logits,
                });
            }
            let model = &self.model;
            let trace = trace.as_mut();
            let faults = &mut self.faults;
            // A panicking pass fails its batch, not the server.
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                faults.point("forward");
                model.forward(&mut inputs, trace)
            }))
        };
        let elapsed = started.elapsed();
        self.pacer.observe(
            elapsed.as_secs_f64(),
            fraction(prefill_rows, prefill_positions, max),
        );
        self.stats.record_step(elapsed, prefill_rows);
        add(&self.stats.forward_nanos, elapsed.as_nanos() as usize);
        add(&self.stats.steps, 1);
        let rows: usize = works.iter().map(|w| self.pass_rows(w, &phases)).sum();
        add(&self.stats.rows, rows);
        match result {
            Ok(Ok(logits)) => self.advance(&works, &phases, &logits, trace.as_ref(), elapsed.as_secs_f64()),
            Ok(Err(e)) => self.fail(&works, e.kind(), &e.to_string()),
            Err(_) => self.fail(&works, "internal", "the model pass panicked"),
        }
    }

    /// Under a context-memory pool: make this pass's growth fit. The reuse cache gives way
    /// first; then the latest admitted growing sequences are stopped with a budget error and
    /// leave the pass (the others' tokens are unaffected: rows are batch-invariant).
    fn fit_pass(&mut self, works: &mut Vec<Work>, phases: &[Phase]) {
        let Some(pool) = self.pool else { return };
        let mut growth = vec![0u64; self.running.len()];
        for w in works.iter() {
            let seq = &self.running[w.seq];
            let (rows, checkpoint) = match phases[w.seq] {
                Phase::Prefill { .. } => (w.len, self.checkpoints > 0 && seq.job.req.reuse_state),
                Phase::Decode => (seq.rows.len(), false),
            };
            // Whole blocks for the new positions, and the checkpoint it may take.
            let checkpoints = seq.state.checkpoint_count() + usize::from(checkpoint);
            let after = pool.size.bytes(seq.state.len() + rows, checkpoints);
            // Growth beyond what the sequence already reserved.
            growth[w.seq] = after.saturating_sub(seq.held());
        }
        let held: Vec<(u64, u64)> = self
            .running
            .iter()
            .zip(&growth)
            .map(|(seq, &g)| (seq.held(), g))
            .collect();
        let (stop, cache_limit) = memory::fit_pass(pool.bytes, &held);
        self.evict_cache_to(cache_limit, None);
        for &i in &stop {
            let seq = &mut self.running[i];
            let e = memory::exhausted(pool.bytes, seq.state.len());
            seq.job.sink.send(Event::Failed {
                kind: e.kind(),
                message: e.to_string(),
            });
            seq.end = Some(End::Failed);
        }
        works.retain(|w| !stop.contains(&w.seq));
    }

    /// Rows a work contributed to the pass.
    fn pass_rows(&self, w: &Work, phases: &[Phase]) -> usize {
        match phases[w.seq] {
            Phase::Prefill { .. } => w.len,
            Phase::Decode => self.running[w.seq].rows.len(),
        }
    }

    fn fail(&mut self, works: &[Work], kind: &'static str, message: &str) {
        for w in works {
            let seq = &mut self.running[w.seq];
            seq.job.sink.send(Event::Failed {
                kind,
                message: message.to_string(),
            });
            seq.end = Some(End::Failed);
        }
    }

    fn advance(
        &mut self,
        works: &[Work],
        phases: &[Phase],
        logits: &[f32],
        trace: Option<&Trace>,
        seconds: f64,
    ) {
        self.faults.point("advance");
        let vocab = self.model.info().vocab_size;
        let width = self.model.info().hidden_size;
        let mut rows = logits.chunks_exact(vocab);
        let mut offset = 0;
        for w in works {
            let n = self.pass_rows(w, phases);
            let first = offset;
            offset += n;
            let wanted = match phases[w.seq] {
                Phase::Prefill { .. } => usize::from(w.logits),
                Phase::Decode => n,
            };
            let got: Vec<&[f32]> = rows.by_ref().take(wanted).collect();
            let seq = &mut self.running[w.seq];
            if got.len() < wanted {
                seq.job.sink.send(Event::Failed {
                    kind: "internal",
                    message: "missing logits row".into(),
                });
                seq.end = Some(End::Failed);
                continue;
            }
            let model = self.model.as_ref();
            let capture = |spec: &Speculator, keep: usize| -> Vec<(String, Vec<f32>)> {
                trace
                    .map(|t| t.rows(spec.captures(), first, keep, width))
                    .unwrap_or_default()
            };
            let tokens = match phases[w.seq] {
                Phase::Prefill { .. } => {
                    seq.fed += w.len;
                    add(&self.stats.prefilled, w.len);
                    seq.state.commit_all();
                    if seq.job.req.reuse_state {
                        // Free here (the state is committed); lets a later prompt that shares
                        // only part of this one rewind a recurrent state to it.
                        seq.state.checkpoint(self.checkpoints);
                    }
                    if let Some(spec) = seq.spec.as_mut() {
                        let hidden = capture(spec, w.len);
                        let chunk = &seq.job.req.prompt[w.start..w.start + w.len];
                        spec.observe(
                            model,
                            &Observation {
                                start: seq.state.len() - w.len,
                                tokens: chunk,
                                hidden: &hidden,
                            },
                        );
                    }
                    let Some(row) = got.first() else { continue };
                    let position = seq.state.len();
                    if seq.fed == seq.job.req.prompt.len()
                        && seq.job.req.reuse_state
                        && self.cfg.state_cache_entries > 0
                    {
                        // The prompt's state is reusable as soon as it is prefilled: a request
                        // sharing this prompt as a prefix (a second agent with the same system
                        // prompt and tools) starts from it without waiting for this one to end.
                        self.cache.insert(seq.job.req.prompt.clone(), seq.state.clone());
                    }
                    let forks = std::mem::take(&mut seq.job.forks);
                    let picked = pick_and_accept(&mut seq.decoder, row, position);
                    let forked = self.fork(w.seq, forks, row, position);
                    self.pending_forks.extend(forked);
                    picked.map(|p| vec![p])
                }
                Phase::Decode => verify_step(seq, &got, self.limit, seconds, model, &capture),
            };
            match tokens {
                Ok(tokens) => self.emit(w.seq, &tokens),
                Err(e) => {
                    let seq = &mut self.running[w.seq];
                    seq.job.sink.send(Event::Failed {
                        kind: e.kind(),
                        message: e.to_string(),
                    });
                    seq.end = Some(End::Failed);
                }
            }
        }
        for (seq, pick) in std::mem::take(&mut self.pending_forks) {
            self.running.push(seq);
            let i = self.running.len() - 1;
            self.emit(i, &[pick]);
        }
    }

    /// The further choices of the sequence at `i`, whose prompt was just prefilled (its state
    /// holds the whole prompt; `row` is the logits of its last position): each starts from a
    /// copy of the state and makes its own first pick from the same row.
    fn fork(
        &mut self,
        i: usize,
        forks: Vec<Box<dyn EventSink>>,
        row: &[f32],
        position: usize,
    ) -> Vec<(Seq, Pick)> {
        let mut out = Vec::new();
        for (k, sink) in forks.into_iter().enumerate() {
            let parent = &self.running[i];
            let req = &parent.job.req;
            let sampling = req
                .sampling
                .with_seed(super::choice_seed(seed_of(req.sampling), k + 1));
            let made = Decoder::new(sampling, req.decode.clone(), &req.prompt).and_then(|mut d| {
                let p = d.pick(row, position)?;
                d.accept(p.token)?;
                Ok((d, p))
            });
            let (decoder, pick) = match made {
                Ok(x) => x,
                Err(e) => {
                    sink.send(Event::Failed {
                        kind: e.kind(),
                        message: e.to_string(),
                    });
                    continue;
                }
            };
            if !sink.send(Event::Started {
                cached_tokens: parent.cached,
            }) {
                continue;
            }
            let mut req = req.clone();
            req.sampling = sampling;
            let spec = self
                .cfg
                .drafts
                .speculator(req.kind, req.spec, Some(self.stats.spec.clone()));
            let seq = Seq {
                history: req.prompt.clone(),
                job: Job {
                    req,
                    sink,
                    forks: Vec::new(),
                    _slot: None,
                    submitted: Instant::now(),
                },
                state: parent.state.clone(),
                fed: parent.fed,
                output: Vec::new(),
                rows: Vec::new(),
                spec,
                decoder,
                cached: parent.cached,
                reserved: 0,
                end: None,
            };
            out.push((seq, pick));
        }
        out
    }

    /// Stream `tokens` (made by one pass) to the sequence, ending it on a stop id, the output or
    /// context limit, or a closed receiver.
    fn emit(&mut self, i: usize, tokens: &[Pick]) {
        let seq = &mut self.running[i];
        // The state holds every emitted token but the last (the new pending one).
        let base = seq.state.len() + 1 - tokens.len();
        for (j, pick) in tokens.iter().enumerate() {
            let token = pick.token;
            seq.output.push(token);
            seq.history.push(token);
            add(&self.stats.generated, 1);
            if let Some(lp) = &pick.logprobs {
                seq.job.sink.send(Event::Logprobs(lp.clone()));
            }
            if !seq.job.sink.send(Event::Token(token)) {
                seq.end = Some(End::Cancelled);
            } else if seq.job.req.stop_ids.contains(&token) {
                seq.end = Some(End::Finished(FinishReason::Stop));
            } else if seq.output.len() >= seq.job.req.max_new_tokens || base + j >= self.limit {
                seq.end = Some(End::Finished(FinishReason::Length));
            }
            if seq.end.is_some() {
                break;
            }
        }
    }

    /// Remove ended sequences: report completions and commit their states for reuse.
    fn retire(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].end.is_none() {
                i += 1;
                continue;
            }
            let seq = self.running.remove(i);
            let (nanos, rows) = seq.decoder.mask_time();
            SchedulerStats::add(&self.stats.mask_nanos, nanos);
            SchedulerStats::add(&self.stats.masked_rows, rows);
            match seq.end {
                Some(End::Finished(reason)) => self.finish(seq, reason),
                Some(End::Cancelled) => add(&self.stats.cancelled, 1),
                _ => {}
            }
        }
        self.stats
            .running
            .store(self.running.len() as u64, Ordering::Relaxed);
    }

    fn finish(&mut self, seq: Seq, finish_reason: FinishReason) {
        let req = &seq.job.req;
        let completion = Completion {
            finish_reason,
            prompt_tokens: req.prompt.len(),
            generated_tokens: seq.output.len(),
            cached_tokens: seq.cached,
        };
        seq.job.sink.send(Event::Done(completion));
        if req.reuse_state && self.cfg.state_cache_entries > 0 {
            // The last sampled token was never run through the model.
            let mut ids = req.prompt.clone();
            ids.extend_from_slice(&seq.output[..seq.output.len().saturating_sub(1)]);
            if ids.len() == seq.state.len() {
                self.cache.insert(ids, seq.state);
            }
        }
    }
}

/// Captured hidden rows of a sequence's first `n` rows in the pass, for its proposers.
type Capture<'a> = dyn Fn(&Speculator, usize) -> Vec<(String, Vec<f32>)> + 'a;

/// The seed a sampling draws from (0 for greedy, which ignores it).
fn seed_of(sampling: crate::generate::Sampling) -> u64 {
    match sampling {
        crate::generate::Sampling::Random { seed, .. } => seed,
        crate::generate::Sampling::Greedy => 0,
    }
}

/// Pick the token at `position` and advance the decoder past it.
fn pick_and_accept(decoder: &mut Decoder, row: &[f32], position: usize) -> crate::error::Result<Pick> {
    let pick = decoder.pick(row, position)?;
    decoder.accept(pick.token)?;
    Ok(pick)
}

/// Verify a decode step of `seq` (its pass's `picks` rows are `logits`): commit the accepted
/// rows, tell its proposers, return the tokens to emit.
///
/// Rows are decided in order, exactly as plain decoding would decide them: row `i` is picked by
/// the decoder after it accepted picks `0..i` (a grammar constraint or a penalty sees the same
/// history), and picking stops at the first draft that differs from the pick before it, or
/// after a stop id.
fn verify_step(
    seq: &mut Seq,
    logits: &[&[f32]],
    limit: usize,
    seconds: f64,
    model: &dyn Model,
    capture: &Capture<'_>,
) -> crate::error::Result<Vec<Pick>> {
    let n = seq.rows.len();
    let begin = seq.state.len() - n;
    let budget = seq
        .job
        .req
        .max_new_tokens
        .saturating_sub(seq.output.len())
        .min(limit.saturating_sub(begin));
    let mut picks: Vec<Pick> = Vec::with_capacity(n);
    for (i, row) in logits.iter().enumerate() {
        let pick = pick_and_accept(&mut seq.decoder, row, begin + i + 1)?;
        let token = pick.token;
        picks.push(pick);
        let matches_next = seq.rows.get(i + 1) == Some(&token);
        if !matches_next || seq.job.req.stop_ids.contains(&token) || picks.len() >= budget.max(1) {
            break;
        }
    }
    let ids: Vec<u32> = picks.iter().map(|p| p.token).collect();
    let drafts = &seq.rows[1..ids.len()];
    let verdict = verify(drafts, &ids, &seq.job.req.stop_ids, budget.max(1));
    if let Err(e) = seq.state.commit(verdict.commit_rows) {
        tracing::error!(error = %e, "commit of a verified pass failed");
    }
    if let Some(spec) = seq.spec.as_mut() {
        spec.finish(verdict.accepted, seconds);
        let hidden = capture(spec, verdict.commit_rows);
        spec.observe(
            model,
            &Observation {
                start: begin,
                tokens: &seq.rows[..verdict.commit_rows],
                hidden: &hidden,
            },
        );
    }
    picks.truncate(verdict.emitted.len());
    Ok(picks)
}
