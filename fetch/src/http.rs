//! HTTP plumbing shared by the sources: the client (rustls with the ring provider; no other TLS
//! stack is compiled in), one-attempt ranged GETs that validate `Content-Range` against what was
//! asked, the mapping of statuses to retryable or fatal outcomes, and the retry loop for small
//! JSON requests.

use std::ops::Range;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::header::{CONTENT_RANGE, HeaderMap, RANGE, RETRY_AFTER};
use reqwest::{Client, StatusCode};

use crate::error::{Error, Result};
use crate::retry::{Failure, RetryPolicy, jitter_sample};
use crate::source::ByteStream;

/// Install rustls' ring provider as the process default (idempotent; a provider already installed
/// is kept). Every client of this crate needs a process-wide provider.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Connection settings.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub connect_timeout: Duration,
    /// Longest silence while reading a body before the attempt fails (and is retried).
    pub read_timeout: Duration,
    pub user_agent: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            user_agent: format!("deltafin-fetch/{}", env!("CARGO_PKG_VERSION")),
        }
    }
}

/// Build the client (installs the TLS provider first).
pub fn build_client(cfg: &HttpConfig) -> Result<Client> {
    install_tls_provider();
    Client::builder()
        .connect_timeout(cfg.connect_timeout)
        .read_timeout(cfg.read_timeout)
        .user_agent(cfg.user_agent.clone())
        .redirect(reqwest::redirect::Policy::limited(10))
        .build()
        .map_err(|e| Error::InvalidArgument {
            what: "HTTP client",
            input: String::new(),
            reason: e.to_string(),
        })
}

/// Why one attempt failed: retryable (with its classification) or fatal.
#[derive(Debug)]
pub enum AttemptKind {
    Retry(Failure, String),
    Fatal(Box<Error>),
}

/// The failure of one attempt at `url`.
#[derive(Debug)]
pub struct AttemptError {
    pub url: String,
    pub kind: AttemptKind,
}

impl AttemptError {
    /// A retryable failure.
    pub fn retry(url: &str, failure: Failure, reason: impl Into<String>) -> Self {
        AttemptError {
            url: url.to_string(),
            kind: AttemptKind::Retry(failure, reason.into()),
        }
    }

    /// A fatal failure.
    pub fn fatal(url: &str, e: Error) -> Self {
        AttemptError {
            url: url.to_string(),
            kind: AttemptKind::Fatal(Box::new(e)),
        }
    }

    /// The error to report after `attempts` attempts.
    pub fn into_error(self, attempts: u32) -> Error {
        match self.kind {
            AttemptKind::Fatal(e) => *e,
            AttemptKind::Retry(Failure::Status { status, .. }, _) => Error::HttpStatus {
                url: self.url,
                status,
                attempts,
            },
            AttemptKind::Retry(_, reason) => Error::Network {
                url: self.url,
                attempts,
                reason,
            },
        }
    }
}

/// Classify a transport error.
pub fn transport_failure(url: &str, e: &reqwest::Error) -> AttemptError {
    let failure = if e.is_timeout() {
        Failure::Timeout
    } else if e.is_body() || e.is_decode() {
        Failure::BodyCut
    } else {
        Failure::Connect
    };
    AttemptError::retry(url, failure, error_chain(e))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Map a non-success status to an attempt error. `hint` is added to 401/403/404 messages.
pub fn status_failure(url: &str, status: StatusCode, headers: &HeaderMap, hint: &str) -> AttemptError {
    let code = status.as_u16();
    match code {
        404 => AttemptError::fatal(
            url,
            Error::NotFound {
                url: url.into(),
                hint: hint_suffix(hint),
            },
        ),
        401 | 403 => AttemptError::fatal(
            url,
            Error::Unauthorized {
                url: url.into(),
                status: code,
                hint: if hint.is_empty() {
                    "check the credentials".into()
                } else {
                    hint.into()
                },
            },
        ),
        _ => {
            let failure = Failure::Status {
                status: code,
                retry_after: retry_after(headers),
            };
            if failure.is_retryable() {
                AttemptError::retry(url, failure, format!("HTTP {code}"))
            } else {
                AttemptError::fatal(
                    url,
                    Error::HttpStatus {
                        url: url.into(),
                        status: code,
                        attempts: 1,
                    },
                )
            }
        }
    }
}

fn hint_suffix(hint: &str) -> String {
    if hint.is_empty() {
        String::new()
    } else {
        format!("; {hint}")
    }
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// Parse `bytes START-END/TOTAL` (pure).
pub fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let total = if total == "*" {
        None
    } else {
        Some(total.parse().ok()?)
    };
    Some((a.parse().ok()?, b.parse().ok()?, total))
}

/// One ranged GET of `range` (non-empty) of a `total`-byte resource. The returned stream yields
/// exactly `range.end - range.start` bytes or fails; bytes beyond that are a protocol error.
pub async fn get_range(
    client: &Client,
    url: &str,
    bearer: Option<&str>,
    range: Range<u64>,
    total: u64,
    hint: &str,
    pinned_header: Option<(&str, &str)>,
) -> Result<ByteStream, AttemptError> {
    let mut req = client
        .get(url)
        .header(RANGE, format!("bytes={}-{}", range.start, range.end - 1));
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.map_err(|e| transport_failure(url, &e))?;
    let status = resp.status();
    let protocol = |reason: String| {
        AttemptError::fatal(
            url,
            Error::Protocol {
                url: url.into(),
                reason,
            },
        )
    };
    if let Some((name, want)) = pinned_header
        && let Some(got) = resp.headers().get(name).and_then(|v| v.to_str().ok())
        && got != want
    {
        return Err(protocol(format!(
            "{name} is {got}, but this install is pinned to {want}: the source changed"
        )));
    }
    match status {
        StatusCode::PARTIAL_CONTENT => {
            let cr = resp
                .headers()
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let want = (range.start, range.end - 1, Some(total));
            if parse_content_range(cr) != Some(want) {
                return Err(protocol(format!(
                    "asked for bytes {}-{} of {total}, got Content-Range `{cr}` (did the file change?)",
                    range.start,
                    range.end - 1
                )));
            }
        }
        StatusCode::OK if range.start == 0 => {
            if resp.content_length().is_some_and(|n| n != total) {
                return Err(protocol(format!(
                    "expected {total} bytes, server announced {:?}",
                    resp.content_length()
                )));
            }
        }
        StatusCode::OK => return Err(protocol("the server ignored the Range header".into())),
        StatusCode::RANGE_NOT_SATISFIABLE => {
            return Err(protocol(format!(
                "range {}-{} not satisfiable: the file is not {total} bytes",
                range.start, range.end
            )));
        }
        _ => return Err(status_failure(url, status, resp.headers(), hint)),
    }
    Ok(limit_stream(url, resp, range.end - range.start))
}

/// Body stream limited to `len` bytes (the rest of a 200 response is dropped).
fn limit_stream(url: &str, resp: reqwest::Response, len: u64) -> ByteStream {
    let url = url.to_string();
    let mut left = len;
    let s = resp
        .bytes_stream()
        .map(move |r| r.map_err(|e| transport_failure(&url, &e)))
        .take_while(move |r| {
            let keep = left > 0;
            if let Ok(b) = r {
                left = left.saturating_sub(b.len() as u64);
            }
            futures_util::future::ready(keep)
        });
    Box::pin(s)
}

/// GET `url` and return its body (for small JSON documents), retrying per `policy`. Returns the
/// body and the response headers.
pub async fn get_small(
    client: &Client,
    url: &str,
    bearer: Option<&str>,
    policy: &RetryPolicy,
    hint: &str,
) -> Result<(Vec<u8>, HeaderMap)> {
    let mut failures = 0;
    loop {
        let attempt = async {
            let mut req = client.get(url);
            if let Some(t) = bearer {
                req = req.bearer_auth(t);
            }
            let resp = req.send().await.map_err(|e| transport_failure(url, &e))?;
            if !resp.status().is_success() {
                return Err(status_failure(url, resp.status(), resp.headers(), hint));
            }
            let headers = resp.headers().clone();
            let body = resp.bytes().await.map_err(|e| transport_failure(url, &e))?;
            Ok((body.to_vec(), headers))
        };
        match attempt.await {
            Ok(r) => return Ok(r),
            Err(e) => {
                failures += 1;
                let delay = match &e.kind {
                    AttemptKind::Retry(f, _) => policy.delay(failures, f, jitter_sample()),
                    AttemptKind::Fatal(_) => None,
                };
                match delay {
                    Some(d) => tokio::time::sleep(d).await,
                    None => return Err(e.into_error(failures)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_parsing() {
        assert_eq!(parse_content_range("bytes 0-99/1000"), Some((0, 99, Some(1000))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, 9, None)));
        assert_eq!(parse_content_range("items 0-1/2"), None);
        assert_eq!(parse_content_range("bytes x-1/2"), None);
    }

    #[test]
    fn statuses_map_to_fatal_or_retry() {
        let h = HeaderMap::new();
        let k = |s: u16| status_failure("u", StatusCode::from_u16(s).unwrap(), &h, "set HF_TOKEN").kind;
        assert!(matches!(k(404), AttemptKind::Fatal(e) if matches!(*e, Error::NotFound { .. })));
        assert!(matches!(k(401), AttemptKind::Fatal(e) if matches!(*e, Error::Unauthorized { .. })));
        assert!(matches!(k(403), AttemptKind::Fatal(e) if matches!(*e, Error::Unauthorized { .. })));
        assert!(matches!(k(400), AttemptKind::Fatal(e) if matches!(*e, Error::HttpStatus { .. })));
        assert!(matches!(
            k(429),
            AttemptKind::Retry(Failure::Status { status: 429, .. }, _)
        ));
        assert!(matches!(k(503), AttemptKind::Retry(..)));
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, "12".parse().unwrap());
        let e = status_failure("u", StatusCode::TOO_MANY_REQUESTS, &h, "");
        assert!(
            matches!(e.kind, AttemptKind::Retry(Failure::Status { retry_after: Some(d), .. }, _) if d.as_secs() == 12)
        );
    }
}
