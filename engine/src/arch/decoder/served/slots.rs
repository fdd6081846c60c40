//! Which sequence state each slot of a served device's caches mirrors, and how much of it: the
//! pure bookkeeping behind `DeviceModel` (no device, no I/O), tested on its own.
//!
//! A slot's mirror of a state is current up to `min(mirrored length, committed length)` while
//! the state has begun no pass since the mirror was written: between passes a state's positions
//! only get cut off (commit, rollback, truncate), never rewritten. A new state (a clone too: it
//! has its own identity) takes a free slot, else the least recently used slot that no sequence
//! of the pass holds, and starts from nothing.

use crate::error::{Error, Result};

/// A sequence of a pass as the slots see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seq {
    /// The state's identity ([`crate::state::SeqState::id`]).
    pub state: u64,
    /// Passes the state had begun before this one (when placing), or after it (when recording).
    pub passes: u64,
    /// Its committed positions before the pass (placing), or every position after it
    /// (recording).
    pub committed: usize,
}

/// Where a sequence of a pass runs: its slot, and how many of its first positions the slot holds
/// already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placed {
    pub slot: usize,
    pub current: usize,
}

/// What a slot mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mirror {
    state: u64,
    passes: u64,
    len: usize,
    /// When it was last written (a counter of passes).
    used: u64,
}

/// The slots of a served device's caches.
#[derive(Debug, Clone)]
pub(super) struct Slots {
    held: Vec<Option<Mirror>>,
    tick: u64,
}

impl Slots {
    /// `n` empty slots.
    pub fn new(n: usize) -> Slots {
        Slots {
            held: vec![None; n],
            tick: 0,
        }
    }

    /// A slot for every sequence of a pass (the typed refusal when the pass has more sequences
    /// than there are slots).
    pub fn place(&self, seqs: &[Seq]) -> Result<Vec<Placed>> {
        let mut taken = vec![false; self.held.len()];
        let mut placed: Vec<Option<Placed>> = seqs
            .iter()
            .map(|s| {
                let slot = self
                    .held
                    .iter()
                    .position(|m| m.is_some_and(|m| m.state == s.state))?;
                let m = self.held[slot].expect("found");
                taken[slot] = true;
                let current = if m.passes == s.passes {
                    m.len.min(s.committed)
                } else {
                    0
                };
                Some(Placed { slot, current })
            })
            .collect();
        for p in placed.iter_mut().filter(|p| p.is_none()) {
            let slot = (0..self.held.len())
                .filter(|&k| !taken[k])
                .min_by_key(|&k| self.held[k].map_or(0, |m| m.used + 1))
                .ok_or_else(|| Error::InvalidArgument {
                    field: "batch",
                    reason: format!(
                        "a pass of {} sequences needs more than the device's {} cache slots",
                        seqs.len(),
                        self.held.len()
                    ),
                })?;
            taken[slot] = true;
            *p = Some(Placed { slot, current: 0 });
        }
        Ok(placed.into_iter().flatten().collect())
    }

    /// After a pass: each placed slot mirrors its sequence as it is now (`seqs`, in the same
    /// order: passes begun and every position).
    pub fn record(&mut self, placed: &[Placed], seqs: &[Seq]) {
        self.tick += 1;
        for (p, s) in placed.iter().zip(seqs) {
            self.held[p.slot] = Some(Mirror {
                state: s.state,
                passes: s.passes,
                len: s.committed,
                used: self.tick,
            });
        }
    }

    /// Every slot mirrors nothing.
    pub fn clear(&mut self) {
        self.held.iter_mut().for_each(|m| *m = None);
    }

    /// After a failed pass: the placed slots mirror nothing (their rows may be half written).
    pub fn forget(&mut self, placed: &[Placed]) {
        for p in placed {
            self.held[p.slot] = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(state: u64, passes: u64, committed: usize) -> Seq {
        Seq {
            state,
            passes,
            committed,
        }
    }

    fn placed(slot: usize, current: usize) -> Placed {
        Placed { slot, current }
    }

    #[test]
    fn a_state_keeps_its_slot_and_what_is_still_its_own() {
        let mut s = Slots::new(2);
        let p = s.place(&[seq(7, 0, 0)]).unwrap();
        assert_eq!(p, [placed(0, 0)]);
        s.record(&p, &[seq(7, 1, 5)]);
        // The next pass after committing every row: all 5 positions are current.
        assert_eq!(s.place(&[seq(7, 1, 5)]).unwrap(), [placed(0, 5)]);
        // Rows dropped (a rejected draft): only the kept prefix is.
        assert_eq!(s.place(&[seq(7, 1, 3)]).unwrap(), [placed(0, 3)]);
        // A pass the slot did not see: nothing is.
        assert_eq!(s.place(&[seq(7, 2, 9)]).unwrap(), [placed(0, 0)]);
    }

    #[test]
    fn new_states_take_free_then_least_recently_used_slots() {
        let mut s = Slots::new(2);
        let p = s.place(&[seq(1, 0, 0), seq(2, 0, 0)]).unwrap();
        assert_eq!(p, [placed(0, 0), placed(1, 0)]);
        s.record(&p, &[seq(1, 1, 4), seq(2, 1, 4)]);
        let p = s.place(&[seq(2, 1, 4)]).unwrap();
        s.record(&p, &[seq(2, 2, 5)]);
        // State 3 evicts state 1 (older), never state 2 which this pass holds.
        assert_eq!(
            s.place(&[seq(2, 2, 5), seq(3, 0, 0)]).unwrap(),
            [placed(1, 5), placed(0, 0)]
        );
        // More sequences than slots: refused.
        assert!(s.place(&[seq(4, 0, 0), seq(5, 0, 0), seq(6, 0, 0)]).is_err());
    }

    #[test]
    fn a_failed_pass_leaves_nothing_current() {
        let mut s = Slots::new(1);
        let p = s.place(&[seq(1, 0, 0)]).unwrap();
        s.record(&p, &[seq(1, 1, 4)]);
        let p = s.place(&[seq(1, 1, 4)]).unwrap();
        s.forget(&p);
        assert_eq!(s.place(&[seq(1, 1, 4)]).unwrap(), [placed(0, 0)]);
    }
}
