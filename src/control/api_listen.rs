//! `--api-listen ADDR` and `--http ADDR`: whether the API over TCP may
//! start, and how it talks. The rule mirrors the NBD listeners'
//! (`nbd::server::check_tls`), stricter: the API carries bearer tokens, so
//! plaintext is allowed only on a loopback address and only with an
//! explicit `--tls off`; anywhere else it needs the certificates of
//! `--tls-certificates`. `run.rs` checks and binds before the daemon
//! serves, so a refusal stops the start; `api::server::tcp` serves.
//!
//! `--http` is the same listener machinery with more on it ([`Surface`]):
//! the API (every route, the same tokens) plus the web dashboard
//! (`api::server::dashboard`). So `--http` alone is enough for both the
//! dashboard and remote `ramd --host` use; `--api-listen` beside it adds
//! an API-only address. The two may not name the same address.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::nbd::tls::{TlsMode, TlsSettings};

/// How the TCP listener talks.
#[derive(Debug, Clone)]
pub enum ApiTransport {
    /// TLS with the NBD server's certificates (reloads included).
    Tls(Arc<TlsSettings>),
    /// Loopback only, asked for with `--tls off`.
    Plaintext,
}

/// What a TCP listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// `--api-listen`: the REST API.
    Api,
    /// `--http`: the REST API and the web dashboard.
    Dashboard,
}

/// A TCP listener of the API, bound, before it serves.
#[derive(Debug)]
pub struct TcpApi {
    pub listener: std::net::TcpListener,
    pub transport: ApiTransport,
    pub surface: Surface,
    /// Most connections it keeps at once (`api::server::conns`; sized
    /// from the descriptor budget by `control::fds`).
    pub max_connections: usize,
}

/// Where the dashboard is served (`--http`), as bound (port resolved):
/// what `POST /v1/dashboard/links` builds its URLs from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpEndpoint {
    pub addr: SocketAddr,
    pub tls: bool,
}

impl HttpEndpoint {
    /// `http(s)://HOST:PORT`, with `host` instead of the bound IP when
    /// given (an unspecified address such as 0.0.0.0 needs one: the
    /// caller passes the machine's name).
    pub fn base_url(&self, host: Option<&str>) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let port = self.addr.port();
        match (host, self.addr.ip()) {
            (Some(h), _) if h.contains(':') && !h.starts_with('[') => {
                format!("{scheme}://[{h}]:{port}")
            }
            (Some(h), _) => format!("{scheme}://{h}:{port}"),
            (None, ip) => format!("{scheme}://{}", SocketAddr::new(ip, port)),
        }
    }
}

/// Why `--api-listen` or `--http` was refused.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// `--api-listen` and `--http` on one address.
    #[error("--api-listen and --http both name {addr}: --http serves the API there already (drop --api-listen), or give them different addresses")]
    SameAddress { addr: SocketAddr },
    /// TLS is wanted but there are no certificates.
    #[error("the API on {addr} needs TLS: give a certificates directory with --tls-certificates DIR (docs/tls.md shows how to make one with openssl or certtool), or, on a loopback address only, pass --tls off to serve it in plaintext")]
    NoCertificates { addr: SocketAddr },
    /// `--tls off` on an address other machines can reach.
    #[error("refusing to serve the API in plaintext on {addr}, which other machines can reach: bearer tokens would cross the network in clear. Give --tls-certificates DIR (docs/tls.md) without --tls off, or listen on a loopback address")]
    PlaintextOnNetwork { addr: SocketAddr },
    /// The address could not be bound.
    #[error("cannot listen on {addr} for the API: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The transport of `addr` by the daemon's TLS settings (`--tls`, None
/// when not given; the loaded certificates).
pub fn transport(
    addr: SocketAddr,
    mode: Option<TlsMode>,
    tls: Option<&Arc<TlsSettings>>,
) -> Result<ApiTransport, ListenError> {
    match (mode, tls) {
        (Some(TlsMode::Off), _) if addr.ip().is_loopback() => Ok(ApiTransport::Plaintext),
        (Some(TlsMode::Off), _) => Err(ListenError::PlaintextOnNetwork { addr }),
        (_, None) => Err(ListenError::NoCertificates { addr }),
        (_, Some(tls)) => Ok(ApiTransport::Tls(tls.clone())),
    }
}

/// The TCP listeners of `api_listen` and `http`, checked and bound
/// (the first refusal wins, and nothing stays bound then).
pub fn bind_all(
    api_listen: Option<SocketAddr>,
    http: Option<SocketAddr>,
    mode: Option<TlsMode>,
    tls: Option<&Arc<TlsSettings>>,
) -> Result<Vec<TcpApi>, ListenError> {
    if let (Some(a), Some(h)) = (api_listen, http) {
        if a == h && a.port() != 0 {
            return Err(ListenError::SameAddress { addr: a });
        }
    }
    let wanted = [(api_listen, Surface::Api), (http, Surface::Dashboard)];
    let mut bound = Vec::new();
    for (addr, surface) in wanted {
        let Some(addr) = addr else { continue };
        let transport = transport(addr, mode, tls)?;
        let key = crate::handover::listeners::key("api-tcp", addr);
        let listener = crate::handover::listeners::kept_or_bind(&key, None, || bind(addr))?;
        bound.push(TcpApi {
            listener,
            transport,
            surface,
            max_connections: super::fds::MAX_WEB_CONNECTIONS,
        });
    }
    Ok(bound)
}

/// Binds `addr`, non-blocking for tokio.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ListenError> {
    let err = |source| ListenError::Bind { addr, source };
    let l = std::net::TcpListener::bind(addr).map_err(err)?;
    l.set_nonblocking(true).map_err(err)?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_only_on_loopback_and_only_when_asked() {
        let lo: SocketAddr = "127.0.0.1:8443".parse().unwrap();
        let lo6: SocketAddr = "[::1]:8443".parse().unwrap();
        let net: SocketAddr = "0.0.0.0:8443".parse().unwrap();
        let plain = |a| transport(a, Some(TlsMode::Off), None);
        assert!(matches!(plain(lo), Ok(ApiTransport::Plaintext)));
        assert!(matches!(plain(lo6), Ok(ApiTransport::Plaintext)));
        let e = plain(net).unwrap_err();
        assert!(matches!(e, ListenError::PlaintextOnNetwork { .. }), "{e}");
        for mode in [None, Some(TlsMode::On), Some(TlsMode::Require)] {
            let e = transport(lo, mode, None).unwrap_err();
            assert!(e.to_string().contains("docs/tls.md"), "{e}");
        }
    }

    #[test]
    fn http_follows_the_same_rule_and_not_on_the_api_address() {
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let net: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let off = Some(TlsMode::Off);
        let both = bind_all(Some(lo), Some(lo), off, None).unwrap();
        let surfaces: Vec<_> = both.iter().map(|t| t.surface).collect();
        assert_eq!(surfaces, [Surface::Api, Surface::Dashboard]);
        let e = bind_all(None, Some(net), off, None).unwrap_err();
        assert!(matches!(e, ListenError::PlaintextOnNetwork { .. }), "{e}");
        let e = bind_all(None, Some(lo), None, None).unwrap_err();
        assert!(matches!(e, ListenError::NoCertificates { .. }), "{e}");
        let fixed: SocketAddr = "127.0.0.1:8443".parse().unwrap();
        let e = bind_all(Some(fixed), Some(fixed), off, None).unwrap_err();
        assert!(e.to_string().contains("drop --api-listen"), "{e}");
    }

    #[test]
    fn dashboard_urls() {
        let at = |a: &str, tls| HttpEndpoint {
            addr: a.parse().unwrap(),
            tls,
        };
        assert_eq!(
            at("127.0.0.1:80", false).base_url(None),
            "http://127.0.0.1:80"
        );
        assert_eq!(at("[::1]:8443", true).base_url(None), "https://[::1]:8443");
        let any = at("0.0.0.0:8443", true);
        assert_eq!(any.base_url(Some("db1")), "https://db1:8443");
        assert_eq!(any.base_url(Some("fe80::1")), "https://[fe80::1]:8443");
    }
}
