//! Byte-range bookkeeping (pure): a set of disjoint half-open ranges ([`RangeSet`]) recording which
//! bytes of a staged file are durably present, and the planning functions that turn "what is
//! wanted" minus "what is present" into bounded chunks for parallel range requests.

use std::ops::Range;

use serde::{Deserialize, Serialize};

/// Disjoint, sorted, non-adjacent half-open byte ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RangeSet {
    ranges: Vec<(u64, u64)>,
}

impl RangeSet {
    /// The empty set.
    pub fn new() -> Self {
        RangeSet::default()
    }

    /// The set holding exactly `r`.
    pub fn from_range(r: Range<u64>) -> Self {
        let mut s = RangeSet::new();
        s.insert(r);
        s
    }

    /// Build from unsorted, possibly overlapping ranges (empty ones are dropped).
    pub fn from_ranges(it: impl IntoIterator<Item = Range<u64>>) -> Self {
        let mut s = RangeSet::new();
        for r in it {
            s.insert(r);
        }
        s
    }

    /// Whether the ranges are sorted, disjoint, non-adjacent and non-empty (for loaded sidecars).
    pub fn is_normalized(&self) -> bool {
        self.ranges.iter().all(|&(a, b)| a < b) && self.ranges.windows(2).all(|w| w[0].1 < w[1].0)
    }

    /// Add `r`, merging with overlapping or adjacent ranges.
    pub fn insert(&mut self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        let (mut start, mut end) = (r.start, r.end);
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        let mut placed = false;
        for &(a, b) in &self.ranges {
            if b < start {
                out.push((a, b));
            } else if a > end {
                if !placed {
                    out.push((start, end));
                    placed = true;
                }
                out.push((a, b));
            } else {
                start = start.min(a);
                end = end.max(b);
            }
        }
        if !placed {
            out.push((start, end));
        }
        self.ranges = out;
    }

    /// Whether every byte of `r` is in the set (an empty `r` is always covered).
    pub fn covers(&self, r: &Range<u64>) -> bool {
        r.start >= r.end || self.ranges.iter().any(|&(a, b)| a <= r.start && r.end <= b)
    }

    /// Total bytes in the set.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|&(a, b)| b - a).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.ranges.iter().map(|&(a, b)| a..b)
    }

    /// The parts of `self` not in `other`.
    pub fn minus(&self, other: &RangeSet) -> RangeSet {
        let mut out = Vec::new();
        for &(a, b) in &self.ranges {
            let mut cur = a;
            for &(c, d) in &other.ranges {
                if d <= cur || c >= b {
                    continue;
                }
                if c > cur {
                    out.push((cur, c));
                }
                cur = cur.max(d);
                if cur >= b {
                    break;
                }
            }
            if cur < b {
                out.push((cur, b));
            }
        }
        RangeSet { ranges: out }
    }

    /// Bytes of `r` that are in the set.
    pub fn overlap(&self, r: &Range<u64>) -> u64 {
        self.ranges
            .iter()
            .map(|&(a, b)| b.min(r.end).saturating_sub(a.max(r.start)))
            .sum()
    }
}

/// Split every range of `todo` into pieces of at most `chunk` bytes (chunk 0 means unbounded).
pub fn plan_chunks(todo: &RangeSet, chunk: u64) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    for r in todo.iter() {
        if chunk == 0 {
            out.push(r);
            continue;
        }
        let mut s = r.start;
        while s < r.end {
            let e = (s + chunk).min(r.end);
            out.push(s..e);
            s = e;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &RangeSet) -> Vec<(u64, u64)> {
        s.iter().map(|r| (r.start, r.end)).collect()
    }

    #[test]
    fn insert_merges_overlaps_and_neighbours() {
        let mut s = RangeSet::new();
        s.insert(10..20);
        s.insert(30..40);
        s.insert(20..25);
        assert_eq!(v(&s), vec![(10, 25), (30, 40)]);
        s.insert(0..5);
        s.insert(24..31);
        assert_eq!(v(&s), vec![(0, 5), (10, 40)]);
        s.insert(7..7);
        assert_eq!(s.len(), 35);
        assert!(s.is_normalized());
    }

    #[test]
    fn covers_and_overlap() {
        let s = RangeSet::from_ranges([0..10, 20..30]);
        assert!(s.covers(&(2..10)));
        assert!(!s.covers(&(5..21)));
        assert!(s.covers(&(15..15)));
        assert_eq!(s.overlap(&(5..25)), 10);
    }

    #[test]
    fn minus_cuts_holes() {
        let want = RangeSet::from_range(0..100);
        let have = RangeSet::from_ranges([0..10, 20..30, 90..120]);
        assert_eq!(v(&want.minus(&have)), vec![(10, 20), (30, 90)]);
        assert_eq!(want.minus(&RangeSet::from_range(0..100)).len(), 0);
        assert_eq!(v(&RangeSet::new().minus(&have)), vec![]);
    }

    #[test]
    fn chunks_are_bounded_and_cover_everything() {
        let todo = RangeSet::from_ranges([0..25, 40..41]);
        let c = plan_chunks(&todo, 10);
        assert_eq!(c, vec![0..10, 10..20, 20..25, 40..41]);
        assert_eq!(plan_chunks(&todo, 0), vec![0..25, 40..41]);
    }

    #[test]
    fn normalized_check_rejects_bad_sidecars() {
        let bad: RangeSet = serde_json::from_str("[[5,3]]").unwrap();
        assert!(!bad.is_normalized());
        let bad: RangeSet = serde_json::from_str("[[0,5],[5,9]]").unwrap();
        assert!(!bad.is_normalized());
        let ok: RangeSet = serde_json::from_str("[[0,5],[6,9]]").unwrap();
        assert!(ok.is_normalized());
    }
}
