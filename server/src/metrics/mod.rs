//! Prometheus metrics on `prometheus-client` (the operator's library), exposed in the Prometheus
//! text format 0.0.4, names and buckets as in `reference/operator.md` §4.
//!
//! Request-path series live in a [`Registry`] of `prometheus-client` metrics and are recorded
//! by [`RequestTimer`], a `Drop` guard: a request that ends early (a disconnect drops its
//! future or stream) is still counted, as `outcome="cancelled"`. Every label combination is
//! created up front, so each series is exposed (at zero) before its first request. Engine
//! gauges and counters, the expert reads/bytes by source, the expert-fetch histogram, the
//! device counters and the drafting series are read at scrape time from the state the engine
//! owns ([`snapshot`]) and encoded by collectors into the same exposition.

mod snapshot;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use deltafin_engine::scheduler::{ExpertIoStats, StatsSnapshot};
use deltafin_engine::spec::SpecSummary;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

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

/// `{endpoint, outcome}` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointOutcome {
    endpoint: &'static str,
    outcome: &'static str,
}

/// `{endpoint, format, outcome}` labels of the tool-call counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolCallLabels {
    endpoint: &'static str,
    format: &'static str,
    outcome: &'static str,
}

/// `{endpoint}` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: &'static str,
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
    registry: Registry,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    requests: Family<EndpointOutcome, Counter>,
    prompt_tokens: Family<EndpointLabel, Counter>,
    generation_tokens: Family<EndpointLabel, Counter>,
    tool_calls: Family<ToolCallLabels, Counter>,
    model_load_seconds: Gauge<f64, AtomicU64>,
}

/// The known outcome label for `outcome` (`error` for anything else).
fn outcome_label(outcome: &str) -> &'static str {
    OUTCOMES
        .iter()
        .copied()
        .find(|&o| o == outcome)
        .unwrap_or("error")
}

impl Metrics {
    pub fn new(build: BuildInfo) -> Self {
        let m = Metrics {
            registry: Registry::default(),
            ttft: Histogram::new(TTFT_BUCKETS.iter().copied()),
            itl: Histogram::new(ITL_BUCKETS.iter().copied()),
            e2e: Histogram::new(E2E_BUCKETS.iter().copied()),
            requests: Family::default(),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            tool_calls: Family::default(),
            model_load_seconds: Gauge::default(),
        };
        for e in Endpoint::ALL {
            for outcome in OUTCOMES {
                let _ = m.requests.get_or_create(&EndpointOutcome {
                    endpoint: e.label(),
                    outcome,
                });
            }
        }
        for e in Endpoint::GENERATING {
            let endpoint = e.label();
            let _ = m.prompt_tokens.get_or_create(&EndpointLabel { endpoint });
            let _ = m.generation_tokens.get_or_create(&EndpointLabel { endpoint });
        }
        m.register(build)
    }

    /// Register every request-path series (help texts without the final period the registry
    /// adds).
    fn register(mut self, build: BuildInfo) -> Self {
        let r = &mut self.registry;
        r.register(
            "deltafin_time_to_first_token_seconds",
            "Time from request arrival to the first generated token",
            self.ttft.clone(),
        );
        r.register(
            "deltafin_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request",
            self.itl.clone(),
        );
        r.register(
            "deltafin_e2e_request_latency_seconds",
            "Time from request arrival to its last byte of output",
            self.e2e.clone(),
        );
        r.register(
            "deltafin_requests",
            "Requests by endpoint and outcome",
            self.requests.clone(),
        );
        r.register(
            "deltafin_prompt_tokens",
            "Prompt tokens of finished requests",
            self.prompt_tokens.clone(),
        );
        r.register(
            "deltafin_generation_tokens",
            "Generated tokens delivered to clients",
            self.generation_tokens.clone(),
        );
        r.register(
            "deltafin_tool_calls",
            "Native tool calls in responses: parsed into tool_calls, or malformed and returned as text",
            self.tool_calls.clone(),
        );
        r.register(
            "deltafin_model_load_seconds",
            "Seconds the model took to load",
            self.model_load_seconds.clone(),
        );
        r.register(
            "deltafin_build",
            "Build and model facts (value is always 1)",
            Info::new(vec![
                ("version", build.version),
                ("device", build.device),
                ("spine", build.spine),
                ("exact", build.exact.to_string()),
            ]),
        );
        self
    }

    /// Count a finished request.
    pub fn request(&self, endpoint: Endpoint, outcome: &str) {
        let labels = EndpointOutcome {
            endpoint: endpoint.label(),
            outcome: outcome_label(outcome),
        };
        self.requests.get_or_create(&labels).inc();
    }

    /// Count the native tool calls of one finished response in `format` (its label): parsed
    /// into `tool_calls`, malformed, and withheld (cut off by the end of the output).
    pub fn tool_calls(
        &self,
        endpoint: Endpoint,
        format: &'static str,
        parsed: usize,
        malformed: usize,
        withheld: usize,
    ) {
        let endpoint = endpoint.label();
        for (outcome, n) in [
            ("parsed", parsed),
            ("malformed", malformed),
            ("withheld", withheld),
        ] {
            self.tool_calls
                .get_or_create(&ToolCallLabels {
                    endpoint,
                    format,
                    outcome,
                })
                .inc_by(n as u64);
        }
    }

    /// The loaded model speaks tool-call `format` (its label): its series start at zero.
    pub fn tool_format(&self, format: &'static str) {
        for e in Endpoint::GENERATING {
            for outcome in ["parsed", "malformed", "withheld"] {
                let _ = self.tool_calls.get_or_create(&ToolCallLabels {
                    endpoint: e.label(),
                    format,
                    outcome,
                });
            }
        }
    }

    pub fn set_model_load_seconds(&self, s: f64) {
        self.model_load_seconds.set(s);
    }

    /// The whole exposition. `engine` is `None` while the model loads.
    pub fn render(&self, engine: Option<StatsSnapshot>, io: &ExpertIoStats) -> String {
        let mut scrape = Registry::default();
        let device = deltafin_engine::backend::current().stats();
        scrape.register_collector(Box::new(snapshot::Snapshot::take(
            engine.unwrap_or_default(),
            io,
            device,
        )));
        let mut out = String::with_capacity(16384);
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        let _ = prometheus_text::encode(&mut out, &scrape);
        out
    }
}

/// `deltafin_weight_read_errors_total{file}`: failed weight reads per shard file, out of core
/// (a model in memory reads no weights after loading, and has no such series).
pub fn render_weight_errors(errors: &[(std::path::PathBuf, u64)]) -> String {
    let files = errors
        .iter()
        .map(|(p, n)| {
            let name = p
                .file_name()
                .unwrap_or(p.as_os_str())
                .to_string_lossy()
                .into_owned();
            (name, *n)
        })
        .collect();
    let mut scrape = Registry::default();
    scrape.register_collector(Box::new(snapshot::WeightReadErrors(files)));
    let mut out = String::with_capacity(1024);
    let _ = prometheus_text::encode(&mut out, &scrape);
    out
}

/// Speculative-decoding series (`deltafin_spec_decode_*`, labelled `draft="dspark|qwen|ngram"`):
/// drafted verify passes, draft and accepted tokens, the accepted-length histogram, seconds
/// drafting and verifying, gate switch-offs and proposer errors, plus the target-only steps.
pub fn render_spec(s: &SpecSummary) -> String {
    let mut scrape = Registry::default();
    scrape.register_collector(Box::new(snapshot::Spec(s.clone())));
    let mut out = String::with_capacity(4096);
    let _ = prometheus_text::encode(&mut out, &scrape);
    out
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
        let m = &self.metrics;
        match self.last_token {
            None => m.ttft.observe((now - self.start).as_secs_f64()),
            Some(t) => m.itl.observe((now - t).as_secs_f64()),
        }
        let labels = EndpointLabel {
            endpoint: self.endpoint.label(),
        };
        m.generation_tokens.get_or_create(&labels).inc();
        self.last_token = Some(now);
    }

    /// The request ended with `outcome`; `prompt_tokens` are counted on success.
    pub fn finish(&mut self, outcome: &'static str, prompt_tokens: usize) {
        if outcome == "success" {
            let labels = EndpointLabel {
                endpoint: self.endpoint.label(),
            };
            self.metrics
                .prompt_tokens
                .get_or_create(&labels)
                .inc_by(prompt_tokens as u64);
        }
        self.outcome = Some(outcome);
    }
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or("cancelled");
        if outcome == "success" {
            self.metrics.e2e.observe(self.start.elapsed().as_secs_f64());
        }
        self.metrics.request(self.endpoint, outcome);
    }
}

#[cfg(test)]
mod tests;
