//! The one decoder every plain-residual family runs (DeepSeek-V3/K2, Qwen3, Qwen3-MoE,
//! Qwen3-Next/Qwen3.5, GLM-4.5, gpt-oss, MiniMax-M2), from a [`DecoderPlan`] each architecture
//! derives from its own config: per layer its sequence mixer ([`MixerKind`]: MLA, grouped-query
//! attention with its options — biases, q/k norm per head or whole, partial rotary, sinks, sliding
//! window, output gate — or gated DeltaNet) and whether its FFN is the routed MoE; the router
//! (softmax or sigmoid with correction bias, group limit, renormalisation, scaling), the
//! experts' stored form and the shared expert (optionally gated); how norms are stored.
//!
//! Layer `i`: `x += mixer(RMSNorm_in(x))`, `x += FFN(RMSNorm_post(x))`, the FFN a dense gated
//! MLP or the routed MoE (experts in ascending id order, as HF's `index_add_` over hit experts)
//! plus shared experts. Logits: `lm_head(RMSNorm(x))`. Tensor names follow the published
//! layouts: `model.layers.{i}.{self_attn,linear_attn}.*`, per-expert or fused experts under
//! `model.layers.{i}.mlp.experts`, `model.layers.{i}.mlp.gate.weight` (+
//! `e_score_correction_bias`), `model.layers.{i}.mlp.shared_experts.*`. Tensors beyond
//! `num_hidden_layers` (multi-token-prediction layers) are not read.
//!
//! Layers live in a [`LayerStore`]: all in memory ([`Decoder::load`]) or, under a memory budget
//! ([`Decoder::load_budgeted`]), a resident prefix plus streamed layers with the routed experts
//! served by the out-of-core [`ExpertStore`]; both build layers with the same code. A stack of
//! MLA layers also runs whole passes on a device (`decoder_device.rs`).

use std::sync::Arc;

use super::ModelSpec;
use super::layers::gated_deltanet::{GatedDeltaNet, GdnDims};
use super::layers::gqa::{Gqa, GqaDims, GqaOptions, KvRows};
use super::layers::kda::{Kda, KdaRows, L2Norm};
use super::layers::mla::{Mla, MlaDims, MlaRows};
use super::layers::mlp::{Activation, GateUp, Mlp, MlpBias};
use super::layers::moe::{Combine, Moe, RouterConfig};
use super::layers::rope::Rope;
use super::{
    Loader, Model, ModelInfo, RowPlan, SeqInput, StateSize, Trace, foreign_state, kda_caches, mla_caches,
};
use crate::cache::ExpertPass;
use crate::cache::store::{ExpertBuilder, LookaheadLayer};
use crate::cache::{ExpertStore, LayerStore, OocOptions, OocParts, OocRuntime, load_resident, source};
use crate::config::KdaConfig;
use crate::config::RopeConfig;
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kernels::ops::rms_norm;
use crate::model::NormWeight;
use crate::state::{KdaCache, KdaShape, KvCache, LayerState, MlaCache, SeqState};
use crate::weights::WeightIndex;

/// The routed part of a MoE layer.
#[derive(Debug, Clone)]
pub(crate) struct MoePlan {
    pub experts: usize,
    /// Each routed expert's width (`moe_intermediate_size`).
    pub width: usize,
    /// The shared experts' combined width (`0`: none).
    pub shared_width: usize,
    /// The shared experts' module below the block (`shared_experts`; Qwen3-Next and Qwen3.5:
    /// `shared_expert`).
    pub shared_module: &'static str,
    /// The shared experts' output is scaled by `σ({block}.shared_expert_gate · x)`.
    pub shared_gate: bool,
    pub router: RouterConfig,
    /// The router has an `e_score_correction_bias`.
    pub correction_bias: bool,
    /// The router Linear has a bias, added to its logits (gpt-oss `router.bias`).
    pub router_bias: bool,
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
    /// SwiGLU experts in either of HF's layouts, whichever the checkpoint holds: one Linear per
    /// expert projection (`{block}.experts.{e}.{gate,up,down}`, any stored format), or the
    /// fused tensors some Qwen releases publish, `{block}.experts.gate_up_proj` `[E, 2I, H]`
    /// (each expert's gate rows, then its up rows) and `{block}.experts.down_proj` `[E, H, I]`
    /// (BF16 or F32).
    Hf(MoeNames),
    /// Experts stacked over the expert axis in MXFP4 (gpt-oss):
    /// `{block}.experts.{gate_up}_{blocks,scales}` with gate and up rows interleaved, and
    /// `{block}.experts.{down}_{blocks,scales}`, each with its `…_bias`; `act` on gate and up.
    StackedMxfp4 {
        names: MoeNames,
        gate_up: &'static str,
        down: &'static str,
        act: Activation,
    },
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
    /// How every RMSNorm weight of the decoder is stored (layers, final norm, q/k norms).
    pub norm_weight: NormWeight,
    /// Per layer: its sequence mixer (empty: attention on every layer).
    pub mixers: Vec<MixerKind>,
    /// The gated-DeltaNet layers' shape (required when `mixers` names any).
    pub linear: Option<GdnDims>,
    /// The MLA layers' shape (required when `mixers` names any).
    pub mla: Option<MlaPlan>,
    /// The KDA layers' shape (required when `mixers` names any).
    pub kda: Option<KdaPlan>,
    /// Per layer: whether its FFN is the routed MoE.
    pub moe_layers: Vec<bool>,
    pub moe: MoePlan,
}

/// A layer's sequence mixer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MixerKind {
    /// Grouped-query softmax attention (`self_attn`).
    Attention,
    /// Gated DeltaNet linear attention (`linear_attn`).
    DeltaNet,
    /// Multi-head latent attention (`self_attn`, DeepSeek-V3, Kimi).
    Mla,
    /// Kimi Delta Attention (`self_attn`, Kimi-Linear).
    Kda,
}

/// The KDA layers' shape and choices.
#[derive(Debug, Clone)]
pub(crate) struct KdaPlan {
    pub config: KdaConfig,
    pub l2: L2Norm,
}

impl KdaPlan {
    fn shape(&self) -> KdaShape {
        KdaShape {
            heads: self.config.num_heads,
            head_dim: self.config.head_dim,
            kernel: self.config.short_conv_kernel_size,
        }
    }
}

/// The MLA layers' shape.
#[derive(Debug, Clone)]
pub(crate) struct MlaPlan {
    /// `q_lora_rank` (`None`: a full-rank `q_proj`).
    pub q_lora_rank: Option<usize>,
    pub dims: MlaDims,
    /// RoPE on the shared key part (`false`: NoPE, Kimi).
    pub rotary: bool,
    /// RoPE pairs interleaved (`rope_interleave`) rather than `rotate_half`.
    pub interleave: bool,
}

impl MoePlan {
    /// Where the block's tensors are.
    fn names(&self) -> MoeNames {
        match self.form {
            ExpertForm::Hf(n) | ExpertForm::StackedMxfp4 { names: n, .. } => n,
        }
    }

    /// The MoE block's module below `model.layers.{i}`.
    fn block(&self) -> &'static str {
        self.names().block
    }

    /// The plan of a model without routed experts (every layer dense).
    pub(crate) fn none() -> MoePlan {
        MoePlan {
            experts: 0,
            width: 0,
            shared_width: 0,
            shared_module: "shared_experts",
            shared_gate: false,
            router_bias: false,
            router: RouterConfig {
                scoring: Default::default(),
                top_k: 0,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: false,
                scaling: 1.0,
            },
            correction_bias: false,
            form: ExpertForm::Hf(MoeNames::HF),
        }
    }
}

impl DecoderPlan {
    fn is_moe(&self, l: usize) -> bool {
        self.moe_layers[l]
    }

    fn mixer(&self, l: usize) -> MixerKind {
        self.mixers.get(l).copied().unwrap_or(MixerKind::Attention)
    }

    /// Layer `l`'s recurrent state shape, when it has one (DeltaNet, KDA).
    fn recurrent_shape(&self, l: usize) -> Option<KdaShape> {
        match (self.mixer(l), &self.linear, &self.kda) {
            (MixerKind::DeltaNet, Some(d), _) => Some(d.shape()),
            (MixerKind::Kda, _, Some(k)) => Some(k.shape()),
            _ => None,
        }
    }

    fn norm(&self, ld: &Loader<'_>, name: &str) -> Result<Vec<f32>> {
        ld.norm(name, self.hidden_size, self.norm_weight)
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
}

#[derive(Debug)]
pub(crate) struct Layer {
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub mixer: Mixer,
    pub ffn: Ffn,
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

    fn supports_budget(&self) -> bool {
        DecoderFamily::supports_budget(self)
    }

    fn raw_completion_drafter(&self) -> bool {
        DecoderFamily::raw_completion_drafter(self)
    }

    fn load_budgeted(
        &self,
        spec: &super::ModelSpec,
        index: Arc<WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Box<dyn Model>, OocRuntime)> {
        if !DecoderFamily::supports_budget(self) {
            return Err(crate::error::Error::Budget(format!(
                "{}: out-of-core loading is not implemented for this architecture (it loads in memory)",
                spec.model_type
            )));
        }
        let (model, runtime) = Decoder::load_budgeted(self.plan(), spec, index, options)?;
        Ok((Box::new(model), runtime))
    }
}

/// Sequence-state bytes: attention layers cache per-head keys and values in f32, DeltaNet
/// layers keep a convolution history and a recurrent matrix per head.
pub(crate) fn state_size(plan: &DecoderPlan) -> StateSize {
    let (mut per_token, mut per_sequence) = (0, 0);
    for l in 0..plan.num_layers {
        match (plan.mixer(l), plan.recurrent_shape(l), &plan.mla) {
            (_, Some(s), _) => per_sequence += 4 * (s.conv_len() + s.state_len()),
            (MixerKind::Mla, _, Some(m)) => per_token += 4 * (m.dims.kv_lora + m.dims.rope),
            _ => per_token += 4 * 2 * plan.attn.kv_heads * plan.attn.head_dim,
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
    pub(super) lm_head: Matrix,
    /// Routed experts when they are not inside the layers (out-of-core mode).
    pub(super) experts: Option<Arc<ExpertStore>>,
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
        ExpertForm::Hf(names) => {
            let p = format!("model.layers.{l}.{}.experts", names.block);
            if !ld.has(&format!("{p}.gate_up_proj")) {
                let [gate, up, down] = names.expert.map(|n| format!("{p}.{e}.{n}"));
                return Ok(Mlp::split(
                    ld.linear(&gate, m.width, h)?,
                    ld.linear(&up, m.width, h)?,
                    ld.linear(&down, h, m.width)?,
                    Activation::Silu,
                ));
            }
            let (n, w) = (m.experts, m.width);
            let gate_up = |rows| ld.stacked_dense(&format!("{p}.gate_up_proj"), (n, e), (2 * w, h), rows);
            Ok(Mlp::split(
                gate_up(0..w)?,
                gate_up(w..2 * w)?,
                ld.stacked_dense(&format!("{p}.down_proj"), (n, e), (h, w), 0..h)?,
                Activation::Silu,
            ))
        }
        ExpertForm::StackedMxfp4 {
            names,
            gate_up,
            down,
            act,
        } => {
            let p = format!("model.layers.{l}.{}.experts", names.block);
            let (n, w) = (m.experts, m.width);
            let (gate_up, down) = (format!("{p}.{gate_up}"), format!("{p}.{down}"));
            Ok(Mlp {
                gate_up: GateUp::Interleaved(ld.stacked_mxfp4(&gate_up, n, e, 2 * w, h)?),
                down: ld.stacked_mxfp4(&down, n, e, h, w)?,
                act,
                bias: Some(MlpBias {
                    gate_up: ld.stacked_vector(&format!("{gate_up}_bias"), n, e, 2 * w)?,
                    down: ld.stacked_vector(&format!("{down}_bias"), n, e, h)?,
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
    let MoeNames {
        block,
        router,
        correction_bias: correction,
        ..
    } = m.names();
    let p = format!("model.layers.{i}.{block}");
    Ok(Moe {
        gate: ld.dense(&format!("{p}.{router}.weight"), m.experts, plan.hidden_size)?,
        bias: match m.correction_bias {
            true => ld.vector(&format!("{p}.{correction}"), m.experts)?,
            false => Vec::new(),
        },
        logit_bias: match m.router_bias {
            true => ld.vector(&format!("{p}.{router}.bias"), m.experts)?,
            false => Vec::new(),
        },
        router: m.router.clone(),
        experts,
        shared_gate: match (&shared, m.shared_gate) {
            (Some(_), true) => {
                Some(ld.dense(&format!("{p}.shared_expert_gate.weight"), 1, plan.hidden_size)?)
            }
            _ => None,
        },
        shared,
        latent: None,
        combine: Combine::Ascending,
    })
}

fn load_layer(plan: &DecoderPlan, ld: &Loader<'_>, i: usize) -> Result<Layer> {
    let h = plan.hidden_size;
    let p = format!("model.layers.{i}");
    let mixer = match (plan.mixer(i), &plan.linear, &plan.mla) {
        (MixerKind::DeltaNet, Some(dims), _) => Mixer::DeltaNet(GatedDeltaNet::load(
            ld,
            &format!("{p}.linear_attn"),
            h,
            *dims,
            plan.rms_norm_eps,
        )?),
        (MixerKind::Kda, ..) if plan.kda.is_some() => {
            let k = plan.kda.as_ref().expect("checked");
            let a = format!("{p}.self_attn");
            Mixer::Kda(Kda::load(ld, &a, h, &k.config, k.l2, plan.rms_norm_eps)?)
        }
        (MixerKind::Mla, _, Some(m)) => {
            let rotary = m.rotary.then(|| Rope::new(&plan.rope, m.dims.rope, m.interleave));
            let a = format!("{p}.self_attn");
            Mixer::Mla(Mla::load(ld, &a, h, m.q_lora_rank, m.dims.clone(), rotary, None)?)
        }
        _ => Mixer::Attention(Gqa::load(
            ld,
            &format!("{p}.self_attn"),
            h,
            plan.attn,
            &plan.rope,
            plan.attn_options(i),
        )?),
    };
    let ffn = if plan.is_moe(i) {
        let m = &plan.moe;
        let n = if ld.routed_experts() { m.experts } else { 0 };
        let experts = (0..n)
            .map(|e| expert(plan, ld, i, e))
            .collect::<Result<Vec<_>>>()?;
        let shared = match m.shared_width {
            0 => None,
            w => Some(mlp(ld, &format!("{p}.{}.{}", m.block(), m.shared_module), h, w)?),
        };
        Ffn::Moe(router(plan, ld, i, experts, shared)?)
    } else {
        Ffn::Dense(mlp(ld, &format!("{p}.mlp"), h, plan.dense_width)?)
    };
    Ok(Layer {
        input_norm: plan.norm(ld, &format!("{p}.input_layernorm.weight"))?,
        post_norm: plan.norm(ld, &format!("{p}.post_attention_layernorm.weight"))?,
        mixer,
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
                norm: plan.norm(ld, &format!("model.layers.{i}.post_attention_layernorm.weight"))?,
                eps: plan.rms_norm_eps,
                router: router(plan, ld, i, Vec::new(), None)?,
            })),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Fixed {
        embed,
        lm_head,
        norm: plan.norm(ld, "model.norm.weight")?,
        lookahead,
    })
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
            let a = match &layer.mixer {
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
                    attn.forward(&xn, n, &mut rows)
                }
                Mixer::DeltaNet(gdn) => {
                    let mut caches = kda_caches(batch, l);
                    let mut rows = KdaRows {
                        caches: &mut caches,
                        seq: &plan.seq,
                    };
                    gdn.forward(&xn, n, &mut rows)
                }
                Mixer::Kda(kda) => {
                    let mut caches = kda_caches(batch, l);
                    let mut rows = KdaRows {
                        caches: &mut caches,
                        seq: &plan.seq,
                    };
                    kda.forward(&xn, n, &mut rows)
                }
                Mixer::Mla(mla) => {
                    let mut caches: Vec<&mut MlaCache> = mla_caches(batch, l);
                    let mut rows = MlaRows {
                        caches: &mut caches,
                        seq: &plan.seq,
                        pos: &plan.pos,
                    };
                    mla.forward(&xn, n, &mut rows)
                }
            };
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
        let ends = super::DecoderEnds {
            embed: &self.embed,
            norm: &self.norm,
            lm_head: &self.lm_head,
            eps: self.plan.rms_norm_eps,
            info: &self.info,
        };
        super::decoder_pass(
            ends,
            batch,
            trace,
            |s| check_state(&self.plan, s),
            |batch, plan, x, trace| self.run_layers(batch, plan, x, trace),
        )
    }
}
