//! Which weight matrices a device keeps resident: a least-recently-used set under a byte
//! budget. Pure bookkeeping (no device calls) so the policy is tested without a GPU; the CUDA
//! backend holds the device buffers and follows the decisions made here.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// What to do with a matrix about to be used.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit<K> {
    /// Already resident; now the most recently used.
    Hit,
    /// Not resident: drop `evict` (least recently used first), then upload and keep it.
    Insert { evict: Vec<K> },
    /// Larger than the whole budget: upload for this call only, keep nothing.
    Bypass,
}

/// The resident set: keys with their sizes, ordered by last use.
#[derive(Debug)]
pub struct Residency<K> {
    budget: u64,
    used: u64,
    tick: u64,
    entries: HashMap<K, (u64, u64)>,
    by_use: BTreeMap<u64, K>,
}

impl<K: Hash + Eq + Clone> Residency<K> {
    /// An empty set that holds at most `budget` bytes.
    pub fn new(budget: u64) -> Self {
        Residency {
            budget,
            used: 0,
            tick: 0,
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    /// Bytes resident now.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The byte budget.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Decide for `key` (of `bytes`), recording the use. After [`Admit::Insert`] the key counts
    /// as resident; after [`Admit::Bypass`] it does not.
    pub fn admit(&mut self, key: &K, bytes: u64) -> Admit<K> {
        self.tick += 1;
        if let Some((_, last)) = self.entries.get_mut(key) {
            self.by_use.remove(last);
            *last = self.tick;
            self.by_use.insert(self.tick, key.clone());
            return Admit::Hit;
        }
        if bytes > self.budget {
            return Admit::Bypass;
        }
        let mut evict = Vec::new();
        while self.used + bytes > self.budget {
            let (_, oldest) = self.by_use.pop_first().expect("used > 0 implies an entry");
            let (size, _) = self.entries.remove(&oldest).expect("indexed entry");
            self.used -= size;
            evict.push(oldest);
        }
        self.used += bytes;
        self.entries.insert(key.clone(), (bytes, self.tick));
        self.by_use.insert(self.tick, key.clone());
        Admit::Insert { evict }
    }

    /// Forget `key` (its upload failed).
    pub fn forget(&mut self, key: &K) {
        if let Some((size, last)) = self.entries.remove(key) {
            self.by_use.remove(&last);
            self.used -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_keep_entries_and_refresh_their_age() {
        let mut r = Residency::new(100);
        assert_eq!(r.admit(&"a", 40), Admit::Insert { evict: vec![] });
        assert_eq!(r.admit(&"b", 40), Admit::Insert { evict: vec![] });
        assert_eq!(r.admit(&"a", 40), Admit::Hit);
        // "b" is now the least recently used one.
        assert_eq!(r.admit(&"c", 40), Admit::Insert { evict: vec!["b"] });
        assert_eq!(r.used(), 80);
        assert_eq!(r.admit(&"a", 40), Admit::Hit);
        assert_eq!(r.admit(&"b", 40), Admit::Insert { evict: vec!["c"] });
    }

    #[test]
    fn evicts_as_many_as_needed_oldest_first_and_never_exceeds_the_budget() {
        let mut r = Residency::new(100);
        for k in 0..10 {
            assert_eq!(r.admit(&k, 10), Admit::Insert { evict: vec![] });
        }
        assert_eq!(
            r.admit(&99, 35),
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
        assert_eq!(r.admit(&1, 60), Admit::Insert { evict: vec![] });
        assert_eq!(r.admit(&2, 101), Admit::Bypass);
        assert_eq!(r.admit(&2, 101), Admit::Bypass, "never becomes resident");
        assert_eq!(r.admit(&1, 60), Admit::Hit);
        assert_eq!(r.used(), 60);
    }

    #[test]
    fn forgetting_releases_the_bytes() {
        let mut r = Residency::new(100);
        assert_eq!(r.admit(&1, 60), Admit::Insert { evict: vec![] });
        r.forget(&1);
        assert_eq!(r.used(), 0);
        assert_eq!(r.admit(&2, 100), Admit::Insert { evict: vec![] });
        r.forget(&3);
        assert_eq!(r.used(), 100);
    }
}
