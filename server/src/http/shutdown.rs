//! The accept loop and graceful shutdown. Each accepted connection is served by
//! [`crate::http::conn`] (its first request head is checked before hyper reads it). On
//! SIGTERM/SIGINT the drain begins: readiness turns off, idle keep-alive connections close, and
//! the listener keeps accepting, so that `/readyz` answers 503 `draining` and other new requests
//! a 503 `shutting_down` with `Connection: close` ([`crate::http::routes`]), instead of connections
//! being refused. The drain ends when every connection that had started a request when it
//! began has closed (in-flight requests finish normally); then the listener closes, silent
//! connections close, and the rest get to finish. If that all takes longer than the deadline,
//! what is left in the engine is cancelled (those streams end with an error event) and the
//! server gets a short grace to flush.

use std::future::Future;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::http::conn::{Phase, Watch, reached};
use crate::http::guard::HttpLimits;
use crate::http::routes::app;
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

/// Serve `state` on `listener` with the default [`HttpLimits`] until `shutdown` completes, then
/// drain within `deadline`.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    deadline: Duration,
) -> std::io::Result<()> {
    serve_with(listener, state, shutdown, deadline, HttpLimits::default()).await
}

/// [`serve`] with explicit limits on request heads.
pub async fn serve_with(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    deadline: Duration,
    limits: HttpLimits,
) -> std::io::Result<()> {
    let (phase, mut rx) = watch::channel(Phase::Serving);
    let (draining, to_drain) = (state.clone(), phase.clone());
    let signal = tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutdown requested: draining in-flight requests");
        draining.begin_drain();
        to_drain.send_replace(Phase::Draining);
    });
    let mut server = tokio::spawn(accept_loop(listener, app(state.clone()), limits, phase));
    let result = drain(&mut server, &mut rx, &state, deadline).await;
    signal.abort();
    result
}

/// Wait for the server task through the drain, the deadline and the grace.
async fn drain(
    server: &mut tokio::task::JoinHandle<()>,
    rx: &mut watch::Receiver<Phase>,
    state: &AppState,
    deadline: Duration,
) -> std::io::Result<()> {
    tokio::select! {
        r = &mut *server => return finished(r),
        () = reached(rx, Phase::Draining) => {},
    }
    if let Ok(r) = tokio::time::timeout(deadline, &mut *server).await {
        return finished(r);
    }
    tracing::warn!(
        deadline_secs = deadline.as_secs_f64(),
        "drain deadline passed: cancelling in-flight requests"
    );
    if let Some(loaded) = state.loaded_any() {
        loaded.engine.cancel_all();
    }
    match tokio::time::timeout(GRACE, &mut *server).await {
        Ok(r) => finished(r),
        Err(_) => {
            server.abort();
            Ok(())
        }
    }
}

fn finished(r: Result<(), tokio::task::JoinError>) -> std::io::Result<()> {
    r.map_err(std::io::Error::other)
}

/// Accept and serve connections until the drain has ended, then wait for the connections left.
///
/// Each connection task holds a clone of `open` (all connections) and, if it was accepted before
/// the drain began, of `held` (what the drain waits for; a connection still silent when the
/// drain begins lets go of it); a `watch::Sender` reports `closed()` once every receiver is
/// gone, as `axum::serve` counts its connections.
async fn accept_loop(
    listener: TcpListener,
    app: axum::Router,
    limits: HttpLimits,
    phase: watch::Sender<Phase>,
) {
    let (open_tx, open_rx) = watch::channel(());
    let (held_tx, held_rx) = watch::channel(());
    let mut held_rx = Some(held_rx);
    let mut drain = phase.subscribe();
    loop {
        let draining = held_rx.is_none();
        let stream = tokio::select! {
            stream = accept(&listener) => stream,
            () = reached(&mut drain, Phase::Draining), if !draining => {
                held_rx = None;
                continue;
            }
            () = held_tx.closed(), if draining => break,
        };
        let open = open_rx.clone();
        let watch = Watch {
            phase: phase.subscribe(),
            holds_drain: held_rx.clone(),
        };
        let app = app.clone();
        tokio::spawn(async move {
            crate::http::conn::serve(stream, app, limits, watch).await;
            drop(open);
        });
    }
    drop(listener);
    phase.send_replace(Phase::Closing);
    tracing::info!("drain done: no longer accepting connections");
    drop(open_rx);
    open_tx.closed().await;
}

/// The next connection. Errors that concern one connection are skipped; others (out of file
/// descriptors, …) are logged and retried after a second, as `axum::serve` does.
async fn accept(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return stream,
            Err(e) if is_connection_error(&e) => {}
            Err(e) => {
                tracing::error!(error = %e, "accept failed; retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}
