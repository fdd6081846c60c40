//! Content verification of complete files. What each source lets us check:
//!
//! * Hugging Face LFS files (every `*.safetensors` shard): SHA-256 of the whole file, from the
//!   API's `lfs.sha256`.
//! * Hugging Face non-LFS files (`config.json`, tokenizer files): the git blob id (SHA-1 of
//!   `"blob {len}\0" + content`) from the API's `blobId`; when the listing carries none, only the
//!   exact size can be checked.
//! * OCI layers: SHA-256 (the layer digest).
//!
//! Stream-mode expert ranges cannot be checked on their own: safetensors carries no per-tensor
//! digest, so a range is trusted on exact offsets/length (the header is part of the hashed file).
//! When a streamed file becomes complete it is hashed like any other before it is published.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha1::Digest as _;

use crate::error::{Error, Result};

/// What a file's content must hash to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "algo", content = "hex")]
pub enum Expected {
    /// SHA-256 of the content (lowercase hex).
    Sha256(String),
    /// Git blob SHA-1 (lowercase hex).
    GitBlobSha1(String),
    /// No digest known: only the size is checked.
    SizeOnly,
}

impl Expected {
    /// Algorithm label for messages.
    pub fn algo(&self) -> &'static str {
        match self {
            Expected::Sha256(_) => "sha256",
            Expected::GitBlobSha1(_) => "git-blob-sha1",
            Expected::SizeOnly => "size",
        }
    }

    /// The SHA-256 when known.
    pub fn sha256(&self) -> Option<&str> {
        match self {
            Expected::Sha256(h) => Some(h),
            _ => None,
        }
    }
}

/// Hash of a whole file: SHA-256 always, plus the git blob id when asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHashes {
    pub size: u64,
    pub sha256: String,
    pub git_blob_sha1: Option<String>,
}

/// Read `path` once and hash it.
pub fn hash_file(path: &Path, want_git_blob: bool) -> Result<FileHashes> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let size = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut sha = sha2::Sha256::new();
    let mut git = want_git_blob.then(|| {
        let mut h = sha1::Sha1::new();
        h.update(format!("blob {size}\0").as_bytes());
        h
    });
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        sha.update(&buf[..n]);
        if let Some(g) = git.as_mut() {
            g.update(&buf[..n]);
        }
    }
    Ok(FileHashes {
        size,
        sha256: hex::encode(sha.finalize()),
        git_blob_sha1: git.map(|g| hex::encode(g.finalize())),
    })
}

/// Check the file at `path` (named `name` in messages) against `size` and `expected`.
pub fn verify_file(path: &Path, name: &str, size: u64, expected: &Expected) -> Result<FileHashes> {
    let h = hash_file(path, matches!(expected, Expected::GitBlobSha1(_)))?;
    let mismatch = |algo, expected: &str, actual: String| Error::ChecksumMismatch {
        path: name.to_string(),
        algo,
        expected: expected.to_string(),
        actual,
    };
    if h.size != size {
        return Err(mismatch("size", &size.to_string(), h.size.to_string()));
    }
    match expected {
        Expected::Sha256(want) if !want.eq_ignore_ascii_case(&h.sha256) => {
            Err(mismatch("sha256", want, h.sha256))
        }
        Expected::GitBlobSha1(want)
            if h.git_blob_sha1
                .as_deref()
                .is_none_or(|g| !want.eq_ignore_ascii_case(g)) =>
        {
            Err(mismatch(
                "git-blob-sha1",
                want,
                h.git_blob_sha1.unwrap_or_default(),
            ))
        }
        _ => Ok(h),
    }
}

/// Whether a string is `n` lowercase-or-uppercase hex digits.
pub fn is_hex(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        let h = hash_file(&p, true).unwrap();
        assert_eq!(
            h.sha256,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        // `git hash-object` of "hello\n".
        assert_eq!(
            h.git_blob_sha1.as_deref(),
            Some("ce013625030ba8dba906f756967f9e9ca394464a")
        );
        let ok = Expected::GitBlobSha1("ce013625030ba8dba906f756967f9e9ca394464a".into());
        verify_file(&p, "f", 6, &ok).unwrap();
        let bad = Expected::Sha256("00".repeat(32));
        let e = verify_file(&p, "f", 6, &bad).unwrap_err();
        assert!(e.to_string().contains("f: checksum mismatch (sha256)"), "{e}");
        assert!(verify_file(&p, "f", 7, &Expected::SizeOnly).is_err());
        assert!(is_hex(&"ab".repeat(20), 40) && !is_hex("xyz", 3));
    }
}
