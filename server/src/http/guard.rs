//! The request-head check that runs before hyper sees a connection: limits on the head
//! ([`HttpLimits`]), the pure check of the bytes read so far ([`check_head`]), and the complete
//! HTTP/1.1 rejection ([`rejection`]) with an OpenAI-shaped JSON body and `Connection: close`.
//!
//! hyper answers a head it cannot accept with an empty body; this check refuses those heads
//! first, with a body that says why (RFC 9112 statuses):
//!
//! | head | status |
//! |---|---|
//! | malformed request line or header line | 400 |
//! | HTTP version other than 1.0 / 1.1 | 505 |
//! | non-numeric or conflicting `Content-Length` | 400 |
//! | `Transfer-Encoding` with `Content-Length`, on HTTP/1.0, or not ending in `chunked` | 400 |
//! | a transfer coding other than `chunked` (`gzip, chunked`) | 501 |
//! | request target over [`HttpLimits::max_uri_bytes`] | 414 |
//! | head over [`HttpLimits::max_head_bytes`] or more than [`HttpLimits::max_headers`] lines | 431 |
//! | head not complete within [`HttpLimits::header_read_timeout`] | 408 |
//!
//! Every first head hyper would refuse, this check refuses first: it uses the same httparse
//! parser in its default (strict) configuration, the same header-count and head-size bounds,
//! the same URI parser, and `Content-Length` / `Transfer-Encoding` rules that are stricter than
//! hyper's. So a head that passes is never refused afterwards with an empty body.

use std::time::Duration;

use axum::http::{StatusCode, Uri};

use crate::http::error::ApiError;

/// Largest request head (request line and headers) by default: 64 KiB.
pub const DEFAULT_MAX_HEAD_BYTES: usize = 64 << 10;
/// Longest request target by default: 8 KiB.
pub const DEFAULT_MAX_URI_BYTES: usize = 8 << 10;
/// Most header lines by default (hyper's own default).
pub const DEFAULT_MAX_HEADERS: usize = 100;
/// Time a client has to send a complete request head by default.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds on a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Largest head in bytes, request line included (431 above).
    pub max_head_bytes: usize,
    /// Longest request target in bytes (414 above).
    pub max_uri_bytes: usize,
    /// Most header lines (431 above).
    pub max_headers: usize,
    /// Time from accepting a connection (or from the end of the previous response on a
    /// keep-alive connection) to the end of the head (408 after it).
    pub header_read_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_head_bytes: DEFAULT_MAX_HEAD_BYTES,
            max_uri_bytes: DEFAULT_MAX_URI_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        }
    }
}

/// Why a request head was refused before routing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeadError {
    /// The request line is not `METHOD target HTTP/1.x`.
    #[error("malformed request line: expected `METHOD /path HTTP/1.1`")]
    RequestLine,
    /// An HTTP version this server does not speak.
    #[error("unsupported HTTP version: this server speaks HTTP/1.1 and HTTP/1.0")]
    Version,
    /// A header line that is not `name: value`.
    #[error("malformed header line ({0})")]
    HeaderLine(&'static str),
    /// The request target does not parse as a URI.
    #[error("the request target is not a valid URI")]
    InvalidUri,
    /// A `Content-Length` that is not a non-negative decimal integer.
    #[error("invalid Content-Length `{0}`: expected a non-negative decimal integer")]
    BadContentLength(String),
    /// Two `Content-Length` headers with different values.
    #[error("conflicting Content-Length headers ({0} and {1}): send one")]
    ConflictingContentLength(u64, u64),
    /// Both framings at once (a request-smuggling shape).
    #[error("a request may not carry both Transfer-Encoding and Content-Length")]
    LengthAndTransferEncoding,
    /// `Transfer-Encoding` on an HTTP/1.0 request.
    #[error("Transfer-Encoding is not allowed on an HTTP/1.0 request")]
    TransferEncodingHttp10,
    /// A `Transfer-Encoding` whose final coding is not `chunked` (or that repeats it).
    #[error("invalid Transfer-Encoding `{0}`: chunked must be the final transfer coding, applied once")]
    ChunkedNotFinal(String),
    /// A transfer coding other than `chunked`.
    #[error(
        "the transfer coding `{0}` is not implemented: send the body with `Transfer-Encoding: chunked` alone or with Content-Length"
    )]
    UnsupportedTransferCoding(String),
    /// The request target is too long.
    #[error("the request target is longer than the limit of {limit} bytes")]
    UriTooLong { limit: usize },
    /// The head is too large or has too many lines.
    #[error("the request headers are larger than the limit of {limit} bytes or {max_headers} header lines")]
    HeadersTooLarge { limit: usize, max_headers: usize },
    /// The head did not arrive in time.
    #[error("the request head was not received within {millis} ms")]
    Timeout { millis: u64 },
    /// The client closed its side before the head was complete.
    #[error("the connection closed before the request head was complete")]
    Truncated,
}

impl HeadError {
    /// The HTTP status (RFC 9112 / 9110).
    pub fn status(&self) -> StatusCode {
        match self {
            HeadError::Version => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            HeadError::UnsupportedTransferCoding(_) => StatusCode::NOT_IMPLEMENTED,
            HeadError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            HeadError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HeadError::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The error body's `code`.
    pub fn code(&self) -> &'static str {
        match self {
            HeadError::RequestLine => "malformed_request_line",
            HeadError::Version => "http_version_not_supported",
            HeadError::HeaderLine(_) => "malformed_header",
            HeadError::InvalidUri => "invalid_uri",
            HeadError::BadContentLength(_)
            | HeadError::ConflictingContentLength(..)
            | HeadError::LengthAndTransferEncoding
            | HeadError::TransferEncodingHttp10
            | HeadError::ChunkedNotFinal(_) => "invalid_message_framing",
            HeadError::UnsupportedTransferCoding(_) => "unsupported_transfer_coding",
            HeadError::UriTooLong { .. } => "uri_too_long",
            HeadError::HeadersTooLarge { .. } => "headers_too_large",
            HeadError::Timeout { .. } => "request_timeout",
            HeadError::Truncated => "incomplete_request_head",
        }
    }
}

/// What the bytes read so far on a connection amount to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadCheck {
    /// The head is not complete yet (and within the limits so far): read more.
    Partial,
    /// A complete, acceptable head of this many bytes (the rest is body or a pipelined request).
    Complete(usize),
    /// A head to refuse.
    Reject(HeadError),
}

/// Check `buf`, the bytes read so far from a new connection, against `limits`.
pub fn check_head(buf: &[u8], limits: &HttpLimits) -> HeadCheck {
    if let Some(e) = check_target_length(buf, limits) {
        return HeadCheck::Reject(e);
    }
    let mut headers = vec![httparse::EMPTY_HEADER; limits.max_headers];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len > limits.max_head_bytes => {
            HeadCheck::Reject(too_large(limits))
        }
        Ok(httparse::Status::Complete(len)) => match check_complete(&req) {
            Ok(()) => HeadCheck::Complete(len),
            Err(e) => HeadCheck::Reject(e),
        },
        Ok(httparse::Status::Partial) if buf.len() > limits.max_head_bytes => {
            HeadCheck::Reject(too_large(limits))
        }
        Ok(httparse::Status::Partial) => HeadCheck::Partial,
        Err(e) => HeadCheck::Reject(parse_error(e, limits)),
    }
}

/// [`check_head`] for a buffer that grew by the bytes from `fresh` on: it parses only when
/// those bytes could end the request line or the head (or the buffer is over the limit), so a
/// head trickled in a byte at a time costs linear time, not quadratic.
pub fn check_read(buf: &[u8], fresh: usize, limits: &HttpLimits) -> HeadCheck {
    let window = &buf[fresh.saturating_sub(3).min(buf.len())..];
    let head_may_end = window.windows(2).any(|w| w == b"\n\n") || window.windows(3).any(|w| w == b"\n\r\n");
    let line_ended = window.contains(&b'\n') && !buf[..fresh.min(buf.len())].contains(&b'\n');
    if head_may_end || line_ended || buf.len() > limits.max_head_bytes {
        return check_head(buf, limits);
    }
    match check_target_length(buf, limits) {
        Some(e) => HeadCheck::Reject(e),
        None => HeadCheck::Partial,
    }
}

fn too_large(limits: &HttpLimits) -> HeadError {
    HeadError::HeadersTooLarge {
        limit: limits.max_head_bytes,
        max_headers: limits.max_headers,
    }
}

/// 414 as soon as the target (complete or not) is over the limit, before waiting for the rest.
fn check_target_length(buf: &[u8], limits: &HttpLimits) -> Option<HeadError> {
    // httparse skips empty lines before the request line; so does this.
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n')?;
    let line = &buf[start..];
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let first_space = line.iter().position(|&b| b == b' ')?;
    let rest = &line[first_space + 1..];
    let target = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
    (target > limits.max_uri_bytes).then_some(HeadError::UriTooLong {
        limit: limits.max_uri_bytes,
    })
}

fn parse_error(e: httparse::Error, limits: &HttpLimits) -> HeadError {
    match e {
        httparse::Error::Version => HeadError::Version,
        httparse::Error::TooManyHeaders => too_large(limits),
        httparse::Error::HeaderName => HeadError::HeaderLine("invalid header name"),
        httparse::Error::HeaderValue => HeadError::HeaderLine("invalid header value"),
        _ => HeadError::RequestLine,
    }
}

/// The checks on a complete head: a valid URI and unambiguous body framing.
fn check_complete(req: &httparse::Request<'_, '_>) -> Result<(), HeadError> {
    let path = req.path.ok_or(HeadError::RequestLine)?;
    Uri::try_from(path).map_err(|_| HeadError::InvalidUri)?;
    check_framing(
        req.version == Some(1),
        req.headers.iter().map(|h| (h.name, h.value)),
    )
}

/// Unambiguous body framing (RFC 9112 §6): `Content-Length` values all the same decimal number;
/// `Transfer-Encoding` only on HTTP/1.1, never with `Content-Length`, and exactly `chunked`.
/// The same rules for the first head on a connection ([`check_head`]) and for every later one
/// (the router's framing middleware), so hyper and this check never frame a body differently.
pub fn check_framing<'a>(
    http_11: bool,
    headers: impl Iterator<Item = (&'a str, &'a [u8])>,
) -> Result<(), HeadError> {
    let mut length: Option<u64> = None;
    let mut codings: Vec<String> = Vec::new();
    let mut has_te = false;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("content-length") {
            let n = parse_length(value)?;
            match length {
                Some(prev) if prev != n => return Err(HeadError::ConflictingContentLength(prev, n)),
                _ => length = Some(n),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            has_te = true;
            let value = String::from_utf8_lossy(value);
            codings.extend(
                value
                    .split(',')
                    .map(|c| c.trim().to_ascii_lowercase())
                    .filter(|c| !c.is_empty()),
            );
        }
    }
    if !has_te {
        return Ok(());
    }
    if !http_11 {
        return Err(HeadError::TransferEncodingHttp10);
    }
    if length.is_some() {
        return Err(HeadError::LengthAndTransferEncoding);
    }
    check_codings(&codings)
}

/// `Transfer-Encoding` must be exactly `chunked`: any other coding is 501 when `chunked` is
/// final (RFC 9112 §6.1: a coding the server does not understand), 400 when it is not (§6.3:
/// the body length cannot be determined).
fn check_codings(codings: &[String]) -> Result<(), HeadError> {
    let shown = || shorten(&codings.join(", "));
    let (last, before) = codings
        .split_last()
        .ok_or_else(|| HeadError::ChunkedNotFinal(String::new()))?;
    if last != "chunked" || before.iter().any(|c| c == "chunked") {
        return Err(HeadError::ChunkedNotFinal(shown()));
    }
    match before.first() {
        Some(other) => Err(HeadError::UnsupportedTransferCoding(shorten(other))),
        None => Ok(()),
    }
}

/// A `Content-Length` value: 1 to 19 ASCII digits (what hyper accepts, minus its overflow).
fn parse_length(value: &[u8]) -> Result<u64, HeadError> {
    let bad = || HeadError::BadContentLength(shorten(&String::from_utf8_lossy(value)));
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)
}

/// Client text echoed in a message, cut to 64 characters.
fn shorten(text: &str) -> String {
    text.chars().take(64).collect()
}

/// A complete HTTP/1.1 response refusing the head: status line, JSON body, `Connection: close`.
pub fn rejection(e: &HeadError) -> Vec<u8> {
    let status = e.status();
    let body = ApiError::Http(e.clone()).body().to_string();
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(head: &str) -> HeadCheck {
        check_head(head.as_bytes(), &HttpLimits::default())
    }

    fn rejected(head: &str) -> HeadError {
        match check(head) {
            HeadCheck::Reject(e) => e,
            other => panic!("{head:?} was not rejected: {other:?}"),
        }
    }

    #[test]
    fn a_plain_head_is_complete_and_a_cut_one_is_partial() {
        let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(check(head), HeadCheck::Complete(head.len() - 2));
        assert_eq!(check(&head[..20]), HeadCheck::Partial);
        assert_eq!(check(""), HeadCheck::Partial);
        let chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n";
        assert_eq!(check(chunked), HeadCheck::Complete(chunked.len()));
        let same = "POST / HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n";
        assert_eq!(
            check(same),
            HeadCheck::Complete(same.len()),
            "equal duplicates pass, as in hyper"
        );
    }

    #[test]
    fn framing_violations_are_400_and_unknown_codings_501() {
        let cases = [
            (
                "Content-Length: 5\r\nContent-Length: 6",
                400,
                "conflicting Content-Length",
            ),
            ("Content-Length: abc", 400, "invalid Content-Length `abc`"),
            ("Content-Length: -1", 400, "invalid Content-Length"),
            ("Content-Length: 5, 5", 400, "invalid Content-Length"),
            (
                "Content-Length: 99999999999999999999",
                400,
                "invalid Content-Length",
            ),
            (
                "Transfer-Encoding: gzip, chunked",
                501,
                "`gzip` is not implemented",
            ),
            (
                "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
                501,
                "not implemented",
            ),
            ("Transfer-Encoding: foo", 400, "chunked must be the final"),
            (
                "Transfer-Encoding: chunked, gzip",
                400,
                "chunked must be the final",
            ),
            ("Transfer-Encoding: chunked, chunked", 400, "applied once"),
            (
                "Transfer-Encoding: chunked\r\nContent-Length: 4",
                400,
                "both Transfer-Encoding",
            ),
        ];
        for (headers, status, phrase) in cases {
            let e = rejected(&format!("POST / HTTP/1.1\r\n{headers}\r\n\r\n"));
            assert_eq!(e.status().as_u16(), status, "{headers}: {e}");
            assert!(e.to_string().contains(phrase), "{headers}: {e}");
        }
        let e = rejected("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(e, HeadError::TransferEncodingHttp10);
    }

    #[test]
    fn size_limits_are_414_and_431_before_the_head_ends() {
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(DEFAULT_MAX_URI_BYTES + 10));
        assert_eq!(rejected(&long).status(), StatusCode::URI_TOO_LONG);
        assert_eq!(
            rejected(&long[..long.len() - 15]).status(),
            StatusCode::URI_TOO_LONG,
            "before the request line ends"
        );
        let at_limit = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(DEFAULT_MAX_URI_BYTES - 1));
        assert_eq!(check(&at_limit), HeadCheck::Complete(at_limit.len()));
        let big = format!(
            "GET / HTTP/1.1\r\nx-big: {}\r\n",
            "b".repeat(DEFAULT_MAX_HEAD_BYTES)
        );
        assert_eq!(
            rejected(&big).status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let many: String = (0..=DEFAULT_MAX_HEADERS)
            .map(|i| format!("x-{i}: 1\r\n"))
            .collect();
        let e = rejected(&format!("GET / HTTP/1.1\r\n{many}\r\n"));
        assert_eq!(e.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }

    #[test]
    fn garbage_is_a_malformed_request_line() {
        assert_eq!(rejected("HELLO\r\n\r\n"), HeadError::RequestLine);
        assert_eq!(rejected("GET /\r\n\r\n"), HeadError::RequestLine);
        assert_eq!(rejected("GET / HTTP/2.0\r\n\r\n"), HeadError::Version);
        assert!(matches!(
            rejected("GET / HTTP/1.1\r\nbad header\r\n\r\n"),
            HeadError::HeaderLine(_)
        ));
    }

    #[test]
    fn reading_in_pieces_gives_what_the_whole_head_gives() {
        let limits = HttpLimits::default();
        let long_uri = format!("GET /{} HTTP/1.1\r\n\r\n", "u".repeat(DEFAULT_MAX_URI_BYTES));
        let heads = [
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
            "\r\nGET / HTTP/1.1\r\n\r\n",
            "HELLO\r\n\r\n",
            "HELLO\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: foo\r\n\r\n",
            long_uri.as_str(),
        ];
        for head in heads {
            let bytes = head.as_bytes();
            let whole = check_head(bytes, &limits);
            let mut last = HeadCheck::Partial;
            for end in 1..=bytes.len() {
                last = check_read(&bytes[..end], end - 1, &limits);
                if last != HeadCheck::Partial {
                    break;
                }
            }
            assert_eq!(last, whole, "{head:?}");
        }
    }

    #[test]
    fn a_rejection_is_a_complete_response_with_an_openai_body() {
        let raw = String::from_utf8(rejection(&HeadError::UriTooLong { limit: 8 })).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "uri_too_long");
        assert!(v["error"]["param"].is_null());
        assert!(v["error"]["message"].as_str().unwrap().contains("8 bytes"));
    }
}
