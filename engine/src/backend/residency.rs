//! Which weight matrices a device keeps resident, in tiers under one byte budget:
//!
//! * **the spine** (attention, norms, dense and shared FFNs, embeddings and head: every matrix a
//!   pass uses every time) comes first: routed experts never evict it, and it evicts experts;
//! * **routed experts** share what the spine leaves, in a segmented LRU: a newly uploaded
//!   expert enters *probation*; a second use promotes it to *protected* (at most
//!   [`PROTECTED_SHARE`] of the expert room); eviction takes probation's least recently used
//!   first. So the experts a workload keeps choosing stay on the device while one-off choices
//!   churn through probation, where a plain LRU would let every burst of cold experts flush the
//!   hot ones. Host RAM (the out-of-core expert cache) is the tier below, disk the one below it.
//!
//! Pure bookkeeping (no device calls), so the policy is tested without a GPU; the CUDA backend
//! holds the device buffers and follows the decisions made here.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// What a matrix is to the model, which decides its tier on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightClass {
    /// Used by every pass.
    #[default]
    Spine,
    /// A routed expert: used by the passes whose router chose it.
    Expert,
}

/// Share of the expert room (budget less the resident spine) the protected segment may hold.
pub const PROTECTED_SHARE: f64 = 0.8;

/// What to do with a matrix about to be used.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit<K> {
    /// Already resident; now the most recently used.
    Hit,
    /// Not resident: drop `evict` (in order), then upload and keep it.
    Insert { evict: Vec<K> },
    /// Larger than the room its class may use: upload for this call only, keep nothing.
    Bypass,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment {
    Spine,
    Probation,
    Protected,
}

const SEGMENTS: usize = 3;

/// Every segment in eviction order: least valuable first.
const EVERY_SEGMENT: [Segment; SEGMENTS] = [Segment::Probation, Segment::Protected, Segment::Spine];

impl Segment {
    fn index(self) -> usize {
        self as usize
    }
}

/// The resident set: keys with their sizes and segments, each segment ordered by last use.
#[derive(Debug)]
pub struct Residency<K> {
    budget: u64,
    tick: u64,
    entries: HashMap<K, (u64, Segment, u64)>,
    by_use: [BTreeMap<u64, K>; SEGMENTS],
    bytes: [u64; SEGMENTS],
}

impl<K: Hash + Eq + Clone> Residency<K> {
    /// An empty set that holds at most `budget` bytes.
    pub fn new(budget: u64) -> Self {
        Residency {
            budget,
            tick: 0,
            entries: HashMap::new(),
            by_use: Default::default(),
            bytes: [0; SEGMENTS],
        }
    }

    /// Bytes resident now.
    pub fn used(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// Bytes resident now of one class.
    pub fn used_by(&self, class: WeightClass) -> u64 {
        match class {
            WeightClass::Spine => self.bytes[Segment::Spine.index()],
            WeightClass::Expert => {
                self.bytes[Segment::Probation.index()] + self.bytes[Segment::Protected.index()]
            }
        }
    }

    /// The byte budget.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Decide for `key` (of `bytes`, used as `class`), recording the use. After
    /// [`Admit::Insert`] the key counts as resident; after [`Admit::Bypass`] it does not.
    pub fn admit(&mut self, key: &K, bytes: u64, class: WeightClass) -> Admit<K> {
        self.tick += 1;
        if let Some(&(size, seg, last)) = self.entries.get(key) {
            let to = if seg == Segment::Probation {
                Segment::Protected
            } else {
                seg
            };
            self.unlink(key, size, seg, last);
            self.link(key, size, to);
            self.cap_protected();
            return Admit::Hit;
        }
        let room = match class {
            WeightClass::Spine => self.budget,
            WeightClass::Expert => self.budget - self.bytes[Segment::Spine.index()],
        };
        if bytes > room {
            return Admit::Bypass;
        }
        let order: &[Segment] = match class {
            WeightClass::Spine => &EVERY_SEGMENT,
            WeightClass::Expert => &EVERY_SEGMENT[..2],
        };
        let evict = self.evict(order, bytes);
        let seg = match class {
            WeightClass::Spine => Segment::Spine,
            WeightClass::Expert => Segment::Probation,
        };
        self.link(key, bytes, seg);
        Admit::Insert { evict }
    }

    /// Take `bytes` off the budget for other device memory (a served model's attention caches):
    /// entries leave, least valuable first (probation, protected, then the spine, oldest first
    /// in each), until the rest fits. The evicted keys.
    pub fn reserve(&mut self, bytes: u64) -> Vec<K> {
        self.budget = self.budget.saturating_sub(bytes);
        let evict = self.evict(&EVERY_SEGMENT, 0);
        self.cap_protected();
        evict
    }

    /// Evict from `order`'s segments, oldest first, until `bytes` more fit in the budget.
    fn evict(&mut self, order: &[Segment], bytes: u64) -> Vec<K> {
        let mut evict = Vec::new();
        for &seg in order {
            while self.used() + bytes > self.budget {
                let Some((_, oldest)) = self.by_use[seg.index()].pop_first() else {
                    break;
                };
                let (size, _, _) = self.entries.remove(&oldest).expect("indexed entry");
                self.bytes[seg.index()] -= size;
                evict.push(oldest);
            }
        }
        evict
    }

    /// Forget `key` (its upload failed).
    pub fn forget(&mut self, key: &K) {
        if let Some(&(size, seg, last)) = self.entries.get(key) {
            self.unlink(key, size, seg, last);
        }
    }

    fn link(&mut self, key: &K, bytes: u64, seg: Segment) {
        self.entries.insert(key.clone(), (bytes, seg, self.tick));
        self.by_use[seg.index()].insert(self.tick, key.clone());
        self.bytes[seg.index()] += bytes;
    }

    fn unlink(&mut self, key: &K, bytes: u64, seg: Segment, last: u64) {
        self.entries.remove(key);
        self.by_use[seg.index()].remove(&last);
        self.bytes[seg.index()] -= bytes;
    }

    /// Demote protected experts (least recently used first) to probation until the protected
    /// segment fits its share of the expert room; each keeps its last-use order.
    fn cap_protected(&mut self) {
        let room = self.budget - self.bytes[Segment::Spine.index()];
        let cap = (room as f64 * PROTECTED_SHARE) as u64;
        let (prot, prob) = (Segment::Protected.index(), Segment::Probation.index());
        while self.bytes[prot] > cap {
            let Some((tick, key)) = self.by_use[prot].pop_first() else {
                break;
            };
            let entry = self.entries.get_mut(&key).expect("indexed entry");
            entry.1 = Segment::Probation;
            self.bytes[prot] -= entry.0;
            self.bytes[prob] += entry.0;
            self.by_use[prob].insert(tick, key);
        }
    }
}

/// How many decoder layers a served device runs (pure): all of them when their spine fits in
/// `budget` bytes of device weights beside the `fixed` tensors, else the longest prefix that
/// does (the rest run on the CPU: a pass's spine is used in the same order every time, so a
/// device that cannot keep all of it would re-upload every matrix of every pass).
pub fn device_layers(layer_bytes: &[u64], fixed: u64, budget: u64) -> usize {
    let mut room = budget.saturating_sub(fixed);
    layer_bytes
        .iter()
        .take_while(|&&b| {
            let fits = b <= room;
            room = room.saturating_sub(b);
            fits
        })
        .count()
}

/// How a device's weight budget divides between the tiers, for the plan printed at start: the
/// spine first, then as many routed experts as the rest holds; host RAM and disk below.
#[derive(Debug, Clone, PartialEq)]
pub struct TierPlan {
    pub device: String,
    pub budget: u64,
    /// Every spine byte of the model (fixed tensors and each layer's spine).
    pub spine_bytes: u64,
    /// The fixed tensors' bytes, and each decoder layer's spine bytes in layer order.
    pub fixed_bytes: u64,
    pub layer_spine: Vec<u64>,
    /// Bytes of one routed expert, and how many the model has.
    pub expert_bytes: u64,
    pub experts: u64,
    /// Experts the host RAM cache holds (the tier below).
    pub host_slots: u64,
}

impl TierPlan {
    /// Spine bytes that stay on the device.
    pub fn spine_resident(&self) -> u64 {
        self.spine_bytes.min(self.budget)
    }

    /// Routed experts the device holds after the spine.
    pub fn device_experts(&self) -> u64 {
        let room = self.budget - self.spine_resident();
        (room / self.expert_bytes.max(1)).min(self.experts)
    }
}

impl std::fmt::Display for TierPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        write!(
            f,
            "device {} weights {:.2} GiB: spine ",
            self.device,
            gib(self.budget)
        )?;
        if self.spine_resident() == self.spine_bytes {
            write!(f, "{:.2} GiB resident", gib(self.spine_bytes))?;
        } else {
            let on = device_layers(&self.layer_spine, self.fixed_bytes, self.budget);
            write!(
                f,
                "{:.2} GiB does not fit: a served pass runs layers 0..{on} of {} on the device and the rest on the CPU (products alone upload the rest as used)",
                gib(self.spine_bytes),
                self.layer_spine.len()
            )?;
        }
        let on = self.device_experts();
        write!(
            f,
            ", then {on} of {} routed experts ({:.1}%, the most chosen kept); host RAM {} experts; disk the rest",
            self.experts,
            100.0 * on as f64 / self.experts.max(1) as f64,
            self.host_slots
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: WeightClass = WeightClass::Spine;
    const E: WeightClass = WeightClass::Expert;

    #[test]
    fn hits_keep_entries_and_refresh_their_age() {
        let mut r = Residency::new(100);
        assert_eq!(r.admit(&"a", 40, S), Admit::Insert { evict: vec![] });
        assert_eq!(r.admit(&"b", 40, S), Admit::Insert { evict: vec![] });
        assert_eq!(r.admit(&"a", 40, S), Admit::Hit);
        // "b" is now the least recently used one.
        assert_eq!(r.admit(&"c", 40, S), Admit::Insert { evict: vec!["b"] });
        assert_eq!(r.used(), 80);
        assert_eq!(r.admit(&"a", 40, S), Admit::Hit);
        assert_eq!(r.admit(&"b", 40, S), Admit::Insert { evict: vec!["c"] });
    }

    #[test]
    fn evicts_as_many_as_needed_oldest_first_and_never_exceeds_the_budget() {
        let mut r = Residency::new(100);
        for k in 0..10 {
            assert_eq!(r.admit(&k, 10, S), Admit::Insert { evict: vec![] });
        }
        assert_eq!(
            r.admit(&99, 35, S),
            Admit::Insert {
                evict: vec![0, 1, 2, 3]
            }
        );
        assert_eq!(r.used(), 95);
        assert!(r.used() <= r.budget());
    }

    #[test]
    fn a_matrix_larger_than_the_budget_bypasses_without_evicting() {
        let mut r = Residency::new(100);
        assert_eq!(r.admit(&1, 60, S), Admit::Insert { evict: vec![] });
        assert_eq!(r.admit(&2, 101, S), Admit::Bypass);
        assert_eq!(r.admit(&2, 101, S), Admit::Bypass, "never becomes resident");
        assert_eq!(r.admit(&1, 60, S), Admit::Hit);
        assert_eq!(r.used(), 60);
    }

    #[test]
    fn forgetting_releases_the_bytes() {
        let mut r = Residency::new(100);
        assert_eq!(r.admit(&1, 60, S), Admit::Insert { evict: vec![] });
        r.forget(&1);
        assert_eq!(r.used(), 0);
        assert_eq!(r.admit(&2, 100, S), Admit::Insert { evict: vec![] });
        r.forget(&3);
        assert_eq!(r.used(), 100);
    }

    #[test]
    fn experts_never_evict_the_spine_and_the_spine_evicts_experts() {
        let mut r = Residency::new(100);
        assert_eq!(r.admit(&"spine", 60, S), Admit::Insert { evict: vec![] });
        assert_eq!(r.admit(&"big", 41, E), Admit::Bypass, "only 40 left for experts");
        assert_eq!(r.admit(&"e1", 20, E), Admit::Insert { evict: vec![] });
        assert_eq!(r.admit(&"e2", 20, E), Admit::Insert { evict: vec![] });
        assert_eq!(r.admit(&"e3", 20, E), Admit::Insert { evict: vec!["e1"] });
        assert_eq!(r.used_by(S), 60);
        assert_eq!(r.used_by(E), 40);
        assert_eq!(
            r.admit(&"spine2", 30, S),
            Admit::Insert {
                evict: vec!["e2", "e3"]
            }
        );
        assert_eq!((r.used_by(S), r.used_by(E)), (90, 0));
    }

    #[test]
    fn an_expert_chosen_again_outlives_a_burst_of_one_off_experts() {
        let mut r = Residency::new(100);
        assert_eq!(r.admit(&0, 20, E), Admit::Insert { evict: vec![] });
        assert_eq!(r.admit(&0, 20, E), Admit::Hit, "promoted to protected");
        // Ten cold experts, each used once: they cycle through probation.
        for k in 1..=10 {
            assert!(matches!(r.admit(&k, 20, E), Admit::Insert { .. }));
            assert!(r.used() <= r.budget());
        }
        assert_eq!(r.admit(&0, 20, E), Admit::Hit, "the hot expert stayed");
        // A plain LRU of the same size would have evicted it after four inserts.
    }

    #[test]
    fn the_protected_segment_keeps_room_for_probation() {
        let mut r = Residency::new(100);
        for k in 0..5 {
            r.admit(&k, 20, E);
            assert_eq!(r.admit(&k, 20, E), Admit::Hit);
        }
        // All five were promoted, but protected holds at most 80: the oldest went back to
        // probation and is the first to go.
        assert_eq!(r.admit(&9, 20, E), Admit::Insert { evict: vec![0] });
        assert_eq!(r.admit(&1, 20, E), Admit::Hit);
        assert_eq!(r.used(), 100);
    }

    #[test]
    fn the_tier_plan_puts_the_spine_first_and_counts_the_experts_after_it() {
        let gib = 1u64 << 30;
        let t = TierPlan {
            device: "cuda:0".into(),
            budget: 20 * gib,
            spine_bytes: 4 * gib,
            fixed_bytes: gib / 2,
            layer_spine: vec![gib / 2; 7],
            expert_bytes: gib / 4,
            experts: 256,
            host_slots: 40,
        };
        assert_eq!((t.spine_resident(), t.device_experts()), (4 * gib, 64));
        assert_eq!(
            t.to_string(),
            "device cuda:0 weights 20.00 GiB: spine 4.00 GiB resident, then 64 of 256 routed experts \
             (25.0%, the most chosen kept); host RAM 40 experts; disk the rest"
        );
        let small = TierPlan { budget: 3 * gib, ..t };
        assert_eq!(small.device_experts(), 0);
        assert!(
            small
                .to_string()
                .contains("spine 4.00 GiB does not fit: a served pass runs layers 0..5 of 7 on the device"),
            "{small}"
        );
    }

    #[test]
    fn a_reservation_shrinks_the_budget_evicting_experts_before_the_spine() {
        let mut r = Residency::new(100);
        r.admit(&"s1", 30, WeightClass::Spine);
        r.admit(&"s2", 30, WeightClass::Spine);
        r.admit(&"e1", 20, WeightClass::Expert);
        r.admit(&"e1", 20, WeightClass::Expert); // protected
        r.admit(&"e2", 20, WeightClass::Expert);
        assert_eq!(r.used(), 100);
        assert_eq!(r.reserve(30), vec!["e2", "e1"], "probation first, then protected");
        assert_eq!((r.budget(), r.used()), (70, 60));
        assert_eq!(r.reserve(20), vec!["s1"], "the spine last, oldest first");
        assert_eq!((r.budget(), r.used()), (50, 30));
        assert_eq!(r.admit(&"s2", 30, WeightClass::Spine), Admit::Hit);
        assert_eq!(
            r.admit(&"e3", 30, WeightClass::Expert),
            Admit::Bypass,
            "no room beside the spine"
        );
        assert_eq!(r.reserve(u64::MAX), vec!["s2"]);
        assert_eq!((r.budget(), r.used()), (0, 0));
    }

    #[test]
    fn a_device_runs_every_layer_or_the_prefix_that_fits() {
        assert_eq!(device_layers(&[10, 10, 10], 5, 100), 3);
        assert_eq!(device_layers(&[10, 10, 10], 5, 30), 2);
        assert_eq!(
            device_layers(&[10, 30, 10], 0, 35),
            1,
            "a prefix, not the layers that fit"
        );
        assert_eq!(device_layers(&[10, 10], 50, 40), 0);
    }
}
