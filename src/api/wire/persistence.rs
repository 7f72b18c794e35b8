//! Persistent drives on the wire: `POST /v1/drives/{name}/sync` and
//! `/restore`, and the `persist` object of a drive (status, progress of a
//! restore, what the last one found).
//!
//! Request bodies reject unknown fields, so a typo is an error, not a
//! silent no-op (and fields added later are refused by older daemons, not
//! ignored). docs/openapi.yaml describes the same shapes.

use serde::{Deserialize, Serialize};

/// `POST /v1/drives/{name}/restore`: restore a failed drive again.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// Load despite damage: corrupt image pages as they are (zero when
    /// encrypted), the journal up to its damage.
    #[serde(default)]
    pub force: bool,
    /// Ignore the journal: load the image as of its last checkpoint.
    #[serde(default)]
    pub discard_journal: bool,
    /// Use this key file from now on (absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
}

/// `POST /v1/drives/{name}/sync`: what the sync saved (it is durable).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncResult {
    pub name: String,
    /// The generation written (0: nothing had changed).
    pub generation: u64,
    /// Bytes of pages with data saved.
    pub data_bytes: u64,
    /// Bytes of pages saved as zero (trimmed).
    pub zero_bytes: u64,
    /// Bytes appended to the journal.
    pub journal_bytes: u64,
    pub duration_ms: f64,
    /// Every write acknowledged before this moment is on disk.
    pub durable_as_of_unix_ms: Option<u64>,
}

/// Done and total bytes of a running sync or restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub done_bytes: u64,
    pub total_bytes: u64,
}

/// The live persistence figures of a ready persistent drive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistStatusInfo {
    /// `idle`, `syncing`, `retrying`, `failing`.
    pub sync_state: String,
    /// When the last successful sync finished.
    pub last_sync_unix_ms: Option<u64>,
    /// The moment the disk's state shows (the last sync's cut).
    pub durable_as_of_unix_ms: Option<u64>,
    pub last_sync_duration_ms: Option<f64>,
    pub max_sync_duration_ms: f64,
    /// Newest durable generation.
    pub durable_generation: u64,
    /// Changed in RAM, not yet on disk.
    pub dirty_bytes: u64,
    /// Committed journal not yet checkpointed into the image.
    pub journal_bytes: u64,
    /// Copies held for a running sync (copy-on-write).
    pub snapshot_copy_bytes: u64,
    /// Written to disk since the drive was opened.
    pub bytes_written: u64,
    pub syncs_ok: u64,
    pub syncs_failed: u64,
    pub consecutive_failures: u64,
    pub checkpoints: u64,
    /// The last sync or checkpoint error since the last success.
    pub last_error: Option<String>,
    pub last_error_unix_ms: Option<u64>,
    /// The running sync's progress.
    pub sync_progress: Option<Progress>,
    /// Sync durations since open: count and sum (for rates and means).
    pub sync_count: u64,
    pub sync_seconds_total: f64,
    /// How long the restore at open took (null: created new).
    pub restore_duration_ms: Option<f64>,
}

/// The last restore of a persistent drive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreInfo {
    /// `queued`, `verifying`, `loading_image`, `replaying`,
    /// `checkpointing`, `waiting_for_memory` (the host was short of memory:
    /// the restore starts again when it recovers), `done`, `failed`.
    pub phase: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// How long it took (when done).
    pub duration_ms: Option<f64>,
    /// What it did, for people (when done).
    pub summary: Option<String>,
    /// A torn journal tail that was cut (when done).
    pub torn_tail: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
}

/// How a persistent drive keeps its data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistInfo {
    pub state_dir: String,
    /// `none`, `periodic`, `flush`.
    pub durability: String,
    /// True in `none` mode: FLUSH returns at once and saves nothing.
    pub flush_is_noop: bool,
    pub sync_interval_ms: u64,
    pub encrypted: bool,
    pub key_file: Option<String>,
    /// Null until the drive is ready.
    pub status: Option<PersistStatusInfo>,
    /// Null for a drive created new in this run.
    pub restore: Option<RestoreInfo>,
}
