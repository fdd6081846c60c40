//! The install manifest, `DIR/.deltafin/manifest.json`: which source and pinned revision the
//! directory holds, the requested mode, every file with its size, digest and state, and (stream
//! mode) the catalog of routed-expert byte ranges that may still be remote. Which bytes of a
//! staged file are present is *not* stored here but in each file's sidecar (see [`crate::staged`]),
//! which is what survives a crash; the manifest's per-file state is a summary refreshed on every
//! change. Written atomically.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fsutil::write_atomic;
use crate::safetensors::ExpertRange;
use crate::verify::Expected;

/// Name of the state directory inside an install directory.
pub const STATE_DIR: &str = ".deltafin";
/// Manifest format version.
pub const MANIFEST_FORMAT: u32 = 1;

/// How much of the checkpoint is installed up front.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every file, complete and verified.
    Full,
    /// Every non-expert byte; routed experts are fetched on first use.
    Stream,
}

/// State of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileState {
    /// Nothing local yet.
    Missing,
    /// A partial under `.deltafin/partial/` (some ranges present).
    Staged,
    /// Complete, verified, published at its final path.
    Published,
}

/// One file of the install.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    pub expected: Expected,
    /// Source locator (HF path or OCI layer digest).
    pub locator: String,
    pub state: FileState,
    /// SHA-256 computed when the file was verified (lets `push` skip re-hashing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// The whole manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// `hf://org/repo` or `oci://registry/repo`.
    pub source: String,
    /// Requested revision (branch, tag, commit, digest).
    pub revision: String,
    /// Hugging Face endpoint the install was made from (stream mode fetches experts from it
    /// later); absent for OCI sources, whose registry is part of `source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// What it resolved to when the install started (commit sha / manifest digest).
    pub pinned: String,
    /// Mode of the last setup.
    pub mode: Mode,
    /// Every wanted byte of `mode` is present and every complete file is verified and published.
    pub complete: bool,
    pub files: Vec<FileEntry>,
    /// Stream mode: every routed expert's byte range(s).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub experts: Vec<ExpertRange>,
}

impl Manifest {
    /// Path of the manifest of `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(STATE_DIR).join("manifest.json")
    }

    /// Load `dir`'s manifest; `Ok(None)` when there is none.
    pub fn load(dir: &Path) -> Result<Option<Manifest>> {
        let path = Self::path(dir);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, e)),
        };
        let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| Error::Format {
            path: path.display().to_string(),
            reason: format!("not a valid manifest: {e}"),
        })?;
        if m.format != MANIFEST_FORMAT {
            return Err(Error::Format {
                path: path.display().to_string(),
                reason: format!("unsupported format {}", m.format),
            });
        }
        Ok(Some(m))
    }

    /// Write atomically.
    pub fn save(&self, dir: &Path) -> Result<()> {
        write_atomic(&Self::path(dir), &serde_json::to_vec_pretty(self).expect("json"))
    }

    /// The entry for `path`.
    pub fn file(&self, path: &str) -> Option<&FileEntry> {
        self.files.iter().find(|f| f.path == path)
    }

    /// Mutable entry for `path`.
    pub fn file_mut(&mut self, path: &str) -> Option<&mut FileEntry> {
        self.files.iter_mut().find(|f| f.path == path)
    }

    /// Sum of file sizes.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_missing() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(Manifest::load(t.path()).unwrap(), None);
        let m = Manifest {
            format: MANIFEST_FORMAT,
            source: "hf://o/r".into(),
            revision: "main".into(),
            endpoint: Some("https://huggingface.co".into()),
            pinned: "abc".into(),
            mode: Mode::Stream,
            complete: false,
            files: vec![FileEntry {
                path: "config.json".into(),
                size: 3,
                expected: Expected::SizeOnly,
                locator: "config.json".into(),
                state: FileState::Published,
                sha256: None,
            }],
            experts: vec![ExpertRange {
                layer: 1,
                expert: 2,
                file: "m.safetensors".into(),
                start: 10,
                end: 20,
            }],
        };
        m.save(t.path()).unwrap();
        assert_eq!(Manifest::load(t.path()).unwrap(), Some(m.clone()));
        let text = std::fs::read_to_string(Manifest::path(t.path())).unwrap();
        assert!(
            text.contains(r#""mode": "stream""#) && text.contains(r#""state": "published""#),
            "{text}"
        );
        std::fs::write(Manifest::path(t.path()), b"{").unwrap();
        assert!(Manifest::load(t.path()).is_err());
    }
}
