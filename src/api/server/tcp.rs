//! The API over TCP (`--api-listen ADDR`, and `--http ADDR` with the
//! dashboard beside it): TLS with the NBD server's certificates, every
//! request behind a bearer token or a dashboard session (`auth`).
//!
//! ```text
//! accept ──► conns::ConnTable::admit (per-address and total bounds; refused: closed at once)
//!        ──► one task per connection:
//!              TLS handshake within HANDSHAKE_TIMEOUT
//!              HTTP/1.1 (hyper): each request's head within HEADER_TIMEOUT of the
//!                moment the connection waits for it (so a keep-alive connection
//!                idle that long is closed too);
//!              a response or request body that moves no byte for IDLE_TIMEOUT
//!                while no handler runs (a client that stops reading): closed
//!              evicted by a newcomer (`conns`): closed
//!        ──► the router (tcp_router / dashboard::router), with the connection's
//!            `conns::ConnState` in each request's extensions (`auth` marks it
//!            authenticated; the failure budget and event streams use its address)
//! ```
//!
//! The loop is ours rather than `axum::serve` because that one has no
//! deadlines and no bound: 400 idle sockets held every handshake slot for
//! 10 s each and, left open, would have taken every file descriptor of the
//! daemon. Each listener's bound comes from the descriptor budget
//! (`control::fds`). The certificate is looked up at each handshake in
//! the daemon's `TlsSettings`, so a reload (SIGHUP, `POST
//! /v1/tls/reload`) reaches new API connections as it reaches new NBD
//! ones. Client certificates are not asked for: tokens are the API's
//! credentials (`ca-cert.pem` and `--tls-verify-peer` are the NBD
//! server's). At a stop, connections finish the request in hand (at most
//! SHUTDOWN_GRACE) and close.
//!
//! Whether it may start, and with TLS or not, is `control::api_listen`'s
//! decision (plaintext only on loopback with an explicit `--tls off`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::auth::Gatekeeper;
use super::conns::{ConnGuard, ConnState, ConnTable, Limits};
use crate::control::api_listen::{ApiTransport, HttpEndpoint, Surface, TcpApi};
use crate::control::Daemon;
use crate::nbd::tls::TlsSettings;

/// Longest a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a client may take to send a request's line and headers,
/// counted from when the connection waits for them (keep-alive idle
/// time included).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection with no handler running that moves no byte for this long
/// is closed: a client that stops reading a response (event streams send
/// at least a comment every 15 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stop waits for a connection's request in hand.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Pause after a failed accept (EMFILE and the like) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves the token-guarded API (and, on `--http`, the dashboard) on
/// `api.listener` until `stop`, then finishes the requests in flight.
pub async fn serve(
    api: TcpApi,
    daemon: Arc<Daemon>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let gate = Gatekeeper {
        tokens: daemon.tokens.clone(),
        sessions: daemon.sessions.clone(),
        throttle: Arc::default(),
    };
    let router = match api.surface {
        Surface::Api => super::tcp_router(daemon, gate),
        Surface::Dashboard => {
            let endpoint = HttpEndpoint {
                addr: api.listener.local_addr()?,
                tls: matches!(api.transport, ApiTransport::Tls(_)),
            };
            super::dashboard::router(daemon, endpoint, gate)
        }
    };
    let tls = match api.transport {
        ApiTransport::Plaintext => None,
        ApiTransport::Tls(settings) => Some(TlsAcceptor::from(
            tls_config(settings).map_err(std::io::Error::other)?,
        )),
    };
    let listener = Listener {
        tcp: TcpListener::from_std(api.listener)?,
        table: ConnTable::new(Limits::for_total(api.max_connections)),
        router,
        tls,
    };
    listener.run(stop).await;
    Ok(())
}

/// One listener's parts.
struct Listener {
    tcp: TcpListener,
    table: Arc<ConnTable>,
    router: Router,
    tls: Option<TlsAcceptor>,
}

impl Listener {
    /// Accepts until `stop`, then waits for every connection to close.
    async fn run(self, stop: impl Future<Output = ()>) {
        let (stop_tx, stop_rx) = watch::channel(false);
        // Each connection task holds a sender; recv() ends when all did.
        let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(1);
        tokio::pin!(stop);
        loop {
            let accepted = tokio::select! {
                _ = &mut stop => break,
                accepted = self.tcp.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("API accept failed: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let guard = match self.table.admit(peer.ip()) {
                Ok(guard) => guard,
                Err(why) => {
                    tracing::debug!(%peer, "API connection refused: {why}");
                    continue;
                }
            };
            let conn = Connection {
                guard,
                router: self.router.clone(),
                tls: self.tls.clone(),
                stop: stop_rx.clone(),
                _done: done_tx.clone(),
            };
            tokio::spawn(conn.run(stream, peer));
        }
        let _ = stop_tx.send(true);
        drop((done_tx, self.tcp));
        let _ = done_rx.recv().await;
    }
}

/// One accepted connection and what it is served with.
struct Connection {
    guard: ConnGuard,
    router: Router,
    tls: Option<TlsAcceptor>,
    stop: watch::Receiver<bool>,
    _done: tokio::sync::mpsc::Sender<()>,
}

impl Connection {
    /// Serves the connection until it ends, is evicted, or the stop.
    async fn run(self, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let state = self.guard.state.clone();
        tokio::select! {
            _ = state.closed.notified() => {
                tracing::debug!(%peer, "API connection closed for a newcomer (connection limits)");
            }
            _ = self.serve(stream, peer) => {}
        }
    }

    async fn serve(&self, stream: TcpStream, peer: SocketAddr) {
        let state = self.guard.state.clone();
        let Some(acceptor) = &self.tls else {
            return self.http(IdleIo::new(stream, state)).await;
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(session)) => self.http(IdleIo::new(session, state)).await,
            Ok(Err(e)) => tracing::debug!(%peer, "API TLS handshake failed: {e}"),
            Err(_) => tracing::debug!(%peer, "API TLS handshake timed out"),
        }
    }

    /// HTTP/1.1 on `io` with the deadlines of the module docs.
    async fn http<I>(&self, io: IdleIo<I>)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let state = self.guard.state.clone();
        let router = self
            .router
            .clone()
            .layer(axum::middleware::from_fn(count_busy))
            .layer(axum::Extension(state));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .keep_alive(true);
        let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(router));
        tokio::pin!(conn);
        let mut stop = self.stop.clone();
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("API connection ended: {e}");
                }
            }
            () = async { drop(stop.wait_for(|s| *s).await) } => {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
            }
        }
    }
}

/// Counts the request as in flight on its connection while it is
/// handled (the idle deadline waits meanwhile).
async fn count_busy(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let busy = req
        .extensions()
        .get::<Arc<ConnState>>()
        .map(ConnState::busy_guard);
    let res = next.run(req).await;
    drop(busy);
    res
}

/// A connection's stream with the idle deadline: a read or write that
/// waits longer than [`IDLE_TIMEOUT`] since the last byte moved, while no
/// request is in flight, fails with `TimedOut` (hyper then closes it).
/// Covers clients that stop reading too (their writes wait).
struct IdleIo<T> {
    inner: T,
    deadline: Pin<Box<tokio::time::Sleep>>,
    state: Arc<ConnState>,
}

impl<T> IdleIo<T> {
    fn new(inner: T, state: Arc<ConnState>) -> IdleIo<T> {
        IdleIo {
            inner,
            deadline: Box::pin(tokio::time::sleep(IDLE_TIMEOUT)),
            state,
        }
    }

    fn moved(&mut self) {
        let at = tokio::time::Instant::now() + IDLE_TIMEOUT;
        self.deadline.as_mut().reset(at);
    }

    /// Pending, or the timeout once the deadline passed while idle.
    fn waiting<R>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<R>> {
        if self.state.is_busy() {
            self.moved();
            return Poll::Pending;
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no byte moved for the idle timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.waiting(cx),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.waiting(cx),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.waiting(cx),
            done => done,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The server's certificate as the daemon's `TlsSettings` hold it now.
#[derive(Debug)]
struct CurrentCertificate(Arc<TlsSettings>);

impl ResolvesServerCert for CurrentCertificate {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.config().cert_resolver.resolve(hello)
    }
}

/// rustls (ring) with the current certificate, HTTP/1.1 by ALPN.
fn tls_config(tls: Arc<TlsSettings>) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(CurrentCertificate(tls)));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
