//! Prefetch planning (pure): which experts of the *next* MoE layer to read ahead, from two
//! predictors — that layer's router applied to the current hidden state ("look-ahead") and the
//! previous pass's routes at that layer — and a per-layer gate that stops speculating where a
//! predictor has been useless.

use std::collections::BTreeSet;

/// Order the union of several rows' look-ahead routes: by summed routing weight, highest first
/// (ties by expert id).
pub fn rank_lookahead(routes: &[Vec<(usize, f32)>]) -> Vec<usize> {
    let mut score: Vec<(usize, f32)> = Vec::new();
    for route in routes {
        for &(e, w) in route {
            match score.iter_mut().find(|(x, _)| *x == e) {
                Some(s) => s.1 += w,
                None => score.push((e, w)),
            }
        }
    }
    score.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    score.into_iter().map(|(e, _)| e).collect()
}

/// The prefetch list: look-ahead experts first, then the previous pass's, skipping those
/// already cached or being read, at most `max` (the slots the prefetcher may claim).
pub fn plan_prefetch(
    lookahead: &[usize],
    previous: &[usize],
    present: impl Fn(usize) -> bool,
    max: usize,
) -> Vec<usize> {
    let mut seen = BTreeSet::new();
    lookahead
        .iter()
        .chain(previous)
        .copied()
        .filter(|&e| seen.insert(e) && !present(e))
        .take(max)
        .collect()
}

/// Recall of a predicted set against the experts actually selected.
pub fn recall(predicted: &[usize], actual: &[usize]) -> f32 {
    if actual.is_empty() {
        return 1.0;
    }
    actual.iter().filter(|e| predicted.contains(e)).count() as f32 / actual.len() as f32
}

/// Precision a look-ahead rank needs before its expert is read ahead.
pub const RANK_PRECISION: f32 = 0.9;

/// How often each rank of look-ahead forecasts was right (exponential moving
/// averages), and the confident prefix of a forecast. The top ranks of a forecast are almost
/// always selected; the last ones, near the router's top-k boundary, often are not (dsv3-bench,
/// uniform routing: ranks 1-5 0.98-1.0, then 0.91, 0.84, 0.66). A wrong read ahead costs its
/// bytes and a slot, while a right one only hides a read that would happen anyway, so ranks
/// right less than [`RANK_PRECISION`] of the time are left to demand reads (dsv3-bench under
/// 2, 4 and 8 GiB cgroup limits: bytes read over the ideal 1.10/1.18/1.13 -> 1.04/1.12/1.06 at
/// 0.9, 1.06/1.13/1.08 at 0.8, decode tok/s unchanged or up 1-4 %). A forecast of several
/// rows is their routes' ranked union, scored against the layer's union; the store keeps one
/// of these per bucket of row counts, since a union's ranks differ with its size (bench serve's
/// default model under 110M: disk bytes per token at 2 streams 28.3 -> 21.2 MiB once multi-row
/// forecasts were pruned too).
#[derive(Debug, Clone)]
pub struct RankPrecision {
    alpha: f32,
    warmup: u32,
    ema: Vec<f32>,
    samples: Vec<u32>,
}

impl RankPrecision {
    pub fn new(alpha: f32, warmup: u32) -> Self {
        RankPrecision {
            alpha,
            warmup,
            ema: Vec::new(),
            samples: Vec::new(),
        }
    }

    /// Score each rank of a `forecast` against the experts actually selected.
    pub fn observe(&mut self, forecast: &[usize], actual: &[usize]) {
        if self.ema.len() < forecast.len() {
            self.ema.resize(forecast.len(), 0.0);
            self.samples.resize(forecast.len(), 0);
        }
        for (rank, e) in forecast.iter().enumerate() {
            let hit = if actual.contains(e) { 1.0 } else { 0.0 };
            let (ema, n) = (&mut self.ema[rank], &mut self.samples[rank]);
            *ema = if *n == 0 {
                hit
            } else {
                (1.0 - self.alpha) * *ema + self.alpha * hit
            };
            *n += 1;
        }
    }

    /// The leading ranks of `forecast` worth reading ahead: up to the first whose precision,
    /// once it has `warmup` samples, is below `min`.
    pub fn confident<'a>(&self, forecast: &'a [usize], min: f32) -> &'a [usize] {
        let keep = (0..forecast.len())
            .position(|r| {
                let n = self.samples.get(r).copied().unwrap_or(0);
                n >= self.warmup && self.ema[r] < min
            })
            .unwrap_or(forecast.len());
        &forecast[..keep]
    }

    /// The precision average of `rank` (0 before its first sample).
    pub fn precision(&self, rank: usize) -> f32 {
        self.ema.get(rank).copied().unwrap_or(0.0)
    }
}

/// Recall the weaker predictor needs before its experts are read too.
pub const SECONDARY_RECALL: f32 = 0.3;

/// Precision the previous pass's selection needs before it is read ahead for the next: the
/// share of it the layer selects again. Under a batch of rows the previous pass's union is
/// large and only partly selected again (bench serve's default model at 4 and 8 streams, 110M:
/// 1.5-1.6x the disk bytes per token of no prefetch at all, while the look-ahead alone read
/// 1.03-1.07x); a list that is mostly wrong costs its reads and the slots it evicts.
pub const PREVIOUS_PRECISION: f32 = 0.9;

/// Per-layer exponential moving averages of each predictor's recall (and of the previous pass's
/// precision); speculation at a layer stops while the better predictor's average is below
/// `threshold` (after `warmup` samples), and resumes when it recovers (scoring continues either
/// way).
#[derive(Debug, Clone)]
pub struct RecallGate {
    alpha: f32,
    threshold: f32,
    warmup: u32,
    lookahead: Vec<f32>,
    previous: Vec<f32>,
    previous_precision: Vec<f32>,
    samples: Vec<u32>,
}

impl RecallGate {
    pub fn new(layers: usize, alpha: f32, threshold: f32, warmup: u32) -> Self {
        RecallGate {
            alpha,
            threshold,
            warmup,
            lookahead: vec![0.0; layers],
            previous: vec![0.0; layers],
            previous_precision: vec![0.0; layers],
            samples: vec![0; layers],
        }
    }

    /// Score both predictors for `layer` against its actual selection.
    pub fn observe(&mut self, layer: usize, lookahead: &[usize], previous: &[usize], actual: &[usize]) {
        let a = self.alpha;
        let first = self.samples[layer] == 0;
        let upd = |ema: &mut f32, r: f32| *ema = if first { r } else { (1.0 - a) * *ema + a * r };
        upd(&mut self.lookahead[layer], recall(lookahead, actual));
        upd(&mut self.previous[layer], recall(previous, actual));
        // Precision is the recall of the other direction.
        upd(&mut self.previous_precision[layer], recall(actual, previous));
        self.samples[layer] += 1;
    }

    /// Whether to prefetch for `layer`.
    pub fn allow(&self, layer: usize) -> bool {
        self.samples[layer] < self.warmup || self.lookahead[layer].max(self.previous[layer]) >= self.threshold
    }

    /// Which predictors to follow at `layer`: `(look-ahead, previous pass)`. Warming up: the
    /// look-ahead only. Then each predictor whose recall clears the threshold, the weaker one
    /// only if it also clears [`SECONDARY_RECALL`] (reading a second, mostly wrong list of
    /// experts costs more than the hits it adds), and the previous pass only while its
    /// precision clears [`PREVIOUS_PRECISION`] (the look-ahead's ranks are pruned by their own
    /// precision, [`RankPrecision`]).
    pub fn predictors(&self, layer: usize) -> (bool, bool) {
        if self.samples[layer] < self.warmup {
            return (true, false);
        }
        let (la, prev) = (self.lookahead[layer], self.previous[layer]);
        let ok = |r: f32, other: f32| r >= self.threshold && (r >= other || r >= SECONDARY_RECALL);
        let precise = self.previous_precision[layer] >= PREVIOUS_PRECISION;
        (ok(la, prev), ok(prev, la) && precise)
    }

    /// `(look-ahead, previous-pass)` recall averages of `layer`.
    pub fn recalls(&self, layer: usize) -> (f32, f32) {
        (self.lookahead[layer], self.previous[layer])
    }
}

/// Buckets of forecast row counts with their own rank precision: 1, 2, 3-4, 5-8, more.
pub const ROWS_BUCKETS: usize = 5;

/// The rank-statistics bucket of a forecast made from `rows` rows.
pub fn rows_bucket(rows: usize) -> usize {
    match rows {
        0 | 1 => 0,
        2 => 1,
        3..=4 => 2,
        5..=8 => 3,
        _ => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookahead_ranks_by_summed_weight() {
        let routes = vec![vec![(3, 0.5), (1, 0.2)], vec![(1, 0.4), (7, 0.1)]];
        assert_eq!(rank_lookahead(&routes), vec![1, 3, 7]);
    }

    #[test]
    fn plan_skips_present_dedups_and_caps() {
        let p = plan_prefetch(&[4, 2, 9], &[2, 5, 6], |e| e == 9, 4);
        assert_eq!(p, vec![4, 2, 5, 6]);
        assert_eq!(plan_prefetch(&[4, 2], &[5], |_| false, 2), vec![4, 2]);
        assert!(plan_prefetch(&[1], &[], |_| true, 8).is_empty());
    }

    #[test]
    fn unreliable_last_ranks_are_not_read_ahead_once_measured() {
        let mut p = RankPrecision::new(0.5, 2);
        let forecast = [4, 7, 9];
        assert_eq!(p.confident(&forecast, 0.8), &forecast, "no samples yet");
        p.observe(&forecast, &[4, 7, 1]);
        assert_eq!(p.confident(&forecast, 0.8), &forecast, "still warming up");
        p.observe(&[5, 6, 8], &[5, 6, 2]);
        assert_eq!(p.precision(2), 0.0);
        assert_eq!(
            p.confident(&[1, 2, 3], 0.8),
            &[1, 2],
            "the third rank is always wrong"
        );
        assert_eq!(p.confident(&[1, 2], 0.8), &[1, 2]);
        p.observe(&[3, 2, 1], &[1, 2, 3]);
        assert_eq!(p.precision(2), 0.5);
        assert_eq!(
            p.confident(&[1, 2, 3], 0.5),
            &[1, 2, 3],
            "recovers when right again"
        );
        // A longer forecast than any seen: its extra ranks have no samples and are kept.
        assert_eq!(p.confident(&[1, 2, 3, 4], 0.4), &[1, 2, 3, 4]);
        p.observe(&[1], &[9]);
        assert_eq!(
            p.confident(&[1, 2, 3], 0.6),
            &[] as &[usize],
            "a prefix: rank 1 failed"
        );
    }

    #[test]
    fn gate_closes_on_useless_predictors_and_reopens() {
        let mut g = RecallGate::new(2, 0.5, 0.2, 2);
        assert!(g.allow(1));
        g.observe(1, &[9], &[8], &[1, 2]);
        assert!(g.allow(1), "still warming up");
        g.observe(1, &[9], &[8], &[1, 2]);
        assert!(!g.allow(1));
        g.observe(1, &[1, 2], &[], &[1, 2]);
        assert_eq!(g.recalls(1).0, 0.5);
        assert!(g.allow(1));
        assert_eq!(
            g.predictors(1),
            (true, false),
            "the previous-pass predictor is useless here"
        );
        let mut w = RecallGate::new(1, 1.0, 0.1, 0);
        w.observe(0, &[1, 2, 3], &[1, 2, 8], &[1, 2, 3]);
        assert_eq!(
            w.predictors(0),
            (true, false),
            "two thirds of a list right is not precise enough to read it"
        );
        w.observe(0, &[1, 2, 3], &[1, 2], &[1, 2, 3]);
        assert_eq!(
            w.predictors(0),
            (true, true),
            "a precise previous pass is read too, though it covers only part of the layer"
        );
        assert_eq!(recall(&[1], &[1, 2]), 0.5);
    }

    #[test]
    fn row_counts_share_rank_statistics_by_bucket() {
        let b: Vec<usize> = [1, 2, 3, 4, 5, 8, 9, 64]
            .iter()
            .map(|&r| rows_bucket(r))
            .collect();
        assert_eq!(b, [0, 1, 2, 2, 3, 3, 4, 4]);
        assert!(b.iter().all(|&x| x < ROWS_BUCKETS));
    }
}
