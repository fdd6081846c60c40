//! The draft models a server or a run has loaded, and how a request picks its proposers: chat
//! requests use the draft head when there is one, raw completions the Qwen drafter; both fall
//! back to n-gram prompt lookup, then to none.

use std::sync::Arc;

use super::dspark::DSpark;
use super::mtp::Mtp;
use super::ngram::{Ngram, NgramConfig};
use super::qwen::QwenDrafter;
use super::{EconomicsConfig, Proposer, SpecMode, SpecStats, Speculator};

/// What kind of request is decoding (decides the preferred proposer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestKind {
    /// A chat conversation (`--chat`, `/v1/chat/completions`).
    Chat,
    /// Raw text continuation (`deltafin run` without `--chat`, `/v1/completions`).
    #[default]
    Completion,
}

/// Loaded draft models and drafting settings, shared by every request.
#[derive(Debug, Clone)]
pub struct Drafts {
    /// The target's own multi-token-prediction module (chat and completions: it shares the
    /// target's tokenizer).
    pub mtp: Option<Arc<Mtp>>,
    pub dspark: Option<Arc<DSpark>>,
    pub qwen: Option<Arc<QwenDrafter>>,
    /// Prompt lookup (`None`: off).
    pub ngram: Option<NgramConfig>,
    pub economics: EconomicsConfig,
    /// Longest context the draft head is used for (its trained context; the reference admits
    /// 8192 tokens).
    pub dspark_max_context: usize,
}

impl Default for Drafts {
    fn default() -> Self {
        Drafts {
            mtp: None,
            dspark: None,
            qwen: None,
            ngram: Some(NgramConfig::default()),
            economics: EconomicsConfig::default(),
            dspark_max_context: 8192,
        }
    }
}

impl Drafts {
    /// No proposer at all.
    pub fn none() -> Self {
        Drafts {
            ngram: None,
            ..Default::default()
        }
    }

    /// The proposers of a request, in preference order, with their controllers; `None` when
    /// drafting is off or no proposer applies. Step figures also go to `shared`.
    pub fn speculator(
        &self,
        kind: RequestKind,
        mode: SpecMode,
        shared: Option<Arc<SpecStats>>,
    ) -> Option<Speculator> {
        if mode == SpecMode::Off {
            return None;
        }
        let mut lanes: Vec<Box<dyn Proposer>> = Vec::new();
        if let Some(m) = &self.mtp {
            lanes.push(Box::new(m.session()));
        }
        match kind {
            RequestKind::Chat => {
                if let Some(d) = &self.dspark {
                    lanes.push(Box::new(d.session(self.dspark_max_context)));
                }
            }
            RequestKind::Completion => {
                if let Some(q) = &self.qwen {
                    lanes.push(Box::new(q.session()));
                }
            }
        }
        if let Some(cfg) = self.ngram {
            lanes.push(Box::new(Ngram::new(cfg)));
        }
        if lanes.is_empty() {
            return None;
        }
        let cfg = EconomicsConfig {
            forced: mode == SpecMode::On,
            ..self.economics.clone()
        };
        Some(Speculator::new(lanes, &cfg, shared))
    }

    /// Labels of the loaded proposers (for logs and `/v1/models`).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.mtp.is_some() {
            parts.push("mtp");
        }
        if self.dspark.is_some() {
            parts.push("dspark (chat)");
        }
        if self.qwen.is_some() {
            parts.push("qwen (completions)");
        }
        if self.ngram.is_some() {
            parts.push("ngram");
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}
