//! Series read at scrape time from state the engine owns (its atomics and lock-free
//! histograms, the expert store's I/O counters, the compute device's counters, the drafting
//! summary): a [`Snapshot`] of them is taken per scrape and encoded through a
//! `prometheus-client` [`Collector`], in the same registry encoding as the request-path series.

use std::fmt::Error as FmtError;

use deltafin_engine::backend::BackendStats;
use deltafin_engine::cache::FETCH_SECONDS_BOUNDS;
use deltafin_engine::scheduler::{
    ExpertIoStats, ExpertSource, HistogramSnapshot, PREFILL_ROW_BOUNDS, QUEUE_WAIT_BOUNDS,
    STEP_SECONDS_BOUNDS, StatsSnapshot,
};
use deltafin_engine::spec::{ProposerKind, ProposerStats, SpecSummary};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;

type Fmt = Result<(), FmtError>;

/// One counter without labels; `name` without the `_total` the encoding appends.
fn counter(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: impl EncodeCounterValue) -> Fmt {
    e.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn gauge(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: impl EncodeGaugeValue) -> Fmt {
    e.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

/// A counter with one label taking each of `values`.
fn labelled_counter(
    e: &mut DescriptorEncoder<'_>,
    (name, help): (&str, &str),
    key: &str,
    values: &[(&str, u64)],
) -> Fmt {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (label, v) in values {
        m.encode_family(&[(key, *label)])?
            .encode_counter::<NoLabelSet, _, u64>(v, None)?;
    }
    Ok(())
}

/// Per-bucket counts (not cumulative) to the encoder's `(upper bound, count)` pairs.
fn buckets(bounds: &[f64], counts: &[u64]) -> Vec<(f64, u64)> {
    bounds.iter().copied().zip(counts.iter().copied()).collect()
}

fn engine_histogram<const N: usize>(
    e: &mut DescriptorEncoder<'_>,
    (name, help): (&str, &str),
    bounds: &[f64],
    h: &HistogramSnapshot<N>,
) -> Fmt {
    e.encode_descriptor(name, help, None, MetricType::Histogram)?
        .encode_histogram::<NoLabelSet>(
            h.sum_micros as f64 / 1e6,
            h.count,
            &buckets(bounds, &h.buckets),
            None,
        )
}

/// The engine, expert-I/O and device series of one scrape.
#[derive(Debug)]
pub(super) struct Snapshot {
    pub engine: StatsSnapshot,
    /// `(source label, reads, bytes)` per expert source.
    pub io: Vec<(&'static str, u64, u64)>,
    pub hit_ratio: Option<f64>,
    /// The expert-fetch histogram: `(upper bound, count)` pairs, sum, count.
    pub fetch: (Vec<(f64, u64)>, f64, u64),
    pub device: BackendStats,
}

impl Snapshot {
    pub(super) fn take(engine: StatsSnapshot, io: &ExpertIoStats, device: BackendStats) -> Snapshot {
        Snapshot {
            engine,
            io: ExpertSource::ALL
                .iter()
                .map(|&s| {
                    let (reads, bytes) = io.get(s);
                    (s.label(), reads, bytes)
                })
                .collect(),
            hit_ratio: io.hit_ratio(),
            fetch: {
                let h = io.fetch();
                (
                    buckets(&FETCH_SECONDS_BOUNDS, &h.buckets),
                    h.sum_micros as f64 / 1e6,
                    h.count,
                )
            },
            device,
        }
    }

    fn encode_engine(&self, e: &mut DescriptorEncoder<'_>) -> Fmt {
        let s = &self.engine;
        gauge(
            e,
            "deltafin_requests_running",
            "Requests in the running batch.",
            s.running,
        )?;
        gauge(
            e,
            "deltafin_requests_waiting",
            "Accepted requests queued for a batch slot (queue depth).",
            s.waiting,
        )?;
        let counters = [
            ("deltafin_engine_steps", "Batched model passes.", s.steps),
            (
                "deltafin_engine_batch_rows",
                "Token rows computed over all passes.",
                s.rows,
            ),
            (
                "deltafin_engine_prefill_tokens",
                "Prompt tokens computed by prefill.",
                s.prefilled,
            ),
            (
                "deltafin_engine_cancelled",
                "Requests whose client went away before they finished.",
                s.cancelled,
            ),
            (
                "deltafin_engine_panics",
                "Engine steps that panicked: their requests failed and the engine went on.",
                s.panics,
            ),
            (
                "deltafin_state_reuse_tokens",
                "Prompt tokens taken from a reused conversation state.",
                s.reused_tokens,
            ),
            (
                "deltafin_constrained_tokens",
                "Tokens sampled under a grammar constraint (structured output, forced tool calls).",
                s.masked_rows,
            ),
        ];
        for (name, help, v) in counters {
            counter(e, name, help, v)?;
        }
        counter(
            e,
            "deltafin_constraint_mask_seconds",
            "Seconds spent computing grammar-constraint masks over the vocabulary.",
            s.mask_nanos as f64 / 1e9,
        )?;
        labelled_counter(
            e,
            ("deltafin_state_reuse", "Conversation-state reuse lookups."),
            "result",
            &[("hit", s.reuse_hits), ("miss", s.reuse_misses)],
        )?;
        engine_histogram(
            e,
            (
                "deltafin_queue_wait_seconds",
                "Time a request waited in the queue before joining the running batch.",
            ),
            &QUEUE_WAIT_BOUNDS,
            &s.queue_wait,
        )?;
        engine_histogram(
            e,
            (
                "deltafin_engine_step_seconds",
                "Duration of each batched model pass (decode rows, drafts and prefill chunks).",
            ),
            &STEP_SECONDS_BOUNDS,
            &s.step_seconds,
        )?;
        engine_histogram(
            e,
            (
                "deltafin_prefill_chunk_tokens",
                "Prompt tokens prefilled per batched pass (passes that prefilled).",
            ),
            &PREFILL_ROW_BOUNDS,
            &s.prefill_rows,
        )
    }

    fn encode_io(&self, e: &mut DescriptorEncoder<'_>) -> Fmt {
        let (counts, sum, count) = &self.fetch;
        e.encode_descriptor(
            "deltafin_expert_fetch_seconds",
            "Time to fetch one expert: a storage read (demand or prefetch) or a stream install's network fetch.",
            None,
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(*sum, *count, counts, None)?;
        let reads: Vec<(&str, u64)> = self.io.iter().map(|&(s, r, _)| (s, r)).collect();
        let bytes: Vec<(&str, u64)> = self.io.iter().map(|&(s, _, b)| (s, b)).collect();
        labelled_counter(
            e,
            ("deltafin_expert_reads", "Routed-expert reads by source."),
            "source",
            &reads,
        )?;
        labelled_counter(
            e,
            (
                "deltafin_expert_read_bytes",
                "Routed-expert bytes read by source.",
            ),
            "source",
            &bytes,
        )?;
        gauge(
            e,
            "deltafin_expert_cache_hit_ratio",
            "Fraction of expert reads served from memory (NaN before any read).",
            self.hit_ratio.unwrap_or(f64::NAN),
        )
    }

    fn encode_device(&self, e: &mut DescriptorEncoder<'_>) -> Fmt {
        let d = &self.device;
        counter(
            e,
            "deltafin_device_weight_upload_bytes",
            "Weight bytes copied to the GPU.",
            d.weight_upload_bytes,
        )?;
        gauge(
            e,
            "deltafin_device_weight_resident_bytes",
            "Weight bytes resident on the GPU.",
            d.resident_bytes,
        )?;
        gauge(
            e,
            "deltafin_device_expert_resident_bytes",
            "Routed-expert bytes resident on the GPU (the tier below the spine).",
            d.expert_resident_bytes,
        )?;
        labelled_counter(
            e,
            (
                "deltafin_device_expert_lookups",
                "Routed-expert products on the GPU: weights already resident (hit) or uploaded.",
            ),
            "result",
            &[("hit", d.expert_hits), ("upload", d.expert_uploads)],
        )?;
        counter(
            e,
            "deltafin_device_weight_evictions",
            "Weight matrices dropped from the GPU to stay within its budget.",
            d.evictions,
        )?;
        counter(
            e,
            "deltafin_device_cpu_fallbacks",
            "Matrix products computed on the CPU after the GPU failed (same results, slower).",
            d.cpu_fallbacks,
        )
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Fmt {
        self.encode_engine(&mut e)?;
        self.encode_io(&mut e)?;
        self.encode_device(&mut e)
    }
}

/// The drafting series of one scrape (`deltafin_spec_decode_*`, labelled `draft`).
#[derive(Debug)]
pub(super) struct Spec(pub SpecSummary);

/// Buckets `0 ..= N` of the accepted-length histogram.
const SPEC_LENGTH_BUCKETS: usize = 8;

/// A per-proposer counter: name (without `_total`), help, and how to read it.
type SpecCounter = (&'static str, &'static str, fn(&ProposerStats) -> u64);

const KINDS: [ProposerKind; 4] = [
    ProposerKind::Mtp,
    ProposerKind::Dspark,
    ProposerKind::Qwen,
    ProposerKind::Ngram,
];

impl Spec {
    fn get(&self, k: ProposerKind) -> ProposerStats {
        self.0.proposers.get(k.label()).cloned().unwrap_or_default()
    }

    fn encode_counters(&self, e: &mut DescriptorEncoder<'_>) -> Fmt {
        let counters: [SpecCounter; 5] = [
            (
                "deltafin_spec_decode_drafts",
                "Verify passes that carried drafts.",
                |p| p.proposals,
            ),
            (
                "deltafin_spec_decode_draft_tokens",
                "Draft tokens verified.",
                |p| p.draft_tokens,
            ),
            (
                "deltafin_spec_decode_accepted_tokens",
                "Draft tokens accepted.",
                |p| p.accepted_tokens,
            ),
            (
                "deltafin_spec_decode_switched_off",
                "Times the economics gate switched a proposer off for a back-off.",
                |p| p.switched_off,
            ),
            (
                "deltafin_spec_decode_errors",
                "Proposer failures (the request continued without it).",
                |p| p.errors,
            ),
        ];
        for (name, help, value) in counters {
            let values: Vec<(&str, u64)> = KINDS.iter().map(|&k| (k.label(), value(&self.get(k)))).collect();
            labelled_counter(e, (name, help), "draft", &values)?;
        }
        let mut m = e.encode_descriptor(
            "deltafin_spec_decode_seconds",
            "Seconds spent drafting and verifying drafts.",
            None,
            MetricType::Counter,
        )?;
        for k in KINDS {
            let p = self.get(k);
            for (phase, v) in [("draft", p.draft_seconds), ("verify", p.verify_seconds)] {
                m.encode_family(&[("draft", k.label()), ("phase", phase)])?
                    .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
            }
        }
        Ok(())
    }

    fn encode_lengths(&self, e: &mut DescriptorEncoder<'_>) -> Fmt {
        let mut m: MetricEncoder<'_> = e.encode_descriptor(
            "deltafin_spec_decode_accepted_length",
            "Drafts accepted per drafted verify pass.",
            None,
            MetricType::Histogram,
        )?;
        for k in KINDS {
            let p = self.get(k);
            let counts: Vec<(f64, u64)> = (0..=SPEC_LENGTH_BUCKETS)
                .map(|le| (le as f64, p.accepted_lengths.get(le).copied().unwrap_or(0)))
                .collect();
            m.encode_family(&[("draft", k.label())])?
                .encode_histogram::<NoLabelSet>(p.accepted_tokens as f64, p.proposals, &counts, None)?;
        }
        Ok(())
    }
}

impl Collector for Spec {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Fmt {
        self.encode_counters(&mut e)?;
        self.encode_lengths(&mut e)?;
        counter(
            &mut e,
            "deltafin_spec_decode_target_only_steps",
            "Decode steps of drafting-enabled requests that ran without drafts.",
            self.0.target_only_steps,
        )
    }
}

/// Failed weight reads per shard file (`deltafin_weight_read_errors_total{file}`): short reads,
/// I/O errors, files changed under the server, checksum mismatches. A file is named by its
/// file name (the model directory is the deployment's, not a label's, business).
#[derive(Debug)]
pub(super) struct WeightReadErrors(pub Vec<(String, u64)>);

impl Collector for WeightReadErrors {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Fmt {
        let values: Vec<(&str, u64)> = self.0.iter().map(|(f, n)| (f.as_str(), *n)).collect();
        labelled_counter(
            &mut e,
            (
                "deltafin_weight_read_errors",
                "Weight reads that failed (short read, I/O error, changed file, checksum mismatch), per shard file.",
            ),
            "file",
            &values,
        )
    }
}
