//! The request-body extractor: bytes under `--max-request-bytes` (413 above), parsed as JSON
//! (400 otherwise: malformed JSON, invalid UTF-8, nesting beyond serde_json's depth limit).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde_json::Value;

use crate::error::ApiError;
use crate::state::AppState;

/// A JSON request body.
#[derive(Debug)]
pub struct JsonBody(pub Value);

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let limit = state.config().max_request_bytes;
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge { limit }
            } else {
                ApiError::InvalidJson(e.body_text())
            }
        })?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::InvalidJson(e.to_string()))
    }
}
