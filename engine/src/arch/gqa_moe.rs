//! The grouped-query-attention decoder that Qwen3-MoE, GLM-4.5 and dense Qwen3 share, run from
//! a [`DecoderPlan`] each architecture derives from its own config (`qwen3_moe.rs`,
//! `glm4_moe.rs`, `qwen3.rs`): which layers are MoE, the attention's options (biases, q/k norm, partial
//! rotary), the router (softmax or sigmoid with correction bias, group limit, renormalisation,
//! scaling) and the shared expert.
//!
//! Layer `i`: `x += o_proj(attn(RMSNorm_in(x)))`, `x += FFN(RMSNorm_post(x))`, the FFN a dense
//! gated MLP or the routed MoE (experts in ascending id order, as HF's `index_add_` over hit
//! experts) plus shared experts. Logits: `lm_head(RMSNorm(x))`. Tensor names follow the
//! published per-expert layout: `model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj`,
//! `model.layers.{i}.mlp.gate.weight` (+ `e_score_correction_bias`),
//! `model.layers.{i}.mlp.shared_experts.*`. Tensors beyond `num_hidden_layers` (GLM's
//! multi-token-prediction layer) are not read.
//!
//! Layers live in a [`LayerStore`]: all in memory ([`GqaMoe::load`]) or, under a memory budget
//! ([`GqaMoe::load_budgeted`]), a resident prefix plus streamed layers with the routed experts
//! served by the out-of-core [`ExpertStore`]; both build layers with the same code.

use std::sync::Arc;

use super::ModelSpec;
use super::layers::gqa::{Gqa, GqaDims, GqaOptions, KvRows};
use super::layers::mlp::{Activation, GateUp, Mlp, MlpBias};
use super::layers::moe::{Combine, Moe, RouterConfig};
use super::{Loader, Model, ModelInfo, RowPlan, SeqInput, StateSize, Trace, foreign_state};
use crate::cache::ExpertPass;
use crate::cache::store::{ExpertBuilder, LookaheadLayer};
use crate::cache::{ExpertStore, LayerStore, OocOptions, OocParts, OocRuntime, load_resident, source};
use crate::config::RopeConfig;
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kernels::ops::rms_norm;
use crate::state::{KvCache, LayerState, SeqState};
use crate::weights::WeightIndex;

/// The routed part of a MoE layer.
#[derive(Debug, Clone)]
pub(crate) struct MoePlan {
    pub experts: usize,
    /// Each routed expert's width (`moe_intermediate_size`).
    pub width: usize,
    /// The shared experts' combined width (`0`: none).
    pub shared_width: usize,
    pub router: RouterConfig,
    /// The router has an `e_score_correction_bias`.
    pub correction_bias: bool,
    /// How the experts and router are stored and what the experts compute.
    pub form: ExpertForm,
}

/// Where a MoE layer's tensors are, below `model.layers.{i}.`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MoeNames {
    /// The block (`mlp`; Mixtral-style checkpoints: `block_sparse_moe`).
    pub block: &'static str,
    /// Each expert's gate, up and down Linear below `{block}.experts.{e}`.
    pub expert: [&'static str; 3],
    /// The router Linear below the block.
    pub router: &'static str,
    /// The selection-only correction bias below the block.
    pub correction_bias: &'static str,
}

impl MoeNames {
    /// The HF layout: `mlp.experts.{e}.{gate,up,down}_proj`, router `mlp.gate` with its
    /// `e_score_correction_bias`.
    pub(crate) const HF: MoeNames = MoeNames {
        block: "mlp",
        expert: ["gate_proj", "up_proj", "down_proj"],
        router: "gate",
        correction_bias: "gate.e_score_correction_bias",
    };
}

/// How a MoE layer's experts and router are stored, and the experts' activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ExpertForm {
    /// One Linear per expert projection in any stored format, SwiGLU.
    PerExpert(MoeNames),
    /// gpt-oss: experts stacked in `mlp.experts.{gate_up,down}_proj_{blocks,scales}` (MXFP4)
    /// with `…_bias`, gate/up rows interleaved, clamped SwiGLU; router `mlp.router` with a
    /// bias on its logits.
    GptOss { alpha: f32, limit: f32 },
}

/// Everything the decoder needs, derived from an architecture's config.
#[derive(Debug, Clone)]
pub(crate) struct DecoderPlan {
    /// Architecture name reported in [`ModelInfo::arch`].
    pub arch: &'static str,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Dense FFN width (`intermediate_size`).
    pub dense_width: usize,
    pub num_layers: usize,
    pub max_context: usize,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub attn: GqaDims,
    pub attn_options: GqaOptions,
    pub rope: RopeConfig,
    /// Per layer: its sliding window (empty: every layer attends to every earlier position).
    pub windows: Vec<Option<usize>>,
    /// Per layer: whether its FFN is the routed MoE.
    pub moe_layers: Vec<bool>,
    pub moe: MoePlan,
}

impl MoePlan {
    /// The plan of a model without routed experts (every layer dense).
    pub(crate) fn none() -> MoePlan {
        MoePlan {
            experts: 0,
            width: 0,
            shared_width: 0,
            router: RouterConfig {
                scoring: Default::default(),
                top_k: 0,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: false,
                scaling: 1.0,
            },
            correction_bias: false,
            form: ExpertForm::PerExpert(MoeNames::HF),
        }
    }
}

impl DecoderPlan {
    fn is_moe(&self, l: usize) -> bool {
        self.moe_layers[l]
    }

    /// Layer `l`'s attention options.
    fn attn_options(&self, l: usize) -> GqaOptions {
        GqaOptions {
            window: self.windows.get(l).copied().flatten(),
            ..self.attn_options
        }
    }
}

// One per layer, built once at load: the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

#[derive(Debug)]
struct Layer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    attn: Gqa,
    ffn: Ffn,
}

/// The always-resident tensors: embeddings, head, final norm, and each MoE layer's FFN norm
/// and router for the look-ahead predictor.
struct Fixed {
    embed: Matrix,
    lm_head: Matrix,
    norm: Vec<f32>,
    lookahead: Vec<Option<LookaheadLayer>>,
}

/// A family that is a plan over this decoder (Qwen3, Qwen3-MoE, GLM-4.5, gpt-oss, MiniMax-M2):
/// its config says the plan, and the [`super::Architecture`] impl is this one.
pub(crate) trait GqaFamily: std::fmt::Debug + Send + Sync {
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

impl<F: GqaFamily> super::Architecture for F {
    fn state_size(&self) -> StateSize {
        state_size(&self.plan())
    }

    fn load(&self, ld: &Loader<'_>) -> Result<Box<dyn Model>> {
        Ok(Box::new(GqaMoe::load(self.plan(), ld)?))
    }

    fn supports_budget(&self) -> bool {
        GqaFamily::supports_budget(self)
    }

    fn raw_completion_drafter(&self) -> bool {
        GqaFamily::raw_completion_drafter(self)
    }

    fn load_budgeted(
        &self,
        spec: &super::ModelSpec,
        index: Arc<WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Box<dyn Model>, OocRuntime)> {
        if !GqaFamily::supports_budget(self) {
            return Err(crate::error::Error::Budget(format!(
                "{}: out-of-core loading is not implemented for this architecture (it loads in memory)",
                spec.model_type
            )));
        }
        let (model, runtime) = GqaMoe::load_budgeted(self.plan(), spec, index, options)?;
        Ok((Box::new(model), runtime))
    }
}

/// Sequence-state bytes: every layer caches per-head keys and values in f32.
pub(crate) fn state_size(plan: &DecoderPlan) -> StateSize {
    StateSize {
        per_token: (plan.num_layers * 4 * 2 * plan.attn.kv_heads * plan.attn.head_dim) as u64,
        per_sequence: 0,
    }
}

/// A loaded GQA MoE decoder.
#[derive(Debug)]
pub struct GqaMoe {
    plan: DecoderPlan,
    info: ModelInfo,
    embed: Matrix,
    layers: Arc<LayerStore<Layer>>,
    norm: Vec<f32>,
    lm_head: Matrix,
    /// Routed experts when they are not inside the layers (out-of-core mode).
    experts: Option<Arc<ExpertStore>>,
}

fn mlp(ld: &Loader<'_>, prefix: &str, hidden: usize, width: usize) -> Result<Mlp> {
    Ok(Mlp::split(
        ld.linear(&format!("{prefix}.gate_proj"), width, hidden)?,
        ld.linear(&format!("{prefix}.up_proj"), width, hidden)?,
        ld.linear(&format!("{prefix}.down_proj"), hidden, width)?,
        Activation::Silu,
    ))
}

fn load_head(plan: &DecoderPlan, ld: &Loader<'_>, embed: &Matrix) -> Result<Matrix> {
    if plan.tie_word_embeddings && !ld.has("lm_head.weight") {
        Ok(embed.clone())
    } else {
        ld.dense("lm_head.weight", plan.vocab_size, plan.hidden_size)
    }
}

/// Routed expert `e` of layer `l`.
fn expert(plan: &DecoderPlan, ld: &Loader<'_>, l: usize, e: usize) -> Result<Mlp> {
    let (h, m) = (plan.hidden_size, &plan.moe);
    match m.form {
        ExpertForm::PerExpert(names) => {
            let p = format!("model.layers.{l}.{}.experts.{e}", names.block);
            let [gate, up, down] = names.expert.map(|n| format!("{p}.{n}"));
            Ok(Mlp::split(
                ld.linear(&gate, m.width, h)?,
                ld.linear(&up, m.width, h)?,
                ld.linear(&down, h, m.width)?,
                Activation::Silu,
            ))
        }
        ExpertForm::GptOss { alpha, limit } => {
            let p = format!("model.layers.{l}.mlp.experts");
            let (n, w) = (m.experts, m.width);
            Ok(Mlp {
                gate_up: GateUp::Interleaved(ld.stacked_mxfp4(
                    &format!("{p}.gate_up_proj"),
                    n,
                    e,
                    2 * w,
                    h,
                )?),
                down: ld.stacked_mxfp4(&format!("{p}.down_proj"), n, e, h, w)?,
                act: Activation::ClampedSwiglu { alpha, limit },
                bias: Some(MlpBias {
                    gate_up: ld.stacked_vector(&format!("{p}.gate_up_proj_bias"), n, e, 2 * w)?,
                    down: ld.stacked_vector(&format!("{p}.down_proj_bias"), n, e, h)?,
                }),
            })
        }
    }
}

/// Layer `i`'s router (its experts and shared experts as given).
fn router(
    plan: &DecoderPlan,
    ld: &Loader<'_>,
    i: usize,
    experts: Vec<Mlp>,
    shared: Option<Mlp>,
) -> Result<Moe> {
    let m = &plan.moe;
    let (block, router, correction, gpt_oss) = match m.form {
        ExpertForm::PerExpert(n) => (n.block, n.router, n.correction_bias, false),
        ExpertForm::GptOss { .. } => ("mlp", "router", "", true),
    };
    let p = format!("model.layers.{i}.{block}");
    Ok(Moe {
        gate: ld.dense(&format!("{p}.{router}.weight"), m.experts, plan.hidden_size)?,
        bias: match m.correction_bias {
            true => ld.vector(&format!("{p}.{correction}"), m.experts)?,
            false => Vec::new(),
        },
        logit_bias: match gpt_oss {
            true => ld.vector(&format!("{p}.{router}.bias"), m.experts)?,
            false => Vec::new(),
        },
        router: m.router.clone(),
        experts,
        shared,
        latent: None,
        combine: Combine::Ascending,
    })
}

fn load_layer(plan: &DecoderPlan, ld: &Loader<'_>, i: usize) -> Result<Layer> {
    let h = plan.hidden_size;
    let p = format!("model.layers.{i}");
    let attn = Gqa::load(
        ld,
        &format!("{p}.self_attn"),
        h,
        plan.attn,
        &plan.rope,
        plan.attn_options(i),
    )?;
    let ffn = if plan.is_moe(i) {
        let m = &plan.moe;
        let n = if ld.routed_experts() { m.experts } else { 0 };
        let experts = (0..n)
            .map(|e| expert(plan, ld, i, e))
            .collect::<Result<Vec<_>>>()?;
        let shared = match m.shared_width {
            0 => None,
            w => Some(mlp(ld, &format!("{p}.mlp.shared_experts"), h, w)?),
        };
        Ffn::Moe(router(plan, ld, i, experts, shared)?)
    } else {
        Ffn::Dense(mlp(ld, &format!("{p}.mlp"), h, plan.dense_width)?)
    };
    Ok(Layer {
        input_norm: ld.vector(&format!("{p}.input_layernorm.weight"), h)?,
        post_norm: ld.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
        attn,
        ffn,
    })
}

fn load_fixed(plan: &DecoderPlan, ld: &Loader<'_>) -> Result<Fixed> {
    let h = plan.hidden_size;
    let embed = ld.dense("model.embed_tokens.weight", plan.vocab_size, h)?;
    let lm_head = load_head(plan, ld, &embed)?;
    let lookahead = (0..plan.num_layers)
        .map(|i| match plan.is_moe(i) {
            false => Ok(None),
            true => Ok(Some(LookaheadLayer {
                norm: ld.vector(&format!("model.layers.{i}.post_attention_layernorm.weight"), h)?,
                eps: plan.rms_norm_eps,
                router: router(plan, ld, i, Vec::new(), None)?,
            })),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Fixed {
        embed,
        lm_head,
        norm: ld.vector("model.norm.weight", h)?,
        lookahead,
    })
}

impl GqaMoe {
    /// Load and shape-check every tensor (memory-mapped).
    pub(crate) fn load(plan: DecoderPlan, ld: &Loader<'_>) -> Result<Self> {
        let fixed = load_fixed(&plan, ld)?;
        let layers = (0..plan.num_layers)
            .map(|i| load_layer(&plan, ld, i))
            .collect::<Result<Vec<_>>>()?;
        let layers = Arc::new(LayerStore::resident(layers));
        Ok(Self::assemble(plan, ld.index, fixed, layers, None))
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
        let (mut fixed, fixed_bytes) = load_resident(&index, spec, &reader, |ld| load_fixed(&plan, ld))?;
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
            fixed_bytes,
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
        GqaMoe {
            info,
            embed: fixed.embed,
            layers,
            norm: fixed.norm,
            lm_head: fixed.lm_head,
            experts,
            plan,
        }
    }

    fn norm_rows(&self, x: &[f32], weight: &[f32]) -> Vec<f32> {
        let h = self.plan.hidden_size;
        let mut out = vec![0.0; x.len()];
        for (src, dst) in x.chunks(h).zip(out.chunks_mut(h)) {
            rms_norm(src, weight, self.plan.rms_norm_eps, dst);
        }
        out
    }

    /// Every decoder layer over the rows of `x`; on error the caller rolls the caches back.
    fn run_layers(
        &self,
        batch: &mut [SeqInput<'_>],
        plan: &RowPlan,
        x: &mut [f32],
        mut trace: Option<&mut Trace>,
    ) -> Result<()> {
        let n = plan.len();
        let pass = ExpertPass::open(self.experts.as_deref());
        for l in 0..self.layers.len() {
            let layer = self.layers.get(l)?;
            let xn = self.norm_rows(x, &layer.input_norm);
            let mut caches: Vec<&mut KvCache> = batch
                .iter_mut()
                .map(|b| b.state.layers[l].kv_mut().expect("state checked: KV layer"))
                .collect();
            let mut rows = KvRows {
                caches: &mut caches,
                seq: &plan.seq,
                pos: &plan.pos,
            };
            let a = layer.attn.forward(&xn, n, &mut rows);
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let xn = self.norm_rows(x, &layer.post_norm);
            pass.hint_next(l, x, n);
            let f = match (&layer.ffn, pass.layer(l)) {
                (Ffn::Dense(m), _) => m.forward(&xn, n),
                (Ffn::Moe(m), None) => m.forward(&xn, n),
                (Ffn::Moe(m), Some(experts)) => m.forward_with(&xn, n, &experts)?,
            };
            x.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
            if let Some(t) = trace.as_deref_mut() {
                t.record(format!("layers.{l}"), x);
            }
        }
        pass.finish()
    }
}

/// Every layer of the state is a key/value cache.
fn check_state(state: &SeqState, layers: usize) -> Result<()> {
    let ok = state.layers.len() == layers && state.layers.iter().all(|l| matches!(l, LayerState::Kv(_)));
    if ok { Ok(()) } else { Err(foreign_state()) }
}

impl Model for GqaMoe {
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
        SeqState::new(
            (0..self.layers.len())
                .map(|_| LayerState::Kv(KvCache::default()))
                .collect(),
        )
    }

    fn forward(&self, batch: &mut [SeqInput<'_>], trace: Option<&mut Trace>) -> Result<Vec<f32>> {
        let ends = super::DecoderEnds {
            embed: &self.embed,
            norm: &self.norm,
            lm_head: &self.lm_head,
            eps: self.plan.rms_norm_eps,
            info: &self.info,
        };
        let layers = self.layers.len();
        super::decoder_pass(
            ends,
            batch,
            trace,
            |s| check_state(s, layers),
            |batch, plan, x, trace| self.run_layers(batch, plan, x, trace),
        )
    }
}
