//! `deltafin bench prefill`: prefill tokens/s at several prompt lengths (default 1k, 4k, 16k),
//! in memory or under a memory budget, the prompt fed in chunks as the server feeds it.
//!
//! Under a budget it also reports the expert bytes each length read from disk and, given the
//! disk's bandwidth (`--disk-gib-s`, from `deltafin bench disk`), the prefill I/O bound: the
//! seconds those reads take at that bandwidth, and the ratio of the measured time to it.
//! Prompts are seeded random ids, so routing depends on the model, not on text.
//!
//! Each length also reports the context memory the committed sequence holds beside the plan's
//! figure for that length (`StateSize::bytes`, what `--context-memory auto` admits by): the
//! check that the plan counts each family's state as its architecture keeps it (compressed
//! entries, sliding windows, recurrent state), not as a dense cache would.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use deltafin_engine::arch::{self, LogitRows, Model, SeqInput};
use deltafin_engine::cache::OocRuntime;
use deltafin_engine::cache::plan::human;
use deltafin_engine::synth::Rng;
use serde::Serialize;

use crate::cli::ooc_args::{OocArgs, describe_plan};

#[derive(Debug, Args)]
pub struct BenchPrefillArgs {
    /// Model directory (default: the built-in model).
    #[arg(long, env = "DELTAFIN_MODEL")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub ooc: OocArgs,
    /// Prompt lengths to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 4096, 16384])]
    pub lengths: Vec<usize>,
    /// Prompt tokens per pass (the server's `--prefill-chunk-solo`: a prompt prefilling alone).
    #[arg(long, default_value_t = deltafin_engine::scheduler::DEFAULT_PREFILL_CHUNK_SOLO)]
    pub chunk: usize,
    /// Disk bandwidth for the I/O bound, GiB/s (from `deltafin bench disk`).
    #[arg(long)]
    pub disk_gib_s: Option<f64>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A label copied into the output.
    #[arg(long, default_value = "")]
    pub label: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Point {
    tokens: usize,
    seconds: f64,
    tokens_per_second: f64,
    /// Expert bytes read from storage during this prefill (budgeted runs only).
    expert_read_bytes: Option<u64>,
    /// Seconds those reads take at `--disk-gib-s`.
    io_bound_seconds: Option<f64>,
    /// Measured seconds over the I/O bound (1.0 = at the disk's limit).
    ratio_to_io_bound: Option<f64>,
    /// Context memory the sequence holds once its prompt is committed.
    context_bytes_held: u64,
    /// The plan's context memory for this many tokens (one sequence, no checkpoints).
    context_bytes_planned: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    label: String,
    model: PathBuf,
    memory_budget: String,
    chunk: usize,
    threads: usize,
    points: Vec<Point>,
}

pub fn run(a: BenchPrefillArgs, cache_dir: &Path) -> Result<()> {
    let dir = crate::cli::run::resolve_model(a.model.clone(), cache_dir)?;
    let loading = || format!("loading model {}", dir.display());
    let (model, rt): (Box<dyn Model>, Option<OocRuntime>) = match a.ooc.options()? {
        None => (arch::load(&dir).with_context(loading)?, None),
        Some(mut o) => {
            let longest = a.lengths.iter().copied().max().unwrap_or(1);
            let spec = crate::cli::ooc_args::plan_context(&dir, &mut o, longest)?;
            let (m, rt) = arch::load_budgeted_spec(&spec, &dir, &o).with_context(loading)?;
            if !a.json {
                eprintln!("{}", describe_plan(&rt.plan, &rt.read));
            }
            (m, Some(rt))
        }
    };
    let mut points = Vec::new();
    for &len in &a.lengths {
        let point = measure(model.as_ref(), rt.as_ref(), &a, len)?;
        if !a.json {
            eprintln!("{len} tokens: {:.1} tok/s", point.tokens_per_second);
        }
        points.push(point);
    }
    let report = Report {
        label: a.label.clone(),
        model: dir,
        memory_budget: a.ooc.memory_budget.clone(),
        chunk: a.chunk,
        threads: rayon::current_num_threads(),
        points,
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn measure(model: &dyn Model, rt: Option<&OocRuntime>, a: &BenchPrefillArgs, len: usize) -> Result<Point> {
    let vocab = model.info().vocab_size as u64;
    let mut rng = Rng::new(a.seed ^ len as u64);
    let prompt: Vec<u32> = (0..len.max(1)).map(|_| (rng.next_u64() % vocab) as u32).collect();
    let mut state = model.new_state();
    let read0 = rt.map(expert_reads);
    let t = Instant::now();
    let chunks = prompt.chunks(a.chunk.max(1));
    let last = chunks.len() - 1;
    for (i, part) in chunks.enumerate() {
        let logits = if i == last {
            LogitRows::Last
        } else {
            LogitRows::None
        };
        model.forward(
            &mut [SeqInput {
                state: &mut state,
                tokens: part,
                logits,
            }],
            None,
        )?;
    }
    let seconds = t.elapsed().as_secs_f64();
    state.commit_all();
    let context_bytes_held = state.cache_bytes() as u64;
    let read = rt.zip(read0).map(|(r, r0)| expert_reads(r) - r0);
    let io_bound_seconds = read
        .zip(a.disk_gib_s)
        .map(|(b, bw)| b as f64 / (bw * (1u64 << 30) as f64));
    Ok(Point {
        tokens: prompt.len(),
        seconds,
        tokens_per_second: prompt.len() as f64 / seconds,
        expert_read_bytes: read,
        io_bound_seconds,
        ratio_to_io_bound: io_bound_seconds.filter(|&b| b > 0.0).map(|b| seconds / b),
        context_bytes_held,
        context_bytes_planned: model.info().state.bytes(prompt.len(), 0),
    })
}

/// Expert bytes read from storage so far (on demand and by prefetch), from one stats snapshot.
fn expert_reads(rt: &OocRuntime) -> u64 {
    let e = rt.stats().experts;
    e.miss_bytes + e.prefetch_read_bytes
}

fn print_table(r: &Report) {
    println!(
        "prefill, chunk {} tokens, {} threads, memory budget {}{}",
        r.chunk,
        r.threads,
        r.memory_budget,
        if r.label.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.label)
        }
    );
    println!(
        "{:>8} {:>10} {:>12} {:>14} {:>12} {:>14} {:>14} {:>11}",
        "tokens",
        "seconds",
        "tok/s",
        "expert MiB read",
        "x I/O bound",
        "context held",
        "context plan",
        "B/token"
    );
    for p in &r.points {
        let mib = p
            .expert_read_bytes
            .map_or("-".into(), |b| format!("{:.1}", b as f64 / (1u64 << 20) as f64));
        let ratio = p.ratio_to_io_bound.map_or("-".into(), |x| format!("{x:.2}"));
        println!(
            "{:>8} {:>10.2} {:>12.1} {:>14} {:>12} {:>14} {:>14} {:>11.0}",
            p.tokens,
            p.seconds,
            p.tokens_per_second,
            mib,
            ratio,
            human(p.context_bytes_held),
            human(p.context_bytes_planned),
            p.context_bytes_held as f64 / p.tokens.max(1) as f64
        );
    }
}
