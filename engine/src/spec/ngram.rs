//! Prompt-lookup n-gram drafting (no model): find the longest suffix of the sequence (between
//! `max_n` and `min_n` tokens) that occurred earlier, take the token that followed its most
//! recent earlier occurrence, append it and repeat on the extended sequence. Strong on code,
//! edits and anything that quotes its context; free when it proposes nothing.

use super::{Proposal, Proposer, ProposerKind};
use crate::arch::Model;
use crate::error::Result;

/// Settings of the n-gram proposer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    /// Longest suffix tried first.
    pub max_n: usize,
    /// Shortest suffix accepted.
    pub min_n: usize,
    /// How far back to search (tokens); bounds the cost on long contexts.
    pub window: usize,
}

impl Default for NgramConfig {
    fn default() -> Self {
        NgramConfig {
            max_n: 6,
            min_n: 2,
            window: 8192,
        }
    }
}

/// The next token after the most recent earlier occurrence of the longest matching suffix of
/// `seq` (pure).
pub fn lookup(seq: &[u32], cfg: &NgramConfig) -> Option<u32> {
    let len = seq.len();
    let lo = len.saturating_sub(cfg.window);
    for n in (cfg.min_n.max(1)..=cfg.max_n).rev() {
        if n >= len {
            continue;
        }
        let suffix = &seq[len - n..];
        // Earlier occurrences end strictly before the suffix itself starts... or overlap it,
        // which is fine: the match at `start` is followed by `seq[start + n]`, which exists.
        let found = (lo..len - n)
            .rev()
            .find(|&start| &seq[start..start + n] == suffix);
        if let Some(start) = found {
            return Some(seq[start + n]);
        }
    }
    None
}

/// Up to `max` tokens proposed to follow `seq` (pure).
pub fn propose(seq: &[u32], max: usize, cfg: &NgramConfig) -> Vec<u32> {
    let mut ext = seq.to_vec();
    let mut out = Vec::with_capacity(max);
    while out.len() < max {
        let Some(t) = lookup(&ext, cfg) else { break };
        out.push(t);
        ext.push(t);
    }
    out
}

/// The n-gram proposer (stateless: it reads the history it is given).
#[derive(Debug, Clone, Default)]
pub struct Ngram {
    cfg: NgramConfig,
}

impl Ngram {
    pub fn new(cfg: NgramConfig) -> Self {
        Ngram { cfg }
    }
}

impl Proposer for Ngram {
    fn kind(&self) -> ProposerKind {
        ProposerKind::Ngram
    }

    fn propose(&mut self, _target: &dyn Model, history: &[u32], max: usize) -> Result<Proposal> {
        Ok(Proposal::new(propose(history, max, &self.cfg)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_what_followed_the_longest_earlier_match() {
        let cfg = NgramConfig::default();
        // "1 2 3 4 ... 1 2 3" -> 4, then "2 3 4" -> 5 ...
        let seq = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        assert_eq!(propose(&seq, 3, &cfg), vec![4, 5, 9]);
    }

    #[test]
    fn prefers_the_most_recent_occurrence() {
        let cfg = NgramConfig::default();
        let seq = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(lookup(&seq, &cfg), Some(2));
    }

    #[test]
    fn prefers_longer_suffixes() {
        let cfg = NgramConfig::default();
        // Suffix "5 7 8" occurred once (followed by 3); "7 8" occurred later (followed by 2).
        let seq = [5, 7, 8, 3, 7, 8, 2, 5, 7, 8];
        assert_eq!(lookup(&seq, &cfg), Some(3));
    }

    #[test]
    fn nothing_without_a_match_of_min_n_tokens() {
        let cfg = NgramConfig::default();
        assert_eq!(propose(&[1, 2, 3, 4], 4, &cfg), Vec::<u32>::new());
        assert_eq!(propose(&[], 4, &cfg), Vec::<u32>::new());
        assert_eq!(propose(&[1], 4, &cfg), Vec::<u32>::new());
    }

    #[test]
    fn a_run_of_one_token_continues_itself() {
        let cfg = NgramConfig::default();
        assert_eq!(propose(&[4, 4, 4], 3, &cfg), vec![4, 4, 4]);
    }

    #[test]
    fn the_window_bounds_the_search() {
        let cfg = NgramConfig {
            window: 4,
            ..Default::default()
        };
        let seq = [1, 2, 3, 0, 0, 0, 0, 1, 2];
        assert_eq!(lookup(&seq, &cfg), None);
    }
}
