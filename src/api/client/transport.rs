//! Where the daemon's API is and how to reach it: its unix socket (no
//! token: the socket's mode is the access control), or a TCP address
//! (`--host https://HOST:PORT`) over TLS with a bearer token.
//!
//! TLS is rustls with ring (tokio-rustls). The server's certificate is
//! checked against `--ca-cert FILE` when given (the usual case: the
//! daemon's certificates come from a private CA, docs/tls.md), else
//! against the system's trust store through `rustls-native-certs`: that
//! is the store the administrator already keeps (distribution bundle plus
//! any local CAs), where a compiled-in copy of Mozilla's roots
//! (`webpki-roots`) would go stale with the binary and ignore local CAs.
//! `http://` is refused except to a loopback host, so a token never
//! crosses a network in clear.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// The daemon's API: a unix socket or a TCP address.
#[derive(Debug, Clone)]
pub enum Target {
    Unix(PathBuf),
    Host(Host),
}

impl Target {
    /// The socket path or URL, for messages.
    pub fn describe(&self) -> String {
        match self {
            Target::Unix(p) => p.display().to_string(),
            Target::Host(h) => h.url.clone(),
        }
    }
}

/// A daemon's API over TCP (`--host`).
#[derive(Clone)]
pub struct Host {
    /// As given (`https://host:8443`), for messages.
    pub(crate) url: String,
    /// Host name or IP address, without brackets.
    pub(crate) host: String,
    pub(crate) port: u16,
    /// None: plaintext (`http://`, loopback only).
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    /// Sent as `Authorization: Bearer ...`; never printed.
    pub(crate) token: Option<String>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("url", &self.url)
            .field("tls", &self.tls.is_some())
            .field("token", &self.token.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

/// Why a `--host` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Not `https://HOST[:PORT]` or `http://HOST[:PORT]`.
    #[error("--host '{0}': expected https://HOST[:PORT] (or http://127.0.0.1:PORT for a plaintext loopback API)")]
    BadUrl(String),
    /// `http://` to a host that is not loopback.
    #[error("--host '{0}': plaintext HTTP would send the token in clear; use https:// (http:// is for loopback addresses only)")]
    PlaintextOffLoopback(String),
    /// The CA file did not load.
    #[error("--ca-cert {}: {reason}", path.display())]
    CaCert { path: PathBuf, reason: String },
    /// No `--ca-cert` and no system root certificates.
    #[error("no system CA certificates found to check the daemon's certificate: give the CA that signed it with --ca-cert FILE (or RAMD_CA_CERT)")]
    NoRoots,
}

impl Host {
    /// A remote API at `url`, trusting `ca_cert` (None: the system roots).
    pub fn new(
        url: &str,
        token: Option<String>,
        ca_cert: Option<&Path>,
    ) -> Result<Host, HostError> {
        let (tls, host, port) = parse_url(url)?;
        if !tls && !is_loopback(&host) {
            return Err(HostError::PlaintextOffLoopback(url.to_owned()));
        }
        let tls = if tls {
            Some(client_config(ca_cert)?)
        } else {
            None
        };
        Ok(Host {
            url: url.to_owned(),
            host,
            port,
            tls,
            token,
        })
    }

    /// The name the server's certificate must carry.
    pub(crate) fn server_name(&self) -> Option<ServerName<'static>> {
        ServerName::try_from(self.host.clone()).ok()
    }

    /// `host:port` as the Host header and `connect` take it.
    pub(crate) fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// (TLS?, host, port) of `https://HOST[:PORT][/]`.
fn parse_url(url: &str) -> Result<(bool, String, u16), HostError> {
    let bad = || HostError::BadUrl(url.to_owned());
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(bad());
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '@', '?', '#']) {
        return Err(bad());
    }
    let default_port = if tls { 443 } else { 80 };
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']').ok_or_else(bad)?;
            (host, after.strip_prefix(':'))
        }
        None => match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    let port = match port {
        Some(p) => p.parse().map_err(|_| bad())?,
        None => default_port,
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((tls, host.to_owned(), port))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// rustls (ring) trusting `ca_cert` or the system roots; HTTP/1.1 by ALPN.
fn client_config(ca_cert: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, HostError> {
    let roots = match ca_cert {
        Some(path) => roots_from_file(path)?,
        None => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn roots_from_file(path: &Path) -> Result<rustls::RootCertStore, HostError> {
    let err = |reason: String| HostError::CaCert {
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("holds no certificate".into()));
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots.add(c).map_err(|e| err(e.to_string()))?;
    }
    Ok(roots)
}

fn system_roots() -> Result<rustls::RootCertStore, HostError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if roots.is_empty() {
        return Err(HostError::NoRoots);
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_default_ports_and_brackets() {
        let p = |u| parse_url(u).unwrap();
        assert_eq!(p("https://h:8443"), (true, "h".into(), 8443));
        assert_eq!(p("https://h/"), (true, "h".into(), 443));
        assert_eq!(p("http://127.0.0.1:1"), (false, "127.0.0.1".into(), 1));
        assert_eq!(p("https://[::1]:9"), (true, "::1".into(), 9));
        for bad in [
            "h:1",
            "ftp://h",
            "https://",
            "https://h:x",
            "https://h/v1",
            "https://u@h",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plaintext_only_to_loopback() {
        assert!(Host::new("http://127.0.0.1:8080", None, None).is_ok());
        assert!(Host::new("http://localhost:8080", None, None).is_ok());
        let e = Host::new("http://10.0.0.1:8080", None, None).unwrap_err();
        assert!(matches!(e, HostError::PlaintextOffLoopback(_)), "{e}");
    }

    #[test]
    fn the_token_is_never_in_debug_output() {
        let r = Host::new("http://127.0.0.1:1", Some("ramd_x_secret".into()), None).unwrap();
        assert!(!format!("{r:?}").contains("secret"));
    }
}
