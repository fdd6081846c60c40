//! `deltafin bench run` (alias `model`): prefill and decode a synthetic token stream under the memory budget
//! and report tokens/s, bytes per token by source, hit rate, achieved read bandwidth, the
//! compute / I-O-wait split, and the ratio to the I/O lower bound
//! `(1 - h) * expert bytes per token / disk bandwidth` (plus streamed spine bytes).
//!
//! Decode feeds a seeded random token stream (one token per pass, like llama-bench), so routing
//! depends on the model, not on generated text; `--text` instead prefills that text and decodes
//! greedily, so a trained model's routing locality (experts shared with the previous token) and
//! the prefetcher's recall are those of real generation.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use deltafin_engine::arch::{self, LogitRows, SeqInput};
use deltafin_engine::cache::OocStats;
use deltafin_engine::cache::store::TraceStep;
use deltafin_engine::synth::Rng;
use deltafin_engine::tokenizer::Tokenizer;
use serde::Serialize;

use crate::cli::ooc_args::{OocArgs, describe_plan};

#[derive(Debug, Args)]
pub struct BenchRunArgs {
    /// Model directory, or `builtin:k3`; default: the built-in trained model.
    #[arg(long, env = "DELTAFIN_MODEL")]
    pub model: Option<PathBuf>,
    /// Prefill this text and decode greedily (real generation) instead of random tokens.
    #[arg(long)]
    pub text: Option<String>,
    #[command(flatten)]
    pub ooc: OocArgs,
    #[arg(long, default_value_t = 32)]
    pub prompt_tokens: usize,
    /// Timed decode tokens (after the warm-up).
    #[arg(long, default_value_t = 32)]
    pub decode_tokens: usize,
    /// Decode tokens before timing starts (fill the cache).
    #[arg(long, default_value_t = 8)]
    pub warmup_tokens: usize,
    /// Disk bandwidth for the bound, GiB/s (from `deltafin bench disk`).
    #[arg(long)]
    pub disk_gib_s: Option<f64>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Afterwards, replay the recorded expert demand stream on a fresh cache with no compute:
    /// the I/O path's own tokens/s.
    #[arg(long)]
    pub io_replay: bool,
    /// A label copied into the output.
    #[arg(long, default_value = "")]
    pub label: String,
    #[arg(long)]
    pub json: bool,
}

/// `/proc/self/io` counters.
#[derive(Debug, Clone, Copy, Default)]
struct ProcIo {
    rchar: u64,
    read_bytes: u64,
}

fn proc_io() -> ProcIo {
    let text = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    ProcIo {
        rchar: get("rchar:"),
        read_bytes: get("read_bytes:"),
    }
}

fn peak_rss() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// Per-decode-token figures.
#[derive(Debug, Serialize)]
struct Decode {
    tokens: usize,
    seconds: f64,
    tokens_per_second: f64,
    /// Bytes per token by source.
    resident_spine_bytes: f64,
    streamed_spine_bytes: f64,
    expert_bytes: f64,
    cache_hit_bytes: f64,
    prefetch_hit_bytes: f64,
    demand_read_bytes: f64,
    prefetch_read_bytes: f64,
    /// Bytes the reader pool read, and how much of it the kernel took from disk.
    read_bytes: f64,
    disk_bytes: f64,
    page_cache_bytes: f64,
    hit_rate: f64,
    /// Hits that needed no read at all (prefetch hits excluded).
    cached_hit_rate: f64,
    read_gib_per_second: f64,
    io_wait_seconds_per_token: f64,
    compute_seconds_per_token: f64,
    lookahead_recall: f64,
    previous_recall: f64,
    prefetch_cancelled: u64,
    prefetch_wasted: u64,
}

/// The compute-free replay of the decode's expert stream.
#[derive(Debug, Serialize)]
struct Replay {
    tokens_per_second: f64,
    read_bytes_per_token: f64,
    hit_rate: f64,
    ratio_to_io_bound: Option<f64>,
}

/// Bounds and ratios.
#[derive(Debug, Serialize)]
struct Bound {
    disk_gib_per_second: f64,
    /// `(1 - cached_hit_rate) * expert bytes + streamed spine` per token.
    io_bytes_per_token: f64,
    io_bound_tokens_per_second: f64,
    ratio_to_io_bound: f64,
    /// `(1 - cache fraction) * expert bytes + streamed spine` per token (uniform routing).
    ideal_bytes_per_token: f64,
    bytes_over_ideal: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    label: String,
    model: PathBuf,
    /// What decode fed: `random` ids or `text, greedy`.
    tokens: &'static str,
    load_seconds: f64,
    prefill_tokens: usize,
    prefill_tokens_per_second: f64,
    decode: Decode,
    bound: Option<Bound>,
    io_replay: Option<Replay>,
    peak_rss_bytes: u64,
    stats: OocStats,
}

pub fn run(mut a: BenchRunArgs, cache_dir: &Path) -> Result<()> {
    let Some(mut options) = a.ooc.options()? else {
        bail!("bench run needs a memory budget (not `off`)")
    };
    let dir = crate::cli::run::resolve_model(a.model.take(), cache_dir)?;
    let held = a.prompt_tokens.max(1) + a.warmup_tokens + a.decode_tokens.max(1);
    let spec = crate::cli::ooc_args::plan_context(&dir, &mut options, held)?;
    let t = Instant::now();
    let (model, rt) = arch::load_budgeted_spec(&spec, &dir, &options)?;
    let load_seconds = t.elapsed().as_secs_f64();
    if !a.json {
        eprintln!("{}", describe_plan(&rt.plan, &rt.read));
    }
    let vocab = model.info().vocab_size as u64;
    let mut rng = Rng::new(a.seed);
    let mut random = move || (rng.next_u64() % vocab) as u32;
    rt.experts.start_trace();
    let mut state = model.new_state();
    let prompt: Vec<u32> = match &a.text {
        Some(text) => Tokenizer::from_dir(&dir)?.encode_prompt(text),
        None => (0..a.prompt_tokens.max(1)).map(|_| random()).collect(),
    };
    let greedy = a.text.is_some();
    let t = Instant::now();
    let mut logits = Vec::new();
    for part in prompt.chunks(32) {
        logits = model.forward(
            &mut [SeqInput {
                state: &mut state,
                tokens: part,
                logits: LogitRows::Last,
            }],
            None,
        )?;
    }
    let prefill_tokens_per_second = prompt.len() as f64 / t.elapsed().as_secs_f64();
    let mut step = |state: &mut _| -> Result<()> {
        let next = if greedy { argmax(&logits) } else { random() };
        logits = model.forward(
            &mut [SeqInput {
                state,
                tokens: &[next],
                logits: LogitRows::Last,
            }],
            None,
        )?;
        Ok(())
    };
    for _ in 0..a.warmup_tokens {
        step(&mut state)?;
    }
    let (s0, io0, t0) = (rt.stats(), proc_io(), Instant::now());
    for _ in 0..a.decode_tokens.max(1) {
        step(&mut state)?;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let (s1, io1) = (rt.stats(), proc_io());
    rt.flush_heat()?;
    let decode = decode_figures(&s0, &s1, io0, io1, a.decode_tokens.max(1), seconds);
    let bound = a.disk_gib_s.map(|bw| bound(&s1, &decode, bw));
    let steps = rt.experts.take_trace();
    drop((state, model, rt));
    let io_replay = if a.io_replay {
        Some(replay(&a, &dir, &options, &steps, bound.as_ref())?)
    } else {
        None
    };
    let report = Report {
        label: a.label.clone(),
        model: dir,
        tokens: if greedy { "text, greedy" } else { "random" },
        load_seconds,
        prefill_tokens: prompt.len(),
        prefill_tokens_per_second,
        decode,
        bound,
        io_replay,
        peak_rss_bytes: peak_rss(),
        stats: s1,
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn replay(
    a: &BenchRunArgs,
    dir: &Path,
    options: &deltafin_engine::cache::OocOptions,
    steps: &[TraceStep],
    bound: Option<&Bound>,
) -> Result<Replay> {
    use deltafin_engine::cache::store::TraceStep as T;
    let n = a.decode_tokens.max(1);
    let ends: Vec<usize> = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, T::EndPass))
        .map(|(i, _)| i)
        .collect();
    if ends.len() <= n {
        bail!("trace too short for replay");
    }
    let split = ends[ends.len() - n - 1] + 1;
    let (_model, rt) = arch::load_budgeted(dir, options)?;
    rt.experts.replay(&steps[..split])?;
    let s0 = rt.stats();
    let t = Instant::now();
    rt.experts.replay(&steps[split..])?;
    let secs = t.elapsed().as_secs_f64();
    let s1 = rt.stats();
    let (e0, e1) = (&s0.experts, &s1.experts);
    let used = (e1.use_bytes - e0.use_bytes) as f64;
    let tps = n as f64 / secs;
    Ok(Replay {
        tokens_per_second: tps,
        read_bytes_per_token: (s1.read.bytes - s0.read.bytes) as f64 / n as f64,
        hit_rate: if used > 0.0 {
            ((e1.hit_bytes - e0.hit_bytes) + (e1.prefetch_hit_bytes - e0.prefetch_hit_bytes)) as f64 / used
        } else {
            0.0
        },
        ratio_to_io_bound: bound.map(|b| tps / b.io_bound_tokens_per_second),
    })
}

fn decode_figures(s0: &OocStats, s1: &OocStats, io0: ProcIo, io1: ProcIo, n: usize, seconds: f64) -> Decode {
    let per = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / n as f64;
    let (e0, e1) = (&s0.experts, &s1.experts);
    let use_bytes = per(e0.use_bytes, e1.use_bytes);
    let hit = per(e0.hit_bytes, e1.hit_bytes);
    let pre_hit = per(e0.prefetch_hit_bytes, e1.prefetch_hit_bytes);
    let read = per(s0.read.bytes, s1.read.bytes);
    let disk = per(io0.read_bytes, io1.read_bytes);
    let buffered = per(s0.read.buffered_bytes, s1.read.buffered_bytes);
    let busy = s1.read.busy_seconds - s0.read.busy_seconds;
    let wait = (e1.wait_seconds - e0.wait_seconds) + (s1.spine.wait_seconds - s0.spine.wait_seconds);
    Decode {
        tokens: n,
        seconds,
        tokens_per_second: n as f64 / seconds,
        resident_spine_bytes: per(s0.spine.resident_bytes, s1.spine.resident_bytes),
        streamed_spine_bytes: per(s0.spine.streamed_bytes, s1.spine.streamed_bytes),
        expert_bytes: use_bytes,
        cache_hit_bytes: hit,
        prefetch_hit_bytes: pre_hit,
        demand_read_bytes: per(e0.miss_bytes, e1.miss_bytes),
        prefetch_read_bytes: per(e0.prefetch_read_bytes, e1.prefetch_read_bytes),
        read_bytes: read,
        disk_bytes: disk,
        page_cache_bytes: (buffered - disk.min(buffered)).max(0.0)
            + (io1.rchar.saturating_sub(io0.rchar) as f64 / n as f64 - read).max(0.0),
        hit_rate: if use_bytes > 0.0 {
            (hit + pre_hit) / use_bytes
        } else {
            0.0
        },
        cached_hit_rate: if use_bytes > 0.0 { hit / use_bytes } else { 0.0 },
        read_gib_per_second: if busy > 0.0 {
            read * n as f64 / busy / (1u64 << 30) as f64
        } else {
            0.0
        },
        io_wait_seconds_per_token: wait / n as f64,
        compute_seconds_per_token: (seconds - wait).max(0.0) / n as f64,
        lookahead_recall: e1.lookahead_recall,
        previous_recall: e1.previous_recall,
        prefetch_cancelled: e1.prefetch_cancelled - e0.prefetch_cancelled,
        prefetch_wasted: e1.prefetch_wasted - e0.prefetch_wasted,
    }
}

fn bound(s: &OocStats, d: &Decode, disk_gib_s: f64) -> Bound {
    let bw = disk_gib_s * (1u64 << 30) as f64;
    let io = (1.0 - d.cached_hit_rate) * d.expert_bytes + d.streamed_spine_bytes;
    let ideal = (1.0 - s.plan.cache_fraction) * d.expert_bytes + d.streamed_spine_bytes;
    let bound = if io > 0.0 { bw / io } else { f64::INFINITY };
    Bound {
        disk_gib_per_second: disk_gib_s,
        io_bytes_per_token: io,
        io_bound_tokens_per_second: bound,
        ratio_to_io_bound: d.tokens_per_second / bound,
        ideal_bytes_per_token: ideal,
        bytes_over_ideal: if ideal > 0.0 { d.read_bytes / ideal } else { 0.0 },
    }
}

fn print_table(r: &Report) {
    let d = &r.decode;
    let mb = |b: f64| b / (1 << 20) as f64;
    println!("{:<34} {}", "label", r.label);
    println!("{:<34} {:.1} s", "load", r.load_seconds);
    println!(
        "{:<34} {:.2} tok/s ({} tokens)",
        "prefill", r.prefill_tokens_per_second, r.prefill_tokens
    );
    println!(
        "{:<34} {:.3} tok/s ({} tokens, {:.1} s)",
        "decode", d.tokens_per_second, d.tokens, d.seconds
    );
    println!(
        "{:<34} {:.1}",
        "MiB/token resident spine",
        mb(d.resident_spine_bytes)
    );
    println!(
        "{:<34} {:.1}",
        "MiB/token streamed spine",
        mb(d.streamed_spine_bytes)
    );
    println!("{:<34} {:.1}", "MiB/token experts used", mb(d.expert_bytes));
    println!(
        "{:<34} {:.1} / {:.1}",
        "MiB/token cache hit / prefetch hit",
        mb(d.cache_hit_bytes),
        mb(d.prefetch_hit_bytes)
    );
    println!(
        "{:<34} {:.1} / {:.1}",
        "MiB/token demand / prefetch reads",
        mb(d.demand_read_bytes),
        mb(d.prefetch_read_bytes)
    );
    println!(
        "{:<34} {:.1} / {:.1} / {:.1}",
        "MiB/token read / disk / page cache",
        mb(d.read_bytes),
        mb(d.disk_bytes),
        mb(d.page_cache_bytes)
    );
    println!(
        "{:<34} {:.1}% ({:.1}% without prefetch hits)",
        "expert hit rate (bytes)",
        100.0 * d.hit_rate,
        100.0 * d.cached_hit_rate
    );
    println!("{:<34} {:.2}", "read GiB/s while busy", d.read_gib_per_second);
    println!(
        "{:<34} {:.3} / {:.3}",
        "s/token compute / I-O wait", d.compute_seconds_per_token, d.io_wait_seconds_per_token
    );
    println!(
        "{:<34} {:.1}% ({} tokens)",
        "routing locality (prev. experts)",
        100.0 * d.previous_recall,
        r.tokens
    );
    println!(
        "{:<34} {:.1}%",
        "prefetch recall (look-ahead)",
        100.0 * d.lookahead_recall
    );
    if let Some(b) = &r.bound {
        println!(
            "{:<34} {:.2} tok/s at {:.2} GiB/s ({:.2}x achieved)",
            "I/O bound", b.io_bound_tokens_per_second, b.disk_gib_per_second, b.ratio_to_io_bound
        );
        println!(
            "{:<34} {:.1} MiB ({:.2}x read)",
            "ideal MiB/token for the cache",
            mb(b.ideal_bytes_per_token),
            b.bytes_over_ideal
        );
    }
    if let Some(x) = &r.io_replay {
        let ratio = x
            .ratio_to_io_bound
            .map_or(String::new(), |v| format!(" ({v:.2}x the I/O bound)"));
        println!(
            "{:<34} {:.2} tok/s{ratio}, {:.1} MiB/token read",
            "I/O replay (no compute)",
            x.tokens_per_second,
            mb(x.read_bytes_per_token)
        );
    }
    println!("{:<34} {}", "reads", r.stats.read_decision);
    println!("{:<34} {:.0} MiB", "peak RSS", mb(r.peak_rss_bytes as f64));
}

/// The first index of the largest logit.
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}
