//! The architecture registry: the family table ([`FAMILIES`]), the one place that maps a
//! `config.json` to the code that runs it. A row names the `model_type`s it takes, how the text
//! config may be nested, what it runs (the README table, [`families_markdown`]) and the parser
//! that validates the config into a typed struct implementing [`Architecture`]; what differs
//! between architectures (state size, in-memory and budgeted loading, whether a memory budget
//! is supported) is a trait method, so generic code never matches on the architecture.
//!
//! Adding an architecture: its file (config struct, plan, [`Architecture`] impl and its
//! [`Family`] row constant), its `mod` line and its row here. `docs/adding-an-architecture.md`
//! walks through it.

use std::sync::Arc;

use super::{Loader, Model, StateSize};
use crate::cache::{OocOptions, OocRuntime};
use crate::config::{
    DeepseekV3Config, Family, FamilyInput, Glm4MoeConfig, GptOssConfig, KimiK3Config, KimiLinearConfig,
    Nesting, Qwen3Config, Qwen3MoeConfig, Spec, TextConfig,
};
use crate::error::{Error, Result};
use crate::weights::WeightIndex;

/// A `config.json` parsed by its family: the checkpoint facts and the architecture.
pub type ModelSpec = Spec<Arc<dyn Architecture>>;

/// What the engine needs from an architecture, implemented by its validated config.
pub trait Architecture: std::fmt::Debug + Send + Sync {
    /// Bytes of one sequence's state (attention caches, recurrent states), from the config.
    fn state_size(&self) -> StateSize;

    /// Build the model with every tensor in memory (memory-mapped).
    fn load(&self, ld: &Loader<'_>) -> Result<Box<dyn Model>>;

    /// The multi-token-prediction module the checkpoint publishes after its last layer, loaded
    /// in memory as a drafter (`None`: the checkpoint has none, or this architecture does not
    /// run it).
    fn load_mtp(&self, ld: &Loader<'_>) -> Result<Option<super::MtpModule>> {
        let _ = ld;
        Ok(None)
    }

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

    /// What a residency plan needs of the checkpoint, from its tensor headers alone (nothing
    /// is read): the layouts [`Architecture::load_budgeted`] would plan with.
    fn ooc_layout(&self, spec: &ModelSpec, index: &WeightIndex) -> Result<super::OocLayout> {
        let _ = index;
        Err(not_budgeted(spec))
    }

    /// Routed expert `expert` of the `moe_layer`-th MoE layer, loaded through `ld` (to time the
    /// kernels of its stored format).
    fn routed_expert(
        &self,
        ld: &Loader<'_>,
        moe_layer: usize,
        expert: usize,
    ) -> Result<crate::model::layers::mlp::Mlp> {
        let _ = (ld, moe_layer, expert);
        Err(Error::Budget("this architecture has no routed experts".into()))
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
        Err(not_budgeted(spec))
    }
}

/// What an architecture without out-of-core loading answers when asked for it.
pub(super) fn not_budgeted(spec: &ModelSpec) -> Error {
    Error::Budget(format!(
        "{}: out-of-core loading is not implemented for this architecture (it loads in memory)",
        spec.model_type
    ))
}

/// A family row building an [`Architecture`].
pub type ArchFamily = Family<Arc<dyn Architecture>>;

/// The families this build runs, first match wins.
pub static FAMILIES: &[ArchFamily] = &[
    row::<DeepseekV3Config>(
        "DeepSeek-V3/V3.1, Kimi-K2, Kimi-K2.5 (nested): BF16, block FP8, compressed-tensors INT4",
    ),
    row::<KimiLinearConfig>("Kimi-Linear: KDA + MLA, BF16"),
    row::<KimiK3Config>("Kimi K3: KDA + MLA, AttnRes, compressed-tensors MXFP4 experts"),
    row::<Qwen3Config>("Qwen3 dense (a raw-completion drafter): BF16"),
    row::<Qwen3MoeConfig>("Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B-A35B: BF16, block FP8"),
    row::<Glm4MoeConfig>("GLM-4.5, GLM-4.6, GLM-4.7: BF16, block FP8"),
    row::<super::glm_moe_dsa::GlmMoeDsaConfig>(
        "GLM-5, GLM-5.1, GLM-5.2, DeepSeek-V3.2: MLA + DeepSeek Sparse Attention (lightning indexer, shared indexer layers), BF16, block FP8",
    ),
    row::<super::deepseek_v4::DeepseekV4Config>(
        "DeepSeek-V4-Flash, DeepSeek-V4-Pro: sliding / compressed sparse / heavily compressed attention, mHC, hash routing, FP4 experts, block FP8",
    ),
    row::<GptOssConfig>("gpt-oss-20b, gpt-oss-120b: the published MXFP4 experts"),
    row::<super::minimax_m2::MiniMaxM2Config>("MiniMax-M2, M2.1, M2.5: block FP8"),
    row::<super::qwen3_next::Qwen3NextConfig>(
        "Qwen3-Next-80B-A3B, Qwen3.5/3.6-MoE (35B-A3B to 397B-A17B): gated DeltaNet + gated attention, BF16, block FP8",
    ),
];

/// The row of the typed config `C`, which runs what `runs` says.
const fn row<C: TextConfig + Architecture + 'static>(runs: &'static str) -> ArchFamily {
    Family {
        model_types: C::MODEL_TYPES,
        nesting: C::NESTING,
        nested_names: C::NESTED_NAMES,
        runs,
        parse: build::<C>,
    }
}

fn build<C: TextConfig + Architecture + 'static>(input: FamilyInput<'_>) -> Result<Arc<dyn Architecture>> {
    Ok(Arc::new(C::parse(input)?))
}

/// The supported types as errors list them.
pub fn supported_model_types() -> String {
    crate::config::supported(FAMILIES)
}

/// The README's table of supported families, one row per [`FAMILIES`] row.
pub fn families_markdown() -> String {
    let mut out = String::from("| `model_type` | nesting | runs |\n|---|---|---|\n");
    for f in FAMILIES {
        let types = f
            .model_types
            .iter()
            .map(|t| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let nesting = match f.nesting {
            Nesting::Flat => "flat".to_string(),
            Nesting::FlatOrNestedIn(o) => format!("flat, or `text_config` of {}", o.join(", ")),
            Nesting::NestedIn(o) => format!("`text_config` of {}", o.join(", ")),
        };
        out += &format!("| {types} | {nesting} | {} |\n", f.runs);
    }
    out
}

impl ModelSpec {
    /// Read and validate `dir/config.json`.
    pub fn load(dir: &std::path::Path) -> Result<ModelSpec> {
        Spec::load_with(dir, FAMILIES)
    }

    /// Validate an already-parsed `config.json` value (`path` for messages).
    pub fn from_value(value: &serde_json::Value, path: &std::path::Path) -> Result<ModelSpec> {
        Spec::from_value_with(value, path, FAMILIES)
    }
}
