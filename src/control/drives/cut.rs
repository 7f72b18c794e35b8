//! The one rule a snapshot push imposes on the drives: no resize while a
//! cut is open (the push reads the drive as it was at the cut).

use super::error::NotReady;
use super::{Drive, DriveError};

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
