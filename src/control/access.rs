//! What every kind of export (drives, caches) does once its access rules
//! changed at run time, after the caller put them in the shared table the
//! servers read (under its own lock, so new connections see them at once):
//! the NBD server closes the open connections the new rules no longer
//! allow what they negotiated (after their pending requests), and the
//! change is logged once, the same way for every kind.

use super::ledger::Kind;
use crate::nbd::access::AccessRules;
use crate::nbd::ShutdownHandle;

/// Rechecks the open connections to export `name` of `kind` against its
/// new `rules` and logs the change; returns how many were closed.
pub fn rules_changed(
    kind: Kind,
    name: &str,
    rules: &AccessRules,
    nbd: Option<&ShutdownHandle>,
) -> usize {
    let closed = nbd.map_or(0, |h| h.recheck_access(name));
    let networks: Vec<String> = rules.networks.iter().map(|n| n.to_string()).collect();
    tracing::info!(
        kind = kind.noun(),
        export = %name,
        identities = ?rules.identities,
        read_only_identities = ?rules.read_only_identities,
        networks = %networks.join(","),
        closed_connections = closed,
        "access rules changed"
    );
    closed
}
