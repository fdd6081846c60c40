//! Measured routing popularity and what a cache of a given policy holds under it: the input
//! that lets `deltafin plan` predict the hit rate of the policy the engine runs instead of the
//! cache's share of the experts (the hit rate of any policy under uniform routing).
//!
//! The model is the independent reference model: each row picks expert `e` of its layer with
//! probability `p_e` (a layer's `p` sum to its top-k), independently of other rows and steps.
//! Under it LFU converges to the cache that holds the `slots` most popular experts, and LRU holds
//! expert `e` with probability `1 − exp(−p_e·T)`, where the characteristic time `T` fills the
//! cache: `Σ_e 1 − exp(−p_e·T) = slots` (Che's approximation). Pure functions, tested without
//! I/O.

use serde::Serialize;

use super::policy::PolicyKind;
use super::routes::RouteCounts;
use crate::error::{Error, Result};

/// Per MoE layer, each expert's chance of being among one row's top-k.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Popularity {
    pub layers: Vec<Vec<f64>>,
}

impl Popularity {
    /// Every expert equally likely: `k / experts` each.
    pub fn uniform(layers: usize, experts: usize, top_k: usize) -> Self {
        let p = top_k as f64 / experts.max(1) as f64;
        Popularity {
            layers: vec![vec![p.min(1.0); experts]; layers],
        }
    }

    /// From a route trace's selection counts (`bench serve`/`serve --route-trace`): each
    /// layer's counts scaled to sum to `top_k`. The trace must cover `layers` MoE layers of
    /// `experts` experts.
    pub fn from_counts(counts: &RouteCounts, layers: usize, experts: usize, top_k: usize) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidArgument {
            field: "route trace",
            reason,
        };
        let mut ids: Vec<u32> = counts.counts.keys().map(|k| k.layer).collect();
        ids.dedup();
        if ids.len() != layers {
            return Err(invalid(format!(
                "it routes {} layers, the model has {layers} MoE layers: a trace of another model?",
                ids.len()
            )));
        }
        let mut out = Vec::with_capacity(layers);
        for layer in ids {
            let mut row = vec![0.0f64; experts];
            for (k, &n) in counts.counts.range(layer_keys(layer)) {
                let slot = row.get_mut(k.expert as usize).ok_or_else(|| {
                    invalid(format!(
                        "layer {layer} expert {}: the model has {experts}",
                        k.expert
                    ))
                })?;
                *slot = n as f64;
            }
            let total: f64 = row.iter().sum();
            row.iter_mut()
                .for_each(|p| *p = (*p * top_k as f64 / total).min(1.0));
            out.push(row);
        }
        Ok(Popularity { layers: out })
    }

    /// Each expert's chance of being held by a cache of `slots` experts under `policy`.
    pub fn held(&self, slots: usize, policy: PolicyKind) -> Vec<Vec<f64>> {
        let all = self.layers.iter().map(Vec::len).sum::<usize>();
        if slots >= all {
            return self.layers.iter().map(|l| vec![1.0; l.len()]).collect();
        }
        match policy {
            PolicyKind::Lfu => self.hottest(slots),
            PolicyKind::Lru => {
                let t = characteristic_time(self.layers.iter().flatten().copied(), slots as f64);
                self.layers
                    .iter()
                    .map(|l| l.iter().map(|&p| 1.0 - (-p * t).exp()).collect())
                    .collect()
            }
        }
    }

    /// The `slots` most popular experts held (ties to the lower layer, then expert).
    fn hottest(&self, slots: usize) -> Vec<Vec<f64>> {
        let mut ranked: Vec<(usize, usize, f64)> = self
            .layers
            .iter()
            .enumerate()
            .flat_map(|(l, ps)| ps.iter().enumerate().map(move |(e, &p)| (l, e, p)))
            .collect();
        ranked.sort_by(|a, b| b.2.total_cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
        let mut held: Vec<Vec<f64>> = self.layers.iter().map(|l| vec![0.0; l.len()]).collect();
        for &(l, e, _) in ranked.iter().take(slots) {
            held[l][e] = 1.0;
        }
        held
    }

    /// Expected `(distinct experts, distinct experts not held)` over all layers when `rows`
    /// independent rows route: expert `e` is selected with chance `1 − (1 − p_e)^rows`.
    pub fn step(&self, held: &[Vec<f64>], rows: usize) -> (f64, f64) {
        let n = rows.min(i32::MAX as usize) as i32;
        let mut union = 0.0;
        let mut missed = 0.0;
        for (ps, hs) in self.layers.iter().zip(held) {
            for (&p, &h) in ps.iter().zip(hs) {
                let selected = 1.0 - (1.0 - p).powi(n);
                union += selected;
                missed += selected * (1.0 - h);
            }
        }
        (union, missed)
    }
}

/// The keys of one layer in a [`RouteCounts`] map.
fn layer_keys(layer: u32) -> std::ops::RangeInclusive<super::ExpertKey> {
    super::ExpertKey { layer, expert: 0 }..=super::ExpertKey {
        layer,
        expert: u32::MAX,
    }
}

/// Che's characteristic time: the `T` with `Σ 1 − exp(−p·T) = slots` (bisection; the sum grows
/// with `T` from 0 to the number of experts with `p > 0`).
fn characteristic_time(ps: impl Iterator<Item = f64> + Clone, slots: f64) -> f64 {
    let filled = |t: f64| ps.clone().map(|p| 1.0 - (-p * t).exp()).sum::<f64>();
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while filled(hi) < slots && hi < 1e12 {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if filled(mid) < slots {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::ExpertKey;

    #[test]
    fn uniform_routing_holds_the_caches_share_under_either_policy() {
        let pop = Popularity::uniform(4, 64, 6);
        for policy in [PolicyKind::Lfu, PolicyKind::Lru] {
            let held = pop.held(64, policy);
            let (union, missed) = pop.step(&held, 1);
            assert!((union - 24.0).abs() < 1e-9, "{union}");
            // A quarter of the experts held: three quarters of the 24 selections miss.
            assert!((missed - 18.0).abs() < 1e-6, "{policy:?}: {missed}");
        }
    }

    #[test]
    fn skewed_routing_hits_more_under_lfu_than_lru_and_both_beat_the_share() {
        // One layer of 8 experts, top-2: two hot experts take most selections.
        let pop = Popularity {
            layers: vec![vec![0.9, 0.7, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05]],
        };
        let miss = |policy| pop.step(&pop.held(2, policy), 1).1;
        let share = pop.step(&[vec![0.25; 8]], 1).1;
        let (lfu, lru) = (miss(PolicyKind::Lfu), miss(PolicyKind::Lru));
        assert!((lfu - 0.4).abs() < 1e-12, "only the cold 0.4 misses: {lfu}");
        assert!(lfu < lru && lru < share, "{lfu} {lru} {share}");
        // Che: the held chances fill exactly the slots.
        let held: f64 = pop.held(2, PolicyKind::Lru)[0].iter().sum();
        assert!((held - 2.0).abs() < 1e-9, "{held}");
    }

    #[test]
    fn trace_counts_become_chances_per_layer_and_a_foreign_trace_is_refused() {
        let mut counts = RouteCounts {
            passes: 10,
            ..Default::default()
        };
        for (layer, expert, n) in [(1, 0, 10), (1, 3, 10), (2, 1, 5), (2, 2, 15)] {
            counts.counts.insert(ExpertKey { layer, expert }, n);
        }
        let pop = Popularity::from_counts(&counts, 2, 4, 2).unwrap();
        assert_eq!(
            pop.layers,
            vec![vec![1.0, 0.0, 0.0, 1.0], vec![0.0, 0.5, 1.5f64.min(1.0), 0.0]]
        );
        assert!(Popularity::from_counts(&counts, 3, 4, 2).is_err(), "layer count");
        assert!(
            Popularity::from_counts(&counts, 2, 3, 2).is_err(),
            "expert 3 of 3"
        );
    }
}
