//! Which draft models a command loads, from where: `--draft-dspark DIR` / `--draft-qwen DIR`,
//! else the install's own `MODEL/drafts/dspark` and `MODEL/drafts/qwen` when present (where
//! `deltafin setup --draft …` / `setup-qwen` put them); with `--draft-mtp` the target's own
//! multi-token-prediction module (DeepSeek-V3, GLM-4.5, GLM-5), held in memory beside the
//! target (under a budget its bytes are reserved out of it). A draft that is present but broken, or
//! that was made for another target, is an error naming it (`--spec off` runs without drafts).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use deltafin_engine::arch::Model;
use deltafin_engine::spec::dspark::DSpark;
use deltafin_engine::spec::mtp::Mtp;
use deltafin_engine::spec::ngram::NgramConfig;
use deltafin_engine::spec::qwen::{QwenDraftConfig, QwenDrafter};
use deltafin_engine::spec::{Drafts, EconomicsConfig, SpecMode};
use deltafin_engine::tokenizer::Tokenizer;

/// Where drafts come from and how they are used (validated command-line settings).
#[derive(Debug, Clone)]
pub struct DraftSources {
    pub mode: SpecMode,
    /// Explicit draft-head directory (else `MODEL/drafts/dspark` if it exists).
    pub dspark: Option<PathBuf>,
    /// Explicit Qwen drafter directory (else `MODEL/drafts/qwen` if it exists).
    pub qwen: Option<PathBuf>,
    pub ngram: bool,
    /// Draft with the checkpoint's own MTP module (`--draft-mtp`).
    pub mtp: bool,
    pub max_width: usize,
}

impl Default for DraftSources {
    fn default() -> Self {
        DraftSources {
            mode: SpecMode::Auto,
            dspark: None,
            qwen: None,
            ngram: true,
            mtp: false,
            max_width: 8,
        }
    }
}

/// Why a draft could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("draft {name} in {}: {source} (run with --spec off to serve without drafts)", dir.display())]
pub struct DraftError {
    pub name: &'static str,
    pub dir: PathBuf,
    #[source]
    pub source: Box<deltafin_engine::Error>,
}

fn pick(explicit: &Option<PathBuf>, model_dir: &Path, name: &str) -> Option<PathBuf> {
    explicit.clone().or_else(|| {
        let d = model_dir.join("drafts").join(name);
        d.join("config.json").is_file().then_some(d)
    })
}

impl DraftSources {
    /// Load the drafts for `target` (in `model_dir`, tokenised by `tokenizer`). Under a memory
    /// budget the caller reserves the MTP module's bytes ([`deltafin_engine::arch::mtp_bytes`]).
    pub fn load(
        &self,
        model_dir: &Path,
        target: &dyn Model,
        tokenizer: &Arc<Tokenizer>,
    ) -> Result<Drafts, DraftError> {
        let economics = EconomicsConfig {
            max_width: self.max_width.max(1),
            ..Default::default()
        };
        let mut drafts = Drafts {
            ngram: self.ngram.then(NgramConfig::default),
            economics,
            ..Drafts::none()
        };
        if self.mode == SpecMode::Off {
            return Ok(drafts);
        }
        if self.mtp {
            drafts.mtp = Some(Arc::new(load_mtp(model_dir, target)?));
        }
        if let Some(dir) = pick(&self.dspark, model_dir, "dspark") {
            let err = |source| DraftError {
                name: "dspark",
                dir: dir.clone(),
                source: Box::new(source),
            };
            let head = DSpark::load(&dir).map_err(err)?;
            head.check_target(target).map_err(err)?;
            drafts.dspark = Some(Arc::new(head));
        }
        if let Some(dir) = pick(&self.qwen, model_dir, "qwen") {
            let err = |source| DraftError {
                name: "qwen",
                dir: dir.clone(),
                source: Box::new(source),
            };
            let q = QwenDrafter::load(&dir, tokenizer.clone(), QwenDraftConfig::default()).map_err(err)?;
            drafts.qwen = Some(Arc::new(q));
        }
        Ok(drafts)
    }
}

/// The target's own MTP module, checked against it.
fn load_mtp(model_dir: &Path, target: &dyn Model) -> Result<Mtp, DraftError> {
    let err = |source| DraftError {
        name: "mtp",
        dir: model_dir.to_path_buf(),
        source: Box::new(source),
    };
    let module = deltafin_engine::arch::load_mtp(model_dir)
        .map_err(err)?
        .ok_or_else(|| {
            err(deltafin_engine::Error::InvalidArgument {
                field: "mtp",
                reason: format!(
                    "the checkpoint has no multi-token-prediction module (model.layers.{}.eh_proj)",
                    target.info().num_layers
                ),
            })
        })?;
    let mtp = Mtp::new(module);
    mtp.check_target(target).map_err(err)?;
    Ok(mtp)
}

/// Reserve the bytes of the MTP module in `dir` out of a memory budget: `--draft-mtp` holds it
/// beside the target (`deltafin_engine::arch::mtp_bytes`; nothing without a module).
pub fn reserve_mtp(
    dir: &Path,
    options: &mut deltafin_engine::cache::OocOptions,
) -> deltafin_engine::Result<()> {
    let index = deltafin_engine::weights::WeightIndex::open(dir)?;
    options.reserve_bytes += deltafin_engine::arch::mtp_bytes(&index);
    Ok(())
}
