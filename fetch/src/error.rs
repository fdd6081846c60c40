//! The crate's one error type. Every variant names what failed (a URL, a file, a directory) so the
//! command line can print it as a single line; [`Error::kind`] gives a stable label for metrics and
//! for the machine-readable progress stream.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while getting weights.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `hf://` / `oci://` source or another argument could not be parsed.
    #[error("invalid {what} `{input}`: {reason}")]
    InvalidArgument {
        what: &'static str,
        input: String,
        reason: String,
    },
    /// HTTP 404 (not retried).
    #[error("{url}: not found (HTTP 404){hint}")]
    NotFound { url: String, hint: String },
    /// HTTP 401/403 (not retried).
    #[error("{url}: access denied (HTTP {status}); {hint}")]
    Unauthorized { url: String, status: u16, hint: String },
    /// Another HTTP status that is not retried, or a retryable one after the last attempt.
    #[error("{url}: HTTP {status} after {attempts} attempt(s)")]
    HttpStatus { url: String, status: u16, attempts: u32 },
    /// Connection refused/reset/timed out, or a body cut short, after the last attempt.
    #[error("{url}: network failure after {attempts} attempt(s): {reason}")]
    Network {
        url: String,
        attempts: u32,
        reason: String,
    },
    /// A response that breaks the protocol (wrong Content-Range, body too long, bad JSON, ...).
    #[error("{url}: unexpected response: {reason}")]
    Protocol { url: String, reason: String },
    /// A complete file whose digest does not match the source's. Nothing was published.
    #[error(
        "{path}: checksum mismatch ({algo}): expected {expected}, got {actual}; the download was discarded and \
         nothing was published"
    )]
    ChecksumMismatch {
        path: String,
        algo: &'static str,
        expected: String,
        actual: String,
    },
    /// Not enough free space for what remains to be downloaded.
    #[error(
        "not enough free space in {dir}: {need} bytes ({need_h}) still to download plus {headroom_h} headroom, \
         but only {free} bytes ({free_h}) are free"
    )]
    InsufficientSpace {
        dir: PathBuf,
        need: u64,
        need_h: String,
        headroom_h: String,
        free: u64,
        free_h: String,
    },
    /// The source's revision now points elsewhere than the commit this install is pinned to.
    #[error(
        "{source_id}: revision `{revision}` moved from {was} to {now} during the install; the local files belong \
         to {was}. Rerun with `@{was}` to finish that commit, or use a new --dir for {now}"
    )]
    RevisionMoved {
        source_id: String,
        revision: String,
        was: String,
        now: String,
    },
    /// The directory already holds an install of something else.
    #[error("{dir} already holds an install of {existing}, not {requested}; use another --dir")]
    OtherInstall {
        dir: PathBuf,
        existing: String,
        requested: String,
    },
    /// Another process holds the directory's lock.
    #[error("{dir} is in use by another deltafin process (lock {lock})")]
    Locked { dir: PathBuf, lock: PathBuf },
    /// A file name from a listing that would escape the target directory.
    #[error("refusing unsafe file name `{name}` from the source listing: {reason}")]
    UnsafePath { name: String, reason: &'static str },
    /// A local file operation failed.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A manifest, sidecar or listing that cannot be understood.
    #[error("{path}: {reason}")]
    Format { path: String, reason: String },
    /// An OCI registry operation failed.
    #[error("OCI {op} {reference}: {reason}")]
    Oci {
        op: &'static str,
        reference: String,
        reason: String,
    },
    /// A range fetch that another caller was performing failed (stream mode coalescing).
    #[error("{file}: fetching bytes {start}..{end} failed: {reason}")]
    RangeFailed {
        file: String,
        start: u64,
        end: u64,
        reason: String,
    },
    /// The install is not in a state that allows the operation.
    #[error("{dir}: {reason}")]
    NotReady { dir: PathBuf, reason: String },
}

impl Error {
    /// Wrap an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Stable short label (metrics, progress stream).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidArgument { .. } => "invalid_argument",
            Error::NotFound { .. } => "not_found",
            Error::Unauthorized { .. } => "unauthorized",
            Error::HttpStatus { .. } => "http_status",
            Error::Network { .. } => "network",
            Error::Protocol { .. } => "protocol",
            Error::ChecksumMismatch { .. } => "checksum_mismatch",
            Error::InsufficientSpace { .. } => "insufficient_space",
            Error::RevisionMoved { .. } => "revision_moved",
            Error::OtherInstall { .. } => "other_install",
            Error::Locked { .. } => "locked",
            Error::UnsafePath { .. } => "unsafe_path",
            Error::Io { .. } => "io",
            Error::Format { .. } => "format",
            Error::Oci { .. } => "oci",
            Error::RangeFailed { .. } => "range_failed",
            Error::NotReady { .. } => "not_ready",
        }
    }
}

/// `1234567` -> `"1.18 MiB"`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(3 << 30), "3.00 GiB");
    }
}
