//! Lock-free histograms written by hot paths (the engine loop, reader completions) and read as
//! snapshots by whoever exports metrics. Bucket bounds live beside each use as a constant array;
//! the histogram only counts.

use std::sync::atomic::{AtomicU64, Ordering};

/// A histogram of `N` buckets written without locking.
#[derive(Debug)]
pub struct AtomicHistogram<const N: usize> {
    /// Observations per bucket (not cumulative); values above the last bound are only counted.
    buckets: [AtomicU64; N],
    count: AtomicU64,
    /// Sum of the observed values, in millionths.
    sum_micros: AtomicU64,
}

impl<const N: usize> Default for AtomicHistogram<N> {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }
}

impl<const N: usize> AtomicHistogram<N> {
    /// Count `v` in the first bucket whose upper bound is at least `v`.
    pub fn observe(&self, bounds: &[f64; N], v: f64) {
        if let Some(i) = bounds.iter().position(|&b| v <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((v * 1e6).round() as u64, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> HistogramSnapshot<N> {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            count: self.count.load(Ordering::Relaxed),
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
        }
    }
}

/// A point-in-time copy of one histogram (bounds: the matching `*_BOUNDS` constant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistogramSnapshot<const N: usize = 10> {
    /// Observations per bucket, not cumulative.
    pub buckets: [u64; N],
    pub count: u64,
    /// Sum of the observations, in millionths.
    pub sum_micros: u64,
}

impl<const N: usize> Default for HistogramSnapshot<N> {
    fn default() -> Self {
        Self {
            buckets: [0; N],
            count: 0,
            sum_micros: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_that_holds_them() {
        let bounds = [0.1, 1.0, 10.0];
        let h = AtomicHistogram::<3>::default();
        for v in [0.05, 0.1, 0.5, 20.0] {
            h.observe(&bounds, v);
        }
        let s = h.snapshot();
        assert_eq!(s.buckets, [2, 1, 0]);
        assert_eq!(s.count, 4);
        assert_eq!(s.sum_micros, 20_650_000);
    }
}
