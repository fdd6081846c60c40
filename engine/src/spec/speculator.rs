//! One request's drafting: its proposers in preference order (e.g. the draft head, then
//! n-gram), each with its own economics controller. Per step, [`Speculator::plan`] asks the
//! first proposer that is neither dropped nor backed off for a draft of the width its
//! controller chooses — a proposer that has nothing to offer passes to the next one — or runs
//! the target alone when the controller needs a baseline; [`Speculator::finish`] folds the
//! verified result and the measured time back in.

use std::sync::Arc;
use std::time::Instant;

use super::{Economics, EconomicsConfig, Observation, Outcome, Proposer, SpecStats, SpecSummary};
use crate::arch::Model;

#[derive(Debug)]
struct Lane {
    proposer: Box<dyn Proposer>,
    econ: Economics,
    dropped: bool,
}

/// The step being run: which lane drafted, how wide, and the time spent proposing.
#[derive(Debug, Clone, Copy)]
struct Current {
    lane: Option<usize>,
    width: usize,
    draft_seconds: f64,
}

/// What [`Speculator::plan`] decided for a step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Drafts to verify after the pending token (empty: a target-only step).
    pub drafts: Vec<u32>,
}

/// A request's proposers and their controllers.
#[derive(Debug)]
pub struct Speculator {
    lanes: Vec<Lane>,
    captures: Vec<String>,
    summary: SpecSummary,
    shared: Option<Arc<SpecStats>>,
    current: Option<Current>,
}

impl Speculator {
    /// Proposers in preference order, each with a controller made from `cfg`; step figures
    /// also go to `shared` when given.
    pub fn new(
        proposers: Vec<Box<dyn Proposer>>,
        cfg: &EconomicsConfig,
        shared: Option<Arc<SpecStats>>,
    ) -> Self {
        let mut captures: Vec<String> = Vec::new();
        for p in &proposers {
            for c in p.captures() {
                if !captures.contains(c) {
                    captures.push(c.clone());
                }
            }
        }
        let lanes = proposers
            .into_iter()
            .map(|proposer| Lane {
                proposer,
                econ: Economics::new(cfg.clone()),
                dropped: false,
            })
            .collect();
        Speculator {
            lanes,
            captures,
            summary: SpecSummary::default(),
            shared,
            current: None,
        }
    }

    /// Target trace tensors to capture for committed positions (union over the proposers).
    pub fn captures(&self) -> &[String] {
        &self.captures
    }

    /// This request's figures so far.
    pub fn summary(&self) -> &SpecSummary {
        &self.summary
    }

    /// Decide the next step for a sequence whose tokens are `history` (pending token last),
    /// with at most `budget` drafts useful.
    pub fn plan(&mut self, target: &dyn Model, history: &[u32], budget: usize) -> StepPlan {
        let mut spent = 0.0;
        for i in 0..self.lanes.len() {
            let lane = &mut self.lanes[i];
            if lane.dropped || lane.econ.is_off() {
                continue;
            }
            let width = lane.econ.width(budget);
            if width == 0 {
                break; // the controller wants a target-only step (baseline)
            }
            // Deferred context work is owed for committed rows, not charged to this draft.
            let caught_up = lane.proposer.catch_up(target);
            let started = Instant::now();
            let result = caught_up.and_then(|()| lane.proposer.propose(target, history, width));
            let seconds = started.elapsed().as_secs_f64();
            spent += seconds;
            match result {
                Ok(mut p) if !p.tokens.is_empty() => {
                    p.tokens.truncate(width);
                    self.current = Some(Current {
                        lane: Some(i),
                        width: p.tokens.len(),
                        draft_seconds: spent,
                    });
                    return StepPlan { drafts: p.tokens };
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(proposer = lane.proposer.kind().label(), error = %e, "proposer dropped for this request");
                    lane.dropped = true;
                    self.summary.proposer(lane.proposer.kind()).errors += 1;
                }
            }
        }
        self.current = Some(Current {
            lane: None,
            width: 0,
            draft_seconds: spent,
        });
        StepPlan::default()
    }

    /// The step planned last was verified: `accepted` drafts were accepted and the target pass
    /// took `verify_seconds`.
    pub fn finish(&mut self, accepted: usize, verify_seconds: f64) {
        let Some(cur) = self.current.take() else { return };
        let seconds = cur.draft_seconds + verify_seconds;
        let mut delta = SpecSummary::default();
        match cur.lane {
            None => {
                for lane in &mut self.lanes {
                    lane.econ.record(Outcome {
                        width: 0,
                        accepted: 0,
                        seconds,
                    });
                }
                delta.record_plain(seconds);
            }
            Some(i) => {
                for (j, lane) in self.lanes.iter_mut().enumerate() {
                    if j != i {
                        lane.econ.skip();
                    }
                }
                let lane = &mut self.lanes[i];
                let kind = lane.proposer.kind();
                let was_off = lane.econ.losses();
                lane.econ.record(Outcome {
                    width: cur.width,
                    accepted,
                    seconds,
                });
                delta.record_draft(kind, cur.width, accepted, cur.draft_seconds, verify_seconds);
                if lane.econ.losses() > was_off {
                    delta.proposer(kind).switched_off += 1;
                }
            }
        }
        self.summary.merge(&delta);
        if let Some(shared) = &self.shared {
            shared.add(&delta);
        }
    }

    /// Rows were committed to the target's state: pass them (and their captured hidden rows)
    /// to every live proposer. A proposer that fails is dropped.
    pub fn observe(&mut self, target: &dyn Model, obs: &Observation<'_>) {
        for lane in &mut self.lanes {
            if lane.dropped {
                continue;
            }
            if let Err(e) = lane.proposer.observe(target, obs) {
                tracing::debug!(proposer = lane.proposer.kind().label(), error = %e, "proposer dropped for this request");
                lane.dropped = true;
                let mut delta = SpecSummary::default();
                delta.proposer(lane.proposer.kind()).errors += 1;
                self.summary.merge(&delta);
                if let Some(shared) = &self.shared {
                    shared.add(&delta);
                }
            }
        }
    }
}
