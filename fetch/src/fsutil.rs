//! Local file-system primitives: free space (statvfs), the per-directory exclusive lock (flock,
//! released by the kernel when the process dies, so `kill -9` never leaves a stale lock), atomic
//! publication (fsync file, rename, fsync directory), atomic small-file writes, and validation of
//! relative paths coming from a remote listing.

use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// Bytes available to an unprivileged writer on the file system holding `path` (the nearest
/// existing ancestor is used when `path` does not exist yet).
pub fn free_space(path: &Path) -> Result<u64> {
    let mut p = path;
    while !p.exists() {
        p = p.parent().unwrap_or(Path::new("/"));
    }
    let st = rustix::fs::statvfs(p).map_err(|e| Error::io(p, e.into()))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// An exclusive advisory lock on a directory's `.deltafin/lock`, held while alive.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Take the lock without waiting; `Error::Locked` when another process holds it.
    pub fn acquire(dir: &Path, state_dir: &Path) -> Result<DirLock> {
        std::fs::create_dir_all(state_dir).map_err(|e| Error::io(state_dir, e))?;
        let path = state_dir.join("lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(DirLock { _file: file, path }),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(Error::Locked {
                dir: dir.to_path_buf(),
                lock: path,
            }),
            Err(e) => Err(Error::io(&path, e.into())),
        }
    }

    /// Path of the lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// fsync a directory (best effort: some file systems refuse it).
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Publish `staged` as `dest`: fsync the data, create `dest`'s parent, rename (atomic on one file
/// system), fsync both directories. A reader sees either no `dest` or the complete file.
pub fn publish(staged: &Path, dest: &Path) -> Result<()> {
    File::open(staged)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(staged, e))?;
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    std::fs::rename(staged, dest).map_err(|e| Error::io(dest, e))?;
    if let Some(parent) = dest.parent() {
        sync_dir(parent);
    }
    if let Some(parent) = staged.parent() {
        sync_dir(parent);
    }
    Ok(())
}

/// Write a small file atomically: `path.tmp`, fsync, rename over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Check a relative path from a remote listing: non-empty, relative, no `..`, no `.deltafin`
/// state directory, no NUL or backslash. Returns it unchanged when safe.
pub fn safe_relative_path(name: &str) -> Result<&str> {
    let bad = |reason| {
        Err(Error::UnsafePath {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() || name.len() > 4096 {
        return bad("empty or too long");
    }
    if name.contains('\0') || name.contains('\\') {
        return bad("contains NUL or backslash");
    }
    let p = Path::new(name);
    for c in p.components() {
        match c {
            Component::Normal(s) if s == ".deltafin" => return bad("names the .deltafin state directory"),
            Component::Normal(_) => {}
            _ => return bad("not a plain relative path (absolute, `.` or `..`)"),
        }
    }
    if name.ends_with('/') {
        return bad("names a directory");
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_paths_are_refused() {
        for ok in ["config.json", "original/model-00001.safetensors", "a b/c.json"] {
            assert!(safe_relative_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "./x",
            ".deltafin/manifest.json",
            "a\\b",
            "dir/",
        ] {
            assert!(safe_relative_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lock_is_exclusive_and_released_on_drop() {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join(".deltafin");
        let a = DirLock::acquire(t.path(), &state).unwrap();
        assert!(matches!(
            DirLock::acquire(t.path(), &state),
            Err(Error::Locked { .. })
        ));
        drop(a);
        DirLock::acquire(t.path(), &state).unwrap();
    }

    #[test]
    fn publish_and_atomic_write() {
        let t = tempfile::tempdir().unwrap();
        let staged = t.path().join("s.partial");
        std::fs::write(&staged, b"hello").unwrap();
        let dest = t.path().join("sub/dir/file");
        publish(&staged, &dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
        assert!(!staged.exists());
        write_atomic(&t.path().join("m.json"), b"{}").unwrap();
        assert_eq!(std::fs::read(t.path().join("m.json")).unwrap(), b"{}");
        assert!(free_space(&t.path().join("not/yet")).unwrap() > 0);
    }
}
