//! Building the decoder's layers and always-resident tensors from a plan: the same code for
//! the in-memory model, the out-of-core recording pass and the streamed layers and experts.

use super::super::layers::attn_res::AttnRes;
use super::super::layers::compressed::{CompressedAttention, CompressedSpec};
use super::super::layers::dsa::{Indexer, Sparse};
use super::super::layers::gated_deltanet::GatedDeltaNet;
use super::super::layers::gqa::Gqa;
use super::super::layers::hyper::{HyperHead, HyperSite};
use super::super::layers::kda::Kda;
use super::super::layers::mla::Mla;
use super::super::layers::mlp::{Activation, GateUp, Mlp, MlpBias};
use super::super::layers::moe::{Latent, Moe};
use super::super::layers::rope::Rope;
use super::{DecoderPlan, ExpertForm, Ffn, Fixed, Layer, Mixer, MixerKind, MoeNames, Residual, Sites, Tail};
use crate::cache::store::LookaheadLayer;
use crate::error::{Error, Result};
use crate::kernels::Matrix;
use crate::model::Loader;

fn mlp(ld: &Loader<'_>, prefix: &str, (hidden, width): (usize, usize), act: Activation) -> Result<Mlp> {
    Ok(Mlp::split(
        ld.linear(&format!("{prefix}.gate_proj"), width, hidden)?,
        ld.linear(&format!("{prefix}.up_proj"), width, hidden)?,
        ld.linear(&format!("{prefix}.down_proj"), hidden, width)?,
        act,
    ))
}

/// Layer `i`'s DSA choice of positions: its own indexer `{a}.indexer`, or the previous full
/// layer's selection.
fn sparse(plan: &DecoderPlan, ld: &Loader<'_>, a: &str, i: usize) -> Result<Option<Sparse>> {
    let Some(m) = &plan.mla else { return Ok(None) };
    let Some(dsa) = &m.sparse else { return Ok(None) };
    if dsa.shared.get(i).copied().unwrap_or(false) {
        return Ok(Some(Sparse::Shared));
    }
    let q_lora = m.q_lora_rank.ok_or_else(|| Error::InvalidArgument {
        field: "q_lora_rank",
        reason: "the DSA indexer reads the query latent: q_lora_rank must be set".into(),
    })?;
    let rope = Rope::new(&plan.rope, dsa.dims.rope, dsa.interleave);
    let prefix = format!("{a}.indexer");
    let ix = Indexer::load(ld, &prefix, plan.hidden_size, q_lora, dsa.dims, rope)?;
    Ok(Some(Sparse::Index(ix)))
}

/// The AttnRes site `{p}{site}_res_norm` / `{p}{site}_res_proj`.
fn load_res(ld: &Loader<'_>, p: &str, site: &str, h: usize, eps: f32) -> Result<AttnRes> {
    let norm = ld.vector(&format!("{p}{site}_res_norm.weight"), h)?;
    let proj = ld.floats(&format!("{p}{site}_res_proj.weight"), &[1, h])?;
    Ok(AttnRes::new(&norm, &proj, eps))
}

fn load_head(plan: &DecoderPlan, ld: &Loader<'_>, embed: &Matrix) -> Result<Matrix> {
    if plan.tie_word_embeddings && !ld.has("lm_head.weight") {
        Ok(embed.clone())
    } else {
        ld.dense("lm_head.weight", plan.vocab_size, plan.hidden_size)
    }
}

/// Routed expert `e` of layer `l`.
pub(super) fn expert(plan: &DecoderPlan, ld: &Loader<'_>, l: usize, e: usize) -> Result<Mlp> {
    let ld = &ld.with_naming(plan.naming());
    let m = &plan.moe;
    // The experts' input: the hidden state, or the latent width they run at.
    let h = m.latent.map_or(plan.hidden_size, |(width, _)| width);
    match m.form {
        ExpertForm::Hf(names) => {
            let p = format!("model.layers.{l}.{}.experts", names.block);
            if !ld.has(&format!("{p}.gate_up_proj")) {
                let [gate, up, down] = names.expert.map(|n| format!("{p}.{e}.{n}"));
                return Ok(Mlp::split(
                    ld.linear(&gate, m.width, h)?,
                    ld.linear(&up, m.width, h)?,
                    ld.linear(&down, h, m.width)?,
                    m.act,
                ));
            }
            let (n, w) = (m.experts, m.width);
            let gate_up = |rows| ld.stacked_dense(&format!("{p}.gate_up_proj"), (n, e), (2 * w, h), rows);
            Ok(Mlp::split(
                gate_up(0..w)?,
                gate_up(w..2 * w)?,
                ld.stacked_dense(&format!("{p}.down_proj"), (n, e), (h, w), 0..h)?,
                m.act,
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
        bias: match m.correction_bias && !plan.is_hash(i) {
            true => ld.vector(&format!("{p}.{correction}"), m.experts)?,
            false => Vec::new(),
        },
        hash: match plan.is_hash(i) {
            true => {
                let shape = (plan.vocab_size, m.router.top_k);
                Some(ld.id_table(&format!("{p}.{router}.tid2eid"), shape, m.experts)?)
            }
            false => None,
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
        combine: m.combine,
    })
}

pub(super) fn load_layer(plan: &DecoderPlan, ld: &Loader<'_>, i: usize) -> Result<Layer> {
    let ld = &ld.with_naming(plan.naming());
    let h = plan.hidden_size;
    let p = format!("model.layers.{i}");
    let a = format!("{p}.self_attn");
    let eps = plan.rms_norm_eps;
    let mixer = match plan.mixer(i) {
        MixerKind::DeltaNet => {
            let dims = plan.linear.ok_or_else(|| unplanned(plan, MixerKind::DeltaNet))?;
            let prefix = format!("{p}.linear_attn");
            Mixer::DeltaNet(GatedDeltaNet::load(ld, &prefix, h, dims, eps)?)
        }
        MixerKind::Kda => {
            let k = plan.kda.as_ref().ok_or_else(|| unplanned(plan, MixerKind::Kda))?;
            Mixer::Kda(Kda::load(ld, &a, h, &k.config, k.l2, eps)?)
        }
        MixerKind::Mla => {
            let m = plan.mla.as_ref().ok_or_else(|| unplanned(plan, MixerKind::Mla))?;
            let rotary = m.rotary.then(|| Rope::new(&plan.rope, m.dims.rope, m.interleave));
            let gate = match m.out_gate {
                true => Some(ld.linear(&format!("{a}.g_proj"), m.dims.heads * m.dims.v, h)?),
                false => None,
            };
            let mut mla = Mla::load(ld, &a, h, m.q_lora_rank, m.dims.clone(), rotary, gate)?;
            mla.sparse = sparse(plan, ld, &a, i)?;
            Mixer::Mla(mla)
        }
        MixerKind::Attention => {
            let g = plan
                .gqa
                .as_ref()
                .ok_or_else(|| unplanned(plan, MixerKind::Attention))?;
            let options = plan.attn_options(i, g.options);
            Mixer::Attention(Gqa::load(ld, &a, h, g.dims, &plan.rope, options)?)
        }
        MixerKind::Compressed(kind) => {
            let v = plan.v4.as_ref().ok_or_else(|| unplanned(plan, plan.mixer(i)))?;
            let rope = Rope::new(&plan.rope, v.dims.rope, true);
            let compress_rope = Rope::new(&v.compress_rope, v.dims.rope, true);
            let spec = CompressedSpec {
                hidden: h,
                dims: v.dims,
                kind,
                indexer: v.indexer,
                rope: match kind {
                    super::super::layers::compressed::AttentionKind::Sliding => &rope,
                    _ => &compress_rope,
                },
                compress_rope: &compress_rope,
                eps: plan.rms_norm_eps,
            };
            Mixer::Compressed(CompressedAttention::load(ld, &a, spec)?)
        }
    };
    let ffn = if plan.is_moe(i) {
        let m = &plan.moe;
        let n = if ld.routed_experts() { m.experts } else { 0 };
        let experts = (0..n)
            .map(|e| expert(plan, ld, i, e))
            .collect::<Result<Vec<_>>>()?;
        let shared = match m.shared_width {
            0 => None,
            w => Some(mlp(
                ld,
                &format!("{p}.{}.{}", m.block(), m.shared_module),
                (h, w),
                m.act,
            )?),
        };
        let mut moe = router(plan, ld, i, experts, shared)?;
        moe.latent = latent(plan, ld, &format!("{p}.{}", m.block()))?;
        Ffn::Moe(moe)
    } else {
        Ffn::Dense(mlp(ld, &format!("{p}.mlp"), (h, plan.dense_width), plan.moe.act)?)
    };
    let (eps, q) = (plan.rms_norm_eps, format!("{p}."));
    let res = match plan.residual {
        Residual::Plain => None,
        Residual::AttnRes { .. } => Some(Sites::AttnRes([
            load_res(ld, &q, "self_attention", h, eps)?,
            load_res(ld, &q, "mlp", h, eps)?,
        ])),
        Residual::Hyper {
            streams,
            iters,
            eps: hc,
        } => {
            let site = |s: &str| HyperSite::load(ld, &format!("{p}.{s}"), (streams, h), iters, (hc, eps));
            Some(Sites::Hyper([site("attn_hc")?, site("ffn_hc")?]))
        }
    };
    Ok(Layer {
        input_norm: plan.norm(ld, &format!("{p}.input_layernorm.weight"))?,
        post_norm: plan.norm(ld, &format!("{p}.post_attention_layernorm.weight"))?,
        mixer,
        ffn,
        res,
    })
}

/// The latent projection around a MoE block's routed experts (`{block}.routed_expert_*`).
fn latent(plan: &DecoderPlan, ld: &Loader<'_>, block: &str) -> Result<Option<Latent>> {
    let Some((width, use_norm)) = plan.moe.latent else {
        return Ok(None);
    };
    let h = plan.hidden_size;
    Ok(Some(Latent {
        down: ld.linear(&format!("{block}.routed_expert_down_proj"), width, h)?,
        norm: match use_norm {
            true => Some(ld.vector(&format!("{block}.routed_expert_norm.weight"), width)?),
            false => None,
        },
        eps: plan.rms_norm_eps,
        up: ld.linear(&format!("{block}.routed_expert_up_proj"), h, width)?,
    }))
}

pub(super) fn load_fixed(plan: &DecoderPlan, ld: &Loader<'_>) -> Result<Fixed> {
    let ld = &ld.with_naming(plan.naming());
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
        output_res: match plan.residual {
            Residual::Plain => None,
            Residual::AttnRes { .. } => Some(Tail::AttnRes(load_res(
                ld,
                "model.",
                "output_attn",
                h,
                plan.rms_norm_eps,
            )?)),
            Residual::Hyper { streams, eps, .. } => Some(Tail::Hyper(HyperHead::load(
                ld,
                "model.hc_head",
                (streams, h),
                (eps, plan.rms_norm_eps),
            )?)),
        },
    })
}

/// A plan naming a mixer it gives no shape for (a family's plan is wrong, not the checkpoint).
fn unplanned(plan: &DecoderPlan, kind: MixerKind) -> Error {
    Error::InvalidArgument {
        field: "plan",
        reason: format!("{}: a {kind:?} layer without its shape in the plan", plan.arch),
    }
}
