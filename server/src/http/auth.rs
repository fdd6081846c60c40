//! Optional API key on `/v1/*`, sent as `Authorization: Bearer <key>` or, as Anthropic
//! clients send it, `x-api-key: <key>`. The key comes from `--api-key-file`; the comparison is
//! constant-time in the key's contents. The scheme is case-insensitive and may be followed by
//! any run of spaces or tabs (RFC 9110 §11.1, §11.4). A request on `/v1/*` with two
//! `Authorization` (or two `x-api-key`) headers is a 400 whether or not a key is configured:
//! the credentials are ambiguous. A refusal on `/v1/messages*` has Anthropic's body shape.
//! `/livez`, `/readyz` and `/metrics` stay open: probes and Prometheus scrapers carry no key, and
//! the metrics hold no prompt or output text (restrict them with a network policy if their
//! counts are sensitive).

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::http::anthropic::error::AnthropicError;
use crate::http::error::ApiError;
use crate::metrics::Endpoint;
use crate::state::AppState;

/// The token of a `Bearer` credential (`<scheme> 1*SP/HTAB <token>`, scheme in any case).
fn bearer_token(header: &[u8]) -> Option<&[u8]> {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let split = header.iter().position(blank)?;
    let (scheme, rest) = header.split_at(split);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let start = rest.iter().position(|b| !blank(b))?;
    let end = rest.iter().rposition(|b| !blank(b))? + 1;
    Some(&rest[start..end])
}

/// Whether `header` (an `Authorization` value) carries `key`.
pub fn authorized(header: Option<&[u8]>, key: &str) -> bool {
    let given = header.and_then(bearer_token).unwrap_or_default();
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

/// The credentials header sent more than once, if any.
fn duplicated_credentials(headers: &HeaderMap) -> Option<&'static str> {
    [
        ("Authorization", AUTHORIZATION.as_str()),
        ("x-api-key", "x-api-key"),
    ]
    .into_iter()
    .find(|(_, name)| headers.get_all(*name).iter().nth(1).is_some())
    .map(|(shown, _)| shown)
}

/// The metrics endpoint of an API path (`/v1/models` for anything unknown).
pub(crate) fn endpoint_of(path: &str) -> Endpoint {
    match path {
        "/v1/chat/completions" => Endpoint::Chat,
        "/v1/completions" => Endpoint::Completions,
        p if p.starts_with("/v1/messages") => Endpoint::Messages,
        "/v1/responses" => Endpoint::Responses,
        _ => Endpoint::Models,
    }
}

/// `e` for the API surface at `path` (Anthropic's body shape on `/v1/messages*`), counted in the
/// request metrics.
pub(crate) fn refuse(app: &AppState, path: &str, e: ApiError) -> Response {
    let endpoint = endpoint_of(path);
    app.metrics().request(endpoint, e.outcome());
    if endpoint == Endpoint::Messages {
        return AnthropicError(e).into_response();
    }
    e.into_response()
}

/// Middleware: 400 on duplicated credentials, 401 unless the request carries the configured key.
pub async fn require_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(header) = duplicated_credentials(req.headers()) {
        return refuse(&app, req.uri().path(), ApiError::DuplicateCredentials(header));
    }
    if let Some(key) = &app.config().api_key
        && !carries_key(req.headers(), key)
    {
        return refuse(&app, req.uri().path(), ApiError::Unauthorized);
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderMap;

    use super::{api_key_matches, authorized, carries_key, duplicated_credentials};

    #[test]
    fn only_the_exact_bearer_key_passes() {
        for good in [
            &b"Bearer s3cret"[..],
            b"bearer s3cret",
            b"BEARER s3cret",
            b"Bearer   s3cret",
            b"bEaReR \t s3cret \t",
        ] {
            assert!(
                authorized(Some(good), "s3cret"),
                "{:?}",
                String::from_utf8_lossy(good)
            );
        }
        for bad in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret2",
            b"Bearers3cret",
            b"Basic s3cret",
            b"Bearer s3 cret",
            b"s3cret",
            b"Bearer ",
            b"Bearer",
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

    #[test]
    fn a_second_authorization_or_x_api_key_header_is_named() {
        let mut h = HeaderMap::new();
        h.append("authorization", "Bearer a".parse().unwrap());
        h.append("x-api-key", "a".parse().unwrap());
        assert_eq!(duplicated_credentials(&h), None);
        h.append("authorization", "Bearer b".parse().unwrap());
        assert_eq!(duplicated_credentials(&h), Some("Authorization"));
        h.remove("authorization");
        h.append("x-api-key", "b".parse().unwrap());
        assert_eq!(duplicated_credentials(&h), Some("x-api-key"));
    }
}
