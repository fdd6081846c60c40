//! Writing one large new file sequentially at the disk's speed: the caller's bytes are gathered
//! into aligned buffers that a background thread writes while the caller produces the next
//! ones, with `O_DIRECT` where the filesystem allows it (no copy into the page cache and no
//! dirty-page writeback throttling, which held buffered writes to a fraction of the disk's
//! write speed), buffered writes otherwise.
//!
//! The last buffer is written padded to the alignment and the file is truncated to its true
//! length afterwards, so the file holds exactly the bytes written. Any write error is returned
//! by the next [`Write`] call or by [`StreamWriter::finish`].

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// Alignment of `O_DIRECT` buffers, file offsets and lengths.
const ALIGN: usize = 4096;

/// Buffers handed to the writer thread (one being written, the others being filled).
const BUFFERS: usize = 3;

/// A heap buffer with an [`ALIGN`]-aligned window of `len` bytes (safe: an over-allocated
/// `Vec` and an offset).
struct AlignedVec {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedVec {
    fn new(len: usize) -> Self {
        let raw = vec![0u8; len + ALIGN];
        let start = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
        AlignedVec { raw, start, len }
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// A full buffer and how many of its bytes are data.
struct Filled(AlignedVec, usize);

/// What the writer thread returns: bytes written (unpadded) and how many went through
/// `O_DIRECT`.
struct Written {
    bytes: u64,
    direct_bytes: u64,
}

/// Sequential writer of a new file (see the module docs).
pub struct StreamWriter {
    /// Taken by `finish`.
    file: Option<File>,
    cur: AlignedVec,
    filled: usize,
    work: Option<SyncSender<Filled>>,
    free: Receiver<AlignedVec>,
    thread: Option<JoinHandle<io::Result<Written>>>,
}

impl std::fmt::Debug for StreamWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamWriter({} buffered bytes)", self.filled)
    }
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> Option<File> {
    None
}

impl StreamWriter {
    /// Create (truncate) `path` and start the writer thread; `chunk` bytes per write (rounded
    /// up to the alignment).
    pub fn create(path: &Path, chunk: usize) -> io::Result<Self> {
        let file = File::create(path)?;
        let direct = open_direct(path);
        let chunk = chunk.max(1).div_ceil(ALIGN) * ALIGN;
        let (work_tx, work_rx) = sync_channel::<Filled>(BUFFERS);
        let (free_tx, free_rx) = sync_channel::<AlignedVec>(BUFFERS);
        for _ in 0..BUFFERS - 1 {
            free_tx
                .send(AlignedVec::new(chunk))
                .expect("capacity for every buffer");
        }
        let buffered = file.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("deltafin-writer".into())
            .spawn(move || write_loop(&buffered, direct, &work_rx, &free_tx))?;
        Ok(StreamWriter {
            file: Some(file),
            cur: AlignedVec::new(chunk),
            filled: 0,
            work: Some(work_tx),
            free: free_rx,
            thread: Some(thread),
        })
    }

    /// Hand the current buffer to the writer thread and take a free one.
    fn hand_off(&mut self) -> io::Result<()> {
        let next = match self.free.recv() {
            Ok(b) => b,
            Err(_) => return Err(self.failure()),
        };
        let full = std::mem::replace(&mut self.cur, next);
        let sent = self
            .work
            .as_ref()
            .expect("open until finish")
            .send(Filled(full, self.filled));
        self.filled = 0;
        if sent.is_err() {
            return Err(self.failure());
        }
        Ok(())
    }

    /// The writer thread's error (it stopped).
    fn failure(&mut self) -> io::Error {
        self.work = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Err(e))) => e,
            Some(Err(_)) => io::Error::other("the writer thread panicked"),
            _ => io::Error::other("the writer thread stopped"),
        }
    }

    /// Write what is left, wait for the writer, set the exact length and fsync. Returns the file
    /// and the bytes that went through `O_DIRECT`.
    pub fn finish(mut self) -> io::Result<(File, u64)> {
        if self.filled > 0 {
            self.hand_off()?;
        }
        self.work = None;
        let written = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r?,
            _ => return Err(io::Error::other("the writer thread panicked")),
        };
        let file = self.file.take().expect("taken only here");
        file.set_len(written.bytes)?;
        file.sync_all()?;
        Ok((file, written.direct_bytes))
    }
}

impl Write for StreamWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.filled == self.cur.len {
            self.hand_off()?;
        }
        let n = buf.len().min(self.cur.len - self.filled);
        let at = self.filled;
        self.cur.bytes()[at..at + n].copy_from_slice(&buf[..n]);
        self.filled += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(()) // bytes reach the file in `finish`
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        self.work = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The writer thread: write each buffer at the next offset, `O_DIRECT` while it works (the
/// last, partial buffer padded with zeros to the alignment), buffered otherwise.
fn write_loop(
    buffered: &File,
    mut direct: Option<File>,
    work: &Receiver<Filled>,
    free: &SyncSender<AlignedVec>,
) -> io::Result<Written> {
    let mut out = Written {
        bytes: 0,
        direct_bytes: 0,
    };
    while let Ok(Filled(mut buf, len)) = work.recv() {
        let padded = len.div_ceil(ALIGN) * ALIGN;
        let bytes = buf.bytes();
        bytes[len..padded].fill(0);
        let mut done = false;
        if let Some(d) = &direct {
            match d.write_all_at(&bytes[..padded], out.bytes) {
                Ok(()) => {
                    out.direct_bytes += len as u64;
                    done = true;
                }
                // Not supported for this file after all: the rest goes through the page cache.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => direct = None,
                Err(e) => return Err(e),
            }
        }
        if !done {
            buffered.write_all_at(&bytes[..len], out.bytes)?;
        }
        out.bytes += len as u64;
        let _ = free.send(buf); // the producer may be gone (finish); nothing to return then
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_exactly_the_bytes_given_in_any_piece_sizes() {
        let dir = tempfile::tempdir().unwrap();
        for total in [0usize, 1, 4095, 4096, 4097, 3 * 8192 + 17, 100_000] {
            let path = dir.path().join(format!("f{total}"));
            let data: Vec<u8> = (0..total).map(|i| (i * 7 + 3) as u8).collect();
            let mut w = StreamWriter::create(&path, 8192).unwrap();
            let mut at = 0;
            let mut piece = 1;
            while at < total {
                let n = piece.min(total - at);
                w.write_all(&data[at..at + n]).unwrap();
                at += n;
                piece = piece * 3 + 1;
            }
            let (_, direct) = w.finish().unwrap();
            assert!(direct <= total as u64);
            assert_eq!(std::fs::read(&path).unwrap(), data, "{total} bytes");
        }
    }
}
