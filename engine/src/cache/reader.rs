//! The reader pool: worker threads issuing aligned positional reads (`pread`) into
//! [`AlignedBuf`]s, many in flight (one per worker), from shard files opened with `O_DIRECT`
//! where the filesystem allows it and buffered otherwise.
//!
//! A request is a list of [`Segment`]s split into chunks of at most `chunk_bytes`; workers take
//! demand chunks before prefetch chunks, and each queue in submission order, so the workers
//! share the oldest request's chunks and requests complete one after another rather than all
//! together (see [`DEFAULT_CHUNK_BYTES`]). A request that no worker has started can be cancelled
//! (prefetch losers); a started one always finishes into its buffer, which the requester keeps
//! exclusive until the [`Ticket`] completes (see the invariant in [`super::buffer`]).
//!
//! Buffered reads first take what the page cache already holds without blocking (`preadv2` with
//! `RWF_NOWAIT`), so each completed request knows its [`Origin`]: entirely from the page cache,
//! or (partly) from storage. Direct reads are always storage.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Serialize;

use super::buffer::AlignedBuf;
use super::read_mode::{ReadDecision, ReadMode};
use super::shard::{Identity, Shard};
use super::spans::{Segment, SpanLayout};
use crate::error::{Error, Result};
use crate::sync::{lock, wait};
use crate::weights::ShardSums;
use integrity::Fault;

/// Queue class of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Needed now by a pass.
    Demand,
    /// Speculative (prefetch, pre-warm); may be cancelled.
    Prefetch,
}

/// Largest single read by default: 1 MiB, far below an expert (12 MiB in dsv3-bench), so the
/// workers read the oldest request together and it lands first. With whole-expert reads (16
/// MiB chunks), 8 workers read 8 experts at once, each at an eighth of the disk, so the first
/// of them landed only when all had, and the expert the pass needed next waited behind the
/// prefetches already started. Measured on dsv3-bench decode under 8, 4 and 2 GiB cgroup
/// limits (interleaved runs, O_DIRECT, 8 workers): 0.82-0.84 / 0.84 / 0.91 of the I/O bound at
/// the pool's own busy rate with 16 MiB chunks, 0.93 / 0.91 / 0.97 with 1 MiB; the disk's
/// busy rate the same (1.5-2.1 GiB/s in both, run to run), bytes read 1-2 % fewer, and 1k
/// prefill under 4 GiB unchanged.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;

/// Pool settings.
#[derive(Debug, Clone)]
pub struct ReaderConfig {
    pub mode: ReadMode,
    /// Worker threads = reads in flight.
    pub threads: usize,
    /// Largest single read ([`DEFAULT_CHUNK_BYTES`] by default).
    pub chunk_bytes: usize,
}

impl Default for ReaderConfig {
    fn default() -> Self {
        ReaderConfig {
            mode: ReadMode::Auto,
            threads: 8,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        }
    }
}

/// Counters of a pool (monotonic).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReadStats {
    pub requests: u64,
    pub reads: u64,
    pub bytes: u64,
    pub direct_bytes: u64,
    pub buffered_bytes: u64,
    /// Buffered bytes the page cache already held (read without blocking).
    pub page_cache_bytes: u64,
    pub cancelled: u64,
    /// Seconds during which at least one read was in flight.
    pub busy_seconds: f64,
}

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const CANCELLED: u8 = 2;

/// Where a completed request's bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Every byte was already in the kernel page cache (a buffered read that did not block).
    PageCache,
    /// At least one byte came from the storage device (or the kernel could not tell).
    Storage,
}

/// Why a read request did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Cancelled before a worker started it (the buffer is the requester's again).
    #[error("cancelled")]
    Cancelled,
    /// The storage read failed (the first failing chunk of the request).
    #[error("{}: read of {len} bytes at {offset}: {message}", path.display())]
    Io {
        path: std::path::PathBuf,
        offset: u64,
        len: usize,
        kind: std::io::ErrorKind,
        message: String,
    },
    /// The file did not give the checkpoint's bytes: it ended before them (a short read) or
    /// it changed since it was opened ([`super::shard`] names how).
    #[error("{}: read of {len} bytes at {offset}: {reason}", path.display())]
    Fault {
        path: std::path::PathBuf,
        offset: u64,
        len: usize,
        reason: String,
    },
    /// The file at a shard's path is not the checkpoint's any more (removed, truncated,
    /// resized); found by [`ReaderPool::health`] before any read failed.
    #[error("{}: {reason}", path.display())]
    Changed {
        path: std::path::PathBuf,
        reason: String,
    },
    /// A tensor read whole does not match the checksum recorded at install: the file changed
    /// or the disk returned other bytes (bit rot).
    #[error(
        "{}: tensor `{tensor}` does not match its recorded checksum (xxh3-64 {expected:016x}, read {actual:016x})",
        path.display()
    )]
    Checksum {
        path: std::path::PathBuf,
        tensor: String,
        expected: u64,
        actual: u64,
    },
}

impl ReadError {
    pub(crate) fn io(path: &Path, offset: u64, len: usize, e: &std::io::Error) -> Self {
        ReadError::Io {
            path: path.to_path_buf(),
            offset,
            len,
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

impl From<ReadError> for Error {
    /// Weights unavailable, naming the shard (the OS error's text kept).
    fn from(e: ReadError) -> Error {
        match e {
            ReadError::Io {
                path,
                offset,
                len,
                message,
                ..
            } => Error::WeightsUnavailable {
                path,
                reason: format!("read of {len} bytes at {offset} failed: {message}"),
            },
            ReadError::Fault {
                path,
                offset,
                len,
                reason,
            } => Error::WeightsUnavailable {
                path,
                reason: format!("read of {len} bytes at {offset}: {reason}"),
            },
            ReadError::Changed { path, reason } => Error::WeightsUnavailable { path, reason },
            ReadError::Checksum {
                path,
                tensor,
                expected,
                actual,
            } => Error::WeightsUnavailable {
                path,
                reason: format!(
                    "tensor `{tensor}` does not match its recorded checksum (xxh3-64 {expected:016x}, read {actual:016x}); nothing read was used"
                ),
            },
            ReadError::Cancelled => Error::io("read", std::io::Error::other("cancelled")),
        }
    }
}

/// The result of a read request.
pub type ReadResult = std::result::Result<(), ReadError>;

/// Called once when a request completes: its result and where its bytes came from.
pub type Callback = Box<dyn FnOnce(ReadResult, Origin) + Send>;

struct Job {
    state: AtomicU8,
    remaining: AtomicUsize,
    error: Mutex<Option<ReadError>>,
    done: Mutex<Option<ReadResult>>,
    cv: Condvar,
    on_done: Mutex<Option<Callback>>,
    /// Still true while every chunk read so far came from the page cache.
    cached: AtomicBool,
    /// With checksums: what to verify when the last chunk lands (taken then, or dropped on
    /// cancel, before the ticket completes).
    check: Mutex<Option<Check>>,
}

/// A request's bytes to verify: its destination, its segments, and the exact file ranges of
/// the tensors it was read for (a merged segment's gaps may hold other tensors, which are not
/// this request's to judge).
struct Check {
    buf: Arc<AlignedBuf>,
    segments: Vec<Segment>,
    scope: Vec<(usize, std::ops::Range<u64>)>,
}

impl Job {
    fn finish(&self, result: ReadResult, call: bool) {
        // The requester expects to hold the only reference to its buffer once this is done.
        drop(lock(&self.check).take());
        let callback = lock(&self.on_done).take();
        if call && let Some(f) = callback {
            let origin = if self.cached.load(Ordering::Acquire) {
                Origin::PageCache
            } else {
                Origin::Storage
            };
            f(result.clone(), origin);
        }
        *lock(&self.done) = Some(result);
        self.cv.notify_all();
    }
}

/// A submitted request.
#[derive(Clone)]
pub struct Ticket(Arc<Job>);

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ticket(state {})", self.0.state.load(Ordering::Relaxed))
    }
}

impl Ticket {
    /// Cancel if no worker has started it. On success the completion callback is dropped
    /// unrun and the buffer is the requester's again.
    pub fn cancel(&self) -> bool {
        let ok = self
            .0
            .state
            .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if ok {
            self.0.finish(Err(ReadError::Cancelled), false);
        }
        ok
    }

    /// Block until the request completed; the error names the file on failure.
    pub fn wait(&self) -> ReadResult {
        let mut done = lock(&self.0.done);
        loop {
            if let Some(r) = done.as_ref() {
                return r.clone();
            }
            done = wait(&self.0.cv, done);
        }
    }

    /// Whether the request has completed (successfully or not).
    pub fn is_done(&self) -> bool {
        lock(&self.0.done).is_some()
    }
}

struct Chunk {
    job: Arc<Job>,
    buf: Arc<AlignedBuf>,
    shard: usize,
    offset: u64,
    len: usize,
    dest: usize,
}

#[derive(Default)]
struct Queues {
    demand: VecDeque<Chunk>,
    prefetch: VecDeque<Chunk>,
    shutdown: bool,
}

struct Inner {
    files: Vec<Shard>,
    /// Per shard: the last failed read not yet known to be repaired (see [`ReaderPool::health`]).
    faults: Mutex<Vec<Option<Fault>>>,
    /// Failed reads per shard since start (`deltafin_weight_read_errors_total`).
    errors: Vec<AtomicU64>,
    mode: ReadMode,
    chunk: usize,
    queue: Mutex<Queues>,
    cv: Condvar,
    requests: AtomicU64,
    reads: AtomicU64,
    direct_bytes: AtomicU64,
    buffered_bytes: AtomicU64,
    page_cache_bytes: AtomicU64,
    cancelled: AtomicU64,
    busy: Mutex<(usize, Option<Instant>, f64)>,
    /// Per-tensor checksums every completed request is verified against, once set.
    sums: OnceLock<ShardSums>,
    /// Tensors verified against their checksums.
    verified: AtomicU64,
    /// Injected I/O errors: reads touching these file ranges fail with EIO (tests).
    #[cfg(any(test, feature = "fault-injection"))]
    injected: Mutex<Vec<(usize, std::ops::Range<u64>)>>,
}

/// The pool of reader threads over one checkpoint's shard files.
pub struct ReaderPool {
    inner: Arc<Inner>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ReaderPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ReaderPool({:?}, {} threads, {} files)",
            self.inner.mode,
            self.workers.len(),
            self.inner.files.len()
        )
    }
}

impl ReaderPool {
    /// Open every shard and start the workers.
    pub fn new(paths: &[PathBuf], config: &ReaderConfig) -> Result<Self> {
        let files = paths
            .iter()
            .map(|p| Shard::open(p, config.mode))
            .collect::<Result<Vec<_>>>()?;
        let inner = Arc::new(Inner {
            faults: Mutex::new(vec![None; files.len()]),
            errors: files.iter().map(|_| AtomicU64::new(0)).collect(),
            files,
            mode: config.mode,
            chunk: super::buffer::align_up(config.chunk_bytes.max(1) as u64) as usize,
            queue: Mutex::new(Queues::default()),
            cv: Condvar::new(),
            requests: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            direct_bytes: AtomicU64::new(0),
            buffered_bytes: AtomicU64::new(0),
            page_cache_bytes: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            busy: Mutex::new((0, None, 0.0)),
            sums: OnceLock::new(),
            verified: AtomicU64::new(0),
            #[cfg(any(test, feature = "fault-injection"))]
            injected: Mutex::new(Vec::new()),
        });
        let workers = (0..config.threads.max(1))
            .map(|i| {
                let inner = inner.clone();
                std::thread::Builder::new()
                    .name(format!("deltafin-read-{i}"))
                    .spawn(move || inner.work())
                    .map_err(|e| Error::io("reader thread", e))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ReaderPool { inner, workers })
    }

    /// The configured mode.
    pub fn mode(&self) -> ReadMode {
        self.inner.mode
    }

    /// Whether every shard could be opened with `O_DIRECT`.
    pub fn supports_direct(&self) -> bool {
        self.inner.files.iter().all(Shard::has_direct)
    }

    /// How this pool reads (for the plan).
    pub fn decision(&self) -> ReadDecision {
        let direct = self.inner.files.iter().filter(|f| f.has_direct()).count();
        ReadDecision::new(self.inner.mode, direct, self.inner.files.len())
    }

    /// Use (or stop using) `O_DIRECT` for every shard that supports it.
    pub fn set_direct(&self, on: bool) {
        for f in &self.inner.files {
            f.direct_ok.store(on && f.has_direct(), Ordering::Relaxed);
        }
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Whether `path` is the very file (device and inode) this pool reads shard `shard` from;
    /// false when either cannot be examined.
    pub fn same_file(&self, shard: usize, path: &std::path::Path) -> bool {
        let (Some(f), Ok(other)) = (self.inner.files.get(shard), std::fs::metadata(path)) else {
            return false;
        };
        f.handles().identity.same_file(&Identity::of(&other))
    }

    /// Whether reads of shard `shard` currently bypass the page cache.
    pub fn is_direct(&self, shard: usize) -> bool {
        self.inner.files[shard].direct_ok.load(Ordering::Relaxed)
    }

    /// Read `segments` into `buf`. `on_done` runs on a worker thread when the last chunk is
    /// read (not when the request is cancelled). The caller must not view the segments' buffer
    /// ranges until the ticket completes.
    pub fn submit(
        &self,
        buf: Arc<AlignedBuf>,
        segments: &[Segment],
        priority: Priority,
        on_done: Option<Callback>,
    ) -> Ticket {
        self.submit_scoped(buf, segments, None, priority, on_done)
    }

    /// [`ReaderPool::submit`] of a layout: with checksums, exactly the layout's tensors are
    /// verified (not other tensors inside its merged gaps).
    pub fn submit_layout(
        &self,
        buf: Arc<AlignedBuf>,
        layout: &SpanLayout,
        priority: Priority,
        on_done: Option<Callback>,
    ) -> Ticket {
        let scope = self.inner.sums.get().map(|_| layout.tensor_ranges());
        self.submit_scoped(buf, &layout.segments, scope, priority, on_done)
    }

    /// Read a layout synchronously (submit at demand priority and wait).
    pub fn read_layout_now(&self, buf: Arc<AlignedBuf>, layout: &SpanLayout) -> Result<()> {
        let t = self.submit_layout(buf, layout, Priority::Demand, None);
        Ok(t.wait()?)
    }

    fn submit_scoped(
        &self,
        buf: Arc<AlignedBuf>,
        segments: &[Segment],
        scope: Option<Vec<(usize, std::ops::Range<u64>)>>,
        priority: Priority,
        on_done: Option<Callback>,
    ) -> Ticket {
        let mut chunks = Vec::new();
        let job = Arc::new(Job {
            state: AtomicU8::new(QUEUED),
            remaining: AtomicUsize::new(0),
            error: Mutex::new(None),
            done: Mutex::new(None),
            cv: Condvar::new(),
            on_done: Mutex::new(on_done),
            cached: AtomicBool::new(true),
            check: Mutex::new(self.inner.sums.get().map(|_| Check {
                buf: buf.clone(),
                segments: segments.to_vec(),
                scope: scope.unwrap_or_else(|| {
                    segments
                        .iter()
                        .map(|s| (s.shard, s.offset..s.offset + s.len as u64))
                        .collect()
                }),
            })),
        });
        for s in segments {
            assert!(s.dest + s.len <= buf.len(), "segment beyond its buffer");
            let mut at = 0;
            while at < s.len {
                let len = self.inner.chunk.min(s.len - at);
                chunks.push(Chunk {
                    job: job.clone(),
                    buf: buf.clone(),
                    shard: s.shard,
                    offset: s.offset + at as u64,
                    len,
                    dest: s.dest + at,
                });
                at += len;
            }
        }
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        if chunks.is_empty() {
            job.state.store(STARTED, Ordering::Release);
            job.finish(Ok(()), true);
            return Ticket(job);
        }
        job.remaining.store(chunks.len(), Ordering::Release);
        let mut q = lock(&self.inner.queue);
        let target = if priority == Priority::Demand {
            &mut q.demand
        } else {
            &mut q.prefetch
        };
        target.extend(chunks);
        drop(q);
        self.inner.cv.notify_all();
        Ticket(job)
    }

    /// Move a still-queued prefetch request ahead of all other prefetches (it became demand).
    pub fn promote(&self, ticket: &Ticket) {
        let mut q = lock(&self.inner.queue);
        let (mine, rest): (VecDeque<Chunk>, VecDeque<Chunk>) = std::mem::take(&mut q.prefetch)
            .into_iter()
            .partition(|c| Arc::ptr_eq(&c.job, &ticket.0));
        q.prefetch = rest;
        q.demand.extend(mine);
    }

    /// Cancel a request and count it.
    pub fn cancel(&self, ticket: &Ticket) -> bool {
        let ok = ticket.cancel();
        if ok {
            self.inner.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Read synchronously (submit at demand priority and wait).
    pub fn read_now(&self, buf: Arc<AlignedBuf>, segments: &[Segment]) -> Result<()> {
        let t = self.submit(buf, segments, Priority::Demand, None);
        Ok(t.wait()?)
    }

    /// Counters so far.
    pub fn stats(&self) -> ReadStats {
        let i = &self.inner;
        let busy = lock(&i.busy);
        let live = busy.1.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let direct = i.direct_bytes.load(Ordering::Relaxed);
        let buffered = i.buffered_bytes.load(Ordering::Relaxed);
        ReadStats {
            requests: i.requests.load(Ordering::Relaxed),
            reads: i.reads.load(Ordering::Relaxed),
            bytes: direct + buffered,
            direct_bytes: direct,
            buffered_bytes: buffered,
            page_cache_bytes: i.page_cache_bytes.load(Ordering::Relaxed),
            cancelled: i.cancelled.load(Ordering::Relaxed),
            busy_seconds: busy.2 + live,
        }
    }
}

impl Drop for ReaderPool {
    fn drop(&mut self) {
        lock(&self.inner.queue).shutdown = true;
        self.inner.cv.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Inner {
    fn work(&self) {
        loop {
            let chunk = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(c) = q.demand.pop_front().or_else(|| q.prefetch.pop_front()) {
                        break c;
                    }
                    if q.shutdown {
                        return;
                    }
                    q = wait(&self.cv, q);
                }
            };
            match chunk
                .job
                .state
                .compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) | Err(STARTED) => {}
                Err(_) => continue, // cancelled: its owner already took the buffer back
            }
            self.busy_edge(true);
            let result = self.read_chunk(&chunk);
            self.busy_edge(false);
            let Chunk { job, buf, .. } = chunk;
            // Release the destination before the request can complete: once its ticket is done
            // the requester may reuse the buffer and expects to hold the only reference.
            drop(buf);
            if let Err(e) = result {
                lock(&job.error).get_or_insert(e);
            }
            if job.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                let error = lock(&job.error).take();
                let check = lock(&job.check).take();
                let result = match (error, check) {
                    (Some(e), _) => Err(e),
                    (None, Some(check)) => self.verify(&check),
                    (None, None) => Ok(()),
                };
                job.finish(result, true);
            }
        }
    }

    fn busy_edge(&self, start: bool) {
        let mut b = lock(&self.busy);
        if start {
            if b.0 == 0 {
                b.1 = Some(Instant::now());
            }
            b.0 += 1;
        } else {
            b.0 -= 1;
            if b.0 == 0
                && let Some(t) = b.1.take()
            {
                b.2 += t.elapsed().as_secs_f64();
            }
        }
    }

    fn read_chunk(&self, c: &Chunk) -> ReadResult {
        let shard = &self.files[c.shard];
        // SAFETY: the requester keeps `c.buf[c.dest..c.dest + c.len]` exclusive until the
        // ticket completes (module invariant of `buffer`), chunks of one request never overlap,
        // and `submit` checked the range lies inside the buffer.
        #[allow(unsafe_code)]
        let dst = unsafe { std::slice::from_raw_parts_mut(c.buf.write_ptr().add(c.dest), c.len) };
        let result = self.fill(shard, dst, c.offset, &c.job.cached);
        self.record(c.shard, c.offset, c.len, &result);
        result
    }

    /// Read `dst.len()` bytes of `shard` at `offset` and check that every byte up to the size
    /// the file had when opened arrived (a short read is an error naming what happened to the
    /// file, never a buffer used half-filled). Clears `cached` when a byte came from storage.
    fn fill(&self, shard: &Shard, dst: &mut [u8], offset: u64, cached: &AtomicBool) -> ReadResult {
        let (len, need) = (dst.len(), shard.required(offset, dst.len()));
        let handles = shard.handles();
        let io = |e: &std::io::Error| ReadError::io(&shard.path, offset, len, e);
        #[cfg(any(test, feature = "fault-injection"))]
        if self.injected(shard, offset..offset + len as u64) {
            return Err(io(&std::io::Error::from_raw_os_error(libc::EIO)));
        }
        let mut got = None;
        if shard.direct_ok.load(Ordering::Relaxed)
            && let Some(direct) = &handles.direct
        {
            match read_full(direct, dst, offset) {
                Ok(n) => {
                    cached.store(false, Ordering::Release);
                    self.reads.fetch_add(1, Ordering::Relaxed);
                    self.direct_bytes.fetch_add(len as u64, Ordering::Relaxed);
                    got = Some(n);
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && self.mode == ReadMode::Auto => {
                    shard.direct_ok.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(io(&e)),
            }
        }
        let got = match got {
            Some(n) => n,
            None => {
                let (n, from_cache) = read_cached(&handles.buffered, dst, offset).map_err(|e| io(&e))?;
                if from_cache < n {
                    cached.store(false, Ordering::Release);
                }
                if self.mode.drops_pages() {
                    drop_pages(&handles.buffered, offset, len);
                }
                self.reads.fetch_add(1, Ordering::Relaxed);
                self.buffered_bytes.fetch_add(len as u64, Ordering::Relaxed);
                self.page_cache_bytes
                    .fetch_add(from_cache as u64, Ordering::Relaxed);
                n
            }
        };
        if got >= need {
            return Ok(());
        }
        let why = match shard.examine() {
            Err(fault) => format!("; the file {fault}"),
            Ok(()) => String::new(),
        };
        Err(ReadError::Fault {
            path: shard.path.clone(),
            offset,
            len,
            reason: format!("short read: {got} of {need} bytes{why}"),
        })
    }
}

/// Ask the kernel to drop the page cache of `len` bytes at `offset` of `file` (`len == 0`: to
/// the end). Best effort: advice that fails changes nothing but memory use.
pub(crate) fn drop_pages(file: &File, offset: u64, len: usize) {
    use std::os::fd::AsRawFd;
    // SAFETY: advisory call on a descriptor owned by `file`; no memory is passed.
    #[allow(unsafe_code)]
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

/// Fill `dst` from `offset` through the page cache: first whatever it holds without blocking
/// (`preadv2(RWF_NOWAIT)`), then the rest with ordinary reads. Returns the bytes filled (fewer
/// than `dst.len()` only at end of file) and how many of them the page cache already held.
#[cfg(target_os = "linux")]
fn read_cached(file: &File, dst: &mut [u8], offset: u64) -> std::io::Result<(usize, usize)> {
    use std::os::fd::AsRawFd;
    let mut done = 0;
    while done < dst.len() {
        let rest = &mut dst[done..];
        let iov = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        let at = libc::off_t::try_from(offset + done as u64).map_err(std::io::Error::other)?;
        // SAFETY: `iov` describes `rest`, which is valid for writes of its length and borrowed
        // mutably for the call; the descriptor is open for as long as `file` lives.
        #[allow(unsafe_code)]
        let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) };
        match n {
            0 => return Ok((done, done)), // end of file: nothing more to read, nothing blocked
            n if n > 0 => done += n as usize,
            _ => {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    // Not cached (EAGAIN), or the kernel/filesystem cannot say: read normally.
                    Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => {
                        let rest = read_full(file, &mut dst[done..], offset + done as u64)?;
                        return Ok((done + rest, done));
                    }
                    _ => return Err(e),
                }
            }
        }
    }
    Ok((done, done))
}

/// Without `RWF_NOWAIT` the origin is unknown: every byte counts as storage.
#[cfg(not(target_os = "linux"))]
fn read_cached(file: &File, dst: &mut [u8], offset: u64) -> std::io::Result<(usize, usize)> {
    read_full(file, dst, offset).map(|n| (n, 0))
}

/// Fill `dst` from `offset`, stopping early only at end of file. Returns the bytes filled; the
/// caller decides how many it needed (aligned reads may extend past the last tensor).
fn read_full(file: &File, dst: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < dst.len() {
        match file.read_at(&mut dst[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[path = "reader_integrity.rs"]
mod integrity;

#[cfg(test)]
#[path = "reader_tests.rs"]
mod tests;
