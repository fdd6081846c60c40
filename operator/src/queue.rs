//! The reconcile queue as Prometheus sees it (`deltafin_operator_queue_depth`), pure.
//!
//! kube-runtime's controller keeps its queue private, so the operator mirrors it: a watch event
//! that maps to a model queues it now, a finished reconcile queues it again at its requeue time,
//! and a reconcile that starts takes it off. The depth is the number of models whose time has
//! come and whose reconcile has not started, deduplicated per model as the controller's scheduler
//! does (controller-runtime's `workqueue_depth` counts the same way; delayed requeues are not
//! counted until due).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

/// Models (keys `K`) waiting for a reconcile, each with the earliest time it is due.
#[derive(Debug)]
pub struct WorkQueue<K> {
    waiting: HashMap<K, Instant>,
}

impl<K> Default for WorkQueue<K> {
    fn default() -> Self {
        WorkQueue {
            waiting: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> WorkQueue<K> {
    /// `key` is due at `at` (the earlier of this and any time it was already due).
    pub fn schedule(&mut self, key: &K, at: Instant) {
        self.waiting
            .entry(key.clone())
            .and_modify(|t| *t = (*t).min(at))
            .or_insert(at);
    }

    /// The reconcile of `key` started: whatever was waiting is being handled.
    pub fn start(&mut self, key: &K) {
        self.waiting.remove(key);
    }

    /// Models due at `now` whose reconcile has not started, among those `exists` still holds
    /// (the controller skips a model that is gone, whatever was queued for it); the entries of
    /// models that are gone are dropped.
    pub fn depth(&mut self, now: Instant, exists: impl Fn(&K) -> bool) -> usize {
        self.waiting.retain(|k, _| exists(k));
        self.waiting.values().filter(|&&t| t <= now).count()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_model_counts_once_while_due_and_not_before() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let all = |_: &&str| true;
        let mut q = WorkQueue::default();
        q.schedule(&"a/m", t0);
        q.schedule(&"a/m", t0);
        q.schedule(&"b/m", t0 + s(300));
        assert_eq!(
            q.depth(t0, all),
            1,
            "two events for one model are one item; a requeue waits"
        );
        q.start(&"a/m");
        assert_eq!(q.depth(t0, all), 0);
        // An event while the reconcile runs, then the reconcile's own requeue: still due now.
        q.schedule(&"a/m", t0 + s(1));
        q.schedule(&"a/m", t0 + s(15));
        assert_eq!(q.depth(t0 + s(1), all), 1);
        assert_eq!(q.depth(t0 + s(300), all), 2, "the requeue comes due");
        assert_eq!(
            q.depth(t0 + s(300), |k: &&str| *k != "b/m"),
            1,
            "a model that is gone waits for nothing"
        );
        assert_eq!(q.depth(t0 + s(300), all), 1, "and is forgotten");
    }
}
