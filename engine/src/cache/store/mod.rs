//! The expert store: serves routed experts to the MoE layers from the slot cache, reading
//! misses through the reader pool, pre-reading the next layer's predicted experts, recording
//! heat, and counting where every expert byte came from.
//!
//! Per MoE layer and pass ([`LayerExperts::for_each_expert`]): tell the policy and the heat
//! recorder what the router selected; cancel this layer's prefetches that lost; pin hits and
//! submit demand reads for misses in disk order, at most the reader's threads at a time (more
//! as they land: `layer.rs`); then submit the prefetch planned for the next layer; then run
//! experts as they become ready (hits first).
//!
//! Stream installs ([`ExpertStore::set_remote`]): before a layer's experts are looked up, the
//! exact byte ranges of every selected expert that are not local yet are made local through the
//! [`RangeSource`] (several at once), and the file they landed in is checked to be the one the
//! reader pool reads. Speculative reads (prefetch, pre-warm) only ever touch experts that are
//! already local, so the network is used for routed experts only.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use serde::Serialize;

mod layer;

use super::ExpertKey;
use super::heat::{Heat, HeatRecorder};
use super::policy::oversubscribes;
use super::prefetch::{
    RANK_PRECISION, ROWS_BUCKETS, RankPrecision, RecallGate, plan_prefetch, rank_lookahead, rows_bucket,
};
use super::reader::{Origin, Priority, ReadResult, ReaderPool};
use super::routes::RouteRecorder;
use super::slots::{ExpertCache, ExpertHandle, Lookup};
use super::source::BufferSource;
use super::spans::SpanLayout;
use crate::config::Checkpoint;
use crate::error::{Error, Result};
use crate::histogram::{AtomicHistogram, HistogramSnapshot};
use crate::kernels::ops::rms_norm;
use crate::model::Loader;
use crate::model::layers::mlp::Mlp;
use crate::model::layers::moe::{ExpertProvider, Moe};
use crate::sync::lock;
use crate::weights::{RangeSource, WeightIndex};

/// Upper bounds (seconds) of the expert-fetch histogram: one read of an expert from storage
/// (a demand read of an expert that missed the cache, or a prefetch), submission to completion,
/// or one expert's missing bytes fetched over the network (stream installs).
pub const FETCH_SECONDS_BOUNDS: [f64; FETCH_BUCKETS] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Buckets of [`FETCH_SECONDS_BOUNDS`].
pub const FETCH_BUCKETS: usize = 14;

/// Counters written by reader completions and fetch threads (off the compute thread's lock).
#[derive(Debug, Default)]
struct CompletionStats {
    page_cache_reads: AtomicU64,
    page_cache_bytes: AtomicU64,
    fetch: AtomicHistogram<FETCH_BUCKETS>,
}

impl CompletionStats {
    /// A read of `bytes` submitted at `started` completed.
    fn completed(&self, ok: bool, origin: Origin, bytes: u64, started: Instant) {
        if !ok {
            return;
        }
        if origin == Origin::PageCache {
            self.page_cache_reads.fetch_add(1, Ordering::Relaxed);
            self.page_cache_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        self.fetch
            .observe(&FETCH_SECONDS_BOUNDS, started.elapsed().as_secs_f64());
    }
}

/// Builds expert `(layer, expert)` from a loader.
pub type ExpertBuilder = Arc<dyn Fn(&Loader<'_>, usize, usize) -> Result<Mlp> + Send + Sync>;

/// What the look-ahead predictor needs of a MoE layer: its FFN input norm and its router.
#[derive(Debug, Clone)]
pub struct LookaheadLayer {
    pub norm: Vec<f32>,
    pub eps: f32,
    /// The router (gate, bias, config); its `experts` are unused.
    pub router: Moe,
}

/// Counters of the expert store.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExpertStats {
    pub passes: u64,
    /// MoE layer steps: one per layer per pass that asked for its experts (the `uses` of one
    /// step of one layer are the union of its rows' selections, each expert once).
    pub layer_steps: u64,
    /// Expert uses (one per selected expert per layer per pass) and their bytes.
    pub uses: u64,
    pub use_bytes: u64,
    /// Served from a slot loaded earlier (by demand or pre-warm).
    pub hits: u64,
    pub hit_bytes: u64,
    /// Served from a slot filled by a prefetch of this layer (finished or still reading).
    pub prefetch_hits: u64,
    pub prefetch_hit_bytes: u64,
    /// Read on demand.
    pub misses: u64,
    pub miss_bytes: u64,
    pub prefetch_reads: u64,
    pub prefetch_read_bytes: u64,
    pub prefetch_cancelled: u64,
    /// Prefetched experts evicted before any use.
    pub prefetch_wasted: u64,
    /// Seconds the compute thread was blocked on expert reads or free slots.
    pub wait_seconds: f64,
    /// Routed experts that had bytes made local through the range source (stream installs),
    /// those bytes, and the seconds the compute thread waited for them.
    pub remote_experts: u64,
    pub remote_bytes: u64,
    pub remote_seconds: f64,
    /// Demand and prefetch reads whose every byte was already in the page cache (buffered
    /// reads only; a subset of `misses + prefetch_reads`), and their bytes.
    pub page_cache_reads: u64,
    pub page_cache_bytes: u64,
    /// Seconds per expert fetch ([`FETCH_SECONDS_BOUNDS`]): storage reads (demand and prefetch)
    /// and network fetches of a stream install's missing experts.
    #[serde(skip)]
    pub fetch_seconds: HistogramSnapshot<FETCH_BUCKETS>,
    /// Mean recall of the two predictors over the layers they were scored on.
    pub lookahead_recall: f64,
    pub previous_recall: f64,
    #[serde(skip)]
    recall_samples: u64,
}

impl ExpertStats {
    /// Mean recalls of the look-ahead and previous-pass predictors over the layers scored
    /// between `earlier` and this snapshot (`None` if none was: prefetch off, or no MoE layer).
    pub fn recalls_since(&self, earlier: &ExpertStats) -> Option<(f64, f64)> {
        let n = self
            .recall_samples
            .checked_sub(earlier.recall_samples)
            .filter(|&n| n > 0)?;
        let delta = |now: f64, before: f64| {
            (now * self.recall_samples as f64 - before * earlier.recall_samples as f64) / n as f64
        };
        Some((
            delta(self.lookahead_recall, earlier.lookahead_recall),
            delta(self.previous_recall, earlier.previous_recall),
        ))
    }

    /// Byte-weighted share of expert uses that needed no demand read.
    pub fn hit_rate(&self) -> f64 {
        if self.use_bytes == 0 {
            0.0
        } else {
            (self.hit_bytes + self.prefetch_hit_bytes) as f64 / self.use_bytes as f64
        }
    }
}

/// One recorded step of the expert demand stream (see [`ExpertStore::start_trace`]).
#[derive(Debug, Clone)]
pub enum TraceStep {
    /// A MoE layer selected `ids`; `lookahead` is what the predictor had forecast for it, from
    /// `rows` rows of input.
    Layer {
        layer: usize,
        ids: Vec<usize>,
        lookahead: Vec<usize>,
        rows: usize,
    },
    /// A pass ended.
    EndPass,
}

/// Settings of the store.
#[derive(Debug, Clone)]
pub struct ExpertStoreConfig {
    pub prefetch: bool,
    /// Recall below which a layer's speculation pauses.
    pub gate_threshold: f32,
    /// Heat flush period in passes.
    pub heat_flush_passes: u64,
    /// Above 1, ready experts become tasks of the current rayon pool (whose size bounds how
    /// many compute at once); at 1 they run one after another on the calling thread.
    pub compute_threads: usize,
}

struct Pass {
    /// Selections of the current pass per layer, becoming the previous pass's at its end.
    current: Vec<Vec<usize>>,
    previous: Vec<Vec<usize>>,
    /// Look-ahead prediction made for each layer in this pass, and from how many rows.
    predicted: Vec<Vec<usize>>,
    rows: Vec<usize>,
    /// Precision of each rank of forecasts, by [`rows_bucket`] of the rows they came from (a
    /// forecast is the ranked union of its rows' routes, scored against the layer's union).
    ranks: Vec<RankPrecision>,
    /// Prefetch planned for a layer, submitted after the current layer's demand reads.
    pending: Option<(usize, Vec<usize>)>,
    /// Prefetches in flight or landed, per layer (for cancelling losers).
    issued: Vec<Vec<usize>>,
    gate: RecallGate,
    /// Rows of the step in progress (from the last look-ahead hint).
    step_rows: usize,
    /// Whether the last finished pass crowded the cache ([`super::policy::oversubscribes`]:
    /// its selections over all layers exceed half the slots; see [`super::policy::bypass_miss`]).
    oversubscribed: bool,
}

/// Routed experts of a model, served through the cache.
pub struct ExpertStore {
    index: Arc<WeightIndex>,
    spec: Checkpoint,
    build: ExpertBuilder,
    /// `layouts[layer][expert]`; empty for dense layers.
    layouts: Vec<Vec<SpanLayout>>,
    /// Expert `e` of layer `l` is blob id `ids[l] + e` in whichever cache slot holds it
    /// ([`crate::weights::Blob::identified`]): a device tier keeps one copy of an expert however
    /// often the host cache reads it again.
    ids: Vec<u64>,
    lookahead: Vec<Option<LookaheadLayer>>,
    cache: ExpertCache,
    reader: Arc<ReaderPool>,
    config: ExpertStoreConfig,
    pass: Mutex<Pass>,
    heat: Mutex<Option<HeatRecorder>>,
    routes: Mutex<Option<RouteRecorder>>,
    remote: OnceLock<Remote>,
    stats: Mutex<ExpertStats>,
    /// Experts read for over-subscribed batched steps so far ([`super::policy::bypass_miss`]).
    bypass_reads: AtomicU64,
    completions: Arc<CompletionStats>,
    trace: Mutex<Option<Vec<TraceStep>>>,
}

/// Where missing expert bytes come from, and how many ranges to fetch at once.
#[derive(Debug)]
struct Remote {
    source: Arc<dyn RangeSource>,
    parallel: usize,
}

impl std::fmt::Debug for ExpertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ExpertStore({} slots, prefetch {})",
            self.cache.slots(),
            self.config.prefetch
        )
    }
}

/// The provider handed to one layer's MoE.
#[derive(Debug)]
pub struct LayerExperts<'a> {
    store: &'a ExpertStore,
    layer: usize,
}

impl ExpertStore {
    /// A store over `cache`; `layouts[l]` lists layer `l`'s experts (empty for dense layers).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: Arc<WeightIndex>,
        spec: Checkpoint,
        build: ExpertBuilder,
        layouts: Vec<Vec<SpanLayout>>,
        lookahead: Vec<Option<LookaheadLayer>>,
        cache: ExpertCache,
        reader: Arc<ReaderPool>,
        config: ExpertStoreConfig,
    ) -> Self {
        let layers = layouts.len();
        let total: usize = layouts.iter().map(Vec::len).sum();
        let first = crate::weights::Blob::reserve_ids(total as u64);
        let ids = layouts
            .iter()
            .scan(first, |next, l| {
                let base = *next;
                *next += l.len() as u64;
                Some(base)
            })
            .collect();
        let pass = Pass {
            current: vec![Vec::new(); layers],
            previous: vec![Vec::new(); layers],
            predicted: vec![Vec::new(); layers],
            rows: vec![0; layers],
            ranks: (0..ROWS_BUCKETS).map(|_| RankPrecision::new(0.05, 32)).collect(),
            pending: None,
            issued: vec![Vec::new(); layers],
            gate: RecallGate::new(layers, 0.2, config.gate_threshold, 16),
            step_rows: 0,
            oversubscribed: false,
        };
        ExpertStore {
            index,
            spec,
            build,
            layouts,
            ids,
            lookahead,
            cache,
            reader,
            config,
            pass: Mutex::new(pass),
            heat: Mutex::new(None),
            routes: Mutex::new(None),
            remote: OnceLock::new(),
            stats: Mutex::new(ExpertStats::default()),
            bypass_reads: AtomicU64::new(0),
            completions: Arc::default(),
            trace: Mutex::new(None),
        }
    }

    /// Record heat into `recorder` from now on (flushed periodically and by [`Self::flush_heat`]).
    pub fn set_heat(&self, recorder: HeatRecorder) {
        *lock(&self.heat) = Some(recorder);
    }

    /// Append every pass's selections to `recorder` from now on.
    pub fn set_route_trace(&self, recorder: RouteRecorder) {
        *lock(&self.routes) = Some(recorder);
    }

    /// Serve a partly remote checkpoint: selected experts whose bytes are not local are made
    /// local through `source` (up to `parallel` ranges at once) before they are read; speculative
    /// reads skip them. Set once, before the first pass (later calls are ignored).
    pub fn set_remote(&self, source: Arc<dyn RangeSource>, parallel: usize) {
        let _ = self.remote.set(Remote {
            source,
            parallel: parallel.max(1),
        });
    }

    /// Pre-warm: seed the policy with `heat` and read the hottest experts (up to the slots) at
    /// prefetch priority. Returns how many reads were submitted.
    pub fn prewarm(&self, heat: &Heat) -> usize {
        let mut n = 0;
        for (key, h) in heat.ranked().into_iter().take(self.cache.slots()) {
            if self
                .layouts
                .get(key.layer as usize)
                .is_none_or(|l| l.len() <= key.expert as usize)
            {
                continue;
            }
            self.cache.seed(key, h);
            if self.prefetch_one(key) {
                n += 1;
            }
        }
        n
    }

    /// Write recorded heat now.
    pub fn flush_heat(&self) -> Result<()> {
        match lock(&self.heat).as_mut() {
            Some(h) => h.flush(),
            None => Ok(()),
        }
    }

    /// The provider for `layer`.
    pub fn layer(&self, layer: usize) -> LayerExperts<'_> {
        LayerExperts { store: self, layer }
    }

    /// Counters so far.
    pub fn stats(&self) -> ExpertStats {
        let mut s = lock(&self.stats).clone();
        s.prefetch_wasted = self.cache.wasted_prefetches();
        let c = &self.completions;
        s.page_cache_reads = c.page_cache_reads.load(Ordering::Relaxed);
        s.page_cache_bytes = c.page_cache_bytes.load(Ordering::Relaxed);
        s.fetch_seconds = c.fetch.snapshot();
        if s.recall_samples > 0 {
            s.lookahead_recall /= s.recall_samples as f64;
            s.previous_recall /= s.recall_samples as f64;
        }
        s
    }

    /// Number of cache slots.
    pub fn slots(&self) -> usize {
        self.cache.slots()
    }

    /// Look-ahead hint, called with the residual stream `x` (`n` rows, whose tokens are
    /// `tokens` when known) right before layer `layer`'s FFN: plans the prefetch of layer
    /// `layer + 1`'s experts (a hash-routed layer's are its tokens' table rows).
    pub fn hint_next(&self, layer: usize, x: &[f32], n: usize, tokens: &[u32]) {
        let next = layer + 1;
        lock(&self.pass).step_rows = n;
        if !self.config.prefetch || next >= self.layouts.len() || self.layouts[next].is_empty() {
            return;
        }
        let lookahead = match &self.lookahead[next] {
            Some(la) => {
                let h = la.norm.len();
                let mut xn = vec![0.0f32; x.len()];
                for (src, dst) in x.chunks(h).zip(xn.chunks_mut(h)) {
                    rms_norm(src, &la.norm, la.eps, dst);
                }
                let routes = match tokens.len() == n && la.router.hash.is_some() {
                    true => la.router.routes_for(&xn, n, tokens),
                    false => la.router.routes(&xn, n),
                };
                rank_lookahead(&routes)
            }
            None => Vec::new(),
        };
        self.plan_hint(layer, next, lookahead, n);
    }

    /// Plan the prefetch of layer `next` from a look-ahead forecast of one or several rows,
    /// made while at `layer`.
    fn plan_hint(&self, layer: usize, next: usize, lookahead: Vec<usize>, rows: usize) {
        let mut pass = lock(&self.pass);
        pass.predicted[next] = lookahead.clone();
        pass.rows[next] = rows;
        // A batched step that over-subscribes the cache reads its misses through the bypass
        // (`policy::bypass_miss`); a read ahead would claim a slot of the kept set for a forecast
        // that, at several rows, is right less often than a demand read: prefetch off
        // (default model under 110M, 8 streams: 1.16-1.20 -> 1.03-1.05 of the ideal bytes).
        if !pass.gate.allow(next) || (pass.oversubscribed && rows > 1) {
            return;
        }
        let max = self
            .cache
            .slots()
            .saturating_sub(pass.current[layer].len().max(1));
        let (use_la, use_prev) = pass.gate.predictors(next);
        let la: &[usize] = if use_la {
            pass.ranks[rows_bucket(rows)].confident(&lookahead, RANK_PRECISION)
        } else {
            &[]
        };
        let prev: &[usize] = if use_prev { &pass.previous[next] } else { &[] };
        // The forecast experts already cached are about to be used: refresh them first, or they
        // are the oldest entries and this prefetch's claims (and the current layer's misses)
        // evict them just before their use. (dsv3-bench under 2 GiB: without this, prefetch
        // left 1.0 % of bytes as plain hits against 9.2 % with no prefetch, and read 1.21x the
        // ideal.)
        // `touch` answers what `contains` would, so the plan takes no lock again.
        let present: BTreeSet<usize> = lookahead
            .iter()
            .chain(prev)
            .copied()
            .filter(|&e| self.cache.touch(key(next, e)))
            .collect();
        let plan = plan_prefetch(la, prev, |e| present.contains(&e), max);
        let now = self.layouts[layer].is_empty(); // a dense layer has no demand reads to go first
        pass.pending = Some((next, plan));
        if now {
            self.submit_pending(&mut pass);
        }
    }

    fn submit_pending(&self, pass: &mut Pass) {
        let Some((layer, plan)) = pass.pending.take() else {
            return;
        };
        for e in plan {
            if self.prefetch_one(key(layer, e)) {
                pass.issued[layer].push(e);
            }
        }
    }

    /// Claim a slot and submit a prefetch read; false if present or no slot is free.
    fn prefetch_one(&self, k: ExpertKey) -> bool {
        if !self.is_local(k.layer as usize, k.expert as usize) {
            return false; // never fetch remote bytes on speculation
        }
        let Lookup::Miss { slot } = self.cache.claim_for_prefetch(k) else {
            return false;
        };
        let layout = &self.layouts[k.layer as usize][k.expert as usize];
        let (cache, completions, bytes) = (self.cache.clone(), self.completions.clone(), layout.read_bytes());
        let started = Instant::now();
        let done = Box::new(move |r: ReadResult, origin| {
            completions.completed(r.is_ok(), origin, bytes, started);
            cache.complete(slot, k, r);
        });
        let ticket =
            self.reader
                .submit_layout(self.cache.buffer(slot), layout, Priority::Prefetch, Some(done));
        self.cache.set_ticket(slot, ticket);
        let mut s = lock(&self.stats);
        s.prefetch_reads += 1;
        s.prefetch_read_bytes += layout.read_bytes();
        true
    }

    /// A pass ended: previous routes, policy decay, heat, and the first MoE layer's prefetch
    /// for the next pass from this pass's routes.
    pub fn end_pass(&self) -> Result<()> {
        self.cache.end_pass();
        let mut pass = lock(&self.pass);
        let p = &mut *pass;
        std::mem::swap(&mut p.previous, &mut p.current);
        p.oversubscribed = oversubscribes(p.previous.iter().map(Vec::len).sum(), self.cache.slots());
        p.current.iter_mut().for_each(Vec::clear);
        p.predicted.iter_mut().for_each(Vec::clear);
        p.pending = None;
        if self.config.prefetch
            && let Some(first) = self.layouts.iter().position(|l| !l.is_empty())
            && p.gate.allow(first)
            && p.gate.predictors(first).1
        {
            let plan = plan_prefetch(
                &[],
                &p.previous[first],
                |e| self.cache.contains(key(first, e)),
                self.cache.slots() / 2,
            );
            p.pending = Some((first, plan));
            self.submit_pending(p);
        }
        drop(pass);
        if let Some(t) = lock(&self.trace).as_mut() {
            t.push(TraceStep::EndPass);
        }
        if let Some(r) = lock(&self.routes).as_mut() {
            r.end_pass()?;
        }
        lock(&self.stats).passes += 1;
        let mut heat = lock(&self.heat);
        if let Some(h) = heat.as_mut() {
            h.end_pass();
            if h.pending_passes() >= self.config.heat_flush_passes {
                h.flush()?;
            }
        }
        Ok(())
    }

    /// Drop what a pass that did not finish left behind (its selections, forecasts, pending
    /// prefetch and unwritten route record); the previous finished pass stays the previous one.
    pub(super) fn abort_pass(&self) {
        let mut pass = lock(&self.pass);
        pass.current.iter_mut().for_each(Vec::clear);
        pass.predicted.iter_mut().for_each(Vec::clear);
        pass.rows.iter_mut().for_each(|s| *s = 0);
        pass.pending = None;
        drop(pass);
        if let Some(r) = lock(&self.routes).as_mut() {
            r.abort_pass();
        }
    }

    /// Whether no pass is under way: nothing recorded since the last finished or aborted pass.
    #[cfg(test)]
    pub(crate) fn between_passes(&self) -> bool {
        let pass = lock(&self.pass);
        let routes_clean = lock(&self.routes).as_ref().is_none_or(|r| r.is_between_passes());
        pass.current.iter().all(Vec::is_empty)
            && pass.predicted.iter().all(Vec::is_empty)
            && pass.pending.is_none()
            && routes_clean
    }

    /// Record every layer's selections and forecasts from now on.
    pub fn start_trace(&self) {
        *lock(&self.trace) = Some(Vec::new());
    }

    /// The recorded steps (recording stops).
    pub fn take_trace(&self) -> Vec<TraceStep> {
        lock(&self.trace).take().unwrap_or_default()
    }

    /// Serve a recorded demand stream with no compute at all: the same selections, forecasts,
    /// prefetches, cancellations and evictions as the run that recorded it, so the time it
    /// takes is what this store's I/O path needs when compute is free.
    pub fn replay(&self, steps: &[TraceStep]) -> Result<()> {
        for (i, step) in steps.iter().enumerate() {
            match step {
                TraceStep::EndPass => self.end_pass()?,
                TraceStep::Layer {
                    layer,
                    ids,
                    lookahead,
                    rows,
                } => {
                    let l = *layer;
                    if self.config.prefetch && l > 0 && self.layouts[l - 1].is_empty() {
                        // A dense layer's hint goes out at once.
                        self.plan_hint(l - 1, l, lookahead.clone(), *rows);
                    }
                    if self.config.prefetch
                        && let Some(TraceStep::Layer {
                            layer: n,
                            lookahead: la,
                            rows: n_rows,
                            ..
                        }) = steps.get(i + 1)
                        && *n == l + 1
                    {
                        self.plan_hint(l, *n, la.clone(), *n_rows);
                    }
                    self.layer(l).for_each_expert(ids, &|_, _| {})?;
                }
            }
        }
        Ok(())
    }

    /// Bookkeeping when layer `layer` selected `ids`: policy, heat, predictor scores, losers.
    fn observe(&self, layer: usize, ids: &[usize]) {
        let keys: Vec<ExpertKey> = ids.iter().map(|&e| key(layer, e)).collect();
        self.cache.select(&keys);
        if let Some(h) = lock(&self.heat).as_mut() {
            h.record(layer, ids);
        }
        if let Some(r) = lock(&self.routes).as_mut() {
            r.record(layer, ids);
        }
        let mut pass = lock(&self.pass);
        let p = &mut *pass;
        if let Some(t) = lock(&self.trace).as_mut() {
            t.push(TraceStep::Layer {
                layer,
                ids: ids.to_vec(),
                lookahead: p.predicted[layer].clone(),
                rows: p.rows[layer],
            });
        }
        p.current[layer] = ids.to_vec();
        if self.config.prefetch {
            p.gate
                .observe(layer, &p.predicted[layer], &p.previous[layer], ids);
            if p.rows[layer] > 0 {
                p.ranks[rows_bucket(p.rows[layer])].observe(&p.predicted[layer], ids);
            }
            let mut s = lock(&self.stats);
            s.lookahead_recall += super::prefetch::recall(&p.predicted[layer], ids) as f64;
            s.previous_recall += super::prefetch::recall(&p.previous[layer], ids) as f64;
            s.recall_samples += 1;
        }
        let mut cancelled = 0;
        for e in std::mem::take(&mut p.issued[layer]) {
            if ids.contains(&e) {
                continue;
            }
            if self
                .cache
                .cancel_prefetch(key(layer, e), |t| self.reader.cancel(t))
            {
                cancelled += 1;
            } else {
                self.cache.demote(key(layer, e)); // a loser that landed goes first
            }
        }
        lock(&self.stats).prefetch_cancelled += cancelled;
    }

    /// The byte ranges of expert `(layer, expert)` that are not local (none without a remote).
    fn missing_ranges(&self, layer: usize, expert: usize) -> Vec<(usize, Range<u64>)> {
        let Some(remote) = self.remote.get() else {
            return Vec::new();
        };
        let mut ranges = self.layouts[layer][expert].tensor_ranges();
        ranges.retain(|(shard, r)| !remote.source.is_local(self.index.shard_name(*shard), r));
        ranges
    }

    fn is_local(&self, layer: usize, expert: usize) -> bool {
        self.remote.get().is_none() || self.missing_ranges(layer, expert).is_empty()
    }

    /// Make every selected expert of `layer` local, fetching missing ranges `parallel` at a time;
    /// each fetched expert's time (from the start until its last range landed) is observed.
    fn fetch_missing(&self, layer: usize, ids: &[usize]) -> Result<()> {
        let Some(remote) = self.remote.get() else {
            return Ok(());
        };
        // (index into `left`, shard, range): one work item per missing range.
        let mut missing = Vec::new();
        let mut left = Vec::new();
        for &e in ids {
            let m = self.missing_ranges(layer, e);
            if !m.is_empty() {
                left.push(AtomicUsize::new(m.len()));
                missing.extend(m.into_iter().map(|(shard, r)| (left.len() - 1, shard, r)));
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let (next, failed) = (AtomicUsize::new(0), AtomicBool::new(false));
        let work = || -> Result<()> {
            while !failed.load(Ordering::Relaxed) {
                let Some((expert, shard, range)) = missing.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return Ok(());
                };
                if let Err(e) = self.make_local(remote, *shard, range) {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                if left[*expert].fetch_sub(1, Ordering::AcqRel) == 1 {
                    let secs = started.elapsed().as_secs_f64();
                    self.completions.fetch.observe(&FETCH_SECONDS_BOUNDS, secs);
                }
            }
            Ok(())
        };
        let threads = remote.parallel.min(missing.len());
        let result = std::thread::scope(|s| {
            let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
            let mut result = work();
            for h in helpers {
                let r = h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                result = result.and(r);
            }
            result
        });
        let mut st = lock(&self.stats);
        st.remote_seconds += started.elapsed().as_secs_f64();
        if result.is_ok() {
            st.remote_experts += left.len() as u64;
            st.remote_bytes += missing.iter().map(|(_, _, r)| r.end - r.start).sum::<u64>();
        }
        result
    }

    /// One range through the source; the file it is in must be the one the readers read.
    fn make_local(&self, remote: &Remote, shard: usize, range: &Range<u64>) -> Result<()> {
        let name = self.index.shard_name(shard);
        let path = remote.source.make_local(name, range)?;
        if !self.reader.same_file(shard, &path) {
            return Err(Error::Remote {
                file: name.to_string(),
                start: range.start,
                end: range.end,
                reason: format!(
                    "the bytes landed in {}, which is not the file being read",
                    path.display()
                ),
            });
        }
        Ok(())
    }

    fn build_mlp(&self, layer: usize, expert: usize, handle: ExpertHandle) -> Result<Mlp> {
        let layout = &self.layouts[layer][expert];
        let source = BufferSource {
            owner: Arc::new(handle),
            layout,
            identity: Some(self.ids[layer] + expert as u64),
        };
        let ld = Loader::new(&self.index, &self.spec).with_source(&source);
        (self.build)(&ld, layer, expert)
    }
}

fn key(layer: usize, expert: usize) -> ExpertKey {
    ExpertKey {
        layer: layer as u32,
        expert: expert as u32,
    }
}
