//! Models as OCI artifacts (pulled and pushed with the `oci-client` crate).
//!
//! Layout of an artifact made by `deltafin push` (OCI image-spec 1.1 artifact manifest):
//!
//! * manifest `mediaType` `application/vnd.oci.image.manifest.v1+json`, `artifactType`
//!   [`ARTIFACT_TYPE`];
//! * config: media type [`CONFIG_MEDIA_TYPE`], a JSON [`ArtifactConfig`] (source, revision, pinned
//!   commit, every file with size and SHA-256);
//! * one layer per file, media type [`FILE_MEDIA_TYPE`], the file's exact bytes (uncompressed), so a
//!   layer digest is the file's SHA-256 (for Hugging Face LFS files: the same value as `lfs.sha256`),
//!   annotated with `org.opencontainers.image.title` = the file's relative path.
//!
//! Pulls go through the same ranged, resumable, verified downloader as Hugging Face (blob GETs with
//! Range headers), by manifest *digest* once the tag is resolved, so a tag moved mid-install is
//! detected instead of mixing two versions.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::str::FromStr;

use bytes::Bytes;
use futures_util::StreamExt;
use oci_client::client::{BlobResponse, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};
pub use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};

use super::{ByteStream, Listing, RemoteFile, SourceSpec};
use crate::error::{Error, Result};
use crate::fsutil::safe_relative_path;
use crate::http::{AttemptError, install_tls_provider, transport_failure};
use crate::retry::Failure;
use crate::verify::{Expected, is_hex};

/// `artifactType` of a Deltafin model artifact.
pub const ARTIFACT_TYPE: &str = "application/vnd.deltafin.model.v1+json";
/// Media type of the config blob.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.deltafin.model.v1+json";
/// Media type of a file layer (raw bytes).
pub const FILE_MEDIA_TYPE: &str = "application/vnd.deltafin.model.file.v1";
/// Annotation holding a layer's relative path.
pub const TITLE: &str = "org.opencontainers.image.title";

/// The config blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactConfig {
    pub format: u32,
    pub source: Option<String>,
    pub revision: Option<String>,
    pub pinned: Option<String>,
    pub files: Vec<ArtifactFile>,
}

/// One file in the config blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// Registry connection settings.
#[derive(Debug, Clone)]
pub struct OciOptions {
    /// Use plain HTTP (always for loopback registries: 127.0.0.1, localhost, [::1]).
    pub plain_http: bool,
    pub auth: RegistryAuth,
}

/// An OCI client for `reference` (plain HTTP for loopback registries or when asked).
pub fn make_client(reference: &Reference, opts: &OciOptions) -> Client {
    install_tls_provider();
    let registry = reference.resolve_registry().to_string();
    let host = registry.rsplit_once(':').map_or(registry.as_str(), |(h, _)| h);
    let loopback = matches!(host, "127.0.0.1" | "localhost" | "[::1]");
    let protocol = if opts.plain_http || loopback {
        ClientProtocol::HttpsExcept(vec![registry])
    } else {
        ClientProtocol::Https
    };
    Client::new(ClientConfig {
        protocol,
        ..Default::default()
    })
}

/// Parse `REGISTRY/REPO[:TAG|@DIGEST]` (without `oci://`).
pub fn parse_reference(s: &str) -> Result<Reference> {
    Reference::from_str(s).map_err(|e| Error::InvalidArgument {
        what: "OCI reference",
        input: s.into(),
        reason: e.to_string(),
    })
}

/// An artifact in a registry, as a download source.
pub struct OciSource {
    client: Client,
    reference: Reference,
    spec: SourceSpec,
    auth: RegistryAuth,
}

impl std::fmt::Debug for OciSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciSource")
            .field("reference", &self.reference.whole())
            .finish_non_exhaustive()
    }
}

impl OciSource {
    /// Source for `spec` (must be `oci://`).
    pub fn new(spec: &SourceSpec, opts: &OciOptions) -> Result<Self> {
        let SourceSpec::Oci { reference } = spec else {
            return Err(Error::InvalidArgument {
                what: "source",
                input: format!("{spec:?}"),
                reason: "not oci://".into(),
            });
        };
        let reference = parse_reference(reference)?;
        let client = make_client(&reference, opts);
        Ok(OciSource {
            client,
            reference,
            spec: spec.clone(),
            auth: opts.auth.clone(),
        })
    }

    /// The source spec.
    pub fn spec(&self) -> SourceSpec {
        self.spec.clone()
    }

    /// Resolve the tag to a manifest digest and list the files.
    pub async fn resolve(&self) -> Result<Listing> {
        let (manifest, digest) = self
            .client
            .pull_manifest(&self.reference, &self.auth)
            .await
            .map_err(|e| oci_error("pull manifest", &self.reference, e))?;
        let OciManifest::Image(m) = manifest else {
            return Err(self.err("resolve", "an image index, not a deltafin model artifact".into()));
        };
        let kind = m.artifact_type.as_deref().unwrap_or(m.config.media_type.as_str());
        if kind != ARTIFACT_TYPE && m.config.media_type != CONFIG_MEDIA_TYPE {
            return Err(self.err(
                "resolve",
                format!("artifact type `{kind}` is not a deltafin model ({ARTIFACT_TYPE})"),
            ));
        }
        let mut files = Vec::with_capacity(m.layers.len());
        for l in &m.layers {
            files.push(layer_file(l).map_err(|r| self.err("resolve", r))?);
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(Listing {
            source_id: self.spec.id(),
            revision: self.spec.revision(),
            pinned: digest,
            files,
        })
    }

    fn err(&self, op: &'static str, reason: String) -> Error {
        Error::Oci {
            op,
            reference: self.reference.whole(),
            reason,
        }
    }

    /// One ranged blob GET.
    pub async fn open_range(
        &self,
        pinned: &str,
        file: &RemoteFile,
        range: Range<u64>,
    ) -> Result<ByteStream, AttemptError> {
        let image = self.reference.clone_with_digest(pinned.to_string());
        let url = format!("{}@{}", self.reference.whole(), file.locator);
        let desc = OciDescriptor {
            media_type: FILE_MEDIA_TYPE.into(),
            digest: file.locator.clone(),
            size: file.size as i64,
            ..Default::default()
        };
        self.client
            .store_auth_if_needed(image.resolve_registry(), &self.auth)
            .await;
        let len = range.end - range.start;
        let resp = self
            .client
            .pull_blob_stream_partial(&image, &desc, range.start, Some(len))
            .await;
        let stream = match resp {
            Ok(BlobResponse::Partial(s)) => s,
            Ok(BlobResponse::Full(s)) if range.start == 0 => s,
            Ok(BlobResponse::Full(_)) => {
                let e = Error::Protocol {
                    url: url.clone(),
                    reason: "the registry ignored the Range header".into(),
                };
                return Err(AttemptError::fatal(&url, e));
            }
            Err(e) => return Err(classify(&url, e)),
        };
        let u = url.clone();
        Ok(Box::pin(stream.stream.map(move |r| {
            r.map_err(|e| AttemptError::retry(&u, Failure::BodyCut, e.to_string()))
        })))
    }
}

/// A layer -> `RemoteFile` (pure).
fn layer_file(l: &OciDescriptor) -> Result<RemoteFile, String> {
    let title = l
        .annotations
        .as_ref()
        .and_then(|a| a.get(TITLE))
        .ok_or_else(|| format!("layer {} has no {TITLE} annotation", l.digest))?;
    let path = safe_relative_path(title).map_err(|e| e.to_string())?.to_string();
    let hex = l
        .digest
        .strip_prefix("sha256:")
        .filter(|h| is_hex(h, 64))
        .ok_or_else(|| format!("layer {path}: digest {} is not sha256", l.digest))?;
    let size = u64::try_from(l.size).map_err(|_| format!("layer {path}: negative size"))?;
    Ok(RemoteFile {
        path,
        size,
        expected: Expected::Sha256(hex.to_ascii_lowercase()),
        locator: l.digest.clone(),
    })
}

/// Map an oci-client error of one attempt.
fn classify(url: &str, e: OciDistributionError) -> AttemptError {
    match e {
        OciDistributionError::RequestError(e) => transport_failure(url, &e),
        OciDistributionError::IoError(e) => AttemptError::retry(url, Failure::BodyCut, e.to_string()),
        OciDistributionError::ServerError { code, message, .. } => {
            let f = Failure::Status {
                status: code,
                retry_after: None,
            };
            match code {
                404 => AttemptError::fatal(
                    url,
                    Error::NotFound {
                        url: url.into(),
                        hint: String::new(),
                    },
                ),
                401 | 403 => AttemptError::fatal(
                    url,
                    Error::Unauthorized {
                        url: url.into(),
                        status: code,
                        hint: message,
                    },
                ),
                _ if f.is_retryable() => AttemptError::retry(url, f, message),
                _ => AttemptError::fatal(
                    url,
                    Error::HttpStatus {
                        url: url.into(),
                        status: code,
                        attempts: 1,
                    },
                ),
            }
        }
        OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_) => {
            AttemptError::fatal(
                url,
                Error::Unauthorized {
                    url: url.into(),
                    status: 401,
                    hint: "check the registry credentials".into(),
                },
            )
        }
        e => AttemptError::fatal(
            url,
            Error::Oci {
                op: "pull blob",
                reference: url.into(),
                reason: e.to_string(),
            },
        ),
    }
}

fn oci_error(op: &'static str, r: &Reference, e: OciDistributionError) -> Error {
    let reference = r.whole();
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => Error::NotFound {
            url: reference,
            hint: String::new(),
        },
        OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_) => {
            Error::Unauthorized {
                url: reference,
                status: 401,
                hint: "check the registry credentials".into(),
            }
        }
        e => Error::Oci {
            op,
            reference,
            reason: e.to_string(),
        },
    }
}

/// What `push` did.
#[derive(Debug, Clone, Serialize)]
pub struct PushReport {
    pub reference: String,
    pub manifest_url: String,
    pub files: usize,
    pub bytes: u64,
    /// Layers already present in the registry (not uploaded again).
    pub skipped: usize,
}

/// A file to push.
#[derive(Debug, Clone)]
pub struct PushFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// Push `files` (relative to `dir`) as a model artifact to `reference`.
pub async fn push(
    dir: &Path,
    reference: &str,
    files: &[PushFile],
    config: &ArtifactConfig,
    opts: &OciOptions,
) -> Result<PushReport> {
    let image = parse_reference(reference)?;
    let client = make_client(&image, opts);
    client
        .store_auth_if_needed(image.resolve_registry(), &opts.auth)
        .await;
    let err = |op, e: OciDistributionError| oci_error(op, &image, e);
    let mut layers = Vec::with_capacity(files.len());
    let mut skipped = 0;
    for f in files {
        let digest = format!("sha256:{}", f.sha256);
        if client
            .blob_exists(&image, &digest)
            .await
            .map_err(|e| err("check blob", e))?
        {
            skipped += 1;
        } else {
            let path = dir.join(&f.path);
            let stream = file_stream(&path)?;
            client
                .push_blob_stream(&image, stream, &digest, Some(f.size))
                .await
                .map_err(|e| err("push blob", e))?;
        }
        let annotations = BTreeMap::from([(TITLE.to_string(), f.path.clone())]);
        layers.push(OciDescriptor {
            media_type: FILE_MEDIA_TYPE.into(),
            digest,
            size: f.size as i64,
            annotations: Some(annotations),
            ..Default::default()
        });
    }
    let config_bytes = serde_json::to_vec(config).expect("json");
    let manifest = artifact_manifest(config, &config_bytes, layers);
    client
        .push_blob(&image, config_bytes, &manifest.config.digest)
        .await
        .map_err(|e| err("push config", e))?;
    let manifest_url = client
        .push_manifest(&image, &OciManifest::Image(manifest))
        .await
        .map_err(|e| err("push manifest", e))?;
    Ok(PushReport {
        reference: image.whole(),
        manifest_url,
        files: files.len(),
        bytes: files.iter().map(|f| f.size).sum(),
        skipped,
    })
}

/// The artifact manifest for `layers` and the serialized config blob (pure).
fn artifact_manifest(
    config: &ArtifactConfig,
    config_bytes: &[u8],
    layers: Vec<OciDescriptor>,
) -> OciImageManifest {
    let config_desc = OciDescriptor {
        media_type: CONFIG_MEDIA_TYPE.into(),
        digest: format!(
            "sha256:{}",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(config_bytes))
        ),
        size: config_bytes.len() as i64,
        ..Default::default()
    };
    let mut annotations = BTreeMap::new();
    if let Some(s) = &config.source {
        annotations.insert("org.opencontainers.image.source".to_string(), s.clone());
    }
    if let Some(p) = &config.pinned {
        annotations.insert("org.opencontainers.image.revision".to_string(), p.clone());
    }
    OciImageManifest {
        schema_version: 2,
        media_type: Some("application/vnd.oci.image.manifest.v1+json".into()),
        config: config_desc,
        layers,
        subject: None,
        artifact_type: Some(ARTIFACT_TYPE.into()),
        annotations: (!annotations.is_empty()).then_some(annotations),
    }
}

/// Read a file as a stream of 8 MiB chunks (for chunked blob uploads).
fn file_stream(
    path: &Path,
) -> Result<impl futures_util::Stream<Item = oci_client::errors::Result<Bytes>> + Send + 'static> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    Ok(futures_util::stream::iter(std::iter::from_fn(move || {
        let mut buf = vec![0u8; 8 << 20];
        match f.read(&mut buf) {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some(Ok(Bytes::from(buf)))
            }
            Err(e) => Some(Err(OciDistributionError::IoError(e))),
        }
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_need_title_and_sha256() {
        let mut l = OciDescriptor {
            media_type: FILE_MEDIA_TYPE.into(),
            digest: format!("sha256:{}", "a".repeat(64)),
            size: 5,
            ..Default::default()
        };
        assert!(layer_file(&l).is_err());
        l.annotations = Some(BTreeMap::from([(TITLE.to_string(), "x/config.json".to_string())]));
        let f = layer_file(&l).unwrap();
        assert_eq!((f.path.as_str(), f.size), ("x/config.json", 5));
        l.annotations = Some(BTreeMap::from([(TITLE.to_string(), "../evil".to_string())]));
        assert!(layer_file(&l).is_err());
        l.annotations = Some(BTreeMap::from([(TITLE.to_string(), "ok".to_string())]));
        l.digest = "sha512:00".into();
        assert!(layer_file(&l).is_err());
    }
}
