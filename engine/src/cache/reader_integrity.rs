//! What makes a reader pool's bytes trustworthy: each shard's last failed read (a fault, kept
//! until the same range reads cleanly), the health check that examines every file and re-reads
//! faulted ranges, the per-tensor checksums every completed request is verified against (on the
//! reader thread, never the compute thread), the read-error counters, and test-only injected
//! I/O errors.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Check, Inner, ReadError, ReadResult, ReaderPool};
use crate::cache::buffer::AlignedBuf;
#[cfg(any(test, feature = "fault-injection"))]
use crate::cache::shard::Shard;
use crate::sync::lock;
use crate::weights::ShardSums;

impl ReaderPool {
    /// Whether every shard can give the checkpoint's bytes now. Each file is examined
    /// (its open file first; a whole one renamed over a damaged one is reopened) and each
    /// shard's last failed range is read again (and verified), on the calling thread; a range
    /// that reads cleanly clears its fault. The error is the first fault still there. A file
    /// found faulty here counts as one read error until it is whole again (however often it is
    /// examined). Cheap when nothing failed: one `fstat` per shard.
    pub fn health(&self) -> ReadResult {
        let inner = &self.inner;
        for (i, shard) in inner.files.iter().enumerate() {
            if let Err(fault) = shard.examine() {
                let error = ReadError::Changed {
                    path: shard.path.clone(),
                    reason: format!("the file {fault}"),
                };
                let mut faults = lock(&inner.faults);
                if faults[i].is_none() {
                    inner.errors[i].fetch_add(1, Ordering::Relaxed);
                    tracing::error!(error = %error, "weights unavailable");
                    faults[i] = Some(Fault {
                        offset: 0,
                        len: 0,
                        error: error.clone(),
                        tensor: None,
                    });
                }
                return Err(error);
            }
            let Some(fault) = lock(&inner.faults)[i].clone() else {
                continue;
            };
            if fault.len == 0 {
                lock(&inner.faults)[i] = None; // a file-level fault: the file is whole again
                continue;
            }
            let buf = AlignedBuf::new(fault.len).map_err(|_| fault.error.clone())?;
            // SAFETY: `buf` is this function's own, not shared with any reader.
            #[allow(unsafe_code)]
            let dst = unsafe { std::slice::from_raw_parts_mut(buf.write_ptr(), fault.len) };
            inner.fill(shard, dst, fault.offset, &AtomicBool::new(false))?;
            if let (Some(sums), Some(t)) = (inner.sums.get(), &fault.tensor) {
                let at = (t.start - fault.offset) as usize;
                let bytes = &buf.as_ref()[at..at + (t.end - t.start) as usize];
                sums.verify(i, t.start, bytes).map_err(|_| fault.error.clone())?;
            }
            let mut faults = lock(&inner.faults);
            if faults[i].as_ref().is_some_and(|f| f.offset == fault.offset) {
                faults[i] = None;
            }
        }
        Ok(())
    }

    /// Verify every request from now on against `sums` (set once; later calls are ignored).
    /// A mismatch fails the request with [`ReadError::Checksum`] naming the tensor.
    pub fn set_checksums(&self, sums: ShardSums) {
        let _ = self.inner.sums.set(sums);
    }

    /// Whether reads are verified against checksums, and how many tensors were so far.
    pub fn checksums(&self) -> Option<u64> {
        let inner = &self.inner;
        inner.sums.get().map(|_| inner.verified.load(Ordering::Relaxed))
    }

    /// Make every read touching `range` of shard `shard` fail with EIO until
    /// [`ReaderPool::clear_injected`] (fault-injection tests: a bad sector under an expert).
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn inject_eio(&self, shard: usize, range: std::ops::Range<u64>) {
        lock(&self.inner.injected).push((shard, range));
    }

    /// Remove every injected error.
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn clear_injected(&self) {
        lock(&self.inner.injected).clear();
    }

    /// Failed reads per shard file since the pool started (zero counts included).
    pub fn read_errors(&self) -> Vec<(PathBuf, u64)> {
        let inner = &self.inner;
        inner
            .files
            .iter()
            .zip(&inner.errors)
            .map(|(f, n)| (f.path.clone(), n.load(Ordering::Relaxed)))
            .collect()
    }
}

impl Inner {
    /// Check a completed request's bytes against the checksums (on the reader thread, so the
    /// compute thread never waits for it); a mismatch is recorded as its segment's fault.
    pub(super) fn verify(&self, check: &Check) -> ReadResult {
        let Some(sums) = self.sums.get() else {
            return Ok(());
        };
        let bytes = (*check.buf).as_ref();
        for (shard, range) in &check.scope {
            let Some(s) = check.segments.iter().find(|s| {
                s.shard == *shard && s.offset <= range.start && range.end <= s.offset + s.len as u64
            }) else {
                continue;
            };
            let at = s.dest + (range.start - s.offset) as usize;
            let checked = sums.verify(
                s.shard,
                range.start,
                &bytes[at..at + (range.end - range.start) as usize],
            );
            match checked {
                Ok(n) => {
                    self.verified.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(m) => {
                    let tensor = m.range.clone();
                    let e = ReadError::Checksum {
                        path: self.files[s.shard].path.clone(),
                        tensor: m.tensor,
                        expected: m.expected,
                        actual: m.actual,
                    };
                    let result = Err(e);
                    self.record(s.shard, s.offset, s.len, &result);
                    if let Some(f) = lock(&self.faults)[s.shard].as_mut() {
                        f.tensor = Some(tensor);
                    }
                    return result;
                }
            }
        }
        Ok(())
    }

    /// Whether an injected error covers part of `range` of `shard`.
    #[cfg(any(test, feature = "fault-injection"))]
    pub(super) fn injected(&self, shard: &Shard, range: std::ops::Range<u64>) -> bool {
        let Some(i) = self.files.iter().position(|f| std::ptr::eq(f, shard)) else {
            return false;
        };
        lock(&self.injected)
            .iter()
            .any(|(s, r)| *s == i && r.start < range.end && range.start < r.end)
    }

    /// Count a failed read and remember it as its shard's fault; a successful read of a
    /// shard's faulted range clears the fault.
    pub(super) fn record(&self, shard: usize, offset: u64, len: usize, result: &ReadResult) {
        let mut faults = lock(&self.faults);
        match result {
            Ok(()) => {
                if faults[shard]
                    .as_ref()
                    .is_some_and(|f| f.len > 0 && f.offset >= offset && f.offset < offset + len as u64)
                {
                    faults[shard] = None;
                }
            }
            Err(e) => {
                if let ReadError::Io { .. } = e {
                    // A replaced file is reopened for the next read; the error stays the OS's.
                    let _ = self.files[shard].examine();
                }
                self.errors[shard].fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "weight read failed");
                faults[shard] = Some(Fault {
                    offset,
                    len,
                    error: e.clone(),
                    tensor: None,
                });
            }
        }
    }
}

/// A shard's last failed read: its range (empty for a fault of the whole file) and, for a
/// checksum mismatch, the file range of the tensor that did not match.
#[derive(Debug, Clone)]
pub(super) struct Fault {
    pub(super) offset: u64,
    pub(super) len: usize,
    pub(super) error: ReadError,
    pub(super) tensor: Option<std::ops::Range<u64>>,
}
