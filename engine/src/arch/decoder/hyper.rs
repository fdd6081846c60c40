//! The decoder's hyper-connection form (DeepSeek-V4's mHC, `layers::hyper`): the residual is
//! `streams` copies of the hidden width per row, starting as copies of the embedding. Layer
//! `ℓ`, per row: the attention site's weights collapse the streams into the mixer's input
//! (`RMSNorm_in` of it), the mixer's output is expanded back (`post`, `comb`); then the same
//! around the FFN. Tail: the hyper head collapses the streams, and the shared pass normalises
//! and projects the logit rows. Traced tensors: `layers.{ℓ}` are the streams (stream-major,
//! `streams · hidden` per row, as HF's decoder layer returns them).

use super::super::layers::compressed::AttentionKind;
use super::super::layers::dsa::Selection;
use super::super::layers::hyper::{HyperSite, HyperWeights, collapse, expand};
use super::super::layers::ops::Host;
use super::super::{RowPlan, SeqInput, Trace};
use super::{Decoder, Sites, Tail, V4Plan, missing_res, row_tokens, run_mixer, stack};
use crate::cache::ExpertPass;
use crate::error::Result;
use crate::kernels::ops::rms_norm_rows;
use crate::state::BLOCK_POSITIONS;

/// Bytes a DeepSeek-V4 layer of `kind` holds (f32, see `CompressedCache`): per position, its
/// compressed entries (and indexer keys), one per `ratio` positions, rounded up; per sequence,
/// the kv of the sliding window and the compressor inputs of the open windows, in whole blocks
/// (what a committed state holds; a pass also holds its own rows until it commits).
pub(super) fn cache_bytes(v: &V4Plan, kind: AttentionKind) -> (usize, usize) {
    let (hd, id) = (4 * v.dims.head_dim, 4 * v.indexer.head_dim);
    let held = |positions: usize| (positions.div_ceil(BLOCK_POSITIONS) + 1) * BLOCK_POSITIONS;
    let window = hd * held(v.dims.window);
    match kind {
        AttentionKind::Sliding => (0, window),
        // Two series of kv and gate, for the compressor and for the indexer.
        AttentionKind::Sparse { ratio } => (
            hd.div_ceil(ratio) + id.div_ceil(ratio),
            window + (4 * hd + 4 * id) * held(2 * ratio),
        ),
        AttentionKind::Heavy { ratio } => (hd.div_ceil(ratio), window + 2 * hd * held(2 * ratio)),
    }
}

/// Per row: the site's weights and the collapsed input.
fn collapse_rows(site: &HyperSite, streams: &[f32], n: usize, h: usize) -> (Vec<HyperWeights>, Vec<f32>) {
    let width = streams.len() / n.max(1);
    let mut out = vec![0.0f32; n * h];
    let weights = streams
        .chunks(width)
        .zip(out.chunks_mut(h))
        .map(|(x, o)| {
            let w = site.weights(x);
            collapse(&w.pre, x, o);
            w
        })
        .collect();
    (weights, out)
}

fn expand_rows(weights: &[HyperWeights], y: &[f32], streams: &mut [f32], h: usize) {
    let width = streams.len() / weights.len().max(1);
    for ((w, y), x) in weights.iter().zip(y.chunks(h)).zip(streams.chunks_mut(width)) {
        expand(w, y, x);
    }
}

/// One decoder layer over hyper-connection streams (the decoder's and DeepSeek-V4's MTP
/// block's).
pub(super) struct StreamLayer<'a> {
    pub layer: &'a super::Layer,
    pub eps: f32,
    pub hidden: usize,
}

impl StreamLayer<'_> {
    /// The layer over the `n` rows of `streams` (in place), layer `l` of the rows' states, its
    /// routed experts from `pass`.
    pub(super) fn run(
        &self,
        batch: &mut [SeqInput<'_>],
        (plan, l): (&RowPlan, usize),
        tokens: &[u32],
        pass: &ExpertPass<'_>,
        streams: &mut [f32],
    ) -> Result<()> {
        let (h, n, layer) = (self.hidden, plan.len(), self.layer);
        let Some(Sites::Hyper([attn_site, ffn_site])) = &layer.res else {
            return Err(missing_res());
        };
        let norm = |x: &[f32], w: &[f32]| rms_norm_rows(x, w, self.eps, h);
        let (weights, u) = collapse_rows(attn_site, streams, n, h);
        let a = run_mixer(
            &layer.mixer,
            &norm(&u, &layer.input_norm),
            batch,
            (plan, l),
            &mut Selection::new(),
        );
        expand_rows(&weights, &a, streams, h);
        let (weights, m) = collapse_rows(ffn_site, streams, n, h);
        pass.hint_next(l, &m, n);
        let f = stack::ffn(
            &Host,
            &layer.ffn,
            (pass, l),
            &norm(&m, &layer.post_norm),
            (n, tokens),
        )?;
        expand_rows(&weights, &f, streams, h);
        Ok(())
    }
}

impl Decoder {
    /// Every layer over the embedding rows `x` as hyper-connection streams; then each row of
    /// `x` becomes the head's collapse, which the shared pass normalises and projects. On error
    /// the caller rolls the states back.
    pub(super) fn hyper_layers(
        &self,
        batch: &mut [SeqInput<'_>],
        plan: &RowPlan,
        x: &mut [f32],
        mut trace: Option<&mut Trace>,
        n_streams: usize,
    ) -> Result<()> {
        let h = self.plan.hidden_size;
        let Some(Tail::Hyper(head)) = &self.output_res else {
            return Err(missing_res());
        };
        let tokens = row_tokens(batch);
        let mut streams: Vec<f32> = x.chunks(h).flat_map(|row| row.repeat(n_streams)).collect();
        let pass = ExpertPass::open(self.experts.as_deref()).with_tokens(&tokens);
        for l in 0..self.layers.len() {
            let layer = self.layers.get(l)?;
            let step = StreamLayer {
                layer: &layer,
                eps: self.plan.rms_norm_eps,
                hidden: h,
            };
            step.run(batch, (plan, l), &tokens, &pass, &mut streams)?;
            if let Some(t) = trace.as_deref_mut() {
                t.record_rows(format!("layers.{l}"), &streams, n_streams * h);
            }
        }
        pass.finish()?;
        let width = n_streams * h;
        for (row, s) in x.chunks_mut(h).zip(streams.chunks(width)) {
            head.collapse(s, row);
        }
        Ok(())
    }
}
