//! Snapshots of drives and caches in object storage, as the daemon runs
//! them: the remotes (`control::remotes`), pushes on request and on
//! schedule, listings, prune, restores into new RAM or persistent drives
//! and at start, and their state for the API and /metrics. The engine is
//! `crate::snapshot`.
//!
//! ```text
//!  policy.rs      [[drive]] / [[cache]] snapshot keys (pure)
//!  target.rs      what a push reads: a drive, or a cache (written back first)
//!  ids.rs         snapshot ids as users type them (pure)
//!  jobs.rs        background pushes/restores the API reports (progress, outcome)
//!  service.rs     Snapshots: push, list, delete, prune; per name+remote state
//!  restore.rs     restores: into new RAM or persistent drives, and at start
//!  persistent.rs  a restore into a state directory, staged and renamed (crash-safe)
//!  owner.rs       the daemon's lease owner id (frees its killed pushes' leases)
//!  schedule.rs    scheduled pushes (one task per drive or cache)
//!  metrics.rs     /metrics families
//!  error.rs       SnapshotsError
//! ```
//!
//! The invariants are in `service.rs`, `restore.rs` and `persistent.rs`.

pub mod error;
pub mod ids;
pub mod jobs;
pub mod metrics;
pub mod owner;
pub mod persistent;
pub mod policy;
pub mod restore;
pub mod schedule;
pub mod service;
pub mod target;

pub use error::SnapshotsError;
pub use policy::{DrivePolicy, PolicyKeys, TargetKind};
pub use restore::RestoreRequest;
pub use service::{PushRequest, PushStatus, Snapshots};
pub use target::Target;

use std::path::Path;

/// The drives `restore_from` must fill at this start, with their remote:
/// a RAM drive always; a persistent one when its state directory
/// (`drives_dir/NAME`) is missing or empty. Call before the drives are
/// created (creating a persistent drive fills its directory).
pub fn restores_due(
    policies: &std::collections::BTreeMap<String, DrivePolicy>,
    persistent: &dyn Fn(&str) -> bool,
    drives_dir: &Path,
) -> Vec<(String, String)> {
    policies
        .iter()
        .filter_map(|(d, p)| p.restore_from.clone().map(|r| (d.clone(), r)))
        .filter(|(d, _)| {
            !persistent(d)
                || std::fs::read_dir(drives_dir.join(d)).map_or(true, |mut e| e.next().is_none())
        })
        .collect()
}

/// The snapshot service and the `(drive, remote)` restores due at start.
pub type Prepared = (std::sync::Arc<Snapshots>, Vec<(String, String)>);

/// At start: the remotes (config plus `STATE_DIR/remotes.json`), every
/// remote the drives' settings name checked to exist, and the restores
/// due (see [`restores_due`]).
pub fn prepare(
    config_remotes: Vec<crate::control::remotes::RemoteSpec>,
    policies: std::collections::BTreeMap<String, DrivePolicy>,
    state_dir: &Path,
    persistent: &dyn Fn(&str) -> bool,
) -> Result<Prepared, SnapshotsError> {
    let remotes = crate::control::remotes::Remotes::load(config_remotes, Some(state_dir))?;
    for p in policies.values() {
        for r in p.remote.iter().chain(p.restore_from.iter()) {
            remotes.get(r)?;
        }
    }
    let due = restores_due(
        &policies,
        persistent,
        &crate::control::drives::persistent::drives_dir(state_dir),
    );
    let owner = owner::load_or_create(state_dir)?;
    Ok((
        std::sync::Arc::new(Snapshots::new(remotes, policies, owner)),
        due,
    ))
}
