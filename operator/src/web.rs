//! The operator's HTTP endpoints: `/metrics`, `/livez`, `/readyz`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// What the endpoints read.
#[derive(Clone, Debug)]
pub struct WebState {
    /// Operator metrics.
    pub metrics: Arc<Metrics>,
    /// True while the controller watches (after the CRD check).
    pub ready: Arc<AtomicBool>,
}

/// The route table.
pub fn router(state: WebState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(s): State<WebState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

async fn readyz(State(s): State<WebState>) -> impl IntoResponse {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(app: Router, path: &str) -> (StatusCode, String) {
        let resp = app
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn health_and_metrics() {
        let state = WebState {
            metrics: Arc::new(Metrics::default()),
            ready: Arc::new(AtomicBool::new(false)),
        };
        let app = router(state.clone());
        assert_eq!(get(app.clone(), "/livez").await.0, StatusCode::OK);
        assert_eq!(
            get(app.clone(), "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        state.ready.store(true, Ordering::SeqCst);
        assert_eq!(get(app.clone(), "/readyz").await.0, StatusCode::OK);
        drop(state.metrics.reconcile());
        let (code, body) = get(app, "/metrics").await;
        assert_eq!(code, StatusCode::OK);
        assert!(
            body.contains("deltafin_operator_reconciliations_total 1"),
            "{body}"
        );
        assert!(body.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF");
    }
}
