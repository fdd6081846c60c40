//! The expert cache proper: a fixed number of equal-size, page-aligned slots, a map from expert
//! to slot, a pluggable eviction policy, and RAII [`ExpertHandle`]s that pin a slot while its
//! weights are in use.
//!
//! Slot life cycle: `Empty -> Loading -> Ready` (or `Failed`), back to `Loading` when evicted
//! for another expert. A read that fails after another requester joined it (a demand joining a
//! prefetch, or a pass joining a read its aborted predecessor left in flight) does not fail the
//! joiner: the slot goes to `Reread` and one waiter reads it again itself (under the lock), so
//! a transient error of somebody else's read is never a request's error; the failure of a read
//! nobody joined, or of the re-read, is. A slot is only ever chosen as a victim when it is unpinned and not
//! `Loading` (its read may still be writing), so a pinned expert's bytes never change; a
//! `Loading` slot nobody pinned (a prefetch) can be reclaimed only by cancelling its read
//! before a worker starts it. Views of a slot's bytes exist only through handles of a `Ready`
//! slot, which is what the buffer invariant of [`super::buffer`] requires.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::ExpertKey;
use super::buffer::AlignedBuf;
use super::policy::EvictionPolicy;
use super::reader::{ReadError, ReadResult, Ticket};
use crate::error::Result;
use crate::sync::{lock, wait};

#[derive(Debug, Clone, PartialEq)]
enum Status {
    Empty,
    Loading,
    Ready,
    Failed(ReadError),
    /// A read somebody joined failed: one waiter reads it again.
    Reread,
}

#[derive(Debug)]
struct Slot {
    key: Option<ExpertKey>,
    status: Status,
    pins: u32,
    ticket: Option<Ticket>,
    /// Loaded by a prefetch and not yet used by a demand.
    speculative: bool,
    /// A requester other than the one that submitted the read in flight joined it.
    joined: bool,
}

#[derive(Debug)]
struct State {
    map: HashMap<ExpertKey, usize>,
    slots: Vec<Slot>,
    policy: Box<dyn EvictionPolicy>,
    wasted_prefetches: u64,
}

#[derive(Debug)]
struct Shared {
    bufs: Vec<Arc<AlignedBuf>>,
    slot_bytes: usize,
    state: Mutex<State>,
    cv: Condvar,
}

/// The outcome of asking for an expert.
#[derive(Debug)]
pub enum Lookup {
    /// Loaded; the slot is pinned for the caller.
    Hit { slot: usize, speculative: bool },
    /// Being read (by a prefetch); pinned for the caller, who may promote the read.
    Loading { slot: usize, ticket: Option<Ticket> },
    /// Assigned to a slot that the caller must fill (submit the read, then `complete`).
    Miss { slot: usize },
    /// Present already (prefetch only).
    Present,
    /// Every slot is pinned or loading.
    NoSlot,
}

/// What [`ExpertCache::wait_any`] woke for (an index into its `slots`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The slot is `Ready`.
    Ready(usize),
    /// A read somebody joined failed; the caller must submit its own read of the slot (it is
    /// `Loading` again and still pinned by the caller).
    Reread(usize),
}

/// The slot table.
#[derive(Debug, Clone)]
pub struct ExpertCache {
    shared: Arc<Shared>,
}

/// A pinned, loaded slot; the bytes stay valid and unchanged until it is dropped.
#[derive(Debug)]
pub struct ExpertHandle {
    shared: Arc<Shared>,
    slot: usize,
}

impl ExpertHandle {
    /// The slot number.
    pub fn slot(&self) -> usize {
        self.slot
    }
}

impl AsRef<[u8]> for ExpertHandle {
    fn as_ref(&self) -> &[u8] {
        &(*self.shared.bufs[self.slot]).as_ref()[..self.shared.slot_bytes]
    }
}

impl Drop for ExpertHandle {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        st.slots[self.slot].pins -= 1;
        drop(st);
        self.shared.cv.notify_all();
    }
}

impl ExpertCache {
    /// `slots` buffers of `slot_bytes` each (memory is touched only when read into).
    pub fn new(slots: usize, slot_bytes: usize, policy: Box<dyn EvictionPolicy>) -> Result<Self> {
        let bufs = (0..slots)
            .map(|_| AlignedBuf::new(slot_bytes).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        let slots_v = (0..slots)
            .map(|_| Slot {
                key: None,
                status: Status::Empty,
                pins: 0,
                ticket: None,
                speculative: false,
                joined: false,
            })
            .collect();
        let state = State {
            map: HashMap::new(),
            slots: slots_v,
            policy,
            wasted_prefetches: 0,
        };
        Ok(ExpertCache {
            shared: Arc::new(Shared {
                bufs,
                slot_bytes,
                state: Mutex::new(state),
                cv: Condvar::new(),
            }),
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.shared.bufs.len()
    }

    /// The buffer of a slot (for the reader; see the module docs for when it may be written).
    pub fn buffer(&self, slot: usize) -> Arc<AlignedBuf> {
        self.shared.bufs[slot].clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.shared.state)
    }

    /// Tell the policy the router selected these experts.
    pub fn select(&self, keys: &[ExpertKey]) {
        let mut st = self.lock();
        keys.iter().for_each(|&k| st.policy.on_select(k));
    }

    /// A pass ended (policy decay).
    pub fn end_pass(&self) {
        self.lock().policy.on_pass_end();
    }

    /// Seed policy hotness.
    pub fn seed(&self, key: ExpertKey, hotness: f32) {
        self.lock().policy.seed(key, hotness);
    }

    /// Whether `key` is loaded or being loaded.
    pub fn contains(&self, key: ExpertKey) -> bool {
        self.lock().map.contains_key(&key)
    }

    /// Record a use of `key` with the eviction policy if it is cached (a forecast that it is
    /// about to be used); returns whether it is.
    pub fn touch(&self, key: ExpertKey) -> bool {
        let mut st = self.lock();
        let Some(&slot) = st.map.get(&key) else {
            return false;
        };
        st.policy.on_access(slot, key);
        true
    }

    /// Prefetches evicted before any demand used them.
    pub fn wasted_prefetches(&self) -> u64 {
        self.lock().wasted_prefetches
    }

    /// Demand lookup: pins the slot for the caller in every outcome but `NoSlot`.
    pub fn acquire(&self, key: ExpertKey) -> Lookup {
        let mut st = self.lock();
        if let Some(&slot) = st.map.get(&key) {
            let s = &mut st.slots[slot];
            match s.status.clone() {
                Status::Ready => {
                    s.pins += 1;
                    let speculative = std::mem::take(&mut s.speculative);
                    st.policy.on_access(slot, key);
                    return Lookup::Hit { slot, speculative };
                }
                Status::Loading | Status::Reread => {
                    s.pins += 1;
                    s.speculative = false;
                    s.joined = true;
                    let ticket = s.ticket.clone();
                    st.policy.on_access(slot, key);
                    return Lookup::Loading { slot, ticket };
                }
                Status::Failed(_) | Status::Empty if s.pins == 0 => {
                    s.status = Status::Loading;
                    s.pins = 1;
                    s.speculative = false;
                    s.joined = false;
                    st.policy.on_access(slot, key);
                    return Lookup::Miss { slot };
                }
                _ => return Lookup::NoSlot,
            }
        }
        match Self::claim(&mut st, key) {
            Some(slot) => {
                st.slots[slot].pins = 1;
                Lookup::Miss { slot }
            }
            None => Lookup::NoSlot,
        }
    }

    /// Prefetch lookup: claims an unpinned slot for `key` unless present (nothing is pinned).
    pub fn claim_for_prefetch(&self, key: ExpertKey) -> Lookup {
        let mut st = self.lock();
        if st.map.contains_key(&key) {
            return Lookup::Present;
        }
        match Self::claim(&mut st, key) {
            Some(slot) => {
                st.slots[slot].speculative = true;
                Lookup::Miss { slot }
            }
            None => Lookup::NoSlot,
        }
    }

    /// Pick an empty slot or evict the policy's victim; the slot becomes `Loading` for `key`.
    fn claim(st: &mut State, key: ExpertKey) -> Option<usize> {
        let empty = st
            .slots
            .iter()
            .position(|s| s.key.is_none() && s.pins == 0 && s.status != Status::Loading);
        let slot = match empty {
            Some(s) => s,
            None => {
                let candidates: Vec<usize> = st
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.pins == 0 && s.status != Status::Loading)
                    .map(|(i, _)| i)
                    .collect();
                st.policy.victim(&candidates)?
            }
        };
        let s = &mut st.slots[slot];
        if let Some(old) = s.key.take() {
            if s.speculative && s.status == Status::Ready {
                st.wasted_prefetches += 1;
            }
            st.map.remove(&old);
            st.policy.on_remove(slot);
        }
        let s = &mut st.slots[slot];
        s.key = Some(key);
        s.status = Status::Loading;
        s.ticket = None;
        s.speculative = false;
        s.joined = false;
        st.map.insert(key, slot);
        st.policy.on_access(slot, key);
        Some(slot)
    }

    /// Remember the read filling `slot` (for promotion and cancellation).
    pub fn set_ticket(&self, slot: usize, ticket: Ticket) {
        let mut st = self.lock();
        if st.slots[slot].status == Status::Loading {
            st.slots[slot].ticket = Some(ticket);
        }
    }

    /// The read of `slot` for `key` finished.
    pub fn complete(&self, slot: usize, key: ExpertKey, result: ReadResult) {
        let mut st = self.lock();
        let s = &mut st.slots[slot];
        if s.key == Some(key) && s.status == Status::Loading {
            s.status = match result {
                Ok(()) => Status::Ready,
                Err(_) if s.joined && s.pins > 0 => Status::Reread,
                Err(e) => Status::Failed(e),
            };
            s.ticket = None;
            s.joined = false;
        }
        drop(st);
        self.shared.cv.notify_all();
    }

    /// Make `key` (a prefetch the router did not select) the policy's next victim.
    pub fn demote(&self, key: ExpertKey) {
        let mut st = self.lock();
        if let Some(&slot) = st.map.get(&key) {
            st.policy.demote(slot);
        }
    }

    /// Cancel an unpinned prefetch of `key` whose read has not started; frees its slot.
    pub fn cancel_prefetch(&self, key: ExpertKey, cancel: impl FnOnce(&Ticket) -> bool) -> bool {
        let mut st = self.lock();
        let Some(&slot) = st.map.get(&key) else {
            return false;
        };
        let s = &st.slots[slot];
        if s.pins != 0 || s.status != Status::Loading {
            return false;
        }
        let Some(ticket) = s.ticket.clone() else {
            return false;
        };
        if !cancel(&ticket) {
            return false;
        }
        st.map.remove(&key);
        st.policy.on_remove(slot);
        let s = &mut st.slots[slot];
        *s = Slot {
            key: None,
            status: Status::Empty,
            pins: 0,
            ticket: None,
            speculative: false,
            joined: false,
        };
        drop(st);
        self.shared.cv.notify_all();
        true
    }

    /// Wait until one of `slots` (each pinned by the caller) is loaded, or a read somebody
    /// joined failed ([`Woken::Reread`]: the caller reads it again); returns which and the time
    /// spent blocked. Any other failed read is an error.
    pub fn wait_any(&self, slots: &[usize]) -> Result<(Woken, Duration)> {
        let start = Instant::now();
        let mut st = self.lock();
        loop {
            for (i, &slot) in slots.iter().enumerate() {
                match &st.slots[slot].status {
                    Status::Ready => return Ok((Woken::Ready(i), start.elapsed())),
                    Status::Failed(e) => {
                        return Err(e.clone().into());
                    }
                    Status::Reread => {
                        st.slots[slot].status = Status::Loading;
                        st.slots[slot].joined = false;
                        return Ok((Woken::Reread(i), start.elapsed()));
                    }
                    _ => {}
                }
            }
            st = wait(&self.shared.cv, st);
        }
    }

    /// Wait (bounded) for any slot to change state, e.g. to be unpinned.
    pub fn wait_change(&self) -> Duration {
        let start = Instant::now();
        let st = self.lock();
        let _unused = self
            .shared
            .cv
            .wait_timeout(st, Duration::from_millis(20))
            .unwrap();
        start.elapsed()
    }

    /// A handle for a slot the caller pinned (by `acquire`) and that is now `Ready`. The pin
    /// moves into the handle.
    pub fn handle(&self, slot: usize) -> ExpertHandle {
        debug_assert_eq!(self.lock().slots[slot].status, Status::Ready);
        ExpertHandle {
            shared: self.shared.clone(),
            slot,
        }
    }

    /// Release a pin taken by `acquire` without making a handle (error paths).
    pub fn unpin(&self, slot: usize) {
        drop(ExpertHandle {
            shared: self.shared.clone(),
            slot,
        });
    }

    /// Keys currently loaded or loading (for tests and stats).
    pub fn resident_keys(&self) -> Vec<ExpertKey> {
        let mut v: Vec<ExpertKey> = self.lock().map.keys().copied().collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::policy::Lru;

    fn k(e: u32) -> ExpertKey {
        ExpertKey { layer: 0, expert: e }
    }

    fn load(c: &ExpertCache, e: u32) -> ExpertHandle {
        match c.acquire(k(e)) {
            Lookup::Miss { slot } => {
                c.complete(slot, k(e), Ok(()));
                c.handle(slot)
            }
            Lookup::Hit { slot, .. } => c.handle(slot),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn eio() -> ReadError {
        ReadError::Io {
            path: "shard".into(),
            offset: 0,
            len: 4096,
            kind: std::io::ErrorKind::Other,
            message: "injected".into(),
        }
    }

    #[test]
    fn a_failed_prefetch_a_demand_joined_is_read_again_by_the_demand() {
        let c = ExpertCache::new(1, 4096, Box::new(Lru::new(1))).unwrap();
        let Lookup::Miss { slot } = c.claim_for_prefetch(k(5)) else {
            panic!()
        };
        assert!(
            matches!(c.acquire(k(5)), Lookup::Loading { .. }),
            "the demand joins"
        );
        c.complete(slot, k(5), Err(eio()));
        let (woken, _) = c.wait_any(&[slot]).unwrap();
        assert_eq!(woken, Woken::Reread(0));
        // The demand's own read: its failure is the demand's error.
        c.complete(slot, k(5), Err(eio()));
        assert!(c.wait_any(&[slot]).is_err());
        c.unpin(slot);
        // A prefetch that fails with nobody waiting is re-read by the next demand's lookup.
        let Lookup::Miss { slot } = c.acquire(k(5)) else {
            panic!("a failed, unpinned slot is a miss")
        };
        c.complete(slot, k(5), Ok(()));
        assert_eq!(c.wait_any(&[slot]).unwrap().0, Woken::Ready(0));
        c.unpin(slot);

        // A demand read an aborted pass left in flight (its pin released) and the next pass
        // joined: the joiner reads it again rather than failing.
        let Lookup::Miss { slot } = c.acquire(k(6)) else {
            panic!()
        };
        c.unpin(slot);
        assert!(matches!(c.acquire(k(6)), Lookup::Loading { .. }));
        c.complete(slot, k(6), Err(eio()));
        assert_eq!(c.wait_any(&[slot]).unwrap().0, Woken::Reread(0));
    }

    #[test]
    fn pinned_slots_are_never_evicted_and_handles_unpin_on_drop() {
        let c = ExpertCache::new(2, 4096, Box::new(Lru::new(2))).unwrap();
        let a = load(&c, 1);
        let b = load(&c, 2);
        assert!(matches!(c.acquire(k(3)), Lookup::NoSlot), "both slots pinned");
        drop(a);
        let h3 = load(&c, 3);
        assert_eq!(h3.slot(), 0, "expert 1's slot was the only candidate");
        assert_eq!(c.resident_keys(), vec![k(2), k(3)]);
        drop(b);
        drop(h3);
        assert!(matches!(c.acquire(k(2)), Lookup::Hit { .. }));
    }

    #[test]
    fn loading_slots_are_not_victims_and_prefetches_can_be_cancelled() {
        let c = ExpertCache::new(1, 4096, Box::new(Lru::new(1))).unwrap();
        let Lookup::Miss { slot } = c.claim_for_prefetch(k(5)) else {
            panic!()
        };
        assert!(matches!(c.claim_for_prefetch(k(5)), Lookup::Present));
        assert!(
            matches!(c.acquire(k(6)), Lookup::NoSlot),
            "a loading slot cannot be evicted"
        );
        assert!(
            !c.cancel_prefetch(k(5), |_| true),
            "no ticket yet: nothing to cancel"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, [0u8; 8]).unwrap();
        let ticket = {
            // A ticket that is queued forever: a pool with no chance to run it is not needed;
            // cancel() succeeds because the closure says so.
            let pool = crate::cache::reader::ReaderPool::new(&[path], &Default::default()).unwrap();
            pool.submit(
                c.buffer(slot),
                &[],
                crate::cache::reader::Priority::Prefetch,
                None,
            )
        };
        c.set_ticket(slot, ticket);
        assert!(c.cancel_prefetch(k(5), |_| true));
        assert!(matches!(c.acquire(k(6)), Lookup::Miss { .. }));
    }

    #[test]
    fn failed_reads_surface_as_errors_and_can_be_retried() {
        let c = ExpertCache::new(1, 4096, Box::new(Lru::new(1))).unwrap();
        let Lookup::Miss { slot } = c.acquire(k(1)) else {
            panic!()
        };
        let e = std::io::Error::other("disk on fire");
        c.complete(
            slot,
            k(1),
            Err(ReadError::io(std::path::Path::new("s.safetensors"), 0, 8, &e)),
        );
        assert!(
            c.wait_any(&[slot])
                .unwrap_err()
                .to_string()
                .contains("disk on fire")
        );
        c.unpin(slot);
        assert!(
            matches!(c.acquire(k(1)), Lookup::Miss { .. }),
            "a failed slot is read again"
        );
    }
}
