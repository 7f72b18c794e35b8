//! What each refusal of an operation on drives is, with the facts its
//! message is made of. [`DriveError`] groups them by what the API answers
//! (its code and HTTP status); the messages say what to do next. The
//! refusals every kind shares (bad name, name taken, not found, over the
//! budget, in use) are the ledger's, wrapped as [`DriveError::Ledger`].

use std::path::PathBuf;

use super::persistent::settings::SettingsError;
use super::spec::SpecError;
use crate::control::ledger::LedgerError;
use crate::size::format_size;

/// Why an operation on drives was refused. The API maps each to a code and
/// an HTTP status; messages say what to do next.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    /// A name or size was malformed.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// Refused by the rules every kind shares: the name is taken, no
    /// such drive, over the budget, or in use.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// A shrink would discard data.
    #[error(transparent)]
    DataBeyondSize(#[from] DataBeyondSize),
    /// The store refused.
    #[error(transparent)]
    Store(#[from] crate::block::backend::Error),
    /// The drive is restoring or failed.
    #[error(transparent)]
    NotReady(#[from] NotReady),
    /// The operation needs a persistent drive.
    #[error("drive '{0}' is not persistent (RAM only): it has no data on disk; create a drive with --persist to keep one")]
    NotPersistent(String),
    /// Persistent drives need a state directory and this daemon has none.
    #[error("this daemon has no state directory for persistent drives")]
    NoStateDir,
    /// A restore was asked of a drive whose state directory holds nothing.
    #[error("there is nothing to restore in {}: delete the drive (`ramd delete {name}`) and create it again", dir.display())]
    NothingToRestore { name: String, dir: PathBuf },
    /// A persistent drive's state directory could not be created or used.
    #[error(transparent)]
    Disk(#[from] super::persistent::DiskError),
    /// A sync failed; the drive keeps serving from RAM.
    #[error(transparent)]
    SyncFailed(#[from] SyncFailed),
    /// A locked drive does not fit the daemon's `RLIMIT_MEMLOCK`.
    #[error(transparent)]
    Memlock(#[from] super::memlock::MemlockTooLow),
}

/// A shrink would discard data stored beyond the new size.
#[derive(Debug, thiserror::Error)]
#[error("shrinking '{name}' to {} would discard data stored up to {}; pass force (ramd resize --force) to discard it", format_size(*size), format_size(*end))]
pub struct DataBeyondSize {
    pub name: String,
    pub size: u64,
    pub end: u64,
}

/// The drive is not ready for the operation (restoring, failed, or ready
/// when a restore was asked).
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// `ramd restore` of a drive that is ready.
    #[error("drive '{name}' is ready: `ramd restore` is for a drive that failed to restore (to reload from disk, `ramd delete {name} --keep-data` and create it again)")]
    AlreadyReady { name: String },
    /// `ramd restore` of a drive that is restoring.
    #[error("drive '{name}' is already restoring ({progress})")]
    AlreadyRestoring { name: String, progress: String },
    /// `ramd restore` of a drive whose `drive.json` is unusable.
    #[error("{source} (`ramd restore {name}` after fixing it)")]
    Settings { name: String, source: SettingsError },
    /// Deleting a drive while it restores.
    #[error("drive '{name}' is restoring; wait until it is ready or failed (`ramd info {name}`), then delete it")]
    DeleteWhileRestoring { name: String },
    /// The drive failed to restore (`reason`: the restore's error).
    #[error("drive '{name}' failed to restore: {reason}. Decide with `ramd restore {name} --force` or `--discard-journal`, or `ramd delete {name}`")]
    Failed { name: String, reason: String },
    /// The drive is restoring.
    #[error(
        "drive '{name}' is restoring ({progress}); try again when it is ready (`ramd info {name}`)"
    )]
    Restoring { name: String, progress: String },
    /// A resize while a snapshot push reads the drive.
    #[error("drive '{name}' cannot be resized while a snapshot of it is being taken; try again when it is done (`ramd snapshot status {name}`)")]
    SnapshotRunning { name: String },
}

/// Writing a persistent drive's data to disk failed; the drive keeps
/// serving from RAM.
#[derive(Debug, thiserror::Error)]
pub enum SyncFailed {
    /// A sync asked for.
    #[error("sync of '{name}' failed: {source}. The drive keeps serving from RAM; the disk holds its last completed sync")]
    Sync {
        name: String,
        source: crate::persist::Error,
    },
    /// The final save of a delete with --keep-data.
    #[error("drive '{name}' was not deleted: saving its data failed: {source}. It is still served from RAM; fix the disk and retry, or delete it without --keep-data")]
    KeepData {
        name: String,
        source: crate::persist::Error,
    },
}
