//! Verification of one drafted pass (pure). A pass over `[t, d1 … dk]` (the pending token and k
//! drafts) yields the target's own pick at every row, `p0 … pk`, each made exactly as plain
//! decoding would make it (`Sampling::pick(row, position)`: greedy, or a draw keyed by
//! `(seed, position)`). Draft `d(i+1)` is accepted while it equals `p(i)`; the emitted tokens are
//! therefore `p0 … pm` — the accepted drafts followed by the target's own next token — which is
//! exactly what plain decoding emits, one token per pass, from the same state.

/// What one verified pass emits and keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Tokens to emit, in order (never empty): the accepted drafts, then the target's pick after
    /// them; cut after a stop id or when the output budget is spent.
    pub emitted: Vec<u32>,
    /// Rows of the pass to commit: the pending token and every accepted draft that is followed
    /// by an emitted token (`emitted.len()`: the last emitted token becomes the new pending one,
    /// never run, as in plain decoding).
    pub commit_rows: usize,
    /// Leading drafts equal to the target's picks (before any cut).
    pub accepted: usize,
    /// Whether the last emitted token is a stop id.
    pub stopped: bool,
}

/// Number of leading drafts that equal the target's pick at the row before them.
pub fn accepted_prefix(drafts: &[u32], picks: &[u32]) -> usize {
    drafts.iter().zip(picks).take_while(|(d, p)| d == p).count()
}

/// Decide a pass: `picks` has one entry per row (`drafts.len() + 1`); `budget` (>= 1) is the
/// number of tokens the request may still emit (output limit and context limit).
pub fn verify(drafts: &[u32], picks: &[u32], stop_ids: &[u32], budget: usize) -> Verdict {
    debug_assert_eq!(picks.len(), drafts.len() + 1, "one pick per row");
    let accepted = accepted_prefix(drafts, picks);
    let mut emitted = Vec::with_capacity(accepted + 1);
    let mut stopped = false;
    for &token in picks.iter().take(accepted + 1).take(budget.max(1)) {
        emitted.push(token);
        if stop_ids.contains(&token) {
            stopped = true;
            break;
        }
    }
    Verdict {
        commit_rows: emitted.len(),
        emitted,
        accepted,
        stopped,
    }
}

/// The most drafts worth running for a request that may still emit `budget` tokens and whose
/// sequence may grow by `room` positions: a pass over `k + 1` rows emits at most `k + 1` tokens.
pub fn draft_budget(max_width: usize, budget: usize, room: usize) -> usize {
    max_width
        .min(budget.saturating_sub(1))
        .min(room.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_drafts_is_plain_decoding() {
        let v = verify(&[], &[7], &[], 10);
        assert_eq!(
            v,
            Verdict {
                emitted: vec![7],
                commit_rows: 1,
                accepted: 0,
                stopped: false
            }
        );
    }

    #[test]
    fn all_drafts_right_emits_them_and_the_bonus_token() {
        let v = verify(&[1, 2, 3], &[1, 2, 3, 4], &[], 10);
        assert_eq!(v.emitted, vec![1, 2, 3, 4]);
        assert_eq!((v.accepted, v.commit_rows), (3, 4));
    }

    #[test]
    fn first_wrong_draft_emits_only_the_target_token() {
        let v = verify(&[9, 2, 3], &[1, 2, 3, 4], &[], 10);
        assert_eq!(v.emitted, vec![1]);
        assert_eq!((v.accepted, v.commit_rows), (0, 1));
    }

    #[test]
    fn a_mismatch_in_the_middle_cuts_there_even_if_later_drafts_match() {
        let v = verify(&[1, 8, 3], &[1, 2, 3, 4], &[], 10);
        assert_eq!(v.emitted, vec![1, 2]);
        assert_eq!(v.accepted, 1);
    }

    #[test]
    fn a_stop_id_among_accepted_drafts_ends_the_output_there() {
        let v = verify(&[1, 0, 3], &[1, 0, 3, 4], &[0], 10);
        assert_eq!(v.emitted, vec![1, 0]);
        assert!(v.stopped);
        assert_eq!(v.commit_rows, 2);
    }

    #[test]
    fn the_output_budget_caps_emitted_tokens() {
        let v = verify(&[1, 2, 3], &[1, 2, 3, 4], &[], 2);
        assert_eq!(v.emitted, vec![1, 2]);
        assert_eq!(v.commit_rows, 2);
        assert!(!v.stopped);
    }

    #[test]
    fn draft_budget_leaves_room_for_the_target_token() {
        assert_eq!(draft_budget(8, 1, 100), 0);
        assert_eq!(draft_budget(8, 5, 100), 4);
        assert_eq!(draft_budget(8, 100, 3), 2);
        assert_eq!(draft_budget(3, 100, 100), 3);
        assert_eq!(draft_budget(8, 0, 0), 0);
    }
}
