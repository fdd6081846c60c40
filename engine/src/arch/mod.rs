//! Architectures. Each architecture is one file; shared layers live in [`layers`]. [`load`] is
//! the only place that maps a config to an implementation.
//!
//! A forward pass runs a *batch*: one or more sequences, each contributing consecutive new
//! tokens. All rows go through the same weight reads (the multi-row kernels), while attention and
//! state stay per sequence. Every row's result is bit-identical to running it alone.

mod decoder;
pub mod deepseek_v3;
pub mod deepseek_v4;
mod device_pass;
mod glm4_moe;
pub mod glm_moe_dsa;
mod gpt_oss;
pub mod kimi_k3;
pub mod kimi_linear;
mod minimax_m2;
pub mod qwen3;
mod qwen3_moe;
mod qwen3_next;
mod registry;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::Path;

pub use crate::backend::residency::device_layers;
pub use crate::model::{Loader, layers};
pub use decoder::{Decoder, MtpModule};
pub use decoder::{DeviceModel, DeviceSession};
pub use device_pass::{
    DEVICE_CACHE_BYTES, DeviceSequence, current_device_sequence, device_cache_bytes, device_cache_positions,
    device_sequence, serve_on_current_device,
};
pub use registry::{ArchFamily, Architecture, FAMILIES, ModelSpec, families_markdown, supported_model_types};

use crate::error::{Error, Result};
use crate::state::{KdaCache, MlaCache, SeqState};
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
    /// Bytes of sequence state (attention caches, recurrent states), from the config.
    pub state: StateSize,
}

/// What one sequence's state costs, from the model's hyperparameters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateSize {
    /// Attention-cache bytes per position (every attention layer: the MLA latent and shared
    /// key, or per-head keys and values), in fp32.
    pub per_token: u64,
    /// Bytes that do not grow with the context (every recurrent layer's convolution history
    /// and delta-rule state); also the size of one recurrent-state checkpoint.
    pub per_sequence: u64,
}

impl StateSize {
    /// Bytes a sequence holding `tokens` positions allocates, with `checkpoints` recurrent-state
    /// checkpoints: attention caches in whole blocks ([`crate::state::paged`]), and the recurrent
    /// state twice (the live state and the pre-pass copy a pass keeps, see
    /// [`crate::state::KdaCache`]) besides the checkpoints.
    pub fn bytes(self, tokens: usize, checkpoints: usize) -> u64 {
        let positions = crate::state::paged::block_positions(tokens) as u64;
        self.per_token * positions + self.per_sequence * (2 + checkpoints as u64)
    }
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

/// Named intermediate tensors recorded during a pass (rows concatenated): every tensor for
/// golden tests, or only the named ones ([`Trace::capture`]) for draft heads that read the
/// target's hidden rows. Every architecture records `embed`, `layers.{l}` (the hidden state
/// after decoder layer `l`, all rows of the pass) and `norm` (the final-normed rows whose logits
/// were requested).
#[derive(Debug, Default, Clone)]
pub struct Trace {
    pub tensors: BTreeMap<String, Vec<f32>>,
    only: Option<Vec<String>>,
    /// Values per row of the tensors whose rows are wider than the hidden size (DeepSeek-V4's
    /// hyper-connection streams).
    widths: BTreeMap<String, usize>,
}

impl Trace {
    /// A trace that keeps only the tensors named in `names`.
    pub fn capture(names: &[String]) -> Self {
        Trace {
            tensors: BTreeMap::new(),
            only: Some(names.to_vec()),
            widths: BTreeMap::new(),
        }
    }

    /// Whether the trace keeps the tensor `name` (so a device pass copies it to the host).
    pub fn wants(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|n| n == name))
    }

    /// Append `data` under `name` (ignored when the trace keeps other tensors only).
    pub fn record(&mut self, name: impl Into<String>, data: &[f32]) {
        let name = name.into();
        if !self.wants(&name) {
            return;
        }
        self.tensors.entry(name).or_default().extend_from_slice(data);
    }

    /// [`Trace::record`] for rows of `width` values that differ from the hidden size.
    pub fn record_rows(&mut self, name: impl Into<String>, data: &[f32], width: usize) {
        let name = name.into();
        self.record(name.clone(), data);
        if self.tensors.contains_key(&name) {
            self.widths.insert(name, width);
        }
    }

    /// Rows `start..start + rows` (`width` values each, unless recorded with their own width)
    /// of every captured tensor, in `names` order; a tensor that was not recorded yields an
    /// empty row set.
    pub fn rows(&self, names: &[String], start: usize, rows: usize, width: usize) -> Vec<(String, Vec<f32>)> {
        names
            .iter()
            .map(|n| {
                let width = self.widths.get(n).copied().unwrap_or(width);
                let data = self.tensors.get(n).map(Vec::as_slice).unwrap_or(&[]);
                let lo = (start * width).min(data.len());
                let hi = ((start + rows) * width).min(data.len());
                (n.clone(), data[lo..hi].to_vec())
            })
            .collect()
    }
}

/// A loaded model.
pub trait Model: Send + Sync + Debug {
    /// Static facts.
    fn info(&self) -> &ModelInfo;
    /// The concrete model, for the paths only some architectures have (whole passes on a device:
    /// [`device_sequence`]).
    fn as_any(&self) -> &dyn std::any::Any;
    /// A fresh per-sequence state.
    fn new_state(&self) -> SeqState;
    /// Run one pass over `batch`, appending every token to its sequence's state. Returns the
    /// requested logits rows (`vocab_size` each) in batch order.
    fn forward(&self, batch: &mut [SeqInput<'_>], trace: Option<&mut Trace>) -> Result<Vec<f32>>;

    /// The input-embedding rows of `tokens` (`hidden_size` values each). Draft heads share the
    /// target's embedding instead of loading a copy.
    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let _ = tokens;
        Err(Error::InvalidArgument {
            field: "embed",
            reason: format!("{} does not expose its embedding", self.info().arch),
        })
    }

    /// Logits of `rows` already-normalised hidden rows through the output head (`lm_head`).
    fn head(&self, normed: &[f32], rows: usize) -> Result<Vec<f32>> {
        let _ = (normed, rows);
        Err(Error::InvalidArgument {
            field: "head",
            reason: format!("{} does not expose its output head", self.info().arch),
        })
    }
}

/// Embedding rows of `tokens` from an embedding matrix, checking the ids.
pub(crate) fn embed_tokens(embed: &crate::kernels::Matrix, tokens: &[u32]) -> Result<Vec<f32>> {
    let h = embed.cols;
    let mut out = vec![0.0f32; tokens.len() * h];
    for (row, &t) in out.chunks_mut(h).zip(tokens) {
        if t as usize >= embed.rows {
            return Err(Error::InvalidArgument {
                field: "tokens",
                reason: format!("token id {t} is outside the vocabulary (size {})", embed.rows),
            });
        }
        crate::kernels::reference::decode_row(embed, t as usize, row);
    }
    Ok(out)
}

/// `rows` normalised hidden rows through an output head, checking the width.
pub(crate) fn head_logits(lm_head: &crate::kernels::Matrix, normed: &[f32], rows: usize) -> Result<Vec<f32>> {
    if normed.len() != rows * lm_head.cols {
        return Err(Error::InvalidArgument {
            field: "head",
            reason: format!(
                "{} values for {rows} rows of width {}",
                normed.len(),
                lm_head.cols
            ),
        });
    }
    let mut logits = vec![0.0f32; rows * lm_head.rows];
    crate::backend::matmul(lm_head, normed, rows, &mut logits);
    Ok(logits)
}

/// Load the model in `dir` (config, weights index, architecture).
pub fn load(dir: &Path) -> Result<Box<dyn Model>> {
    load_spec(&ModelSpec::load(dir)?, dir)
}

/// Load the model in `dir` whose `config.json` the caller already parsed into `spec`.
pub fn load_spec(spec: &ModelSpec, dir: &Path) -> Result<Box<dyn Model>> {
    load_with(spec, &WeightIndex::open(dir)?)
}

/// What one sequence's state costs for the model `arch` describes (each architecture's own
/// function; the same figure its [`ModelInfo::state`] reports once loaded).
pub fn state_size(spec: &ModelSpec) -> StateSize {
    spec.arch.state_size()
}

/// Load the model in `dir` under a memory budget: weights are read (not mapped), a prefix of
/// layers stays resident, the rest streams, and routed experts go through the expert cache.
/// Results are bit-identical to [`load`]. With [`crate::cache::OocOptions::remote`] the shards
/// are read from the files it names and missing experts are made local on first use.
pub fn load_budgeted(
    dir: &Path,
    options: &crate::cache::OocOptions,
) -> Result<(Box<dyn Model>, crate::cache::OocRuntime)> {
    load_budgeted_spec(&ModelSpec::load(dir)?, dir, options)
}

/// [`load_budgeted`] for a `config.json` the caller already parsed into `spec`.
pub fn load_budgeted_spec(
    spec: &ModelSpec,
    dir: &Path,
    options: &crate::cache::OocOptions,
) -> Result<(Box<dyn Model>, crate::cache::OocRuntime)> {
    let index = std::sync::Arc::new(options.open_index(dir)?);
    spec.arch.load_budgeted(spec, index, options)
}

/// What planning a memory budget needs of a checkpoint, read from its tensor headers:
/// the always-resident bytes, each layer's spine bytes and the routed experts (as
/// [`load_budgeted`] would lay them out).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OocLayout {
    pub fixed_bytes: u64,
    /// Spine bytes of each layer, in layer order.
    pub layer_bytes: Vec<u64>,
    /// Bytes of the largest routed expert (one cache slot).
    pub slot_bytes: u64,
    /// Layers with routed experts, the experts of each and how many a token selects.
    pub moe_layers: usize,
    pub experts_per_layer: usize,
    pub top_k: usize,
}

impl OocLayout {
    /// Routed experts in the model.
    pub fn experts(&self) -> u64 {
        (self.moe_layers * self.experts_per_layer) as u64
    }
}

/// The layout of the model in `dir` (nothing but headers is read).
pub fn ooc_layout(dir: &Path) -> Result<OocLayout> {
    let spec = ModelSpec::load(dir)?;
    let index = WeightIndex::open(dir)?;
    spec.arch.ooc_layout(&spec, &index)
}

/// Seconds one forward of a routed expert of the model in `dir` takes at each of `rows` row
/// counts, with the kernel threads of this process and its weights memory-mapped and warm: over
/// the expert's bytes, the per-byte cost of its format's kernels here. Each count repeats until
/// `min_seconds` have passed (at least 3 times). The expert is loaded once.
pub fn time_expert(dir: &Path, rows: &[usize], min_seconds: f64) -> Result<Vec<f64>> {
    let spec = ModelSpec::load(dir)?;
    let index = WeightIndex::open(dir)?;
    let expert = spec.arch.routed_expert(&Loader::new(&index, &spec), 0, 0)?;
    let width = expert.down.rows;
    let class = crate::backend::WeightClass::Expert;
    let time = |rows: usize| {
        let x: Vec<f32> = (0..rows * width)
            .map(|i| ((i % 13) as f32 - 6.0) * 0.01)
            .collect();
        std::hint::black_box(expert.forward_as(&x, rows, class));
        let start = std::time::Instant::now();
        let mut n = 0u32;
        while n < 3 || start.elapsed().as_secs_f64() < min_seconds {
            std::hint::black_box(expert.forward_as(std::hint::black_box(&x), rows, class));
            n += 1;
        }
        start.elapsed().as_secs_f64() / f64::from(n)
    };
    Ok(rows.iter().map(|&r| time(r)).collect())
}

/// Whether [`load_budgeted`] supports the model in `dir`.
pub fn supports_budget(dir: &Path) -> Result<bool> {
    Ok(ModelSpec::load(dir)?.arch.supports_budget())
}

/// Build the architecture for an already-parsed spec and index.
pub fn load_with(spec: &ModelSpec, index: &WeightIndex) -> Result<Box<dyn Model>> {
    spec.arch.load(&Loader::new(index, spec))
}

/// Bytes of the multi-token-prediction module's tensors in `index` (every tensor under the
/// `model.layers.{L}.` that holds an `eh_proj`, else under `mtp.`; 0 without one): what a
/// budget reserves to load it beside an out-of-core target.
pub fn mtp_bytes(index: &WeightIndex) -> u64 {
    let layer = index.names().find_map(|n| {
        n.strip_prefix("model.layers.")?
            .strip_suffix(".eh_proj.weight")
            .filter(|l| l.parse::<usize>().is_ok())
            .map(str::to_string)
    });
    let prefix = match layer {
        Some(l) => format!("model.layers.{l}."),
        None => "mtp.".to_string(),
    };
    index
        .names()
        .filter(|n| n.starts_with(&prefix))
        .filter_map(|n| index.info(n).ok())
        .map(|i| i.len)
        .sum()
}

/// The multi-token-prediction module of the checkpoint in `dir`, if it publishes one this build
/// runs (DeepSeek-V3, GLM-4.5, GLM-5: `model.layers.{num_hidden_layers}.eh_proj` and the rest;
/// Qwen3-Next and Qwen3.5: `mtp.*`; DeepSeek-V4: `mtp.0.*`).
pub fn load_mtp(dir: &Path) -> Result<Option<MtpModule>> {
    let spec = ModelSpec::load(dir)?;
    spec.arch.load_mtp(&Loader::new(&WeightIndex::open(dir)?, &spec))
}

/// Stage a new pass over every sequence of a validated batch (commits each one's previous
/// pass; see `state`).
pub(crate) fn begin_pass(batch: &mut [SeqInput<'_>]) {
    for b in batch.iter_mut() {
        b.state.begin_pass(b.tokens.len());
    }
}

/// The error for a state made by another model.
pub(crate) fn foreign_state() -> Error {
    Error::InvalidArgument {
        field: "state",
        reason: "the sequence state was not created by this model".into(),
    }
}

/// Layer `l`'s MLA cache of every sequence (states were checked against the model).
pub(crate) fn mla_caches<'a>(batch: &'a mut [SeqInput<'_>], l: usize) -> Vec<&'a mut MlaCache> {
    batch
        .iter_mut()
        .map(|b| b.state.layers[l].mla_mut().expect("state checked: MLA layer"))
        .collect()
}

/// Layer `l`'s KDA state of every sequence (states were checked against the model).
pub(crate) fn kda_caches<'a>(batch: &'a mut [SeqInput<'_>], l: usize) -> Vec<&'a mut KdaCache> {
    batch
        .iter_mut()
        .map(|b| b.state.layers[l].kda_mut().expect("state checked: KDA layer"))
        .collect()
}

/// Layer `l`'s DeepSeek-V4 attention cache of every sequence (states were checked against the
/// model).
pub(crate) fn compressed_caches<'a>(
    batch: &'a mut [SeqInput<'_>],
    l: usize,
) -> Vec<&'a mut crate::state::CompressedCache> {
    batch
        .iter_mut()
        .map(|b| {
            b.state.layers[l]
                .compressed_mut()
                .expect("state checked: compressed layer")
        })
        .collect()
}

/// The tensors around the decoder layers that a plain decoder pass needs.
pub(crate) struct DecoderEnds<'a> {
    pub embed: &'a crate::kernels::Matrix,
    pub norm: &'a [f32],
    pub lm_head: &'a crate::kernels::Matrix,
    pub eps: f32,
    pub info: &'a ModelInfo,
}

/// One decoder pass shared by the architectures whose layers sit between an embedding and
/// `lm_head(RMSNorm(x))`: validate the batch and every state (`check`), stage the pass, embed
/// (traced as `embed`), run `layers` over the rows (rolling every state back when it fails, so
/// a failed read leaves no trace), then the final norm of the rows whose logits were asked for
/// (traced as `norm`) and the head.
pub(crate) fn decoder_pass(
    ends: DecoderEnds<'_>,
    batch: &mut [SeqInput<'_>],
    mut trace: Option<&mut Trace>,
    check: impl Fn(&SeqState) -> Result<()>,
    layers: impl FnOnce(&mut [SeqInput<'_>], &RowPlan, &mut [f32], Option<&mut Trace>) -> Result<()>,
) -> Result<Vec<f32>> {
    let (h, vocab) = (ends.info.hidden_size, ends.info.vocab_size);
    let plan = RowPlan::new(batch, vocab, ends.info.max_context)?;
    for b in batch.iter() {
        check(b.state)?;
    }
    begin_pass(batch);
    let logit_rows = plan.logit_rows(batch);
    let mut x = vec![0.0f32; plan.len() * h];
    let tokens = batch.iter().flat_map(|b| b.tokens.iter().copied());
    for (row, t) in x.chunks_mut(h).zip(tokens) {
        crate::kernels::reference::decode_row(ends.embed, t as usize, row);
    }
    if let Some(t) = trace.as_deref_mut() {
        t.record("embed", &x);
    }
    if let Err(e) = layers(batch, &plan, &mut x, trace.as_deref_mut()) {
        batch.iter_mut().for_each(|b| b.state.rollback());
        return Err(e);
    }
    let mut normed = vec![0.0f32; logit_rows.len() * h];
    for (&r, dst) in logit_rows.iter().zip(normed.chunks_mut(h)) {
        crate::kernels::ops::rms_norm(&x[r * h..(r + 1) * h], ends.norm, ends.eps, dst);
    }
    if let Some(t) = trace {
        t.record("norm", &normed);
    }
    let mut logits = vec![0.0f32; logit_rows.len() * vocab];
    crate::backend::matmul(ends.lm_head, &normed, logit_rows.len(), &mut logits);
    Ok(logits)
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
        let mut plan = RowPlan {
            seq: Vec::new(),
            pos: Vec::new(),
        };
        for (s, input) in batch.iter().enumerate() {
            let start = input.state.len();
            if start + input.tokens.len() > max_context {
                return Err(Error::ContextOverflow {
                    needed: start + input.tokens.len(),
                    limit: max_context,
                });
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
