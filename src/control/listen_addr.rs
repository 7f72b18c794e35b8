//! The TCP addresses the daemon listens on (`--nbd-listen`,
//! `--api-listen`, `--http` and their config keys), as people write them:
//! `127.0.0.1:8080`, `[::1]:8080`, or a host name with a port
//! (`localhost:8080`), resolved once at start with the system's resolver
//! (`/etc/hosts`, DNS).
//!
//! Why resolve here, not keep names: every later rule works on the
//! address that is bound (the "plaintext only on loopback" checks of
//! `nbd::server` and `api_listen`, the URIs `ramd list` prints), so a
//! name becomes exactly one address before any of them runs, and what is
//! checked is what is served. A name that resolves to several addresses
//! (`localhost`: 127.0.0.1 and ::1) takes its first IPv4 one, else its
//! first: IPv4 loopback exists on every host, while ::1 is missing where
//! IPv6 is switched off.

use std::net::{SocketAddr, ToSocketAddrs};

/// Why a listen address was refused.
#[derive(Debug, thiserror::Error)]
pub enum ListenAddrError {
    /// No `:PORT` at the end.
    #[error("'{text}' has no port: give HOST:PORT, e.g. 127.0.0.1:8080 or localhost:8080")]
    NoPort { text: String },
    /// The resolver did not know the name (its reason).
    #[error("cannot resolve '{text}': {source} (give HOST:PORT with a host name this machine resolves, or an IP address)")]
    Resolve {
        text: String,
        source: std::io::Error,
    },
    /// The name resolved to no address at all.
    #[error("'{text}' resolves to no address")]
    NoAddress { text: String },
}

/// `text` as the one address to bind: an IP address and port as they
/// are, a host name resolved (its first IPv4 address, else its first).
pub fn parse_listen_addr(text: &str) -> Result<SocketAddr, ListenAddrError> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let has_port = text
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !has_port {
        return Err(ListenAddrError::NoPort {
            text: text.to_owned(),
        });
    }
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|source| ListenAddrError::Resolve {
            text: text.to_owned(),
            source,
        })?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| ListenAddrError::NoAddress {
            text: text.to_owned(),
        })
}

/// serde: a listen address (config keys `api_listen`, `http`).
pub fn de_listen_addr<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let text = <String as serde::Deserialize>::deserialize(d)?;
    parse_listen_addr(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// serde: a list of listen addresses (config key `nbd_listen`).
pub fn de_listen_addrs<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<SocketAddr>>, D::Error> {
    let texts = <Vec<String> as serde::Deserialize>::deserialize(d)?;
    texts
        .iter()
        .map(|t| parse_listen_addr(t))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
        .map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_stay_as_they_are() {
        for text in ["127.0.0.1:8080", "0.0.0.0:0", "[::1]:10809", "[::]:443"] {
            assert_eq!(
                parse_listen_addr(text).unwrap(),
                text.parse::<SocketAddr>().unwrap()
            );
        }
    }

    #[test]
    fn localhost_resolves_to_a_loopback_address() {
        let a = parse_listen_addr("localhost:8080").unwrap();
        assert!(a.ip().is_loopback(), "{a}");
        assert!(a.is_ipv4(), "IPv4 first: {a}");
        assert_eq!(a.port(), 8080);
    }

    #[test]
    fn names_without_a_port_or_unknown_are_refused_with_the_text() {
        for text in [
            "localhost",
            "nowhere",
            "127.0.0.1",
            ":8080",
            "localhost:http",
        ] {
            let e = parse_listen_addr(text).unwrap_err().to_string();
            assert!(e.contains(text) && e.contains("no port"), "{text}: {e}");
        }
        let e = parse_listen_addr("no-such-host.invalid:8080").unwrap_err();
        assert!(matches!(e, ListenAddrError::Resolve { .. }), "{e:?}");
        assert!(e.to_string().contains("no-such-host.invalid:8080"), "{e}");
    }
}
