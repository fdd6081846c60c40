//! Context memory: under a memory budget, every byte of sequence state — attention caches,
//! recurrent states, their checkpoints and the reuse cache — lives in one pool planned inside
//! the budget (`--context-memory`), so a long context is refused or waits instead of growing
//! the process past its cgroup limit. Pure decisions on byte counts, tested without a model.
//!
//! * A request whose prompt alone cannot fit in the pool is refused at submission, with an
//!   error naming the pool and the longest context it holds.
//! * A request joins the batch when its prompt's state fits beside what the running sequences
//!   hold; the reuse cache gives way first (it is only an optimisation), otherwise it waits for
//!   running requests to finish.
//! * Before each pass, the growth it causes (rows, checkpoints) must fit; the reuse cache gives
//!   way first, then the most recently admitted growing sequences fail with a clear error.

use crate::arch::StateSize;
use crate::cache::plan::human;
use crate::error::Error;
use crate::state::BLOCK_POSITIONS;

/// Bytes a sequence holding `tokens` positions costs with `checkpoints` recurrent-state
/// checkpoints, times `copies` (the choices of an `n > 1` request each hold a state).
pub(crate) fn state_bytes(size: StateSize, tokens: usize, checkpoints: usize, copies: usize) -> u64 {
    size.bytes(tokens, checkpoints) * copies.max(1) as u64
}

/// The longest context one sequence (with `checkpoints`) holds in `pool` bytes, capped at
/// `cap` (the model's context limit): whole cache blocks.
pub fn longest_context(size: StateSize, pool: u64, checkpoints: usize, cap: usize) -> usize {
    let fixed = size.bytes(0, checkpoints);
    if pool < fixed {
        return 0;
    }
    match size.per_token {
        0 => cap,
        t => (((pool - fixed) / t) as usize / BLOCK_POSITIONS * BLOCK_POSITIONS).min(cap),
    }
}

/// Tokens per sequence the automatic context memory plans for (at most; less when the model's
/// or the server's context limit is shorter).
pub const AUTO_CONTEXT_TOKENS: usize = 32_768;

/// The automatic context memory: `max_batch` sequences of `min(limit, 32k)` tokens with one
/// checkpoint each, but at most a quarter of the memory budget.
pub fn auto_context_bytes(size: StateSize, budget: u64, max_batch: usize, limit: usize) -> u64 {
    let tokens = limit.min(AUTO_CONTEXT_TOKENS);
    state_bytes(size, tokens, 1, max_batch).min(budget / 4)
}

/// Whether a request may join the running batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// It fits; the reuse cache must shrink to at most this many bytes.
    Now { cache_limit: u64 },
    /// Not beside the running sequences: wait for one to finish.
    Wait,
}

/// Admit a request needing `need` bytes when running sequences hold `used` of `pool`.
pub(crate) fn admit(pool: u64, used: u64, need: u64) -> Admission {
    match pool.checked_sub(used).and_then(|free| free.checked_sub(need)) {
        Some(cache_limit) => Admission::Now { cache_limit },
        // Nothing running: it was checked to fit the pool at submission.
        None if used == 0 => Admission::Now { cache_limit: 0 },
        None => Admission::Wait,
    }
}

/// Which growing sequences must stop so a pass fits: `sequences` are `(held, growth)` byte
/// counts in admission order; the latest admitted growers go first. Returns their indices and
/// the bytes the reuse cache may keep afterwards.
pub(crate) fn fit_pass(pool: u64, sequences: &[(u64, u64)]) -> (Vec<usize>, u64) {
    let mut total: u64 = sequences.iter().map(|&(held, grow)| held + grow).sum();
    let mut stop = Vec::new();
    for (i, &(held, grow)) in sequences.iter().enumerate().rev() {
        if total <= pool {
            break;
        }
        if grow > 0 {
            total -= held + grow;
            stop.push(i);
        }
    }
    stop.reverse();
    (stop, pool.saturating_sub(total))
}

/// The error for a request whose prompt (`tokens` positions, for each of `choices`) cannot fit.
pub(crate) fn too_long(
    size: StateSize,
    pool: u64,
    tokens: usize,
    checkpoints: usize,
    choices: usize,
    cap: usize,
) -> Error {
    let per_choice = if choices > 1 { " per choice" } else { "" };
    Error::Budget(format!(
        "the context memory planned inside the memory budget is {}: a {tokens}-token prompt needs {} of \
         sequence state for {} choice(s); the longest context it holds is {} tokens{per_choice} (raise \
         --memory-budget or --context-memory)",
        human(pool),
        human(state_bytes(size, tokens, checkpoints, choices)),
        choices.max(1),
        longest_context(size, pool / choices.max(1) as u64, checkpoints, cap)
    ))
}

/// The error for a sequence stopped because the pool is full.
pub(crate) fn exhausted(pool: u64, position: usize) -> Error {
    Error::Budget(format!(
        "the context memory ({}) planned inside the memory budget is full: this request stopped at \
         {position} tokens to let the others continue; retry when fewer requests run, or raise \
         --memory-budget or --context-memory",
        human(pool)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K3: StateSize = StateSize {
        per_token: 24 * 4 * (512 + 64),
        per_sequence: 69 * 4 * (147_456 + 1_572_864),
    };

    #[test]
    fn k3_at_128k_tokens_needs_about_7_6_gib() {
        let bytes = K3.bytes(131_072, 0);
        assert_eq!(
            bytes,
            131_072 * 55_296 + 2 * 474_808_320,
            "the recurrent state twice"
        );
        assert!(
            (bytes as f64 / (1u64 << 30) as f64 - 7.63).abs() < 0.01,
            "{}",
            human(bytes)
        );
        assert_eq!(longest_context(K3, bytes, 0, 1 << 20), 131_072);
        assert_eq!(
            longest_context(K3, bytes - 1, 0, 1 << 20),
            131_072 - 64,
            "whole blocks"
        );
        assert_eq!(K3.bytes(131_073, 0) - bytes, 64 * 55_296, "a new block");
        assert_eq!(longest_context(K3, 1, 0, 1 << 20), 0);
        let mla_only = StateSize {
            per_token: 8,
            per_sequence: 0,
        };
        assert_eq!(
            longest_context(mla_only, 1 << 30, 0, 4096),
            4096,
            "capped by the model"
        );
    }

    #[test]
    fn the_automatic_pool_holds_the_batch_at_32k_or_a_quarter_of_the_budget() {
        let s = StateSize {
            per_token: 1000,
            per_sequence: 10_000,
        };
        assert_eq!(
            auto_context_bytes(s, u64::MAX, 8, 1 << 20),
            8 * (32_768_000 + 30_000)
        );
        assert_eq!(auto_context_bytes(s, u64::MAX, 2, 1000), 2 * (1_024_000 + 30_000));
        assert_eq!(auto_context_bytes(s, 4_000_000, 8, 1 << 20), 1_000_000);
    }

    #[test]
    fn checkpoints_and_choices_are_counted() {
        let s = StateSize {
            per_token: 10,
            per_sequence: 100,
        };
        assert_eq!(state_bytes(s, 5, 2, 1), 640 + 400);
        assert_eq!(state_bytes(s, 5, 0, 3), 3 * 840);
        assert_eq!(state_bytes(s, 5, 0, 0), 840);
    }

    #[test]
    fn admission_fits_beside_the_running_or_waits() {
        assert_eq!(admit(100, 30, 50), Admission::Now { cache_limit: 20 });
        assert_eq!(admit(100, 60, 50), Admission::Wait);
        assert_eq!(admit(100, 0, 100), Admission::Now { cache_limit: 0 });
        assert_eq!(
            admit(100, 0, 500),
            Admission::Now { cache_limit: 0 },
            "alone it runs"
        );
    }

    #[test]
    fn a_full_pool_stops_the_latest_growers_and_spares_idle_ones() {
        // Within the pool: nothing stops, the cache keeps the rest.
        assert_eq!(fit_pass(100, &[(20, 5), (30, 5)]), (vec![], 40));
        // Over: the latest grower stops first.
        assert_eq!(fit_pass(100, &[(40, 10), (30, 10), (15, 0)]), (vec![1], 35));
        assert_eq!(fit_pass(50, &[(40, 10), (30, 10), (15, 0)]), (vec![0, 1], 35));
        // A sequence that does not grow this pass is never stopped.
        assert_eq!(fit_pass(10, &[(40, 0)]), (vec![], 0));
    }

    #[test]
    fn errors_name_the_pool_and_the_longest_context() {
        let s = StateSize {
            per_token: 1024,
            per_sequence: 0,
        };
        let e = too_long(s, 1 << 20, 5000, 0, 1, 1 << 20).to_string();
        assert!(
            e.contains("1.00 MiB") && e.contains("1024 tokens") && e.contains("5000-token"),
            "{e}"
        );
        let e = too_long(s, 1 << 20, 700, 0, 2, 1 << 20).to_string();
        assert!(
            e.contains("1.00 MiB") && e.contains("2 choice(s)") && e.contains("512 tokens per choice"),
            "{e}"
        );
        assert!(exhausted(1 << 20, 77).to_string().contains("77 tokens"));
    }
}
