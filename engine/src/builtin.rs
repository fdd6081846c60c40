//! The built-in models, usable with no download: the trained default and the synthetic K3 preset.
//!
//! The default is a small DeepSeek-V3-architecture MoE (MLA attention, sigmoid-routed experts
//! with a shared expert, BF16 weights, F32 router bias) trained on Jane Austen's novels by
//! `engine/assets/train_default_model.py`; its files ship inside the binary, exactly as the
//! script wrote them, and are written out on first use. The K3 preset is
//! [`crate::synth::KimiK3Synth::k3_builtin`]: random weights in the real K3 format, for the K3
//! code paths. Both are written atomically (a sibling temp directory, then a rename).

use std::path::Path;

use crate::error::{Error, Result};

/// Which built-in model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// The trained default (`austen-moe`): readable English.
    Default,
    /// The synthetic Kimi K3 checkpoint: every K3 code path, meaningless text.
    K3,
}

/// The trained default's files, as `engine/assets/train_default_model.py` wrote them.
const DEFAULT_FILES: [(&str, &[u8]); 5] = [
    ("config.json", include_bytes!("../assets/austen-moe/config.json")),
    (
        "generation_config.json",
        include_bytes!("../assets/austen-moe/generation_config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../assets/austen-moe/model.safetensors"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../assets/austen-moe/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_bytes!("../assets/austen-moe/tokenizer_config.json"),
    ),
];

impl Builtin {
    /// Parse a `builtin:NAME` model argument (`builtin:default`, `builtin:k3`).
    pub fn from_model_arg(arg: &str) -> Option<Result<Self>> {
        let name = arg.strip_prefix("builtin:")?;
        Some(match name {
            "" | "default" | "austen-moe" => Ok(Builtin::Default),
            "k3" => Ok(Builtin::K3),
            other => Err(Error::InvalidArgument {
                field: "model",
                reason: format!("unknown built-in model `{other}` (builtin:default, builtin:k3)"),
            }),
        })
    }

    /// A directory name that changes whenever the model's bytes do.
    pub fn dir_name(self) -> String {
        match self {
            Builtin::Default => {
                let mut h = 0xcbf2_9ce4_8422_2325u64;
                for (_, bytes) in DEFAULT_FILES {
                    for &b in bytes {
                        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                    }
                }
                format!("builtin-austen-moe-{:012x}", h >> 16)
            }
            Builtin::K3 => format!("builtin-kimi-k3-{}", env!("CARGO_PKG_VERSION")),
        }
    }

    /// Whether its weights are random (its text is meaningless).
    pub fn synthetic(self) -> bool {
        self == Builtin::K3
    }

    /// Make sure the model exists in `dir`, writing it if it does not. Returns whether it was
    /// written now.
    pub fn ensure(self, dir: &Path) -> Result<bool> {
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
        self.write(&tmp)?;
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

    /// Write the model's files into `dir` (created; synced before returning).
    pub fn write(self, dir: &Path) -> Result<()> {
        match self {
            Builtin::K3 => crate::synth::KimiK3Synth::k3_builtin().write(dir),
            Builtin::Default => {
                std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
                for (name, bytes) in DEFAULT_FILES {
                    let path = dir.join(name);
                    let write = || -> std::io::Result<()> {
                        let mut f = std::fs::File::create(&path)?;
                        std::io::Write::write_all(&mut f, bytes)?;
                        f.sync_all()
                    };
                    write().map_err(|e| Error::io(&path, e))?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_args_name_the_builtins() {
        assert_eq!(Builtin::from_model_arg("/models/x").map(|r| r.ok()), None);
        assert_eq!(
            Builtin::from_model_arg("builtin:k3").unwrap().unwrap(),
            Builtin::K3
        );
        assert_eq!(
            Builtin::from_model_arg("builtin:default").unwrap().unwrap(),
            Builtin::Default
        );
        let err = Builtin::from_model_arg("builtin:gpt").unwrap().unwrap_err();
        assert!(err.to_string().contains("builtin:k3"), "{err}");
    }

    #[test]
    fn the_default_is_written_once_and_byte_for_byte() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join(Builtin::Default.dir_name());
        assert!(Builtin::Default.ensure(&dir).unwrap());
        assert!(!Builtin::Default.ensure(&dir).unwrap());
        for (name, bytes) in DEFAULT_FILES {
            assert_eq!(std::fs::read(dir.join(name)).unwrap(), bytes, "{name}");
        }
    }
}
