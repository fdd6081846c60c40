//! Kimi-Linear: KDA and NoPE-MLA layers as listed in `linear_attn_config`, a dense first
//! FFN, then sigmoid-routed MoE with shared experts; untied head. Reference: HF transformers
//! `models/kimi_linear/modeling_kimi_linear.py` (float32 path) and `model-formats.md` §3.
//!
//! Layer `i`: `x += Attn_i(RMSNorm_in(x)); x += FFN_i(RMSNorm_post(x))`; logits
//! `lm_head(RMSNorm(x))`: a plan over the shared decoder ([`super::decoder`]), which runs it in
//! memory, out of core and (its MLA and KDA layers) on a device. Tensor names are the released
//! checkpoint's (pre-HF-conversion): `self_attn.{q,k,v}_conv1d`,
//! `self_attn.{f_a_proj,f_b_proj,dt_bias,A_log}`,
//! `block_sparse_moe.{gate,experts.{e}.w1/w2/w3,shared_experts}`.
//!
//! The loaders and per-layer helpers here are also Kimi K3's ([`super::kimi_k3`]: Block
//! Attention Residuals, so not a plain-residual plan), which passes its own variant choices
//! ([`Variant`]).

use super::decoder::{
    Decoder, DecoderFamily, DecoderPlan, ExpertForm, KdaPlan, MixerKind, MlaPlan, MoeNames, MoePlan,
};
use super::layers::device::{self, DeviceKda, DeviceKdaState, DeviceMla, DeviceMlaCache};
use super::layers::gqa::{GqaDims, GqaOptions, QkNorm};
use super::layers::kda::{Kda, KdaRows, L2Norm};
use super::layers::mla::{Mla, MlaDims, MlaRows};
use super::layers::mlp::{Activation, Mlp};
use super::layers::moe::{Combine, ExpertProvider, Latent, Moe, RouterConfig, Scoring};
use super::{Loader, ModelInfo, RowPlan, SeqInput, StateSize, kda_caches, mla_caches};
use crate::backend::device::DeviceOps;
use crate::backend::{WeightClass, matmul};
use crate::config::{AttnKind, KimiLinearConfig, RopeConfig};
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kernels::ops::rms_norm;
use crate::kernels::reference::decode_row;
use crate::model::NormWeight;
use crate::state::{KdaCache, KdaShape, LayerState, MlaCache, SeqState};

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
        true => Some(ld.linear(
            &format!("{a}.g_proj"),
            cfg.num_attention_heads * cfg.v_head_dim,
            h,
        )?),
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

/// Where Kimi keeps a MoE layer's tensors.
const NAMES: MoeNames = MoeNames {
    block: "block_sparse_moe",
    expert: ["w1", "w3", "w2"],
    router: "gate",
    correction_bias: "gate.e_score_correction_bias",
};

/// The decoder plan of a Kimi-Linear config.
fn plan(c: &KimiLinearConfig) -> DecoderPlan {
    let (v, layers) = (variant(), c.num_hidden_layers);
    DecoderPlan {
        arch: "kimi_linear",
        vocab_size: c.vocab_size,
        hidden_size: c.hidden_size,
        dense_width: c.intermediate_size,
        num_layers: layers,
        max_context: c.max_position_embeddings,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: c.tie_word_embeddings,
        bos_token_id: c.bos_token_id,
        eos_token_ids: c.eos_token_ids.clone(),
        // Grouped-query attention and RoPE are not used: the layers are KDA and NoPE MLA.
        attn: GqaDims {
            heads: c.num_attention_heads,
            kv_heads: c.num_attention_heads,
            head_dim: c.qk_head_dim(),
            rotary_dim: 0,
        },
        attn_options: GqaOptions {
            qkv_bias: false,
            o_bias: false,
            qk_norm: QkNorm::None,
            eps: c.rms_norm_eps,
            norm_weight: NormWeight::Plain,
            sinks: false,
            window: None,
            output_gate: false,
        },
        rope: RopeConfig::default(),
        windows: Vec::new(),
        norm_weight: NormWeight::Plain,
        mixers: c
            .layer_kinds
            .iter()
            .map(|k| match k {
                AttnKind::Kda => MixerKind::Kda,
                AttnKind::Mla => MixerKind::Mla,
            })
            .collect(),
        linear: None,
        mla: Some(MlaPlan {
            q_lora_rank: c.q_lora_rank,
            dims: mla_dims(c, &v),
            rotary: false,
            interleave: false,
        }),
        kda: Some(KdaPlan {
            config: c.kda.clone(),
            l2: v.l2,
        }),
        moe_layers: c.moe_layers.clone(),
        moe: MoePlan {
            experts: c.num_experts,
            width: c.moe_intermediate_size,
            shared_width: c.moe_intermediate_size * c.num_shared_experts,
            shared_module: "shared_experts",
            shared_gate: false,
            router: RouterConfig {
                scoring: Scoring::Sigmoid,
                top_k: c.num_experts_per_token,
                n_group: c.num_expert_group,
                topk_group: c.topk_group,
                norm_topk_prob: c.moe_renormalize,
                scaling: c.routed_scaling_factor,
            },
            correction_bias: true,
            router_bias: false,
            form: ExpertForm::Hf(NAMES),
        },
    }
}

impl DecoderFamily for KimiLinearConfig {
    fn plan(&self) -> DecoderPlan {
        plan(self)
    }
}

/// The in-memory model of `cfg` (the device tests open sessions on it).
pub fn load(cfg: &KimiLinearConfig, ld: &Loader<'_>) -> Result<Decoder> {
    Decoder::load(plan(cfg), ld)
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
