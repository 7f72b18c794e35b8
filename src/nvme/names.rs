//! Names and identifiers: the discovery subsystem's NQN, each drive's
//! subsystem NQN, and the namespace's NGUID and UUID. Pure.
//!
//! A drive's NQN is `nqn.2026-11.io.ramd:<node>:<drive>`: `<node>` is the
//! daemon's node id (a UUID the daemon keeps in its state directory), so
//! two daemons serving drives of the same name (the two legs of a mirror)
//! are two subsystems to a host, never two paths to one. The NGUID and
//! UUID are derived from the NQN by SHA-256, so they are stable across
//! restarts and unique wherever the NQN is; a host connecting twice (two
//! controllers, or after a restart) sees the same namespace.

/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// The prefix of every ramd subsystem NQN.
pub const NQN_PREFIX: &str = "nqn.2026-11.io.ramd:";

/// NQNs are at most 223 bytes (NVMe Base 2.0, 4.5).
pub const NQN_MAX: usize = 223;

/// The subsystem NQN of drive `drive` on node `node`.
pub fn subsystem_nqn(node: &str, drive: &str) -> String {
    format!("{NQN_PREFIX}{node}:{drive}")
}

/// The drive name in one of this node's subsystem NQNs.
pub fn drive_of<'a>(node: &str, nqn: &'a str) -> Option<&'a str> {
    let rest = nqn.strip_prefix(NQN_PREFIX)?.strip_prefix(node)?;
    rest.strip_prefix(':').filter(|d| !d.is_empty())
}

/// The namespace's NGUID and UUID (RFC 4122 version 8, name based): from
/// the NQN alone for a drive whose data lasts, from the NQN and its
/// `incarnation` for one whose data goes with the process (so a RAM drive
/// that comes back empty is a new namespace to the host).
pub fn namespace_ids(nqn: &str, incarnation: Option<&[u8; 16]>) -> ([u8; 16], [u8; 16]) {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(nqn.as_bytes());
    if let Some(i) = incarnation {
        ctx.update(i);
    }
    let d = ctx.finish();
    let d = d.as_ref();
    let nguid: [u8; 16] = d[..16].try_into().expect("16 bytes");
    let mut uuid: [u8; 16] = d[16..32].try_into().expect("16 bytes");
    uuid[6] = (uuid[6] & 0x0F) | 0x80;
    uuid[8] = (uuid[8] & 0x3F) | 0x80;
    (nguid, uuid)
}

/// A UUID's usual text form.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nqns_name_node_and_drive() {
        let n = subsystem_nqn("abcd", "db-1");
        assert_eq!(n, "nqn.2026-11.io.ramd:abcd:db-1");
        assert_eq!(drive_of("abcd", &n), Some("db-1"));
        assert_eq!(drive_of("abce", &n), None);
        assert_eq!(drive_of("abcd", "nqn.2026-11.io.ramd:abcd:"), None);
        assert_eq!(drive_of("abcd", DISCOVERY_NQN), None);
        // The longest drive name and a UUID node stay within the limit.
        let long = subsystem_nqn(&"0".repeat(36), &"a".repeat(64));
        assert!(long.len() <= NQN_MAX);
    }

    #[test]
    fn namespace_ids_are_stable_and_distinct() {
        let a = namespace_ids("nqn.2026-11.io.ramd:n1:a", None);
        assert_eq!(a, namespace_ids("nqn.2026-11.io.ramd:n1:a", None));
        assert_ne!(a, namespace_ids("nqn.2026-11.io.ramd:n2:a", None));
        // Another incarnation of a RAM drive is another namespace.
        let one = namespace_ids("nqn.2026-11.io.ramd:n1:a", Some(&[1; 16]));
        assert_ne!(one, a);
        assert_ne!(
            one,
            namespace_ids("nqn.2026-11.io.ramd:n1:a", Some(&[2; 16]))
        );
        assert_eq!(
            one,
            namespace_ids("nqn.2026-11.io.ramd:n1:a", Some(&[1; 16]))
        );
        assert_eq!(a.1[6] >> 4, 8);
        assert_eq!(a.1[8] >> 6, 2);
        assert_eq!(uuid_text(&[0x11; 16]).len(), 36);
    }
}
