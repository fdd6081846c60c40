//! Optional bearer API key on `/v1/*`. The key comes from `--api-key-file`; the comparison is
//! constant-time in the key's contents. `/livez`, `/readyz` and `/metrics` stay open: probes and
//! Prometheus scrapers carry no key, and the metrics hold no prompt or output text (restrict
//! them with a network policy if their counts are sensitive).

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

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

/// Middleware: 401 unless the request carries the configured key.
pub async fn require_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.config().api_key
        && !authorized(req.headers().get(AUTHORIZATION).map(|v| v.as_bytes()), key)
    {
        let endpoint = match req.uri().path() {
            "/v1/chat/completions" => Endpoint::Chat,
            "/v1/completions" => Endpoint::Completions,
            _ => Endpoint::Models,
        };
        app.metrics().request(endpoint, "invalid");
        return ApiError::Unauthorized.into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::authorized;

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
}
