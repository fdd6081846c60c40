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

use super::super::layers::ops::Host;
use super::super::{RowPlan, SeqInput, Trace};
use super::{Decoder, HostStack, row_tokens, stack};
use crate::error::Result;

impl Decoder {
    /// Every layer over the embedding rows `x`, anchors every `block` layers (the written-once
    /// loop on the CPU); then each logit row of `x` becomes its tail mix `z`, which the shared
    /// pass normalises and projects. On error the caller rolls the states back.
    pub(super) fn attn_res_layers(
        &self,
        batch: &mut [SeqInput<'_>],
        plan: &RowPlan,
        x: &mut [f32],
        trace: Option<&mut Trace>,
        block: usize,
    ) -> Result<()> {
        let (h, n, tokens) = (self.plan.hidden_size, plan.len(), row_tokens(batch));
        let mut stack = HostStack::new(batch, plan, trace);
        let (run, z) = stack::attn_res(self, (&Host, &mut stack), x.to_vec(), (n, &tokens), block)?;
        x.copy_from_slice(&run);
        for r in plan.logit_rows(batch) {
            x[r * h..(r + 1) * h].copy_from_slice(&z[r * h..(r + 1) * h]);
        }
        Ok(())
    }
}
