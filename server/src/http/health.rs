//! Probes and the metrics endpoint.
//!
//! * `/livez` answers 200 whenever the process can serve HTTP (never queued behind the engine,
//!   and still 200 while draining) unless the engine loop has stopped or stalled with work
//!   waiting (503, so the kubelet restarts the pod).
//! * `/readyz` is 503 until the model is loaded (`"status": "unavailable"`), while the weights
//!   cannot be read as published (`"status": "degraded"`, the reason naming the file; 200 again
//!   once the file is whole and the failed range reads cleanly), and while draining (`"status":
//!   "draining"`: the listener keeps accepting during the drain so that probes see this). It
//!   stays 200 while busy: a full queue answers 429, it does not make the pod unready.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use deltafin_engine::scheduler::Stall;

use crate::http::error::ApiError;
use crate::state::AppState;

/// `GET /livez`: 200 while the process serves HTTP and the engine loop (once loaded) is live;
/// 503 when the loop has stopped or made no progress for `--liveness-stall` with requests in
/// flight ([`deltafin_engine::scheduler::SchedulerHandle::liveness`]).
pub async fn livez(State(app): State<AppState>) -> Response {
    let Some(loaded) = app.loaded_any() else {
        return Json(json!({"status": "ok"})).into_response();
    };
    match loaded.engine.liveness(app.config().liveness_stall) {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => {
            let status = match e {
                Stall::Stopped => "stopped",
                Stall::Stalled { .. } => "stalled",
            };
            tracing::error!(reason = %e, "liveness probe failing");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": status, "reason": e.to_string()})),
            )
                .into_response()
        }
    }
}

/// `GET /readyz`.
pub async fn readyz(State(app): State<AppState>) -> Response {
    let health = match app.loaded() {
        Ok(loaded) if loaded.engine.liveness(app.config().liveness_stall) == Err(Stall::Stopped) => {
            Err(ApiError::Internal("the engine loop has stopped"))
        }
        // Examining the shard files (and re-reading a failed range) touches the disk.
        Ok(loaded) => tokio::task::spawn_blocking(move || loaded.weights_health())
            .await
            .unwrap_or(Err(ApiError::Internal("health check"))),
        Err(e) => Err(e),
    };
    match health {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(e @ ApiError::WeightsUnavailable(_)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "degraded", "reason": e.to_string()})),
        )
            .into_response(),
        Err(e @ ApiError::ShuttingDown) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining", "reason": e.to_string()})),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "reason": e.to_string()})),
        )
            .into_response(),
    }
}

/// `GET /metrics` (Prometheus text format 0.0.4).
pub async fn metrics(State(app): State<AppState>) -> Response {
    let loaded = app.loaded_any();
    let engine = loaded.as_ref().map(|l| l.engine.stats().snapshot());
    let mut text = match loaded.as_ref().and_then(|l| l.ooc.as_deref()) {
        Some(rt) => app.metrics().render(engine, &crate::model::expert_io(rt)),
        None => app.metrics().render(engine, app.expert_io()),
    };
    let spec = loaded
        .as_ref()
        .map(|l| l.engine.stats().speculation())
        .unwrap_or_default();
    text.push_str(&crate::metrics::render_spec(&spec));
    if let Some(rt) = loaded.as_ref().and_then(|l| l.ooc.as_deref()) {
        text.push_str(&crate::metrics::render_weight_errors(&rt.reader.read_errors()));
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}
