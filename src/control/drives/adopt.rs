//! Drives made from data filled elsewhere first (a snapshot restore), and
//! the one rule a snapshot push imposes on the drives (no resize while a
//! cut is open).
//!
//! [`Drives::adopt`] registers a RAM drive (raw or compressed) around a
//! store the caller already filled and verified, so the drive is served only once its data
//! is complete (`control::snapshots` invariants). The name and budget are
//! claimed here, at the end: a name taken meanwhile fails the adoption
//! and the store is dropped.

use std::sync::Arc;

use super::error::NotReady;
use super::spec::{check_name, DriveSpec};
use super::{check_size, promise_for, Drive, DriveData, DriveError, DriveKind, DriveState, Drives};
use crate::control::ledger::{now_unix_s, Kind, Origin};
use crate::size::format_size;

impl Drives {
    /// Whether a drive of `spec` could be registered now (the name free,
    /// the size legal, its promise within the budget): checked before a
    /// restore downloads anything, so an answer that would come at the end
    /// comes at once. (Also for restores into persistent drives, which
    /// promise the same.)
    pub fn check_room(&self, spec: &DriveSpec) -> Result<(), DriveError> {
        check_name(&spec.name)?;
        check_size(spec.size_bytes)?;
        let promise = promise_for(spec.size_bytes, spec.mem_limit_bytes, spec.overcommit);
        Ok(self.ledger.check_claim(Kind::Drive, &spec.name, &promise)?)
    }

    /// Registers a RAM drive over `data` (a raw or compressed store filled
    /// by the caller, of `spec.size_bytes`) and serves it.
    pub fn adopt(
        self: &Arc<Self>,
        spec: &DriveSpec,
        origin: Origin,
        data: DriveData,
    ) -> Result<Arc<Drive>, DriveError> {
        check_name(&spec.name)?;
        check_size(spec.size_bytes)?;
        debug_assert!(matches!(data, DriveData::Ram(_) | DriveData::Compressed(_)));
        let mut drives = self.drives.lock();
        let promise = promise_for(spec.size_bytes, spec.mem_limit_bytes, spec.overcommit);
        let claim = self
            .ledger
            .claim_guarded(Kind::Drive, &spec.name, origin, &promise)?;
        let drive = self.assemble(
            spec,
            claim.claim().clone(),
            DriveKind::Ram,
            DriveState::Ready,
            data,
            None,
            None,
            now_unix_s(),
        );
        self.insert(&mut drives, &drive)?;
        claim.keep();
        tracing::info!(drive = %spec.name, size = %format_size(spec.size_bytes), "drive created from restored data");
        Ok(drive)
    }
}

/// Refuses a resize of `drive` while a snapshot push reads it.
pub(super) fn check_resize(drive: &Drive, new_size: Option<u64>) -> Result<(), DriveError> {
    if new_size.is_some_and(|s| s != drive.size_bytes()) && drive.export.is_cut_open() {
        return Err(NotReady::SnapshotRunning {
            name: drive.name.clone(),
        }
        .into());
    }
    Ok(())
}
