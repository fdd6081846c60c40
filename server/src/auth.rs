//! Optional API key on `/v1/*`, sent as `Authorization: Bearer <key>` or, as Anthropic
//! clients send it, `x-api-key: <key>`. The key comes from `--api-key-file`; the comparison is
//! constant-time in the key's contents. A refusal on `/v1/messages*` has Anthropic's body shape. `/livez`, `/readyz` and `/metrics` stay open: probes and
//! Prometheus scrapers carry no key, and the metrics hold no prompt or output text (restrict
//! them with a network policy if their counts are sensitive).

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::anthropic::error::AnthropicError;
use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::state::AppState;

/// Whether `header` (an `Authorization` value) carries `key`.
pub fn authorized(header: Option<&[u8]>, key: &str) -> bool {
    let given = header
        .and_then(|h| h.strip_prefix(b"Bearer "))
        .unwrap_or_default();
    bool::from(given.ct_eq(key.as_bytes()))
}

/// Whether `value` (an `x-api-key` value) is exactly `key`.
pub fn api_key_matches(value: Option<&[u8]>, key: &str) -> bool {
    value.is_some_and(|v| bool::from(v.ct_eq(key.as_bytes())))
}

/// Whether `headers` carry `key`, as a bearer token or an `x-api-key`.
fn carries_key(headers: &HeaderMap, key: &str) -> bool {
    let bearer = authorized(headers.get(AUTHORIZATION).map(|v| v.as_bytes()), key);
    let x_api_key = api_key_matches(headers.get("x-api-key").map(|v| v.as_bytes()), key);
    bearer | x_api_key
}

/// Middleware: 401 unless the request carries the configured key.
pub async fn require_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.config().api_key
        && !carries_key(req.headers(), key)
    {
        let endpoint = match req.uri().path() {
            "/v1/chat/completions" => Endpoint::Chat,
            "/v1/completions" => Endpoint::Completions,
            p if p.starts_with("/v1/messages") => Endpoint::Messages,
            "/v1/responses" => Endpoint::Responses,
            _ => Endpoint::Models,
        };
        app.metrics().request(endpoint, "invalid");
        if endpoint == Endpoint::Messages {
            return AnthropicError(ApiError::Unauthorized).into_response();
        }
        return ApiError::Unauthorized.into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderMap;

    use super::{api_key_matches, authorized, carries_key};

    #[test]
    fn only_the_exact_bearer_key_passes() {
        assert!(authorized(Some(b"Bearer s3cret"), "s3cret"));
        for bad in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret2",
            b"bearer s3cret",
            b"s3cret",
            b"Bearer ",
            b"",
        ] {
            assert!(
                !authorized(Some(bad), "s3cret"),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(!authorized(None, "s3cret"));
    }

    #[test]
    fn an_x_api_key_header_also_passes() {
        assert!(api_key_matches(Some(b"s3cret"), "s3cret"));
        for bad in [&b"s3cre"[..], b"s3cret ", b"Bearer s3cret", b""] {
            assert!(!api_key_matches(Some(bad), "s3cret"));
        }
        assert!(!api_key_matches(None, "s3cret"));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "s3cret".parse().unwrap());
        assert!(carries_key(&h, "s3cret"));
        h.insert("x-api-key", "wrong".parse().unwrap());
        assert!(!carries_key(&h, "s3cret"));
        h.insert("authorization", "Bearer s3cret".parse().unwrap());
        assert!(
            carries_key(&h, "s3cret"),
            "a right bearer key passes beside a wrong x-api-key"
        );
    }
}
