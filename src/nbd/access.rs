//! Who may see an export: per-export access rules, decided per connection
//! from the client's certificate identity and source address. Pure (no
//! I/O): the handshake asks [`AccessTable::grant`] for each export it
//! would list, describe or open, and the server counts the refusals.
//!
//! An export without rules is open to everyone who reaches the listener
//! (what ramd did before rules existed). With rules, a client must pass
//! both lists that are given:
//!
//! ```text
//! allow_identities      (empty: any identity, anonymous included)
//!   + read_only_identities  these identities are allowed too, read-only
//! allow_networks        (empty: any source) CIDRs like 10.0.0.0/8, or
//!                       "unix" for the unix socket
//! ```
//!
//! An identity is the client certificate's CN or first SAN, compared
//! exactly (`alice`, not `CN=alice`). A unix-socket client's network is
//! `unix`: it passes when no networks are given, and otherwise only when
//! `unix` is listed. CIDR parsing is a dozen lines here, tested below, so
//! no crate is needed for it.
//!
//! The rules change at run time (`PATCH /v1/drives/{name}`): the table is
//! read at every decision, so a handshake sees the rules as they are when
//! it lists, describes or opens an export. Connections already open are
//! checked again by the server (`ShutdownHandle::recheck_access`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;

/// A source network an export may be reached from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// The unix socket.
    Unix,
    /// An address block: the address and the prefix length in bits.
    Cidr(IpAddr, u8),
}

/// A network in a rule that does not parse.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("'{0}' is not a network: give a CIDR like 10.0.0.0/8 or 127.0.0.1/32, or \"unix\" for the unix socket")]
pub struct BadNetwork(pub String);

impl std::fmt::Display for Network {
    /// The form `from_str` reads back: `unix`, or `ADDR/BITS`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Network::Unix => f.write_str("unix"),
            Network::Cidr(addr, bits) => write!(f, "{addr}/{bits}"),
        }
    }
}

impl std::str::FromStr for Network {
    type Err = BadNetwork;
    fn from_str(s: &str) -> Result<Network, BadNetwork> {
        if s == "unix" {
            return Ok(Network::Unix);
        }
        let bad = || BadNetwork(s.to_owned());
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) if b.is_empty() || !b.bytes().all(|c| c.is_ascii_digit()) => return Err(bad()),
            Some(b) => b.parse::<u8>().map_err(|_| bad())?,
        };
        if bits > max {
            return Err(bad());
        }
        Ok(Network::Cidr(addr, bits))
    }
}

impl Network {
    /// Whether a client from `source` is in this network.
    pub fn contains(&self, source: &Source) -> bool {
        match (self, source) {
            (Network::Unix, Source::Unix) => true,
            (Network::Cidr(net, bits), Source::Ip(ip)) => {
                let ip = match (net, ip) {
                    // An IPv4 client on a dual-stack socket.
                    (IpAddr::V4(_), IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                        Some(v4) => IpAddr::V4(v4),
                        None => return false,
                    },
                    _ => *ip,
                };
                match (net, ip) {
                    (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), *bits),
                    (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), *bits),
                    _ => false,
                }
            }
            _ => false,
        }
    }
}

/// Whether the first `bits` bits of `a` and `b` are equal.
fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let bits = bits as usize;
    let (whole, rest) = (bits / 8, bits % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[whole] & mask == b[whole] & mask
    }
}

/// Where a connection comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Unix,
    Ip(IpAddr),
}

/// The rules of one export (see the module docs). All empty: no rules,
/// the export is open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessRules {
    pub identities: Vec<String>,
    pub read_only_identities: Vec<String>,
    pub networks: Vec<Network>,
}

/// An identity in a rule that can never match.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "an identity cannot be empty: give the client certificate's CN or first SAN, like \"alice\""
)]
pub struct EmptyIdentity;

/// What a client may do with an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// The export does not exist for this client.
    Denied,
    ReadOnly,
    ReadWrite,
}

impl AccessRules {
    /// Whether there are no rules (the export is open to everyone).
    pub fn is_open(&self) -> bool {
        self == &AccessRules::default()
    }

    /// Checks that every identity can match (no empty names).
    pub fn check(&self) -> Result<(), EmptyIdentity> {
        let all = self.identities.iter().chain(&self.read_only_identities);
        match all.into_iter().any(|i| i.is_empty()) {
            true => Err(EmptyIdentity),
            false => Ok(()),
        }
    }

    pub fn grant(&self, identity: Option<&str>, source: &Source) -> Grant {
        if !self.networks.is_empty() && !self.networks.iter().any(|n| n.contains(source)) {
            return Grant::Denied;
        }
        let listed = |list: &[String]| identity.is_some_and(|i| list.iter().any(|x| x == i));
        if listed(&self.read_only_identities) {
            return Grant::ReadOnly;
        }
        let open = self.identities.is_empty() && self.read_only_identities.is_empty();
        if open || listed(&self.identities) {
            Grant::ReadWrite
        } else {
            Grant::Denied
        }
    }
}

/// A change to an export's access rules (`PATCH` of a drive or a
/// cache): each list given replaces the export's; absent ones stay as they are.
#[derive(Debug, Clone, Default)]
pub struct AccessChange {
    pub identities: Option<Vec<String>>,
    pub read_only_identities: Option<Vec<String>>,
    pub networks: Option<Vec<Network>>,
}

impl AccessChange {
    /// `rules` with this change applied.
    pub fn apply(&self, rules: &AccessRules) -> AccessRules {
        AccessRules {
            identities: self.identities.clone().unwrap_or(rules.identities.clone()),
            read_only_identities: self
                .read_only_identities
                .clone()
                .unwrap_or(rules.read_only_identities.clone()),
            networks: self.networks.clone().unwrap_or(rules.networks.clone()),
        }
    }
}

/// The rules of every export that has some, by export name, shared by
/// the server (which reads them at every decision) and the drives (which
/// set them at create, change and delete). A std-like lock, never held
/// across I/O: each reader copies out the one decision it needs.
#[derive(Debug, Default)]
pub struct AccessTable(RwLock<BTreeMap<String, AccessRules>>);

impl AccessTable {
    pub const fn new() -> Self {
        AccessTable(parking_lot::const_rwlock(BTreeMap::new()))
    }

    /// What a client gets for `export` (no rules: read-write).
    pub fn grant(&self, export: &str, identity: Option<&str>, source: &Source) -> Grant {
        match self.0.read().get(export) {
            None => Grant::ReadWrite,
            Some(r) => r.grant(identity, source),
        }
    }

    /// The rules of `export` (open: none).
    pub fn rules(&self, export: &str) -> AccessRules {
        self.0.read().get(export).cloned().unwrap_or_default()
    }

    /// Sets the rules of `export`; open rules remove its entry.
    pub fn set(&self, export: &str, rules: AccessRules) {
        let mut t = self.0.write();
        if rules.is_open() {
            t.remove(export);
        } else {
            t.insert(export.to_owned(), rules);
        }
    }
}

/// Why a client was refused, the `reason` label of
/// `ramd_nbd_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The access rules hide the export from this client.
    NotAllowed,
    /// An option before the TLS this listener requires.
    TlsRequired,
    /// A connection over `max_connections_per_address` (closed at accept).
    PerAddressLimit,
    /// A connection over `max_connections_per_identity` (refused once its
    /// certificate identity is known, after the TLS handshake).
    PerIdentityLimit,
}

impl Reason {
    pub const ALL: [Reason; REASONS] = [
        Reason::NotAllowed,
        Reason::TlsRequired,
        Reason::PerAddressLimit,
        Reason::PerIdentityLimit,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Reason::NotAllowed => "not_allowed",
            Reason::TlsRequired => "tls_required",
            Reason::PerAddressLimit => "per_address_limit",
            Reason::PerIdentityLimit => "per_identity_limit",
        }
    }
}

/// How many reasons there are.
const REASONS: usize = 4;

/// Refusals counted since start, shared by the server (which counts) and
/// the daemon (which reports them in /metrics). Atomics: counted from
/// every connection thread, never behind a lock.
#[derive(Debug)]
pub struct Refusals([AtomicU64; REASONS]);

impl Refusals {
    pub const fn new() -> Self {
        Refusals([const { AtomicU64::new(0) }; REASONS])
    }
    pub fn count(&self, reason: Reason) {
        self.0[reason as usize].fetch_add(1, Ordering::Relaxed);
    }
    pub fn get(&self, reason: Reason) -> u64 {
        self.0[reason as usize].load(Ordering::Relaxed)
    }
}

/// `ramd_nbd_refusals_total{reason}` at the moment of the scrape.
#[derive(Debug)]
pub struct RefusalCollector(pub [(Reason, u64); REASONS]);

impl Default for Refusals {
    fn default() -> Self {
        Refusals::new()
    }
}

impl RefusalCollector {
    pub fn of(r: &Refusals) -> Self {
        RefusalCollector(Reason::ALL.map(|x| (x, r.get(x))))
    }
}

impl Collector for RefusalCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let series = self
            .0
            .iter()
            .map(|(r, n)| {
                (
                    vec![("reason", r.label().to_owned())],
                    ConstCounter::new(*n),
                )
            })
            .collect();
        crate::metrics::prometheus::family(
            &mut enc,
            "ramd_nbd_refusals",
            "NBD clients refused an export or an option, by reason",
            None,
            series,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Source {
        Source::Ip(s.parse().unwrap())
    }

    #[test]
    fn networks_parse_and_refuse_garbage() {
        assert_eq!("unix".parse(), Ok(Network::Unix));
        assert_eq!(
            "10.0.0.0/8".parse(),
            Ok(Network::Cidr("10.0.0.0".parse().unwrap(), 8))
        );
        assert_eq!(
            "::1".parse(),
            Ok(Network::Cidr("::1".parse().unwrap(), 128))
        );
        for bad in [
            "",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0/8",
            "x/8",
            "::/129",
            "1.2.3.4/+8",
            "1.2.3.4/8/8",
        ] {
            assert!(bad.parse::<Network>().is_err(), "{bad}");
        }
    }

    #[test]
    fn cidr_contains_by_prefix() {
        let n: Network = "10.1.0.0/12".parse().unwrap();
        assert!(n.contains(&ip("10.15.255.255")));
        assert!(!n.contains(&ip("10.16.0.0")));
        assert!(!n.contains(&Source::Unix));
        let all: Network = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(&ip("192.168.1.1")));
        assert!(all.contains(&ip("::ffff:192.168.1.1")));
        assert!(!all.contains(&ip("::1")));
        let one: Network = "127.0.0.2/32".parse().unwrap();
        assert!(one.contains(&ip("127.0.0.2")));
        assert!(!one.contains(&ip("127.0.0.1")));
        let v6: Network = "fd00::/8".parse().unwrap();
        assert!(v6.contains(&ip("fdab::1")));
        assert!(!v6.contains(&ip("fe80::1")));
    }

    #[test]
    fn grants() {
        let r = AccessRules {
            identities: vec!["alice".into()],
            read_only_identities: vec!["bob".into()],
            networks: vec!["127.0.0.0/8".parse().unwrap(), Network::Unix],
        };
        let lo = ip("127.0.0.1");
        assert_eq!(r.grant(Some("alice"), &lo), Grant::ReadWrite);
        assert_eq!(r.grant(Some("bob"), &Source::Unix), Grant::ReadOnly);
        assert_eq!(r.grant(Some("eve"), &lo), Grant::Denied);
        assert_eq!(r.grant(None, &lo), Grant::Denied);
        assert_eq!(r.grant(Some("alice"), &ip("10.0.0.1")), Grant::Denied);
        let nets_only = AccessRules {
            networks: vec!["127.0.0.2/32".parse().unwrap()],
            ..AccessRules::default()
        };
        assert_eq!(nets_only.grant(None, &ip("127.0.0.2")), Grant::ReadWrite);
        assert_eq!(nets_only.grant(None, &ip("127.0.0.1")), Grant::Denied);
        assert_eq!(nets_only.grant(None, &Source::Unix), Grant::Denied);
        let table = AccessTable::default();
        assert_eq!(table.grant("x", None, &Source::Unix), Grant::ReadWrite);
        table.set("x", r.clone());
        assert_eq!(table.grant("x", None, &Source::Unix), Grant::Denied);
        assert_eq!(table.rules("x"), r);
        table.set("x", AccessRules::default());
        assert_eq!(table.grant("x", None, &Source::Unix), Grant::ReadWrite);
        assert!(table.0.read().is_empty(), "open rules leave no entry");
    }

    #[test]
    fn networks_print_as_they_parse() {
        for text in ["unix", "10.0.0.0/8", "127.0.0.2/32", "fd00::/8"] {
            let n: Network = text.parse().unwrap();
            assert_eq!(n.to_string(), text);
        }
        assert_eq!("::1".parse::<Network>().unwrap().to_string(), "::1/128");
        let bad = "10.0.0.0/33".parse::<Network>().unwrap_err().to_string();
        assert!(bad.starts_with("'10.0.0.0/33' is not a network"), "{bad}");
        let empty = AccessRules {
            identities: vec!["".into()],
            ..AccessRules::default()
        };
        assert_eq!(empty.check(), Err(EmptyIdentity));
    }
}
