//! Kimi-Linear: KDA and NoPE-MLA layers as listed in `linear_attn_config`, a dense first
//! FFN, then sigmoid-routed MoE with shared experts; untied head. Reference: HF transformers
//! `models/kimi_linear/modeling_kimi_linear.py` (float32 path) and `model-formats.md` §3.
//!
//! Layer `i`: `x += Attn_i(RMSNorm_in(x)); x += FFN_i(RMSNorm_post(x))`; logits
//! `lm_head(RMSNorm(x))`. Tensor names are the released checkpoint's (pre-HF-conversion):
//! `self_attn.{q,k,v}_conv1d`, `self_attn.{f_a_proj,f_b_proj,dt_bias,A_log}`,
//! `block_sparse_moe.{gate,experts.{e}.w1/w2/w3,shared_experts}`.
//!
//! The loaders for KDA, MLA and the MoE are shared with Kimi K3 ([`super::kimi_k3`]), which
//! passes its own variant choices ([`Variant`]).
//!
//! Layers live in a [`LayerStore`]: all in memory ([`KimiLinear::load`]) or, under a memory
//! budget ([`KimiLinear::load_budgeted`], [`super::kimi_ooc`]), a resident prefix plus streamed
//! layers, with routed experts served by the out-of-core [`ExpertStore`].

use std::sync::Arc;

use super::ModelSpec;
use super::layers::device::{self, DeviceKda, DeviceKdaState, DeviceMla, DeviceMlaCache};
use super::layers::kda::{Kda, KdaRows, L2Norm};
use super::layers::mla::{Mla, MlaDims, MlaRows};
use super::layers::mlp::{Activation, Mlp};
use super::layers::moe::{Combine, ExpertProvider, Latent, Moe, RouterConfig, Scoring};
use super::{
    Loader, Model, ModelInfo, RowPlan, SeqInput, StateSize, Trace, begin_pass, kda_caches, mla_caches,
};
use crate::backend::device::DeviceOps;
use crate::backend::{WeightClass, matmul};
use crate::cache::ExpertPass;
use crate::cache::layers::LayerBuilder;
use crate::cache::{ExpertStore, LayerStore, OocOptions, OocRuntime};
use crate::config::{AttnKind, KimiLinearConfig};
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kernels::ops::rms_norm;
use crate::kernels::reference::decode_row;
use crate::state::{KdaCache, KdaShape, LayerState, MlaCache, SeqState};
use crate::weights::WeightIndex;

/// HF `KimiLinearRMSNorm`'s default epsilon, which `KimiLinearAttention` uses for
/// `q_a_layernorm` and `kv_a_layernorm` (it does not pass `rms_norm_eps`).
const HF_MLA_NORM_EPS: f32 = 1e-6;

/// Architecture choices that differ between Kimi-Linear and K3.
#[derive(Debug, Clone)]
pub(crate) struct Variant {
    /// FFN activation (dense, shared and routed experts).
    pub act: Activation,
    /// q/k normalisation in KDA.
    pub l2: L2Norm,
    /// Epsilon of the MLA `q_a_layernorm` / `kv_a_layernorm`.
    pub mla_norm_eps: f32,
    /// Sigmoid output gate on MLA.
    pub mla_gate: bool,
    /// Latent MoE width and whether the expert sum is normalised.
    pub latent: Option<(usize, bool)>,
    pub combine: Combine,
}

/// The attention of one layer.
#[derive(Debug)]
pub(crate) enum Attn {
    Kda(Box<Kda>),
    Mla(Box<Mla>),
}

/// The FFN of one layer.
#[derive(Debug)]
pub(crate) enum Ffn {
    Dense(Box<Mlp>),
    Moe(Box<Moe>),
}

impl Ffn {
    /// The FFN over `n` rows of `x` (already normalised). Routed experts come from `experts`
    /// when given (out-of-core), else from the layer itself.
    pub(crate) fn forward_with(
        &self,
        x: &[f32],
        n: usize,
        experts: Option<&dyn ExpertProvider>,
    ) -> Result<Vec<f32>> {
        match (self, experts) {
            (Ffn::Dense(m), _) => Ok(m.forward(x, n)),
            (Ffn::Moe(m), None) => Ok(m.forward(x, n)),
            (Ffn::Moe(m), Some(p)) => m.forward_with(x, n, p),
        }
    }
}

#[derive(Debug)]
struct Layer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    attn: Attn,
    ffn: Ffn,
}

/// A loaded Kimi-Linear model.
#[derive(Debug)]
pub struct KimiLinear {
    cfg: KimiLinearConfig,
    info: ModelInfo,
    embed: Matrix,
    layers: Arc<LayerStore<Layer>>,
    norm: Vec<f32>,
    lm_head: Matrix,
    /// Routed experts when they are not inside the layers (out-of-core mode).
    experts: Option<Arc<ExpertStore>>,
}

/// A gated MLP `{prefix}.{gate,up,down}` (names given) from `input` to `width` and back.
pub(crate) fn load_mlp(
    ld: &Loader<'_>,
    p: &str,
    names: [&str; 3],
    input: usize,
    width: usize,
    act: Activation,
) -> Result<Mlp> {
    Ok(Mlp::split(
        ld.linear(&format!("{p}.{}", names[0]), width, input)?,
        ld.linear(&format!("{p}.{}", names[1]), width, input)?,
        ld.linear(&format!("{p}.{}", names[2]), input, width)?,
        act,
    ))
}

/// A KDA layer `{p}.self_attn`.
pub(crate) fn load_kda(cfg: &KimiLinearConfig, ld: &Loader<'_>, p: &str, v: &Variant) -> Result<Kda> {
    let a = format!("{p}.self_attn");
    Kda::load(ld, &a, cfg.hidden_size, &cfg.kda, v.l2, cfg.rms_norm_eps)
}

/// The MLA shape of a config (NoPE: no rotary part is rotated).
pub(crate) fn mla_dims(cfg: &KimiLinearConfig, v: &Variant) -> MlaDims {
    MlaDims {
        heads: cfg.num_attention_heads,
        nope: cfg.qk_nope_head_dim,
        rope: cfg.qk_rope_head_dim,
        v: cfg.v_head_dim,
        kv_lora: cfg.kv_lora_rank,
        eps: v.mla_norm_eps,
        scale: (cfg.qk_head_dim() as f64).powf(-0.5) as f32,
    }
}

/// A NoPE MLA layer `{p}.self_attn` (optionally with the output gate).
pub(crate) fn load_mla(cfg: &KimiLinearConfig, ld: &Loader<'_>, p: &str, v: &Variant) -> Result<Mla> {
    let (h, a) = (cfg.hidden_size, format!("{p}.self_attn"));
    let out_gate = match v.mla_gate {
        true => Some(ld.linear(&format!("{a}.g_proj"), cfg.num_attention_heads * cfg.v_head_dim, h)?),
        false => None,
    };
    Mla::load(ld, &a, h, cfg.q_lora_rank, mla_dims(cfg, v), None, out_gate)
}

/// The FFN of layer `i` (`mlp.*` dense, or `block_sparse_moe.*`).
pub(crate) fn load_ffn(cfg: &KimiLinearConfig, ld: &Loader<'_>, i: usize, v: &Variant) -> Result<Ffn> {
    let (h, p) = (cfg.hidden_size, format!("model.layers.{i}"));
    let proj = ["gate_proj", "up_proj", "down_proj"];
    if !cfg.moe_layers[i] {
        return Ok(Ffn::Dense(Box::new(load_mlp(
            ld,
            &format!("{p}.mlp"),
            proj,
            h,
            cfg.intermediate_size,
            v.act,
        )?)));
    }
    let m = format!("{p}.block_sparse_moe");
    let e = if ld.routed_experts() { cfg.num_experts } else { 0 };
    let experts = (0..e)
        .map(|x| load_expert(cfg, ld, i, x, v))
        .collect::<Result<Vec<_>>>()?;
    let shared = match cfg.num_shared_experts {
        0 => None,
        s => Some(load_mlp(
            ld,
            &format!("{m}.shared_experts"),
            proj,
            h,
            cfg.moe_intermediate_size * s,
            v.act,
        )?),
    };
    let latent = match v.latent {
        None => None,
        Some((width, use_norm)) => Some(Latent {
            down: ld.linear(&format!("{m}.routed_expert_down_proj"), width, h)?,
            norm: if use_norm {
                Some(ld.vector(&format!("{m}.routed_expert_norm.weight"), width)?)
            } else {
                None
            },
            eps: cfg.rms_norm_eps,
            up: ld.linear(&format!("{m}.routed_expert_up_proj"), h, width)?,
        }),
    };
    let mut moe = load_router(cfg, ld, i, v)?;
    moe.experts = experts;
    moe.shared = shared;
    moe.latent = latent;
    Ok(Ffn::Moe(Box::new(moe)))
}

/// Routed expert `e` of layer `l` (`block_sparse_moe.experts.{e}.w1/w3/w2`; K3: MXFP4 at the
/// latent width).
pub(crate) fn load_expert(
    cfg: &KimiLinearConfig,
    ld: &Loader<'_>,
    l: usize,
    e: usize,
    v: &Variant,
) -> Result<Mlp> {
    let input = v.latent.map_or(cfg.hidden_size, |(width, _)| width);
    let p = format!("model.layers.{l}.block_sparse_moe.experts.{e}");
    load_mlp(
        ld,
        &p,
        ["w1", "w3", "w2"],
        input,
        cfg.moe_intermediate_size,
        v.act,
    )
}

/// Layer `l`'s router (`block_sparse_moe.gate`) as a MoE without experts, shared experts or
/// latent projection.
pub(crate) fn load_router(cfg: &KimiLinearConfig, ld: &Loader<'_>, l: usize, v: &Variant) -> Result<Moe> {
    let (e, m) = (cfg.num_experts, format!("model.layers.{l}.block_sparse_moe"));
    Ok(Moe {
        gate: ld.dense(&format!("{m}.gate.weight"), e, cfg.hidden_size)?,
        bias: ld.vector(&format!("{m}.gate.e_score_correction_bias"), e)?,
        logit_bias: Vec::new(),
        router: RouterConfig {
            scoring: Scoring::Sigmoid,
            top_k: cfg.num_experts_per_token,
            n_group: cfg.num_expert_group,
            topk_group: cfg.topk_group,
            norm_topk_prob: cfg.moe_renormalize,
            scaling: cfg.routed_scaling_factor,
        },
        experts: Vec::new(),
        shared: None,
        shared_gate: None,
        latent: None,
        combine: v.combine,
    })
}

/// Attention of layer `i` by the config's schedule.
pub(crate) fn load_attn(cfg: &KimiLinearConfig, ld: &Loader<'_>, i: usize, v: &Variant) -> Result<Attn> {
    let p = format!("model.layers.{i}");
    Ok(match cfg.layer_kinds[i] {
        AttnKind::Kda => Attn::Kda(Box::new(load_kda(cfg, ld, &p, v)?)),
        AttnKind::Mla => Attn::Mla(Box::new(load_mla(cfg, ld, &p, v)?)),
    })
}

/// The KDA state shape of a config.
fn kda_shape(cfg: &KimiLinearConfig) -> KdaShape {
    let k = &cfg.kda;
    KdaShape {
        heads: k.num_heads,
        head_dim: k.head_dim,
        kernel: k.short_conv_kernel_size,
    }
}

/// Fresh per-layer states for a schedule.
pub(crate) fn new_layer_states(cfg: &KimiLinearConfig) -> SeqState {
    let shape = kda_shape(cfg);
    SeqState::new(
        cfg.layer_kinds
            .iter()
            .map(|kind| match kind {
                AttnKind::Kda => LayerState::Kda(KdaCache::new(shape)),
                AttnKind::Mla => LayerState::Mla(MlaCache::default()),
            })
            .collect(),
    )
}

/// Whether `state` has this schedule's layer kinds and KDA shapes.
pub(crate) fn check_state(cfg: &KimiLinearConfig, state: &SeqState) -> Result<()> {
    let shape = kda_shape(cfg);
    let ok = state.layers.len() == cfg.layer_kinds.len()
        && state
            .layers
            .iter()
            .zip(&cfg.layer_kinds)
            .all(|(s, kind)| match (s, kind) {
                (LayerState::Kda(c), AttnKind::Kda) => c.shape() == shape,
                (LayerState::Mla(_), AttnKind::Mla) => true,
                _ => false,
            });
    if ok { Ok(()) } else { Err(super::foreign_state()) }
}

/// Run layer `l`'s attention over the pass's rows.
pub(crate) fn run_attn(
    attn: &Attn,
    xn: &[f32],
    plan: &RowPlan,
    batch: &mut [SeqInput<'_>],
    l: usize,
) -> Vec<f32> {
    let n = plan.len();
    match attn {
        Attn::Kda(k) => {
            let mut caches = kda_caches(batch, l);
            k.forward(
                xn,
                n,
                &mut KdaRows {
                    caches: &mut caches,
                    seq: &plan.seq,
                },
            )
        }
        Attn::Mla(m) => {
            let mut caches = mla_caches(batch, l);
            m.forward(
                xn,
                n,
                &mut MlaRows {
                    caches: &mut caches,
                    seq: &plan.seq,
                    pos: &plan.pos,
                },
            )
        }
    }
}

/// RMSNorm of every `h`-wide row.
pub(crate) fn norm_rows(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let h = weight.len();
    let mut out = vec![0.0; x.len()];
    for (src, dst) in x.chunks(h).zip(out.chunks_mut(h)) {
        rms_norm(src, weight, eps, dst);
    }
    out
}

/// Embedding rows of the batch's tokens.
pub(crate) fn embed_rows(embed: &Matrix, batch: &[SeqInput<'_>], n: usize) -> Vec<f32> {
    let h = embed.cols;
    let mut x = vec![0.0f32; n * h];
    let tokens = batch.iter().flat_map(|b| b.tokens.iter().copied());
    for (row, t) in x.chunks_mut(h).zip(tokens) {
        decode_row(embed, t as usize, row);
    }
    x
}

/// `lm_head` over the selected rows (already normalised).
pub(crate) fn head(lm_head: &Matrix, normed: &[f32], rows: usize) -> Vec<f32> {
    let mut logits = vec![0.0f32; rows * lm_head.rows];
    matmul(lm_head, normed, rows, &mut logits);
    logits
}

/// Model facts shared by the Kimi architectures.
pub(crate) fn model_info(arch: &'static str, cfg: &KimiLinearConfig, ld: &Loader<'_>) -> ModelInfo {
    ModelInfo {
        arch,
        vocab_size: cfg.vocab_size,
        hidden_size: cfg.hidden_size,
        num_layers: cfg.num_hidden_layers,
        max_context: cfg.max_position_embeddings,
        bos_token_id: cfg.bos_token_id,
        eos_token_ids: cfg.eos_token_ids.clone(),
        weight_bytes: ld
            .index
            .names()
            .filter_map(|n| ld.index.info(n).ok())
            .map(|i| i.len)
            .sum(),
        state: state_size(cfg),
    }
}

/// Sequence-state bytes: MLA layers cache the latent and shared key of every position; KDA
/// layers hold a convolution history and a delta-rule matrix whatever the context.
pub(crate) fn state_size(cfg: &KimiLinearConfig) -> StateSize {
    let count = |kind: AttnKind| cfg.layer_kinds.iter().filter(|&&k| k == kind).count();
    let kda = kda_shape(cfg);
    StateSize {
        per_token: (count(AttnKind::Mla) * 4 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)) as u64,
        per_sequence: (count(AttnKind::Kda) * 4 * (kda.conv_len() + kda.state_len())) as u64,
    }
}

/// Embedding and (possibly tied) head.
pub(crate) fn load_embed_head(cfg: &KimiLinearConfig, ld: &Loader<'_>) -> Result<(Matrix, Matrix)> {
    let embed = ld.dense("model.embed_tokens.weight", cfg.vocab_size, cfg.hidden_size)?;
    let lm_head = if cfg.tie_word_embeddings && !ld.has("lm_head.weight") {
        embed.clone()
    } else {
        ld.dense("lm_head.weight", cfg.vocab_size, cfg.hidden_size)?
    };
    Ok((embed, lm_head))
}

/// Kimi-Linear's choices of the shared Kimi layers.
fn variant() -> Variant {
    Variant {
        act: Activation::Silu,
        l2: L2Norm::EpsInside(1e-6),
        mla_norm_eps: HF_MLA_NORM_EPS,
        mla_gate: false,
        latent: None,
        combine: Combine::Ascending,
    }
}

/// The always-resident tensors besides the look-ahead routers.
struct Fixed {
    embed: Matrix,
    lm_head: Matrix,
    norm: Vec<f32>,
}

impl super::Architecture for KimiLinearConfig {
    fn state_size(&self) -> StateSize {
        state_size(self)
    }

    fn load(&self, ld: &Loader<'_>) -> Result<Box<dyn Model>> {
        Ok(Box::new(KimiLinear::load(self.clone(), ld)?))
    }

    fn supports_budget(&self) -> bool {
        true
    }

    fn load_budgeted(
        &self,
        spec: &ModelSpec,
        index: Arc<WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Box<dyn Model>, OocRuntime)> {
        let (model, runtime) = KimiLinear::load_budgeted(self.clone(), spec, index, options)?;
        Ok((Box::new(model), runtime))
    }
}

impl KimiLinear {
    /// Load and shape-check every tensor.
    pub fn load(cfg: KimiLinearConfig, ld: &Loader<'_>) -> Result<Self> {
        let v = variant();
        let (embed, lm_head) = load_embed_head(&cfg, ld)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| load_layer(&cfg, ld, i, &v))
            .collect::<Result<Vec<_>>>()?;
        let norm = ld.vector("model.norm.weight", cfg.hidden_size)?;
        let info = model_info("kimi_linear", &cfg, ld);
        let layers = Arc::new(LayerStore::resident(layers));
        Ok(KimiLinear {
            norm,
            embed,
            layers,
            lm_head,
            info,
            cfg,
            experts: None,
        })
    }

    /// Load under `options.budget` (see [`super::kimi_ooc`]): embeddings, head, final norm and
    /// the look-ahead routers resident, a prefix of layers resident and the rest streamed each
    /// pass, routed experts through the expert cache. Bit-identical to [`Self::load`].
    pub fn load_budgeted(
        cfg: KimiLinearConfig,
        spec: &ModelSpec,
        index: Arc<WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Self, OocRuntime)> {
        let v = variant();
        let fixed = |ld: &Loader<'_>| {
            let (embed, lm_head) = load_embed_head(&cfg, ld)?;
            Ok(Fixed {
                embed,
                lm_head,
                norm: ld.vector("model.norm.weight", cfg.hidden_size)?,
            })
        };
        let (c, lv) = (cfg.clone(), v.clone());
        let layer: LayerBuilder<Layer> = Arc::new(move |ld, i| load_layer(&c, ld, i, &lv));
        let b = super::kimi_ooc::load(&cfg, &v, spec, index.clone(), options, fixed, layer)?;
        let info = model_info("kimi_linear", &cfg, &Loader::new(&index, spec));
        let experts = Some(b.runtime.experts.clone());
        let Fixed { embed, lm_head, norm } = b.fixed;
        Ok((
            KimiLinear {
                norm,
                embed,
                layers: b.layers,
                lm_head,
                info,
                cfg,
                experts,
            },
            b.runtime,
        ))
    }

    /// Every decoder layer over the rows of `x`; on error the caller rolls the states back.
    fn run_layers(
        &self,
        batch: &mut [SeqInput<'_>],
        plan: &RowPlan,
        x: &mut [f32],
        mut trace: Option<&mut Trace>,
    ) -> Result<()> {
        let (n, eps) = (plan.len(), self.cfg.rms_norm_eps);
        let pass = ExpertPass::open(self.experts.as_deref());
        for l in 0..self.layers.len() {
            let layer = self.layers.get(l)?;
            let xn = norm_rows(x, &layer.input_norm, eps);
            let a = run_attn(&layer.attn, &xn, plan, batch, l);
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let xn = norm_rows(x, &layer.post_norm, eps);
            pass.hint_next(l, x, n); // predicts layer l + 1's routes from this residual
            let experts = pass.layer(l);
            let f = layer
                .ffn
                .forward_with(&xn, n, experts.as_ref().map(|e| e as &dyn ExpertProvider))?;
            x.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
            if let Some(t) = trace.as_deref_mut() {
                t.record(format!("layers.{l}"), x);
            }
        }
        pass.finish()
    }
}

/// Decoder layer `i` (without routed experts when the loader says so).
fn load_layer(cfg: &KimiLinearConfig, ld: &Loader<'_>, i: usize, v: &Variant) -> Result<Layer> {
    let (h, p) = (cfg.hidden_size, format!("model.layers.{i}"));
    Ok(Layer {
        input_norm: ld.vector(&format!("{p}.input_layernorm.weight"), h)?,
        post_norm: ld.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
        attn: load_attn(cfg, ld, i, v)?,
        ffn: load_ffn(cfg, ld, i, v)?,
    })
}

impl Model for KimiLinear {
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
        new_layer_states(&self.cfg)
    }

    fn forward(&self, batch: &mut [SeqInput<'_>], mut trace: Option<&mut Trace>) -> Result<Vec<f32>> {
        let (h, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps);
        let plan = RowPlan::new(batch, self.cfg.vocab_size, self.info.max_context)?;
        for b in batch.iter_mut() {
            check_state(&self.cfg, b.state)?;
        }
        begin_pass(batch);
        let n = plan.len();
        let logit_rows = plan.logit_rows(batch);
        let mut x = embed_rows(&self.embed, batch, n);
        if let Some(t) = trace.as_deref_mut() {
            t.record("embed", &x);
        }
        if let Err(e) = self.run_layers(batch, &plan, &mut x, trace.as_deref_mut()) {
            batch.iter_mut().for_each(|b| b.state.rollback()); // a failed read leaves no trace
            return Err(e);
        }
        let selected: Vec<f32> = logit_rows
            .iter()
            .flat_map(|&r| x[r * h..(r + 1) * h].iter().copied())
            .collect();
        let normed = norm_rows(&selected, &self.norm, eps);
        if let Some(t) = trace {
            t.record("norm", &normed);
        }
        Ok(head(&self.lm_head, &normed, logit_rows.len()))
    }
}

/// One attention layer's device-resident constants and its sequence state (shared with K3).
pub(crate) enum DeviceAttn<B> {
    Kda(DeviceKda<B>, DeviceKdaState<B>),
    Mla(DeviceMla<B>, DeviceMlaCache<B>),
}

impl<B> DeviceAttn<B> {
    /// Upload `attn`'s constants and make a fresh state of up to `capacity` positions.
    pub(crate) fn new<D: DeviceOps<Buf = B>>(dev: &D, attn: &Attn, capacity: usize) -> Result<Self> {
        Ok(match attn {
            Attn::Kda(k) => DeviceAttn::Kda(DeviceKda::new(dev, k)?, DeviceKdaState::new(dev, k)?),
            Attn::Mla(m) => {
                let d = &m.dims;
                let cache = DeviceMlaCache {
                    latent: dev.zeros_f32(capacity * d.kv_lora)?,
                    rope: dev.zeros_f32(capacity * d.rope)?,
                    len: 0,
                    capacity,
                };
                DeviceAttn::Mla(DeviceMla::new(dev, m)?, cache)
            }
        })
    }

    /// `attn` over `n` normalised rows, advancing the state.
    pub(crate) fn run<D: DeviceOps<Buf = B>>(&mut self, dev: &D, attn: &Attn, x: &B, n: usize) -> Result<B> {
        match (attn, self) {
            (Attn::Kda(kda), DeviceAttn::Kda(c, st)) => device::kda(dev, (kda, c), x, n, st),
            (Attn::Mla(mla), DeviceAttn::Mla(c, cache)) => device::mla(dev, (mla, c), x, n, cache),
            _ => unreachable!("the session mirrors the layers"),
        }
    }
}

impl Ffn {
    /// The selection bias of a routed FFN on the device (`None`: dense, or no bias).
    pub(crate) fn device_bias<D: DeviceOps>(&self, dev: &D) -> Result<Option<D::Buf>> {
        match self {
            Ffn::Moe(m) if !m.bias.is_empty() => dev.upload_f32(&m.bias).map(Some),
            _ => Ok(None),
        }
    }

    /// The FFN over `n` normalised rows on the device.
    pub(crate) fn run_on<D: DeviceOps>(
        &self,
        dev: &D,
        experts: Option<&dyn ExpertProvider>,
        bias: Option<&D::Buf>,
        x: &D::Buf,
        n: usize,
    ) -> Result<D::Buf> {
        match self {
            Ffn::Dense(mlp) => device::mlp(dev, mlp, WeightClass::Spine, x, n),
            Ffn::Moe(moe) => device::moe(dev, (moe, experts), bias, x, n),
        }
    }
}

struct DeviceLayer<B> {
    input_norm: B,
    post_norm: B,
    attn: DeviceAttn<B>,
    bias: Option<B>,
}

/// A Kimi-Linear model running whole passes of one sequence on a device: activations, MLA
/// caches and KDA states stay there; tokens go in, the last row's logits come out
/// (`model::layers::device`). Out of core, routed experts come from the expert store (host
/// cache, then disk) through the device's expert tier.
pub struct DeviceSession<'m, D: DeviceOps> {
    model: &'m KimiLinear,
    dev: &'m D,
    layers: Vec<DeviceLayer<D::Buf>>,
    norm: D::Buf,
    len: usize,
}

impl<D: DeviceOps> std::fmt::Debug for DeviceSession<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceSession({} layers, {} positions)",
            self.layers.len(),
            self.len
        )
    }
}

impl KimiLinear {
    /// A device session of up to `capacity` positions (its caches are allocated now).
    pub fn device_session<'m, D: DeviceOps>(
        &'m self,
        dev: &'m D,
        capacity: usize,
    ) -> Result<DeviceSession<'m, D>> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in 0..self.layers.len() {
            let layer = self.layers.get(l)?;
            layers.push(DeviceLayer {
                input_norm: dev.upload_f32(&layer.input_norm)?,
                post_norm: dev.upload_f32(&layer.post_norm)?,
                attn: DeviceAttn::new(dev, &layer.attn, capacity)?,
                bias: layer.ffn.device_bias(dev)?,
            });
        }
        Ok(DeviceSession {
            model: self,
            dev,
            layers,
            norm: dev.upload_f32(&self.norm)?,
            len: 0,
        })
    }
}

impl<D: DeviceOps> DeviceSession<'_, D> {
    /// Positions run so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has run yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Run `tokens` (the sequence's next positions) through every layer on the device; the last
    /// row's logits.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let (m, dev, n) = (self.model, self.dev, tokens.len());
        let (h, eps) = (m.cfg.hidden_size, m.cfg.rms_norm_eps);
        let mut x = dev.upload_f32(&super::embed_tokens(&m.embed, tokens)?)?;
        let pass = ExpertPass::open(m.experts.as_deref());
        for (l, k) in self.layers.iter_mut().enumerate() {
            let layer = m.layers.get(l)?;
            let xn = device::rms_norm(dev, &x, &k.input_norm, n, h, eps)?;
            let a = k.attn.run(dev, &layer.attn, &xn, n)?;
            x = device::add(dev, &x, &a, n * h)?;
            let xn = device::rms_norm(dev, &x, &k.post_norm, n, h, eps)?;
            if pass.is_out_of_core() {
                pass.hint_next(l, &dev.download_f32(&x)?, n);
            }
            let experts = pass.layer(l);
            let provider = experts.as_ref().map(|e| e as &dyn ExpertProvider);
            let f = layer.ffn.run_on(dev, provider, k.bias.as_ref(), &xn, n)?;
            x = device::add(dev, &x, &f, n * h)?;
        }
        pass.finish()?;
        self.len += n;
        device::last_row_logits(dev, &x, (n, h), (&self.norm, eps), &m.lm_head)
    }
}
