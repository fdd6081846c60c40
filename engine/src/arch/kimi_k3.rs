//! Kimi K3: KDA (lower-bounded gate, per-channel `A_log`, full-rank output gate) and gated
//! NoPE-MLA layers, Block Attention Residuals, SiTU, a latent MoE with MXFP4 experts combined in
//! router order plus fused shared experts, untied head. Reference: `reference/kimi-k3.md` §1
//! (the independent float64 NumPy oracle of the golden test is written from the same text).
//!
//! Per position the state between layers is `(h, A)`: `h` the within-block running sum of
//! sub-layer outputs, `A` the completed block representations ("anchors"). Layer `ℓ`:
//! * `u = AttnRes_att([A…, h])` (just `h` while `A` is empty);
//! * if `ℓ % attn_res_block_size == 0`, `h` becomes an anchor and the partial sum `p` restarts
//!   (`p = a` below), otherwise `p = h`;
//! * `a = Attn(RMSNorm_in(u))`; `p ← p + a`; `m = AttnRes_mlp([A…, p])`;
//! * `h ← p + FFN(RMSNorm_post(m))`.
//!
//! Tail: `z = AttnRes_out([A…, h])`, `logits = lm_head(RMSNorm(z))`. Traced tensors: `embed`,
//! `layers.{ℓ}` (= `h` after layer ℓ) and `norm` (= `RMSNorm(z)` of the logit rows).

use super::kimi_linear::{
    Attn, Ffn, Variant, check_state, embed_rows, head, load_attn, load_embed_head, load_ffn, model_info,
    new_layer_states, norm_rows, run_attn,
};
use super::layers::attn_res::AttnRes;
use super::layers::kda::L2Norm;
use super::layers::mlp::Activation;
use super::layers::moe::Combine;
use super::{Loader, Model, ModelInfo, RowPlan, SeqInput, Trace, begin_pass};
use crate::config::KimiK3Config;
use crate::error::Result;
use crate::generate::SeqState;
use crate::kernels::Matrix;

/// `F.normalize`'s floor on the L2 norm of q and k.
const L2_FLOOR: f32 = 1e-12;

#[derive(Debug)]
struct Layer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    attn_res: AttnRes,
    mlp_res: AttnRes,
    attn: Attn,
    ffn: Ffn,
}

/// A loaded Kimi K3 model.
#[derive(Debug)]
pub struct KimiK3 {
    cfg: KimiK3Config,
    info: ModelInfo,
    embed: Matrix,
    layers: Vec<Layer>,
    output_res: AttnRes,
    norm: Vec<f32>,
    lm_head: Matrix,
}

/// The AttnRes site `{p}{site}_res_norm` / `{p}{site}_res_proj`.
fn load_res(ld: &Loader<'_>, p: &str, site: &str, h: usize, eps: f32) -> Result<AttnRes> {
    let norm = ld.vector(&format!("{p}{site}_res_norm.weight"), h)?;
    let proj = ld.floats(&format!("{p}{site}_res_proj.weight"), &[1, h])?;
    Ok(AttnRes::new(&norm, &proj, eps))
}

impl KimiK3 {
    /// Load and shape-check every tensor.
    pub fn load(cfg: KimiK3Config, ld: &Loader<'_>) -> Result<Self> {
        let t = &cfg.text;
        let v = Variant {
            act: Activation::Situ {
                beta: cfg.situ_beta,
                linear_beta: cfg.situ_linear_beta,
            },
            l2: L2Norm::EpsFloor(L2_FLOOR),
            mla_norm_eps: t.rms_norm_eps,
            mla_gate: cfg.mla_use_output_gate,
            latent: Some((cfg.routed_expert_hidden_size, cfg.latent_moe_use_norm)),
            combine: Combine::RouteOrder,
        };
        let (h, eps) = (t.hidden_size, t.rms_norm_eps);
        let (embed, lm_head) = load_embed_head(t, ld)?;
        let layers = (0..t.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}.");
                Ok(Layer {
                    input_norm: ld.vector(&format!("{p}input_layernorm.weight"), h)?,
                    post_norm: ld.vector(&format!("{p}post_attention_layernorm.weight"), h)?,
                    attn_res: load_res(ld, &p, "self_attention", h, eps)?,
                    mlp_res: load_res(ld, &p, "mlp", h, eps)?,
                    attn: load_attn(t, ld, i, &v)?,
                    ffn: load_ffn(t, ld, i, &v)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let info = model_info("kimi_k3", t, ld);
        Ok(KimiK3 {
            output_res: load_res(ld, "model.", "output_attn", h, eps)?,
            norm: ld.vector("model.norm.weight", h)?,
            embed,
            layers,
            lm_head,
            info,
            cfg,
        })
    }
}

/// AttnRes over every row: `anchors[a]` and `last` hold `n` rows of `h` values each.
fn mix_rows(res: &AttnRes, anchors: &[Vec<f32>], last: &[f32], rows: &[usize], h: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows.len() * h];
    let mut refs: Vec<&[f32]> = Vec::with_capacity(anchors.len());
    for (k, &r) in rows.iter().enumerate() {
        refs.clear();
        refs.extend(anchors.iter().map(|a| &a[r * h..(r + 1) * h]));
        res.mix(&refs, &last[r * h..(r + 1) * h], &mut out[k * h..(k + 1) * h]);
    }
    out
}

impl Model for KimiK3 {
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
        new_layer_states(&self.cfg.text)
    }

    fn forward(&self, batch: &mut [SeqInput<'_>], mut trace: Option<&mut Trace>) -> Result<Vec<f32>> {
        let t = &self.cfg.text;
        let (h, eps, block) = (t.hidden_size, t.rms_norm_eps, self.cfg.attn_res_block_size);
        let plan = RowPlan::new(batch, t.vocab_size, self.info.max_context)?;
        for b in batch.iter_mut() {
            check_state(t, b.state)?;
        }
        begin_pass(batch);
        let n = plan.len();
        let all: Vec<usize> = (0..n).collect();
        let mut run = embed_rows(&self.embed, batch, n);
        if let Some(tr) = trace.as_deref_mut() {
            tr.record("embed", &run);
        }
        let mut anchors: Vec<Vec<f32>> = Vec::with_capacity(self.cfg.num_blocks());
        for (l, layer) in self.layers.iter().enumerate() {
            let u = if anchors.is_empty() {
                run.clone()
            } else {
                mix_rows(&layer.attn_res, &anchors, &run, &all, h)
            };
            let partial = if l % block == 0 {
                anchors.push(run);
                None
            } else {
                Some(run)
            };
            let a = run_attn(
                &layer.attn,
                &norm_rows(&u, &layer.input_norm, eps),
                &plan,
                batch,
                l,
            );
            let p = match partial {
                None => a,
                Some(mut p) => {
                    p.iter_mut().zip(&a).for_each(|(p, a)| *p += a);
                    p
                }
            };
            let m = mix_rows(&layer.mlp_res, &anchors, &p, &all, h);
            let f = layer.ffn.forward(&norm_rows(&m, &layer.post_norm, eps), n);
            run = p;
            run.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
            if let Some(tr) = trace.as_deref_mut() {
                tr.record(format!("layers.{l}"), &run);
            }
        }
        let logit_rows = plan.logit_rows(batch);
        let z = mix_rows(&self.output_res, &anchors, &run, &logit_rows, h);
        let normed = norm_rows(&z, &self.norm, eps);
        if let Some(tr) = trace {
            tr.record("norm", &normed);
        }
        Ok(head(&self.lm_head, &normed, logit_rows.len()))
    }
}
