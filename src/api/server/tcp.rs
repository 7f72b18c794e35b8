//! The API over TCP (`--api-listen ADDR`, and `--http ADDR` with the
//! dashboard beside it): TLS with the NBD server's certificates, every
//! request behind a bearer token (`auth`).
//!
//! ```text
//! accept task ──► TLS handshake (one task each, at most MAX_HANDSHAKES,
//!    (TCP)        HANDSHAKE_TIMEOUT) ──► channel ──► axum::serve ──► tcp_router
//!                                                                   (dashboard_router)
//! ```
//!
//! Handshakes run off the accept loop, so a client that connects and
//! sends nothing holds a permit for a few seconds, never the listener.
//! The certificate is looked up at each handshake in the daemon's
//! `TlsSettings`, so a reload (SIGHUP, `POST /v1/tls/reload`) reaches new
//! API connections as it reaches new NBD ones. Client certificates are not
//! asked for: tokens are the API's credentials (`ca-cert.pem` and
//! `--tls-verify-peer` are the NBD server's).
//!
//! Whether it may start, and with TLS or not, is `control::api_listen`'s
//! decision (plaintext only on loopback with an explicit `--tls off`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::control::api_listen::{ApiTransport, HttpEndpoint, Surface, TcpApi};
use crate::control::Daemon;
use crate::nbd::tls::TlsSettings;

/// Most TLS handshakes in progress at once.
const MAX_HANDSHAKES: usize = 64;
/// Longest a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (EMFILE and the like) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves the token-guarded API (and, on `--http`, the dashboard) on
/// `api.listener` until `stop`, then finishes the requests in flight.
pub async fn serve(
    api: TcpApi,
    daemon: Arc<Daemon>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = match api.surface {
        Surface::Api => super::tcp_router(daemon),
        Surface::Dashboard => {
            let endpoint = HttpEndpoint {
                addr: api.listener.local_addr()?,
                tls: matches!(api.transport, ApiTransport::Tls(_)),
            };
            super::dashboard::router(daemon, endpoint)
        }
    };
    let app = router.into_make_service();
    let tcp = TcpListener::from_std(api.listener)?;
    match api.transport {
        ApiTransport::Plaintext => axum::serve(tcp, app).with_graceful_shutdown(stop).await,
        ApiTransport::Tls(settings) => {
            let config = tls_config(settings).map_err(std::io::Error::other)?;
            let tls = TlsListener::start(tcp, TlsAcceptor::from(config))?;
            axum::serve(tls, app).with_graceful_shutdown(stop).await
        }
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

/// TLS sessions ready for HTTP, handed to axum one by one.
struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    /// The accept loop; stopped when axum drops the listener.
    task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    fn start(tcp: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(MAX_HANDSHAKES);
        let task = tokio::spawn(accept_loop(tcp, acceptor, tx));
        Ok(TlsListener { ready, local, task })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(session) => session,
            // The accept loop never ends on its own; if it did, wait for
            // the shutdown rather than spin.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

type Ready = tokio::sync::mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>;

/// Accepts TCP connections and runs each TLS handshake in its own task.
async fn accept_loop(tcp: TcpListener, acceptor: TlsAcceptor, ready: Ready) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    loop {
        let (stream, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("API accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (acceptor, ready) = (acceptor.clone(), ready.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(session)) => {
                    let _ = ready.send((session, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, "API TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "API TLS handshake timed out"),
            }
        });
    }
}
