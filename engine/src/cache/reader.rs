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
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Serialize;

use super::buffer::AlignedBuf;
use super::read_mode::{ReadDecision, ReadMode};
use super::spans::Segment;
use crate::error::{Error, Result};

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
    /// An I/O error naming the shard, keeping the OS error's kind.
    fn from(e: ReadError) -> Error {
        match e {
            ReadError::Io {
                path,
                offset,
                len,
                kind,
                message,
            } => Error::io(
                path,
                std::io::Error::new(kind, format!("read of {len} bytes at {offset}: {message}")),
            ),
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
}

impl Job {
    fn finish(&self, result: ReadResult, call: bool) {
        let callback = self.on_done.lock().unwrap().take();
        if call && let Some(f) = callback {
            let origin = if self.cached.load(Ordering::Acquire) {
                Origin::PageCache
            } else {
                Origin::Storage
            };
            f(result.clone(), origin);
        }
        *self.done.lock().unwrap() = Some(result);
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
        let mut done = self.0.done.lock().unwrap();
        loop {
            if let Some(r) = done.as_ref() {
                return r.clone();
            }
            done = self.0.cv.wait(done).unwrap();
        }
    }

    /// Whether the request has completed (successfully or not).
    pub fn is_done(&self) -> bool {
        self.0.done.lock().unwrap().is_some()
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

struct ShardFile {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    direct_ok: AtomicBool,
}

#[derive(Default)]
struct Queues {
    demand: VecDeque<Chunk>,
    prefetch: VecDeque<Chunk>,
    shutdown: bool,
}

struct Inner {
    files: Vec<ShardFile>,
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

#[cfg(target_os = "linux")]
fn open_direct(path: &std::path::Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &std::path::Path) -> std::io::Result<File> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "O_DIRECT is Linux-only",
    ))
}

impl ReaderPool {
    /// Open every shard and start the workers.
    pub fn new(paths: &[PathBuf], config: &ReaderConfig) -> Result<Self> {
        let mut files = Vec::new();
        for path in paths {
            let buffered = File::open(path).map_err(|e| Error::io(path, e))?;
            let direct = match config.mode {
                ReadMode::Buffered => None,
                ReadMode::Direct => Some(open_direct(path).map_err(|e| Error::io(path, e))?),
                ReadMode::Auto => open_direct(path).ok(),
            };
            let direct_ok = AtomicBool::new(direct.is_some());
            files.push(ShardFile {
                path: path.clone(),
                buffered,
                direct,
                direct_ok,
            });
        }
        let inner = Arc::new(Inner {
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
        self.inner.files.iter().all(|f| f.direct.is_some())
    }

    /// How this pool reads (for the plan).
    pub fn decision(&self) -> ReadDecision {
        let direct = self.inner.files.iter().filter(|f| f.direct.is_some()).count();
        ReadDecision::new(self.inner.mode, direct, self.inner.files.len())
    }

    /// Use (or stop using) `O_DIRECT` for every shard that supports it.
    pub fn set_direct(&self, on: bool) {
        for f in &self.inner.files {
            f.direct_ok.store(on && f.direct.is_some(), Ordering::Relaxed);
        }
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Whether `path` is the very file (device and inode) this pool reads shard `shard` from;
    /// false when either cannot be examined.
    pub fn same_file(&self, shard: usize, path: &std::path::Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let (Some(f), Ok(other)) = (self.inner.files.get(shard), std::fs::metadata(path)) else {
            return false;
        };
        f.buffered
            .metadata()
            .is_ok_and(|m| (m.dev(), m.ino()) == (other.dev(), other.ino()))
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
        let mut chunks = Vec::new();
        let job = Arc::new(Job {
            state: AtomicU8::new(QUEUED),
            remaining: AtomicUsize::new(0),
            error: Mutex::new(None),
            done: Mutex::new(None),
            cv: Condvar::new(),
            on_done: Mutex::new(on_done),
            cached: AtomicBool::new(true),
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
        let mut q = self.inner.queue.lock().unwrap();
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
        let mut q = self.inner.queue.lock().unwrap();
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
        let busy = i.busy.lock().unwrap();
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
        self.inner.queue.lock().unwrap().shutdown = true;
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
                let mut q = self.queue.lock().unwrap();
                loop {
                    if let Some(c) = q.demand.pop_front().or_else(|| q.prefetch.pop_front()) {
                        break c;
                    }
                    if q.shutdown {
                        return;
                    }
                    q = self.cv.wait(q).unwrap();
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
                job.error.lock().unwrap().get_or_insert(e);
            }
            if job.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                let error = job.error.lock().unwrap().take();
                job.finish(error.map_or(Ok(()), Err), true);
            }
        }
    }

    fn busy_edge(&self, start: bool) {
        let mut b = self.busy.lock().unwrap();
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
        let file = &self.files[c.shard];
        // SAFETY: the requester keeps `c.buf[c.dest..c.dest + c.len]` exclusive until the
        // ticket completes (module invariant of `buffer`), chunks of one request never overlap,
        // and `submit` checked the range lies inside the buffer.
        #[allow(unsafe_code)]
        let dst = unsafe { std::slice::from_raw_parts_mut(c.buf.write_ptr().add(c.dest), c.len) };
        if file.direct_ok.load(Ordering::Relaxed)
            && let Some(direct) = &file.direct
        {
            match read_full(direct, dst, c.offset) {
                Ok(()) => {
                    c.job.cached.store(false, Ordering::Release);
                    self.reads.fetch_add(1, Ordering::Relaxed);
                    self.direct_bytes.fetch_add(c.len as u64, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && self.mode == ReadMode::Auto => {
                    file.direct_ok.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(ReadError::io(&file.path, c.offset, c.len, &e)),
            }
        }
        let cached = read_cached(&file.buffered, dst, c.offset)
            .map_err(|e| ReadError::io(&file.path, c.offset, c.len, &e))?;
        if cached < c.len {
            c.job.cached.store(false, Ordering::Release);
        }
        if self.mode.drops_pages() {
            drop_pages(&file.buffered, c.offset, c.len);
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.buffered_bytes.fetch_add(c.len as u64, Ordering::Relaxed);
        self.page_cache_bytes.fetch_add(cached as u64, Ordering::Relaxed);
        Ok(())
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
/// (`preadv2(RWF_NOWAIT)`), then the rest with ordinary reads. Returns how many bytes the page
/// cache already held (all of `dst` when the read ends at end of file without blocking).
#[cfg(target_os = "linux")]
fn read_cached(file: &File, dst: &mut [u8], offset: u64) -> std::io::Result<usize> {
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
            0 => return Ok(dst.len()), // end of file: nothing more to read, nothing blocked
            n if n > 0 => done += n as usize,
            _ => {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    // Not cached (EAGAIN), or the kernel/filesystem cannot say: read normally.
                    Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => {
                        read_full(file, &mut dst[done..], offset + done as u64)?;
                        return Ok(done);
                    }
                    _ => return Err(e),
                }
            }
        }
    }
    Ok(done)
}

/// Without `RWF_NOWAIT` the origin is unknown: every byte counts as storage.
#[cfg(not(target_os = "linux"))]
fn read_cached(file: &File, dst: &mut [u8], offset: u64) -> std::io::Result<usize> {
    read_full(file, dst, offset).map(|()| 0)
}

/// Fill `dst` from `offset`, stopping early only at end of file (aligned reads may extend past
/// the last tensor; those bytes are never used).
fn read_full(file: &File, dst: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        match file.read_at(&mut dst[done..], offset + done as u64) {
            Ok(0) => return Ok(()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    #[test]
    fn reads_segments_in_chunks_in_every_mode() {
        let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (_d, path) = file_with(&data);
        for mode in [ReadMode::Auto, ReadMode::Buffered] {
            let pool = ReaderPool::new(
                std::slice::from_ref(&path),
                &ReaderConfig {
                    mode,
                    threads: 3,
                    chunk_bytes: 4096,
                },
            )
            .unwrap();
            let buf = Arc::new(AlignedBuf::new(3 * 4096 + 40_960).unwrap());
            let segs = [
                Segment {
                    shard: 0,
                    offset: 8192,
                    len: 12288,
                    dest: 0,
                },
                Segment {
                    shard: 0,
                    offset: 0,
                    len: 40960,
                    dest: 12288,
                },
            ];
            pool.read_now(buf.clone(), &segs).unwrap();
            let b = (*buf).as_ref();
            assert_eq!(&b[..12288], &data[8192..20480]);
            assert_eq!(&b[12288..12288 + 40_000], &data[..]);
            let s = pool.stats();
            assert_eq!(s.reads, 3 + 10);
            assert!(s.bytes >= 12288 + 40_000);
        }
    }

    #[test]
    fn queued_requests_can_be_cancelled_and_callbacks_run_once() {
        let (_d, path) = file_with(&vec![1u8; 1 << 20]);
        let pool = ReaderPool::new(
            &[path],
            &ReaderConfig {
                mode: ReadMode::Buffered,
                threads: 1,
                chunk_bytes: 4096,
            },
        )
        .unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let mut tickets = Vec::new();
        for _ in 0..64 {
            let buf = Arc::new(AlignedBuf::new(1 << 20).unwrap());
            let c = calls.clone();
            let cb: Callback = Box::new(move |r, _| {
                assert!(r.is_ok());
                c.fetch_add(1, Ordering::SeqCst);
            });
            tickets.push(pool.submit(
                buf,
                &[Segment {
                    shard: 0,
                    offset: 0,
                    len: 1 << 20,
                    dest: 0,
                }],
                Priority::Prefetch,
                Some(cb),
            ));
        }
        let cancelled = tickets.iter().filter(|t| pool.cancel(t)).count();
        assert!(cancelled > 0, "one worker cannot have started all 64 requests");
        for t in &tickets {
            let r = t.wait();
            assert!(r.is_ok() || r == Err(ReadError::Cancelled));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 64 - cancelled);
        assert_eq!(pool.stats().cancelled, cancelled as u64);
    }

    /// Pages of `path` in the page cache (`mincore` over a map of the file).
    fn resident_pages(path: &Path) -> usize {
        let file = File::open(path).unwrap();
        let len = file.metadata().unwrap().len() as usize;
        // SAFETY: the test's own file, not modified while mapped.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let page = 4096;
        let mut vec = vec![0u8; len.div_ceil(page)];
        // SAFETY: `map` covers `len` bytes and stays alive for the call; `vec` holds one byte
        // per page of that range.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    fn evict(path: &Path) {
        let f = File::open(path).unwrap();
        f.sync_all().unwrap();
        drop_pages(&f, 0, 0);
    }

    #[test]
    fn auto_mode_buffered_reads_leave_nothing_in_the_page_cache() {
        let len = 1 << 20;
        // Beside the test binary, on the build's disk (not a tmpfs /tmp, whose pages are the
        // file itself and cannot be dropped).
        let exe = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir_in(exe.parent().unwrap()).unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, vec![7u8; len]).unwrap();
        let whole = [Segment {
            shard: 0,
            offset: 0,
            len,
            dest: 0,
        }];
        let read = |mode| {
            evict(&path);
            let pool = ReaderPool::new(
                std::slice::from_ref(&path),
                &ReaderConfig {
                    mode,
                    threads: 2,
                    chunk_bytes: 64 << 10,
                },
            )
            .unwrap();
            // Buffered reads even where the filesystem allows O_DIRECT (as where it does not).
            pool.set_direct(false);
            pool.read_now(Arc::new(AlignedBuf::new(len).unwrap()), &whole)
                .unwrap();
            (resident_pages(&path), pool.decision())
        };
        let (kept, decision) = read(ReadMode::Buffered);
        assert!(kept >= len / 4096 / 2, "buffered reads keep their pages: {kept}");
        assert!(!decision.drop_pages);
        let (left, decision) = read(ReadMode::Auto);
        assert!(decision.drop_pages);
        assert!(
            left < len / 4096 / 8,
            "auto left {left} of {} pages cached",
            len / 4096
        );
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let err = ReaderPool::new(
            &[PathBuf::from("/nonexistent/x.safetensors")],
            &ReaderConfig::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/x.safetensors"));
    }
}
