//! `deltafin bench serve`: decode throughput of the engine loop at several numbers of concurrent
//! streams. Each level submits that many greedy requests with distinct prompts to one scheduler
//! and times the window in which all of them are decoding; batching shares every weight read
//! among the streams, so aggregate tokens/s should rise with concurrency.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use deltafin_engine::arch;
use deltafin_engine::cache::OocStats;
use deltafin_engine::generate::Sampling;
use deltafin_engine::scheduler::{self, Event, EventSink, GenRequest, SchedulerConfig};
use deltafin_engine::synth::{DeepseekSynth, RoutingModel, RoutingShape};
use serde::Serialize;

/// Arguments of `deltafin bench serve`.
#[derive(Debug, Args)]
pub struct ServeBenchArgs {
    /// Model directory (default: a synthetic MoE checkpoint generated into the cache directory:
    /// 6 layers, 64 experts of 0.75 MiB, top-6; about 250 MB).
    #[arg(long, env = "DELTAFIN_MODEL")]
    model: Option<PathBuf>,
    /// Concurrency levels to measure.
    #[arg(
        long,
        default_value = "1,2,4,8",
        value_delimiter = ',',
        env = "DELTAFIN_STREAMS"
    )]
    streams: Vec<usize>,
    /// Tokens generated per stream.
    #[arg(long, default_value_t = 48, env = "DELTAFIN_TOKENS")]
    tokens: usize,
    /// Prompt length per stream.
    #[arg(long, default_value_t = 16, env = "DELTAFIN_PROMPT_TOKENS")]
    prompt_tokens: usize,
    /// Routing models of the default model to measure, each a checkpoint of its own
    /// (`uniform`: independent balanced routes; `published`: temporal reuse and per-layer skew
    /// calibrated to published measurements, see `engine/src/synth/routing.rs`). Not with
    /// `--model`.
    #[arg(
        long,
        default_value = "uniform",
        value_delimiter = ',',
        value_parser = crate::cli::synth::parse_routing
    )]
    routing: Vec<RoutingModel>,
    /// Print one JSON object instead of a table.
    #[arg(long, env = "DELTAFIN_JSON")]
    json: bool,
    #[command(flatten)]
    ooc: crate::cli::ooc_args::OocArgs,
}

/// One concurrency level's result.
#[derive(Debug, Serialize)]
struct Level {
    /// The default model's routing model (`None`: a `--model` directory).
    routing: Option<&'static str>,
    streams: usize,
    /// Generated tokens per second over all streams while all were decoding.
    aggregate_tokens_per_second: f64,
    per_stream_tokens_per_second: f64,
    /// Mean rows per batched pass over the whole level.
    mean_batch_rows: f64,
    passes: u64,
    /// Mean milliseconds of one batched model pass.
    mean_pass_ms: f64,
    /// Routed-expert bytes the passes used, per generated token (out-of-core loads only).
    expert_bytes_per_token: Option<f64>,
    /// Of those, bytes read from disk (demand misses + prefetch), per generated token.
    disk_bytes_per_token: Option<f64>,
    /// The per-step bound (out of core only).
    #[serde(flatten)]
    bound: Option<StepBound>,
}

/// What one batched step must read at best, and the rate the disk allows for it.
#[derive(Debug, Serialize)]
struct StepBound {
    /// Distinct routed experts per MoE layer per step (the union of the step's rows).
    union_experts_per_layer_step: f64,
    /// Routed-expert bytes the unions hold, per generated token.
    union_bytes_per_token: f64,
    /// Share of the routed experts the cache holds (the plan's).
    cache_fraction: f64,
    /// `union_bytes_per_token x (1 - cache_fraction)`: the disk bytes per token if the cache hit
    /// as often as its size allows under independent uniform routing.
    ideal_disk_bytes_per_token: f64,
    /// Measured: expert disk bytes per token over the ideal.
    disk_over_ideal: f64,
    /// Everything the reader read (experts and streamed spine), per generated token.
    read_bytes_per_token: f64,
    /// Bytes per second while at least one read was in flight (the reader's busy rate).
    reader_busy_bytes_per_second: f64,
    /// `reader_busy_bytes_per_second / read_bytes_per_token`: tokens per second if the disk
    /// were busy the whole time at that rate.
    io_bound_tokens_per_second: f64,
    /// Aggregate tokens per second (the all-decoding window) over that bound.
    fraction_of_io_bound: f64,
    /// Share of the level's wall time during which a read was in flight.
    disk_busy_share: f64,
    /// Share of a layer's selection that the previous pass also selected at that layer (at one
    /// stream: the previous token's reuse), and that the look-ahead predictor forecast; `None`
    /// with prefetch off.
    previous_pass_reuse: Option<f64>,
    lookahead_recall: Option<f64>,
    /// Measured expert disk bytes per token (the level's `disk_bytes_per_token`).
    #[serde(skip)]
    disk_bytes_per_token: f64,
}

impl StepBound {
    /// The bound between two snapshots of the out-of-core counters, over `generated` tokens
    /// decoded at `rate` tokens per second.
    fn between(a: &OocStats, b: &OocStats, generated: f64, rate: f64, wall: f64) -> StepBound {
        let (ea, eb) = (&a.experts, &b.experts);
        let steps = (eb.layer_steps - ea.layer_steps).max(1) as f64;
        let recalls = eb.recalls_since(ea);
        let union_bytes = (eb.use_bytes - ea.use_bytes) as f64 / generated;
        let disk = (eb.miss_bytes + eb.prefetch_read_bytes - ea.miss_bytes - ea.prefetch_read_bytes) as f64
            / generated;
        let ideal = union_bytes * (1.0 - b.plan.cache_fraction.clamp(0.0, 1.0));
        let read = (b.read.bytes - a.read.bytes) as f64 / generated;
        let busy = b.read.busy_seconds - a.read.busy_seconds;
        let busy_rate = if busy > 0.0 { read * generated / busy } else { 0.0 };
        let bound = if read > 0.0 {
            busy_rate / read
        } else {
            f64::INFINITY
        };
        StepBound {
            union_experts_per_layer_step: (eb.uses - ea.uses) as f64 / steps,
            union_bytes_per_token: union_bytes,
            cache_fraction: b.plan.cache_fraction,
            ideal_disk_bytes_per_token: ideal,
            disk_over_ideal: if ideal > 0.0 { disk / ideal } else { 0.0 },
            read_bytes_per_token: read,
            reader_busy_bytes_per_second: busy_rate,
            io_bound_tokens_per_second: bound,
            fraction_of_io_bound: if bound.is_finite() && bound > 0.0 {
                rate / bound
            } else {
                0.0
            },
            disk_busy_share: if wall > 0.0 { busy / wall } else { 0.0 },
            previous_pass_reuse: recalls.map(|r| r.1),
            lookahead_recall: recalls.map(|r| r.0),
            disk_bytes_per_token: disk,
        }
    }
}

/// Timestamps each event when the engine loop emits it.
struct TimedSink(mpsc::Sender<(Instant, Event)>);

impl EventSink for TimedSink {
    fn send(&self, event: Event) -> bool {
        self.0.send((Instant::now(), event)).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

fn prompt(len: usize, salt: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 31 + salt * 97 + 7) % vocab.min(256)) as u32)
        .collect()
}

/// Run `streams` requests at once; returns the token timestamps of each.
fn run_level(
    handle: &scheduler::SchedulerHandle,
    streams: usize,
    args: &ServeBenchArgs,
    vocab: usize,
) -> Result<Vec<Vec<Instant>>> {
    let mut receivers = Vec::new();
    for s in 0..streams {
        let (tx, rx) = mpsc::channel();
        let req = GenRequest {
            prompt: prompt(args.prompt_tokens.max(1), s, vocab),
            max_new_tokens: args.tokens.max(2),
            sampling: Sampling::Greedy,
            stop_ids: Vec::new(),
            reuse_state: false,
            kind: deltafin_engine::spec::RequestKind::Completion,
            spec: deltafin_engine::spec::SpecMode::Off,
            decode: Default::default(),
        };
        handle
            .submit(req, Box::new(TimedSink(tx)))
            .map_err(|e| anyhow::anyhow!("submit: {e}"))?;
        receivers.push(rx);
    }
    let mut times = Vec::new();
    for rx in receivers {
        let mut t = Vec::new();
        loop {
            match rx
                .recv_timeout(Duration::from_secs(600))
                .context("waiting for tokens")?
            {
                (at, Event::Token(_)) => t.push(at),
                (_, Event::Done(_)) => break,
                (_, Event::Failed { message, .. }) => anyhow::bail!("generation failed: {message}"),
                (_, Event::Started { .. } | Event::Logprobs(_)) => {}
            }
        }
        times.push(t);
    }
    Ok(times)
}

/// Tokens per second inside the window where every stream was past its first token.
fn window_rate(times: &[Vec<Instant>]) -> f64 {
    let (Some(start), Some(end)) = (
        times.iter().filter_map(|t| t.first()).max(),
        times.iter().filter_map(|t| t.last()).min(),
    ) else {
        return 0.0;
    };
    let tokens = times
        .iter()
        .flatten()
        .filter(|&&t| t > *start && t <= *end)
        .count();
    let secs = end.saturating_duration_since(*start).as_secs_f64();
    if secs > 0.0 { tokens as f64 / secs } else { 0.0 }
}

/// The default benchmark model: big enough that expert reads dominate a decode pass.
fn bench_synth() -> DeepseekSynth {
    DeepseekSynth {
        hidden: 512,
        intermediate: 1024,
        moe_intermediate: 256,
        layers: 6,
        experts: 64,
        top_k: 6,
        n_group: 8,
        topk_group: 4,
        seed: 0xBE4C,
        ..DeepseekSynth::builtin()
    }
}

pub(crate) fn resolve(model: Option<PathBuf>, cache_dir: &Path) -> Result<PathBuf> {
    resolve_with(model, cache_dir, None)
}

/// [`resolve`], with the default model's router shaped otherwise: `routing` names the variant
/// (a directory of its own) and gives its knobs.
pub(crate) fn resolve_with(
    model: Option<PathBuf>,
    cache_dir: &Path,
    routing: Option<(&str, RoutingShape)>,
) -> Result<PathBuf> {
    if let Some(dir) = model {
        return Ok(dir);
    }
    let mut synth = bench_synth();
    let suffix = match routing {
        Some((name, shape)) => {
            synth.routing = shape;
            format!("-{name}")
        }
        None => String::new(),
    };
    let dir = cache_dir.join(format!("bench-moe{suffix}-{}", env!("CARGO_PKG_VERSION")));
    if !dir.join("config.json").is_file() {
        let tmp = cache_dir.join(format!(".bench-moe{suffix}.partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        synth
            .write(&tmp)
            .with_context(|| format!("writing the benchmark model to {}", tmp.display()))?;
        std::fs::rename(&tmp, &dir).with_context(|| format!("moving it to {}", dir.display()))?;
        eprintln!("generated the synthetic benchmark model in {}", dir.display());
    }
    Ok(dir)
}

/// The default model's directory for routing model `m` (`uniform` is the default model).
fn resolve_routing(m: RoutingModel, cache_dir: &Path) -> Result<PathBuf> {
    match m {
        RoutingModel::Uniform => resolve(None, cache_dir),
        _ => resolve_with(None, cache_dir, Some((m.name(), m.shape()))),
    }
}

pub fn bench_serve(args: ServeBenchArgs, cache_dir: &Path) -> Result<()> {
    let runs: Vec<(Option<&'static str>, PathBuf)> = match &args.model {
        Some(dir) => {
            if args.routing != [RoutingModel::Uniform] {
                anyhow::bail!("--routing shapes the default model; it does not apply with --model");
            }
            vec![(None, dir.clone())]
        }
        None => args
            .routing
            .iter()
            .map(|&m| Ok((Some(m.name()), resolve_routing(m, cache_dir)?)))
            .collect::<Result<_>>()?,
    };
    let mut levels = Vec::new();
    for (routing, dir) in &runs {
        levels.extend(measure(&args, dir, *routing)?);
    }
    if args.json {
        let models: Vec<_> = runs
            .iter()
            .map(|(r, d)| serde_json::json!({"routing": r, "model": d}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"model": runs[0].1, "models": models, "tokens_per_stream": args.tokens, "levels": levels})
        );
    } else {
        for (routing, dir) in &runs {
            let mine: Vec<&Level> = levels.iter().filter(|l| l.routing == *routing).collect();
            print_table(dir, *routing, &mine);
        }
    }
    Ok(())
}

/// Every concurrency level on the model in `dir`.
fn measure(args: &ServeBenchArgs, dir: &Path, routing: Option<&'static str>) -> Result<Vec<Level>> {
    let budgeted = args.ooc.explicit() || arch::supports_budget(dir)?;
    let (model, ooc) = match args.ooc.options()?.filter(|_| budgeted) {
        None => (
            arch::load(dir).with_context(|| format!("loading {}", dir.display()))?,
            None,
        ),
        Some(o) => {
            let (m, rt) =
                arch::load_budgeted(dir, &o).with_context(|| format!("loading {}", dir.display()))?;
            eprintln!("{}", crate::cli::ooc_args::describe_plan(&rt.plan, &rt.read));
            (m, Some(rt))
        }
    };
    let ooc_stats = || ooc.as_ref().map(|rt| rt.stats());
    let vocab = model.info().vocab_size;
    let max = args.streams.iter().copied().max().unwrap_or(1).max(1);
    let cfg = SchedulerConfig {
        max_batch: max,
        max_queue: max,
        state_cache_entries: 0,
        ..Default::default()
    };
    // As `serve` places it: whole passes on the process's GPU when it has one.
    let model = deltafin_server::model::on_device(model, &cfg, dir)?;
    let (handle, _thread) = scheduler::start(model, cfg)?;
    run_level(&handle, 1, args, vocab)?; // warm-up
    let mut levels = Vec::new();
    for &streams in &args.streams {
        let before = handle.stats().snapshot();
        let io_before = ooc_stats();
        let started = Instant::now();
        let times = run_level(&handle, streams.max(1), args, vocab)?;
        let wall = started.elapsed().as_secs_f64();
        let after = handle.stats().snapshot();
        let io_after = ooc_stats();
        let generated = (after.generated - before.generated).max(1) as f64;
        let rate = window_rate(&times);
        let bound = io_before
            .as_ref()
            .zip(io_after.as_ref())
            .map(|(a, b)| StepBound::between(a, b, generated, rate, wall));
        let passes = after.steps - before.steps;
        levels.push(Level {
            routing,
            streams,
            aggregate_tokens_per_second: rate,
            per_stream_tokens_per_second: rate / streams.max(1) as f64,
            mean_batch_rows: (after.rows - before.rows) as f64 / passes.max(1) as f64,
            passes,
            expert_bytes_per_token: bound.as_ref().map(|b| b.union_bytes_per_token),
            disk_bytes_per_token: bound.as_ref().map(|b| b.disk_bytes_per_token),
            bound,
            mean_pass_ms: (after.forward_seconds_x1e9 - before.forward_seconds_x1e9) as f64
                / 1e6
                / passes.max(1) as f64,
        });
    }
    Ok(levels)
}

fn print_table(dir: &Path, routing: Option<&str>, levels: &[&Level]) {
    match routing {
        Some(r) => println!("model: {} (routing: {r})", dir.display()),
        None => println!("model: {}", dir.display()),
    }
    println!(
        "{:>8} {:>14} {:>14} {:>10} {:>10} {:>16} {:>14} {:>12} {:>14} {:>12} {:>10} {:>10}",
        "streams",
        "aggregate t/s",
        "per-stream t/s",
        "rows/pass",
        "ms/pass",
        "expert MiB/tok",
        "disk MiB/tok",
        "union/layer",
        "ideal MiB/tok",
        "I/O bound t/s",
        "of bound",
        "prev reuse"
    );
    for l in levels {
        let b = l.bound.as_ref();
        println!(
            "{:>8} {:>14.1} {:>14.1} {:>10.2} {:>10.2} {:>16} {:>14} {:>12} {:>14} {:>12} {:>10} {:>10}",
            l.streams,
            l.aggregate_tokens_per_second,
            l.per_stream_tokens_per_second,
            l.mean_batch_rows,
            l.mean_pass_ms,
            mib(l.expert_bytes_per_token),
            mib(l.disk_bytes_per_token),
            b.map_or("-".into(), |b| format!("{:.1}", b.union_experts_per_layer_step)),
            mib(b.map(|b| b.ideal_disk_bytes_per_token)),
            b.map_or("-".into(), |b| format!("{:.1}", b.io_bound_tokens_per_second)),
            b.map_or("-".into(), |b| format!("{:.2}", b.fraction_of_io_bound)),
            b.and_then(|b| b.previous_pass_reuse)
                .map_or("-".into(), |r| format!("{:.1}%", 100.0 * r)),
        );
    }
}

fn mib(v: Option<f64>) -> String {
    v.map_or("-".into(), |b| format!("{:.2}", b / (1u64 << 20) as f64))
}
