//! The decoder's hyper-connection form (DeepSeek-V4's mHC, `layers::hyper`): the residual is
//! `streams` copies of the hidden width per row, starting as copies of the embedding. Layer
//! `ℓ`, per row: the attention site's weights collapse the streams into the mixer's input
//! (`RMSNorm_in` of it), the mixer's output is expanded back (`post`, `comb`); then the same
//! around the FFN. Tail: the hyper head collapses the streams, and the shared pass normalises
//! and projects the logit rows. Traced tensors: `layers.{ℓ}` are the streams (stream-major,
//! `streams · hidden` per row, as HF's decoder layer returns them). The loop itself is the
//! decoder's written-once `stack::hyper`; this module keeps V4's cache sizes and the MTP
//! block's single layer.

use super::super::layers::compressed::AttentionKind;
use super::super::layers::ops::Host;
use super::super::{RowPlan, SeqInput};
use super::stack::{self, HyperStep};
use super::{HostStack, V4Plan};
use crate::cache::ExpertPass;
use crate::error::Result;
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

/// One decoder layer over hyper-connection streams, on the host (DeepSeek-V4's MTP block; the
/// decoder's own layers run in `stack::hyper`).
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
        let n = plan.len();
        let step = HyperStep {
            at: (l, self.layer),
            hidden: self.hidden,
            eps: self.eps,
            streams: streams.len() / (n * self.hidden).max(1),
        };
        let mut stack = HostStack::new(batch, plan, None);
        let out = stack::hyper_layer(step, (&Host, &mut stack), streams.to_vec(), (n, tokens), pass)?;
        streams.copy_from_slice(&out);
        Ok(())
    }
}
