//! Eviction policies of the expert cache: pure bookkeeping over slot numbers, no I/O and no
//! locking (the cache calls them under its lock).
//!
//! * [`Lru`]: evict the slot used least recently (the baseline).
//! * [`Lfu`]: decayed *selection hotness* — every time the router selects an expert (hit or
//!   miss) its hotness grows by one, and all hotness halves every `half_life` passes; evict the
//!   coldest, least recently used on ties. Counting selections rather than hits lets an expert
//!   that keeps missing earn its way in; the decay lets the set follow a drifting workload.
//!   Hotness can be seeded from the persistent heat histogram.

use std::collections::HashMap;

use serde::Serialize;

use super::ExpertKey;

/// Which policy a cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    Lru,
    Lfu,
}

impl std::str::FromStr for PolicyKind {
    type Err = crate::error::UnknownChoice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "lru" => Ok(PolicyKind::Lru),
            "lfu" => Ok(PolicyKind::Lfu),
            _ => Err(crate::error::UnknownChoice {
                what: "cache policy",
                input: s.into(),
                expected: "lru, lfu",
            }),
        }
    }
}

impl PolicyKind {
    /// A fresh policy of this kind for `slots` slots.
    pub fn build(self, slots: usize) -> Box<dyn EvictionPolicy> {
        match self {
            PolicyKind::Lru => Box::new(Lru::new(slots)),
            PolicyKind::Lfu => Box::new(Lfu::new(slots, 16)),
        }
    }
}

/// Decision logic of an eviction policy.
pub trait EvictionPolicy: Send + std::fmt::Debug {
    /// The policy's name.
    fn kind(&self) -> PolicyKind;
    /// The router selected `key` in this pass (called once per selected expert, hit or miss).
    fn on_select(&mut self, key: ExpertKey);
    /// `slot` now holds `key` (insert) or was used again (hit).
    fn on_access(&mut self, slot: usize, key: ExpertKey);
    /// `slot` was emptied.
    fn on_remove(&mut self, slot: usize);
    /// A pass ended.
    fn on_pass_end(&mut self);
    /// `slot` holds a useless speculative read: evict it before anything else.
    fn demote(&mut self, slot: usize);
    /// Seed the hotness of `key` (from the persistent heat histogram); ignored by LRU.
    fn seed(&mut self, _key: ExpertKey, _hotness: f32) {}
    /// The slot to evict among `candidates` (unpinned, loaded), or `None` if empty.
    fn victim(&self, candidates: &[usize]) -> Option<usize>;
}

/// Least recently used.
#[derive(Debug, Clone)]
pub struct Lru {
    tick: u64,
    last: Vec<u64>,
}

impl Lru {
    pub fn new(slots: usize) -> Self {
        Lru {
            tick: 0,
            last: vec![0; slots],
        }
    }
}

impl EvictionPolicy for Lru {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lru
    }
    fn on_select(&mut self, _key: ExpertKey) {}
    fn on_access(&mut self, slot: usize, _key: ExpertKey) {
        self.tick += 1;
        self.last[slot] = self.tick;
    }
    fn on_remove(&mut self, slot: usize) {
        self.last[slot] = 0;
    }
    fn on_pass_end(&mut self) {}
    fn demote(&mut self, slot: usize) {
        self.last[slot] = 0;
    }
    fn victim(&self, candidates: &[usize]) -> Option<usize> {
        candidates.iter().copied().min_by_key(|&s| (self.last[s], s))
    }
}

/// Decayed selection-hotness LFU with LRU tie-break.
#[derive(Debug, Clone)]
pub struct Lfu {
    lru: Lru,
    half_life: u32,
    passes: u32,
    hot: HashMap<ExpertKey, f32>,
    slot_key: Vec<Option<ExpertKey>>,
}

impl Lfu {
    /// `half_life`: passes after which hotness halves.
    pub fn new(slots: usize, half_life: u32) -> Self {
        Lfu {
            lru: Lru::new(slots),
            half_life: half_life.max(1),
            passes: 0,
            hot: HashMap::new(),
            slot_key: vec![None; slots],
        }
    }

    /// Current hotness of `key`.
    pub fn hotness(&self, key: ExpertKey) -> f32 {
        self.hot.get(&key).copied().unwrap_or(0.0)
    }
}

impl EvictionPolicy for Lfu {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lfu
    }
    fn on_select(&mut self, key: ExpertKey) {
        *self.hot.entry(key).or_insert(0.0) += 1.0;
    }
    fn on_access(&mut self, slot: usize, key: ExpertKey) {
        self.lru.on_access(slot, key);
        self.slot_key[slot] = Some(key);
    }
    fn on_remove(&mut self, slot: usize) {
        self.lru.on_remove(slot);
        self.slot_key[slot] = None;
    }
    fn on_pass_end(&mut self) {
        self.passes += 1;
        if self.passes.is_multiple_of(self.half_life) {
            self.hot.retain(|_, h| {
                *h *= 0.5;
                *h >= 1e-3
            });
        }
    }
    fn demote(&mut self, slot: usize) {
        self.lru.demote(slot);
    }
    fn seed(&mut self, key: ExpertKey, hotness: f32) {
        let h = self.hot.entry(key).or_insert(0.0);
        *h = h.max(hotness);
    }
    fn victim(&self, candidates: &[usize]) -> Option<usize> {
        let score = |s: usize| self.slot_key[s].map_or(0.0, |k| self.hotness(k));
        candidates.iter().copied().min_by(|&a, &b| {
            score(a)
                .total_cmp(&score(b))
                .then(self.lru.last[a].cmp(&self.lru.last[b]))
                .then(a.cmp(&b))
        })
    }
}

/// Whether a step that selected `selections` routed experts over all its layers over-subscribes
/// a cache of `slots` (pure): more than half of it. Recency keeps about `slots / selections`
/// steps of history, and a layer's experts come back at the next step no more often than the
/// step's share of the layer; past half the cache that share is below what a kept set hits
/// (default model under 110M, 2 streams: 65 selections for 88 slots, recency hit 13 % against
/// a share of 27.5 %).
pub fn oversubscribes(selections: usize, slots: usize) -> bool {
    2 * selections > slots
}

/// One miss in this many of an over-subscribed batched step is kept like any other (see
/// [`bypass_miss`]), so the kept set follows slowly changing routes.
pub const BYPASS_KEEP_EVERY: u64 = 32;

/// Whether the `nth` (from 1) expert read for an over-subscribed batched step goes to the
/// eviction end of the cache instead of its head (pure).
///
/// When one step's routed experts over all layers crowd the slots ([`oversubscribes`]), recency evicts exactly
/// what the next step needs first: the step walks the layers in the same order every time, so
/// the oldest entries are the next step's first layers. Reading on demand cannot avoid the
/// misses, but it can keep them from evicting the experts that do hit: a miss of such a step is
/// demoted once read (evicted first after its use; pinned slots are never victims), except one
/// in [`BYPASS_KEEP_EVERY`]. The cached set then stays put and hits as often as its share of the
/// experts, where recency hit almost never (bench serve's default model under 110M at 8 streams:
/// see docs/performance.md). Only batched steps: one row's steps keep plain recency, whose
/// token-to-token reuse the single-stream figures were tuned on.
pub fn bypass_miss(nth: u64) -> bool {
    !nth.is_multiple_of(BYPASS_KEEP_EVERY)
}

/// The order a step's experts of one layer are started in (pure): those the cache holds first
/// (they need no read, and their compute starts at once), then the misses by disk position
/// (`(shard, offset)`), so reads go out in offset order. Ties keep the router's order.
pub fn issue_order(
    ids: &[usize],
    cached: impl Fn(usize) -> bool,
    position: impl Fn(usize) -> (usize, u64),
) -> Vec<usize> {
    let mut order: Vec<(bool, (usize, u64), usize)> = ids
        .iter()
        .map(|&e| {
            let hit = cached(e);
            (!hit, if hit { (0, 0) } else { position(e) }, e)
        })
        .collect();
    order.sort_by_key(|&(miss, pos, _)| (miss, pos));
    order.into_iter().map(|(_, _, e)| e).collect()
}

/// Whether another demand miss may claim a slot while `in_flight` of this layer's misses hold
/// one (pure). A layer's misses are read `window` at a time (the reader's threads: the disk sees
/// the same queue depth) and each releases its slot once computed, so a step needs `window`
/// slots for the experts it does not keep instead of one per miss: at 8 streams on the default
/// benchmark model a layer misses about 26 experts, and with every one of them holding a slot
/// the cache kept 62 of its 88 slots for the experts that hit.
pub fn may_start_miss(in_flight: usize, window: usize) -> bool {
    in_flight < window.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(e: u32) -> ExpertKey {
        ExpertKey { layer: 1, expert: e }
    }

    #[test]
    fn lru_evicts_the_oldest_candidate() {
        let mut p = Lru::new(3);
        for (slot, e) in [(0, 10), (1, 11), (2, 12)] {
            p.on_access(slot, k(e));
        }
        p.on_access(0, k(10));
        assert_eq!(p.victim(&[0, 1, 2]), Some(1));
        assert_eq!(p.victim(&[0, 2]), Some(2), "pinned slots are not candidates");
        assert_eq!(p.victim(&[]), None);
        p.on_remove(0);
        assert_eq!(p.victim(&[0, 2]), Some(0), "an emptied slot is the first victim");
    }

    #[test]
    fn lfu_keeps_frequently_selected_experts_over_recent_ones() {
        let mut p = Lfu::new(3, 4);
        for (slot, e) in [(0, 10), (1, 11), (2, 12)] {
            p.on_access(slot, k(e));
        }
        for _ in 0..5 {
            p.on_select(k(10));
        }
        p.on_select(k(11));
        p.on_access(2, k(12)); // most recent, but never selected
        assert_eq!(p.victim(&[0, 1, 2]), Some(2));
        // Ties on hotness fall back to LRU.
        p.on_select(k(12));
        assert_eq!(p.victim(&[1, 2]), Some(1));
    }

    #[test]
    fn lfu_hotness_decays_per_half_life() {
        let mut p = Lfu::new(1, 2);
        for _ in 0..8 {
            p.on_select(k(1));
        }
        p.on_pass_end();
        assert_eq!(p.hotness(k(1)), 8.0);
        p.on_pass_end();
        assert_eq!(p.hotness(k(1)), 4.0);
        p.seed(k(2), 3.0);
        assert_eq!(p.hotness(k(2)), 3.0);
        assert_eq!("lfu".parse::<PolicyKind>().unwrap(), PolicyKind::Lfu);
        assert!("mru".parse::<PolicyKind>().is_err());
    }

    #[test]
    fn hits_start_first_then_misses_in_disk_order_within_a_window() {
        let cached = |e: usize| e.is_multiple_of(3);
        let position = |e: usize| (e % 2, 1000 - 10 * e as u64);
        assert_eq!(
            issue_order(&[5, 3, 4, 0, 1, 2, 6], cached, position),
            [3, 0, 6, 4, 2, 5, 1]
        );
        assert_eq!(issue_order(&[], cached, position), Vec::<usize>::new());
        assert!(may_start_miss(7, 8));
        assert!(!may_start_miss(8, 8));
        assert!(may_start_miss(0, 0), "a window of 0 still reads one at a time");
        assert!(!oversubscribes(44, 88) && oversubscribes(45, 88));
    }

    #[test]
    fn one_read_in_n_of_an_oversubscribed_batch_is_kept() {
        let kept: Vec<u64> = (1..=3 * BYPASS_KEEP_EVERY).filter(|&n| !bypass_miss(n)).collect();
        assert_eq!(
            kept,
            [BYPASS_KEEP_EVERY, 2 * BYPASS_KEEP_EVERY, 3 * BYPASS_KEEP_EVERY]
        );
    }
}
