//! Deterministic synthetic checkpoints written in the real on-disk formats (HF `config.json`,
//! safetensors shards with an index, tokenizer files). Used for the built-in default model,
//! tests that need specific shapes or formats, and benchmarks. Their weights are random: the
//! text they produce is meaningless, but every code path is the one real checkpoints take.

mod deepseek;
mod dspark;
mod fill;
mod kimi;
mod rng;
mod tokenizer;

pub use deepseek::{DeepseekSynth, ExpertFormat, RoutingShape};
pub use dspark::DSparkSynth;
pub use kimi::{KimiK3Synth, KimiSynth, KimiVariant};
pub use rng::Rng;
pub use tokenizer::{
    K3_SPECIALS, KIMI_SPECIALS, TokenizerFlavor, write_byte_tokenizer, write_byte_tokenizer_flavor,
};

use std::path::Path;

use crate::error::{Error, Result};

/// The built-in default model: a small Kimi-K3-architecture checkpoint in the real K3 on-disk
/// format (MXFP4 experts, `language_model.` prefix) with synthetic weights and a byte-level
/// tokenizer with K3's special tokens and chat format.
pub fn builtin_default() -> KimiK3Synth {
    KimiK3Synth::k3_builtin()
}

/// Make sure the built-in default model exists in `dir`, generating it (atomically: into a
/// sibling temp directory, then renamed) if it does not. Returns whether it was generated.
pub fn ensure_builtin(dir: &Path) -> Result<bool> {
    if dir.join("config.json").is_file() {
        return Ok(false);
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    let tmp = parent.join(format!(
        ".{}.partial-{}",
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("model"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    builtin_default().write(&tmp)?;
    match std::fs::rename(&tmp, dir) {
        Ok(()) => Ok(true),
        // Another process won the race: theirs is complete (rename is atomic).
        Err(_) if dir.join("config.json").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(false)
        }
        Err(e) => Err(Error::io(dir, e)),
    }
}
