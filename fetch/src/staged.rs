//! A file being downloaded: `.deltafin/partial/<path>.partial` (a sparse file of the final size)
//! plus a sidecar `<path>.partial.json` recording *which byte ranges are durably present*. Data
//! is written with positional writes, `fdatasync`ed, and only then added to the sidecar (written
//! atomically), so after `kill -9` or power loss the sidecar never claims bytes that are not on
//! disk. The sidecar also records the file's identity (size, digest, pinned revision): a partial
//! from another revision is discarded, never mixed. When every byte is present the file is hashed
//! and published by rename; a mismatch deletes the partial and publishes nothing.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fsutil::{publish, write_atomic};
use crate::ranges::RangeSet;
use crate::source::RemoteFile;
use crate::verify::{Expected, FileHashes, verify_file};

/// Sidecar format version.
const SIDECAR_FORMAT: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Sidecar {
    format: u32,
    path: String,
    size: u64,
    expected: Expected,
    pinned: String,
    present: RangeSet,
}

/// Where a remote file is staged under a state directory (pure).
pub fn staged_paths(state_dir: &Path, rel: &str) -> (PathBuf, PathBuf) {
    let base = state_dir.join("partial").join(rel);
    let mut data = base.clone().into_os_string();
    data.push(".partial");
    let mut side = base.into_os_string();
    side.push(".partial.json");
    (PathBuf::from(data), PathBuf::from(side))
}

/// A staged (partial) file.
#[derive(Debug)]
pub struct StagedFile {
    pub remote: RemoteFile,
    data_path: PathBuf,
    sidecar_path: PathBuf,
    file: File,
    pinned: String,
    present: Mutex<RangeSet>,
}

impl StagedFile {
    /// Open (resume) or create the staged copy of `remote` at `pinned`. A partial whose sidecar is
    /// missing, unreadable, or describes another file/revision starts over from nothing.
    pub fn open(state_dir: &Path, remote: &RemoteFile, pinned: &str) -> Result<StagedFile> {
        let (data_path, sidecar_path) = staged_paths(state_dir, &remote.path);
        if let Some(parent) = data_path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        let want = Sidecar {
            format: SIDECAR_FORMAT,
            path: remote.path.clone(),
            size: remote.size,
            expected: remote.expected.clone(),
            pinned: pinned.to_string(),
            present: RangeSet::new(),
        };
        let prior = std::fs::read(&sidecar_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Sidecar>(&b).ok());
        let len = std::fs::metadata(&data_path).map(|m| m.len()).ok();
        let present = match prior {
            Some(p) if same_identity(&p, &want) && p.present.is_normalized() && len == Some(remote.size) => {
                RangeSet::from_ranges(p.present.iter().filter(|r| r.end <= remote.size))
            }
            _ => RangeSet::new(),
        };
        let file = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&data_path)
            .map_err(|e| Error::io(&data_path, e))?;
        if present.is_empty() {
            // Start over: an empty sparse file of the final size.
            file.set_len(0)
                .and_then(|_| file.set_len(remote.size))
                .map_err(|e| Error::io(&data_path, e))?;
        }
        let staged = StagedFile {
            remote: remote.clone(),
            data_path,
            sidecar_path,
            file,
            pinned: pinned.to_string(),
            present: Mutex::new(present),
        };
        staged.write_sidecar(&staged.present.lock().expect("lock").clone())?;
        Ok(staged)
    }

    /// Path of the partial data file (readable while staged).
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    /// Write `bytes` at `offset` (not yet durable nor recorded).
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| Error::io(&self.data_path, e))
    }

    /// Read `buf.len()` bytes at `offset` (only meaningful for present ranges).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::io(&self.data_path, e))
    }

    /// Make `range` durable and record it as present.
    pub fn commit(&self, range: Range<u64>) -> Result<()> {
        self.file.sync_data().map_err(|e| Error::io(&self.data_path, e))?;
        let mut p = self.present.lock().expect("lock");
        let mut next = p.clone();
        next.insert(range);
        self.write_sidecar(&next)?;
        *p = next;
        Ok(())
    }

    fn write_sidecar(&self, present: &RangeSet) -> Result<()> {
        let s = Sidecar {
            format: SIDECAR_FORMAT,
            path: self.remote.path.clone(),
            size: self.remote.size,
            expected: self.remote.expected.clone(),
            pinned: self.pinned.clone(),
            present: present.clone(),
        };
        write_atomic(&self.sidecar_path, &serde_json::to_vec(&s).expect("json"))
    }

    /// The ranges present.
    pub fn present(&self) -> RangeSet {
        self.present.lock().expect("lock").clone()
    }

    /// Whether all of `range` is present.
    pub fn covers(&self, range: &Range<u64>) -> bool {
        self.present.lock().expect("lock").covers(range)
    }

    /// Whether every byte is present.
    pub fn is_complete(&self) -> bool {
        self.covers(&(0..self.remote.size))
    }

    /// Hash the complete file and publish it as `dest`. On a mismatch the partial and its sidecar
    /// are deleted and the error names the file.
    pub fn finish(&self, dest: &Path) -> Result<FileHashes> {
        if !self.is_complete() {
            return Err(Error::NotReady {
                dir: self.data_path.clone(),
                reason: "not every byte is present yet".into(),
            });
        }
        self.file.sync_all().map_err(|e| Error::io(&self.data_path, e))?;
        match verify_file(
            &self.data_path,
            &self.remote.path,
            self.remote.size,
            &self.remote.expected,
        ) {
            Ok(h) => {
                publish(&self.data_path, dest)?;
                let _ = std::fs::remove_file(&self.sidecar_path);
                Ok(h)
            }
            Err(e) => {
                self.discard();
                Err(e)
            }
        }
    }

    /// Delete the partial and its sidecar.
    pub fn discard(&self) {
        let _ = std::fs::remove_file(&self.sidecar_path);
        let _ = std::fs::remove_file(&self.data_path);
    }
}

fn same_identity(a: &Sidecar, b: &Sidecar) -> bool {
    a.format == b.format
        && a.path == b.path
        && a.size == b.size
        && a.expected == b.expected
        && a.pinned == b.pinned
}

/// Bytes recorded present for `remote` in an existing sidecar (read-only; for planning and doctor).
pub fn present_on_disk(state_dir: &Path, remote: &RemoteFile, pinned: &str) -> RangeSet {
    let (data, side) = staged_paths(state_dir, &remote.path);
    let len = std::fs::metadata(&data).map(|m| m.len()).ok();
    match std::fs::read(&side)
        .ok()
        .and_then(|b| serde_json::from_slice::<Sidecar>(&b).ok())
    {
        Some(s)
            if s.path == remote.path
                && s.size == remote.size
                && s.expected == remote.expected
                && s.pinned == pinned
                && len == Some(remote.size)
                && s.present.is_normalized() =>
        {
            s.present
        }
        _ => RangeSet::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    fn remote(content: &[u8]) -> RemoteFile {
        RemoteFile {
            path: "sub/f.bin".into(),
            size: content.len() as u64,
            expected: Expected::Sha256(hex::encode(sha2::Sha256::digest(content))),
            locator: "sub/f.bin".into(),
        }
    }

    #[test]
    fn resume_keeps_committed_ranges_only() {
        let t = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..100u8).collect();
        let r = remote(&content);
        let s = StagedFile::open(t.path(), &r, "c1").unwrap();
        s.write_at(0, &content[..40]).unwrap();
        s.commit(0..40).unwrap();
        s.write_at(40, &content[40..60]).unwrap(); // written, never committed
        drop(s);
        let s = StagedFile::open(t.path(), &r, "c1").unwrap();
        assert_eq!(s.present(), RangeSet::from_range(0..40));
        assert_eq!(present_on_disk(t.path(), &r, "c1"), RangeSet::from_range(0..40));
        drop(s);
        // Another pinned revision: start over.
        let s = StagedFile::open(t.path(), &r, "c2").unwrap();
        assert!(s.present().is_empty());
        s.write_at(0, &content).unwrap();
        s.commit(0..100).unwrap();
        let dest = t.path().join("out/f.bin");
        s.finish(&dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), content);
        assert!(!staged_paths(t.path(), "sub/f.bin").1.exists());
    }

    #[test]
    fn bad_checksum_is_never_published() {
        let t = tempfile::tempdir().unwrap();
        let content = b"0123456789".to_vec();
        let r = remote(&content);
        let s = StagedFile::open(t.path(), &r, "c").unwrap();
        s.write_at(0, b"0123456780").unwrap();
        s.commit(0..10).unwrap();
        let dest = t.path().join("f.bin");
        let e = s.finish(&dest).unwrap_err();
        assert!(
            matches!(e, Error::ChecksumMismatch { ref path, .. } if path == "sub/f.bin"),
            "{e}"
        );
        assert!(!dest.exists());
        let (data, side) = staged_paths(t.path(), "sub/f.bin");
        assert!(!data.exists() && !side.exists());
    }
}
