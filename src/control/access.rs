//! What every kind of export (drives, caches) does once its access rules
//! changed at run time, after the caller put them in the shared table the
//! servers read (under its own lock, so new connections see them at once):
//! the NBD server closes the open connections the new rules no longer
//! allow what they negotiated (after their pending requests), the NVMe/TCP
//! target removes the controllers whose host lost its grant (or its right
//! to write), and the change is logged once, the same way for every kind.

use std::sync::{Arc, OnceLock};

use super::ledger::Kind;
use crate::nbd::access::AccessRules;
use crate::nbd::ShutdownHandle;
use crate::nvme::Target;

/// The servers an export's connections live in, set once they are bound
/// (an export manager exists before them).
#[derive(Default)]
pub struct Servers {
    nbd: OnceLock<ShutdownHandle>,
    nvme: OnceLock<Arc<Target>>,
}

impl Servers {
    /// Records the servers once they are bound (the NVMe/TCP target only
    /// when the daemon listens for it).
    pub fn set(&self, nbd: ShutdownHandle, nvme: Option<Arc<Target>>) {
        let _ = self.nbd.set(nbd);
        if let Some(t) = nvme {
            let _ = self.nvme.set(t);
        }
    }

    /// The NBD server's handle, once bound.
    pub fn nbd(&self) -> Option<&ShutdownHandle> {
        self.nbd.get()
    }

    /// Rechecks the open connections to export `name` of `kind` against
    /// its new `rules` and logs the change; returns what was closed.
    pub fn rules_changed(&self, kind: Kind, name: &str, rules: &AccessRules) -> Closed {
        let closed = Closed {
            nbd: self.nbd.get().map_or(0, |h| h.recheck_access(name)),
            nvme: self.nvme.get().map_or(0, |t| t.recheck_access(name)),
        };
        log_change(kind, name, rules, closed);
        closed
    }
}

/// What an access change closed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Closed {
    /// NBD connections (after their pending requests).
    pub nbd: usize,
    /// NVMe/TCP controllers, each with its admin and I/O queues.
    pub nvme: usize,
}

fn log_change(kind: Kind, name: &str, rules: &AccessRules, closed: Closed) {
    let networks: Vec<String> = rules.networks.iter().map(|n| n.to_string()).collect();
    tracing::info!(
        kind = kind.noun(),
        export = %name,
        identities = ?rules.identities,
        read_only_identities = ?rules.read_only_identities,
        networks = %networks.join(","),
        closed_nbd_connections = closed.nbd,
        closed_nvme_controllers = closed.nvme,
        "access rules changed"
    );
}
