//! Where weights come from. A [`SourceSpec`] is parsed from `hf://ORG/REPO[@REVISION]` or
//! `oci://REGISTRY/REPO[:TAG|@DIGEST]`; a [`Remote`] resolves it to a pinned [`Listing`] (every
//! file with its size and digest) and serves byte ranges of those files. Both sources go through
//! the same resumable, verified downloader.

pub mod hf;
pub mod oci;

use std::ops::Range;
use std::pin::Pin;
use std::str::FromStr;

use bytes::Bytes;
use futures_util::Stream;

use crate::error::{Error, Result};
use crate::http::AttemptError;
use crate::verify::Expected;

/// A parsed `--source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// A Hugging Face model repository at a revision (branch, tag or commit; default `main`).
    Hf { repo: String, revision: String },
    /// An OCI artifact pushed by `deltafin push` (`registry/repository:tag` or `@sha256:...`).
    Oci { reference: String },
}

impl FromStr for SourceSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| Error::InvalidArgument {
            what: "source",
            input: s.to_string(),
            reason: reason.into(),
        };
        if let Some(rest) = s.strip_prefix("hf://") {
            let (repo, revision) = match rest.split_once('@') {
                Some((r, rev)) => (r, rev),
                None => (rest, "main"),
            };
            let parts: Vec<&str> = repo.split('/').collect();
            let ok_part = |p: &&str| {
                !p.is_empty()
                    && !p.starts_with('.')
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            };
            if parts.len() != 2 || !parts.iter().all(ok_part) {
                return Err(bad("expected hf://ORG/REPO[@REVISION]"));
            }
            if revision.is_empty() || revision.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(bad("empty or malformed revision after `@`"));
            }
            return Ok(SourceSpec::Hf {
                repo: repo.to_string(),
                revision: revision.to_string(),
            });
        }
        if let Some(rest) = s.strip_prefix("oci://") {
            oci_client::Reference::from_str(rest).map_err(|e| bad(&format!("bad OCI reference: {e}")))?;
            if !rest.contains('/') {
                return Err(bad("expected oci://REGISTRY/REPOSITORY[:TAG|@DIGEST]"));
            }
            return Ok(SourceSpec::Oci {
                reference: rest.to_string(),
            });
        }
        Err(bad(
            "expected hf://ORG/REPO[@REVISION] or oci://REGISTRY/REPO:TAG",
        ))
    }
}

impl SourceSpec {
    /// The source without its revision (`hf://org/repo`, `oci://registry/repo`): what an install
    /// directory belongs to.
    pub fn id(&self) -> String {
        match self {
            SourceSpec::Hf { repo, .. } => format!("hf://{repo}"),
            SourceSpec::Oci { reference } => match oci_client::Reference::from_str(reference) {
                Ok(r) => format!("oci://{}/{}", r.registry(), r.repository()),
                Err(_) => format!("oci://{reference}"),
            },
        }
    }

    /// The requested revision (HF revision, OCI tag or digest).
    pub fn revision(&self) -> String {
        match self {
            SourceSpec::Hf { revision, .. } => revision.clone(),
            SourceSpec::Oci { reference } => match oci_client::Reference::from_str(reference) {
                Ok(r) => r.digest().or(r.tag()).unwrap_or("latest").to_string(),
                Err(_) => "latest".into(),
            },
        }
    }
}

/// One file of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// Relative path in the model directory (validated).
    pub path: String,
    /// Exact size in bytes.
    pub size: u64,
    /// What its content must hash to.
    pub expected: Expected,
    /// Source-specific locator (HF: the path; OCI: the layer digest).
    pub locator: String,
}

/// A resolved source: the pinned identity and every file.
#[derive(Debug, Clone)]
pub struct Listing {
    /// [`SourceSpec::id`].
    pub source_id: String,
    /// The requested revision.
    pub revision: String,
    /// What the revision resolved to (HF commit sha, OCI manifest digest).
    pub pinned: String,
    pub files: Vec<RemoteFile>,
}

impl Listing {
    /// Sum of file sizes.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// A body being received.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, AttemptError>> + Send>>;

/// A source that can be resolved and read by range.
#[derive(Debug)]
pub enum Remote {
    Hf(hf::HfRepo),
    Oci(oci::OciSource),
}

impl Remote {
    /// Resolve the revision and list every file.
    pub async fn resolve(&self) -> Result<Listing> {
        match self {
            Remote::Hf(r) => r.resolve().await,
            Remote::Oci(r) => r.resolve().await,
        }
    }

    /// Open bytes `range` of `file` at the pinned revision (one attempt; the caller retries).
    pub async fn open_range(
        &self,
        pinned: &str,
        file: &RemoteFile,
        range: Range<u64>,
    ) -> Result<ByteStream, AttemptError> {
        match self {
            Remote::Hf(r) => r.open_range(pinned, file, range).await,
            Remote::Oci(r) => r.open_range(pinned, file, range).await,
        }
    }

    /// The Hugging Face endpoint (`None` for OCI, whose registry is part of [`Remote::id`]).
    pub fn endpoint(&self) -> Option<String> {
        match self {
            Remote::Hf(r) => Some(r.endpoint().to_string()),
            Remote::Oci(_) => None,
        }
    }

    /// A printable id of the source.
    pub fn id(&self) -> String {
        match self {
            Remote::Hf(r) => r.spec().id(),
            Remote::Oci(r) => r.spec().id(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_sources() {
        let s: SourceSpec = "hf://moonshotai/Kimi-K3".parse().unwrap();
        assert_eq!(
            s,
            SourceSpec::Hf {
                repo: "moonshotai/Kimi-K3".into(),
                revision: "main".into()
            }
        );
        assert_eq!(s.id(), "hf://moonshotai/Kimi-K3");
        let s: SourceSpec = "hf://org/repo@c5d1dd4c428bd1ce8b88c5044f3b6ccde9e3b721"
            .parse()
            .unwrap();
        assert_eq!(s.revision(), "c5d1dd4c428bd1ce8b88c5044f3b6ccde9e3b721");
        let s: SourceSpec = "hf://org/repo@refs/pr/1".parse().unwrap();
        assert_eq!(s.revision(), "refs/pr/1");
        for bad in [
            "hf://org",
            "hf://a/b/c",
            "hf://../x",
            "hf://org/repo@",
            "s3://x/y",
            "hf://o/r@a b",
        ] {
            assert!(bad.parse::<SourceSpec>().is_err(), "{bad}");
        }
        let s: SourceSpec = "oci://127.0.0.1:5000/models/tiny:v1".parse().unwrap();
        assert_eq!(s.id(), "oci://127.0.0.1:5000/models/tiny");
        assert_eq!(s.revision(), "v1");
        assert!("oci://".parse::<SourceSpec>().is_err());
    }
}
