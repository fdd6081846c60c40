//! Recurrent-state checkpoints: copies of every KDA layer's committed state (convolution
//! history and delta-rule matrix) at chosen positions of a sequence, so a state holding a long
//! prompt can be rewound to a position inside it. Attention caches only append and are simply
//! truncated; a recurrent state cannot be rewound, so a prompt that shares only a prefix with a
//! cached one (two agents with the same system prompt and tools) could otherwise not reuse it on
//! K3 or Kimi-Linear.
//!
//! A checkpoint is taken where the state is already committed (the end of a prefill chunk): it
//! shares the committed recurrent matrix (the next pass writes a new one), so it costs one
//! state's memory and no copy or extra compute. Restoring it gives exactly the
//! state of having run the first `position` tokens, so a reused prefix is bit-identical to
//! recomputing it.
//!
//! DeepSeek-V4's compressed attention caches only their sliding window and open windows
//! ([`super::CompressedCache`]), so a state rewinds into its history only to a checkpoint too:
//! the checkpoint shares those blocks as they were (the compressed entries are kept whole and
//! simply truncated).
//!
//! The number kept per sequence is bounded; [`thin`] (pure) chooses which one to drop so the
//! survivors stay spread over the prompt (the largest gap left after a rewind stays small).

use std::sync::Arc;

use super::paged::Paged;

/// The recurrent state of every KDA layer and the window parts of every compressed layer (in
/// layer order) after the first `position` tokens.
#[derive(Debug)]
pub(crate) struct Checkpoint {
    pub position: usize,
    /// `(convolution history, delta-rule state)` per KDA layer; the matrices are shared.
    pub layers: Vec<(Vec<f32>, Arc<[f32]>)>,
    /// `[kv, compressor inputs, indexer inputs]` per compressed layer; the blocks are shared.
    pub windows: Vec<[Paged; 3]>,
}

impl Checkpoint {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let windows: usize = self.windows.iter().flatten().map(Paged::bytes).sum();
        windows
            + self
                .layers
                .iter()
                .map(|(c, r)| 4 * (c.len() + r.len()))
                .sum::<usize>()
    }

    /// Each allocation's identity and bytes (the convolution histories as one, by the
    /// checkpoint's own address: clones of a state share the checkpoint; blocks by theirs).
    pub fn for_each_allocation(&self, f: &mut dyn FnMut(usize, usize)) {
        let conv = self.layers.iter().map(|(c, _)| 4 * c.len()).sum();
        f(self as *const Checkpoint as usize, conv);
        for (_, r) in &self.layers {
            f(r.as_ptr() as usize, 4 * r.len());
        }
        self.windows.iter().flatten().for_each(|p| p.for_each_block(f));
    }
}

/// Which of the checkpoints at `positions` (strictly increasing) to drop so that at most `max`
/// remain, one at a time: the one whose removal leaves the smallest merged gap between its
/// neighbours (the gap before the first is measured from position 0). The newest checkpoint is
/// never dropped while another can be, since a conversation most often continues from where the
/// prompt ended. `None` when nothing needs dropping.
pub(crate) fn thin(positions: &[usize], max: usize) -> Option<usize> {
    if positions.len() <= max || positions.is_empty() {
        return None;
    }
    if positions.len() == 1 {
        return Some(0);
    }
    let last = positions.len() - 1;
    (0..last).min_by_key(|&i| {
        let before = if i == 0 { 0 } else { positions[i - 1] };
        (positions[i + 1] - before, i)
    })
}

/// Index of the checkpoint with the largest position `<= len`, if any.
pub(crate) fn at_or_before(positions: &[usize], len: usize) -> Option<usize> {
    positions.iter().rposition(|&p| p <= len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Add checkpoints at `every` multiples up to `end`, thinning to `max` after each.
    fn keep(every: usize, end: usize, max: usize) -> Vec<usize> {
        let mut kept = Vec::new();
        for p in (every..=end).step_by(every) {
            kept.push(p);
            while let Some(i) = thin(&kept, max) {
                kept.remove(i);
            }
        }
        kept
    }

    #[test]
    fn nothing_is_dropped_within_the_bound() {
        assert_eq!(thin(&[], 0), None);
        assert_eq!(thin(&[5, 9], 2), None);
        assert_eq!(thin(&[5], 0), Some(0));
    }

    #[test]
    fn the_newest_is_kept_and_the_closest_pair_merges() {
        // Merged gap if dropped: 0 -> 10 (0..10), 1 -> 98 (2..100), 2 -> 91 (10..101).
        assert_eq!(thin(&[2, 10, 100, 101], 3), Some(0));
        // 0 -> 52, 1 -> 50 (50..100), 2 -> 49 (52..101).
        assert_eq!(thin(&[50, 52, 100, 101], 3), Some(2));
        assert_eq!(thin(&[50, 60], 1), Some(0));
    }

    #[test]
    fn survivors_stay_spread_over_a_long_prompt() {
        // A 12k prompt in chunks of 256 with 16 checkpoints kept: no gap much above 12k / 16.
        let kept = keep(256, 12_288, 16);
        assert_eq!(kept.len(), 16);
        assert_eq!(*kept.last().unwrap(), 12_288, "the newest survives");
        let mut prev = 0;
        for &p in &kept {
            assert!(
                p - prev <= 2 * 12_288 / 16,
                "gap {} before {p}: {kept:?}",
                p - prev
            );
            prev = p;
        }
    }

    #[test]
    fn lookup_finds_the_latest_at_or_before() {
        let p = [256, 512, 1024];
        assert_eq!(at_or_before(&p, 100), None);
        assert_eq!(at_or_before(&p, 512), Some(1));
        assert_eq!(at_or_before(&p, 1000), Some(1));
        assert_eq!(at_or_before(&p, 9999), Some(2));
    }
}
