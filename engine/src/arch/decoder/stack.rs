//! The decoder's layer loops, written once over the layers' [`Ops`]: the plain residual stream,
//! K3's Block Attention Residuals and DeepSeek-V4's hyper-connections, each with its FFN (dense
//! MLP or routed MoE). The CPU pass
//! (`Decoder::forward`, buffers on the host), the device session (`device.rs`) and the served
//! device model (`served/`, which may run a pass's first layers on the device and the rest on the
//! host, carrying the [`Stream`] across) run these same functions; what differs per device is
//! only the [`Stack`]: where a layer's norm weights and AttnRes queries live, and how its mixer
//! reaches the sequences' states.
//!
//! ## Block Attention Residuals
//! The Block Attention Residuals form (Kimi K3, `reference/kimi-k3.md` §1): instead of
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

use std::ops::Range;

use super::super::layers::moe::ExpertProvider;
use super::super::layers::ops::Ops;
use super::{Decoder, Ffn, Layer, Residual, Sites, Tail, missing_res};
use crate::backend::WeightClass;
use crate::cache::ExpertPass;
use crate::error::Result;

/// One device's view of the layers during a pass.
pub(super) trait Stack<O: Ops> {
    /// Layer `l`'s input and post-attention norm weights.
    fn norms<'a>(&'a self, l: usize, layer: &'a Layer) -> [&'a O::Buf; 2];

    /// Layer `l`'s residual sites' vectors before the mixer and before the FFN: the AttnRes
    /// pseudo-queries, or the hyper-connection projections.
    fn res_queries<'a>(&'a self, l: usize, layer: &'a Layer) -> Result<[&'a O::Buf; 2]>;

    /// The tail's vector before the final norm: the AttnRes pseudo-query, or the hyper head's
    /// projection.
    fn output_query<'a>(&'a self, model: &'a Decoder) -> Result<&'a O::Buf>;

    /// Layer `l`'s mixer over `n` normalised rows, advancing the sequences' states.
    fn mixer(&mut self, o: &O, at: (usize, &Layer), xn: &O::Buf, n: usize) -> Result<O::Buf>;

    /// Layer `l`'s output rows of `width` values (the trace's `layers.{l}`).
    fn record(&mut self, o: &O, l: usize, x: &O::Buf, width: usize) -> Result<()>;
}

/// The layers a loop runs, and the pass over their routed experts. The caller opens and
/// finishes the pass, as one pass may run its layers on two devices (a served model's split).
pub(super) struct Span<'p, 'a> {
    pub layers: Range<usize>,
    pub pass: &'p ExpertPass<'a>,
}

/// The layers of `span` in the plain form: `x += mixer(RMSNorm_in(x))`, `x += FFN(RMSNorm_post(x))`,
/// over `n` rows (whose tokens are `tokens`) starting from `x` (the embeddings, or the stream
/// after the layers before the span).
fn plain<O: Ops, S: Stack<O>>(
    m: &Decoder,
    (o, stack): (&O, &mut S),
    mut x: O::Buf,
    (n, tokens): (usize, &[u32]),
    span: Span<'_, '_>,
) -> Result<O::Buf> {
    let (h, eps, pass) = (m.plan.hidden_size, m.plan.rms_norm_eps, span.pass);
    for l in span.layers {
        let layer = m.layers.get(l)?;
        let xn = o.rms_norm(&x, stack.norms(l, &layer)[0], n, h, eps)?;
        let a = stack.mixer(o, (l, &layer), &xn, n)?;
        x = o.add(&x, &a, n * h)?;
        let xn = o.rms_norm(&x, stack.norms(l, &layer)[1], n, h, eps)?;
        if pass.is_out_of_core() {
            pass.hint_next(l, &o.host(&x)?, n);
        }
        let f = ffn(o, &layer.ffn, (pass, l), &xn, (n, tokens))?;
        x = o.add(&x, &f, n * h)?;
        stack.record(o, l, &x, h)?;
    }
    Ok(x)
}

/// Block Attention Residuals between layers: the running sum `run`, the slots (the anchors,
/// then room for a partial sum) and how many anchors they hold.
pub(super) struct Carry<B> {
    pub run: B,
    pub slots: B,
    pub anchors: usize,
}

impl<B> Carry<B> {
    /// The carry before layer 0 of `n` rows: the embeddings `run`, no anchor yet.
    pub fn start<O: Ops<Buf = B>>(o: &O, m: &Decoder, run: B, n: usize) -> Result<Self> {
        let Residual::AttnRes { block } = m.plan.residual else {
            return Err(missing_res());
        };
        let slots = o.zeros((m.layers.len().div_ceil(block) + 1) * n * m.plan.hidden_size)?;
        Ok(Carry {
            run,
            slots,
            anchors: 0,
        })
    }

    /// The same carry in `to`'s buffers (from `from`'s).
    pub fn moved<F: Ops<Buf = B>, T: Ops>(self, from: &F, to: &T) -> Result<Carry<T::Buf>> {
        Ok(Carry {
            run: to.input(from.host(&self.run)?.into_owned())?,
            slots: to.input(from.host(&self.slots)?.into_owned())?,
            anchors: self.anchors,
        })
    }
}

/// `last` into the slot after the `anchors`, then the site's mix over both.
fn mix<O: Ops>(
    o: &O,
    slots: &mut O::Buf,
    site: (&O::Buf, f32),
    anchors: usize,
    (last, n, h): (&O::Buf, usize, usize),
) -> Result<O::Buf> {
    o.put_slot(slots, anchors, last, n, h)?;
    o.attn_res(site, slots, anchors + 1, (n, h))
}

/// The layers of `span` in the Block Attention Residuals form (the equations are in the
/// module doc), anchors every `block` layers, from `carry` (see
/// [`Carry::start`]).
fn attn_res<O: Ops, S: Stack<O>>(
    m: &Decoder,
    (o, stack): (&O, &mut S),
    carry: Carry<O::Buf>,
    (n, tokens): (usize, &[u32]),
    (block, span): (usize, Span<'_, '_>),
) -> Result<Carry<O::Buf>> {
    let (h, eps, pass) = (m.plan.hidden_size, m.plan.rms_norm_eps, span.pass);
    let Carry {
        mut run,
        mut slots,
        mut anchors,
    } = carry;
    for l in span.layers {
        let layer = m.layers.get(l)?;
        let [attn, mlp] = layer
            .res
            .as_ref()
            .and_then(Sites::attn_res)
            .ok_or_else(missing_res)?;
        let u = match anchors {
            0 => None,
            _ => {
                let site = (stack.res_queries(l, &layer)?[0], attn.eps);
                Some(mix(o, &mut slots, site, anchors, (&run, n, h))?)
            }
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
        let site = (stack.res_queries(l, &layer)?[1], mlp.eps);
        let mixed = mix(o, &mut slots, site, anchors, (&p, n, h))?;
        // PILOT look-ahead (kimi-k3.md §4.5): layer l + 1's norm and router applied to the
        // AttnRes output that feeds this layer's FFN; a forecast for prefetching only.
        if pass.is_out_of_core() {
            pass.hint_next(l, &o.host(&mixed)?, n);
        }
        let xn = o.rms_norm(&mixed, stack.norms(l, &layer)[1], n, h, eps)?;
        let f = ffn(o, &layer.ffn, (pass, l), &xn, (n, tokens))?;
        run = o.add(&p, &f, n * h)?;
        stack.record(o, l, &run, h)?;
    }
    Ok(Carry { run, slots, anchors })
}

/// After the last layer: the running sum `h` and the tail mix `z` of every row.
fn attn_res_tail<O: Ops, S: Stack<O>>(
    m: &Decoder,
    (o, stack): (&O, &S),
    carry: Carry<O::Buf>,
    n: usize,
) -> Result<(O::Buf, O::Buf)> {
    let out = m
        .output_res
        .as_ref()
        .and_then(Tail::attn_res)
        .ok_or_else(missing_res)?;
    let Carry {
        run,
        mut slots,
        anchors,
    } = carry;
    let site = (stack.output_query(m)?, out.eps);
    let z = mix(o, &mut slots, site, anchors, (&run, n, m.plan.hidden_size))?;
    Ok((run, z))
}

/// The layers of `span` in DeepSeek-V4's hyper-connection form (`layers::hyper`): `n` rows of
/// `s` streams each (stream-major), each layer as [`hyper_layer`].
fn hyper<O: Ops, S: Stack<O>>(
    m: &Decoder,
    (o, stack): (&O, &mut S),
    mut streams: O::Buf,
    (n, tokens): (usize, &[u32]),
    (s, span): (usize, Span<'_, '_>),
) -> Result<O::Buf> {
    let (h, eps, pass) = (m.plan.hidden_size, m.plan.rms_norm_eps, span.pass);
    for l in span.layers {
        let layer = m.layers.get(l)?;
        let step = HyperStep {
            at: (l, &layer),
            hidden: h,
            eps,
            streams: s,
        };
        streams = hyper_layer(step, (o, &mut *stack), streams, (n, tokens), pass)?;
        stack.record(o, l, &streams, s * h)?;
    }
    Ok(streams)
}

/// One layer of the hyper-connection form: where it runs in its stack, the hidden width, the
/// norms' epsilon and the streams per row.
pub(super) struct HyperStep<'a> {
    pub at: (usize, &'a Layer),
    pub hidden: usize,
    pub eps: f32,
    pub streams: usize,
}

/// One layer over `n` rows of hyper-connection streams (the decoder's, and DeepSeek-V4's MTP
/// block's): the attention site collapses the streams into the mixer's input and expands its
/// output back; then the same around the FFN. The look-ahead prefetch sees the FFN site's
/// collapse.
pub(super) fn hyper_layer<O: Ops, S: Stack<O>>(
    step: HyperStep<'_>,
    (o, stack): (&O, &mut S),
    streams: O::Buf,
    (n, tokens): (usize, &[u32]),
    pass: &ExpertPass<'_>,
) -> Result<O::Buf> {
    let ((l, layer), h, eps, s) = (step.at, step.hidden, step.eps, step.streams);
    let Some(Sites::Hyper([attn, mlp])) = &layer.res else {
        return Err(missing_res());
    };
    let [w, u] = o.hyper_site((attn, stack.res_queries(l, layer)?[0]), &streams, (n, h))?;
    let xn = o.rms_norm(&u, stack.norms(l, layer)[0], n, h, eps)?;
    let a = stack.mixer(o, (l, layer), &xn, n)?;
    let streams = o.hyper_expand(&w, &a, streams, (n, s, h))?;
    let [w, u] = o.hyper_site((mlp, stack.res_queries(l, layer)?[1]), &streams, (n, h))?;
    if pass.is_out_of_core() {
        pass.hint_next(l, &o.host(&u)?, n);
    }
    let xn = o.rms_norm(&u, stack.norms(l, layer)[1], n, h, eps)?;
    let f = ffn(o, &layer.ffn, (pass, l), &xn, (n, tokens))?;
    o.hyper_expand(&w, &f, streams, (n, s, h))
}

/// A pass's residual stream between spans of layers: the plain stream, Block Attention
/// Residuals' carry, or the hyper-connection streams.
pub(super) enum Stream<B> {
    Plain(B),
    AttnRes(Carry<B>),
    Hyper(B),
}

impl<B> Stream<B> {
    /// The stream before layer 0: the embeddings `x` of `n` rows, in `m`'s residual form.
    pub fn start<O: Ops<Buf = B>>(o: &O, m: &Decoder, x: B, n: usize) -> Result<Self> {
        Ok(match m.plan.residual {
            Residual::AttnRes { .. } => Stream::AttnRes(Carry::start(o, m, x, n)?),
            Residual::Hyper { streams, .. } => {
                // Every stream starts as the embedding.
                let rows = o.host(&x)?;
                let h = m.plan.hidden_size;
                Stream::Hyper(o.input(rows.chunks(h).flat_map(|r| r.repeat(streams)).collect())?)
            }
            Residual::Plain => Stream::Plain(x),
        })
    }

    /// The same stream in `to`'s buffers (from `from`'s).
    pub fn moved<F: Ops<Buf = B>, T: Ops>(self, from: &F, to: &T) -> Result<Stream<T::Buf>> {
        Ok(match self {
            Stream::Plain(x) => Stream::Plain(to.input(from.host(&x)?.into_owned())?),
            Stream::AttnRes(c) => Stream::AttnRes(c.moved(from, to)?),
            Stream::Hyper(x) => Stream::Hyper(to.input(from.host(&x)?.into_owned())?),
        })
    }
}

/// The layers of `span` on one device, carrying the stream through them.
pub(super) fn layers<O: Ops, S: Stack<O>>(
    m: &Decoder,
    (o, stack): (&O, &mut S),
    stream: Stream<O::Buf>,
    rows: (usize, &[u32]),
    span: Span<'_, '_>,
) -> Result<Stream<O::Buf>> {
    match (stream, m.plan.residual) {
        (Stream::AttnRes(c), Residual::AttnRes { block }) => {
            attn_res(m, (o, stack), c, rows, (block, span)).map(Stream::AttnRes)
        }
        (Stream::Hyper(x), Residual::Hyper { streams, .. }) => {
            hyper(m, (o, stack), x, rows, (streams, span)).map(Stream::Hyper)
        }
        (Stream::Plain(x), Residual::Plain) => plain(m, (o, stack), x, rows, span).map(Stream::Plain),
        _ => Err(missing_res()),
    }
}

/// The stream after the last layer: every row's hidden state (with hyper-connections, the
/// head's collapse of its streams), and with Block Attention Residuals the tail mix `z` that
/// the rows given logits take instead.
pub(super) fn finish<O: Ops, S: Stack<O>>(
    m: &Decoder,
    (o, stack): (&O, &S),
    stream: Stream<O::Buf>,
    n: usize,
) -> Result<(O::Buf, Option<O::Buf>)> {
    match stream {
        Stream::Plain(x) => Ok((x, None)),
        Stream::AttnRes(c) => attn_res_tail(m, (o, stack), c, n).map(|(run, z)| (run, Some(z))),
        Stream::Hyper(x) => {
            let Some(Tail::Hyper(head)) = &m.output_res else {
                return Err(missing_res());
            };
            let proj = stack.output_query(m)?;
            Ok((o.hyper_head((head, proj), &x, (n, m.plan.hidden_size))?, None))
        }
    }
}

/// Every layer of `m` on one device in one pass over its routed experts: the final stream (see
/// [`finish`]).
pub(super) fn whole<O: Ops, S: Stack<O>>(
    m: &Decoder,
    (o, stack): (&O, &mut S),
    x: O::Buf,
    (n, tokens): (usize, &[u32]),
) -> Result<(O::Buf, Option<O::Buf>)> {
    let pass = ExpertPass::open(m.experts.as_deref()).with_tokens(tokens);
    let stream = Stream::start(o, m, x, n)?;
    let span = Span {
        layers: 0..m.layers.len(),
        pass: &pass,
    };
    let stream = layers(m, (o, stack), stream, (n, tokens), span)?;
    pass.finish()?;
    finish(m, (o, &*stack), stream, n)
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
