//! Flags shared by commands that load a model under a memory budget.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use deltafin_engine::arch::ModelSpec;
use deltafin_engine::cache::plan::{default_budget, human, parse_size, probe_memory};
use deltafin_engine::cache::reader::DEFAULT_CHUNK_BYTES;
use deltafin_engine::cache::{ChecksumMode, OocOptions, PolicyKind, ReadDecision, ReadMode, ResidencyPlan};

/// Out-of-core settings.
#[derive(Debug, Clone, Args)]
pub struct OocArgs {
    /// Memory for weights, caches and state: a size (`4G`, `512M`), `auto` (the cgroup limit,
    /// else available memory, minus headroom) or `off` (memory-map everything).
    #[arg(long, default_value = "auto", env = "DELTAFIN_MEMORY_BUDGET")]
    pub memory_budget: String,
    /// Expert cache eviction policy: `lfu` (decayed selection hotness) or `lru`.
    #[arg(long, default_value = "lfu", env = "DELTAFIN_CACHE_POLICY")]
    pub cache_policy: PolicyKind,
    /// `auto` (O_DIRECT where supported, else buffered reads that drop their pages at once:
    /// expert reads never grow the page cache), `direct`, or `buffered` (through the page
    /// cache, which keeps what it read and which a memory cgroup charges).
    #[arg(long, default_value = "auto", env = "DELTAFIN_READ_MODE")]
    pub read_mode: ReadMode,
    /// Disable next-layer expert prefetch (for A/B runs).
    #[arg(long, env = "DELTAFIN_NO_PREFETCH")]
    pub no_prefetch: bool,
    /// Reader threads (reads in flight).
    #[arg(long, default_value_t = 8, env = "DELTAFIN_READERS")]
    pub readers: usize,
    /// Largest single read, MiB: the workers share the oldest read's chunks, so an expert
    /// lands as soon as the disk can deliver it instead of together with every read in flight.
    #[arg(long, default_value_t = DEFAULT_CHUNK_BYTES >> 20, env = "DELTAFIN_READ_CHUNK_MIB")]
    pub read_chunk_mib: usize,
    /// Persistent expert heat histogram (recorded, used to pre-warm the cache).
    #[arg(long, env = "DELTAFIN_HEAT_FILE")]
    pub heat_file: Option<PathBuf>,
    /// Memory for sequence state inside the budget (every request's attention caches and
    /// recurrent states, their checkpoints, the reuse cache): a size, or `auto` (the batch at
    /// up to 32k tokens each, at most a quarter of the budget). A prompt that cannot fit is
    /// refused; requests wait for room instead of growing past the budget.
    #[arg(long, default_value = "auto", env = "DELTAFIN_CONTEXT_MEMORY")]
    pub context_memory: String,
    /// Append every pass's routed-expert selections to FILE as JSON lines (for `deltafin warm`).
    #[arg(long, value_name = "FILE", env = "DELTAFIN_ROUTE_TRACE")]
    pub route_trace: Option<PathBuf>,
    /// Verify every weight read against the install's per-tensor checksums
    /// (`.deltafin/checksums.json`, written by `setup` and `doctor --write-checksums`): `auto`
    /// (when recorded), `on` (required), `off`. Reads are always checked for length and for
    /// files changed under the process.
    #[arg(long, default_value = "auto", env = "DELTAFIN_VERIFY_WEIGHTS")]
    pub verify_weights: ChecksumMode,
}

impl OocArgs {
    /// Whether the budget was given explicitly (not `auto`).
    pub fn explicit(&self) -> bool {
        self.memory_budget != "auto"
    }

    /// `None` for `off`, else the options with the resolved budget.
    pub fn options(&self) -> Result<Option<OocOptions>> {
        let budget = match self.memory_budget.as_str() {
            "off" => return Ok(None),
            "auto" => {
                let (limit, usage, available) = probe_memory();
                default_budget(limit, usage, available)
            }
            s => parse_size(s).context("--memory-budget")?,
        };
        let mut o = OocOptions::with_budget(budget);
        o.policy = self.cache_policy;
        o.reader.mode = self.read_mode;
        o.reader.threads = self.readers.max(1);
        o.reader.chunk_bytes = self.read_chunk_mib.max(1) << 20;
        o.prefetch = !self.no_prefetch;
        o.heat_file = self.heat_file.clone();
        o.route_trace = self.route_trace.clone();
        o.checksums = self.verify_weights;
        // 0 = `auto`, resolved when the model's state size is known (crate::model::load).
        o.context_bytes = match self.context_memory.as_str() {
            "auto" => 0,
            s => {
                let n = parse_size(s).context("--context-memory")?;
                anyhow::ensure!(n > 0, "--context-memory must be a size above 0 or `auto`");
                n
            }
        };
        Ok(Some(o))
    }
}

/// Size `--context-memory auto` for one sequence of `tokens` positions — what `run` and `bench
/// prefill` hold — so its attention caches and recurrent state are planned inside the budget
/// (the expert cache gives way) instead of growing beside it. A context that cannot fit beside
/// the fixed tensors is refused by the plan with the budget named. Returns the parsed
/// `config.json` for the load (parsed once).
pub fn plan_context(dir: &Path, o: &mut OocOptions, tokens: usize) -> Result<ModelSpec> {
    let spec = ModelSpec::load(dir).with_context(|| format!("reading {}", dir.display()))?;
    if o.context_bytes == 0 {
        o.context_bytes = deltafin_engine::arch::state_size(&spec).bytes(tokens, 0).max(1);
    }
    Ok(spec)
}

/// The plan as printed at start, with the device tier when a GPU computes.
pub fn describe_plan(p: &ResidencyPlan, read: &ReadDecision) -> String {
    let host = describe_host_plan(p, read);
    match device_tiers(p) {
        Some(t) => format!("{host}; {t}"),
        None => host,
    }
}

/// How the device's weight budget holds this plan's spine and experts (`None` on the CPU).
fn device_tiers(p: &ResidencyPlan) -> Option<deltafin_engine::backend::residency::TierPlan> {
    let backend = deltafin_engine::backend::current();
    let budget = backend.weight_budget()?;
    Some(deltafin_engine::backend::residency::TierPlan {
        device: backend.device().to_string(),
        budget,
        spine_bytes: p.fixed_bytes + p.layer_bytes.iter().sum::<u64>(),
        fixed_bytes: p.fixed_bytes,
        layer_spine: p.layer_bytes.clone(),
        expert_bytes: p.slot_bytes,
        experts: p.experts,
        host_slots: p.expert_slots,
    })
}

/// The host part of the plan.
fn describe_host_plan(p: &ResidencyPlan, read: &ReadDecision) -> String {
    format!("{}; reads: {read}", describe_budget(p))
}

/// How the plan divides the budget (without the read mode, which needs the files open).
pub fn describe_budget(p: &ResidencyPlan) -> String {
    let unread = match &p.unread {
        u if u.tensors == 0 => String::new(),
        u => {
            let groups: Vec<String> = u.groups.iter().map(|(g, n)| format!("{g}.* ({n})")).collect();
            format!(
                "; not read (not part of the text decoder): {} tensors, {}: {}",
                u.tensors,
                human(u.bytes),
                groups.join(", ")
            )
        }
    };
    let plan = format!(
        "memory budget {}: fixed {} + reserve {} + context memory {}; spine layers 0..{} resident ({}), {} streamed ({} per pass, arena {}); expert cache {} slots x {} = {} ({:.1}% of experts)",
        human(p.budget),
        human(p.fixed_bytes),
        human(p.reserve_bytes),
        human(p.context_bytes),
        p.resident_layers,
        human(p.resident_spine_bytes),
        p.streamed_layers.len(),
        human(p.streamed_bytes_per_pass),
        human(p.arena_bytes),
        p.expert_slots,
        human(p.slot_bytes),
        human(p.expert_cache_bytes),
        100.0 * p.cache_fraction
    );
    plan + &unread
}
