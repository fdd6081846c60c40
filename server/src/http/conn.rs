//! One accepted connection: read and check its first request head ([`crate::http::guard`]),
//! refuse a bad one with a JSON response and close, or hand hyper a stream that replays the bytes
//! already read ([`Rewind`]) and then continues with the socket.
//!
//! Only the first head on a connection goes through this check. Later heads on a keep-alive
//! connection are read by hyper, configured with the same limits: the same head-size and
//! header-count bounds (431 above them), a URI bound of hyper's own 64 KiB (414), and the same
//! header-read timeout, which on a keep-alive connection also bounds the idle wait for the next
//! request (hyper closes the connection when it passes). hyper's refusals carry no body; a
//! client that keeps its connection open already sent one acceptable request on it.
//!
//! Draining ([`Phase`]): a connection still waiting for its first byte when the drain begins
//! stops holding the drain open but is still read, and any connection that sends its first
//! request during the drain is served without keep-alive (one response, then close), so
//! probes see `/readyz` say 503. A connection still silent when the listener closes is closed.
//! Connections in hyper's hands get hyper's graceful shutdown when the drain begins (an idle
//! keep-alive connection closes; a busy one closes after its response).

use std::io;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::http::guard::{HeadCheck, HeadError, HttpLimits, check_read, rejection};

/// Bytes asked of the socket per read while reading a head.
const READ_CHUNK: usize = 8 << 10;
/// After a refusal, what the client still sends is read and dropped for up to this long (and
/// [`LINGER_BYTES`]) before closing: closing a socket with unread data resets the connection,
/// and the reset can destroy the response before the client reads it.
const LINGER: Duration = Duration::from_secs(1);
/// See [`LINGER`].
const LINGER_BYTES: usize = 1 << 20;

/// Where the server is in its life, as the connections see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Accepting and serving.
    Serving,
    /// Shutdown requested: still accepting, new requests get 503, no keep-alive.
    Draining,
    /// The drain ended and the listener closed: silent connections close.
    Closing,
}

/// Completes once `phase` reaches `at_least` (never if the phase signal is gone before).
pub(crate) async fn reached(phase: &mut watch::Receiver<Phase>, at_least: Phase) {
    let rank = |p: Phase| p as u8;
    if phase.wait_for(|&p| rank(p) >= rank(at_least)).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What a connection task holds: the phase signal, and while the drain must wait for this
/// connection, a clone of the drain's receiver (dropping it releases the drain).
#[derive(Debug)]
pub(crate) struct Watch {
    pub phase: watch::Receiver<Phase>,
    pub holds_drain: Option<watch::Receiver<()>>,
}

/// What reading the first head of a connection gave.
enum FirstHead {
    /// Everything read so far: a complete acceptable head, perhaps followed by more.
    Ready(Vec<u8>),
    /// The client went away (or stayed silent until the listener closed): close, no response.
    Closed,
    /// Refuse with this error.
    Refused(HeadError),
}

/// hyper's HTTP/1 connection settings: the same head limits as the first-head check, so a
/// later request on a kept-alive connection meets the same bounds (the framing rules are
/// applied to every request by the router: [`crate::http::routes`]).
pub fn http1_builder(limits: &HttpLimits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_head_bytes)
        .max_headers(limits.max_headers);
    builder
}

/// Serve one connection with `app` until it closes.
pub(crate) async fn serve(mut stream: TcpStream, app: Router, limits: HttpLimits, mut watch: Watch) {
    let head = match read_first_head(&mut stream, &limits, &mut watch).await {
        FirstHead::Ready(head) => head,
        FirstHead::Closed => return,
        FirstHead::Refused(e) => return refuse(stream, &e).await,
    };
    let draining = *watch.phase.borrow() != Phase::Serving;
    answer(head, stream, app, limits, watch.phase, draining).await;
}

/// Hand hyper the connection, its complete first `head` replayed first. When the drain begins
/// while the connection is kept alive, it gets hyper's graceful shutdown, but only once hyper has
/// taken up that first request: a connection hyper has not read from yet counts as idle to
/// hyper and would be closed with the request unanswered.
async fn answer<S>(
    head: Vec<u8>,
    stream: S,
    app: Router,
    limits: HttpLimits,
    mut phase: watch::Receiver<Phase>,
    draining: bool,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = http1_builder(&limits);
    builder.keep_alive(!draining);
    let io = TokioIo::new(Rewind::new(head, stream));
    // The router's per-request rules (`routes::every_head`) read the connection's limits.
    let app = TowerToHyperService::new(app.layer(axum::Extension(limits)));
    let (began, mut taken_up) = watch::channel(false);
    let service = hyper::service::service_fn(move |req| {
        began.send_replace(true);
        hyper::service::Service::call(&app, req)
    });
    let mut conn = pin!(builder.serve_connection(io, service));
    let result = if draining {
        conn.await
    } else {
        let drain_begun = async {
            reached(&mut phase, Phase::Draining).await;
            // An error means hyper dropped the service: the connection is ending anyway.
            let _ = taken_up.wait_for(|&b| b).await;
        };
        tokio::select! {
            biased;
            () = drain_begun => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
            r = conn.as_mut() => r,
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Read until the first head is complete, refused, timed out or abandoned. A connection with
/// nothing read yet releases the drain when it begins, and closes when the listener closes.
async fn read_first_head(stream: &mut TcpStream, limits: &HttpLimits, watch: &mut Watch) -> FirstHead {
    let deadline = tokio::time::Instant::now() + limits.header_read_timeout;
    let mut buf = Vec::with_capacity(READ_CHUNK);
    loop {
        let fresh = buf.len();
        let idle = buf.is_empty();
        let holds_drain = watch.holds_drain.is_some();
        let (mut to_drain, mut to_close) = (watch.phase.clone(), watch.phase.clone());
        buf.reserve(READ_CHUNK);
        let read = tokio::select! {
            r = stream.read_buf(&mut buf) => r,
            () = tokio::time::sleep_until(deadline) => {
                let millis = limits.header_read_timeout.as_millis().try_into().unwrap_or(u64::MAX);
                return FirstHead::Refused(HeadError::Timeout { millis });
            }
            () = reached(&mut to_drain, Phase::Draining), if idle && holds_drain => {
                watch.holds_drain = None;
                continue;
            }
            () = reached(&mut to_close, Phase::Closing), if idle => return FirstHead::Closed,
        };
        match read {
            Ok(0) if buf.is_empty() => return FirstHead::Closed,
            Ok(0) => return FirstHead::Refused(HeadError::Truncated),
            Ok(_) => {}
            Err(_) => return FirstHead::Closed,
        }
        match check_read(&buf, fresh, limits) {
            HeadCheck::Partial => {}
            HeadCheck::Complete(_) => return FirstHead::Ready(buf),
            HeadCheck::Reject(e) => return FirstHead::Refused(e),
        }
    }
}

/// Write the refusal, then close without resetting the connection (see [`LINGER`]).
async fn refuse(mut stream: TcpStream, e: &HeadError) {
    tracing::debug!(status = e.status().as_u16(), error = %e, "request head refused");
    if stream.write_all(&rejection(e)).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let drain_input = async {
        let mut sink = vec![0; READ_CHUNK];
        let mut total = 0;
        while total < LINGER_BYTES {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain_input).await;
}

/// A stream that first yields `prefix` (bytes already read from `inner`), then reads `inner`;
/// writes go to `inner`.
#[derive(Debug)]
pub struct Rewind<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Rewind<S> {
    /// `inner`, with `prefix` read again first.
    pub fn new(prefix: Vec<u8>, inner: S) -> Self {
        Rewind {
            prefix,
            pos: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pos < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.pos);
            buf.put_slice(&this.prefix[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == this.prefix.len() {
                this.prefix = Vec::new();
                this.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use axum::Router;
    use tokio::sync::watch;

    use super::{HttpLimits, Phase, Rewind, answer};

    #[tokio::test]
    async fn a_rewound_stream_replays_its_prefix_then_reads_on() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut s = Rewind::new(b"GET / HT".to_vec(), server);
        client.write_all(b"TP/1.1\r\n").await.unwrap();
        drop(client);
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"GET / HTTP/1.1\r\n");
    }

    /// The race behind a probe that got no answer at all: the head was complete while serving,
    /// and the drain began before hyper first read the connection.
    #[tokio::test]
    async fn a_first_request_whose_drain_began_before_hyper_read_it_is_answered() {
        let app = Router::new().route("/readyz", axum::routing::get(|| async { "draining" }));
        let (_phase_tx, phase) = watch::channel(Phase::Draining);
        let (mut client, server) = tokio::io::duplex(4096);
        let head = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        let served = tokio::spawn(answer(head, server, app, HttpLimits::default(), phase, false));
        let mut reply = String::new();
        client.read_to_string(&mut reply).await.unwrap();
        served.await.unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
        assert!(reply.ends_with("draining"), "{reply:?}");
    }
}
