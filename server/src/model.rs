//! Loading what the server serves: the model (handed to a new engine loop), its tokenizer, and
//! the token facts requests need (stop ids, end-of-turn ids, thinking markers, BOS).

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use deltafin_engine::arch::{self, ModelInfo};
use deltafin_engine::cache::shard::ShardWatch;
use deltafin_engine::cache::{ChecksumMode, OocOptions, OocRuntime};
use deltafin_engine::scheduler::{self, SchedulerConfig};
use deltafin_engine::scheduler::{ExpertIoStats, ExpertSource};
use deltafin_engine::tokenizer::Tokenizer;
use deltafin_engine::tools::{ToolFormat, ToolMarkers};

use crate::drafts::{DraftError, DraftSources};
use crate::http::openai::output::reasoning_markers;
use crate::state::Loaded;

/// Special tokens that end an assistant turn in the chat formats we know.
const END_OF_TURN: [&str; 4] = [
    "<|im_end|>",
    "<|end_of_msg|>",
    "<|eot_id|>",
    "<|end▁of▁sentence|>",
];

/// Why the model could not be served.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the model: {0}")]
    Model(#[source] deltafin_engine::Error),
    #[error("loading the tokenizer: {0}")]
    Tokenizer(#[source] deltafin_engine::Error),
    #[error("starting the engine thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error(transparent)]
    Drafts(#[from] DraftError),
}

/// Where a loaded model runs: given the model and the engine's settings, the model the engine
/// loop drives ([`on_device`]: whole passes on the process's GPU when there is one).
pub type Place<'a> =
    &'a dyn Fn(Box<dyn arch::Model>, &SchedulerConfig) -> Result<Box<dyn arch::Model>, LoadError>;

/// Load `dir` (under a memory budget when `ooc` is given; in memory its tensors are first
/// verified against the install's checksums as `checksums` says) and its drafts, and start its
/// engine loop, on the process's compute device.
pub fn load(
    dir: &Path,
    model_id: String,
    cfg: SchedulerConfig,
    ooc: Option<&OocOptions>,
    checksums: ChecksumMode,
    drafts: &DraftSources,
) -> Result<(Loaded, JoinHandle<()>), LoadError> {
    load_placed(dir, model_id, cfg, (ooc, checksums), drafts, &|m, cfg| {
        on_device(m, cfg, dir)
    })
}

/// [`load`], the model placed by `place` (tests run it on an emulated device).
pub fn load_placed(
    dir: &Path,
    model_id: String,
    mut cfg: SchedulerConfig,
    (ooc, checksums): (Option<&OocOptions>, ChecksumMode),
    drafts: &DraftSources,
    place: Place<'_>,
) -> Result<(Loaded, JoinHandle<()>), LoadError> {
    let spec = deltafin_engine::arch::ModelSpec::load(dir).map_err(LoadError::Model)?;
    let mut watch = None;
    let (model, ooc) = match ooc {
        None => {
            // One index for both: the checksums and the files to watch.
            let index = deltafin_engine::weights::WeightIndex::open(dir).map_err(LoadError::Model)?;
            verify_in_memory(&index, checksums).map_err(LoadError::Model)?;
            watch = Some(ShardWatch::open(&index.shard_paths()).map_err(LoadError::Model)?);
            (arch::load_spec(&spec, dir).map_err(LoadError::Model)?, None)
        }
        Some(o) => {
            let mut o = with_context_memory(&spec, o, &mut cfg);
            if drafts.mtp && drafts.mode != deltafin_engine::spec::SpecMode::Off {
                crate::drafts::reserve_mtp(dir, &mut o).map_err(LoadError::Model)?;
            }
            let (m, rt) = arch::load_budgeted_spec(&spec, dir, &o).map_err(LoadError::Model)?;
            (m, Some(Arc::new(rt)))
        }
    };
    let tokenizer = Arc::new(Tokenizer::from_dir(dir).map_err(LoadError::Tokenizer)?);
    let stop_ids = stop_ids(dir, model.info(), &tokenizer);
    let chat_stop_ids = END_OF_TURN
        .iter()
        .filter_map(|t| tokenizer.token_to_id(t).filter(|&id| tokenizer.is_special(id)))
        .filter(|id| !stop_ids.contains(id))
        .collect();
    let markers = reasoning_markers(&tokenizer);
    let vocab_size = model.info().vocab_size;
    let tool_format = ToolFormat::detect(&tokenizer);
    let model = place(model, &cfg)?;
    cfg.drafts = drafts.load(dir, model.as_ref(), &tokenizer)?;
    tracing::info!(drafts = %cfg.drafts.describe(), "speculative decoding");
    let (engine, thread) = scheduler::start(model, cfg).map_err(LoadError::Thread)?;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let loaded = Loaded {
        tokenizer: tokenizer.clone(),
        engine,
        model_id,
        created,
        stop_ids,
        chat_stop_ids,
        markers,
        ooc,
        watch,
        tool_format,
        tool_markers: tool_format.and_then(|f| ToolMarkers::resolve(f, &tokenizer).ok()),
        vocab_size,
        vocabulary: std::sync::OnceLock::new(),
    };
    Ok((loaded, thread))
}

/// On a GPU, the model as whole passes on the device when its architecture has a served device
/// path (`arch::DeviceModel`): one cache slot per batch row and a spare ([`device_slots`]), each
/// of the context limit, within `arch::DEVICE_CACHE_BYTES` of attention cache; the layers whose
/// spine the device's weight budget holds beside those caches (`arch::device_layers` over the
/// checkpoint in `dir`), the rest on the CPU.
pub fn on_device(
    model: Box<dyn arch::Model>,
    cfg: &SchedulerConfig,
    dir: &Path,
) -> Result<Box<dyn arch::Model>, LoadError> {
    let info = model.info();
    let slots = device_slots(cfg);
    let limits = (cfg.context_limit, info.max_context);
    let capacity =
        arch::device_cache_positions(info.state.per_token, slots, limits, arch::DEVICE_CACHE_BYTES);
    let caches = arch::device_cache_bytes(info.state.per_token, slots, capacity);
    let budget = deltafin_engine::backend::current()
        .weight_budget()
        .map(|b| b.saturating_sub(caches));
    let layers = match budget.map(|b| (arch::ooc_layout(dir), b)) {
        Some((Ok(layout), budget)) => arch::device_layers(&layout.layer_bytes, layout.fixed_bytes, budget),
        _ => usize::MAX,
    };
    let (model, pass) =
        arch::serve_on_current_device(model, (slots, capacity), layers).map_err(LoadError::Model)?;
    tracing::info!(%pass, "device");
    Ok(model)
}

/// Cache slots of a served device: one per sequence of a batch, and a spare that keeps a
/// finished request's mirror for the next turn of its conversation.
pub fn device_slots(cfg: &SchedulerConfig) -> usize {
    cfg.max_batch.max(1) + 1
}

/// In memory, every tensor is verified once, at load, against the install's checksums (out of
/// core, every read is: [`deltafin_engine::cache::ReaderPool::set_checksums`]).
pub fn verify_in_memory(
    index: &deltafin_engine::weights::WeightIndex,
    mode: ChecksumMode,
) -> Result<(), deltafin_engine::Error> {
    let started = std::time::Instant::now();
    if let Some(n) = deltafin_engine::weights::checksums::verify_all(index, mode)? {
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            tensors = n,
            seconds,
            "weights verified against the install's checksums"
        );
    }
    Ok(())
}

/// Plan the context memory inside the budget (`auto` when `context_bytes` is 0) and make the
/// scheduler keep every sequence state inside it.
fn with_context_memory(
    spec: &deltafin_engine::arch::ModelSpec,
    o: &OocOptions,
    cfg: &mut SchedulerConfig,
) -> OocOptions {
    let size = arch::state_size(spec);
    let mut o = o.clone();
    if o.context_bytes == 0 {
        let limit = cfg.context_limit.unwrap_or(usize::MAX);
        o.context_bytes = scheduler::auto_context_bytes(size, o.budget, cfg.max_batch, limit).max(1);
    }
    cfg.context_memory = Some(o.context_bytes);
    o
}

/// EOS ids: config.json's, generation_config.json's and the tokenizer's.
pub fn stop_ids(dir: &Path, info: &ModelInfo, tokenizer: &Tokenizer) -> Vec<u32> {
    let mut ids = info.eos_token_ids.clone();
    if let Ok(text) = std::fs::read(dir.join("generation_config.json"))
        && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&text)
    {
        match &v["eos_token_id"] {
            serde_json::Value::Number(n) => ids.extend(n.as_u64().map(|n| n as u32)),
            serde_json::Value::Array(a) => ids.extend(a.iter().filter_map(|n| n.as_u64().map(|n| n as u32))),
            _ => {}
        }
    }
    ids.extend(tokenizer.eos_id());
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The served model id for `dir`: its directory name.
pub fn default_model_id(dir: &Path) -> String {
    dir.file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("deltafin")
        .to_string()
}

/// Expert reads of an out-of-core model by source: cache hits (demand or prefetched slots) are
/// `pinned` memory; demand misses and prefetch reads came from `disk`, except buffered reads the
/// page cache already held in full (`page_cache`) and the first reads of experts a stream
/// install had to fetch (`network`). Also the store's expert-fetch histogram.
pub fn expert_io(rt: &OocRuntime) -> ExpertIoStats {
    let e = rt.stats().experts;
    let io = ExpertIoStats::default();
    io.add(
        ExpertSource::Pinned,
        e.hits + e.prefetch_hits,
        e.hit_bytes + e.prefetch_hit_bytes,
    );
    io.add(ExpertSource::PageCache, e.page_cache_reads, e.page_cache_bytes);
    io.add(
        ExpertSource::Disk,
        (e.misses + e.prefetch_reads).saturating_sub(e.remote_experts + e.page_cache_reads),
        (e.miss_bytes + e.prefetch_read_bytes).saturating_sub(e.remote_bytes + e.page_cache_bytes),
    );
    io.add(ExpertSource::Network, e.remote_experts, e.remote_bytes);
    io.set_fetch(e.fetch_seconds);
    io
}
