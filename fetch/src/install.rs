//! `setup`: resolve the source, pin it, plan what is missing (resume from sidecars, stream-mode
//! experts left remote), check free space for what remains, download ranges in parallel, verify
//! and publish each file as it completes, and keep the manifest current. Re-running completes an
//! interrupted install without re-downloading present bytes, and `--full` completes a streamed one.
//!
//! Failure modes are typed errors: a source that moved away from the pinned revision, a directory
//! holding another model, too little space (checked before any payload byte is fetched), network
//! and HTTP failures after retries, and checksum mismatches (nothing published).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{TryStreamExt, stream};
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::download::{FetchCtx, fetch_range};
use crate::error::{Error, Result, human_bytes};
use crate::fsutil::{DirLock, free_space};
use crate::manifest::{FileEntry, FileState, MANIFEST_FORMAT, Manifest, Mode, STATE_DIR};
use crate::progress::{Phase, Progress, ProgressSink};
use crate::ranges::{RangeSet, plan_chunks};
use crate::retry::RetryPolicy;
use crate::safetensors::{ExpertRange, expert_ranges, header_len, parse_header};
use crate::source::{Listing, Remote, RemoteFile};
use crate::staged::StagedFile;
use crate::verify::verify_file;

/// Settings of one setup run.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    pub dir: PathBuf,
    pub mode: Mode,
    /// Parallel range requests.
    pub workers: usize,
    /// Largest range per request.
    pub chunk_size: u64,
    /// Free space to keep beyond what the download needs.
    pub headroom: u64,
    pub retry: RetryPolicy,
    /// Least time between two download progress events.
    pub progress_interval: Duration,
}

impl InstallOptions {
    /// Defaults for `dir` and `mode`: 8 workers, 64 MiB ranges, 1 GiB headroom.
    pub fn new(dir: impl Into<PathBuf>, mode: Mode) -> Self {
        InstallOptions {
            dir: dir.into(),
            mode,
            workers: 8,
            chunk_size: 64 << 20,
            headroom: 1 << 30,
            retry: RetryPolicy::default(),
            progress_interval: Duration::from_millis(500),
        }
    }
}

/// What a setup run did.
#[derive(Debug, Clone, Serialize)]
pub struct InstallReport {
    pub source: String,
    pub revision: String,
    pub pinned: String,
    /// Mode of the install after this run (`full` once every file is published).
    pub mode: Mode,
    pub complete: bool,
    pub files_total: usize,
    pub files_published: usize,
    /// Checkpoint size.
    pub bytes_total: u64,
    /// Bytes present locally after the run.
    pub bytes_local: u64,
    /// Bytes received over the network by this run.
    pub bytes_downloaded: u64,
    /// Wall time of the download phase (including verification overlapped with it).
    pub download_seconds: f64,
    /// Time spent hashing complete files.
    pub verify_seconds: f64,
}

/// A file and what this run must do with it.
#[derive(Debug)]
enum FilePlan {
    Published,
    Staged(Arc<StagedFile>),
}

/// Run a setup. Emits `resolve`, `download`, `verify`, then `done` or `error` events.
pub async fn install(
    remote: &Remote,
    opts: &InstallOptions,
    sink: &dyn ProgressSink,
) -> Result<InstallReport> {
    let progress = Progress::new(sink, opts.progress_interval);
    match install_inner(remote, opts, &progress).await {
        Ok(r) => {
            let msg = if r.complete {
                format!("{} {} installed ({:?})", r.source, r.pinned, r.mode)
            } else {
                "incomplete".into()
            };
            progress.emit(Phase::Done, &msg);
            Ok(r)
        }
        Err(e) => {
            progress.emit(Phase::Error, &e.to_string());
            Err(e)
        }
    }
}

async fn install_inner(
    remote: &Remote,
    opts: &InstallOptions,
    progress: &Progress<'_>,
) -> Result<InstallReport> {
    let dir = opts.dir.as_path();
    progress.emit(Phase::Resolve, &format!("resolving {}", remote.id()));
    let listing = remote.resolve().await?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let state_dir = dir.join(STATE_DIR);
    let _lock = DirLock::acquire(dir, &state_dir)?;
    let prior = Manifest::load(dir)?;
    check_prior(prior.as_ref(), &listing, dir)?;
    let mut plans = Vec::with_capacity(listing.files.len());
    for f in &listing.files {
        plans.push(plan_file(dir, &state_dir, f, &listing.pinned, prior.as_ref())?);
    }
    let received = AtomicU64::new(0);
    let ctx = FetchCtx {
        remote,
        pinned: &listing.pinned,
        policy: opts.retry,
        progress: None,
        received: &received,
    };
    let experts = match (opts.mode, prior.as_ref()) {
        (Mode::Stream, _) => stream_catalog(&ctx, &plans).await?,
        (Mode::Full, Some(p)) => p.experts.clone(),
        (Mode::Full, None) => Vec::new(),
    };
    let mut fresh = new_manifest(&listing, opts.mode, &plans, experts);
    fresh.endpoint = remote.endpoint();
    let manifest = Mutex::new(fresh);
    manifest.lock().expect("lock").save(dir)?;
    let todo = wanted_ranges(&plans, &manifest.lock().expect("lock").experts, opts.mode);
    check_space(dir, &todo, opts.headroom)?;
    init_progress(progress, &listing, &plans, &todo);
    progress.emit(
        Phase::Download,
        &format!(
            "{} to download",
            human_bytes(todo.iter().map(|(_, r)| r.len()).sum())
        ),
    );
    let started = Instant::now();
    let verify_nanos = AtomicU64::new(0);
    let run = Run {
        dir,
        opts,
        progress,
        manifest: &manifest,
        verify_nanos: &verify_nanos,
    };
    let ctx = FetchCtx {
        progress: Some(progress),
        ..ctx
    };
    run.download_all(&ctx, todo).await?;
    let download_seconds = started.elapsed().as_secs_f64();
    recheck_pin(remote, &listing).await?;
    let mut m = manifest.into_inner().expect("lock");
    finalize_manifest(&mut m, &plans, opts.mode);
    m.save(dir)?;
    Ok(report(
        &m,
        &plans,
        received.load(Ordering::Relaxed),
        download_seconds,
        verify_nanos.load(Ordering::Relaxed),
    ))
}

/// The directory must hold nothing, or this source at the same pinned revision.
fn check_prior(prior: Option<&Manifest>, listing: &Listing, dir: &Path) -> Result<()> {
    let Some(p) = prior else { return Ok(()) };
    if p.source != listing.source_id {
        return Err(Error::OtherInstall {
            dir: dir.into(),
            existing: p.source.clone(),
            requested: listing.source_id.clone(),
        });
    }
    if p.pinned != listing.pinned {
        return Err(Error::RevisionMoved {
            source_id: listing.source_id.clone(),
            revision: listing.revision.clone(),
            was: p.pinned.clone(),
            now: listing.pinned.clone(),
        });
    }
    Ok(())
}

/// Published (verified earlier, or an existing file that verifies now) or staged.
fn plan_file(
    dir: &Path,
    state_dir: &Path,
    f: &RemoteFile,
    pinned: &str,
    prior: Option<&Manifest>,
) -> Result<FilePlan> {
    let dest = dir.join(&f.path);
    if let Ok(meta) = std::fs::metadata(&dest) {
        let known = prior
            .and_then(|m| m.file(&f.path))
            .is_some_and(|e| e.state == FileState::Published && e.expected == f.expected && e.size == f.size);
        if known && meta.len() == f.size {
            return Ok(FilePlan::Published);
        }
        // A file we did not publish: adopt it only if it verifies.
        verify_file(&dest, &f.path, f.size, &f.expected).map_err(|e| match e {
            Error::ChecksumMismatch {
                path,
                algo,
                expected,
                actual,
            } => Error::ChecksumMismatch {
                path: format!(
                    "{path} (already in {} but not from this source; remove it)",
                    dir.display()
                ),
                algo,
                expected,
                actual,
            },
            e => e,
        })?;
        return Ok(FilePlan::Published);
    }
    Ok(FilePlan::Staged(Arc::new(StagedFile::open(
        state_dir, f, pinned,
    )?)))
}

/// Stream mode: fetch every staged safetensors header and list its routed-expert ranges.
async fn stream_catalog(ctx: &FetchCtx<'_>, plans: &[FilePlan]) -> Result<Vec<ExpertRange>> {
    let mut out = Vec::new();
    for p in plans {
        let FilePlan::Staged(s) = p else { continue };
        if !s.remote.path.ends_with(".safetensors") || s.remote.size < 8 {
            continue;
        }
        let size = s.remote.size;
        if !s.covers(&(0..8)) {
            fetch_range(ctx, s, 0..8).await?;
        }
        let mut first = [0u8; 8];
        s.read_at(0, &mut first)?;
        let bad = |reason: String| Error::Format {
            path: s.remote.path.clone(),
            reason,
        };
        let hlen = header_len(&first, size).map_err(bad)?;
        let hdr = 8..8 + hlen;
        if !s.covers(&hdr) {
            fetch_range(ctx, s, hdr.clone()).await?;
        }
        let mut json = vec![0u8; hlen as usize];
        s.read_at(8, &mut json)?;
        let tensors = parse_header(&json, size).map_err(bad)?;
        out.extend(expert_ranges(&s.remote.path, &tensors));
    }
    Ok(out)
}

/// Per staged file, the ranges this run must fetch.
fn wanted_ranges(
    plans: &[FilePlan],
    experts: &[ExpertRange],
    mode: Mode,
) -> Vec<(Arc<StagedFile>, RangeSet)> {
    let mut out = Vec::new();
    for p in plans {
        let FilePlan::Staged(s) = p else { continue };
        out.push((
            s.clone(),
            to_fetch(&s.remote.path, s.remote.size, experts, mode, &s.present()),
        ));
    }
    out
}

/// What to fetch of one file (pure): all of it in full mode, everything but its routed experts in
/// stream mode, minus what is already present.
fn to_fetch(path: &str, size: u64, experts: &[ExpertRange], mode: Mode, present: &RangeSet) -> RangeSet {
    let mut want = RangeSet::from_range(0..size);
    if mode == Mode::Stream {
        want = want.minus(&RangeSet::from_ranges(
            experts.iter().filter(|e| e.file == path).map(|e| e.start..e.end),
        ));
    }
    want.minus(present)
}

fn check_space(dir: &Path, todo: &[(Arc<StagedFile>, RangeSet)], headroom: u64) -> Result<()> {
    let need: u64 = todo.iter().map(|(_, r)| r.len()).sum();
    let free = free_space(dir)?;
    if free < need.saturating_add(headroom) {
        return Err(Error::InsufficientSpace {
            dir: dir.into(),
            need,
            need_h: human_bytes(need),
            headroom_h: human_bytes(headroom),
            free,
            free_h: human_bytes(free),
        });
    }
    Ok(())
}

fn init_progress(
    progress: &Progress<'_>,
    listing: &Listing,
    plans: &[FilePlan],
    todo: &[(Arc<StagedFile>, RangeSet)],
) {
    let remaining: u64 = todo.iter().map(|(_, r)| r.len()).sum();
    let mut total = 0;
    let mut done_files = 0;
    for p in plans {
        match p {
            FilePlan::Published => done_files += 1,
            FilePlan::Staged(_) => {}
        }
    }
    for (s, r) in todo {
        total += s.present().len() + r.len();
    }
    total += plans
        .iter()
        .zip(&listing.files)
        .filter(|(p, _)| matches!(p, FilePlan::Published))
        .map(|(_, f)| f.size)
        .sum::<u64>();
    progress.set(total - remaining, total, done_files, listing.files.len() as u64);
}

fn new_manifest(listing: &Listing, mode: Mode, plans: &[FilePlan], experts: Vec<ExpertRange>) -> Manifest {
    let files = listing
        .files
        .iter()
        .zip(plans)
        .map(|(f, p)| FileEntry {
            path: f.path.clone(),
            size: f.size,
            expected: f.expected.clone(),
            locator: f.locator.clone(),
            state: match p {
                FilePlan::Published => FileState::Published,
                FilePlan::Staged(s) if s.present().is_empty() => FileState::Missing,
                FilePlan::Staged(_) => FileState::Staged,
            },
            sha256: f.expected.sha256().map(str::to_string),
        })
        .collect();
    Manifest {
        format: MANIFEST_FORMAT,
        source: listing.source_id.clone(),
        revision: listing.revision.clone(),
        endpoint: None,
        pinned: listing.pinned.clone(),
        mode,
        complete: false,
        files,
        experts,
    }
}

/// Shared state of the download phase.
struct Run<'a> {
    dir: &'a Path,
    opts: &'a InstallOptions,
    progress: &'a Progress<'a>,
    manifest: &'a Mutex<Manifest>,
    verify_nanos: &'a AtomicU64,
}

impl Run<'_> {
    async fn download_all(&self, ctx: &FetchCtx<'_>, todo: Vec<(Arc<StagedFile>, RangeSet)>) -> Result<()> {
        let workers = self.opts.workers.max(1);
        let sem = Semaphore::new(workers);
        stream::iter(todo.into_iter().map(Ok))
            .try_for_each_concurrent(workers, |(staged, ranges)| {
                let sem = &sem;
                async move {
                    let chunks = plan_chunks(&ranges, self.opts.chunk_size);
                    stream::iter(chunks.into_iter().map(Ok))
                        .try_for_each_concurrent(workers, |c| {
                            let staged = &staged;
                            async move {
                                let _permit = sem.acquire().await.expect("semaphore");
                                fetch_range(ctx, staged, c).await
                            }
                        })
                        .await?;
                    self.file_fetched(&staged).await
                }
            })
            .await
    }

    /// After a file's ranges arrived: publish it when complete, record its state either way.
    async fn file_fetched(&self, staged: &Arc<StagedFile>) -> Result<()> {
        let path = staged.remote.path.clone();
        if !staged.is_complete() {
            self.set_state(&path, FileState::Staged, None)?;
            self.progress.file_done();
            return Ok(());
        }
        self.progress.emit(Phase::Verify, &format!("verifying {path}"));
        let dest = self.dir.join(&path);
        let s = staged.clone();
        let t = Instant::now();
        let hashes = tokio::task::spawn_blocking(move || s.finish(&dest))
            .await
            .expect("verify task")?;
        self.verify_nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.set_state(&path, FileState::Published, Some(hashes.sha256))?;
        self.progress.file_done();
        Ok(())
    }

    fn set_state(&self, path: &str, state: FileState, sha256: Option<String>) -> Result<()> {
        let mut m = self.manifest.lock().expect("lock");
        if let Some(e) = m.file_mut(path) {
            e.state = state;
            if sha256.is_some() {
                e.sha256 = sha256;
            }
        }
        m.save(self.dir)
    }
}

/// The revision must still resolve to the pinned commit/digest (unless it *is* that pin).
async fn recheck_pin(remote: &Remote, listing: &Listing) -> Result<()> {
    if listing.revision == listing.pinned {
        return Ok(());
    }
    let now = remote.resolve().await?;
    if now.pinned != listing.pinned {
        return Err(Error::RevisionMoved {
            source_id: listing.source_id.clone(),
            revision: listing.revision.clone(),
            was: listing.pinned.clone(),
            now: now.pinned,
        });
    }
    Ok(())
}

fn finalize_manifest(m: &mut Manifest, plans: &[FilePlan], requested: Mode) {
    let all_published = plans.iter().all(|p| match p {
        FilePlan::Published => true,
        FilePlan::Staged(s) => !s.data_path().exists(),
    });
    for (e, p) in m.files.iter_mut().zip(plans) {
        if let FilePlan::Staged(s) = p
            && s.data_path().exists()
        {
            e.state = if s.present().is_empty() {
                FileState::Missing
            } else {
                FileState::Staged
            };
        }
    }
    m.mode = if all_published { Mode::Full } else { requested };
    if all_published {
        m.experts.clear();
    }
    m.complete = all_published || requested == Mode::Stream;
}

fn report(
    m: &Manifest,
    plans: &[FilePlan],
    downloaded: u64,
    download_seconds: f64,
    verify_nanos: u64,
) -> InstallReport {
    let local: u64 = m
        .files
        .iter()
        .zip(plans)
        .map(|(e, p)| match (e.state, p) {
            (FileState::Published, _) => e.size,
            (_, FilePlan::Staged(s)) => s.present().len(),
            _ => 0,
        })
        .sum();
    InstallReport {
        source: m.source.clone(),
        revision: m.revision.clone(),
        pinned: m.pinned.clone(),
        mode: m.mode,
        complete: m.complete,
        files_total: m.files.len(),
        files_published: m.files.iter().filter(|f| f.state == FileState::Published).count(),
        bytes_total: m.total_bytes(),
        bytes_local: local,
        bytes_downloaded: downloaded,
        download_seconds,
        verify_seconds: verify_nanos as f64 / 1e9,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(pinned: &str) -> Listing {
        Listing {
            source_id: "hf://o/r".into(),
            revision: "main".into(),
            pinned: pinned.into(),
            files: Vec::new(),
        }
    }

    fn manifest(source: &str, pinned: &str) -> Manifest {
        let mut m = new_manifest(&listing(pinned), Mode::Full, &[], Vec::new());
        m.source = source.into();
        m
    }

    #[test]
    fn prior_install_must_match_source_and_pin() {
        let dir = Path::new("/d");
        assert!(check_prior(None, &listing("a"), dir).is_ok());
        assert!(check_prior(Some(&manifest("hf://o/r", "a")), &listing("a"), dir).is_ok());
        let e = check_prior(Some(&manifest("hf://o/r", "a")), &listing("b"), dir).unwrap_err();
        assert!(
            matches!(e, Error::RevisionMoved { ref was, ref now, .. } if was == "a" && now == "b"),
            "{e}"
        );
        let e = check_prior(Some(&manifest("hf://x/y", "a")), &listing("a"), dir).unwrap_err();
        assert!(matches!(e, Error::OtherInstall { .. }), "{e}");
    }

    #[test]
    fn fetch_plan_skips_experts_in_stream_mode_and_present_bytes_always() {
        let ex = |file: &str, start, end| ExpertRange {
            layer: 1,
            expert: 0,
            file: file.into(),
            start,
            end,
        };
        let experts = vec![ex("a", 10, 20), ex("a", 30, 40), ex("b", 0, 5)];
        let present = RangeSet::from_range(0..5);
        let v = |s: RangeSet| s.iter().collect::<Vec<_>>();
        assert_eq!(
            v(to_fetch("a", 50, &experts, Mode::Stream, &present)),
            vec![5..10, 20..30, 40..50]
        );
        assert_eq!(v(to_fetch("a", 50, &experts, Mode::Full, &present)), vec![5..50]);
        assert_eq!(
            v(to_fetch("c", 8, &experts, Mode::Stream, &RangeSet::new())),
            vec![0..8]
        );
    }
}
