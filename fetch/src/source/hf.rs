//! Hugging Face Hub source. Resolution: `GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true`
//! returns the commit `sha` and `siblings` (`rfilename`, `size`, `blobId`, `lfs.sha256`). Files are
//! read from `{endpoint}/{repo}/resolve/{commit}/{path}` with Range requests: asking by *commit*
//! rather than by branch pins the content, and an `X-Repo-Commit` response header that names
//! another commit fails the install. The token, when given, is sent as `Authorization: Bearer`
//! (reqwest drops it on redirects to other hosts, e.g. the CDN).

use std::ops::Range;

use reqwest::{Client, Url};
use serde::Deserialize;

use super::{ByteStream, Listing, RemoteFile, SourceSpec};
use crate::error::{Error, Result};
use crate::fsutil::safe_relative_path;
use crate::http::{AttemptError, get_range, get_small};
use crate::retry::RetryPolicy;
use crate::verify::{Expected, is_hex};

/// Default endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A repository at a revision on an endpoint.
#[derive(Debug, Clone)]
pub struct HfRepo {
    client: Client,
    endpoint: Url,
    repo: String,
    revision: String,
    token: Option<String>,
    policy: RetryPolicy,
}

#[derive(Deserialize)]
struct ApiRevision {
    sha: String,
    #[serde(default)]
    siblings: Vec<ApiSibling>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiLfs {
    sha256: String,
    size: u64,
}

impl HfRepo {
    /// `endpoint` like `https://huggingface.co` (a path prefix is kept).
    pub fn new(
        client: Client,
        endpoint: &str,
        spec: &SourceSpec,
        token: Option<String>,
        policy: RetryPolicy,
    ) -> Result<Self> {
        let SourceSpec::Hf { repo, revision } = spec else {
            return Err(Error::InvalidArgument {
                what: "source",
                input: format!("{spec:?}"),
                reason: "not hf://".into(),
            });
        };
        let endpoint = Url::parse(endpoint.trim_end_matches('/'))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| Error::InvalidArgument {
                what: "endpoint",
                input: endpoint.into(),
                reason: "expected an http(s) URL".into(),
            })?;
        Ok(HfRepo {
            client,
            endpoint,
            repo: repo.clone(),
            revision: revision.clone(),
            token,
            policy,
        })
    }

    /// The endpoint, without a trailing slash.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str().trim_end_matches('/')
    }

    /// The source this repo was built from.
    pub fn spec(&self) -> SourceSpec {
        SourceSpec::Hf {
            repo: self.repo.clone(),
            revision: self.revision.clone(),
        }
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut u = self.endpoint.clone();
        {
            let mut p = u.path_segments_mut().expect("http URL");
            p.pop_if_empty();
            for s in segments {
                p.push(s);
            }
        }
        u
    }

    /// The API URL of the revision listing.
    pub fn api_url(&self) -> Url {
        let (org, name) = self.repo.split_once('/').expect("validated ORG/REPO");
        let mut u = self.url(&["api", "models", org, name, "revision", &self.revision]);
        u.set_query(Some("blobs=true"));
        u
    }

    /// The download URL of `path` at `commit`.
    pub fn file_url(&self, commit: &str, path: &str) -> Url {
        let (org, name) = self.repo.split_once('/').expect("validated ORG/REPO");
        let mut segs = vec![org, name, "resolve", commit];
        segs.extend(path.split('/'));
        self.url(&segs)
    }

    fn hint(&self) -> String {
        if self.token.is_some() {
            format!(
                "check that {} exists at revision `{}` and that the token may read it",
                self.repo, self.revision
            )
        } else {
            format!(
                "check that {} exists at revision `{}`; private or gated repositories need HF_TOKEN",
                self.repo, self.revision
            )
        }
    }

    /// Resolve the revision to a commit and list every file with its size and digest.
    pub async fn resolve(&self) -> Result<Listing> {
        let url = self.api_url();
        let (body, _) = get_small(
            &self.client,
            url.as_str(),
            self.token.as_deref(),
            &self.policy,
            &self.hint(),
        )
        .await?;
        let api: ApiRevision = serde_json::from_slice(&body).map_err(|e| Error::Protocol {
            url: url.to_string(),
            reason: format!("revision listing is not the expected JSON: {e}"),
        })?;
        let bad = |reason: String| Error::Protocol {
            url: url.to_string(),
            reason,
        };
        if api.sha.is_empty() || !api.sha.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(bad(format!("commit sha `{}` is malformed", api.sha)));
        }
        let mut files = Vec::with_capacity(api.siblings.len());
        for s in api.siblings {
            let path = safe_relative_path(&s.rfilename)?.to_string();
            files.push(sibling_file(path, s).map_err(bad)?);
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(Listing {
            source_id: self.spec().id(),
            revision: self.revision.clone(),
            pinned: api.sha,
            files,
        })
    }

    /// One ranged GET of `file` at `commit`.
    pub async fn open_range(
        &self,
        commit: &str,
        file: &RemoteFile,
        range: Range<u64>,
    ) -> Result<ByteStream, AttemptError> {
        let url = self.file_url(commit, &file.locator);
        let pin = Some(("x-repo-commit", commit));
        get_range(
            &self.client,
            url.as_str(),
            self.token.as_deref(),
            range,
            file.size,
            &self.hint(),
            pin,
        )
        .await
    }
}

/// A listing entry -> `RemoteFile` (pure): LFS files are checked by SHA-256, others by git blob id
/// when present, else by size only. Sizes must be known (the API gives them with `blobs=true`).
fn sibling_file(path: String, s: ApiSibling) -> Result<RemoteFile, String> {
    let (size, expected) = match (&s.lfs, s.size) {
        (Some(lfs), _) => {
            if !is_hex(&lfs.sha256, 64) {
                return Err(format!(
                    "{path}: lfs.sha256 `{}` is not 64 hex digits",
                    lfs.sha256
                ));
            }
            (lfs.size, Expected::Sha256(lfs.sha256.to_ascii_lowercase()))
        }
        (None, Some(size)) => match s.blob_id.as_deref() {
            Some(b) if is_hex(b, 40) => (size, Expected::GitBlobSha1(b.to_ascii_lowercase())),
            _ => (size, Expected::SizeOnly),
        },
        (None, None) => {
            return Err(format!(
                "{path}: the listing has no size (was ?blobs=true honoured?)"
            ));
        }
    };
    Ok(RemoteFile {
        locator: path.clone(),
        path,
        size,
        expected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_built_and_encoded() {
        crate::http::install_tls_provider();
        let spec: SourceSpec = "hf://org/my.repo@refs/pr/1".parse().unwrap();
        let c = Client::new();
        let r = HfRepo::new(
            c,
            "http://127.0.0.1:8080/mirror/",
            &spec,
            None,
            RetryPolicy::default(),
        )
        .unwrap();
        assert_eq!(
            r.api_url().as_str(),
            "http://127.0.0.1:8080/mirror/api/models/org/my.repo/revision/refs%2Fpr%2F1?blobs=true"
        );
        assert_eq!(
            r.file_url("abc", "sub dir/x.json").as_str(),
            "http://127.0.0.1:8080/mirror/org/my.repo/resolve/abc/sub%20dir/x.json"
        );
        assert!(HfRepo::new(Client::new(), "ftp://x", &spec, None, RetryPolicy::default()).is_err());
    }

    #[test]
    fn siblings_choose_the_strongest_check() {
        let sib = |json: &str| serde_json::from_str::<ApiSibling>(json).unwrap();
        let f = sibling_file(
            "a".into(),
            sib(&format!(
                r#"{{"rfilename":"a","size":135,"lfs":{{"sha256":"{}","size":999}}}}"#,
                "Ab".repeat(32)
            )),
        )
        .unwrap();
        assert_eq!((f.size, f.expected), (999, Expected::Sha256("ab".repeat(32))));
        let f = sibling_file(
            "b".into(),
            sib(&format!(
                r#"{{"rfilename":"b","size":5,"blobId":"{}"}}"#,
                "c".repeat(40)
            )),
        )
        .unwrap();
        assert_eq!(f.expected, Expected::GitBlobSha1("c".repeat(40)));
        let f = sibling_file("c".into(), sib(r#"{"rfilename":"c","size":5}"#)).unwrap();
        assert_eq!(f.expected, Expected::SizeOnly);
        assert!(sibling_file("d".into(), sib(r#"{"rfilename":"d"}"#)).is_err());
        assert!(
            sibling_file(
                "e".into(),
                sib(r#"{"rfilename":"e","lfs":{"sha256":"zz","size":1}}"#)
            )
            .is_err()
        );
    }
}
