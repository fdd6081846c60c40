//! The engine loop itself (the I/O shell around [`super::plan`] and [`super::reuse`]): take
//! commands, drop cancelled requests, admit queued ones, run one batched pass, sample, stream,
//! finish. Runs on one thread that owns the model.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use super::plan::{Phase, Work, plan_step};
use super::reuse::StateCache;
use super::{Command, Completion, Event, FinishReason, Job, SchedulerConfig, SchedulerStats};
use crate::arch::{LogitRows, Model, SeqInput};
use crate::generate::SeqState;

/// One running request.
struct Seq {
    job: Job,
    state: SeqState,
    /// Prompt tokens already in `state`.
    fed: usize,
    output: Vec<u32>,
    cached: usize,
    /// Set when the request leaves the batch after this step.
    end: Option<End>,
}

enum End {
    Finished(FinishReason),
    Cancelled,
    Failed,
}

impl Seq {
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
    ) -> Self {
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
        }
    }

    pub(super) fn run(mut self) {
        loop {
            self.intake();
            if !self.connected && self.running.is_empty() && self.waiting.is_empty() {
                return;
            }
            self.drop_cancelled();
            self.admit();
            if self.running.is_empty() {
                continue;
            }
            // A simulated slow model: the delay comes before the pass, so even the first token
            // of a request waits for it.
            if !self.cfg.step_delay.is_zero() {
                std::thread::sleep(self.cfg.step_delay);
            }
            self.step();
            self.retire();
        }
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
            Command::Submit(job) => self.waiting.push_back(job),
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
        let before = self.waiting.len() + self.running.len();
        self.waiting.retain(|j| !j.sink.is_closed());
        self.running.retain(|s| !s.job.sink.is_closed());
        add(
            &self.stats.cancelled,
            before - self.waiting.len() - self.running.len(),
        );
        self.stats
            .running
            .store(self.running.len() as u64, Ordering::Relaxed);
    }

    /// Move queued requests into the batch (FIFO), starting each from a reused state if any.
    fn admit(&mut self) {
        while self.running.len() < self.cfg.max_batch.max(1) {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            let reused = if job.req.reuse_state {
                self.cache.lookup(&job.req.prompt)
            } else {
                None
            };
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
            self.running.push(Seq {
                job,
                state,
                fed: cached,
                output: Vec::new(),
                cached,
                end: None,
            });
        }
        self.stats
            .running
            .store(self.running.len() as u64, Ordering::Relaxed);
    }

    /// One batched pass over every running sequence, then sampling.
    fn step(&mut self) {
        let phases: Vec<Phase> = self.running.iter().map(Seq::phase).collect();
        let works = plan_step(&phases, self.cfg.prefill_chunk);
        let started = Instant::now();
        let result = {
            let mut inputs = Vec::with_capacity(works.len());
            let mut next = works.iter().peekable();
            for (i, seq) in self.running.iter_mut().enumerate() {
                let Some(w) = next.next_if(|w| w.seq == i) else {
                    continue;
                };
                let tokens: &[u32] = match phases[i] {
                    Phase::Prefill { .. } => &seq.job.req.prompt[w.start..w.start + w.len],
                    Phase::Decode => std::slice::from_ref(seq.output.last().unwrap_or(&0)),
                };
                let logits = if w.logits {
                    LogitRows::Last
                } else {
                    LogitRows::None
                };
                inputs.push(SeqInput {
                    state: &mut seq.state,
                    tokens,
                    logits,
                });
            }
            let model = &self.model;
            // A panicking pass fails its batch, not the server.
            std::panic::catch_unwind(AssertUnwindSafe(|| model.forward(&mut inputs, None)))
        };
        add(&self.stats.forward_nanos, started.elapsed().as_nanos() as usize);
        add(&self.stats.steps, 1);
        add(&self.stats.rows, works.iter().map(|w| w.len).sum());
        match result {
            Ok(Ok(logits)) => self.advance(&works, &phases, &logits),
            Ok(Err(e)) => self.fail(&works, e.kind(), &e.to_string()),
            Err(_) => self.fail(&works, "internal", "the model pass panicked"),
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

    fn advance(&mut self, works: &[Work], phases: &[Phase], logits: &[f32]) {
        let vocab = self.model.info().vocab_size;
        let mut rows = logits.chunks_exact(vocab);
        for w in works {
            let seq = &mut self.running[w.seq];
            if let Phase::Prefill { .. } = phases[w.seq] {
                seq.fed += w.len;
                add(&self.stats.prefilled, w.len);
            }
            if !w.logits {
                continue;
            }
            let Some(row) = rows.next() else {
                seq.job.sink.send(Event::Failed {
                    kind: "internal",
                    message: "missing logits row".into(),
                });
                seq.end = Some(End::Failed);
                continue;
            };
            let token = seq.job.req.sampling.pick(row, seq.state.len());
            seq.output.push(token);
            add(&self.stats.generated, 1);
            if !seq.job.sink.send(Event::Token(token)) {
                seq.end = Some(End::Cancelled);
            } else if seq.job.req.stop_ids.contains(&token) {
                seq.end = Some(End::Finished(FinishReason::Stop));
            } else if seq.output.len() >= seq.job.req.max_new_tokens || seq.state.len() >= self.limit {
                seq.end = Some(End::Finished(FinishReason::Length));
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
