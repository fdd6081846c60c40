//! Drafting statistics: per proposer, the steps that drafted, the tokens proposed and accepted,
//! the histogram of accepted lengths, and the time spent drafting and verifying; plus the
//! target-only steps. [`SpecSummary`] is one request's (or one run's) figures; [`SpecStats`]
//! aggregates every request of a server for `/metrics`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use super::ProposerKind;

/// Figures of one proposer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProposerStats {
    /// Steps in which it drafted (verify passes with at least one draft).
    pub proposals: u64,
    /// Draft tokens verified.
    pub draft_tokens: u64,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
    /// `accepted_lengths[m]`: steps that accepted exactly `m` drafts.
    pub accepted_lengths: Vec<u64>,
    /// Seconds spent proposing.
    pub draft_seconds: f64,
    /// Seconds of the verify passes.
    pub verify_seconds: f64,
    /// Times the economics gate switched it off (each followed by a back-off and a retry).
    pub switched_off: u64,
    /// Errors that dropped it for a request.
    pub errors: u64,
}

impl ProposerStats {
    /// Accepted / proposed tokens (0 when nothing was proposed).
    pub fn acceptance_rate(&self) -> f64 {
        if self.draft_tokens == 0 {
            0.0
        } else {
            self.accepted_tokens as f64 / self.draft_tokens as f64
        }
    }

    fn merge(&mut self, o: &ProposerStats) {
        self.proposals += o.proposals;
        self.draft_tokens += o.draft_tokens;
        self.accepted_tokens += o.accepted_tokens;
        if self.accepted_lengths.len() < o.accepted_lengths.len() {
            self.accepted_lengths.resize(o.accepted_lengths.len(), 0);
        }
        for (a, b) in self.accepted_lengths.iter_mut().zip(&o.accepted_lengths) {
            *a += b;
        }
        self.draft_seconds += o.draft_seconds;
        self.verify_seconds += o.verify_seconds;
        self.switched_off += o.switched_off;
        self.errors += o.errors;
    }
}

/// Drafting figures of a request or a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SpecSummary {
    /// Keyed by the proposer's label.
    pub proposers: BTreeMap<&'static str, ProposerStats>,
    /// Decode steps without drafts.
    pub target_only_steps: u64,
    /// Their seconds (the measured baseline).
    pub target_only_seconds: f64,
}

impl SpecSummary {
    /// The entry of `kind`, created on first use.
    pub fn proposer(&mut self, kind: ProposerKind) -> &mut ProposerStats {
        self.proposers.entry(kind.label()).or_default()
    }

    pub(super) fn record_draft(
        &mut self,
        kind: ProposerKind,
        width: usize,
        accepted: usize,
        draft: f64,
        verify: f64,
    ) {
        let p = self.proposer(kind);
        p.proposals += 1;
        p.draft_tokens += width as u64;
        p.accepted_tokens += accepted as u64;
        if p.accepted_lengths.len() <= accepted {
            p.accepted_lengths.resize(accepted + 1, 0);
        }
        p.accepted_lengths[accepted] += 1;
        p.draft_seconds += draft;
        p.verify_seconds += verify;
    }

    pub(super) fn record_plain(&mut self, seconds: f64) {
        self.target_only_steps += 1;
        self.target_only_seconds += seconds;
    }

    /// Add `other` into `self`.
    pub fn merge(&mut self, other: &SpecSummary) {
        for (k, v) in &other.proposers {
            self.proposers.entry(k).or_default().merge(v);
        }
        self.target_only_steps += other.target_only_steps;
        self.target_only_seconds += other.target_only_seconds;
    }

    /// One line for `--stats`.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("{} target-only steps", self.target_only_steps)];
        for (k, p) in &self.proposers {
            let mean = if p.proposals == 0 {
                0.0
            } else {
                p.accepted_tokens as f64 / p.proposals as f64
            };
            parts.push(format!(
                "{k}: {} drafts, {}/{} tokens accepted ({:.0}%), mean accepted {mean:.2}, drafting {:.3} s, verifying {:.3} s{}{}",
                p.proposals,
                p.accepted_tokens,
                p.draft_tokens,
                100.0 * p.acceptance_rate(),
                p.draft_seconds,
                p.verify_seconds,
                if p.switched_off > 0 { format!(", switched off {}x", p.switched_off) } else { String::new() },
                if p.errors > 0 { format!(", {} errors", p.errors) } else { String::new() },
            ));
        }
        parts.join("; ")
    }
}

/// Aggregated drafting figures of every request (shared with the metrics endpoint).
#[derive(Debug, Default)]
pub struct SpecStats(Mutex<SpecSummary>);

impl SpecStats {
    /// Add one request's step figures.
    pub fn add(&self, delta: &SpecSummary) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).merge(delta);
    }

    /// A copy of the totals.
    pub fn snapshot(&self) -> SpecSummary {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_merges_histograms_of_different_lengths() {
        let mut a = SpecSummary::default();
        a.record_draft(ProposerKind::Ngram, 4, 2, 0.1, 1.0);
        let mut b = SpecSummary::default();
        b.record_draft(ProposerKind::Ngram, 8, 7, 0.1, 1.0);
        b.record_plain(0.5);
        a.merge(&b);
        let p = &a.proposers["ngram"];
        assert_eq!((p.proposals, p.draft_tokens, p.accepted_tokens), (2, 12, 9));
        assert_eq!(p.accepted_lengths, vec![0, 0, 1, 0, 0, 0, 0, 1]);
        assert_eq!(a.target_only_steps, 1);
        assert!((p.acceptance_rate() - 0.75).abs() < 1e-12);
    }
}
