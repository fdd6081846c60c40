//! The decoder's layer loops, written once over the layers' [`Ops`]: the plain residual stream
//! and K3's Block Attention Residuals, each with its FFN (dense MLP or routed MoE). The CPU pass
//! (`Decoder::forward`, buffers on the host) and the device session (`device.rs`, buffers in
//! device memory) run these same functions; what differs per device is only the [`Stack`]: where
//! a layer's norm weights and AttnRes queries live, and how its mixer reaches the sequences'
//! states.

use super::super::layers::moe::ExpertProvider;
use super::super::layers::ops::Ops;
use super::{Decoder, Ffn, Layer, Sites, Tail, missing_res};
use crate::backend::WeightClass;
use crate::cache::ExpertPass;
use crate::error::Result;

/// One device's view of the layers during a pass.
pub(super) trait Stack<O: Ops> {
    /// Layer `l`'s input and post-attention norm weights.
    fn norms<'a>(&'a self, l: usize, layer: &'a Layer) -> [&'a O::Buf; 2];

    /// Layer `l`'s AttnRes pseudo-queries before the mixer and before the FFN.
    fn res_queries<'a>(&'a self, l: usize, layer: &'a Layer) -> Result<[&'a O::Buf; 2]>;

    /// The AttnRes pseudo-query before the final norm.
    fn output_query<'a>(&'a self, model: &'a Decoder) -> Result<&'a O::Buf>;

    /// Layer `l`'s mixer over `n` normalised rows, advancing the sequences' states.
    fn mixer(&mut self, o: &O, at: (usize, &Layer), xn: &O::Buf, n: usize) -> Result<O::Buf>;

    /// Layer `l`'s output rows (the trace's `layers.{l}`).
    fn record(&mut self, o: &O, l: usize, x: &O::Buf) -> Result<()>;
}

/// Every layer in the plain form: `x += mixer(RMSNorm_in(x))`, `x += FFN(RMSNorm_post(x))`,
/// over `n` rows (whose tokens are `tokens`) starting from the embeddings `x`.
pub(super) fn plain<O: Ops, S: Stack<O>>(
    m: &Decoder,
    (o, stack): (&O, &mut S),
    mut x: O::Buf,
    (n, tokens): (usize, &[u32]),
) -> Result<O::Buf> {
    let (h, eps) = (m.plan.hidden_size, m.plan.rms_norm_eps);
    let pass = ExpertPass::open(m.experts.as_deref());
    for l in 0..m.layers.len() {
        let layer = m.layers.get(l)?;
        let xn = o.rms_norm(&x, stack.norms(l, &layer)[0], n, h, eps)?;
        let a = stack.mixer(o, (l, &layer), &xn, n)?;
        x = o.add(&x, &a, n * h)?;
        let xn = o.rms_norm(&x, stack.norms(l, &layer)[1], n, h, eps)?;
        if pass.is_out_of_core() {
            pass.hint_next(l, &o.host(&x)?, n);
        }
        let f = ffn(o, &layer.ffn, (&pass, l), &xn, (n, tokens))?;
        x = o.add(&x, &f, n * h)?;
        stack.record(o, l, &x)?;
    }
    pass.finish()?;
    Ok(x)
}

/// Every layer in the Block Attention Residuals form (`attn_res.rs` has the equations), anchors
/// every `block` layers: the last layer's running sum `h` and the tail mix `z` of every row.
pub(super) fn attn_res<O: Ops, S: Stack<O>>(
    m: &Decoder,
    (o, stack): (&O, &mut S),
    mut run: O::Buf,
    (n, tokens): (usize, &[u32]),
    block: usize,
) -> Result<(O::Buf, O::Buf)> {
    let (h, eps) = (m.plan.hidden_size, m.plan.rms_norm_eps);
    let mut slots = o.zeros((m.layers.len().div_ceil(block) + 1) * n * h)?;
    // `last` into the slot after the anchors, then the site's mix over both.
    let mix = |slots: &mut O::Buf, site: (&O::Buf, f32), anchors: usize, last: &O::Buf| {
        o.put_slot(slots, anchors, last, n, h)?;
        o.attn_res(site, slots, anchors + 1, (n, h))
    };
    let mut anchors = 0;
    let pass = ExpertPass::open(m.experts.as_deref());
    for l in 0..m.layers.len() {
        let layer = m.layers.get(l)?;
        let [attn, mlp] = layer
            .res
            .as_ref()
            .and_then(Sites::attn_res)
            .ok_or_else(missing_res)?;
        let u = match anchors {
            0 => None,
            _ => Some(mix(
                &mut slots,
                (stack.res_queries(l, &layer)?[0], attn.eps),
                anchors,
                &run,
            )?),
        };
        let xn = o.rms_norm(u.as_ref().unwrap_or(&run), stack.norms(l, &layer)[0], n, h, eps)?;
        let a = stack.mixer(o, (l, &layer), &xn, n)?;
        let p = if l % block == 0 {
            o.put_slot(&mut slots, anchors, &run, n, h)?;
            anchors += 1;
            a
        } else {
            o.add(&run, &a, n * h)?
        };
        let mixed = mix(
            &mut slots,
            (stack.res_queries(l, &layer)?[1], mlp.eps),
            anchors,
            &p,
        )?;
        // PILOT look-ahead (kimi-k3.md §4.5): layer l + 1's norm and router applied to the
        // AttnRes output that feeds this layer's FFN; a forecast for prefetching only.
        if pass.is_out_of_core() {
            pass.hint_next(l, &o.host(&mixed)?, n);
        }
        let xn = o.rms_norm(&mixed, stack.norms(l, &layer)[1], n, h, eps)?;
        let f = ffn(o, &layer.ffn, (&pass, l), &xn, (n, tokens))?;
        run = o.add(&p, &f, n * h)?;
        stack.record(o, l, &run)?;
    }
    pass.finish()?;
    let out = m
        .output_res
        .as_ref()
        .and_then(Tail::attn_res)
        .ok_or_else(missing_res)?;
    let z = mix(&mut slots, (stack.output_query(m)?, out.eps), anchors, &run)?;
    Ok((run, z))
}

/// Layer `l`'s FFN over `n` normalised rows (whose tokens are `tokens`, for hash routing), its
/// routed experts from the pass (out of core) or its own.
pub(super) fn ffn<O: Ops>(
    o: &O,
    ffn: &Ffn,
    (pass, l): (&ExpertPass<'_>, usize),
    xn: &O::Buf,
    (n, tokens): (usize, &[u32]),
) -> Result<O::Buf> {
    let experts = pass.layer(l);
    let provider = experts.as_ref().map(|e| e as &dyn ExpertProvider);
    match ffn {
        Ffn::Dense(mlp) => mlp.run(o, WeightClass::Spine, xn, n),
        Ffn::Moe(moe) => moe.run(o, xn, n, Some(tokens), provider),
    }
}
