//! Why a snapshot operation of the control plane was refused or failed.

use std::path::PathBuf;

use crate::control::caches::CachesError;
use crate::control::drives::DriveError;
use crate::control::remotes::RemotesError;
use crate::snapshot::manifest::BadSnapshotId;
use crate::snapshot::SnapshotError;

/// A snapshot request the daemon refused, or a failed run.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotsError {
    /// A remote that is unknown, unusable or badly given.
    #[error(transparent)]
    Remote(#[from] RemotesError),
    /// The drive is missing or not ready.
    #[error(transparent)]
    Drive(#[from] DriveError),
    /// The cache is missing or not serving, or its write-back failed
    /// (boxed: it is large, and rare).
    #[error(transparent)]
    Cache(Box<CachesError>),
    /// The lease owner id could not be had.
    #[error(transparent)]
    Owner(#[from] super::owner::OwnerError),
    /// A restore into this name is running.
    #[error("a restore into drive '{0}' is already running; wait for it to finish")]
    Restoring(String),
    /// The persistent drive's state directory holds data already.
    #[error("the state directory {} of drive '{name}' is not empty: restore under another name with --as NAME, or delete the drive first (`ramd delete {name}`)", dir.display())]
    StateDirTaken {
        name: String,
        dir: std::path::PathBuf,
    },
    /// Writing the restored drive's state directory failed; nothing of
    /// it was kept.
    #[error("cannot write the restored drive '{name}' into {}: {source}; nothing was kept (free space there, or restore without --persist)", dir.display())]
    Disk {
        name: String,
        dir: std::path::PathBuf,
        source: Box<StagingError>,
    },
    /// The restored drive did not load from its state directory.
    #[error("drive '{name}' was restored into {} but did not load: {reason}", dir.display())]
    NotLoaded {
        name: String,
        dir: std::path::PathBuf,
        reason: String,
    },
    /// The engine failed (its message names the remote and object).
    #[error(transparent)]
    Engine(#[from] SnapshotError),
    /// A push of this drive is already running.
    #[error("a snapshot of drive '{0}' is already being taken; wait for it to finish (see `ramd snapshot status {0}`)")]
    Busy(String),
    /// The cut layer refused.
    #[error("drive '{drive}': {source}")]
    Cut {
        drive: String,
        source: crate::block::cut::CutError,
    },
    /// The drive name cannot name snapshots.
    #[error("drive name '{0}' cannot name snapshots")]
    DriveName(String),
    /// Not a snapshot id.
    #[error("'{text}': {source}")]
    BadId { text: String, source: BadSnapshotId },
    /// The remote holds no snapshot of the drive.
    #[error("remote '{remote}' holds no snapshot of drive '{drive}' (see `ramd snapshot list --remote {remote}`)")]
    NoSnapshot { remote: String, drive: String },
    /// The target drive exists already.
    #[error(
        "drive '{0}' already exists: restore into a new name with --as NAME, or delete it first"
    )]
    TargetExists(String),
    /// The snapshot is larger than the drive that should take it.
    #[error("snapshot {id} is {snapshot_bytes} bytes, larger than drive '{drive}' ({drive_bytes} bytes): make the drive at least that large")]
    TooLarge {
        id: String,
        drive: String,
        snapshot_bytes: u64,
        drive_bytes: u64,
    },
    /// No such job.
    #[error("no snapshot job {0} (jobs are kept for an hour after they end)")]
    NoJob(u64),
    /// A retention that keeps nothing.
    #[error("keep_last / keep_daily of 0 would delete every snapshot: give at least 1")]
    KeepNothing,
    /// The new drive's memory could not be had.
    #[error("cannot make the restored drive: {0}")]
    Store(#[from] crate::block::backend::Error),
    /// Restores at start need a runtime.
    #[error("cannot start the snapshot runtime: {0}")]
    Runtime(std::io::Error),
}

impl From<CachesError> for SnapshotsError {
    fn from(e: CachesError) -> Self {
        SnapshotsError::Cache(Box::new(e))
    }
}

/// Why the staged copy could not be made.
#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    /// Creating the drive's files failed.
    #[error(transparent)]
    Create(#[from] crate::control::drives::persistent::DiskError),
    /// Saving the restored data failed (a full disk: ENOSPC).
    #[error(transparent)]
    Save(#[from] crate::persist::Error),
    /// The staged copy could not be moved into place.
    #[error("cannot move {} to {}: {source}", from.display(), to.display())]
    Rename {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
    /// The drives directory could not be synced after the rename.
    #[error("cannot sync {}: {source}", dir.display())]
    SyncDir {
        dir: PathBuf,
        source: std::io::Error,
    },
}
