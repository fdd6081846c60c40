//! Architectures. Each architecture is one file; shared layers live in [`layers`]. [`load`] is
//! the only place that maps a config to an implementation.
//!
//! A forward pass runs a *batch*: one or more sequences, each contributing consecutive new
//! tokens. All rows go through the same weight reads (the multi-row kernels), while attention and
//! state stay per sequence. Every row's result is bit-identical to running it alone.

pub mod deepseek_v3;
pub mod kimi_k3;
pub mod kimi_linear;
pub mod layers;
mod loader;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::Path;

pub use loader::Loader;

use crate::config::{ArchConfig, ModelSpec};
use crate::error::{Error, Result};
use crate::generate::{KdaCache, MlaCache, SeqState};
use crate::weights::WeightIndex;

/// Facts about a loaded model that generation and serving need.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Architecture name (`deepseek_v3`, ...).
    pub arch: &'static str,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    /// Longest sequence the model supports.
    pub max_context: usize,
    pub bos_token_id: Option<u32>,
    /// Ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Bytes of weights the model references (all shards).
    pub weight_bytes: u64,
}

/// Which rows of a sequence need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// Every new token (verification, tests).
    All,
    /// Only the last new token (prefill, decode).
    Last,
    /// None (a non-final prefill chunk).
    None,
}

/// One sequence's part of a batched pass.
#[derive(Debug)]
pub struct SeqInput<'a> {
    pub state: &'a mut SeqState,
    pub tokens: &'a [u32],
    pub logits: LogitRows,
}

/// Named intermediate tensors recorded during a pass (rows concatenated), for golden tests.
#[derive(Debug, Default, Clone)]
pub struct Trace {
    pub tensors: BTreeMap<String, Vec<f32>>,
}

impl Trace {
    /// Append `data` under `name`.
    pub fn record(&mut self, name: impl Into<String>, data: &[f32]) {
        self.tensors.entry(name.into()).or_default().extend_from_slice(data);
    }
}

/// A loaded model.
pub trait Model: Send + Sync + Debug {
    /// Static facts.
    fn info(&self) -> &ModelInfo;
    /// A fresh per-sequence state.
    fn new_state(&self) -> SeqState;
    /// Run one pass over `batch`, appending every token to its sequence's state. Returns the
    /// requested logits rows (`vocab_size` each) in batch order.
    fn forward(&self, batch: &mut [SeqInput<'_>], trace: Option<&mut Trace>) -> Result<Vec<f32>>;
}

/// Load the model in `dir` (config, weights index, architecture).
pub fn load(dir: &Path) -> Result<Box<dyn Model>> {
    let spec = ModelSpec::load(dir)?;
    let index = WeightIndex::open(dir)?;
    load_with(&spec, &index)
}

/// Load the model in `dir` under a memory budget: weights are read (not mapped), a prefix of
/// layers stays resident, the rest streams, and routed experts go through the expert cache.
/// Results are bit-identical to [`load`].
pub fn load_budgeted(dir: &Path, options: &crate::cache::OocOptions) -> Result<(Box<dyn Model>, crate::cache::OocRuntime)> {
    let spec = ModelSpec::load(dir)?;
    let index = std::sync::Arc::new(WeightIndex::open(dir)?);
    match &spec.arch {
        ArchConfig::DeepseekV3(cfg) => {
            let (model, runtime) = deepseek_v3::DeepseekV3::load_budgeted(cfg.clone(), &spec, index, options)?;
            Ok((Box::new(model), runtime))
        }
        _ => Err(Error::Budget(format!(
            "{}: out-of-core loading is implemented for DeepSeek-V3 / Kimi-K2 checkpoints only so far",
            spec.model_type
        ))),
    }
}

/// Whether [`load_budgeted`] supports the model in `dir`.
pub fn supports_budget(dir: &Path) -> Result<bool> {
    Ok(matches!(ModelSpec::load(dir)?.arch, ArchConfig::DeepseekV3(_)))
}

/// Build the architecture for an already-parsed spec and index.
pub fn load_with(spec: &ModelSpec, index: &WeightIndex) -> Result<Box<dyn Model>> {
    let loader = Loader::new(index, spec);
    match &spec.arch {
        ArchConfig::DeepseekV3(cfg) => Ok(Box::new(deepseek_v3::DeepseekV3::load(cfg.clone(), &loader)?)),
        ArchConfig::KimiLinear(cfg) => Ok(Box::new(kimi_linear::KimiLinear::load(cfg.clone(), &loader)?)),
        ArchConfig::KimiK3(cfg) => Ok(Box::new(kimi_k3::KimiK3::load(cfg.clone(), &loader)?)),
    }
}

/// Stage a new pass over every sequence of a validated batch (commits each one's previous
/// pass; see `generate::state`).
pub(crate) fn begin_pass(batch: &mut [SeqInput<'_>]) {
    for b in batch.iter_mut() {
        b.state.begin_pass(b.tokens.len());
    }
}

/// The error for a state made by another model.
pub(crate) fn foreign_state() -> Error {
    Error::InvalidArgument { field: "state", reason: "the sequence state was not created by this model".into() }
}

/// Layer `l`'s MLA cache of every sequence (states were checked against the model).
pub(crate) fn mla_caches<'a>(batch: &'a mut [SeqInput<'_>], l: usize) -> Vec<&'a mut MlaCache> {
    batch.iter_mut().map(|b| b.state.layers[l].mla_mut().expect("state checked: MLA layer")).collect()
}

/// Layer `l`'s KDA state of every sequence (states were checked against the model).
pub(crate) fn kda_caches<'a>(batch: &'a mut [SeqInput<'_>], l: usize) -> Vec<&'a mut KdaCache> {
    batch.iter_mut().map(|b| b.state.layers[l].kda_mut().expect("state checked: KDA layer")).collect()
}

/// Per-row bookkeeping of a batched pass: which sequence each row belongs to and its position.
#[derive(Debug, Clone)]
pub(crate) struct RowPlan {
    pub seq: Vec<usize>,
    pub pos: Vec<usize>,
}

impl RowPlan {
    /// Validate tokens and context limits, and lay the batch out as rows.
    pub(crate) fn new(batch: &[SeqInput<'_>], vocab: usize, max_context: usize) -> Result<RowPlan> {
        let mut plan = RowPlan { seq: Vec::new(), pos: Vec::new() };
        for (s, input) in batch.iter().enumerate() {
            let start = input.state.len();
            if start + input.tokens.len() > max_context {
                return Err(Error::ContextOverflow { needed: start + input.tokens.len(), limit: max_context });
            }
            for (i, &t) in input.tokens.iter().enumerate() {
                if t as usize >= vocab {
                    return Err(Error::InvalidArgument {
                        field: "tokens",
                        reason: format!("token id {t} is outside the vocabulary (size {vocab})"),
                    });
                }
                plan.seq.push(s);
                plan.pos.push(start + i);
            }
        }
        Ok(plan)
    }

    pub(crate) fn len(&self) -> usize {
        self.seq.len()
    }

    /// Row indices whose logits were requested, in order.
    pub(crate) fn logit_rows(&self, batch: &[SeqInput<'_>]) -> Vec<usize> {
        let mut rows = Vec::new();
        let mut offset = 0;
        for input in batch {
            let n = input.tokens.len();
            match input.logits {
                LogitRows::All => rows.extend(offset..offset + n),
                LogitRows::Last if n > 0 => rows.push(offset + n - 1),
                _ => {}
            }
            offset += n;
        }
        rows
    }
}
