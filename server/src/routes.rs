//! The whole route table, on one screen.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::Uri;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::{Extension, Router};

use crate::anthropic::{count_tokens, messages};
use crate::auth::require_key;
use crate::error::ApiError;
use crate::health::{livez, metrics, readyz};
use crate::openai::handlers::{chat_completions, completions, models};
use crate::responses::{ResponseStore, responses};
use crate::state::AppState;

/// The server's router over `state`.
pub fn app(state: AppState) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/responses", post(responses))
        .layer(Extension(Arc::new(ResponseStore::default())))
        .route_layer(from_fn_with_state(state.clone(), require_key));
    Router::new()
        .merge(api)
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config().max_request_bytes))
        .with_state(state)
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(uri.path().chars().take(128).collect())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
