//! Conversation state reuse: a small LRU of committed sequence states keyed by the token ids
//! they hold. A new prompt reuses the entry sharing its longest common prefix (rolled back to
//! that prefix — for recurrent models, to the latest checkpoint inside it — and always leaving
//! at least one prompt token to run so the pass yields logits).
//! A state's rows depend only on the tokens before them, so a reused prefix is bit-identical to
//! recomputing it: output never changes, only prefill work.
//!
//! A cached state and the states made from it share their memory (attention-cache blocks,
//! recurrent matrices: [`crate::state::paged`]), so an insert or a lookup copies no position, and
//! the cache's bytes are what it alone keeps alive: shared allocations are counted once, and those
//! a running sequence also holds are that sequence's.
//!
//! Pure bookkeeping, generic over the state type so it is tested without a model.

use std::collections::{HashSet, VecDeque};

use crate::state::SeqState;

/// What the cache needs from a state.
pub(crate) trait Reusable: Clone {
    /// The longest prefix `<= len` the state can be rolled back to (a recurrent state only to
    /// its checkpoints).
    fn rewind_point(&self, len: usize) -> usize;
    /// Roll back to the first `len` positions (only called with a `rewind_point`).
    fn truncate(&mut self, len: usize);
    /// Bytes held (for the byte budget).
    fn bytes(&self) -> usize;
    /// Each allocation held, by identity (shared ones have the same identity in every holder)
    /// and bytes.
    fn for_each_allocation(&self, f: &mut dyn FnMut(usize, usize));
}

impl Reusable for SeqState {
    fn rewind_point(&self, len: usize) -> usize {
        SeqState::rewind_point(self, len)
    }
    fn truncate(&mut self, len: usize) {
        // `lookup` only asks for lengths `rewind_point` returned, so this cannot fail; if it
        // somehow did, the state is left as it was and the caller re-runs the prompt.
        let _ = SeqState::truncate(self, len);
    }
    fn bytes(&self) -> usize {
        self.cache_bytes()
    }
    fn for_each_allocation(&self, f: &mut dyn FnMut(usize, usize)) {
        SeqState::for_each_allocation(self, f)
    }
}

#[derive(Debug)]
struct Entry<S> {
    ids: Vec<u32>,
    state: S,
}

/// LRU of committed states (front = most recently used).
#[derive(Debug)]
pub(crate) struct StateCache<S> {
    entries: VecDeque<Entry<S>>,
    max_entries: usize,
    max_bytes: usize,
    /// Shortest prefix worth reusing.
    min_prefix: usize,
}

/// A reused state: `state` holds the first `len` prompt tokens.
#[derive(Debug)]
pub(crate) struct Reused<S> {
    pub state: S,
    pub len: usize,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<S: Reusable> StateCache<S> {
    pub(crate) fn new(max_entries: usize, max_bytes: usize, min_prefix: usize) -> Self {
        StateCache {
            entries: VecDeque::new(),
            max_entries,
            max_bytes,
            min_prefix: min_prefix.max(1),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The best reusable state for `prompt` (a copy, rolled back to the shared prefix), or
    /// `None` when no entry shares at least `min_prefix` tokens. The entry stays cached.
    pub(crate) fn lookup(&mut self, prompt: &[u32]) -> Option<Reused<S>> {
        // Keep one prompt token to run: its pass produces the first logits.
        let usable = |e: &Entry<S>| {
            let len = common_prefix(&e.ids, prompt).min(prompt.len().saturating_sub(1));
            e.state.rewind_point(len)
        };
        let (best, len) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, usable(e)))
            .max_by_key(|&(i, len)| (len, std::cmp::Reverse(i)))?;
        if len < self.min_prefix {
            return None;
        }
        let entry = self.entries.remove(best)?;
        let mut state = entry.state.clone();
        state.truncate(len);
        self.entries.push_front(entry);
        Some(Reused { state, len })
    }

    /// Commit `state`, which holds exactly `ids`. Entries that are prefixes of `ids` are
    /// superseded; the least recently used entries are evicted to fit the budgets.
    pub(crate) fn insert(&mut self, ids: Vec<u32>, state: S) {
        if self.max_entries == 0 || ids.len() < self.min_prefix || state.bytes() > self.max_bytes {
            return;
        }
        self.entries.retain(|e| !ids.starts_with(&e.ids));
        self.entries.push_front(Entry { ids, state });
        while self.entries.len() > self.max_entries || self.bytes() > self.max_bytes {
            self.entries.pop_back();
        }
    }

    /// Bytes the cached states hold, what they share counted once.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes_beside(&[])
    }

    /// Bytes only the cache keeps alive: its allocations, each once, less those the `running`
    /// states also hold.
    fn bytes_beside(&self, running: &[&S]) -> usize {
        let mut seen = HashSet::new();
        distinct(running.iter().copied(), &mut seen);
        distinct(self.entries.iter().map(|e| &e.state), &mut seen)
    }

    /// Bytes alive in the `running` states and the cache together, what they share counted once
    /// (the engine's pool check in debug builds).
    #[cfg(debug_assertions)]
    pub(crate) fn bytes_with(&self, running: &[&S]) -> usize {
        let mut seen = HashSet::new();
        distinct(running.iter().copied(), &mut seen)
            + distinct(self.entries.iter().map(|e| &e.state), &mut seen)
    }

    /// Evict least recently used entries until the cache alone keeps at most `max_bytes` alive
    /// beside the `running` states.
    pub(crate) fn evict_to(&mut self, max_bytes: usize, running: &[&S]) {
        // Each entry's own total bounds what it keeps alive: within that, nothing to count.
        if self.entries.iter().map(|e| e.state.bytes()).sum::<usize>() <= max_bytes {
            return;
        }
        while !self.entries.is_empty() && self.bytes_beside(running) > max_bytes {
            self.entries.pop_back();
        }
    }
}

/// Bytes of the allocations of `states` not in `seen`, each once (adds them to `seen`).
fn distinct<'a, S: Reusable + 'a>(states: impl Iterator<Item = &'a S>, seen: &mut HashSet<usize>) -> usize {
    let mut total = 0;
    for s in states {
        s.for_each_allocation(&mut |id, bytes| {
            if seen.insert(id) {
                total += bytes;
            }
        });
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in state: the ids it holds.
    #[derive(Debug, Clone, PartialEq)]
    struct Ids(Vec<u32>);

    impl Reusable for Ids {
        fn rewind_point(&self, len: usize) -> usize {
            len
        }
        fn truncate(&mut self, len: usize) {
            self.0.truncate(len)
        }
        fn bytes(&self) -> usize {
            self.0.len() * 4
        }
        fn for_each_allocation(&self, f: &mut dyn FnMut(usize, usize)) {
            f(self.0.as_ptr() as usize, self.bytes())
        }
    }

    fn commit(c: &mut StateCache<Ids>, ids: &[u32]) {
        c.insert(ids.to_vec(), Ids(ids.to_vec()));
    }

    #[test]
    fn an_extension_reuses_the_whole_committed_prefix() {
        let mut c = StateCache::new(4, 1 << 20, 2);
        commit(&mut c, &[1, 2, 3, 4]);
        let r = c.lookup(&[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!((r.len, r.state), (4, Ids(vec![1, 2, 3, 4])));
    }

    #[test]
    fn a_divergent_prompt_rolls_back_to_the_common_prefix() {
        let mut c = StateCache::new(4, 1 << 20, 2);
        commit(&mut c, &[1, 2, 3, 4]);
        let r = c.lookup(&[1, 2, 9]).unwrap();
        assert_eq!((r.len, r.state), (2, Ids(vec![1, 2])));
        // The entry itself is untouched.
        assert_eq!(c.lookup(&[1, 2, 3, 4, 0]).unwrap().len, 4);
    }

    #[test]
    fn an_identical_prompt_leaves_one_token_to_run() {
        let mut c = StateCache::new(4, 1 << 20, 1);
        commit(&mut c, &[1, 2, 3]);
        assert_eq!(c.lookup(&[1, 2, 3]).unwrap().len, 2);
        assert!(c.lookup(&[1]).is_none());
    }

    #[test]
    fn short_or_missing_prefixes_miss() {
        let mut c = StateCache::new(4, 1 << 20, 3);
        assert!(c.lookup(&[1, 2, 3]).is_none());
        commit(&mut c, &[1, 2, 3, 4]);
        assert!(c.lookup(&[1, 2, 7, 7]).is_none());
        assert!(c.lookup(&[5, 2, 3, 4, 5]).is_none());
    }

    #[test]
    fn longest_prefix_wins_and_extensions_supersede() {
        let mut c = StateCache::new(4, 1 << 20, 1);
        commit(&mut c, &[1, 2]);
        commit(&mut c, &[1, 2, 3, 4]);
        assert_eq!(c.len(), 1, "the shorter prefix is superseded");
        commit(&mut c, &[1, 5, 6]);
        assert_eq!(c.lookup(&[1, 2, 3, 4, 8]).unwrap().len, 4);
        assert_eq!(c.lookup(&[1, 5, 6, 8]).unwrap().len, 3);
    }

    #[test]
    fn lru_and_byte_budgets_evict_the_oldest() {
        let mut c = StateCache::new(2, 1 << 20, 1);
        commit(&mut c, &[1, 1]);
        commit(&mut c, &[2, 2]);
        assert!(c.lookup(&[1, 1, 0]).is_some()); // touch [1, 1]
        commit(&mut c, &[3, 3]);
        assert!(
            c.lookup(&[2, 2, 0]).is_none(),
            "least recently used entry evicted"
        );
        assert!(c.lookup(&[1, 1, 0]).is_some());
        let mut c = StateCache::new(8, 16, 1);
        commit(&mut c, &[1, 1, 1]);
        commit(&mut c, &[2, 2, 2]);
        assert_eq!(c.len(), 1);
        commit(&mut c, &[9; 5]);
        assert_eq!(c.len(), 1, "a state over the byte budget is not kept");
        let mut c = StateCache::new(0, 1 << 20, 1);
        commit(&mut c, &[1, 2]);
        assert_eq!(c.len(), 0, "zero entries disables reuse");
        let mut c = StateCache::new(8, 1 << 20, 1);
        commit(&mut c, &[1, 1]);
        commit(&mut c, &[2, 2, 2]);
        c.evict_to(12, &[]);
        assert_eq!((c.len(), c.bytes()), (1, 12), "the older entry goes first");
        c.evict_to(0, &[]);
        assert_eq!(c.len(), 0);
    }

    /// A stand-in paged state: blocks shared between clones.
    #[derive(Debug, Clone)]
    struct Blocks(Vec<std::sync::Arc<[u32; 4]>>);

    impl Reusable for Blocks {
        fn rewind_point(&self, len: usize) -> usize {
            len
        }
        fn truncate(&mut self, len: usize) {
            self.0.truncate(len.div_ceil(4))
        }
        fn bytes(&self) -> usize {
            self.0.len() * 16
        }
        fn for_each_allocation(&self, f: &mut dyn FnMut(usize, usize)) {
            self.0.iter().for_each(|b| f(b.as_ptr() as usize, 16))
        }
    }

    #[test]
    fn shared_blocks_count_once_and_a_running_holder_keeps_its_own() {
        let blocks = |n: u32| Blocks((0..n).map(|i| std::sync::Arc::new([i; 4])).collect());
        let mut c = StateCache::new(8, 1 << 20, 1);
        let a = blocks(4);
        let ids: Vec<u32> = (0..16).collect();
        c.insert(ids.clone(), a.clone());
        // A second conversation sharing the first 8 positions (two blocks) and adding two.
        let mut b = a.clone();
        b.truncate(8);
        b.0.extend(blocks(2).0);
        let mut longer = ids[..8].to_vec();
        longer.extend([90, 91, 92, 93, 94, 95, 96, 97]);
        c.insert(longer.clone(), b.clone());
        assert_eq!(c.len(), 2);
        assert_eq!(c.bytes(), 6 * 16, "two shared blocks counted once");
        // A running sequence reused the first conversation: only what it does not hold counts.
        let running = c.lookup(&[ids.clone(), vec![7]].concat()).unwrap().state;
        assert_eq!(c.bytes_beside(&[&running]), 2 * 16);
        c.evict_to(2 * 16, &[&running]);
        assert_eq!(c.len(), 2, "the cache alone keeps 32 bytes alive: both stay");
        c.evict_to(16, &[&running]);
        assert_eq!(c.len(), 1, "the least recently used (the second) goes");
        assert_eq!(c.lookup(&[ids, vec![7]].concat()).unwrap().len, 16);
    }

    /// A stand-in recurrent state: rewinds only to its checkpoints.
    #[derive(Debug, Clone, PartialEq)]
    struct Recurrent {
        ids: Vec<u32>,
        marks: Vec<usize>,
    }

    impl Reusable for Recurrent {
        fn rewind_point(&self, len: usize) -> usize {
            self.marks
                .iter()
                .copied()
                .filter(|&m| m <= len)
                .max()
                .unwrap_or(0)
        }
        fn truncate(&mut self, len: usize) {
            self.ids.truncate(len);
            self.marks.retain(|&m| m <= len);
        }
        fn bytes(&self) -> usize {
            self.ids.len() * 4
        }
        fn for_each_allocation(&self, f: &mut dyn FnMut(usize, usize)) {
            f(self.ids.as_ptr() as usize, self.bytes())
        }
    }

    #[test]
    fn a_recurrent_state_rewinds_to_its_latest_checkpoint_inside_the_shared_prefix() {
        let mut c = StateCache::new(4, 1 << 20, 2);
        let ids: Vec<u32> = (0..10).collect();
        let state = |marks: Vec<usize>| Recurrent {
            ids: ids.clone(),
            marks,
        };
        c.insert(ids.clone(), state(vec![4, 8, 10]));
        // Shares 9 tokens: the checkpoint at 8 is the latest inside it.
        let mut prompt = ids[..9].to_vec();
        prompt.push(99);
        let r = c.lookup(&prompt).unwrap();
        assert_eq!(
            (r.len, r.state.ids.len(), r.state.marks.clone()),
            (8, 8, vec![4, 8])
        );
        // Shares 3 tokens, below the first checkpoint: nothing reusable.
        assert!(c.lookup(&[0, 1, 2, 77]).is_none());
        // Another entry with a checkpoint closer to the divergence wins.
        c.insert(vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 50], {
            let mut s = state(vec![9]);
            s.ids = vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 50];
            s
        });
        assert_eq!(c.lookup(&prompt).unwrap().len, 9);
    }
}
