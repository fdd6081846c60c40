//! What `deltafin push` uploads: the files of a complete install (from its manifest, reusing the
//! SHA-256 computed at verification) or, for a plain directory without a manifest, every regular
//! file under it (hashed now). The `.deltafin/` state directory is never pushed.

use std::path::Path;

use crate::error::{Error, Result};
use crate::fsutil::safe_relative_path;
use crate::manifest::{FileState, Manifest, STATE_DIR};
use crate::source::oci::{ArtifactConfig, ArtifactFile, PushFile};
use crate::verify::hash_file;

/// Files and config blob for pushing `dir`.
pub fn push_plan(dir: &Path) -> Result<(Vec<PushFile>, ArtifactConfig)> {
    let files = match Manifest::load(dir)? {
        Some(m) => from_manifest(dir, &m)?,
        None => from_tree(dir)?,
    };
    let m = Manifest::load(dir)?;
    let config = ArtifactConfig {
        format: 1,
        source: m.as_ref().map(|m| m.source.clone()),
        revision: m.as_ref().map(|m| m.revision.clone()),
        pinned: m.as_ref().map(|m| m.pinned.clone()),
        files: files
            .iter()
            .map(|f| ArtifactFile {
                path: f.path.clone(),
                size: f.size,
                sha256: f.sha256.clone(),
            })
            .collect(),
    };
    Ok((files, config))
}

fn from_manifest(dir: &Path, m: &Manifest) -> Result<Vec<PushFile>> {
    let mut out = Vec::new();
    for f in &m.files {
        if f.state != FileState::Published {
            return Err(Error::NotReady {
                dir: dir.into(),
                reason: format!(
                    "{} is not complete (mode {:?}); run `deltafin setup --full` first",
                    f.path, m.mode
                ),
            });
        }
        let path = dir.join(&f.path);
        let len = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len();
        if len != f.size {
            return Err(Error::NotReady {
                dir: dir.into(),
                reason: format!("{} is {len} bytes, the manifest says {}", f.path, f.size),
            });
        }
        let sha256 = match &f.sha256 {
            Some(h) => h.clone(),
            None => hash_file(&path, false)?.sha256,
        };
        out.push(PushFile {
            path: f.path.clone(),
            size: f.size,
            sha256,
        });
    }
    Ok(out)
}

fn from_tree(dir: &Path) -> Result<Vec<PushFile>> {
    let mut rels = Vec::new();
    walk(dir, "", &mut rels)?;
    rels.sort();
    let mut out = Vec::new();
    for rel in rels {
        let h = hash_file(&dir.join(&rel), false)?;
        out.push(PushFile {
            path: rel,
            size: h.size,
            sha256: h.sha256,
        });
    }
    if out.is_empty() {
        return Err(Error::NotReady {
            dir: dir.into(),
            reason: "no files to push".into(),
        });
    }
    Ok(out)
}

fn walk(root: &Path, prefix: &str, out: &mut Vec<String>) -> Result<()> {
    let here = root.join(prefix);
    for entry in std::fs::read_dir(&here).map_err(|e| Error::io(&here, e))? {
        let entry = entry.map_err(|e| Error::io(&here, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if prefix.is_empty() && name == STATE_DIR {
            continue;
        }
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let ty = entry.file_type().map_err(|e| Error::io(entry.path(), e))?;
        if ty.is_dir() {
            walk(root, &rel, out)?;
        } else if ty.is_file() {
            out.push(safe_relative_path(&rel)?.to_string());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_tree_skips_state_dir() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join(".deltafin")).unwrap();
        std::fs::write(t.path().join(".deltafin/lock"), b"").unwrap();
        std::fs::create_dir_all(t.path().join("sub")).unwrap();
        std::fs::write(t.path().join("sub/b.json"), b"{}").unwrap();
        std::fs::write(t.path().join("a.bin"), b"xyz").unwrap();
        let (files, config) = push_plan(t.path()).unwrap();
        let names: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["a.bin", "sub/b.json"]);
        assert_eq!(config.files.len(), 2);
        assert_eq!(config.source, None);
    }
}
