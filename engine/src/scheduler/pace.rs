//! Prefill pacing: size each step's prefill budget by what it costs in time, so a long prompt
//! delays running streams and newly arrived requests by at most a set step time.
//!
//! The configured budget (`prefill_chunk` rows, `prefill_positions` attended positions) is the
//! most a step may take; the pacer scales it down by the measured cost of recent steps. A step
//! that ran a fraction `f` of the full budget (the larger of its row and position shares) and
//! took `t` seconds is charged `t − base` for its prefill, where `base` is what a step without
//! prefill currently costs (decode rows, and out of core the expert reads that every pass pays).
//! The estimate of a full budget's cost is the running average of `(t − base) / f`; the scale is
//! `target / estimate`, at most 1. Only the *added* time counts, so a slow decode step (a large
//! model read from disk) never starves prefill to single rows.
//!
//! Pure arithmetic on measured durations: tested without a model. Output never depends on it
//! (the kernels are batch-invariant, so chunking does not change any row).

use super::plan::PrefillBudget;

/// Weight of a new observation in the running averages.
const ALPHA: f64 = 0.3;
/// Steps whose prefill took less than this share of the budget are too small to estimate from
/// (timer noise would dominate), unless nothing is known yet.
const MIN_FRACTION: f64 = 1.0 / 64.0;

/// The pacer's state.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    /// Added seconds a step may spend on prefill (`None`: no pacing, always the full budget).
    target: Option<f64>,
    /// Running average of a step's seconds without prefill rows.
    base: Option<f64>,
    /// Running average of the added seconds of a full budget's prefill.
    full: Option<f64>,
}

impl Pacer {
    pub(crate) fn new(target: Option<std::time::Duration>) -> Self {
        Pacer {
            target: target.map(|d| d.as_secs_f64()).filter(|t| *t > 0.0),
            base: None,
            full: None,
        }
    }

    /// Share of the configured budget the next step may use, in `(0, 1]`.
    pub(crate) fn scale(&self) -> f64 {
        match (self.target, self.full) {
            (Some(target), Some(full)) if full > target => (target / full).max(1e-6),
            _ => 1.0,
        }
    }

    /// The next step's budget: `max` scaled (at least one row and one position; the planner
    /// always runs one prefill row so progress never stops).
    pub(crate) fn budget(&self, max: PrefillBudget) -> PrefillBudget {
        let s = self.scale();
        let scaled = |n: usize| ((n as f64 * s) as usize).clamp(1, n.max(1));
        PrefillBudget {
            tokens: scaled(max.tokens),
            positions: scaled(max.positions),
        }
    }

    /// The budget of the next step. When it would delay someone — decode rows run, another
    /// prompt prefills, or requests wait for a slot — it is paced ([`Pacer::budget`]); a prompt
    /// prefilling alone delays no one and gets `solo_tokens` rows (positions scaled alike), since
    /// larger chunks are cheaper per token (out of core, each chunk reads every expert it
    /// touches once).
    pub(crate) fn step_budget(
        &self,
        max: PrefillBudget,
        solo_tokens: usize,
        contended: bool,
    ) -> PrefillBudget {
        if contended {
            return self.budget(max);
        }
        let solo = solo_tokens.max(max.tokens);
        let factor = solo as f64 / max.tokens.max(1) as f64;
        PrefillBudget {
            tokens: solo,
            positions: (max.positions as f64 * factor).min(usize::MAX as f64 / 2.0) as usize,
        }
    }

    /// Learn from a step that took `seconds` and ran prefill worth `fraction` of the configured
    /// budget (0 when it ran no prefill row).
    pub(crate) fn observe(&mut self, seconds: f64, fraction: f64) {
        let avg = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + ALPHA * (new - o)));
        if fraction <= 0.0 {
            self.base = avg(self.base, seconds);
            return;
        }
        if fraction < MIN_FRACTION && self.full.is_some() {
            return;
        }
        let added = (seconds - self.base.unwrap_or(0.0)).max(0.0);
        self.full = avg(self.full, added / fraction);
    }
}

/// The share of `max` that prefill rows of `rows` rows attending `positions` positions used.
pub(crate) fn fraction(rows: usize, positions: usize, max: PrefillBudget) -> f64 {
    let share = |n: usize, of: usize| n as f64 / of.max(1) as f64;
    share(rows, max.tokens).max(share(positions, max.positions))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MAX: PrefillBudget = PrefillBudget {
        tokens: 256,
        positions: 256 * 4096,
    };

    /// Run `steps` steps of a model costing `base + per_full * f` seconds, where every step
    /// prefills as much as the pacer allows (a long prompt) next to some decode rows.
    fn converge(p: &mut Pacer, base: f64, per_full: f64, steps: usize) -> PrefillBudget {
        for _ in 0..steps {
            p.observe(base, 0.0);
            let b = p.budget(MAX);
            let f = fraction(b.tokens, 0, MAX);
            p.observe(base + per_full * f, f);
        }
        p.budget(MAX)
    }

    #[test]
    fn without_a_target_the_budget_is_the_configured_one() {
        let mut p = Pacer::new(None);
        p.observe(9.0, 1.0);
        assert_eq!(p.budget(MAX), MAX);
        assert_eq!(Pacer::new(Some(Duration::ZERO)).budget(MAX), MAX);
    }

    #[test]
    fn a_costly_prefill_shrinks_to_the_target_step_time() {
        // A full budget adds 2 s; the target is 0.25 s: an eighth of it.
        let mut p = Pacer::new(Some(Duration::from_millis(250)));
        let b = converge(&mut p, 0.05, 2.0, 30);
        assert!((p.scale() - 0.125).abs() < 1e-3, "{}", p.scale());
        assert_eq!(b.tokens, 32);
        assert_eq!(b.positions, 256 * 4096 / 8);
    }

    #[test]
    fn a_cheap_prefill_keeps_the_whole_budget() {
        let mut p = Pacer::new(Some(Duration::from_millis(250)));
        assert_eq!(converge(&mut p, 0.01, 0.1, 10), MAX);
    }

    #[test]
    fn a_slow_decode_step_does_not_starve_prefill() {
        // Out of core every step pays 3 s of reads; prefill adds 0.4 s per full budget.
        let mut p = Pacer::new(Some(Duration::from_millis(250)));
        let b = converge(&mut p, 3.0, 0.4, 30);
        assert!(b.tokens >= 150, "{b:?}");
    }

    #[test]
    fn the_budget_recovers_when_steps_get_cheaper() {
        let mut p = Pacer::new(Some(Duration::from_millis(250)));
        converge(&mut p, 0.0, 4.0, 20);
        assert!(p.budget(MAX).tokens <= 17);
        let b = converge(&mut p, 0.0, 0.2, 40);
        assert_eq!(b, MAX, "a cheaper model regains the full budget");
    }

    #[test]
    fn tiny_steps_are_ignored_once_an_estimate_exists_and_the_floor_is_one_row() {
        let mut p = Pacer::new(Some(Duration::from_millis(1)));
        p.observe(10.0, 1.0);
        let b = p.budget(MAX);
        assert_eq!(b.tokens, 1);
        assert!(b.positions >= 1);
        let before = p.scale();
        p.observe(50.0, 1.0 / 1000.0);
        assert_eq!(p.scale(), before);
    }

    #[test]
    fn a_prompt_alone_gets_the_solo_budget_and_company_gets_the_paced_one() {
        let mut p = Pacer::new(Some(Duration::from_millis(250)));
        p.observe(4.0, 1.0);
        let paced = p.step_budget(MAX, 1024, true);
        assert_eq!(paced, p.budget(MAX));
        assert!(paced.tokens < MAX.tokens);
        let solo = p.step_budget(MAX, 1024, false);
        assert_eq!((solo.tokens, solo.positions), (1024, 4 * MAX.positions));
        assert_eq!(
            p.step_budget(MAX, 8, false),
            MAX,
            "never below the configured budget"
        );
    }

    #[test]
    fn the_fraction_is_the_larger_share() {
        assert_eq!(fraction(128, 0, MAX), 0.5);
        assert_eq!(fraction(16, 256 * 4096, MAX), 1.0);
        assert_eq!(fraction(0, 0, MAX), 0.0);
    }
}
