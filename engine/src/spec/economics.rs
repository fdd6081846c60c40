//! Live economics of drafting for one request and one proposer (pure: the caller supplies the
//! measured seconds; no clock, no I/O).
//!
//! Drafting only pays when a verify pass over `k + 1` rows costs less than the tokens it is
//! expected to emit would cost one at a time. Both sides are measured, never assumed:
//! * the **baseline** `B`: seconds of a target-only step (refreshed every `refresh_every`
//!   drafted steps, since it drifts with the context length and the cache);
//!
//! Timings are the median of the last [`WINDOW`] samples: interference on a shared machine only
//! ever adds time, and a one-off cost (a drafter's first prefill) must not switch drafting off.
//! * the **cost** `T(w)` of a step at draft width `w` (drafting plus the verify pass), kept per
//!   width. On a model that streams experts from disk a wide pass reads the union of its rows'
//!   experts, so `T(w)` grows much faster than on a model in memory; because it is measured,
//!   the controller sees that growth and picks a narrower width (or none). Exploration moves
//!   one width at a time: an unmeasured width next to a measured one is tried when even its
//!   optimistic cost (that of the narrower neighbour) would make it the best;
//! * the **acceptance** `a`: a decayed estimate of the chance that a draft is accepted, from
//!   geometric trials (`m` successes and, when `m < w`, one failure per step).
//!
//! With i.i.d. acceptance a width-`w` step emits `E(a, w) = (1 − a^(w+1)) / (1 − a)` tokens, so
//! the controller picks `argmax_w E(a, w) / T(w)` and drafts only while that beats `1 / B` by
//! `min_gain`. A proposer that loses is switched off for `backoff` target-only steps and then
//! probed again, with the back-off doubling on every loss (up to `backoff_max`) and reset by a
//! win — it is never disabled for good on one bad stretch.

/// Settings of the controller.
#[derive(Debug, Clone, PartialEq)]
pub struct EconomicsConfig {
    /// Widest draft.
    pub max_width: usize,
    /// Width of the first drafted steps, before anything is known.
    pub probe_width: usize,
    /// Drafting must beat target-only by this fraction (0.03 = 3 %).
    pub min_gain: f64,
    /// Target-only steps after the first loss before drafting is tried again.
    pub backoff_min: usize,
    /// Longest back-off.
    pub backoff_max: usize,
    /// Drafted steps between target-only steps that refresh the baseline.
    pub refresh_every: usize,
    /// Weight of a new step in the acceptance estimate (0, 1].
    pub smoothing: f64,
    /// Drafted steps before the gate judges a (re)started proposer.
    pub min_samples: usize,
    /// Never switch drafting off (`--spec on`); drafts are still verified.
    pub forced: bool,
}

impl Default for EconomicsConfig {
    fn default() -> Self {
        EconomicsConfig {
            max_width: 8,
            probe_width: 2,
            min_gain: 0.03,
            backoff_min: 16,
            backoff_max: 512,
            refresh_every: 64,
            smoothing: 0.25,
            min_samples: 3,
            forced: false,
        }
    }
}

/// One finished step, as measured by the caller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Drafts verified in the step (0 = a target-only step).
    pub width: usize,
    /// Drafts accepted.
    pub accepted: usize,
    /// Wall seconds of the step: drafting plus the target pass.
    pub seconds: f64,
}

/// Timing samples kept per quantity.
pub const WINDOW: usize = 5;

/// The last [`WINDOW`] samples of a timing; its estimate is their median.
#[derive(Debug, Clone, Default)]
struct Window {
    samples: std::collections::VecDeque<f64>,
}

impl Window {
    fn push(&mut self, v: f64) {
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(v);
    }

    fn median(&self) -> Option<f64> {
        let mut v: Vec<f64> = self.samples.iter().copied().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }
}

/// The controller's state.
#[derive(Debug, Clone)]
pub struct Economics {
    cfg: EconomicsConfig,
    baseline: Window,
    /// `cost[w]`: seconds of steps at width `w` (index 0 unused).
    cost: Vec<Window>,
    accepted: f64,
    trials: f64,
    samples: usize,
    since_refresh: usize,
    off: usize,
    backoff: usize,
    losses: usize,
}

/// Expected tokens emitted by a step with `width` drafts at per-draft acceptance `a`.
pub fn expected_tokens(a: f64, width: usize) -> f64 {
    let a = a.clamp(0.0, 1.0);
    if a >= 1.0 - 1e-12 {
        return (width + 1) as f64;
    }
    (1.0 - a.powi(width as i32 + 1)) / (1.0 - a)
}

impl Economics {
    /// A fresh controller (nothing measured).
    pub fn new(cfg: EconomicsConfig) -> Self {
        let cost = vec![Window::default(); cfg.max_width + 1];
        let backoff = cfg.backoff_min.max(1);
        Economics {
            cfg,
            baseline: Window::default(),
            cost,
            accepted: 0.0,
            trials: 0.0,
            samples: 0,
            since_refresh: 0,
            off: 0,
            backoff,
            losses: 0,
        }
    }

    /// Drafts to propose for the next step when at most `budget` are useful (0 = run the
    /// target alone this step).
    pub fn width(&self, budget: usize) -> usize {
        let budget = budget.min(self.cfg.max_width);
        if budget == 0 || self.baseline.median().is_none() || self.off > 0 {
            return 0;
        }
        if self.since_refresh >= self.cfg.refresh_every.max(1) {
            return 0;
        }
        self.best(budget)
            .map_or(self.cfg.probe_width.clamp(1, budget), |(w, _)| w)
    }

    /// Fold in a finished step.
    pub fn record(&mut self, o: Outcome) {
        if !(o.seconds.is_finite() && o.seconds >= 0.0) {
            return;
        }
        if o.width == 0 {
            self.baseline.push(o.seconds);
            self.since_refresh = 0;
            self.skip();
            return;
        }
        let w = o.width.min(self.cfg.max_width);
        self.cost[w].push(o.seconds);
        let decay = 1.0 - self.cfg.smoothing.clamp(0.0, 1.0);
        let m = o.accepted.min(w) as f64;
        self.accepted = self.accepted * decay + m;
        self.trials = self.trials * decay + m + if o.accepted < w { 1.0 } else { 0.0 };
        self.samples += 1;
        self.since_refresh += 1;
        self.judge();
    }

    /// A step in which this proposer did not draft because another one did: only the back-off
    /// counts down.
    pub fn skip(&mut self) {
        if self.off > 0 {
            self.off -= 1;
            if self.off == 0 {
                self.samples = 0;
            }
        }
    }

    /// The acceptance estimate (0 before any drafted step).
    pub fn acceptance(&self) -> f64 {
        if self.trials > 0.0 {
            self.accepted / self.trials
        } else {
            0.0
        }
    }

    /// Whether the proposer is currently switched off by the gate.
    pub fn is_off(&self) -> bool {
        self.off > 0
    }

    /// Times the gate has switched drafting off.
    pub fn losses(&self) -> usize {
        self.losses
    }

    /// Measured seconds of a target-only step.
    pub fn baseline(&self) -> Option<f64> {
        self.baseline.median()
    }

    /// Expected gain of the best width over target-only (`rate · B`), if it can be estimated.
    pub fn expected_gain(&self) -> Option<f64> {
        let b = self.baseline.median()?;
        self.best(self.cfg.max_width).map(|(_, rate)| rate * b)
    }

    fn judge(&mut self) {
        if self.cfg.forced || self.samples < self.cfg.min_samples.max(1) {
            return;
        }
        let Some(gain) = self.expected_gain() else { return };
        if gain < 1.0 + self.cfg.min_gain {
            self.off = self.backoff;
            self.backoff = (self.backoff * 2).min(self.cfg.backoff_max.max(1));
            self.samples = 0;
            self.losses += 1;
        } else if self.samples >= self.cfg.min_samples + 2 {
            self.backoff = self.cfg.backoff_min.max(1);
        }
    }

    /// The best width within `budget` and its expected tokens per second, once a drafted
    /// width has been measured. Candidates are the measured widths and each unmeasured width
    /// just above a measured one (or above target-only), estimated optimistically at the cost
    /// of that neighbour (a step never costs less than a narrower one): exploration moves one
    /// width at a time and stops where the measured cost outgrows the expected tokens.
    fn best(&self, budget: usize) -> Option<(usize, f64)> {
        let b = self.baseline.median()?;
        if self.cost.iter().all(|c| c.median().is_none()) {
            return None;
        }
        let a = self.acceptance();
        let mut best: Option<(usize, f64)> = None;
        for w in 1..=budget.min(self.cfg.max_width) {
            let Some(t) = self.cost_at(w, b) else { continue };
            if t <= 0.0 {
                continue;
            }
            // A verify pass over `w + 1` rows never truly costs less than a target-only step;
            // one measured below the baseline means the baseline caught interference, and
            // trusting it would let drafts that are never accepted look like a win.
            let t = t.max(b);
            let rate = expected_tokens(a, w) / t;
            if best.is_none_or(|(_, r)| rate > r * (1.0 + 1e-9)) {
                best = Some((w, rate));
            }
        }
        best
    }

    /// Seconds of a width-`w` step: its median once it has [`RELIABLE`] samples; before that the
    /// lower of its median and the optimistic estimate — the narrower neighbour's cost (a step
    /// never costs less than a narrower one; `T(0) = B`) — so one slow sample cannot hide a width
    /// for good; `None` for an unmeasured width whose narrower neighbour is unmeasured too.
    fn cost_at(&self, w: usize, baseline: f64) -> Option<f64> {
        let own = self.cost[w].median();
        if own.is_some() && self.cost[w].samples.len() >= RELIABLE {
            return own;
        }
        let neighbour = if w == 1 {
            Some(baseline)
        } else {
            self.cost[w - 1].median()
        };
        match (own, neighbour) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Samples after which a width's measured cost is trusted over the optimistic estimate.
const RELIABLE: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    /// Drive a controller with a cost model and a fixed acceptance pattern; returns the widths.
    fn drive(
        cfg: EconomicsConfig,
        steps: usize,
        cost: impl Fn(usize) -> f64,
        accept: impl Fn(usize) -> usize,
    ) -> Vec<usize> {
        let mut e = Economics::new(cfg);
        let mut widths = Vec::new();
        for _ in 0..steps {
            let w = e.width(100);
            widths.push(w);
            e.record(Outcome {
                width: w,
                accepted: if w == 0 { 0 } else { accept(w) },
                seconds: cost(w),
            });
        }
        widths
    }

    #[test]
    fn expected_tokens_matches_the_closed_form() {
        assert_eq!(expected_tokens(0.0, 5), 1.0);
        assert_eq!(expected_tokens(1.0, 5), 6.0);
        assert!((expected_tokens(0.5, 2) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn the_first_step_measures_the_baseline_then_probes() {
        let mut e = Economics::new(EconomicsConfig::default());
        assert_eq!(e.width(10), 0);
        e.record(Outcome {
            width: 0,
            accepted: 0,
            seconds: 1.0,
        });
        assert_eq!(e.width(10), 2);
        assert_eq!(e.width(1), 1, "never more drafts than the budget");
        assert_eq!(e.width(0), 0);
    }

    #[test]
    fn always_right_cheap_drafts_grow_to_the_widest_width() {
        // Memory-resident model: a wide pass costs little more than a narrow one.
        let widths = drive(EconomicsConfig::default(), 40, |w| 1.0 + 0.05 * w as f64, |w| w);
        assert_eq!(*widths.last().unwrap(), 8, "{widths:?}");
        assert!(
            widths.iter().skip(1).filter(|&&w| w == 0).count() <= 1,
            "only baseline refreshes: {widths:?}"
        );
    }

    #[test]
    fn always_wrong_drafts_are_switched_off_and_retried_later() {
        let widths = drive(EconomicsConfig::default(), 200, |w| 1.0 + 0.05 * w as f64, |_| 0);
        let drafted: Vec<usize> = widths
            .iter()
            .enumerate()
            .filter(|(_, w)| **w > 0)
            .map(|(i, _)| i)
            .collect();
        assert!(drafted.len() >= 4, "retried after a back-off: {widths:?}");
        assert!(drafted.len() <= 12, "mostly off: {} drafted steps", drafted.len());
        // The back-off doubles: the gap before the second retry is longer than before the first.
        let gaps: Vec<usize> = drafted
            .windows(2)
            .map(|p| p[1] - p[0])
            .filter(|&g| g > 1)
            .collect();
        assert!(gaps.len() >= 2 && gaps[1] > gaps[0], "{gaps:?}");
    }

    #[test]
    fn a_baseline_inflated_by_interference_does_not_keep_losing_drafts_on() {
        // Target-only steps measured while the machine was busy (3 s) and drafted steps while
        // it was idle (1 s): drafts that are never accepted must still be switched off.
        let widths = drive(
            EconomicsConfig::default(),
            100,
            |w| if w == 0 { 3.0 } else { 1.0 },
            |_| 0,
        );
        let drafted = widths.iter().filter(|&&w| w > 0).count();
        assert!(drafted < 15, "never-accepted drafts kept drafting: {widths:?}");
    }

    #[test]
    fn wide_passes_that_cost_as_much_as_their_rows_are_not_worth_drafting() {
        // An offloaded model whose verify pass reads every row's experts: cost grows with rows.
        let widths = drive(
            EconomicsConfig::default(),
            100,
            |w| (w + 1) as f64,
            |w| w.saturating_sub(1),
        );
        let drafted = widths.iter().filter(|&&w| w > 0).count();
        assert!(drafted < 15, "the gate keeps drafting mostly off: {widths:?}");
    }

    #[test]
    fn expert_union_growth_narrows_the_width() {
        // Cost rises steeply beyond 3 drafts (the union of experts stops overlapping), with a
        // perfect draft: the best rate is at a middle width, not the widest.
        let cost = |w: usize| {
            if w <= 3 {
                1.0 + 0.1 * w as f64
            } else {
                1.3 + 1.0 * (w - 3) as f64
            }
        };
        let widths = drive(EconomicsConfig::default(), 80, cost, |w| w);
        let last = &widths[60..];
        assert!(last.iter().all(|&w| w <= 4), "{widths:?}");
        assert!(last.contains(&3), "{widths:?}");
    }

    #[test]
    fn one_slow_first_draft_does_not_switch_drafting_off() {
        // A drafter's first proposal pays its prefill (here 20x a normal step): the median of
        // the recent samples ignores it, so good drafts keep drafting.
        let mut e = Economics::new(EconomicsConfig::default());
        e.record(Outcome {
            width: 0,
            accepted: 0,
            seconds: 1.0,
        });
        let mut first = true;
        for _ in 0..30 {
            let w = e.width(100);
            let seconds = if std::mem::take(&mut first) {
                20.0
            } else {
                1.0 + 0.05 * w as f64
            };
            e.record(Outcome {
                width: w,
                accepted: w,
                seconds,
            });
        }
        assert_eq!(e.losses(), 0);
        assert!(e.width(100) >= 4);
    }

    #[test]
    fn forced_mode_never_switches_off() {
        let cfg = EconomicsConfig {
            forced: true,
            ..Default::default()
        };
        let widths = drive(cfg, 50, |w| 1.0 + w as f64, |_| 0);
        assert!(widths[1..].iter().filter(|&&w| w == 0).count() <= 1, "{widths:?}");
    }

    #[test]
    fn the_baseline_is_refreshed_periodically() {
        let cfg = EconomicsConfig {
            refresh_every: 8,
            ..Default::default()
        };
        let widths = drive(cfg, 40, |w| 1.0 + 0.01 * w as f64, |w| w);
        assert!(widths[1..].iter().filter(|&&w| w == 0).count() >= 3, "{widths:?}");
    }

    #[test]
    fn unmeasured_widths_next_to_measured_ones_are_estimated_optimistically() {
        let mut e = Economics::new(EconomicsConfig::default());
        e.record(Outcome {
            width: 0,
            accepted: 0,
            seconds: 1.0,
        });
        e.record(Outcome {
            width: 2,
            accepted: 2,
            seconds: 1.2,
        });
        assert_eq!(e.cost_at(1, 1.0), Some(1.0));
        assert_eq!(e.cost_at(2, 1.0), Some(1.2), "below the optimistic estimate");
        assert_eq!(e.cost_at(3, 1.0), Some(1.2));
        assert_eq!(e.cost_at(4, 1.0), None);
        for _ in 0..3 {
            e.record(Outcome {
                width: 3,
                accepted: 3,
                seconds: 2.0,
            });
        }
        assert_eq!(e.cost_at(3, 1.0), Some(2.0), "trusted after three samples");
    }

    #[test]
    fn nonsense_timings_are_ignored() {
        let mut e = Economics::new(EconomicsConfig::default());
        e.record(Outcome {
            width: 0,
            accepted: 0,
            seconds: f64::NAN,
        });
        assert!(e.baseline().is_none());
    }
}
