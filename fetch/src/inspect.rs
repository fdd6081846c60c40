//! Read-only inspection of an install directory (for `deltafin doctor`): what the manifest says,
//! what is actually on disk (published files and their sizes, staged files and the bytes their
//! sidecars record), optional re-hashing of published files, and a list of problems. Nothing is
//! written and no lock is taken.

use std::path::Path;

use serde::Serialize;

use crate::error::Result;
use crate::manifest::{FileEntry, FileState, Manifest, Mode, STATE_DIR};
use crate::ranges::RangeSet;
use crate::source::RemoteFile;
use crate::staged::present_on_disk;
use crate::verify::verify_file;

/// One file as found on disk.
#[derive(Debug, Clone, Serialize)]
pub struct FileStatus {
    pub path: String,
    pub size: u64,
    pub state: FileState,
    /// Bytes present locally.
    pub local_bytes: u64,
    /// `Some(true/false)` when hashed (`--verify`) — only complete files can be.
    pub verified: Option<bool>,
}

/// The install as found on disk.
#[derive(Debug, Clone, Serialize)]
pub struct InstallStatus {
    pub source: String,
    pub revision: String,
    pub pinned: String,
    pub mode: Mode,
    pub complete: bool,
    pub bytes_total: u64,
    pub bytes_local: u64,
    /// `100 * bytes_local / bytes_total`.
    pub percent_local: f64,
    /// Routed-expert ranges still remote (stream mode).
    pub remote_expert_bytes: u64,
    pub files: Vec<FileStatus>,
    /// Everything that makes the install unusable or suspect.
    pub problems: Vec<String>,
}

/// Inspect `dir`; `Ok(None)` when it has no manifest (not installed by `deltafin setup`).
pub fn inspect(dir: &Path, verify: bool) -> Result<Option<InstallStatus>> {
    let Some(m) = Manifest::load(dir)? else {
        return Ok(None);
    };
    let state_dir = dir.join(STATE_DIR);
    let mut problems = Vec::new();
    let mut files = Vec::new();
    let mut remote_expert_bytes = 0;
    for e in &m.files {
        let (status, remote) = file_status(dir, &state_dir, &m, e, verify, &mut problems);
        files.push(status);
        remote_expert_bytes += remote;
    }
    if !m.complete {
        problems
            .push("the last setup did not finish: rerun the same `deltafin setup` command to resume".into());
    }
    let bytes_total = m.total_bytes();
    let bytes_local: u64 = files.iter().map(|f| f.local_bytes).sum();
    Ok(Some(InstallStatus {
        source: m.source.clone(),
        revision: m.revision.clone(),
        pinned: m.pinned.clone(),
        mode: m.mode,
        complete: m.complete,
        bytes_total,
        bytes_local,
        percent_local: if bytes_total == 0 {
            100.0
        } else {
            100.0 * bytes_local as f64 / bytes_total as f64
        },
        remote_expert_bytes,
        files,
        problems,
    }))
}

/// One file's status and its still-remote expert bytes; problems are appended to `problems`.
fn file_status(
    dir: &Path,
    state_dir: &Path,
    m: &Manifest,
    e: &FileEntry,
    verify: bool,
    problems: &mut Vec<String>,
) -> (FileStatus, u64) {
    let dest = dir.join(&e.path);
    let status = |state, local_bytes, verified| FileStatus {
        path: e.path.clone(),
        size: e.size,
        state,
        local_bytes,
        verified,
    };
    if let Ok(meta) = std::fs::metadata(&dest) {
        if meta.len() != e.size {
            problems.push(format!(
                "{}: {} bytes on disk, {} expected",
                e.path,
                meta.len(),
                e.size
            ));
        }
        let verified = verify.then(|| match verify_file(&dest, &e.path, e.size, &e.expected) {
            Ok(_) => true,
            Err(err) => {
                problems.push(err.to_string());
                false
            }
        });
        return (status(FileState::Published, meta.len().min(e.size), verified), 0);
    }
    let rf = RemoteFile {
        path: e.path.clone(),
        size: e.size,
        expected: e.expected.clone(),
        locator: e.locator.clone(),
    };
    let present = present_on_disk(state_dir, &rf, &m.pinned);
    let experts = RangeSet::from_ranges(
        m.experts
            .iter()
            .filter(|x| x.file == e.path)
            .map(|x| x.start..x.end),
    );
    let missing_resident = RangeSet::from_range(0..e.size)
        .minus(&experts)
        .minus(&present)
        .len();
    if m.mode == Mode::Full || missing_resident > 0 {
        problems.push(format!(
            "{}: {} of {} bytes still missing",
            e.path,
            e.size - present.len(),
            e.size
        ));
    }
    let state = if present.is_empty() {
        FileState::Missing
    } else {
        FileState::Staged
    };
    (status(state, present.len(), None), experts.minus(&present).len())
}
