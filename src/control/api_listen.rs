//! `--api-listen ADDR`: whether the API over TCP may start, and how it
//! talks. The rule mirrors the NBD listeners' (`nbd::server::check_tls`),
//! stricter: the API carries bearer tokens, so plaintext is allowed only on
//! a loopback address and only with an explicit `--tls off`; anywhere else
//! it needs the certificates of `--tls-certificates`. `run.rs` checks and
//! binds before the daemon serves, so a refusal stops the start;
//! `api::server::tcp` serves.

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

/// Why `--api-listen` was refused.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
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
}
