//! `ApiError`: every way a request can fail, and the ONE mapping from failure to HTTP status
//! and OpenAI-shaped body `{"error": {"message", "type", "param", "code"}}`. Messages name the
//! offending field and never carry internals (those are logged, not returned). Streams that
//! fail after their headers were sent carry the same object as an SSE `data:` event.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use deltafin_engine::scheduler::SubmitError;
use serde_json::{Value, json};

/// A failed request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The body is not valid JSON (or not UTF-8).
    #[error("invalid JSON body: {0}")]
    InvalidJson(String),
    /// A field is missing, has the wrong type or is out of range.
    #[error("{message}")]
    InvalidField { param: String, message: String },
    /// A field this server cannot honour exactly (fail closed).
    #[error("{message}")]
    Unsupported { param: String, message: String },
    /// Prompt (plus requested output) longer than the context limit.
    #[error("the prompt has {needed} tokens but the context limit is {limit} tokens")]
    ContextLength {
        param: &'static str,
        needed: usize,
        limit: usize,
    },
    /// The prompt's state does not fit in the context memory planned inside `--memory-budget`.
    #[error("{0}")]
    OverBudget(String),
    /// The context memory filled up while the request ran (others hold it); it was stopped.
    #[error("{0}")]
    MemoryExhausted(String),
    /// Missing or wrong bearer API key.
    #[error("missing or incorrect API key: send `Authorization: Bearer <key>`")]
    Unauthorized,
    /// `model` names a model this server does not serve.
    #[error("the model `{0}` does not exist; see GET /v1/models")]
    ModelNotFound(String),
    /// No such route.
    #[error("no route for {0}")]
    NotFound(String),
    /// The route exists with another method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Body over `--max-request-bytes`.
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// Batch and queue are full.
    #[error("the server is busy ({in_flight} requests in flight); retry after {retry_after} s")]
    Busy { in_flight: u64, retry_after: u64 },
    /// The model is still loading.
    #[error("the model is loading; retry when /readyz is 200")]
    Loading,
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The model's weights cannot be read as published right now (a shard truncated, replaced,
    /// unreadable, or failing its checksum). The message names the file; nothing was
    /// generated from bad bytes, and the request can be retried once `/readyz` is 200 again.
    #[error("{0}")]
    WeightsUnavailable(String),
    /// A failure inside the engine; the detail is logged, not returned.
    #[error("internal error ({0}); see the server log")]
    Internal(&'static str),
    /// The request head breaks HTTP/1.1 framing, size or timing rules; answered before routing
    /// (see [`crate::http::guard`]).
    #[error(transparent)]
    Http(#[from] crate::http::guard::HeadError),
    /// The body has a `Content-Encoding` (bodies are read as they are, never decompressed).
    #[error("request bodies with Content-Encoding `{0}` are not supported: send the JSON body uncompressed")]
    UnsupportedContentEncoding(String),
    /// The body ended before its `Content-Length` or its final chunk.
    #[error("the request body was incomplete: the client aborted it before its declared end")]
    IncompleteBody,
    /// The body could not be read for another reason (broken chunk framing, …).
    #[error("the request body could not be read: {0}")]
    UnreadableBody(String),
    /// Two or more instances of a credentials header (`Authorization`, `x-api-key`).
    #[error("the request has two or more {0} headers: send exactly one")]
    DuplicateCredentials(&'static str),
}

impl ApiError {
    /// An invalid field.
    pub fn field(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidField {
            param: param.into(),
            message: message.into(),
        }
    }

    /// An unsupported field.
    pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Unsupported {
            param: param.into(),
            message: message.into(),
        }
    }

    /// The same error with field names replaced (`(from, to)` pairs): an API surface that
    /// validates through the chat pipeline reports its own names (`text.format` for
    /// `response_format`, …).
    pub fn renamed(self, names: &[(&str, &str)]) -> Self {
        let rename = |param: String, message: String| match names.iter().find(|(from, _)| param == *from) {
            Some((from, to)) => (to.to_string(), message.replace(from, to)),
            None => (param, message),
        };
        match self {
            ApiError::InvalidField { param, message } => {
                let (param, message) = rename(param, message);
                ApiError::InvalidField { param, message }
            }
            ApiError::Unsupported { param, message } => {
                let (param, message) = rename(param, message);
                ApiError::Unsupported { param, message }
            }
            e => e,
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson(_)
            | ApiError::InvalidField { .. }
            | ApiError::Unsupported { .. }
            | ApiError::ContextLength { .. }
            | ApiError::OverBudget(_) => StatusCode::BAD_REQUEST,
            ApiError::MemoryExhausted(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Loading | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) | ApiError::WeightsUnavailable(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Http(e) => e.status(),
            ApiError::UnsupportedContentEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::IncompleteBody | ApiError::UnreadableBody(_) | ApiError::DuplicateCredentials(_) => {
                StatusCode::BAD_REQUEST
            }
        }
    }

    /// The `outcome` label of `deltafin_requests_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            ApiError::Busy { .. } => "busy",
            e if e.status().is_client_error() => "invalid",
            _ => "error",
        }
    }

    fn kind(&self) -> (&'static str, Option<&str>, Option<&'static str>) {
        match self {
            ApiError::InvalidJson(_) => ("invalid_request_error", None, Some("invalid_json")),
            ApiError::InvalidField { param, .. } => {
                ("invalid_request_error", Some(param), Some("invalid_value"))
            }
            ApiError::Unsupported { param, .. } => (
                "invalid_request_error",
                Some(param),
                Some("unsupported_parameter"),
            ),
            ApiError::ContextLength { param, .. } => (
                "invalid_request_error",
                Some(param),
                Some("context_length_exceeded"),
            ),
            ApiError::OverBudget(_) => (
                "invalid_request_error",
                Some("messages"),
                Some("context_length_exceeded"),
            ),
            ApiError::MemoryExhausted(_) => ("server_error", None, Some("context_memory_exhausted")),
            ApiError::Unauthorized => ("invalid_request_error", None, Some("invalid_api_key")),
            ApiError::ModelNotFound(_) => ("invalid_request_error", Some("model"), Some("model_not_found")),
            ApiError::NotFound(_) => ("invalid_request_error", None, Some("not_found")),
            ApiError::MethodNotAllowed => ("invalid_request_error", None, Some("method_not_allowed")),
            ApiError::PayloadTooLarge { .. } => ("invalid_request_error", None, Some("payload_too_large")),
            ApiError::Busy { .. } => ("rate_limit_error", None, Some("server_busy")),
            ApiError::Loading => ("server_error", None, Some("model_loading")),
            ApiError::ShuttingDown => ("server_error", None, Some("shutting_down")),
            ApiError::Internal(_) => ("server_error", None, Some("internal_error")),
            ApiError::WeightsUnavailable(_) => ("server_error", None, Some("weights_unavailable")),
            ApiError::Http(e) => ("invalid_request_error", None, Some(e.code())),
            ApiError::UnsupportedContentEncoding(_) => (
                "invalid_request_error",
                None,
                Some("unsupported_content_encoding"),
            ),
            ApiError::IncompleteBody => ("invalid_request_error", None, Some("incomplete_body")),
            ApiError::UnreadableBody(_) => ("invalid_request_error", None, Some("unreadable_body")),
            ApiError::DuplicateCredentials(_) => {
                ("invalid_request_error", None, Some("duplicate_credentials"))
            }
        }
    }

    /// The OpenAI-shaped error object.
    pub fn body(&self) -> Value {
        let (kind, param, code) = self.kind();
        json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Busy { in_flight, .. } => ApiError::Busy {
                in_flight,
                retry_after: 1,
            },
            SubmitError::Stopped => ApiError::ShuttingDown,
            SubmitError::Invalid(deltafin_engine::Error::ContextOverflow { needed, limit }) => {
                ApiError::ContextLength {
                    param: "messages",
                    needed,
                    limit,
                }
            }
            SubmitError::Invalid(deltafin_engine::Error::InvalidArgument { field, reason }) => {
                ApiError::field(field, format!("`{field}` {reason}"))
            }
            SubmitError::Invalid(deltafin_engine::Error::Budget(message)) => ApiError::OverBudget(message),
            SubmitError::Invalid(_) => ApiError::Internal("engine"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        match &self {
            ApiError::Busy { retry_after, .. } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
            }
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::Loading | ApiError::ShuttingDown => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            }
            _ => {}
        }
        response.extensions_mut().insert(self);
        response
    }
}

/// The `param` an error's body names (tests of the request validators).
#[cfg(test)]
pub(crate) fn param_of(e: ApiError) -> String {
    e.body()["error"]["param"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_openai_shaped_and_name_the_field() {
        let e = ApiError::unsupported("logit_bias", "`logit_bias` is not supported");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let expected: Value = serde_json::from_str(
            r#"{"error":{"message":"`logit_bias` is not supported","type":"invalid_request_error","param":"logit_bias","code":"unsupported_parameter"}}"#,
        )
        .unwrap();
        assert_eq!(e.body(), expected);
        assert_eq!(
            ApiError::Busy {
                in_flight: 3,
                retry_after: 1
            }
            .outcome(),
            "busy"
        );
        assert_eq!(ApiError::PayloadTooLarge { limit: 1 }.outcome(), "invalid");
        assert_eq!(ApiError::Internal("x").outcome(), "error");
    }

    #[test]
    fn busy_sets_retry_after_and_unauthorized_sets_www_authenticate() {
        let r = ApiError::Busy {
            in_flight: 2,
            retry_after: 1,
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = ApiError::Unauthorized.into_response();
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
