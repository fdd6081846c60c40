//! Flags shared by commands that decode (`run`, `serve`): speculative decoding and its drafts.

use std::path::PathBuf;

use clap::Args;
use deltafin_engine::spec::SpecMode;
use deltafin_server::drafts::DraftSources;

/// Speculative-decoding settings.
#[derive(Debug, Clone, Args)]
pub struct SpecArgs {
    /// Speculative decoding: `auto` (draft while the measured economics say it pays), `on`
    /// (always draft; still verified), `off`. Drafts never change the output.
    #[arg(long, default_value = "auto", env = "DELTAFIN_SPEC")]
    pub spec: SpecMode,
    /// Draft-head (DSpark) directory; default MODEL/drafts/dspark when present. Used for chat.
    #[arg(long, env = "DELTAFIN_DRAFT_DSPARK")]
    pub draft_dspark: Option<PathBuf>,
    /// Qwen3 drafter directory; default MODEL/drafts/qwen when present. Used for raw completions.
    #[arg(long, env = "DELTAFIN_DRAFT_QWEN")]
    pub draft_qwen: Option<PathBuf>,
    /// Draft with the checkpoint's own multi-token-prediction module (DeepSeek-V3, GLM-4.5,
    /// GLM-5), held in memory (under a budget, its bytes are reserved out of it). Used for chat
    /// and completions, before the other drafts.
    #[arg(long, env = "DELTAFIN_DRAFT_MTP")]
    pub draft_mtp: bool,
    /// Do not fall back to n-gram prompt-lookup drafts.
    #[arg(long, env = "DELTAFIN_NO_NGRAM")]
    pub no_ngram: bool,
    /// Widest draft verified in one pass.
    #[arg(long, default_value_t = 8, env = "DELTAFIN_SPEC_MAX_WIDTH")]
    pub spec_max_width: usize,
}

impl SpecArgs {
    /// The validated draft sources.
    pub fn sources(&self) -> DraftSources {
        DraftSources {
            mode: self.spec,
            dspark: self.draft_dspark.clone(),
            qwen: self.draft_qwen.clone(),
            ngram: !self.no_ngram,
            mtp: self.draft_mtp,
            max_width: self.spec_max_width.max(1),
        }
    }
}
