//! The target's own multi-token-prediction module as a drafter ([`MtpModule`]: DeepSeek-V3,
//! GLM-4.5, GLM-5).
//!
//! The module's row at position `t` reads the target's hidden row of `t` (captured from the
//! target's pass as `layers.{L-1}`, final-normed here) and the token at `t + 1`, so a position
//! enters the module's cache once the token after it is known: committed rows wait in a buffer
//! until the next proposal, whose history ends with the pending token. A proposal of `k` tokens
//! then runs the buffered rows (the last one's logits give the first draft) and `k - 1` single
//! rows that feed the module's own output back; those speculative rows are cut from the cache
//! afterwards. Drafts are greedy (the argmax); the target verifies every one.

use std::sync::Arc;

use super::{Observation, Proposal, Proposer, ProposerKind};
use crate::arch::{Model, MtpModule};
use crate::error::{Error, Result};
use crate::kernels::ops::argmax;
use crate::state::SeqState;

/// The loaded module, shared by every request.
#[derive(Debug)]
pub struct Mtp {
    module: MtpModule,
    captures: Vec<String>,
}

impl Mtp {
    /// Wrap a module loaded with [`crate::arch::load_mtp`].
    pub fn new(module: MtpModule) -> Mtp {
        Mtp {
            captures: vec![module.capture()],
            module,
        }
    }

    /// Check that the module belongs to `target`: hidden size and vocabulary.
    pub fn check_target(&self, target: &dyn Model) -> Result<()> {
        let info = target.info();
        if self.module.dims() != (info.hidden_size, info.vocab_size) {
            return Err(Error::InvalidArgument {
                field: "mtp",
                reason: format!(
                    "the module's (hidden, vocabulary) {:?} is not the target's ({}, {})",
                    self.module.dims(),
                    info.hidden_size,
                    info.vocab_size
                ),
            });
        }
        Ok(())
    }

    /// A proposer for one request.
    pub fn session(self: &Arc<Self>) -> MtpSession {
        MtpSession {
            mtp: self.clone(),
            state: self.module.new_state(),
            observed: 0,
            pending: Vec::new(),
        }
    }
}

/// One request's draft state.
#[derive(Debug)]
pub struct MtpSession {
    mtp: Arc<Mtp>,
    /// The module's cache: positions `0..state.len()`.
    state: SeqState,
    /// Committed target positions seen.
    observed: usize,
    /// Captured (raw) target rows of positions `state.len()..observed`.
    pending: Vec<f32>,
}

impl MtpSession {
    /// Positions in the module's cache (each with the token after it known).
    pub fn cached(&self) -> usize {
        self.state.len()
    }
}

impl Proposer for MtpSession {
    fn kind(&self) -> ProposerKind {
        ProposerKind::Mtp
    }

    fn captures(&self) -> &[String] {
        &self.mtp.captures
    }

    fn propose(&mut self, _target: &dyn Model, history: &[u32], max: usize) -> Result<Proposal> {
        let module = &self.mtp.module;
        let start = self.state.len();
        if max == 0 || history.len() != self.observed + 1 || start == self.observed {
            // Nothing new to read from (a state the module never saw, or no committed row).
            return Ok(Proposal::default());
        }
        let prev = module.target_rows(&self.pending);
        let (rows, mut logits) = module.forward(&mut self.state, &history[start + 1..], &prev)?;
        self.pending.clear();
        let h = module.row_width();
        let mut last = rows[rows.len() - h..].to_vec();
        let mut drafts = vec![argmax(&logits) as u32];
        while drafts.len() < max {
            let token = *drafts.last().expect("one draft at least");
            let out = module.forward(&mut self.state, &[token], &last);
            let (row, next) = match out {
                Ok(o) => o,
                Err(e) => {
                    self.state.truncate(self.observed)?;
                    return Err(e);
                }
            };
            (last, logits) = (row, next);
            drafts.push(argmax(&logits) as u32);
        }
        self.state.truncate(self.observed)?;
        Ok(Proposal::new(drafts))
    }

    fn observe(&mut self, _target: &dyn Model, obs: &Observation<'_>) -> Result<()> {
        if obs.start != self.observed {
            return Err(Error::InvalidArgument {
                field: "mtp",
                reason: format!(
                    "committed rows start at {} but the module has seen {}",
                    obs.start, self.observed
                ),
            });
        }
        let h = self.mtp.module.row_width();
        let rows = obs
            .hidden
            .iter()
            .find(|(name, _)| *name == self.mtp.captures[0])
            .map(|(_, v)| v.as_slice())
            .unwrap_or(&[]);
        if rows.len() != obs.tokens.len() * h {
            return Err(Error::InvalidArgument {
                field: "mtp",
                reason: "captured target rows are missing".into(),
            });
        }
        self.pending.extend_from_slice(rows);
        self.observed += obs.tokens.len();
        Ok(())
    }
}
