//! Prometheus metrics (text exposition format 0.0.4), names and buckets as in
//! `reference/operator.md` §4. Request-path metrics are recorded by [`RequestTimer`], a `Drop`
//! guard: a request that ends early (a disconnect drops its future or stream) is still
//! counted, as `outcome="cancelled"`. Engine gauges and counters are read from the scheduler's
//! atomics at scrape time. Expert reads/bytes by source and the expert-fetch histogram come from
//! [`ExpertIoStats`], which the expert store feeds (zero for a model loaded in memory).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use deltafin_engine::backend::BackendStats;
use deltafin_engine::cache::FETCH_SECONDS_BOUNDS;
use deltafin_engine::scheduler::{
    ExpertIoStats, ExpertSource, HistogramSnapshot, PREFILL_ROW_BOUNDS, QUEUE_WAIT_BOUNDS,
    STEP_SECONDS_BOUNDS, StatsSnapshot,
};
use deltafin_engine::spec::{ProposerKind, ProposerStats, SpecSummary};

/// Time to first token (seconds).
pub const TTFT_BUCKETS: &[f64] = &[
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2560.0, 5120.0, 10240.0,
];
/// Inter-token latency (seconds).
pub const ITL_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
    120.0,
];
/// End-to-end latency (seconds): 1 … 65536 doubling, then 86400.
pub const E2E_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
    32768.0, 65536.0, 86400.0,
];

/// The API endpoint a request used (`endpoint` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Models,
    Messages,
    Responses,
}

impl Endpoint {
    const ALL: [Endpoint; 5] = [
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Models,
        Endpoint::Messages,
        Endpoint::Responses,
    ];
    /// The endpoints that generate tokens.
    const GENERATING: [Endpoint; 4] = [
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Messages,
        Endpoint::Responses,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::Models => "models",
            Endpoint::Messages => "messages",
            Endpoint::Responses => "responses",
        }
    }
}

/// `outcome` label values.
pub const OUTCOMES: [&str; 5] = ["success", "busy", "invalid", "error", "cancelled"];

#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        render_histogram(out, (name, help), self.bounds, &self.counts, self.sum, self.count);
    }
}

/// One histogram in the exposition format; `counts` are per bucket (not cumulative).
fn render_histogram(
    out: &mut String,
    (name, help): (&str, &str),
    bounds: &[f64],
    counts: &[u64],
    sum: f64,
    count: u64,
) {
    header(out, name, help, "histogram");
    let mut cumulative = 0;
    for (b, c) in bounds.iter().zip(counts) {
        cumulative += c;
        let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {sum}");
    let _ = writeln!(out, "{name}_count {count}");
}

/// An engine histogram snapshot.
fn render_engine_histogram<const N: usize>(
    out: &mut String,
    name_help: (&str, &str),
    bounds: &[f64],
    h: &HistogramSnapshot<N>,
) {
    render_histogram(
        out,
        name_help,
        bounds,
        &h.buckets,
        h.sum_micros as f64 / 1e6,
        h.count,
    );
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

#[derive(Debug)]
struct Inner {
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    /// `[endpoint][outcome]`.
    requests: [[u64; OUTCOMES.len()]; Endpoint::ALL.len()],
    prompt_tokens: [u64; Endpoint::ALL.len()],
    generation_tokens: [u64; Endpoint::ALL.len()],
    model_load_seconds: Option<f64>,
    /// `[endpoint][parsed, malformed]`.
    tool_calls: [[u64; 2]; Endpoint::ALL.len()],
}

/// Labels of `deltafin_build_info`.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    pub version: String,
    pub device: String,
    pub spine: String,
    pub exact: bool,
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
    build: BuildInfo,
}

fn outcome_index(outcome: &str) -> usize {
    OUTCOMES.iter().position(|&o| o == outcome).unwrap_or(3)
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    pub fn new(build: BuildInfo) -> Self {
        let inner = Inner {
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            requests: [[0; OUTCOMES.len()]; Endpoint::ALL.len()],
            prompt_tokens: [0; Endpoint::ALL.len()],
            generation_tokens: [0; Endpoint::ALL.len()],
            model_load_seconds: None,
            tool_calls: [[0; 2]; Endpoint::ALL.len()],
        };
        Metrics {
            inner: Mutex::new(inner),
            build,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Count a finished request.
    pub fn request(&self, endpoint: Endpoint, outcome: &str) {
        self.with(|m| m.requests[endpoint as usize][outcome_index(outcome)] += 1);
    }

    /// Count the native tool calls of one finished response: parsed into `tool_calls`, and
    /// malformed ones returned as text.
    pub fn tool_calls(&self, endpoint: Endpoint, parsed: usize, malformed: usize) {
        self.with(|m| {
            m.tool_calls[endpoint as usize][0] += parsed as u64;
            m.tool_calls[endpoint as usize][1] += malformed as u64;
        });
    }

    pub fn set_model_load_seconds(&self, s: f64) {
        self.with(|m| m.model_load_seconds = Some(s));
    }

    /// The whole exposition. `engine` is `None` while the model loads.
    pub fn render(&self, engine: Option<StatsSnapshot>, io: &ExpertIoStats) -> String {
        let mut out = String::with_capacity(8192);
        self.with(|m| {
            m.ttft.render(
                &mut out,
                "deltafin_time_to_first_token_seconds",
                "Time from request arrival to the first generated token.",
            );
            m.itl.render(
                &mut out,
                "deltafin_inter_token_latency_seconds",
                "Time between consecutive generated tokens of a request.",
            );
            m.e2e.render(
                &mut out,
                "deltafin_e2e_request_latency_seconds",
                "Time from request arrival to its last byte of output.",
            );
            render_engine_histogram(
                &mut out,
                (
                    "deltafin_expert_fetch_seconds",
                    "Time to fetch one expert: a storage read (demand or prefetch) or a stream install's network fetch.",
                ),
                &FETCH_SECONDS_BOUNDS,
                &io.fetch(),
            );
            header(
                &mut out,
                "deltafin_requests_total",
                "Requests by endpoint and outcome.",
                "counter",
            );
            for e in Endpoint::ALL {
                for (o, outcome) in OUTCOMES.iter().enumerate() {
                    let n = m.requests[e as usize][o];
                    let _ = writeln!(
                        out,
                        "deltafin_requests_total{{endpoint=\"{}\",outcome=\"{outcome}\"}} {n}",
                        e.label()
                    );
                }
            }
            let per_endpoint = [
                (
                    "deltafin_prompt_tokens_total",
                    "Prompt tokens of finished requests.",
                    &m.prompt_tokens,
                ),
                (
                    "deltafin_generation_tokens_total",
                    "Generated tokens delivered to clients.",
                    &m.generation_tokens,
                ),
            ];
            for (name, help, values) in per_endpoint {
                header(&mut out, name, help, "counter");
                for e in Endpoint::GENERATING {
                    let _ = writeln!(out, "{name}{{endpoint=\"{}\"}} {}", e.label(), values[e as usize]);
                }
            }
            header(
                &mut out,
                "deltafin_tool_calls_total",
                "Native tool calls in responses: parsed into tool_calls, or malformed and returned as text.",
                "counter",
            );
            for e in Endpoint::GENERATING {
                for (o, outcome) in ["parsed", "malformed"].iter().enumerate() {
                    let n = m.tool_calls[e as usize][o];
                    let _ = writeln!(
                        out,
                        "deltafin_tool_calls_total{{endpoint=\"{}\",outcome=\"{outcome}\"}} {n}",
                        e.label()
                    );
                }
            }
            header(
                &mut out,
                "deltafin_model_load_seconds",
                "Seconds the model took to load.",
                "gauge",
            );
            let _ = writeln!(
                out,
                "deltafin_model_load_seconds {}",
                m.model_load_seconds.unwrap_or(0.0)
            );
        });
        self.render_engine(&mut out, engine.unwrap_or_default());
        render_io(&mut out, io);
        render_device(&mut out, &deltafin_engine::backend::current().stats());
        let b = &self.build;
        header(
            &mut out,
            "deltafin_build_info",
            "Build and model facts (value is always 1).",
            "gauge",
        );
        let _ = writeln!(
            out,
            "deltafin_build_info{{version=\"{}\",device=\"{}\",spine=\"{}\",exact=\"{}\"}} 1",
            escape(&b.version),
            escape(&b.device),
            escape(&b.spine),
            b.exact
        );
        out
    }

    fn render_engine(&self, out: &mut String, s: StatsSnapshot) {
        let gauges = [
            (
                "deltafin_requests_running",
                "Requests in the running batch.",
                s.running,
            ),
            (
                "deltafin_requests_waiting",
                "Accepted requests queued for a batch slot (queue depth).",
                s.waiting,
            ),
        ];
        for (name, help, v) in gauges {
            header(out, name, help, "gauge");
            let _ = writeln!(out, "{name} {v}");
        }
        let counters = [
            ("deltafin_engine_steps_total", "Batched model passes.", s.steps),
            (
                "deltafin_engine_batch_rows_total",
                "Token rows computed over all passes.",
                s.rows,
            ),
            (
                "deltafin_engine_prefill_tokens_total",
                "Prompt tokens computed by prefill.",
                s.prefilled,
            ),
            (
                "deltafin_engine_cancelled_total",
                "Requests whose client went away before they finished.",
                s.cancelled,
            ),
            (
                "deltafin_state_reuse_tokens_total",
                "Prompt tokens taken from a reused conversation state.",
                s.reused_tokens,
            ),
            (
                "deltafin_constrained_tokens_total",
                "Tokens sampled under a grammar constraint (structured output, forced tool calls).",
                s.masked_rows,
            ),
        ];
        for (name, help, v) in counters {
            header(out, name, help, "counter");
            let _ = writeln!(out, "{name} {v}");
        }
        header(
            out,
            "deltafin_constraint_mask_seconds_total",
            "Seconds spent computing grammar-constraint masks over the vocabulary.",
            "counter",
        );
        let _ = writeln!(
            out,
            "deltafin_constraint_mask_seconds_total {}",
            s.mask_nanos as f64 / 1e9
        );
        header(
            out,
            "deltafin_state_reuse_total",
            "Conversation-state reuse lookups.",
            "counter",
        );
        let _ = writeln!(
            out,
            "deltafin_state_reuse_total{{result=\"hit\"}} {}",
            s.reuse_hits
        );
        let _ = writeln!(
            out,
            "deltafin_state_reuse_total{{result=\"miss\"}} {}",
            s.reuse_misses
        );
        let histograms = [
            (
                "deltafin_queue_wait_seconds",
                "Time a request waited in the queue before joining the running batch.",
                &QUEUE_WAIT_BOUNDS,
                &s.queue_wait,
            ),
            (
                "deltafin_engine_step_seconds",
                "Duration of each batched model pass (decode rows, drafts and prefill chunks).",
                &STEP_SECONDS_BOUNDS,
                &s.step_seconds,
            ),
            (
                "deltafin_prefill_chunk_tokens",
                "Prompt tokens prefilled per batched pass (passes that prefilled).",
                &PREFILL_ROW_BOUNDS,
                &s.prefill_rows,
            ),
        ];
        for (name, help, bounds, h) in histograms {
            render_engine_histogram(out, (name, help), bounds, h);
        }
    }
}

/// Speculative-decoding series (`deltafin_spec_decode_*`, labelled `draft="dspark|qwen|ngram"`):
/// drafted verify passes, draft and accepted tokens, the accepted-length histogram, seconds
/// drafting and verifying, gate switch-offs and proposer errors, plus the target-only steps.
pub fn render_spec(s: &SpecSummary) -> String {
    let mut out = String::with_capacity(4096);
    let kinds = [ProposerKind::Dspark, ProposerKind::Qwen, ProposerKind::Ngram];
    let empty = ProposerStats::default();
    let get = |k: ProposerKind| s.proposers.get(k.label()).unwrap_or(&empty);
    let counters: [SpecCounter; 5] = [
        (
            "deltafin_spec_decode_drafts_total",
            "Verify passes that carried drafts.",
            |p| p.proposals,
        ),
        (
            "deltafin_spec_decode_draft_tokens_total",
            "Draft tokens verified.",
            |p| p.draft_tokens,
        ),
        (
            "deltafin_spec_decode_accepted_tokens_total",
            "Draft tokens accepted.",
            |p| p.accepted_tokens,
        ),
        (
            "deltafin_spec_decode_switched_off_total",
            "Times the economics gate switched a proposer off for a back-off.",
            |p| p.switched_off,
        ),
        (
            "deltafin_spec_decode_errors_total",
            "Proposer failures (the request continued without it).",
            |p| p.errors,
        ),
    ];
    for (name, help, value) in counters {
        header(&mut out, name, help, "counter");
        for k in kinds {
            let _ = writeln!(out, "{name}{{draft=\"{}\"}} {}", k.label(), value(get(k)));
        }
    }
    header(
        &mut out,
        "deltafin_spec_decode_seconds_total",
        "Seconds spent drafting and verifying drafts.",
        "counter",
    );
    for k in kinds {
        let p = get(k);
        let _ = writeln!(
            out,
            "deltafin_spec_decode_seconds_total{{draft=\"{}\",phase=\"draft\"}} {}",
            k.label(),
            p.draft_seconds
        );
        let _ = writeln!(
            out,
            "deltafin_spec_decode_seconds_total{{draft=\"{}\",phase=\"verify\"}} {}",
            k.label(),
            p.verify_seconds
        );
    }
    let name = "deltafin_spec_decode_accepted_length";
    header(
        &mut out,
        name,
        "Drafts accepted per drafted verify pass.",
        "histogram",
    );
    for k in kinds {
        let p = get(k);
        let mut cumulative = 0;
        for le in 0..=SPEC_LENGTH_BUCKETS {
            cumulative += p.accepted_lengths.get(le).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "{name}_bucket{{draft=\"{}\",le=\"{le}\"}} {cumulative}",
                k.label()
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{draft=\"{}\",le=\"+Inf\"}} {}",
            k.label(),
            p.proposals
        );
        let _ = writeln!(out, "{name}_sum{{draft=\"{}\"}} {}", k.label(), p.accepted_tokens);
        let _ = writeln!(out, "{name}_count{{draft=\"{}\"}} {}", k.label(), p.proposals);
    }
    header(
        &mut out,
        "deltafin_spec_decode_target_only_steps_total",
        "Decode steps of drafting-enabled requests that ran without drafts.",
        "counter",
    );
    let _ = writeln!(
        out,
        "deltafin_spec_decode_target_only_steps_total {}",
        s.target_only_steps
    );
    out
}

/// A per-proposer counter: name, help, and how to read it.
type SpecCounter = (&'static str, &'static str, fn(&ProposerStats) -> u64);

/// Buckets `0 ..= N` of the accepted-length histogram.
const SPEC_LENGTH_BUCKETS: usize = 8;

fn render_io(out: &mut String, io: &ExpertIoStats) {
    let series = [
        ("deltafin_expert_reads_total", "Routed-expert reads by source.", 0),
        (
            "deltafin_expert_read_bytes_total",
            "Routed-expert bytes read by source.",
            1,
        ),
    ];
    for (name, help, which) in series {
        header(out, name, help, "counter");
        for s in ExpertSource::ALL {
            let (reads, bytes) = io.get(s);
            let _ = writeln!(
                out,
                "{name}{{source=\"{}\"}} {}",
                s.label(),
                if which == 0 { reads } else { bytes }
            );
        }
    }
    header(
        out,
        "deltafin_expert_cache_hit_ratio",
        "Fraction of expert reads served from memory (NaN before any read).",
        "gauge",
    );
    let _ = writeln!(
        out,
        "deltafin_expert_cache_hit_ratio {}",
        io.hit_ratio().map_or("NaN".to_string(), |r| r.to_string())
    );
}

/// The compute device's counters (all zero on the CPU).
fn render_device(out: &mut String, s: &BackendStats) {
    let series = [
        (
            "deltafin_device_weight_upload_bytes_total",
            "Weight bytes copied to the GPU.",
            "counter",
            s.weight_upload_bytes,
        ),
        (
            "deltafin_device_weight_resident_bytes",
            "Weight bytes resident on the GPU.",
            "gauge",
            s.resident_bytes,
        ),
        (
            "deltafin_device_weight_evictions_total",
            "Weight matrices dropped from the GPU to stay within its budget.",
            "counter",
            s.evictions,
        ),
        (
            "deltafin_device_cpu_fallbacks_total",
            "Matrix products computed on the CPU after the GPU failed (same results, slower).",
            "counter",
            s.cpu_fallbacks,
        ),
    ];
    for (name, help, kind, v) in series {
        header(out, name, help, kind);
        let _ = writeln!(out, "{name} {v}");
    }
}

/// Records one generation request's latencies and tokens; its `Drop` records the outcome
/// (`cancelled` unless [`RequestTimer::finish`] ran).
#[derive(Debug)]
pub struct RequestTimer {
    metrics: Arc<Metrics>,
    endpoint: Endpoint,
    start: Instant,
    last_token: Option<Instant>,
    outcome: Option<&'static str>,
}

impl RequestTimer {
    pub fn new(metrics: Arc<Metrics>, endpoint: Endpoint, start: Instant) -> Self {
        RequestTimer {
            metrics,
            endpoint,
            start,
            last_token: None,
            outcome: None,
        }
    }

    /// A token reached the client side of the engine.
    pub fn token(&mut self) {
        let now = Instant::now();
        let e = self.endpoint as usize;
        self.metrics.with(|m| {
            match self.last_token {
                None => m.ttft.observe((now - self.start).as_secs_f64()),
                Some(t) => m.itl.observe((now - t).as_secs_f64()),
            }
            m.generation_tokens[e] += 1;
        });
        self.last_token = Some(now);
    }

    /// The request ended with `outcome`; `prompt_tokens` are counted on success.
    pub fn finish(&mut self, outcome: &'static str, prompt_tokens: usize) {
        if outcome == "success" {
            let e = self.endpoint as usize;
            self.metrics.with(|m| m.prompt_tokens[e] += prompt_tokens as u64);
        }
        self.outcome = Some(outcome);
    }
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or("cancelled");
        let elapsed = self.start.elapsed().as_secs_f64();
        self.metrics.with(|m| {
            if outcome == "success" {
                m.e2e.observe(elapsed);
            }
            m.requests[self.endpoint as usize][outcome_index(outcome)] += 1;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Metrics {
        Metrics::new(BuildInfo {
            version: "0.1.0".into(),
            device: "cpu".into(),
            spine: "bf16".into(),
            exact: true,
        })
    }

    #[test]
    fn buckets_follow_the_operator_table() {
        assert_eq!(TTFT_BUCKETS.len(), 16);
        assert_eq!(ITL_BUCKETS.len(), 20);
        assert_eq!((E2E_BUCKETS[0], *E2E_BUCKETS.last().unwrap()), (1.0, 86400.0));
        assert!(E2E_BUCKETS.windows(2).all(|w| w[1] > w[0]));
    }

    #[test]
    fn a_dropped_timer_counts_as_cancelled_and_a_finished_one_as_success() {
        let m = Arc::new(metrics());
        {
            let mut t = RequestTimer::new(m.clone(), Endpoint::Chat, Instant::now());
            t.token();
            t.token();
        }
        {
            let mut t = RequestTimer::new(m.clone(), Endpoint::Completions, Instant::now());
            t.token();
            t.finish("success", 7);
        }
        let text = m.render(None, &ExpertIoStats::default());
        assert!(
            text.contains("deltafin_requests_total{endpoint=\"chat_completions\",outcome=\"cancelled\"} 1")
        );
        assert!(text.contains("deltafin_requests_total{endpoint=\"completions\",outcome=\"success\"} 1"));
        assert!(text.contains("deltafin_generation_tokens_total{endpoint=\"chat_completions\"} 2"));
        assert!(text.contains("deltafin_prompt_tokens_total{endpoint=\"completions\"} 7"));
        assert!(text.contains("deltafin_time_to_first_token_seconds_count 2"));
        assert!(text.contains("deltafin_inter_token_latency_seconds_count 1"));
        assert!(text.contains("deltafin_e2e_request_latency_seconds_count 1"));
        assert!(text.contains("deltafin_time_to_first_token_seconds_bucket{le=\"0.25\"} 2"));
        assert!(text.contains(
            "deltafin_build_info{version=\"0.1.0\",device=\"cpu\",spine=\"bf16\",exact=\"true\"} 1"
        ));
    }

    #[test]
    fn expert_io_counters_are_exposed_by_source() {
        let io = ExpertIoStats::default();
        io.record(ExpertSource::Disk, 100);
        io.record(ExpertSource::PageCache, 50);
        let text = metrics().render(None, &io);
        assert!(text.contains("deltafin_expert_read_bytes_total{source=\"disk\"} 100"));
        assert!(text.contains("deltafin_expert_reads_total{source=\"page_cache\"} 1"));
        assert!(text.contains("deltafin_expert_cache_hit_ratio 0.5"));
    }
}
