//! Graceful shutdown: on SIGTERM/SIGINT stop accepting connections and turn readiness off, let
//! in-flight requests finish for up to a deadline, then cancel what is left in the engine (their
//! streams end with an error event) and give the server a short grace to flush.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::routes::app;
use crate::state::AppState;

/// Completes on SIGTERM or SIGINT.
pub async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// How long to flush once in-flight work was cancelled.
const GRACE: Duration = Duration::from_secs(5);

/// Serve `state` on `listener` until `shutdown` completes, then drain within `deadline`.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    deadline: Duration,
) -> std::io::Result<()> {
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let draining = state.clone();
    let graceful = async move {
        shutdown.await;
        tracing::info!("shutdown requested: draining in-flight requests");
        draining.begin_drain();
        let _ = tx.send(true);
    };
    let server = axum::serve(listener, app(state.clone())).with_graceful_shutdown(graceful);
    let mut server = tokio::spawn(server.into_future());
    tokio::select! {
        r = &mut server => return r.unwrap_or(Ok(())),
        _ = rx.wait_for(|&d| d) => {},
    }
    if let Ok(r) = tokio::time::timeout(deadline, &mut server).await {
        return r.unwrap_or(Ok(()));
    }
    tracing::warn!(
        deadline_secs = deadline.as_secs_f64(),
        "drain deadline passed: cancelling in-flight requests"
    );
    if let Some(loaded) = state.loaded_any() {
        loaded.engine.cancel_all();
    }
    match tokio::time::timeout(GRACE, &mut server).await {
        Ok(r) => r.unwrap_or(Ok(())),
        Err(_) => {
            server.abort();
            Ok(())
        }
    }
}
