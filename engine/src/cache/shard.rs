//! The shard files a [`super::ReaderPool`] reads, and what makes a read of them trustworthy.
//!
//! Each shard is opened once and its identity recorded (device, inode, size, modification
//! time). The size at open is the length every later read is checked against: a read that ends
//! before `min(offset + len, size)` is a *short read*, an error, never zeros or stale bytes used
//! as weights. When a read fails, or when [`Shard::examine`] is asked, the open file itself is
//! examined (`fstat`): while it keeps its size it is read as before, wherever its name now is (a
//! stream install publishes a staged shard by `rename`; a shard deleted while open is still the
//! bytes that were loaded). When it has shrunk or grown (truncated in place by a failing disk, a
//! half-finished copy, a second `setup`), the path is examined: a whole file of the recorded size
//! there (a restore by `rename`) is opened in its place, so a server recovers when its weights
//! are whole again; a file restored in place needs no reopen. (A same-size file with other
//! contents is what the install's checksums catch.)

use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::read_mode::ReadMode;
use crate::error::{Error, Result};
use crate::sync::{read, write};

/// What identifies an open file: which file it is (device, inode) and how long it is. (Its
/// modification time decides nothing: a same-size rewrite is what the checksums catch.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

impl Identity {
    /// The identity `meta` describes.
    pub fn of(meta: &Metadata) -> Self {
        Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
        }
    }

    /// Whether `other` is the same file (device and inode), whatever its size.
    pub fn same_file(&self, other: &Identity) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }
}

/// What is wrong with a shard file now (pure description; [`resized`] decides it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileFault {
    /// The path cannot be examined (removed, permissions, I/O error).
    Unreadable(String),
    /// The file is shorter or longer than when it was opened.
    Resized { was: u64, now: u64 },
}

impl std::fmt::Display for FileFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileFault::Unreadable(why) => write!(f, "cannot be examined: {why}"),
            FileFault::Resized { was, now } if now < was => {
                write!(f, "truncated to {now} bytes (was {was} when opened)")
            }
            FileFault::Resized { was, now } => {
                write!(f, "is {now} bytes, not the {was} bytes it had when opened")
            }
        }
    }
}

/// The fault of a file recorded as `opened` and seen as `now`, if any: a different size.
pub fn resized(opened: &Identity, now: &Identity) -> Option<FileFault> {
    (now.size != opened.size).then_some(FileFault::Resized {
        was: opened.size,
        now: now.size,
    })
}

/// The descriptors of one opening of a shard.
#[derive(Debug)]
pub(crate) struct Handles {
    pub buffered: File,
    /// Opened with `O_DIRECT`, where the filesystem allows it and the mode asks for it.
    pub direct: Option<File>,
    pub identity: Identity,
}

impl Handles {
    fn open(path: &Path, mode: ReadMode) -> Result<Handles> {
        let buffered = File::open(path).map_err(|e| Error::io(path, e))?;
        let identity = Identity::of(&buffered.metadata().map_err(|e| Error::io(path, e))?);
        let direct = match mode {
            ReadMode::Buffered => None,
            ReadMode::Direct => Some(open_direct(path).map_err(|e| Error::io(path, e))?),
            ReadMode::Auto => open_direct(path).ok(),
        };
        Ok(Handles {
            buffered,
            direct,
            identity,
        })
    }
}

/// One shard file of a reader pool.
#[derive(Debug)]
pub(crate) struct Shard {
    pub path: PathBuf,
    mode: ReadMode,
    /// The identity at pool start: its size is what every read is checked against.
    pub opened: Identity,
    handles: RwLock<Arc<Handles>>,
    /// Whether reads use the `O_DIRECT` descriptor (see [`super::ReaderPool::set_direct`]).
    pub direct_ok: AtomicBool,
}

impl Shard {
    /// Open `path` for `mode` and record its identity.
    pub fn open(path: &Path, mode: ReadMode) -> Result<Shard> {
        let handles = Handles::open(path, mode)?;
        Ok(Shard {
            path: path.to_path_buf(),
            mode,
            opened: handles.identity,
            direct_ok: AtomicBool::new(handles.direct.is_some()),
            handles: RwLock::new(Arc::new(handles)),
        })
    }

    /// The descriptors reads use now.
    pub fn handles(&self) -> Arc<Handles> {
        read(&self.handles).clone()
    }

    /// Whether the shard was opened with an `O_DIRECT` descriptor.
    pub fn has_direct(&self) -> bool {
        self.handles().direct.is_some()
    }

    /// Bytes a read of `len` at `offset` must return: everything up to the size at open
    /// (aligned reads may run past the end of the file; those bytes are never used).
    pub fn required(&self, offset: u64, len: usize) -> usize {
        self.opened.size.saturating_sub(offset).min(len as u64) as usize
    }

    /// Examine the open file, and its path when the open file is not whole: `Ok` when reads
    /// will give the checkpoint's bytes (reopening a whole file of the recorded size found at
    /// the path), else the fault.
    pub fn examine(&self) -> std::result::Result<(), FileFault> {
        let current = self.handles();
        let open_now = match current.buffered.metadata() {
            Ok(m) => Identity::of(&m),
            Err(e) => return Err(FileFault::Unreadable(e.to_string())),
        };
        let Some(damage) = resized(&self.opened, &open_now) else {
            return Ok(());
        };
        // The open file is damaged: is a whole one at the path (restored by rename)?
        let at_path = match std::fs::metadata(&self.path) {
            Ok(m) => Identity::of(&m),
            Err(_) => return Err(damage),
        };
        if at_path.same_file(&open_now) || at_path.size != self.opened.size {
            return Err(damage);
        }
        let fresh = Handles::open(&self.path, self.mode).map_err(|e| FileFault::Unreadable(e.to_string()))?;
        if let Some(f) = resized(&self.opened, &fresh.identity) {
            return Err(f);
        }
        tracing::warn!(
            file = %self.path.display(),
            "the shard file was replaced by a whole one of the recorded size; reading the new one"
        );
        let direct = fresh.direct.is_some() && self.direct_ok.load(Ordering::Relaxed);
        self.direct_ok.store(direct, Ordering::Relaxed);
        *write(&self.handles) = Arc::new(fresh);
        Ok(())
    }
}

/// The shard files of a model held in memory (memory-mapped), watched the same way: a file
/// truncated or resized under the process is reported before a request touches its pages.
#[derive(Debug)]
pub struct ShardWatch(Vec<Shard>);

impl ShardWatch {
    /// Open every file of `paths` and record its identity.
    pub fn open(paths: &[PathBuf]) -> Result<ShardWatch> {
        let shards = paths
            .iter()
            .map(|p| Shard::open(p, ReadMode::Buffered))
            .collect::<Result<Vec<_>>>()?;
        Ok(ShardWatch(shards))
    }

    /// `Ok` while every file is whole; else a `WeightsUnavailable` error naming the first that
    /// is not.
    pub fn check(&self) -> Result<()> {
        for shard in &self.0 {
            if let Err(fault) = shard.examine() {
                return Err(Error::WeightsUnavailable {
                    path: shard.path.clone(),
                    reason: format!("the file {fault}"),
                });
            }
        }
        Ok(())
    }
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> std::io::Result<File> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "O_DIRECT is Linux-only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ino: u64, size: u64) -> Identity {
        Identity { dev: 1, ino, size }
    }

    #[test]
    fn a_different_size_is_the_fault() {
        assert_eq!(resized(&id(7, 100), &id(7, 100)), None);
        assert_eq!(
            resized(&id(7, 100), &id(8, 100)),
            None,
            "another inode of the same size"
        );
        assert_eq!(
            resized(&id(7, 100), &id(7, 40)),
            Some(FileFault::Resized { was: 100, now: 40 })
        );
        assert_eq!(
            resized(&id(7, 100), &id(8, 140)),
            Some(FileFault::Resized { was: 100, now: 140 })
        );
        assert!(
            FileFault::Resized { was: 100, now: 40 }
                .to_string()
                .contains("truncated to 40")
        );
    }

    #[test]
    fn a_truncated_file_is_a_fault_until_a_whole_one_is_renamed_over_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.bin");
        std::fs::write(&path, [1u8; 64]).unwrap();
        let shard = Shard::open(&path, ReadMode::Buffered).unwrap();
        assert_eq!(shard.examine(), Ok(()));
        // Renamed away (a stream install publishing a staged shard): the open file is whole.
        let moved = dir.path().join("published.bin");
        std::fs::rename(&path, &moved).unwrap();
        assert_eq!(shard.examine(), Ok(()));
        std::fs::rename(&moved, &path).unwrap();
        // Truncated in place: a fault, also while the path holds a short file.
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(10)
            .unwrap();
        assert_eq!(shard.examine(), Err(FileFault::Resized { was: 64, now: 10 }));
        std::fs::write(dir.path().join("short"), [1u8; 20]).unwrap();
        std::fs::rename(dir.path().join("short"), &path).unwrap();
        assert_eq!(shard.examine(), Err(FileFault::Resized { was: 64, now: 10 }));
        // A whole one renamed over it: reopened.
        std::fs::write(dir.path().join("whole"), [2u8; 64]).unwrap();
        std::fs::rename(dir.path().join("whole"), &path).unwrap();
        assert_eq!(shard.examine(), Ok(()));
        assert!(
            shard
                .handles()
                .identity
                .same_file(&Identity::of(&std::fs::metadata(&path).unwrap()))
        );
        // Deleted while open: still the bytes that were read.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(shard.examine(), Ok(()));
    }
}
