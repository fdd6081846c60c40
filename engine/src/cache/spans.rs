//! Read layouts: a group of tensors (one expert, one spine layer, the resident set) becomes a
//! list of aligned file segments read into one buffer, and each tensor's place in that buffer.
//! Pure planning, no I/O.

use std::collections::HashMap;

use super::buffer::{align_down, align_up};
use crate::weights::TensorInfo;

/// Tensors closer than this in a file are read with one request (the gap is read and ignored).
pub const MERGE_GAP: u64 = 256 * 1024;

/// One aligned file range read into a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Shard number.
    pub shard: usize,
    /// Aligned file offset.
    pub offset: u64,
    /// Aligned length.
    pub len: usize,
    /// Aligned offset in the destination buffer.
    pub dest: usize,
}

/// Where a group of tensors is read from and where each lands.
#[derive(Debug, Clone, Default)]
pub struct SpanLayout {
    pub segments: Vec<Segment>,
    /// Buffer bytes needed (aligned).
    pub total: usize,
    /// Tensor bytes proper (without alignment padding and merged gaps).
    pub payload: u64,
    /// `(shard, file offset)` of a tensor -> `(buffer offset, len)`.
    places: HashMap<(usize, u64), (usize, usize)>,
}

impl SpanLayout {
    /// Lay out `tensors` (duplicates allowed): sorted by shard and offset, merged when closer
    /// than `merge_gap`, each segment aligned.
    pub fn new(tensors: &[TensorInfo], merge_gap: u64) -> SpanLayout {
        let mut ranges: Vec<(usize, u64, u64)> = tensors
            .iter()
            .map(|t| (t.shard, t.offset, t.offset + t.len))
            .collect();
        ranges.sort_unstable();
        ranges.dedup();
        let mut layout = SpanLayout::default();
        let mut groups: Vec<(usize, u64, u64)> = Vec::new();
        for &(shard, start, end) in &ranges {
            match groups.last_mut() {
                Some(g) if g.0 == shard && start <= g.2 + merge_gap => g.2 = g.2.max(end),
                _ => groups.push((shard, start, end)),
            }
        }
        let mut dest = 0usize;
        for (shard, start, end) in groups {
            let offset = align_down(start);
            let len = (align_up(end) - offset) as usize;
            layout.segments.push(Segment {
                shard,
                offset,
                len,
                dest,
            });
            dest += len;
        }
        layout.total = dest;
        for &(shard, start, end) in &ranges {
            let seg = layout
                .segments
                .iter()
                .find(|s| s.shard == shard && s.offset <= start && end <= s.offset + s.len as u64)
                .expect("every range lies in its merged segment");
            layout.places.insert(
                (shard, start),
                (seg.dest + (start - seg.offset) as usize, (end - start) as usize),
            );
            layout.payload += end - start;
        }
        layout
    }

    /// Buffer range of a tensor, if it belongs to this layout.
    pub fn place(&self, info: &TensorInfo) -> Option<std::ops::Range<usize>> {
        let &(at, len) = self.places.get(&(info.shard, info.offset))?;
        (len as u64 == info.len).then_some(at..at + len)
    }

    /// The exact byte ranges of this layout's tensors, per shard, adjacent ones merged, sorted:
    /// what must be local before the layout is read (alignment padding and merged gaps are read
    /// too but never used, so they need not be).
    pub fn tensor_ranges(&self) -> Vec<(usize, std::ops::Range<u64>)> {
        let mut ranges: Vec<(usize, u64, u64)> = self
            .places
            .iter()
            .map(|(&(shard, start), &(_, len))| (shard, start, start + len as u64))
            .collect();
        ranges.sort_unstable();
        let mut out: Vec<(usize, std::ops::Range<u64>)> = Vec::new();
        for (shard, start, end) in ranges {
            match out.last_mut() {
                Some((s, r)) if *s == shard && start <= r.end => r.end = r.end.max(end),
                _ => out.push((shard, start..end)),
            }
        }
        out
    }

    /// Bytes read from files (aligned segments).
    pub fn read_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Dtype;

    fn t(shard: usize, offset: u64, len: u64) -> TensorInfo {
        TensorInfo {
            name: format!("t{shard}.{offset}"),
            dtype: Dtype::U8,
            shape: vec![len as usize],
            shard,
            offset,
            len,
        }
    }

    #[test]
    fn adjacent_tensors_become_one_aligned_segment() {
        let l = SpanLayout::new(&[t(0, 5000, 3000), t(0, 8000, 100), t(0, 100, 10)], 0);
        // 100..110 is far from 5000 only with gap 0: 110 -> 5000 needs a gap of 4890.
        assert_eq!(l.segments.len(), 2);
        assert_eq!(
            l.segments[0],
            Segment {
                shard: 0,
                offset: 0,
                len: 4096,
                dest: 0
            }
        );
        assert_eq!(
            l.segments[1],
            Segment {
                shard: 0,
                offset: 4096,
                len: 4096,
                dest: 4096
            }
        );
        assert_eq!(l.place(&t(0, 5000, 3000)), Some(4096 + 904..4096 + 904 + 3000));
        assert_eq!(l.place(&t(0, 8000, 100)), Some(4096 + 3904..4096 + 4004));
        assert_eq!(l.place(&t(0, 100, 10)), Some(100..110));
        assert_eq!(l.payload, 3110);
        assert_eq!(l.total, 8192);
    }

    #[test]
    fn tensor_ranges_are_exact_and_merge_only_touching_tensors() {
        let l = SpanLayout::new(
            &[t(0, 5000, 3000), t(0, 8000, 100), t(0, 100, 10), t(1, 0, 10)],
            MERGE_GAP,
        );
        assert_eq!(
            l.tensor_ranges(),
            vec![(0, 100..110), (0, 5000..8100), (1, 0..10)]
        );
    }

    #[test]
    fn gaps_merge_and_shards_stay_apart() {
        let l = SpanLayout::new(&[t(0, 0, 10), t(0, 20_000, 10), t(1, 0, 10)], MERGE_GAP);
        assert_eq!(l.segments.len(), 2);
        assert_eq!(l.segments[0].len, 20480);
        assert_eq!(l.segments[1].shard, 1);
        assert_eq!(l.place(&t(1, 0, 10)), Some(20480..20490));
        assert_eq!(
            l.place(&t(1, 0, 11)),
            None,
            "a length mismatch is not this tensor"
        );
    }
}
