//! Stream mode's local store: routed experts are fetched by range on first use into the staged
//! shard files created by `setup --stream`, then served locally like a full install.
//!
//! * [`ExpertSource`] is the interface the engine's expert cache calls (from its own threads, never
//!   from inside an async runtime): `ensure_expert` / `ensure_range` return once the bytes are
//!   durable and recorded, and give the path of the file to read them from.
//! * Concurrent requests for the same range coalesce: one caller fetches, the others wait for its
//!   result. A range is visible as present only after `fdatasync` + sidecar update, so a crash
//!   never exposes a partial expert.
//! * When the last range of a shard arrives, the whole shard is SHA-256 verified and published at
//!   its final path (a rename: readers that opened the staged file keep reading the same inode),
//!   and the manifest is updated (it becomes a full install once every shard is). A shard that
//!   fails verification is discarded and *poisoned* for the rest of the process: nothing of it
//!   is reported local again and every later request for it fails, naming the cause.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use serde::Serialize;

use crate::download::{FetchCtx, check_range, fetch_range};
use crate::error::{Error, Result};
use crate::fsutil::DirLock;
use crate::manifest::{FileState, Manifest, Mode, STATE_DIR};
use crate::retry::RetryPolicy;
use crate::safetensors::{ExpertKey, ExpertRange};
use crate::source::{Remote, RemoteFile};
use crate::staged::StagedFile;

/// What the engine needs from a (possibly partial) local weight store.
pub trait ExpertSource: Send + Sync + std::fmt::Debug {
    /// Make bytes `range` of `file` local (fetching them if needed) and return the path of the file
    /// that holds them now (the staged shard, or the published one once complete).
    fn ensure_range(&self, file: &str, range: Range<u64>) -> Result<PathBuf>;
    /// Make every byte of one routed expert local.
    fn ensure_expert(&self, layer: u32, expert: u32) -> Result<()>;
}

/// Counters of a store.
#[derive(Debug, Default, Clone, Serialize)]
pub struct StreamStats {
    /// Range fetches performed (network requests may be more with retries).
    pub fetches: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Callers that waited for another caller's identical fetch.
    pub coalesced: u64,
    /// Shards verified and published by this store.
    pub files_published: u64,
}

#[derive(Debug, Default)]
struct Inflight {
    done: Mutex<Option<Result<(), String>>>,
    cv: Condvar,
}

impl Inflight {
    fn finish(&self, r: Result<(), String>) {
        *self.done.lock().expect("lock") = Some(r);
        self.cv.notify_all();
    }

    fn wait(&self) -> Result<(), String> {
        let mut g = self.done.lock().expect("lock");
        while g.is_none() {
            g = self.cv.wait(g).expect("lock");
        }
        g.clone().expect("set")
    }
}

#[derive(Debug)]
struct FileSlot {
    staged: Option<Arc<StagedFile>>,
    published: Mutex<bool>,
    /// Why the shard failed verification (its staged copy is gone).
    failed: Mutex<Option<String>>,
}

/// The stream-mode store of one install directory (holds the directory lock).
#[derive(Debug)]
pub struct StreamStore {
    dir: PathBuf,
    remote: Remote,
    handle: tokio::runtime::Handle,
    policy: RetryPolicy,
    pinned: String,
    files: HashMap<String, FileSlot>,
    experts: HashMap<ExpertKey, Vec<ExpertRange>>,
    inflight: Mutex<HashMap<(String, u64, u64), Arc<Inflight>>>,
    manifest: Mutex<Manifest>,
    fetches: AtomicU64,
    bytes: AtomicU64,
    coalesced: AtomicU64,
    published: AtomicU64,
    _lock: DirLock,
}

impl StreamStore {
    /// Open the install in `dir` (made by `setup --stream`). `remote` must be the install's source;
    /// fetches run on `handle`'s runtime (multi-threaded), driven from the calling thread.
    pub fn open(
        dir: &Path,
        remote: Remote,
        handle: tokio::runtime::Handle,
        policy: RetryPolicy,
    ) -> Result<StreamStore> {
        let state_dir = dir.join(STATE_DIR);
        let lock = DirLock::acquire(dir, &state_dir)?;
        let manifest = Manifest::load(dir)?.ok_or_else(|| Error::NotReady {
            dir: dir.into(),
            reason: "no install manifest: run `deltafin setup` first".into(),
        })?;
        if manifest.source != remote.id() {
            return Err(Error::OtherInstall {
                dir: dir.into(),
                existing: manifest.source.clone(),
                requested: remote.id(),
            });
        }
        let mut files = HashMap::new();
        for e in &manifest.files {
            let published = e.state == FileState::Published && dir.join(&e.path).exists();
            let staged = if published {
                None
            } else {
                let rf = RemoteFile {
                    path: e.path.clone(),
                    size: e.size,
                    expected: e.expected.clone(),
                    locator: e.locator.clone(),
                };
                Some(Arc::new(StagedFile::open(&state_dir, &rf, &manifest.pinned)?))
            };
            files.insert(
                e.path.clone(),
                FileSlot {
                    staged,
                    published: Mutex::new(published),
                    failed: Mutex::new(None),
                },
            );
        }
        let mut experts: HashMap<ExpertKey, Vec<ExpertRange>> = HashMap::new();
        for r in &manifest.experts {
            experts
                .entry(ExpertKey {
                    layer: r.layer,
                    expert: r.expert,
                })
                .or_default()
                .push(r.clone());
        }
        Ok(StreamStore {
            dir: dir.into(),
            remote,
            handle,
            policy,
            pinned: manifest.pinned.clone(),
            files,
            experts,
            inflight: Mutex::new(HashMap::new()),
            manifest: Mutex::new(manifest),
            fetches: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            coalesced: AtomicU64::new(0),
            published: AtomicU64::new(0),
            _lock: lock,
        })
    }

    /// Counters so far.
    pub fn stats(&self) -> StreamStats {
        StreamStats {
            fetches: self.fetches.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            coalesced: self.coalesced.load(Ordering::Relaxed),
            files_published: self.published.load(Ordering::Relaxed),
        }
    }

    /// Whether `range` of `file` is local.
    pub fn is_local(&self, file: &str, range: &Range<u64>) -> bool {
        match self.files.get(file) {
            Some(slot) if slot.failed.lock().expect("lock").is_none() => {
                *slot.published.lock().expect("lock") || slot.staged.as_ref().is_some_and(|s| s.covers(range))
            }
            _ => false,
        }
    }

    /// `(local bytes, total bytes)` over every file.
    pub fn completeness(&self) -> (u64, u64) {
        let m = self.manifest.lock().expect("lock");
        let mut local = 0;
        for e in &m.files {
            let slot = &self.files[&e.path];
            local += if *slot.published.lock().expect("lock") {
                e.size
            } else {
                slot.staged.as_ref().map_or(0, |s| s.present().len())
            };
        }
        (local, m.total_bytes())
    }

    /// Check that every byte a stream install keeps locally (all but the routed experts) is
    /// present, so a reader never meets a hole outside an expert: an interrupted setup, or a
    /// shard discarded after a failed verification, is reported here instead.
    pub fn check_resident(&self) -> Result<()> {
        let m = self.manifest.lock().expect("lock");
        for e in &m.files {
            let slot = &self.files[&e.path];
            if *slot.published.lock().expect("lock") {
                continue;
            }
            let mut have = slot.staged.as_ref().map(|s| s.present()).unwrap_or_default();
            for r in m.experts.iter().filter(|r| r.file == e.path) {
                have.insert(r.start..r.end);
            }
            if !have.covers(&(0..e.size)) {
                return Err(Error::NotReady {
                    dir: self.dir.clone(),
                    reason: format!(
                        "{}: {} bytes that stream mode keeps local are missing (an interrupted or failed setup); \
                         rerun `deltafin setup --stream` for this directory",
                        e.path,
                        e.size - have.overlap(&(0..e.size))
                    ),
                });
            }
        }
        Ok(())
    }

    /// The mode recorded in the manifest now (`full` once every shard is published).
    pub fn mode(&self) -> Mode {
        self.manifest.lock().expect("lock").mode
    }

    /// Every `(path, size)` of the install.
    pub fn files(&self) -> Vec<(String, u64)> {
        let m = self.manifest.lock().expect("lock");
        m.files.iter().map(|e| (e.path.clone(), e.size)).collect()
    }

    /// The expert catalog entry of `(layer, expert)`.
    pub fn expert_ranges(&self, layer: u32, expert: u32) -> Option<&[ExpertRange]> {
        self.experts.get(&ExpertKey { layer, expert }).map(Vec::as_slice)
    }

    /// Where `file` can be read now (its staged shard, or the published file once complete); the
    /// engine builds its tensor index over these paths.
    pub fn local_path(&self, file: &str) -> Option<PathBuf> {
        self.files.get(file).map(|slot| self.path_of(file, slot))
    }

    fn path_of(&self, file: &str, slot: &FileSlot) -> PathBuf {
        if *slot.published.lock().expect("lock") {
            self.dir.join(file)
        } else {
            slot.staged.as_ref().expect("staged").data_path().to_path_buf()
        }
    }

    fn fetch_as_leader(&self, staged: &StagedFile, range: Range<u64>) -> Result<()> {
        let received = AtomicU64::new(0);
        let ctx = FetchCtx {
            remote: &self.remote,
            pinned: &self.pinned,
            policy: self.policy,
            progress: None,
            received: &received,
        };
        let r = self.handle.block_on(fetch_range(&ctx, staged, range));
        self.fetches.fetch_add(1, Ordering::Relaxed);
        self.bytes
            .fetch_add(received.load(Ordering::Relaxed), Ordering::Relaxed);
        r
    }

    /// Verify and publish a shard whose every byte is present (once).
    fn complete_file(&self, file: &str, slot: &FileSlot) -> Result<()> {
        let mut published = slot.published.lock().expect("lock");
        if *published {
            return Ok(());
        }
        let staged = slot.staged.as_ref().expect("staged");
        let hashes = staged.finish(&self.dir.join(file)).inspect_err(|e| {
            *slot.failed.lock().expect("lock") = Some(e.to_string());
        })?;
        *published = true;
        self.published.fetch_add(1, Ordering::Relaxed);
        let mut m = self.manifest.lock().expect("lock");
        if let Some(e) = m.file_mut(file) {
            e.state = FileState::Published;
            e.sha256 = Some(hashes.sha256);
        }
        if m.files.iter().all(|f| f.state == FileState::Published) {
            m.mode = Mode::Full;
            m.complete = true;
            m.experts.clear();
        }
        m.save(&self.dir)
    }
}

impl ExpertSource for StreamStore {
    fn ensure_range(&self, file: &str, range: Range<u64>) -> Result<PathBuf> {
        let slot = self.files.get(file).ok_or_else(|| Error::InvalidArgument {
            what: "file",
            input: file.into(),
            reason: "not part of this install".into(),
        })?;
        if *slot.published.lock().expect("lock") {
            return Ok(self.dir.join(file));
        }
        if let Some(why) = slot.failed.lock().expect("lock").clone() {
            return Err(Error::RangeFailed {
                file: file.into(),
                start: range.start,
                end: range.end,
                reason: format!(
                    "the shard failed verification earlier ({why}); rerun `deltafin setup --stream` for this directory"
                ),
            });
        }
        let staged = slot.staged.clone().expect("staged");
        check_range(&staged, &range)?;
        let key = (file.to_string(), range.start, range.end);
        let (flight, leader) = {
            let mut inflight = self.inflight.lock().expect("lock");
            if staged.covers(&range) {
                return Ok(self.path_of(file, slot));
            }
            match inflight.get(&key) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = Arc::new(Inflight::default());
                    inflight.insert(key.clone(), f.clone());
                    (f, true)
                }
            }
        };
        if !leader {
            self.coalesced.fetch_add(1, Ordering::Relaxed);
            return flight
                .wait()
                .map(|()| self.path_of(file, slot))
                .map_err(|reason| Error::RangeFailed {
                    file: file.into(),
                    start: range.start,
                    end: range.end,
                    reason,
                });
        }
        let mut result = self.fetch_as_leader(&staged, range.clone());
        if result.is_ok() && staged.is_complete() {
            result = self.complete_file(file, slot);
        }
        self.inflight.lock().expect("lock").remove(&key);
        flight.finish(result.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        result.map(|()| self.path_of(file, slot))
    }

    fn ensure_expert(&self, layer: u32, expert: u32) -> Result<()> {
        let ranges = self.expert_ranges(layer, expert).map(<[ExpertRange]>::to_vec);
        let Some(ranges) = ranges else {
            // Not in the catalog: either the install is full, or there is no such expert.
            let full = self.manifest.lock().expect("lock").mode == Mode::Full;
            return if full {
                Ok(())
            } else {
                Err(Error::InvalidArgument {
                    what: "expert",
                    input: format!("layer {layer} expert {expert}"),
                    reason: "not in the stream catalog".into(),
                })
            };
        };
        for r in ranges {
            self.ensure_range(&r.file, r.start..r.end)?;
        }
        Ok(())
    }
}
