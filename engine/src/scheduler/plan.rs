//! Pure step planning: which rows each running sequence contributes to the next batched pass.
//!
//! Every decoding sequence contributes its one pending token (decode is never starved by
//! prefill). Sequences still prefilling share a per-step [`PrefillBudget`], **shortest remaining
//! prompt first** (ties in admission order), so a short prompt that arrives while a long one
//! prefills is served at the next step instead of after the whole long prompt. The budget counts
//! both prompt rows and *attended positions* (a row at position `p` attends `p + 1` positions,
//! which is what attention costs), so chunks deep into a long prompt get shorter and a step never
//! grows with the prompt's length. Because the kernels are batch-invariant, neither the chunking
//! nor the company a sequence keeps changes its logits.

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

/// What one step may spend on prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefillBudget {
    /// Prompt rows per step.
    pub tokens: usize,
    /// Attended positions per step (`Σ (p + 1)` over the prefill rows at positions `p`).
    pub positions: usize,
}

/// Attended positions of the rows `start..start + len`.
pub(crate) fn positions(start: usize, len: usize) -> usize {
    len * (start + 1) + len * len.saturating_sub(1) / 2
}

/// The longest `len <= max` whose rows from `start` attend at most `budget` positions.
fn rows_within(start: usize, max: usize, budget: usize) -> usize {
    let (mut lo, mut hi) = (0, max);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if positions(start, mid) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Plan one pass over `phases` (running sequences in admission order): every decode row, then
/// prefill chunks shortest-remaining first within `budget` (at least one row if any sequence is
/// prefilling, so progress never stops). Works come back in running order.
pub(crate) fn plan_step(phases: &[Phase], budget: PrefillBudget) -> Vec<Work> {
    let mut works: Vec<Work> = Vec::with_capacity(phases.len());
    let mut prefilling: Vec<(usize, usize, usize)> = Vec::new();
    for (seq, phase) in phases.iter().enumerate() {
        match *phase {
            Phase::Decode => works.push(Work {
                seq,
                start: 0,
                len: 1,
                logits: true,
            }),
            Phase::Prefill { done, total } if done < total => prefilling.push((seq, done, total)),
            Phase::Prefill { .. } => {}
        }
    }
    prefilling.sort_by_key(|&(seq, done, total)| (total - done, seq));
    let (mut tokens, mut attended) = (budget.tokens.max(1), budget.positions.max(1));
    for (i, &(seq, done, total)) in prefilling.iter().enumerate() {
        let mut len = rows_within(done, (total - done).min(tokens), attended);
        if i == 0 {
            len = len.max(1);
        }
        if len == 0 {
            break;
        }
        tokens = tokens.saturating_sub(len);
        attended = attended.saturating_sub(positions(done, len));
        works.push(Work {
            seq,
            start: done,
            len,
            logits: done + len == total,
        });
        if tokens == 0 || attended == 0 {
            break;
        }
    }
    works.sort_by_key(|w| w.seq);
    works
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token budget with no attention limit.
    fn tokens(n: usize) -> PrefillBudget {
        PrefillBudget {
            tokens: n,
            positions: usize::MAX,
        }
    }

    #[test]
    fn a_short_prompt_goes_first_and_is_not_queued_behind_a_long_one() {
        let phases = [
            Phase::Prefill {
                done: 256,
                total: 16_000,
            },
            Phase::Prefill { done: 0, total: 3 },
            Phase::Decode,
        ];
        let w = plan_step(&phases, tokens(256));
        assert_eq!(w.len(), 3);
        assert_eq!(
            (w[1].seq, w[1].len, w[1].logits),
            (1, 3, true),
            "the short prompt completes"
        );
        assert_eq!(
            (w[0].seq, w[0].start, w[0].len),
            (0, 256, 253),
            "the long one gets the rest"
        );
    }

    #[test]
    fn deep_chunks_shrink_so_a_step_attends_a_bounded_number_of_positions() {
        let budget = PrefillBudget {
            tokens: 256,
            positions: 256 * 4096,
        };
        let shallow = plan_step(
            &[Phase::Prefill {
                done: 0,
                total: 20_000,
            }],
            budget,
        );
        assert_eq!(shallow[0].len, 256);
        let deep = plan_step(
            &[Phase::Prefill {
                done: 16_000,
                total: 20_000,
            }],
            budget,
        );
        assert!(deep[0].len < 70 && deep[0].len > 60, "{}", deep[0].len);
        assert!(positions(16_000, deep[0].len) <= budget.positions);
        assert!(positions(16_000, deep[0].len + 1) > budget.positions);
        // Even a budget smaller than one row's cost makes progress.
        let tiny = PrefillBudget {
            tokens: 256,
            positions: 1,
        };
        assert_eq!(
            plan_step(
                &[Phase::Prefill {
                    done: 9_000,
                    total: 9_001
                }],
                tiny
            )[0]
            .len,
            1
        );
    }

    #[test]
    fn decode_rows_always_run_and_prefill_shares_the_budget_shortest_first() {
        let phases = [
            Phase::Prefill { done: 0, total: 10 },
            Phase::Decode,
            Phase::Prefill { done: 4, total: 6 },
            Phase::Decode,
        ];
        let work = |seq, start, len, logits| Work {
            seq,
            start,
            len,
            logits,
        };
        assert_eq!(
            plan_step(&phases, tokens(8)),
            vec![
                work(0, 0, 6, false),
                work(1, 0, 1, true),
                work(2, 4, 2, true),
                work(3, 0, 1, true),
            ]
        );
        let w = plan_step(&phases, tokens(2));
        assert_eq!(
            w,
            vec![work(1, 0, 1, true), work(2, 4, 2, true), work(3, 0, 1, true)]
        );
        let w = plan_step(&phases, tokens(12));
        assert_eq!((w[0], w[2]), (work(0, 0, 10, true), work(2, 4, 2, true)));
    }

    #[test]
    fn a_zero_budget_still_makes_progress() {
        let w = plan_step(&[Phase::Prefill { done: 2, total: 3 }], tokens(0));
        assert_eq!(
            w,
            vec![Work {
                seq: 0,
                start: 2,
                len: 1,
                logits: true
            }]
        );
        assert!(plan_step(&[], tokens(4)).is_empty());
    }

    #[test]
    fn chunks_cover_the_prompt_exactly_once() {
        let total = 37;
        let mut done = 0;
        let mut covered = Vec::new();
        while done < total {
            let w = plan_step(&[Phase::Prefill { done, total }], tokens(5));
            covered.extend(w[0].start..w[0].start + w[0].len);
            assert_eq!(w[0].logits, w[0].start + w[0].len == total);
            done += w[0].len;
        }
        assert_eq!(covered, (0..total).collect::<Vec<_>>());
    }
}
