//! The daemon's NVMe/TCP target (`--nvme-listen`, config `nvme_listen`):
//! the node id every subsystem NQN carries, the plaintext rule, start.
//!
//! NVMe/TCP here has no TLS (TP 8011 needs TLS 1.3 with external PSKs,
//! which rustls does not offer; docs/nvme.md), so like plaintext NBD it
//! serves a loopback address as it is and any other address only when
//! `--nvme-plaintext` (config `nvme_plaintext = true`) says so.
//!
//! The node id is a random UUID written once to `<state dir>/nvme-node-id`
//! and read at every start, so a drive's NQN, NGUID and UUID stay the same
//! across restarts (hosts reconnect to the same subsystem) and differ
//! between two daemons (the legs of a mirror are two subsystems).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::block::ExportTable;
use crate::nbd::access::AccessTable;
use crate::nvme::{NvmeServer, NvmeShutdown, Target, TargetConfig};

/// The default NVMe/TCP port (IANA).
pub const NVME_PORT: u16 = 4420;

/// Why the NVMe/TCP target did not start.
#[derive(Debug, thiserror::Error)]
pub enum NvmeStartError {
    /// Plaintext on an address other machines reach, not asked for.
    #[error("refusing to serve NVMe/TCP in plaintext on {addr}, which other machines can reach (NVMe/TCP TLS is not offered yet, docs/nvme.md): listen on a loopback address, or pass --nvme-plaintext to serve it anyway on a trusted network")]
    PlaintextOnNetwork { addr: SocketAddr },
    /// The node id file could not be read or written.
    #[error("NVMe/TCP node id {path}: {source}")]
    NodeId { path: PathBuf, source: io::Error },
    /// The listener could not be bound.
    #[error("cannot listen for NVMe/TCP on {addrs:?}: {source}")]
    Bind {
        addrs: Vec<SocketAddr>,
        source: io::Error,
    },
}

/// `ADDR[:PORT]` as `--nvme-listen` takes it: the port defaults to 4420.
pub fn parse_nvme_listen(text: &str) -> Result<SocketAddr, super::listen_addr::ListenAddrError> {
    // A bare IP address (IPv6 ones included: `::1` would otherwise look
    // like host `:` and port 1).
    if let Ok(ip) = text.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, NVME_PORT));
    }
    match super::listen_addr::parse_listen_addr(text) {
        Err(super::listen_addr::ListenAddrError::NoPort { .. }) => {
            super::listen_addr::parse_listen_addr(&format!("{text}:{NVME_PORT}"))
        }
        other => other,
    }
}

/// serde: the config key `nvme_listen`, a list of `ADDR[:PORT]`.
pub fn de_nvme_listen<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<SocketAddr>>, D::Error> {
    let texts = <Vec<String> as serde::Deserialize>::deserialize(d)?;
    texts
        .iter()
        .map(|t| parse_nvme_listen(t).map_err(serde::de::Error::custom))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Refuses plaintext on a non-loopback address unless allowed.
pub fn check_plaintext(addrs: &[SocketAddr], allowed: bool) -> Result<(), NvmeStartError> {
    match addrs.iter().find(|a| !a.ip().is_loopback()) {
        Some(a) if !allowed => Err(NvmeStartError::PlaintextOnNetwork { addr: *a }),
        _ => Ok(()),
    }
}

/// The daemon's node id (see the module docs), created on first use.
pub fn node_id(state_dir: &Path) -> Result<String, NvmeStartError> {
    let path = state_dir.join("nvme-node-id");
    let err = |source| NvmeStartError::NodeId {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(s) if is_uuid(s.trim()) => return Ok(s.trim().to_owned()),
        Ok(_) => {
            return Err(err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a UUID; remove the file to make a new id (hosts then see new NQNs)",
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let mut b = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .map_err(|_| err(io::Error::other("no random bytes")))?;
    b[6] = (b[6] & 0x0F) | 0x40;
    b[8] = (b[8] & 0x3F) | 0x80;
    let id = crate::nvme::names::uuid_text(&b);
    std::fs::create_dir_all(state_dir).map_err(err)?;
    let tmp = state_dir.join("nvme-node-id.tmp");
    std::fs::write(&tmp, format!("{id}\n")).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)?;
    Ok(id)
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// A started target: stop it with the handle, then join the thread.
pub struct RunningNvme {
    pub shutdown: NvmeShutdown,
    pub thread: std::thread::JoinHandle<io::Result<()>>,
    /// The addresses bound.
    pub addrs: Vec<SocketAddr>,
    /// The node id the drives' NQNs carry.
    pub node: String,
    /// The target, for what it serves now (hosts per drive).
    pub target: Arc<Target>,
}

/// Binds and starts the target over the daemon's exports and access rules.
pub fn start(
    listen: &[SocketAddr],
    plaintext: bool,
    node: &str,
    exports: Arc<ExportTable>,
    access: Arc<AccessTable>,
) -> Result<RunningNvme, NvmeStartError> {
    check_plaintext(listen, plaintext)?;
    let config = TargetConfig::new(listen.to_vec(), node);
    let target = Arc::new(Target::new(config, exports, access));
    let server = NvmeServer::bind(target.clone()).map_err(|source| NvmeStartError::Bind {
        addrs: listen.to_vec(),
        source,
    })?;
    let addrs = server.local_addrs();
    let handle = server.shutdown_handle();
    let thread = std::thread::Builder::new()
        .name("nvme-accept".into())
        .spawn(move || server.run())
        .map_err(|source| NvmeStartError::Bind {
            addrs: listen.to_vec(),
            source,
        })?;
    for a in &addrs {
        tracing::info!(
            "NVMe/TCP on {a} (discovery: nvme discover -t tcp -a {} -s {})",
            a.ip(),
            a.port()
        );
    }
    Ok(RunningNvme {
        shutdown: handle,
        thread,
        addrs,
        node: node.to_owned(),
        target,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_defaults_to_4420() {
        assert_eq!(
            parse_nvme_listen("127.0.0.1").unwrap(),
            "127.0.0.1:4420".parse().unwrap()
        );
        assert_eq!(
            parse_nvme_listen("127.0.0.1:4421").unwrap(),
            "127.0.0.1:4421".parse().unwrap()
        );
        assert_eq!(
            parse_nvme_listen("::1").unwrap(),
            "[::1]:4420".parse().unwrap()
        );
        assert_eq!(
            parse_nvme_listen("[::1]:9").unwrap(),
            "[::1]:9".parse().unwrap()
        );
    }

    #[test]
    fn plaintext_beyond_loopback_needs_the_opt_in() {
        let lo: SocketAddr = "127.0.0.1:4420".parse().unwrap();
        let net: SocketAddr = "0.0.0.0:4420".parse().unwrap();
        assert!(check_plaintext(&[lo], false).is_ok());
        let e = check_plaintext(&[lo, net], false).unwrap_err();
        assert!(e.to_string().contains("--nvme-plaintext"), "{e}");
        assert!(check_plaintext(&[net], true).is_ok());
    }

    #[test]
    fn the_node_id_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = node_id(dir.path()).unwrap();
        assert!(is_uuid(&a), "{a}");
        assert_eq!(node_id(dir.path()).unwrap(), a);
        std::fs::write(dir.path().join("nvme-node-id"), "garbage").unwrap();
        assert!(node_id(dir.path()).is_err());
    }
}
