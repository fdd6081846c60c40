//! Pure step planning: which rows each running sequence contributes to the next batched pass.
//!
//! Every decoding sequence contributes its one pending token (decode is never starved by
//! prefill). Sequences still prefilling share a per-step budget of prompt tokens, in admission
//! order, so a long prompt is chunked and interleaved with the decode steps of the others.
//! Because the kernels are batch-invariant, neither the chunking nor the company a sequence keeps
//! changes its logits.

/// Where a running sequence is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// `done` of the prompt's `total` tokens are in the state.
    Prefill { done: usize, total: usize },
    /// The last sampled token is pending (not yet in the state).
    Decode,
}

/// One sequence's rows in a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Work {
    /// Index into the running list.
    pub seq: usize,
    /// For prefill: the prompt range `start..start + len`. For decode: `len == 1`, `start` unused.
    pub start: usize,
    pub len: usize,
    /// Whether the pass must return logits for this sequence's last row (a token is sampled).
    pub logits: bool,
}

/// Plan one pass over `phases` (running sequences in admission order) with at most
/// `prefill_budget` prompt rows (at least one row if any sequence is prefilling).
pub(crate) fn plan_step(phases: &[Phase], prefill_budget: usize) -> Vec<Work> {
    let mut budget = prefill_budget.max(1);
    let mut works = Vec::with_capacity(phases.len());
    for (seq, phase) in phases.iter().enumerate() {
        match *phase {
            Phase::Decode => works.push(Work {
                seq,
                start: 0,
                len: 1,
                logits: true,
            }),
            Phase::Prefill { done, total } if done < total && budget > 0 => {
                let len = (total - done).min(budget);
                budget -= len;
                works.push(Work {
                    seq,
                    start: done,
                    len,
                    logits: done + len == total,
                });
            }
            Phase::Prefill { .. } => {}
        }
    }
    works
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_rows_always_run_and_prefill_shares_the_budget_in_order() {
        let phases = [
            Phase::Prefill { done: 0, total: 10 },
            Phase::Decode,
            Phase::Prefill { done: 4, total: 6 },
            Phase::Decode,
        ];
        let w = plan_step(&phases, 8);
        assert_eq!(
            w,
            vec![
                Work {
                    seq: 0,
                    start: 0,
                    len: 8,
                    logits: false
                },
                Work {
                    seq: 1,
                    start: 0,
                    len: 1,
                    logits: true
                },
                Work {
                    seq: 3,
                    start: 0,
                    len: 1,
                    logits: true
                },
            ]
        );
        let w = plan_step(&phases, 12);
        assert_eq!(
            w[0],
            Work {
                seq: 0,
                start: 0,
                len: 10,
                logits: true
            }
        );
        assert_eq!(
            w[2],
            Work {
                seq: 2,
                start: 4,
                len: 2,
                logits: true
            }
        );
    }

    #[test]
    fn a_zero_budget_still_makes_progress() {
        let w = plan_step(&[Phase::Prefill { done: 2, total: 3 }], 0);
        assert_eq!(
            w,
            vec![Work {
                seq: 0,
                start: 2,
                len: 1,
                logits: true
            }]
        );
        assert!(plan_step(&[], 4).is_empty());
    }

    #[test]
    fn chunks_cover_the_prompt_exactly_once() {
        let total = 37;
        let mut done = 0;
        let mut covered = Vec::new();
        while done < total {
            let w = plan_step(&[Phase::Prefill { done, total }], 5);
            covered.extend(w[0].start..w[0].start + w[0].len);
            assert_eq!(w[0].logits, w[0].start + w[0].len == total);
            done += w[0].len;
        }
        assert_eq!(covered, (0..total).collect::<Vec<_>>());
    }
}
