//! Anthropic-shaped errors: every [`ApiError`] keeps its HTTP status (the one mapping in
//! `error.rs`) and headers, but its body becomes Anthropic's
//! `{"type": "error", "error": {"type", "message"}}`, and in a stream the same object is the
//! data of an `event: error`.

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::http::error::ApiError;

/// An [`ApiError`] rendered for the Messages API.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl AnthropicError {
    /// Anthropic's error `type` for this failure.
    pub fn kind(&self) -> &'static str {
        match &self.0 {
            ApiError::Unauthorized => "authentication_error",
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) => "not_found_error",
            ApiError::PayloadTooLarge { .. } => "request_too_large",
            ApiError::Busy { .. } => "rate_limit_error",
            ApiError::Loading | ApiError::ShuttingDown => "overloaded_error",
            ApiError::Internal(_) | ApiError::WeightsUnavailable(_) => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The message; the 401 names Anthropic's header as well as the bearer one.
    fn message(&self) -> String {
        match &self.0 {
            ApiError::Unauthorized => {
                "missing or incorrect API key: send `x-api-key: <key>` or `Authorization: Bearer <key>`"
                    .to_string()
            }
            e => e.to_string(),
        }
    }

    /// `{"type": "error", "error": {"type", "message"}}`.
    pub fn body(&self) -> Value {
        json!({"type": "error", "error": {"type": self.kind(), "message": self.message()}})
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let body = self.body().to_string();
        // The OpenAI rendering carries the status, `Retry-After` / `WWW-Authenticate` and the
        // logging extension; only the body is replaced.
        let (mut parts, _) = self.0.into_response().into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        Response::from_parts(parts, Body::from(body))
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    #[test]
    fn bodies_are_anthropic_shaped_and_keep_the_status() {
        let e = AnthropicError(ApiError::field("max_tokens", "`max_tokens` is required"));
        assert_eq!(
            e.body(),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "`max_tokens` is required"}})
        );
        let r = AnthropicError(ApiError::Busy {
            in_flight: 1,
            retry_after: 1,
        })
        .into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(
            AnthropicError(ApiError::Unauthorized).kind(),
            "authentication_error"
        );
        assert_eq!(AnthropicError(ApiError::Loading).kind(), "overloaded_error");
    }
}
