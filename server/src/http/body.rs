//! The request-body extractor: bytes under `--max-request-bytes` (413 above), parsed as JSON
//! (400 otherwise: malformed JSON, invalid UTF-8, nesting beyond serde_json's depth limit).
//! Bodies are never decompressed: a `Content-Encoding` other than `identity` is a 415 before
//! the body is read. A body that ends before its `Content-Length` or its final chunk (the
//! client aborted it) is a 400 that says so, not a JSON error.

use std::error::Error as _;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_ENCODING;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

use crate::http::error::ApiError;
use crate::state::AppState;

/// A JSON request body.
#[derive(Debug)]
pub struct JsonBody(pub Value);

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        check_encoding(req.headers())?;
        let limit = state.config().max_request_bytes;
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| read_error(&e, limit))?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::InvalidJson(e.to_string()))
    }
}

/// 415 for any `Content-Encoding` but `identity`.
fn check_encoding(headers: &HeaderMap) -> Result<(), ApiError> {
    for value in headers.get_all(CONTENT_ENCODING) {
        let text = String::from_utf8_lossy(value.as_bytes());
        for coding in text.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if !coding.eq_ignore_ascii_case("identity") {
                return Err(ApiError::UnsupportedContentEncoding(
                    coding.chars().take(64).collect(),
                ));
            }
        }
    }
    Ok(())
}

/// The error for a body that could not be buffered.
fn read_error(e: &BytesRejection, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::PayloadTooLarge { limit };
    }
    if ended_early(e) {
        return ApiError::IncompleteBody;
    }
    ApiError::UnreadableBody(e.body_text())
}

/// Whether the error's source chain holds hyper's "ended before its length" body error (an
/// `UnexpectedEof` I/O error, for `Content-Length` and chunked bodies alike) or an incomplete
/// message.
fn ended_early(e: &BytesRejection) -> bool {
    let mut source = e.source();
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::UnexpectedEof
        {
            return true;
        }
        if err
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
        {
            return true;
        }
        source = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn any_content_encoding_but_identity_is_415() {
        let mut h = HeaderMap::new();
        assert_eq!(check_encoding(&h), Ok(()));
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("Identity"));
        assert_eq!(check_encoding(&h), Ok(()));
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        let e = check_encoding(&h).unwrap_err();
        assert_eq!(e.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(
            e.to_string()
                .contains("Content-Encoding `gzip` are not supported"),
            "{e}"
        );
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("identity, br"));
        assert_eq!(
            check_encoding(&h),
            Err(ApiError::UnsupportedContentEncoding("br".into()))
        );
    }
}
