//! A Qwen3 drafter (dense or MoE: any architecture whose registry entry says it can draft) for
//! raw completions, whose tokenizer differs from the target's, translated through text
//! (string-level exact match): only proposals that re-tokenise consistently under the target
//! tokenizer are offered, and the target verifies every one.
//!
//! One proposal:
//! 1. decode the target history to text and require that re-encoding it with the target
//!    tokenizer (specials allowed) gives back exactly the history (otherwise: no proposal);
//! 2. encode the text with the drafter's tokenizer and bring the drafter's own state up to it:
//!    the session keeps its KV cache across steps and only runs the tokens after the longest
//!    common prefix with what it ran before (the cache is cut back to that prefix) — the
//!    history is never re-prefilled from scratch;
//! 3. greedily generate `clamp(width + 2, 3, max_budget)` tokens, recording each chosen token's
//!    probability; for widths above 2, stop at the first token below `min_confidence`;
//! 4. decode the drafter's text plus its continuation, re-encode it with the target tokenizer,
//!    require the history to be a prefix, and propose the next `≤ width` target ids. A proposal
//!    that comes out short although the budget was spent is retried once with `max_budget`.

use std::path::Path;
use std::sync::Arc;

use super::{Proposal, Proposer, ProposerKind};
use crate::arch::{self, LogitRows, Model, SeqInput};
use crate::error::{Error, Result};
use crate::kernels::ops::argmax;
use crate::state::SeqState;
use crate::tokenizer::Tokenizer;

/// Settings of the drafter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QwenDraftConfig {
    /// Cut a proposal wider than 2 at the first token with a lower probability.
    pub min_confidence: f64,
    /// Most tokens generated for one proposal.
    pub max_budget: usize,
}

impl Default for QwenDraftConfig {
    fn default() -> Self {
        QwenDraftConfig {
            min_confidence: 0.3,
            max_budget: 20,
        }
    }
}

/// The loaded drafter (shared by every request).
#[derive(Debug)]
pub struct QwenDrafter {
    model: Box<dyn Model>,
    tokenizer: Tokenizer,
    target_tokenizer: Arc<Tokenizer>,
    cfg: QwenDraftConfig,
}

impl QwenDrafter {
    /// Load the Qwen3 checkpoint in `dir` (config, weights, `tokenizer.json`) as a drafter for a
    /// target that tokenises with `target_tokenizer`.
    pub fn load(dir: &Path, target_tokenizer: Arc<Tokenizer>, cfg: QwenDraftConfig) -> Result<QwenDrafter> {
        let spec = crate::arch::ModelSpec::load(dir)?;
        if !spec.arch.raw_completion_drafter() {
            return Err(Error::config(
                dir.join("config.json"),
                "model_type",
                format!(
                    "a Qwen drafter must be a qwen3 or qwen3_moe checkpoint, found {}",
                    spec.model_type
                ),
            ));
        }
        let model = arch::load_spec(&spec, dir)?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        Ok(QwenDrafter {
            model,
            tokenizer,
            target_tokenizer,
            cfg,
        })
    }

    /// A proposer for one request.
    pub fn session(self: &Arc<Self>) -> QwenSession {
        QwenSession {
            drafter: self.clone(),
            state: self.model.new_state(),
            ids: Vec::new(),
        }
    }

    /// The drafter model.
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }
}

/// One request's drafter state.
#[derive(Debug)]
pub struct QwenSession {
    drafter: Arc<QwenDrafter>,
    state: SeqState,
    /// Drafter ids whose keys and values are in `state`, in order.
    ids: Vec<u32>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Probability of the argmax of `logits` (softmax in f64).
fn top_probability(logits: &[f32], top: usize) -> f64 {
    let max = logits[top] as f64;
    let total: f64 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| (l as f64 - max).exp())
        .sum();
    if total > 0.0 { 1.0 / total } else { 0.0 }
}

impl QwenSession {
    /// Bring the drafter state to `ids`, running only what follows the common prefix with what
    /// it ran before; returns the logits after the last id.
    fn sync(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        let keep = common_prefix(&self.ids, ids).min(ids.len() - 1);
        self.state.truncate(keep)?;
        self.ids.truncate(keep);
        let model = self.drafter.model.as_ref();
        let logits = model.forward(
            &mut [SeqInput {
                state: &mut self.state,
                tokens: &ids[keep..],
                logits: LogitRows::Last,
            }],
            None,
        )?;
        self.state.commit_all();
        self.ids.extend_from_slice(&ids[keep..]);
        Ok(logits)
    }

    /// Greedily extend `generated` up to `budget` tokens (stopping at low confidence when
    /// `cut`); `logits` follow the last id run, and every generated token is run so that they
    /// still do afterwards. Returns whether the budget was spent.
    fn generate(
        &mut self,
        logits: &mut Vec<f32>,
        generated: &mut Vec<u32>,
        budget: usize,
        cut: bool,
    ) -> Result<bool> {
        let d = self.drafter.clone();
        let eos = &d.model.info().eos_token_ids;
        let limit = d.model.info().max_context;
        while generated.len() < budget {
            let top = argmax(logits);
            if cut && top_probability(logits, top) < d.cfg.min_confidence {
                return Ok(false);
            }
            let token = top as u32;
            generated.push(token);
            if eos.contains(&token) || self.state.len() + 1 >= limit {
                return Ok(false);
            }
            let model = d.model.as_ref();
            *logits = model.forward(
                &mut [SeqInput {
                    state: &mut self.state,
                    tokens: &[token],
                    logits: LogitRows::Last,
                }],
                None,
            )?;
            self.state.commit_all();
            self.ids.push(token);
        }
        Ok(true)
    }

    /// Target ids after `history` that the drafter's text `prefix ++ generated` re-tokenises to.
    fn translate(&self, history: &[u32], prefix: &[u32], generated: &[u32], width: usize) -> Vec<u32> {
        let d = &self.drafter;
        let mut all = prefix.to_vec();
        all.extend_from_slice(generated);
        let text = String::from_utf8_lossy(&d.tokenizer.decode_bytes(&all)).into_owned();
        let ids = d.target_tokenizer.encode_with_special(&text);
        if ids.len() <= history.len() || ids[..history.len()] != *history {
            return Vec::new();
        }
        ids[history.len()..].iter().take(width).copied().collect()
    }
}

impl Proposer for QwenSession {
    fn kind(&self) -> ProposerKind {
        ProposerKind::Qwen
    }

    fn propose(&mut self, _target: &dyn Model, history: &[u32], width: usize) -> Result<Proposal> {
        let d = self.drafter.clone();
        let text = d.target_tokenizer.decode(history);
        if d.target_tokenizer.encode_with_special(&text) != history {
            return Ok(Proposal::default());
        }
        let prefix = d.tokenizer.encode(&text);
        if prefix.is_empty() || prefix.len() + 1 >= d.model.info().max_context {
            return Ok(Proposal::default());
        }
        let mut logits = self.sync(&prefix)?;
        let budget = (width + 2).clamp(3, d.cfg.max_budget.max(3));
        let mut generated = Vec::new();
        let spent = self.generate(&mut logits, &mut generated, budget, width > 2)?;
        let mut drafts = self.translate(history, &prefix, &generated, width);
        if drafts.len() < width && spent && budget < d.cfg.max_budget {
            self.generate(&mut logits, &mut generated, d.cfg.max_budget, width > 2)?;
            drafts = self.translate(history, &prefix, &generated, width);
        }
        Ok(Proposal::new(drafts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_probability_is_the_softmax_of_the_argmax() {
        let p = top_probability(&[0.0, 0.0], 0);
        assert!((p - 0.5).abs() < 1e-12);
        let p = top_probability(&[10.0, 0.0, 0.0], 0);
        assert!(p > 0.99);
    }

    #[test]
    fn common_prefix_counts_leading_equal_ids() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
