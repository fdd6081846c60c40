//! Out-of-core weights: models larger than memory run with a bounded footprint and exactly the
//! same results.
//!
//! * [`plan`]: the residency plan (pure): what stays resident, which spine layers stream each
//!   pass, how many expert slots the budget leaves; the default budget probe.
//! * [`reader`]: a pool of threads issuing aligned positional reads, `O_DIRECT` or buffered.
//! * [`slots`]: the expert cache — equal-size slots, pluggable [`policy`] (LRU, decayed LFU),
//!   RAII handles that pin a slot while its expert computes.
//! * [`store`]: serves MoE layers their experts through the cache (hits compute while misses
//!   load), pre-reads the next layer's predicted experts ([`prefetch`], pure planning) and
//!   cancels losers, records the persistent [`heat`] histogram used to pre-warm and, on request,
//!   a [`routes`] trace of every pass's selections; on a stream install it makes routed experts
//!   local through a [`RangeSource`] before reading them ([`RemoteWeights`]).
//! * [`layers`]: the spine store — a resident prefix of layers plus double-buffered streaming.
//! * [`spans`], [`source`], [`buffer`]: read layouts, blob sources over read buffers, aligned
//!   memory; [`probe`]: disk probes with the same read pattern (`deltafin bench disk`).
//!
//! Invariant: none of this changes a single bit of any result. Layers and experts are built by
//! the architecture's own loading code over buffers holding the checkpoint's exact bytes, and
//! the MoE combines expert outputs in a fixed order whatever order they arrive in.

pub mod buffer;
pub mod heat;
pub mod layers;
pub mod pass;
pub mod plan;
pub mod policy;
pub mod popularity;
pub mod predict;
pub mod prefetch;
pub mod probe;
pub mod read_mode;
pub mod reader;
pub mod routes;
pub mod shard;
pub mod slots;
pub mod source;
pub mod spans;
pub mod store;

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

pub use crate::weights::checksums::ChecksumMode;
pub use layers::{LayerStore, SpineStats};
pub use pass::ExpertPass;
pub use plan::ResidencyPlan;
pub use policy::PolicyKind;
pub use read_mode::{ReadDecision, ReadMode};
pub use reader::{Origin, ReadStats, ReaderConfig, ReaderPool};
pub use store::{ExpertStats, ExpertStore, FETCH_BUCKETS, FETCH_SECONDS_BOUNDS};

use crate::config::Checkpoint;
use crate::error::Result;
use crate::model::Loader;
use crate::weights::{RangeSource, ShardFile, WeightIndex};

/// Identifies one routed expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ExpertKey {
    pub layer: u32,
    pub expert: u32,
}

/// How to run a model out of core.
#[derive(Debug, Clone)]
pub struct OocOptions {
    /// Bytes for weights, caches and state (see [`plan::default_budget`]).
    pub budget: u64,
    pub policy: PolicyKind,
    pub reader: ReaderConfig,
    /// Read the next layer's predicted experts ahead.
    pub prefetch: bool,
    /// Persistent heat histogram (`None`: not recorded, no pre-warm).
    pub heat_file: Option<PathBuf>,
    /// Pre-warm the cache from the heat file at load.
    pub prewarm: bool,
    /// Fewest expert slots accepted.
    pub min_expert_slots: u64,
    /// Bytes reserved for activations and scratch.
    pub reserve_bytes: u64,
    /// Bytes planned for sequence state (the scheduler's context memory); 0: none planned.
    pub context_bytes: u64,
    /// Above 1, ready experts become tasks of the current rayon pool (whose size bounds how
    /// many compute at once); at 1 they run one after another on the calling thread.
    pub compute_threads: usize,
    /// A partly remote checkpoint (stream install): where its shards are read from and what
    /// makes missing expert bytes local. `None`: every shard is `DIR/<name>`, complete.
    pub remote: Option<RemoteWeights>,
    /// Append every pass's routed-expert selections to this file ([`routes`]).
    pub route_trace: Option<PathBuf>,
    /// Whether weight reads are verified against the install's per-tensor checksums.
    pub checksums: ChecksumMode,
}

/// The reader pool over `index`'s shards, verifying reads against the install's checksums as
/// `options.checksums` says.
pub fn open_reader(index: &WeightIndex, options: &OocOptions) -> Result<Arc<ReaderPool>> {
    let reader = ReaderPool::new(&index.shard_paths(), &options.reader)?;
    if let Some(sums) = crate::weights::checksums::load_for(index, options.checksums)? {
        reader.set_checksums(sums.for_index(index)?);
    }
    Ok(Arc::new(reader))
}

/// The shards of a partly remote checkpoint and the source of its missing bytes.
#[derive(Debug, Clone)]
pub struct RemoteWeights {
    /// Every shard, with the file it is read from (staged files keep their inode when published).
    pub shards: Vec<ShardFile>,
    pub source: Arc<dyn RangeSource>,
    /// Missing ranges fetched at once when a layer selects several remote experts.
    pub parallel: usize,
}

impl OocOptions {
    /// Defaults for a budget.
    pub fn with_budget(budget: u64) -> Self {
        OocOptions {
            budget,
            policy: PolicyKind::Lfu,
            reader: ReaderConfig::default(),
            prefetch: true,
            heat_file: None,
            prewarm: true,
            min_expert_slots: 1,
            reserve_bytes: 32 << 20,
            context_bytes: 0,
            compute_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            remote: None,
            route_trace: None,
            checksums: ChecksumMode::Auto,
        }
    }

    /// The weight index of the model in `dir`: over `DIR/*.safetensors`, or over the shards of
    /// [`OocOptions::remote`] when set.
    pub fn open_index(&self, dir: &std::path::Path) -> Result<WeightIndex> {
        match &self.remote {
            Some(r) => WeightIndex::open_shards(dir, &r.shards),
            None => WeightIndex::open(dir),
        }
    }
}

/// Everything measured so far by an out-of-core model.
#[derive(Debug, Clone, Serialize)]
pub struct OocStats {
    pub plan: ResidencyPlan,
    pub policy: PolicyKind,
    pub read_mode: ReadMode,
    /// How the reader reads and why.
    pub read_decision: ReadDecision,
    pub prefetch: bool,
    pub read: ReadStats,
    pub spine: SpineStats,
    pub experts: ExpertStats,
}

/// Handle on an out-of-core model's machinery, for stats and heat.
pub struct OocRuntime {
    pub plan: ResidencyPlan,
    pub options: OocOptions,
    pub reader: Arc<ReaderPool>,
    pub experts: Arc<ExpertStore>,
    spine: Box<dyn Fn() -> SpineStats + Send + Sync>,
    /// Why the heat file was ignored, if it was.
    pub heat_note: Option<String>,
    /// Pre-warm reads submitted at load.
    pub prewarmed: usize,
    /// How expert and layer reads are made, and why.
    pub read: ReadDecision,
}

impl std::fmt::Debug for OocRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OocRuntime")
            .field("plan", &self.plan)
            .field("experts", &self.experts)
            .finish()
    }
}

impl OocRuntime {
    /// Counters so far.
    pub fn stats(&self) -> OocStats {
        OocStats {
            plan: self.plan.clone(),
            policy: self.options.policy,
            read_mode: self.reader.mode(),
            read_decision: self.read.clone(),
            prefetch: self.options.prefetch,
            read: self.reader.stats(),
            spine: (self.spine)(),
            experts: self.experts.stats(),
        }
    }

    /// Whether every shard can give the checkpoint's bytes now ([`ReaderPool::health`]): the
    /// error names the file and what is wrong with it.
    pub fn health(&self) -> Result<()> {
        Ok(self.reader.health()?)
    }

    /// Write the heat histogram now.
    pub fn flush_heat(&self) -> Result<()> {
        self.experts.flush_heat()
    }
}

/// Pieces an architecture hands to [`assemble`].
pub struct OocParts<L: Send + Sync + 'static> {
    pub layer_builder: layers::LayerBuilder<L>,
    pub layer_layouts: Vec<spans::SpanLayout>,
    pub expert_builder: store::ExpertBuilder,
    /// `[layer][expert]`, empty for dense layers.
    pub expert_layouts: Vec<Vec<spans::SpanLayout>>,
    pub lookahead: Vec<Option<store::LookaheadLayer>>,
    /// The always-resident set (already loaded by the architecture).
    pub fixed: spans::SpanLayout,
}

impl<L: Send + Sync + 'static> std::fmt::Debug for OocParts<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OocParts({} layers)", self.layer_layouts.len())
    }
}

/// Load a group of tensors into one resident buffer and build `R` over it. Returns `R` and
/// the layout read.
pub fn load_resident<R>(
    index: &WeightIndex,
    spec: &Checkpoint,
    reader: &ReaderPool,
    build: impl Fn(&Loader<'_>) -> Result<R>,
) -> Result<(R, spans::SpanLayout)> {
    let layout = source::record(index, spec, false, &build)?;
    let buf = Arc::new(buffer::AlignedBuf::new(layout.total)?);
    reader.read_layout_now(buf.clone(), &layout)?;
    let src = source::BufferSource {
        owner: buf,
        layout: &layout,
        identity: None,
    };
    let r = build(
        &Loader::new(index, spec)
            .with_source(&src)
            .with_routed_experts(false),
    )?;
    Ok((r, layout))
}

/// The checkpoint tensors none of `layouts` reads.
fn unread<'a>(index: &WeightIndex, layouts: impl Iterator<Item = &'a spans::SpanLayout>) -> plan::Unread {
    let read: Vec<(usize, u64, u64)> = layouts
        .flat_map(|l| l.tensor_ranges())
        .map(|(shard, r)| (shard, r.start, r.end))
        .collect();
    let infos: Vec<_> = index.names().filter_map(|n| index.info(n).ok()).collect();
    let all: Vec<(&str, usize, u64, u64)> = infos
        .iter()
        .map(|i| (i.name.as_str(), i.shard, i.offset, i.len))
        .collect();
    plan::Unread::of(&all, &read)
}

/// Plan residency from `parts` and build the spine store and the expert store.
pub fn assemble<L: Send + Sync + 'static>(
    index: Arc<WeightIndex>,
    spec: &Checkpoint,
    reader: Arc<ReaderPool>,
    parts: OocParts<L>,
    options: &OocOptions,
) -> Result<(Arc<LayerStore<L>>, OocRuntime)> {
    let slot_bytes = parts
        .expert_layouts
        .iter()
        .flatten()
        .map(|l| l.total as u64)
        .max()
        .unwrap_or(buffer::ALIGN as u64);
    let experts = parts.expert_layouts.iter().map(|l| l.len() as u64).sum();
    let input = plan::PlanInput {
        budget: options.budget,
        fixed_bytes: parts.fixed.total as u64,
        reserve_bytes: options.reserve_bytes,
        context_bytes: options.context_bytes,
        layer_bytes: parts.layer_layouts.iter().map(|l| l.total as u64).collect(),
        slot_bytes,
        experts,
        min_expert_slots: options.min_expert_slots,
    };
    let mut plan = plan::plan(&input)?;
    let all_layouts = parts
        .layer_layouts
        .iter()
        .chain(parts.expert_layouts.iter().flatten());
    plan.unread = unread(&index, std::iter::once(&parts.fixed).chain(all_layouts));
    let read = reader.decision();
    let layers = Arc::new(LayerStore::load(
        index.clone(),
        spec.clone(),
        parts.layer_builder,
        reader.clone(),
        parts.layer_layouts,
        plan.resident_layers,
    )?);
    let cache = slots::ExpertCache::new(
        plan.expert_slots as usize,
        slot_bytes as usize,
        options.policy.build(plan.expert_slots as usize),
    )?;
    let config = store::ExpertStoreConfig {
        prefetch: options.prefetch,
        gate_threshold: 0.1,
        heat_flush_passes: 64,
        compute_threads: options.compute_threads.max(1),
    };
    let n_layers = parts.expert_layouts.len();
    let n_experts = parts.expert_layouts.iter().map(Vec::len).max().unwrap_or(0);
    let store = Arc::new(ExpertStore::new(
        index,
        spec.clone(),
        parts.expert_builder,
        parts.expert_layouts,
        parts.lookahead,
        cache,
        reader.clone(),
        config,
    ));
    let (heat_note, prewarmed) = attach(&store, options, n_layers, n_experts)?;
    let spine_layers = layers.clone();
    let runtime = OocRuntime {
        plan,
        options: options.clone(),
        reader,
        experts: store,
        spine: Box::new(move || spine_layers.stats()),
        heat_note,
        prewarmed,
        read,
    };
    Ok((layers, runtime))
}

/// Give the expert store its remote source, route trace and heat histogram (pre-warming from it:
/// after the remote source, so pre-warm reads only local experts). Returns why the heat file was
/// ignored, if it was, and the pre-warm reads submitted.
fn attach(
    store: &ExpertStore,
    options: &OocOptions,
    layers: usize,
    experts: usize,
) -> Result<(Option<String>, usize)> {
    if let Some(r) = &options.remote {
        store.set_remote(r.source.clone(), r.parallel);
    }
    if let Some(path) = &options.route_trace {
        store.set_route_trace(routes::RouteRecorder::create(path)?);
    }
    let Some(path) = &options.heat_file else {
        return Ok((None, 0));
    };
    let (heat, why) = heat::Heat::load(path, layers, experts);
    let prewarmed = if options.prewarm { store.prewarm(&heat) } else { 0 };
    store.set_heat(heat::HeatRecorder::new(path.clone(), layers, experts, 8192));
    Ok((why, prewarmed))
}
