//! `deltafin plan`: what a given box will do with a model. It prints the residency plan for the
//! box's memory and the predicted decode and prefill tokens per second at several numbers of
//! streams, from the plan's bytes per step and two rates measured here — the disk's bandwidth
//! for whole-expert reads and the kernels' seconds per weight byte on the model's own stored
//! expert format — scaled to the box's cores and disk (`engine/src/cache/predict.rs` has the
//! formula, which is printed with the figures). Nothing but tensor headers is read to plan.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use deltafin_engine::arch::{self, ModelSpec, OocLayout};
use deltafin_engine::backend::residency::TierPlan;
use deltafin_engine::cache::plan::{PlanInput, default_budget, human, parse_size, plan, probe_memory};
use deltafin_engine::cache::policy::PolicyKind;
use deltafin_engine::cache::popularity::Popularity;
use deltafin_engine::cache::predict::{Hits, KernelCost, Machine, Routing, StepPrediction, step};
use deltafin_engine::cache::probe::{evict_page_cache, expert_layouts, pick, read_probe};
use deltafin_engine::cache::routes::RouteCounts;
use deltafin_engine::cache::{OocOptions, ReadMode, ResidencyPlan};
use deltafin_engine::scheduler;
use deltafin_engine::weights::WeightIndex;
use serde::Serialize;

/// Arguments of `deltafin plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Model directory (default: the `bench serve` model, generated if missing).
    #[arg(long, env = "DELTAFIN_MODEL")]
    model: Option<PathBuf>,
    /// Memory the engine may use on that box, as `--memory-budget` takes it (`64G`); default:
    /// this machine's `auto` budget.
    #[arg(long)]
    ram: Option<String>,
    /// That box's disk read bandwidth in GB/s (default: measured here on the model's shards,
    /// whole-expert reads as the engine makes them, 8 in flight).
    #[arg(long)]
    disk_gbps: Option<f64>,
    /// That box's cores for the kernels (default: this process's kernel threads).
    #[arg(long)]
    cores: Option<usize>,
    /// That box's GPU memory for weights (`24G`): the device tiers are planned and printed;
    /// the predicted rates stay those of CPU compute (no GPU rate is measured here).
    #[arg(long)]
    gpu_memory: Option<String>,
    /// Context memory inside the budget: a size, `0` (none planned, as `bench serve`), or
    /// `auto` (what `serve` plans for the largest number of streams).
    #[arg(long, default_value = "auto")]
    context_memory: String,
    /// Concurrent streams to predict.
    #[arg(long, default_value = "1,8", value_delimiter = ',')]
    streams: Vec<usize>,
    /// Prompt tokens per pass for the prefill prediction (default: the server's chunk for a
    /// prompt prefilling alone); `s` streams prefill `s` times as many per pass.
    #[arg(long, default_value_t = scheduler::DEFAULT_PREFILL_CHUNK_SOLO)]
    prefill_tokens: usize,
    /// A route trace of this model (`bench serve`/`serve --route-trace FILE`): predict the
    /// hits of `--cache-policy` under the routing it measured, not the cache's share of the
    /// experts (the hit rate under uniform routing).
    #[arg(long)]
    route_trace: Option<PathBuf>,
    /// The expert cache's policy the engine will run, for `--route-trace`.
    #[arg(long, default_value = "lfu")]
    cache_policy: PolicyKind,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// A figure and where it came from.
#[derive(Debug, Serialize)]
struct Input<T> {
    value: T,
    /// `given` or `measured here`.
    source: &'static str,
}

#[derive(Debug, Serialize)]
struct Prediction {
    kind: &'static str,
    streams: usize,
    #[serde(flatten)]
    step: StepPrediction,
}

#[derive(Debug, Serialize)]
struct Report {
    model: PathBuf,
    layout: OocLayout,
    budget: Input<u64>,
    disk_bytes_per_second: Input<f64>,
    /// Each disk probe's bytes per second when measured here (their median is the figure).
    disk_probes: Vec<f64>,
    cores: Input<usize>,
    kernel: KernelCost,
    plan: ResidencyPlan,
    device: Option<String>,
    formula: &'static str,
    /// `share` (uniform routing), or the route trace and policy the hits come from.
    hits: String,
    predictions: Vec<Prediction>,
}

const FORMULA: &str = "union(s) = E*(1-(1-k/E)^s); disk(s) = streamed + L*union(s)*(1-h)*slot; \
compute(s) = spine*c(s) + L*union(s)*slot*c(s*k/union(s)); step(s) = disk(s)/bandwidth + compute(s); \
tokens/s = s/step(s)  [s rows per step, E experts of `slot` bytes in each of L MoE layers, top-k, \
h = the plan's cache fraction (the hit rate under uniform routing: a floor, since the default LFU \
policy hits more where routing is skewed), c(r) = measured kernel seconds per weight byte at r rows, times \
cores_here/cores]; with --route-trace: union(s) = sum_e (1-(1-p_e)^s)/L and disk(s) = streamed + \
sum_e (1-(1-p_e)^s)*(1-held_e)*slot, p_e each expert's measured chance per row, held_e its chance of \
being cached under the policy (LFU: the hottest experts; LRU: Che's approximation)";

/// Row counts the kernels are timed at (interpolated between).
const KERNEL_ROWS: [usize; 4] = [1, 8, 64, 512];

pub fn run(a: PlanArgs, cache_dir: &Path) -> Result<()> {
    let dir = crate::bench::serve::resolve(a.model.clone(), cache_dir)?;
    let spec = ModelSpec::load(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let layout = arch::ooc_layout(&dir).with_context(|| format!("planning {}", dir.display()))?;
    let budget = match &a.ram {
        Some(s) => Input {
            value: parse_size(s).context("--ram")?,
            source: "given",
        },
        None => {
            let (limit, usage, available) = probe_memory();
            Input {
                value: default_budget(limit, usage, available),
                source: "measured here",
            }
        }
    };
    let max_streams = a.streams.iter().copied().max().unwrap_or(1).max(1);
    let plan = residency(&spec, &layout, budget.value, &a.context_memory, max_streams)?;
    let (disk, disk_probes) = match a.disk_gbps {
        Some(g) if g > 0.0 => (
            Input {
                value: g * 1e9,
                source: "given",
            },
            Vec::new(),
        ),
        Some(g) => bail!("--disk-gbps {g}: give a bandwidth above 0"),
        None => {
            let probes = (0..DISK_PROBES)
                .map(|i| measure_disk(&dir, i as u64))
                .collect::<Result<Vec<f64>>>()?;
            let value = median(&probes);
            (
                Input {
                    value,
                    source: "measured here: the median of 3 probes",
                },
                probes,
            )
        }
    };
    let here = rayon::current_num_threads().max(1);
    let cores = Input {
        value: a.cores.unwrap_or(here).max(1),
        source: if a.cores.is_some() {
            "given"
        } else {
            "measured here"
        },
    };
    let kernel = deltafin_engine::pool::on_pool(|| measure_kernels(&dir, layout.slot_bytes, here))?;
    let device = a
        .gpu_memory
        .as_deref()
        .map(|g| device_tiers(g, &plan))
        .transpose()?;
    let machine = Machine {
        disk_bytes_per_second: disk.value,
        cores: cores.value,
        kernel: kernel.clone(),
    };
    let routing = Routing {
        moe_layers: layout.moe_layers,
        experts_per_layer: layout.experts_per_layer,
        top_k: layout.top_k,
    };
    let measured = a
        .route_trace
        .as_deref()
        .map(|path| measured_hits(path, &routing, &plan, a.cache_policy))
        .transpose()?;
    let hits = match &measured {
        None => Hits::Share,
        Some((pop, held)) => Hits::Measured(pop, held),
    };
    let hits_source = match &a.route_trace {
        None => "share".to_string(),
        Some(p) => format!("measured: {} under {:?}", p.display(), a.cache_policy),
    };
    let mut predictions = Vec::new();
    for &s in &a.streams {
        let s = s.max(1);
        let decode = step(&plan, &routing, &machine, s, hits);
        predictions.push(Prediction {
            kind: "decode",
            streams: s,
            step: decode,
        });
    }
    for &s in &a.streams {
        let s = s.max(1);
        let prefill = step(&plan, &routing, &machine, s * a.prefill_tokens.max(1), hits);
        predictions.push(Prediction {
            kind: "prefill",
            streams: s,
            step: prefill,
        });
    }
    let report = Report {
        model: dir,
        layout,
        budget,
        disk_bytes_per_second: disk,
        disk_probes,
        cores,
        kernel,
        plan,
        device,
        formula: FORMULA,
        hits: hits_source,
        predictions,
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

/// The routing measured by the trace at `path`, and what the cache `plan` sizes holds of it
/// under `policy`.
fn measured_hits(
    path: &Path,
    routing: &Routing,
    plan: &ResidencyPlan,
    policy: PolicyKind,
) -> Result<(Popularity, Vec<Vec<f64>>)> {
    let counts = RouteCounts::read(path).with_context(|| format!("reading {}", path.display()))?;
    let pop = Popularity::from_counts(
        &counts,
        routing.moe_layers,
        routing.experts_per_layer,
        routing.top_k,
    )
    .with_context(|| format!("{}", path.display()))?;
    let held = pop.held(plan.expert_slots as usize, policy);
    Ok((pop, held))
}

/// The residency plan `load_budgeted` would make for `budget`, with the context memory `serve`
/// would plan (`auto`), none (`0`) or the size given.
fn residency(
    spec: &ModelSpec,
    layout: &OocLayout,
    budget: u64,
    context: &str,
    streams: usize,
) -> Result<ResidencyPlan> {
    let o = OocOptions::with_budget(budget);
    let context_bytes = match context {
        "auto" => scheduler::auto_context_bytes(arch::state_size(spec), budget, streams, usize::MAX).max(1),
        "0" => 0,
        s => parse_size(s).context("--context-memory")?,
    };
    Ok(plan(&PlanInput {
        budget,
        fixed_bytes: layout.fixed_bytes,
        reserve_bytes: o.reserve_bytes,
        context_bytes,
        layer_bytes: layout.layer_bytes.clone(),
        slot_bytes: layout.slot_bytes,
        experts: layout.experts(),
        min_expert_slots: o.min_expert_slots,
    })?)
}

/// Disk probes `plan` takes: one probe swung between 2.7 and 3.6 GB/s within minutes here
/// (the stop-52 calibration), so the figure is their median.
const DISK_PROBES: usize = 3;

/// The middle value (the mean of the two middle ones for an even count; 0 for none).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Whole-expert reads from the model's shards, 8 in flight, as the engine reads them
/// (`ReadMode::Auto`: O_DIRECT where the filesystem has it, else buffered reads that drop their
/// pages; the shards' page cache is dropped first), probe `probe` choosing its own experts:
/// bytes per second.
fn measure_disk(dir: &Path, probe: u64) -> Result<f64> {
    let index = WeightIndex::open(dir)?;
    let layouts = expert_layouts(&index);
    if layouts.is_empty() {
        bail!("{}: no routed experts to read", dir.display());
    }
    let paths = index.shard_paths();
    // About 256 MiB of reads (at least 96): shorter probes swing with the disk's moods.
    let slot = layouts.iter().map(|l| l.read_bytes()).max().unwrap_or(1).max(1);
    let count = ((256u64 << 20) / slot).clamp(96, 4096) as usize;
    let chosen = pick(layouts.len(), 0, count, 0x9_1A4 + probe);
    evict_page_cache(&paths);
    let result = read_probe(&paths, &layouts, &chosen, ReadMode::Auto, 8)?;
    Ok(result.bytes as f64 / result.seconds.max(1e-9))
}

/// Seconds per weight byte of a routed expert's forward at [`KERNEL_ROWS`], on `cores` threads
/// (over the plan's slot bytes: one expert's).
fn measure_kernels(dir: &Path, slot_bytes: u64, cores: usize) -> Result<KernelCost> {
    let seconds = arch::time_expert(dir, &KERNEL_ROWS, 0.15)?;
    let points = KERNEL_ROWS
        .iter()
        .zip(seconds)
        .map(|(&rows, s)| (rows, s / slot_bytes.max(1) as f64))
        .collect();
    Ok(KernelCost { points, cores })
}

/// How a GPU of `size` would hold the plan's spine and experts.
fn device_tiers(size: &str, plan: &ResidencyPlan) -> Result<String> {
    let tiers = TierPlan {
        device: "GPU (given)".into(),
        budget: parse_size(size).context("--gpu-memory")?,
        spine_bytes: plan.fixed_bytes + plan.layer_bytes.iter().sum::<u64>(),
        fixed_bytes: plan.fixed_bytes,
        layer_spine: plan.layer_bytes.clone(),
        expert_bytes: plan.slot_bytes,
        experts: plan.experts,
        host_slots: plan.expert_slots,
    };
    Ok(tiers.to_string())
}

fn print_report(r: &Report) {
    let l = &r.layout;
    println!(
        "model: {} ({} layers, {} MoE layers x {} experts of {}, top-{})",
        r.model.display(),
        l.layer_bytes.len(),
        l.moe_layers,
        l.experts_per_layer,
        human(l.slot_bytes),
        l.top_k
    );
    let probes: Vec<String> = r.disk_probes.iter().map(|b| format!("{:.2}", b / 1e9)).collect();
    let probes = match probes.is_empty() {
        true => String::new(),
        false => format!(": {} GB/s", probes.join(", ")),
    };
    println!(
        "box: memory {} ({}), disk {:.2} GB/s ({}{probes}), {} cores ({})",
        human(r.budget.value),
        r.budget.source,
        r.disk_bytes_per_second.value / 1e9,
        r.disk_bytes_per_second.source,
        r.cores.value,
        r.cores.source
    );
    println!("plan: {}", crate::cli::ooc_args::describe_budget(&r.plan));
    if let Some(d) = &r.device {
        println!("device tiers: {d} (the rates below are for CPU compute: no GPU is measured here)");
    }
    let kernel: Vec<String> = r
        .kernel
        .points
        .iter()
        .map(|(rows, c)| format!("{rows} row(s) {:.3} ns/B", c * 1e9))
        .collect();
    println!(
        "kernels (the model's expert format, measured here on {} threads): {}",
        r.kernel.cores,
        kernel.join(", ")
    );
    println!("formula: {}", r.formula);
    println!("hits: {}", r.hits);
    println!(
        "{:>8} {:>8} {:>7} {:>12} {:>14} {:>10} {:>14} {:>11} {:>8} {:>10}",
        "",
        "streams",
        "rows",
        "union/layer",
        "disk MiB/step",
        "disk ms",
        "compute MiB",
        "compute ms",
        "bound",
        "tok/s"
    );
    for p in &r.predictions {
        let s = &p.step;
        println!(
            "{:>8} {:>8} {:>7} {:>12.1} {:>14.2} {:>10.2} {:>14.2} {:>11.2} {:>8} {:>10.1}",
            p.kind,
            p.streams,
            s.rows,
            s.union_experts_per_layer,
            s.disk_bytes / (1u64 << 20) as f64,
            s.disk_seconds * 1e3,
            s.compute_bytes / (1u64 << 20) as f64,
            s.compute_seconds * 1e3,
            s.bound,
            s.tokens_per_second
        );
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_disk_figure_is_the_median_probe() {
        assert_eq!(median(&[3.1, 2.7, 3.6]), 3.1);
        assert_eq!(median(&[2.0, 4.0]), 3.0);
        assert_eq!(median(&[5.0]), 5.0);
        assert_eq!(median(&[]), 0.0);
    }
}
