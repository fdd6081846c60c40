//! The decoder's Block Attention Residuals form (Kimi K3, `reference/kimi-k3.md` §1): instead of
//! adding each sub-layer's output to one residual stream, the state between layers is
//! `(h, A)` — `h` the within-block running sum of sub-layer outputs, `A` the completed block
//! representations ("anchors"). Layer `ℓ`:
//! * `u = AttnRes_att([A…, h])` (just `h` while `A` is empty);
//! * if `ℓ % block == 0`, `h` becomes an anchor and the partial sum `p` restarts (`p = a`
//!   below), otherwise `p = h`;
//! * `a = mixer(RMSNorm_in(u))`; `p ← p + a`; `m = AttnRes_mlp([A…, p])`;
//! * `h ← p + FFN(RMSNorm_post(m))`.
//!
//! Tail: `z = AttnRes_out([A…, h])`, `logits = lm_head(RMSNorm(z))`: the layers run inside the
//! shared pass (`arch::decoder_pass`: embedding, state checks, rollback, norm, head) and leave
//! `z` in the logit rows. Traced tensors: `embed`, `layers.{ℓ}` (= `h` after layer ℓ) and
//! `norm` (= `RMSNorm(z)` of the logit rows). The
//! look-ahead prefetch applies layer `ℓ+1`'s `post_attention_layernorm` and router to `m` of
//! layer `ℓ` (deltafin's PILOT predictor).

use super::super::layers::attn_res::AttnRes;
use super::super::layers::dsa::Selection;
use super::super::{RowPlan, SeqInput, Trace};
use super::{Decoder, missing_res, run_ffn, run_mixer};
use crate::cache::ExpertPass;
use crate::error::Result;

impl Decoder {
    /// Every layer over the embedding rows `x`, anchors every `block` layers; then each logit
    /// row of `x` becomes its tail mix `z`, which the shared pass normalises and projects. On
    /// error the caller rolls the states back.
    pub(super) fn attn_res_layers(
        &self,
        batch: &mut [SeqInput<'_>],
        plan: &RowPlan,
        x: &mut [f32],
        mut trace: Option<&mut Trace>,
        block: usize,
    ) -> Result<()> {
        let (h, n) = (self.plan.hidden_size, plan.len());
        let output_res = self
            .output_res
            .as_ref()
            .and_then(super::Tail::attn_res)
            .ok_or_else(missing_res)?;
        let mut run = x.to_vec();
        let all: Vec<usize> = (0..n).collect();
        let tokens = super::row_tokens(batch);
        let mut anchors: Vec<Vec<f32>> = Vec::with_capacity(self.layers.len().div_ceil(block));
        let pass = ExpertPass::open(self.experts.as_deref());
        for l in 0..self.layers.len() {
            let layer = self.layers.get(l)?;
            let [attn_res, mlp_res] = layer
                .res
                .as_ref()
                .and_then(super::Sites::attn_res)
                .ok_or_else(missing_res)?;
            let u = match anchors.is_empty() {
                true => run.clone(),
                false => mix_rows(attn_res, &anchors, &run, &all, h),
            };
            let partial = if l % block == 0 {
                anchors.push(run);
                None
            } else {
                Some(run)
            };
            let a = run_mixer(
                &layer.mixer,
                &self.norm_rows(&u, &layer.input_norm),
                batch,
                (plan, l),
                &mut Selection::new(),
            );
            let p = match partial {
                None => a,
                Some(mut p) => {
                    p.iter_mut().zip(&a).for_each(|(p, a)| *p += a);
                    p
                }
            };
            let m = mix_rows(mlp_res, &anchors, &p, &all, h);
            // PILOT look-ahead (kimi-k3.md §4.5): layer l + 1's norm and router applied to the
            // AttnRes output that feeds this layer's FFN. A forecast for prefetching only;
            // layer l + 1 routes its own input.
            pass.hint_next(l, &m, n);
            let f = run_ffn(
                &layer.ffn,
                (&self.norm_rows(&m, &layer.post_norm), &tokens),
                n,
                &pass,
                l,
            )?;
            run = p;
            run.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
            if let Some(tr) = trace.as_deref_mut() {
                tr.record(format!("layers.{l}"), &run);
            }
        }
        pass.finish()?;
        x.copy_from_slice(&run);
        let logit_rows = plan.logit_rows(batch);
        let z = mix_rows(output_res, &anchors, &run, &logit_rows, h);
        for (&r, zr) in logit_rows.iter().zip(z.chunks(h)) {
            x[r * h..(r + 1) * h].copy_from_slice(zr);
        }
        Ok(())
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
