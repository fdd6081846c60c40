//! The whole route table, on one screen. While the server drains (after SIGTERM) the probes
//! and `/metrics` still run (`/readyz` says 503 `draining`), every other new request is a 503
//! `shutting_down`, and every response carries `Connection: close`; requests that were already
//! running are not affected (see [`crate::http::shutdown`]).

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::CONNECTION;
use axum::http::{HeaderValue, Uri, Version};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use crate::http::anthropic::{count_tokens, messages};
use crate::http::auth::{refuse, require_key};
use crate::http::error::ApiError;
use crate::http::guard::{HeadError, HttpLimits, check_framing};
use crate::http::health::{livez, metrics, readyz};
use crate::http::openai::handlers::{chat_completions, completions, models};
use crate::http::responses::{ResponseStore, responses};
use crate::http::tokenize::{detokenize, tokenize};
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
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
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
        .layer(from_fn_with_state(state.clone(), while_draining))
        .layer(from_fn(every_head))
        .with_state(state)
}

/// Middleware: every request meets the rules the first head of a connection met before hyper
/// saw it ([`crate::http::guard`]): its target within the connection's URI limit (its
/// [`HttpLimits`], set by the accept loop; the defaults when served otherwise) and its body
/// framing unambiguous. hyper alone parses a later request on a kept-alive connection; this
/// makes the rules the same for it. A refused request closes its connection.
async fn every_head(req: Request, next: Next) -> Response {
    let limits = req.extensions().get::<HttpLimits>().copied().unwrap_or_default();
    let limit = limits.max_uri_bytes;
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    let framing = check_framing(
        req.version() == Version::HTTP_11,
        req.headers().iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
    );
    let refused = match framing {
        _ if target > limit => Some(HeadError::UriTooLong { limit }),
        Err(e) => Some(e),
        Ok(()) => None,
    };
    let Some(e) = refused else {
        return next.run(req).await;
    };
    tracing::debug!(status = e.status().as_u16(), error = %e, "request head refused");
    let mut response = ApiError::Http(e).into_response();
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Middleware: once draining, only the probes and `/metrics` run, and every connection closes
/// after its response.
async fn while_draining(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if !matches!(app.loaded(), Err(ApiError::ShuttingDown)) {
        return next.run(req).await;
    }
    let path = req.uri().path().to_owned();
    let mut response = match path.as_str() {
        "/livez" | "/readyz" | "/metrics" => next.run(req).await,
        _ => refuse(&app, &path, ApiError::ShuttingDown),
    };
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(uri.path().chars().take(128).collect())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
