//! Speculative decoding that never changes output.
//!
//! A decoding sequence has one *pending* token (emitted, not yet run). A drafted step runs the
//! target once over `[pending, d1 … dk]` with logits at every row, picks the target's own token
//! at each row exactly as plain decoding would (`Sampling::pick(row, position)`: greedy, or a
//! draw keyed by `(seed, position)`), emits the accepted drafts plus the target's next token and
//! commits those rows of the staged state ([`crate::state::SeqState::commit`]); the rest is
//! rolled back. Because the kernels are batch-invariant, every row's logits equal the
//! single-row pass's bit for bit, so the output is identical with and without drafts, greedy or
//! sampled ([`verify`] holds the pure decision).
//!
//! Proposers implement [`Proposer`], one file each: [`ngram`] (prompt lookup, no model),
//! [`dspark`] (a DSpark-style block draft head fed by captured target hidden rows), [`mtp`]
//! (the target's own multi-token-prediction module, fed the same way) and [`qwen`] (a Qwen3
//! dense drafter translated through text). A request's [`Speculator`] holds
//! its proposers in preference order, each with its own [`economics::Economics`] controller; a
//! proposer that errors is dropped for the request (drafts are optional, the target is the
//! sole authority), one that loses is backed off and retried later.

mod drafts;
pub mod dspark;
pub mod economics;
pub mod mtp;
pub mod ngram;
pub mod qwen;
mod speculator;
mod stats;
pub mod verify;

use std::fmt::Debug;

pub use drafts::{Drafts, RequestKind};
pub use economics::{Economics, EconomicsConfig, Outcome};
pub use speculator::{Speculator, StepPlan};
pub use stats::{ProposerStats, SpecStats, SpecSummary};
pub use verify::{Verdict, draft_budget, verify};

use crate::arch::Model;
use crate::error::Result;

/// Which proposer made a draft (a stable, low-cardinality label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposerKind {
    Ngram,
    Dspark,
    Qwen,
    /// The target's own multi-token-prediction module.
    Mtp,
    /// Test and benchmark proposers (oracle replays, controlled-acceptance wrappers).
    Custom,
}

impl ProposerKind {
    /// Every kind, in metric order.
    pub const ALL: [ProposerKind; 5] = [
        ProposerKind::Mtp,
        ProposerKind::Dspark,
        ProposerKind::Qwen,
        ProposerKind::Ngram,
        ProposerKind::Custom,
    ];

    /// The metric label (`draft="..."`).
    pub fn label(self) -> &'static str {
        match self {
            ProposerKind::Ngram => "ngram",
            ProposerKind::Dspark => "dspark",
            ProposerKind::Qwen => "qwen",
            ProposerKind::Mtp => "mtp",
            ProposerKind::Custom => "custom",
        }
    }
}

/// Draft tokens proposed to follow the pending token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
}

impl Proposal {
    pub fn new(tokens: Vec<u32>) -> Self {
        Proposal { tokens }
    }
}

/// Rows that were just committed to the target's state, with the hidden rows a proposer asked
/// to capture ([`Proposer::captures`]).
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// Position of the first committed row.
    pub start: usize,
    /// The committed tokens (positions `start..start + tokens.len()`).
    pub tokens: &'a [u32],
    /// `(name, rows)` for each requested capture: `tokens.len()` rows of `hidden_size` values.
    pub hidden: &'a [(String, Vec<f32>)],
}

/// A source of draft tokens for one request.
///
/// `history` is every token of the sequence: the committed positions followed by the pending
/// token (last). Proposals never change output — they are verified — so a proposer is free to
/// be wrong; an `Err` drops it for the rest of the request.
pub trait Proposer: Send + Debug {
    /// Its label.
    fn kind(&self) -> ProposerKind;

    /// Target trace tensors (`layers.{l}`) this proposer needs for every committed position.
    fn captures(&self) -> &[String] {
        &[]
    }

    /// Bring state deferred from [`Proposer::observe`] up to date before a proposal. Called
    /// outside the timed drafting cost, like `observe` itself: the work is owed for committed
    /// rows whether or not a draft follows.
    fn catch_up(&mut self, _target: &dyn Model) -> Result<()> {
        Ok(())
    }

    /// Propose up to `max` tokens to follow `history`.
    fn propose(&mut self, target: &dyn Model, history: &[u32], max: usize) -> Result<Proposal>;

    /// Positions were committed (prefill chunks and verified steps, in order).
    fn observe(&mut self, _target: &dyn Model, _obs: &Observation<'_>) -> Result<()> {
        Ok(())
    }
}

/// How a request uses drafts (`--spec`, the request's extension field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecMode {
    /// Never draft.
    Off,
    /// Draft while the measured economics say it pays.
    #[default]
    Auto,
    /// Always draft (still verified); for measurements.
    On,
}

impl std::str::FromStr for SpecMode {
    type Err = crate::error::UnknownChoice;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "off" => Ok(SpecMode::Off),
            "auto" => Ok(SpecMode::Auto),
            "on" => Ok(SpecMode::On),
            other => Err(crate::error::UnknownChoice {
                what: "speculation mode",
                input: other.into(),
                expected: "off, auto, on",
            }),
        }
    }
}
