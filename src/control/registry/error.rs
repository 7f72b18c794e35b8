//! What each refusal of the registry is, with the facts its message is
//! made of. [`super::RegistryError`] groups them by what the API answers
//! (its code and HTTP status); the messages say what to do next.

use std::path::PathBuf;

use crate::control::persistent::settings::SettingsError;
use crate::size::format_size;

/// Something would not fit in the memory budget.
#[derive(Debug, thiserror::Error)]
pub enum OverBudget {
    /// A drive's metadata alone does not fit in what is free.
    #[error("drive '{name}' of {} needs {} of metadata but only {} of the {} memory budget is free; choose a smaller size", format_size(*size), format_size(*meta), format_size(*room), format_size(*limit))]
    Metadata {
        name: String,
        size: u64,
        meta: u64,
        room: u64,
        limit: u64,
    },
    /// A drive could hold more than the unpromised budget.
    #[error("drive '{name}' could hold {} (plus {} of metadata) but only {} of the daemon's {} memory budget is unpromised; choose a smaller size, cap its memory with mem-limit, allow overcommit (writes past the budget then fail with ENOSPC), or start the daemon with a larger --mem-budget", format_size(*data), format_size(*meta), format_size(*room), format_size(*limit))]
    Drive {
        name: String,
        data: u64,
        meta: u64,
        room: u64,
        limit: u64,
    },
    /// Something other than a drive (`what`: a cache) does not fit.
    #[error("{what} needs {} but only {} of the {} memory budget is not promised to drives and caches; use a smaller --size, delete a drive or cache, or start the daemon with a larger --mem-budget", format_size(*bytes), format_size(*room), format_size(*limit))]
    Other {
        what: String,
        bytes: u64,
        room: u64,
        limit: u64,
    },
}

/// A shrink would discard data stored beyond the new size.
#[derive(Debug, thiserror::Error)]
#[error("shrinking '{name}' to {} would discard data stored up to {}; pass force (ramd resize --force) to discard it", format_size(*size), format_size(*end))]
pub struct DataBeyondSize {
    pub name: String,
    pub size: u64,
    pub end: u64,
}

/// The drive is in use.
#[derive(Debug, thiserror::Error)]
pub enum Busy {
    /// Attached at mountpoints (`force`: the delete was forced already).
    #[error("drive '{name}' is attached at {}; unmount what uses it and run `ramd detach MOUNTPOINT` first{}", join_paths(mountpoints), if *force { "" } else { " (or delete with force)" })]
    Attached {
        name: String,
        mountpoints: Vec<PathBuf>,
        force: bool,
    },
    /// NBD clients are connected.
    #[error("drive '{name}' has {connections} open NBD connection{}; disconnect the client{} or delete with force (ramd delete --force), which closes them", plural(*connections), plural(*connections))]
    Connections { name: String, connections: usize },
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

/// Paths as one comma-separated list, for messages.
pub(crate) fn join_paths(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}

/// The plural ending for `n` things.
pub(crate) fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
