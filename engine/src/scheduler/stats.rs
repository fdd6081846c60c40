//! Live counters of the engine loop, shared with whoever exports metrics. Plain atomics: the
//! loop writes, readers take snapshots; nothing here blocks the loop.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::cache::FETCH_BUCKETS;
use crate::histogram::AtomicHistogram;
pub use crate::histogram::HistogramSnapshot;
use crate::spec::SpecStats;

/// Counters and gauges of one scheduler.
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Requests accepted and not yet finished (queued + running).
    pub(crate) in_flight: AtomicU64,
    /// Requests in the running batch.
    pub(crate) running: AtomicU64,
    /// Batched passes run.
    pub(crate) steps: AtomicU64,
    /// Rows (tokens) computed over all passes.
    pub(crate) rows: AtomicU64,
    /// Tokens sampled.
    pub(crate) generated: AtomicU64,
    /// Prompt tokens computed by prefill (reused ones excluded).
    pub(crate) prefilled: AtomicU64,
    /// Prompt tokens taken from a reused state.
    pub(crate) reused_tokens: AtomicU64,
    pub(crate) reuse_hits: AtomicU64,
    pub(crate) reuse_misses: AtomicU64,
    /// Requests dropped because their receiver went away.
    pub(crate) cancelled: AtomicU64,
    /// Nanoseconds spent inside model passes.
    pub(crate) forward_nanos: AtomicU64,
    /// Nanoseconds spent computing grammar-constraint masks, and the rows masked.
    pub(crate) mask_nanos: AtomicU64,
    pub(crate) masked_rows: AtomicU64,
    /// Speculative decoding figures of every request.
    pub(crate) spec: Arc<SpecStats>,
    /// Seconds requests waited in the queue before joining the batch.
    queue_wait: AtomicHistogram<BUCKETS>,
    /// Seconds of each batched pass.
    step_seconds: AtomicHistogram<BUCKETS>,
    /// Prompt rows each pass prefilled (passes with prefill only).
    prefill_rows: AtomicHistogram<BUCKETS>,
    /// The engine loop's heartbeat: [`now_ms`] at its last tick, and at the last accepted
    /// submission (a loop idle until then has not stalled).
    tick_ms: AtomicU64,
    submit_ms: AtomicU64,
    /// Set when the engine loop's thread has ended (returned or unwound).
    stopped: AtomicBool,
    /// Engine steps that panicked: their requests failed and the loop went on.
    pub(crate) panics: AtomicU64,
}

/// Milliseconds since the first call in this process (a monotonic clock for heartbeats).
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Why the engine loop is not live.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stall {
    /// Its thread ended.
    #[error("the engine loop has stopped")]
    Stopped,
    /// Work is waiting and the loop has not ticked for longer than allowed.
    #[error("the engine loop has not made progress for {seconds} s with {in_flight} request(s) in flight")]
    Stalled { seconds: u64, in_flight: u64 },
}

/// Upper bounds of the queue-wait histogram buckets, in seconds.
pub const QUEUE_WAIT_BOUNDS: [f64; BUCKETS] = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Upper bounds of the step-time histogram buckets, in seconds.
pub const STEP_SECONDS_BOUNDS: [f64; BUCKETS] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
/// Upper bounds of the prefill-rows-per-step histogram buckets.
pub const PREFILL_ROW_BOUNDS: [f64; BUCKETS] =
    [1.0, 4.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];
const BUCKETS: usize = 10;

/// A point-in-time copy of [`SchedulerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub in_flight: u64,
    pub running: u64,
    /// Accepted requests not yet running.
    pub waiting: u64,
    pub steps: u64,
    pub rows: u64,
    pub generated: u64,
    pub prefilled: u64,
    pub reused_tokens: u64,
    pub reuse_hits: u64,
    pub reuse_misses: u64,
    pub cancelled: u64,
    /// Engine steps that panicked (their requests failed; the loop went on).
    pub panics: u64,
    pub forward_seconds_x1e9: u64,
    /// Nanoseconds spent computing grammar-constraint masks.
    pub mask_nanos: u64,
    /// Rows (sampled tokens) that were masked by a constraint.
    pub masked_rows: u64,
    /// Seconds requests waited in the queue ([`QUEUE_WAIT_BOUNDS`]).
    pub queue_wait: HistogramSnapshot,
    /// Seconds per batched pass ([`STEP_SECONDS_BOUNDS`]).
    pub step_seconds: HistogramSnapshot,
    /// Prompt rows prefilled per pass, passes with prefill only ([`PREFILL_ROW_BOUNDS`]).
    pub prefill_rows: HistogramSnapshot,
}

impl SchedulerStats {
    /// The engine loop is alive now (called at every turn of the loop).
    pub(crate) fn tick(&self) {
        self.tick_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// A request was accepted.
    pub(crate) fn submitted(&self) {
        self.submit_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// The engine loop's thread ended.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// Whether the engine loop is live: its thread runs, and with requests in flight it ticked
    /// within `stall` (of its last tick or the latest submission, whichever is later). An
    /// idle loop blocked waiting for work is live.
    pub fn liveness(&self, stall: Duration) -> Result<(), Stall> {
        if self.stopped.load(Ordering::SeqCst) {
            return Err(Stall::Stopped);
        }
        let in_flight = self.in_flight.load(Ordering::SeqCst);
        let last = self
            .tick_ms
            .load(Ordering::Relaxed)
            .max(self.submit_ms.load(Ordering::Relaxed));
        let quiet = now_ms().saturating_sub(last);
        if in_flight > 0 && quiet > stall.as_millis() as u64 {
            return Err(Stall::Stalled {
                seconds: quiet / 1000,
                in_flight,
            });
        }
        Ok(())
    }

    /// Engine steps that panicked (their requests failed; the loop went on).
    pub fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }

    /// Read every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let in_flight = get(&self.in_flight);
        let running = get(&self.running);
        StatsSnapshot {
            in_flight,
            running,
            waiting: in_flight.saturating_sub(running),
            steps: get(&self.steps),
            rows: get(&self.rows),
            generated: get(&self.generated),
            prefilled: get(&self.prefilled),
            reused_tokens: get(&self.reused_tokens),
            reuse_hits: get(&self.reuse_hits),
            reuse_misses: get(&self.reuse_misses),
            cancelled: get(&self.cancelled),
            panics: get(&self.panics),
            forward_seconds_x1e9: get(&self.forward_nanos),
            mask_nanos: get(&self.mask_nanos),
            masked_rows: get(&self.masked_rows),
            queue_wait: self.queue_wait.snapshot(),
            step_seconds: self.step_seconds.snapshot(),
            prefill_rows: self.prefill_rows.snapshot(),
        }
    }

    /// A request joined the batch after waiting `wait`.
    pub(crate) fn record_queue_wait(&self, wait: std::time::Duration) {
        self.queue_wait.observe(&QUEUE_WAIT_BOUNDS, wait.as_secs_f64());
    }

    /// A pass took `elapsed` and prefilled `rows` prompt rows.
    pub(crate) fn record_step(&self, elapsed: std::time::Duration, rows: usize) {
        self.step_seconds
            .observe(&STEP_SECONDS_BOUNDS, elapsed.as_secs_f64());
        if rows > 0 {
            self.prefill_rows.observe(&PREFILL_ROW_BOUNDS, rows as f64);
        }
    }

    /// Drafting figures summed over every request.
    pub fn speculation(&self) -> crate::spec::SpecSummary {
        self.spec.snapshot()
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Where an expert's weights came from when a pass needed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertSource {
    /// Pinned in RAM/VRAM by the heat policy.
    Pinned,
    /// Served from the OS page cache (or an already-resident slot).
    PageCache,
    /// Read from local disk.
    Disk,
    /// Fetched over the network (stream mode).
    Network,
}

impl ExpertSource {
    /// Every source, in label order.
    pub const ALL: [ExpertSource; 4] = [
        ExpertSource::Pinned,
        ExpertSource::PageCache,
        ExpertSource::Disk,
        ExpertSource::Network,
    ];

    /// The `source` metric label.
    pub fn label(self) -> &'static str {
        match self {
            ExpertSource::Pinned => "pinned",
            ExpertSource::PageCache => "page_cache",
            ExpertSource::Disk => "disk",
            ExpertSource::Network => "network",
        }
    }
}

/// Expert reads and bytes by source. The expert cache (out-of-core streaming) records into it;
/// metrics and benchmarks read it. Until a cache feeds it, every counter stays zero.
#[derive(Debug, Default)]
pub struct ExpertIoStats {
    reads: [AtomicU64; 4],
    bytes: [AtomicU64; 4],
    /// Seconds per expert fetch ([`crate::cache::FETCH_SECONDS_BOUNDS`]), as the store saw them.
    fetch: std::sync::Mutex<HistogramSnapshot<FETCH_BUCKETS>>,
}

impl ExpertIoStats {
    /// Count one expert read of `bytes` from `source`.
    pub fn record(&self, source: ExpertSource, bytes: u64) {
        self.reads[source as usize].fetch_add(1, Ordering::Relaxed);
        self.bytes[source as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Count `reads` expert reads totalling `bytes` from `source`.
    pub fn add(&self, source: ExpertSource, reads: u64, bytes: u64) {
        self.reads[source as usize].fetch_add(reads, Ordering::Relaxed);
        self.bytes[source as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Set the expert-fetch histogram (the store keeps it; this is a copy taken at scrape time).
    pub fn set_fetch(&self, h: HistogramSnapshot<FETCH_BUCKETS>) {
        *self
            .fetch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = h;
    }

    /// The expert-fetch histogram (empty until a store reported one).
    pub fn fetch(&self) -> HistogramSnapshot<FETCH_BUCKETS> {
        *self
            .fetch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `(reads, bytes)` from `source`.
    pub fn get(&self, source: ExpertSource) -> (u64, u64) {
        (
            self.reads[source as usize].load(Ordering::Relaxed),
            self.bytes[source as usize].load(Ordering::Relaxed),
        )
    }

    /// Fraction of reads served without touching disk or network (`None` before any read).
    pub fn hit_ratio(&self) -> Option<f64> {
        let reads: Vec<u64> = ExpertSource::ALL.iter().map(|&s| self.get(s).0).collect();
        let total: u64 = reads.iter().sum();
        (total > 0).then(|| (reads[0] + reads[1]) as f64 / total as f64)
    }
}
