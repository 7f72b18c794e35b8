//! NBD URIs (the NBD project's doc/uri.md), pure parsing:
//!
//! ```text
//!   nbd://HOST[:PORT][/EXPORT]                   plaintext TCP
//!   nbds://HOST[:PORT][/EXPORT]?TLS              TLS over TCP (must succeed)
//!   nbd+unix:///[EXPORT]?socket=PATH             plaintext unix socket
//!   nbds+unix:///[EXPORT]?socket=PATH&TLS        TLS over a unix socket
//!
//!   TLS = tls-certificates=DIR      ca-cert.pem [client-cert.pem client-key.pem]
//!         tls-verify-peer=BOOL      default true (false: no server check, warned)
//!         tls-hostname=NAME         the name the server's certificate must hold
//!         tls-type=x509             the only kind supported
//! ```
//!
//! The TLS parameters are libnbd's (`tls-certificates` is the directory
//! layout libnbd, nbdkit and qemu share), so one URI works with nbdinfo
//! and with ramd. Unknown parameters are refused, as the spec asks.

use std::path::PathBuf;

use super::ClientError;

/// Where an NBD server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tcp { host: String, port: u16 },
    Unix { socket: PathBuf },
}

/// How to speak TLS (present for `nbds` and `nbds+unix`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsParams {
    /// `ca-cert.pem` (whom to trust) and, for mutual TLS,
    /// `client-cert.pem` + `client-key.pem`. None only with
    /// `verify_peer` false: ramd has no system CA store.
    pub certificates: Option<PathBuf>,
    /// Check the server's certificate against the CA (and its name).
    pub verify_peer: bool,
    /// The name the server's certificate must hold: `tls-hostname`, else
    /// the URI's host; None over a unix socket without `tls-hostname`
    /// (the chain is checked, not the name, as libnbd does).
    pub hostname: Option<String>,
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub address: Address,
    /// Export name ("" selects the server's default export).
    pub export: String,
    /// TLS settings; None for plaintext (`nbd`, `nbd+unix`).
    pub tls: Option<TlsParams>,
}

/// The IANA port for NBD.
pub const DEFAULT_PORT: u16 = 10809;

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// libnbd's booleans.
fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// What is wrong with a URI's query (the `why` of
/// [`ClientError::BadUri`]).
#[derive(Debug, thiserror::Error)]
enum QueryError {
    #[error("bad %-escape in '{0}'")]
    BadEscape(String),
    #[error("tls-verify-peer={0}: expected true or false")]
    NotABool(String),
    #[error("{key}={value}: only X.509 certificates are supported (tls-certificates=DIR), not TLS-PSK or anonymous TLS")]
    NotX509 { key: String, value: String },
    #[error("unsupported parameter '{0}'")]
    Unsupported(String),
    #[error("TLS (nbds) needs tls-certificates=DIR with the CA that signed the server's certificate (DIR/ca-cert.pem): ramd has no system CA store (or add tls-verify-peer=false to skip checking the server, for testing only)")]
    NoCertificates,
}

/// The query parameters of a URI, decoded, before they are checked
/// against its scheme.
#[derive(Default)]
struct Query {
    socket: Option<String>,
    certificates: Option<String>,
    verify_peer: Option<bool>,
    hostname: Option<String>,
    /// The first TLS parameter seen (to refuse it on a plaintext URI).
    first_tls: Option<String>,
}

impl Query {
    fn parse(query: Option<&str>) -> Result<Query, QueryError> {
        let mut q = Query::default();
        let pairs = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').unwrap_or((p, "")));
        for (k, v) in pairs {
            let v = percent_decode(v).ok_or_else(|| QueryError::BadEscape(k.to_owned()))?;
            if k.starts_with("tls-") && q.first_tls.is_none() {
                q.first_tls = Some(k.to_owned());
            }
            match k {
                "socket" => q.socket = Some(v),
                "tls-certificates" => q.certificates = Some(v),
                "tls-verify-peer" => {
                    q.verify_peer = Some(parse_bool(&v).ok_or(QueryError::NotABool(v))?)
                }
                "tls-hostname" => q.hostname = Some(v),
                "tls-type" if v == "x509" => {}
                "tls-type" | "tls-psk-file" | "tls-username" => {
                    return Err(QueryError::NotX509 {
                        key: k.to_owned(),
                        value: v,
                    })
                }
                other => return Err(QueryError::Unsupported(other.to_owned())),
            }
        }
        Ok(q)
    }

    /// The TLS settings for a TLS scheme; `host` is the URI's host (None
    /// for a unix socket).
    fn tls(&mut self, host: Option<&str>) -> Result<TlsParams, QueryError> {
        let verify_peer = self.verify_peer.unwrap_or(true);
        let certificates = self.certificates.take().filter(|d| !d.is_empty());
        if certificates.is_none() && verify_peer {
            return Err(QueryError::NoCertificates);
        }
        Ok(TlsParams {
            certificates: certificates.map(PathBuf::from),
            verify_peer,
            hostname: self.hostname.take().or(host.map(str::to_owned)),
        })
    }
}

/// `HOST[:PORT]`, `[IPv6][:PORT]`.
fn host_port(authority: &str) -> Result<(String, u16), &'static str> {
    if authority.is_empty() {
        return Err("no host");
    }
    if let Some(h) = authority.strip_prefix('[') {
        let (h, after) = h.split_once(']').ok_or("unclosed '['")?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| "bad port")?,
            None if after.is_empty() => DEFAULT_PORT,
            None => return Err("junk after ']'"),
        };
        return Ok((h.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Ok((h.to_owned(), p.parse().map_err(|_| "bad port")?)),
        None => Ok((authority.to_owned(), DEFAULT_PORT)),
    }
}

impl NbdUri {
    /// True when `s` looks like an NBD URI (so a backing spec is not a path).
    pub fn is_uri(s: &str) -> bool {
        s.starts_with("nbd:") || s.starts_with("nbd+") || s.starts_with("nbds")
    }

    /// Parses an NBD URI of one of the four forms in the module docs.
    pub fn parse(uri: &str) -> Result<NbdUri, ClientError> {
        let bad = |why: &str| ClientError::BadUri {
            uri: uri.to_owned(),
            why: why.to_owned(),
        };
        let (scheme, rest) = uri.split_once("://").ok_or_else(|| bad("no '://'"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path).ok_or_else(|| bad("bad %-escape in the export name"))?;
        let (unix, tls) = match scheme {
            "nbd" => (false, false),
            "nbds" => (false, true),
            "nbd+unix" => (true, false),
            "nbds+unix" => (true, true),
            other => return Err(bad(&format!("unknown scheme '{other}'"))),
        };
        let mut q = Query::parse(query).map_err(|w| bad(&w.to_string()))?;
        if let (false, Some(k)) = (tls, &q.first_tls) {
            return Err(bad(&format!(
                "'{k}' needs TLS: use nbds:// or nbds+unix://"
            )));
        }
        let address = if unix {
            if !authority.is_empty() {
                return Err(bad(
                    "a unix URI has no host: use nbd+unix:///EXPORT?socket=PATH",
                ));
            }
            let socket = q
                .socket
                .take()
                .filter(|s| !s.is_empty())
                .ok_or_else(|| bad("missing ?socket=PATH"))?;
            Address::Unix {
                socket: PathBuf::from(socket),
            }
        } else {
            if q.socket.is_some() {
                return Err(bad("'socket' is for nbd+unix:// URIs"));
            }
            let (host, port) = host_port(authority).map_err(bad)?;
            Address::Tcp { host, port }
        };
        let tls = if tls {
            let host = match &address {
                Address::Tcp { host, .. } => Some(host.as_str()),
                Address::Unix { .. } => None,
            };
            Some(q.tls(host).map_err(|w| bad(&w.to_string()))?)
        } else {
            None
        };
        Ok(NbdUri {
            address,
            export,
            tls,
        })
    }

    /// Where the server is, for messages.
    pub fn target(&self) -> String {
        match &self.address {
            Address::Tcp { host, port } => format!("{host}:{port}"),
            Address::Unix { socket } => socket.display().to_string(),
        }
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.tls.is_some() { "s" } else { "" };
        let mut sep = '?';
        match &self.address {
            Address::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd{s}://[{host}]:{port}/{}", self.export)?
            }
            Address::Tcp { host, port } => write!(f, "nbd{s}://{host}:{port}/{}", self.export)?,
            Address::Unix { socket } => {
                write!(
                    f,
                    "nbd{s}+unix:///{}?socket={}",
                    self.export,
                    socket.display()
                )?;
                sep = '&';
            }
        }
        if let Some(t) = &self.tls {
            if let Some(dir) = &t.certificates {
                write!(f, "{sep}tls-certificates={}", dir.display())?;
                sep = '&';
            }
            if !t.verify_peer {
                write!(f, "{sep}tls-verify-peer=false")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse() {
        let u = NbdUri::parse("nbd://example.com:10810/disk%201").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "example.com".into(),
                port: 10810
            }
        );
        assert_eq!((u.export.as_str(), &u.tls), ("disk 1", &None));
        let u = NbdUri::parse("nbd://127.0.0.1").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "127.0.0.1".into(),
                port: DEFAULT_PORT
            }
        );
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd://[::1]:999/x").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "::1".into(),
                port: 999
            }
        );
        assert_eq!(u.to_string(), "nbd://[::1]:999/x");
        let u = NbdUri::parse("nbd+unix:///ram0?socket=/run/ramd/nbd.sock").unwrap();
        assert_eq!(
            u.address,
            Address::Unix {
                socket: "/run/ramd/nbd.sock".into()
            }
        );
        assert_eq!(u.export, "ram0");
        assert_eq!(u.to_string(), "nbd+unix:///ram0?socket=/run/ramd/nbd.sock");
        let u = NbdUri::parse("nbd+unix://?socket=/tmp/s").unwrap();
        assert_eq!(u.export, "");
    }

    #[test]
    fn tls_uris_parse() {
        let u = NbdUri::parse("nbds://storage.lan/vol1?tls-certificates=/etc/pki/nbd").unwrap();
        assert_eq!(
            u.tls,
            Some(TlsParams {
                certificates: Some("/etc/pki/nbd".into()),
                verify_peer: true,
                hostname: Some("storage.lan".into()),
            })
        );
        assert_eq!(
            u.to_string(),
            "nbds://storage.lan:10809/vol1?tls-certificates=/etc/pki/nbd"
        );
        let u = NbdUri::parse(
            "nbds+unix:///d?socket=/s&tls-certificates=/c%20d&tls-type=x509&tls-hostname=srv",
        )
        .unwrap();
        assert_eq!(
            u.address,
            Address::Unix {
                socket: "/s".into()
            }
        );
        let t = u.tls.as_ref().unwrap();
        assert_eq!(t.certificates, Some("/c d".into()));
        assert_eq!(t.hostname.as_deref(), Some("srv"));
        assert_eq!(
            u.to_string(),
            "nbds+unix:///d?socket=/s&tls-certificates=/c d"
        );
        // No hostname over a unix socket: the chain is checked, not a name.
        let u = NbdUri::parse("nbds+unix:///?socket=/s&tls-certificates=/c").unwrap();
        assert_eq!(u.tls.unwrap().hostname, None);
        for off in ["false", "0", "no", "off", "FALSE"] {
            let u = NbdUri::parse(&format!("nbds://h/?tls-verify-peer={off}")).unwrap();
            let t = u.tls.as_ref().unwrap();
            assert!(!t.verify_peer && t.certificates.is_none(), "{off}");
            assert_eq!(u.to_string(), "nbds://h:10809/?tls-verify-peer=false");
        }
    }

    #[test]
    fn bad_uris_explain() {
        for (uri, why) in [
            ("nbd:/x", "://"),
            ("nbd:///x", "no host"),
            ("nbds:///x?tls-certificates=/c", "no host"),
            ("nbd://h:port/x", "bad port"),
            ("nbd://[::1/x", "unclosed"),
            ("nbd+unix:///x", "socket"),
            ("nbds+unix:///x?tls-certificates=/c", "socket"),
            ("nbd+unix://host/x?socket=/s", "no host"),
            ("nbd://h/x?socket=/s", "nbd+unix"),
            ("http://h/x", "scheme"),
            ("nbd+unix:///x?socket=/s&tls=on", "'tls'"),
            ("nbd://h/x?tls-certificates=/c", "nbds://"),
            ("nbds://h/x", "tls-certificates=DIR"),
            ("nbds://h/x", "no system CA"),
            ("nbds://h/x?tls-certificates=", "tls-certificates=DIR"),
            (
                "nbds://h/x?tls-certificates=/c&tls-verify-peer=maybe",
                "true or false",
            ),
            ("nbds://h/x?tls-psk-file=/k", "TLS-PSK"),
            ("nbds://h/x?tls-type=anon&tls-verify-peer=0", "X.509"),
            ("nbd://h/%zz", "escape"),
            ("nbds://h/x?tls-certificates=%zz", "escape"),
        ] {
            let e = NbdUri::parse(uri).unwrap_err().to_string();
            assert!(e.contains(why), "{uri}: {e}");
            assert!(e.contains("expected nbd://"), "{e}");
        }
        assert!(NbdUri::is_uri("nbd+unix:///x?socket=/s"));
        assert!(NbdUri::is_uri("nbds://h/x"));
        assert!(!NbdUri::is_uri("/dev/sdb"));
    }
}
