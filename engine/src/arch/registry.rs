//! The architecture registry: the one place that maps a parsed config ([`ArchConfig`]) to the
//! code that runs it. Each architecture's config implements [`Architecture`] in the
//! architecture's own file; what differs between architectures (state size, in-memory and
//! budgeted loading, whether a memory budget is supported) is a trait method, so generic code
//! never matches on the architecture.
//!
//! Adding an architecture: its config file (`config/<arch>.rs`, a variant of [`ArchConfig`] and
//! its `model_type` arm in `config/mod.rs`), its architecture file implementing [`Architecture`],
//! and one arm in [`architecture`]. `docs/adding-an-architecture.md` walks through it.

use std::sync::Arc;

use super::{Loader, Model, StateSize};
use crate::cache::{OocOptions, OocRuntime};
use crate::config::{ArchConfig, ModelSpec};
use crate::error::{Error, Result};
use crate::weights::WeightIndex;

/// What the engine needs from an architecture, implemented by its validated config.
pub trait Architecture: Sync {
    /// Bytes of one sequence's state (attention caches, recurrent states), from the config.
    fn state_size(&self) -> StateSize;

    /// Build the model with every tensor in memory (memory-mapped).
    fn load(&self, ld: &Loader<'_>) -> Result<Box<dyn Model>>;

    /// Whether [`Architecture::load_budgeted`] is implemented.
    fn supports_budget(&self) -> bool {
        false
    }

    /// Whether a checkpoint of this architecture can be a raw-completion drafter
    /// (`--draft-qwen`): loaded in memory beside the target, proposing through its own
    /// tokenizer.
    fn raw_completion_drafter(&self) -> bool {
        false
    }

    /// Build the model under `options.budget`: a resident prefix of layers, the rest streamed,
    /// routed experts through the expert cache; bit-identical to [`Architecture::load`].
    fn load_budgeted(
        &self,
        spec: &ModelSpec,
        index: Arc<WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Box<dyn Model>, OocRuntime)> {
        let _ = (index, options);
        Err(Error::Budget(format!(
            "{}: out-of-core loading is not implemented for this architecture (it loads in memory)",
            spec.model_type
        )))
    }
}

/// The implementation of `cfg`'s architecture.
pub fn architecture(cfg: &ArchConfig) -> &dyn Architecture {
    match cfg {
        ArchConfig::DeepseekV3(c) => c,
        ArchConfig::KimiLinear(c) => c,
        ArchConfig::KimiK3(c) => c,
        ArchConfig::Qwen3(c) => c,
        ArchConfig::Qwen3Moe(c) => c,
        ArchConfig::Glm4Moe(c) => c,
    }
}
