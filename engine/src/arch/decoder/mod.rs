//! The one decoder every family runs (DeepSeek-V3/K2, Kimi-Linear, Kimi K3, Qwen3, Qwen3-MoE,
//! Qwen3-Next/Qwen3.5, GLM-4.5, gpt-oss, MiniMax-M2), from a [`DecoderPlan`] (`plan.rs`) each
//! architecture derives from its own config: per layer its sequence mixer ([`MixerKind`]: MLA,
//! KDA, gated DeltaNet, or grouped-query attention with its options — biases, q/k norm per head
//! or whole, partial rotary, sinks, sliding window, output gate) and whether its FFN is the
//! routed MoE; the router (softmax or sigmoid with correction bias, group limit,
//! renormalisation, scaling, logit bias), the experts' stored form, names and activation, the
//! latent projection and the shared expert (optionally gated); how norms are stored; the
//! residual form ([`Residual`]: plain, or K3's Block Attention Residuals in `attn_res.rs`).
//!
//! Plain layer `i`: `x += mixer(RMSNorm_in(x))`, `x += FFN(RMSNorm_post(x))`, the FFN a dense
//! gated MLP or the routed MoE plus shared experts. Logits: `lm_head(RMSNorm(x))`. Tensors
//! beyond `num_hidden_layers` (multi-token-prediction layers) and vision towers are not read.
//!
//! Layers are built by `load.rs` and live in a [`LayerStore`]: all in memory
//! ([`Decoder::load`]) or, under a memory budget ([`Decoder::load_budgeted`]), a resident prefix
//! plus streamed layers with the routed experts served by the out-of-core [`ExpertStore`]; both
//! build layers with the same code. Stacks of MLA and KDA layers also run whole passes on a
//! device (`device.rs`).

mod device;
mod hyper;
mod load;
mod mtp;
mod plan;
mod served;
mod stack;

use std::sync::Arc;

pub use device::DeviceSession;
use load::{expert, load_fixed, load_layer};
pub use mtp::MtpModule;
pub(crate) use plan::{
    DecoderPlan, DsaPlan, ExpertForm, GqaPlan, KdaPlan, MixerKind, MlaPlan, MoeNames, MoePlan, Residual,
    V4Plan,
};
pub use served::DeviceModel;

use super::ModelSpec;
use super::layers::attn_res::AttnRes;
use super::layers::compressed::{CompressedAttention, CompressedRows};
use super::layers::dsa::Selection;
use super::layers::gated_deltanet::GatedDeltaNet;
use super::layers::gqa::{Gqa, KvRows};
use super::layers::hyper::{HyperHead, HyperSite};
use super::layers::kda::{Kda, KdaRows};
use super::layers::mla::{Mla, MlaRows};
use super::layers::mlp::Mlp;
use super::layers::moe::Moe;
use super::layers::ops::Host;
use super::{
    Loader, Model, ModelInfo, RowPlan, SeqInput, StateSize, Trace, compressed_caches, foreign_state,
    kda_caches, mla_caches,
};
use crate::cache::store::{ExpertBuilder, LookaheadLayer};
use crate::cache::{ExpertStore, LayerStore, OocOptions, OocParts, OocRuntime, load_resident, source};
use crate::error::Result;
use crate::kernels::Matrix;
use crate::state::{CompressedCache, KdaCache, KvCache, LayerState, MlaCache, SeqState};
use crate::weights::WeightIndex;

// One per layer, built once at load: the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Mixer {
    Attention(Gqa),
    DeltaNet(GatedDeltaNet),
    Mla(Mla),
    Kda(Kda),
    Compressed(CompressedAttention),
}

/// A layer's residual sites ([`Residual`]): K3's AttnRes before the mixer and before the FFN,
/// or DeepSeek-V4's hyper-connections around them.
#[derive(Debug)]
pub(crate) enum Sites {
    AttnRes([AttnRes; 2]),
    Hyper([HyperSite; 2]),
}

impl Sites {
    pub(crate) fn attn_res(&self) -> Option<&[AttnRes; 2]> {
        match self {
            Sites::AttnRes(s) => Some(s),
            Sites::Hyper(_) => None,
        }
    }
}

/// The residual form's tail before the final norm: AttnRes's output site or the hyper head.
#[derive(Debug)]
pub(crate) enum Tail {
    AttnRes(AttnRes),
    Hyper(HyperHead),
}

impl Tail {
    pub(crate) fn attn_res(&self) -> Option<&AttnRes> {
        match self {
            Tail::AttnRes(s) => Some(s),
            Tail::Hyper(_) => None,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Layer {
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub mixer: Mixer,
    pub ffn: Ffn,
    /// The residual sites around the mixer and the FFN (not [`Residual::Plain`]).
    pub res: Option<Sites>,
}

/// The always-resident tensors: embeddings, head, final norm, and each MoE layer's FFN norm
/// and router for the look-ahead predictor.
struct Fixed {
    embed: Matrix,
    lm_head: Matrix,
    norm: Vec<f32>,
    lookahead: Vec<Option<LookaheadLayer>>,
    /// The residual form's tail before the final norm (not [`Residual::Plain`]).
    output_res: Option<Tail>,
}

/// A family that is a plan over this decoder (Qwen3, Qwen3-MoE, GLM-4.5, gpt-oss, MiniMax-M2):
/// its config says the plan, and the [`super::Architecture`] impl is this one.
pub(crate) trait DecoderFamily: std::fmt::Debug + Send + Sync {
    /// The decoder plan of this config.
    fn plan(&self) -> DecoderPlan;

    /// See [`super::Architecture::raw_completion_drafter`].
    fn raw_completion_drafter(&self) -> bool {
        false
    }

    /// See [`super::Architecture::supports_budget`] (every family with routed experts).
    fn supports_budget(&self) -> bool {
        true
    }
}

impl<F: DecoderFamily> super::Architecture for F {
    fn state_size(&self) -> StateSize {
        state_size(&self.plan())
    }

    fn load(&self, ld: &Loader<'_>) -> Result<Box<dyn Model>> {
        Ok(Box::new(Decoder::load(self.plan(), ld)?))
    }

    fn load_mtp(&self, ld: &Loader<'_>) -> Result<Option<MtpModule>> {
        MtpModule::load(&self.plan(), ld)
    }

    fn supports_budget(&self) -> bool {
        DecoderFamily::supports_budget(self)
    }

    fn raw_completion_drafter(&self) -> bool {
        DecoderFamily::raw_completion_drafter(self)
    }

    fn ooc_layout(&self, spec: &super::ModelSpec, index: &WeightIndex) -> Result<super::OocLayout> {
        if !DecoderFamily::supports_budget(self) {
            return Err(super::registry::not_budgeted(spec));
        }
        Decoder::ooc_layout(&self.plan(), spec, index)
    }

    fn routed_expert(&self, ld: &Loader<'_>, moe_layer: usize, e: usize) -> Result<Mlp> {
        let plan = self.plan();
        let l = (0..plan.num_layers)
            .filter(|&l| plan.is_moe(l))
            .nth(moe_layer)
            .ok_or_else(|| crate::error::Error::Budget(format!("no MoE layer {moe_layer} in this model")))?;
        expert(&plan, ld, l, e)
    }

    fn load_budgeted(
        &self,
        spec: &super::ModelSpec,
        index: Arc<WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Box<dyn Model>, OocRuntime)> {
        if !DecoderFamily::supports_budget(self) {
            return Err(super::registry::not_budgeted(spec));
        }
        let (model, runtime) = Decoder::load_budgeted(self.plan(), spec, index, options)?;
        Ok((Box::new(model), runtime))
    }
}

/// Sequence-state bytes: attention layers cache per-head keys and values in f32 (MLA: the
/// latent, the shared key and a DSA indexer's key), DeltaNet layers keep a convolution history
/// and a recurrent matrix per head.
pub(crate) fn state_size(plan: &DecoderPlan) -> StateSize {
    let (mut per_token, mut per_sequence) = (0, 0);
    for l in 0..plan.num_layers {
        match (plan.mixer(l), plan.recurrent_shape(l), &plan.mla) {
            (_, Some(s), _) => per_sequence += 4 * (s.conv_len() + s.state_len()),
            (MixerKind::Mla, _, Some(m)) => per_token += 4 * (m.dims.kv_lora + m.dims.rope + m.index_keys(l)),
            (MixerKind::Attention, ..) => {
                let d = plan.gqa.as_ref().map_or(0, |g| g.dims.kv_heads * g.dims.head_dim);
                per_token += 4 * 2 * d
            }
            (MixerKind::Compressed(kind), ..) => {
                let v = plan.v4.as_ref().expect("a compressed layer has the V4 plan");
                let (token, sequence) = hyper::cache_bytes(v, kind);
                per_token += token;
                per_sequence += sequence;
            }
            _ => {}
        }
    }
    StateSize {
        per_token: per_token as u64,
        per_sequence: per_sequence as u64,
    }
}

/// A loaded GQA MoE decoder.
#[derive(Debug)]
pub struct Decoder {
    pub(super) plan: DecoderPlan,
    info: ModelInfo,
    pub(super) embed: Matrix,
    pub(super) layers: Arc<LayerStore<Layer>>,
    pub(super) norm: Vec<f32>,
    /// The residual form's tail before the final norm (not [`Residual::Plain`]).
    pub(super) output_res: Option<Tail>,
    pub(super) lm_head: Matrix,
    /// Routed experts when they are not inside the layers (out-of-core mode).
    pub(super) experts: Option<Arc<ExpertStore>>,
}

impl Decoder {
    /// Load and shape-check every tensor (memory-mapped).
    pub(crate) fn load(plan: DecoderPlan, ld: &Loader<'_>) -> Result<Self> {
        let fixed = load_fixed(&plan, ld)?;
        let layers = (0..plan.num_layers)
            .map(|i| load_layer(&plan, ld, i))
            .collect::<Result<Vec<_>>>()?;
        let layers = Arc::new(LayerStore::resident(layers));
        Ok(Self::assemble(plan, ld.index, fixed, layers, None))
    }

    /// The layouts [`Decoder::load_budgeted`] plans with, from the headers alone.
    fn ooc_layout(plan: &DecoderPlan, spec: &ModelSpec, index: &WeightIndex) -> Result<super::OocLayout> {
        let fixed = source::record(index, spec, false, |ld| load_fixed(plan, ld))?;
        let layer_bytes = (0..plan.num_layers)
            .map(|i| Ok(source::record(index, spec, false, |ld| load_layer(plan, ld, i))?.total as u64))
            .collect::<Result<Vec<_>>>()?;
        let moe: Vec<usize> = (0..plan.num_layers).filter(|&l| plan.is_moe(l)).collect();
        let mut slot_bytes = 0;
        for &l in &moe {
            for e in 0..plan.moe.experts {
                let layout = source::record(index, spec, true, |ld| expert(plan, ld, l, e))?;
                slot_bytes = slot_bytes.max(layout.total as u64);
            }
        }
        Ok(super::OocLayout {
            fixed_bytes: fixed.total as u64,
            layer_bytes,
            slot_bytes,
            moe_layers: moe.len(),
            experts_per_layer: plan.moe.experts,
            top_k: plan.moe.router.top_k,
        })
    }

    /// Load under `options.budget`: the fixed tensors and a prefix of layers resident, the
    /// other layers streamed each pass, routed experts through the expert cache.
    pub(crate) fn load_budgeted(
        plan: DecoderPlan,
        spec: &ModelSpec,
        index: Arc<WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Self, OocRuntime)> {
        let reader = crate::cache::open_reader(&index, options)?;
        let (mut fixed, fixed_layout) = load_resident(&index, spec, &reader, |ld| load_fixed(&plan, ld))?;
        let layer_layouts = (0..plan.num_layers)
            .map(|i| source::record(&index, spec, false, |ld| load_layer(&plan, ld, i)))
            .collect::<Result<Vec<_>>>()?;
        let expert_plan = plan.clone();
        let expert_builder: ExpertBuilder = Arc::new(move |ld, l, e| expert(&expert_plan, ld, l, e));
        let expert_layouts = (0..plan.num_layers)
            .map(|l| match plan.is_moe(l) {
                false => Ok(Vec::new()),
                true => (0..plan.moe.experts)
                    .map(|e| source::record(&index, spec, true, |ld| expert_builder(ld, l, e)))
                    .collect::<Result<Vec<_>>>(),
            })
            .collect::<Result<Vec<_>>>()?;
        let layer_plan = plan.clone();
        let parts = OocParts {
            layer_builder: Arc::new(move |ld, i| load_layer(&layer_plan, ld, i)),
            layer_layouts,
            expert_builder,
            expert_layouts,
            lookahead: std::mem::take(&mut fixed.lookahead),
            fixed: fixed_layout,
        };
        let (layers, runtime) = crate::cache::assemble(index.clone(), spec, reader, parts, options)?;
        let experts = Some(runtime.experts.clone());
        Ok((Self::assemble(plan, &index, fixed, layers, experts), runtime))
    }

    fn assemble(
        plan: DecoderPlan,
        index: &WeightIndex,
        fixed: Fixed,
        layers: Arc<LayerStore<Layer>>,
        experts: Option<Arc<ExpertStore>>,
    ) -> Self {
        let info = ModelInfo {
            arch: plan.arch,
            vocab_size: plan.vocab_size,
            hidden_size: plan.hidden_size,
            num_layers: plan.num_layers,
            max_context: plan.max_context,
            bos_token_id: plan.bos_token_id,
            eos_token_ids: plan.eos_token_ids.clone(),
            weight_bytes: index
                .names()
                .filter_map(|n| index.info(n).ok())
                .map(|i| i.len)
                .sum(),
            state: state_size(&plan),
        };
        Decoder {
            info,
            embed: fixed.embed,
            layers,
            norm: fixed.norm,
            output_res: fixed.output_res,
            lm_head: fixed.lm_head,
            experts,
            plan,
        }
    }

    /// Every decoder layer over the rows of `x` (the written-once loops on the CPU), in place:
    /// with Block Attention Residuals the logit rows take the tail mix `z`, which the shared
    /// pass normalises and projects. On error the caller rolls the states back.
    fn run_layers(
        &self,
        batch: &mut [SeqInput<'_>],
        plan: &RowPlan,
        x: &mut [f32],
        trace: Option<&mut Trace>,
    ) -> Result<()> {
        let tokens = row_tokens(batch);
        let mut stack = HostStack::new(batch, plan, trace);
        let (run, z) = stack::whole(self, (&Host, &mut stack), x.to_vec(), (plan.len(), &tokens))?;
        settle(
            x,
            (&run, z.as_deref()),
            &plan.logit_rows(stack.batch),
            self.plan.hidden_size,
        );
        Ok(())
    }
}

/// The pass's final rows into `x`: every row's hidden state `run`, and the tail mix `z` (Block
/// Attention Residuals) in the rows given logits.
pub(super) fn settle(x: &mut [f32], (run, z): (&[f32], Option<&[f32]>), logit_rows: &[usize], h: usize) {
    x.copy_from_slice(run);
    if let Some(z) = z {
        for &r in logit_rows {
            x[r * h..(r + 1) * h].copy_from_slice(&z[r * h..(r + 1) * h]);
        }
    }
}

/// The CPU's [`stack::Stack`]: the layers' own norm weights and queries, the mixers over the
/// batch's sequence states.
pub(super) struct HostStack<'b, 's, 't> {
    batch: &'b mut [SeqInput<'s>],
    plan: &'b RowPlan,
    selection: Selection,
    trace: Option<&'t mut Trace>,
}

impl<'b, 's, 't> HostStack<'b, 's, 't> {
    pub(super) fn new(
        batch: &'b mut [SeqInput<'s>],
        plan: &'b RowPlan,
        trace: Option<&'t mut Trace>,
    ) -> Self {
        HostStack {
            batch,
            plan,
            selection: Selection::new(),
            trace,
        }
    }
}

impl stack::Stack<Host> for HostStack<'_, '_, '_> {
    fn norms<'a>(&'a self, _: usize, layer: &'a Layer) -> [&'a Vec<f32>; 2] {
        [&layer.input_norm, &layer.post_norm]
    }

    fn res_queries<'a>(&'a self, _: usize, layer: &'a Layer) -> Result<[&'a Vec<f32>; 2]> {
        match layer.res.as_ref().ok_or_else(missing_res)? {
            Sites::AttnRes([a, m]) => Ok([&a.query, &m.query]),
            Sites::Hyper([a, m]) => Ok([&a.proj, &m.proj]),
        }
    }

    fn output_query<'a>(&'a self, model: &'a Decoder) -> Result<&'a Vec<f32>> {
        match model.output_res.as_ref().ok_or_else(missing_res)? {
            Tail::AttnRes(out) => Ok(&out.query),
            Tail::Hyper(head) => Ok(&head.proj),
        }
    }

    fn mixer(&mut self, _: &Host, (l, layer): (usize, &Layer), xn: &Vec<f32>, _: usize) -> Result<Vec<f32>> {
        Ok(run_mixer(
            &layer.mixer,
            xn,
            self.batch,
            (self.plan, l),
            &mut self.selection,
        ))
    }

    fn record(&mut self, _: &Host, l: usize, x: &Vec<f32>, width: usize) -> Result<()> {
        if let Some(t) = self.trace.as_deref_mut() {
            t.record_rows(format!("layers.{l}"), x, width);
        }
        Ok(())
    }
}

/// Layer `l`'s mixer over the pass's normalised rows `xn`, advancing each row's state;
/// `selection` carries a DSA layer's choice of positions to the layers that share it.
pub(super) fn run_mixer(
    mixer: &Mixer,
    xn: &[f32],
    batch: &mut [SeqInput<'_>],
    (plan, l): (&RowPlan, usize),
    selection: &mut Selection,
) -> Vec<f32> {
    let n = plan.len();
    match mixer {
        Mixer::Attention(attn) => {
            let mut caches: Vec<&mut KvCache> = batch
                .iter_mut()
                .map(|b| b.state.layers[l].kv_mut().expect("state checked: KV layer"))
                .collect();
            let mut rows = KvRows {
                caches: &mut caches,
                seq: &plan.seq,
                pos: &plan.pos,
            };
            attn.forward(xn, n, &mut rows)
        }
        Mixer::DeltaNet(gdn) => {
            let mut caches = kda_caches(batch, l);
            let mut rows = KdaRows {
                caches: &mut caches,
                seq: &plan.seq,
                elsewhere: None,
            };
            gdn.forward(xn, n, &mut rows)
        }
        Mixer::Kda(kda) => {
            let mut caches = kda_caches(batch, l);
            let mut rows = KdaRows {
                caches: &mut caches,
                seq: &plan.seq,
                elsewhere: None,
            };
            kda.forward(xn, n, &mut rows)
        }
        Mixer::Compressed(attn) => {
            let mut caches = compressed_caches(batch, l);
            let mut rows = CompressedRows {
                caches: &mut caches,
                seq: &plan.seq,
                pos: &plan.pos,
            };
            attn.forward(xn, n, &mut rows)
        }
        Mixer::Mla(mla) => {
            let mut caches: Vec<&mut MlaCache> = mla_caches(batch, l);
            let mut rows = MlaRows {
                caches: &mut caches,
                seq: &plan.seq,
                pos: &plan.pos,
                selection,
            };
            mla.forward(xn, n, &mut rows)
        }
    }
}

/// The token of every row of the pass, in row order.
pub(super) fn row_tokens(batch: &[SeqInput<'_>]) -> Vec<u32> {
    batch.iter().flat_map(|b| b.tokens.iter().copied()).collect()
}

/// Each layer of the state is what the plan's layer keeps: a key/value cache for attention, a
/// recurrent state of the layer's shape for DeltaNet.
fn check_state(plan: &DecoderPlan, state: &SeqState) -> Result<()> {
    let ok = state.layers.len() == plan.num_layers
        && state
            .layers
            .iter()
            .enumerate()
            .all(|(l, s)| match (s, plan.mixer(l)) {
                (LayerState::Kv(_), MixerKind::Attention) | (LayerState::Mla(_), MixerKind::Mla) => true,
                (LayerState::Compressed(c), MixerKind::Compressed(k)) => c.ratio == k.ratio(),
                (LayerState::Kda(c), _) => plan.recurrent_shape(l) == Some(c.shape()),
                _ => false,
            });
    if ok { Ok(()) } else { Err(foreign_state()) }
}

/// A fresh state for the plan's layers.
fn new_state(plan: &DecoderPlan) -> SeqState {
    SeqState::new(
        (0..plan.num_layers)
            .map(|l| match (plan.mixer(l), plan.recurrent_shape(l)) {
                (_, Some(shape)) => LayerState::Kda(KdaCache::new(shape)),
                (MixerKind::Mla, _) => LayerState::Mla(MlaCache::default()),
                (MixerKind::Compressed(k), _) => {
                    let window = plan.v4.as_ref().map_or(0, |v| v.dims.window);
                    LayerState::Compressed(CompressedCache::new(k.ratio(), window))
                }
                _ => LayerState::Kv(KvCache::default()),
            })
            .collect(),
    )
}

impl Model for Decoder {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        super::embed_tokens(&self.embed, tokens)
    }

    fn head(&self, normed: &[f32], rows: usize) -> Result<Vec<f32>> {
        super::head_logits(&self.lm_head, normed, rows)
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> SeqState {
        new_state(&self.plan)
    }

    fn forward(&self, batch: &mut [SeqInput<'_>], trace: Option<&mut Trace>) -> Result<Vec<f32>> {
        self.pass(batch, trace, |batch, plan, x, trace| {
            self.run_layers(batch, plan, x, trace)
        })
    }
}

impl Decoder {
    /// One batched pass around `layers`: the batch checked and staged, the embeddings, then the
    /// final norm and the head on the rows that want logits (the CPU's pass and the server's
    /// device pass, `served.rs`).
    fn pass(
        &self,
        batch: &mut [SeqInput<'_>],
        trace: Option<&mut Trace>,
        layers: impl FnOnce(&mut [SeqInput<'_>], &RowPlan, &mut [f32], Option<&mut Trace>) -> Result<()>,
    ) -> Result<Vec<f32>> {
        let ends = super::DecoderEnds {
            embed: &self.embed,
            norm: &self.norm,
            lm_head: &self.lm_head,
            eps: self.plan.rms_norm_eps,
            info: &self.info,
        };
        super::decoder_pass(ends, batch, trace, |s| check_state(&self.plan, s), layers)
    }
}

/// A plan with Block Attention Residuals whose layers or tail were built without their sites
/// (cannot happen: the same plan builds both).
pub(super) fn missing_res() -> crate::error::Error {
    crate::error::Error::InvalidArgument {
        field: "residual",
        reason: "the model's layers have no Block Attention Residual sites".into(),
    }
}
