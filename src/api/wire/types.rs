//! The JSON bodies of API v1, shared by the server and the client. Request
//! bodies reject unknown fields, so a typo is an error, not a silent no-op
//! (and fields added later are refused by older daemons, not ignored).
//! docs/openapi.yaml describes the same shapes.

use serde::{Deserialize, Serialize};

pub use super::values::{DurationValue, Latency, SizeValue, StatsRates, StatsTotals};

/// `POST /v1/drives`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateDrive {
    pub name: String,
    /// Required, except for a persistent drive whose state directory
    /// already holds one (it keeps its own size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_limit: Option<SizeValue>,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub overcommit: bool,
    /// Keep the drive in the daemon's state directory (restored when it
    /// holds one already).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub persist: bool,
    /// `none`, `periodic` (default) or `flush`; needs `persist`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    /// Background sync interval (default 60s); needs `persist`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_interval: Option<DurationValue>,
    /// Encrypt the state directory (AES-256-GCM); needs `key_file`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypt: bool,
    /// Absolute path of the key file, read by the daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
}

/// `PATCH /v1/drives/{name}`: absent fields stay as they are.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchDrive {
    /// New size (grow or shrink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<SizeValue>,
    /// Lock (true) or unlock (false) for writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// New memory limit; "none" removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_limit: Option<SizeValue>,
    /// Shrink even when it discards data.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// A persistent drive's new durability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    /// A persistent drive's new sync interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_interval: Option<DurationValue>,
}

/// `DELETE /v1/drives/{name}?force=true&keep_data=true`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    #[serde(default)]
    pub force: bool,
    /// A persistent drive: save it and keep its state directory (without:
    /// the state directory is removed).
    #[serde(default)]
    pub keep_data: bool,
}

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
    /// `checkpointing`, `done`, `failed`.
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

/// A drive as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriveInfo {
    pub name: String,
    /// "ram" (later kinds: persistent, cache).
    pub kind: String,
    /// "ready" (later states: restoring, failed).
    pub state: String,
    pub size_bytes: u64,
    pub read_only: bool,
    /// The drive's own memory limit; null when it has none.
    pub mem_limit_bytes: Option<u64>,
    /// Memory the drive holds now.
    pub allocated_bytes: u64,
    pub overcommit: bool,
    /// Open NBD connections.
    pub connections: u64,
    /// Mountpoints where it is attached through FUSE.
    pub attachments: Vec<String>,
    /// "config", "command-line" or "api".
    pub origin: String,
    pub created_unix_s: u64,
    /// NBD URI on the unix socket.
    pub uri: String,
    /// NBD URIs on TCP listeners.
    pub tcp_uris: Vec<String>,
    /// Set on changes to a drive the daemon re-creates at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
    /// A persistent drive's persistence; absent for RAM drives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persist: Option<PersistInfo>,
    /// Why a failed drive failed (the precise error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/drives`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DriveList {
    pub drives: Vec<DriveInfo>,
}

/// `DELETE /v1/drives/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deleted {
    pub name: String,
    /// NBD connections closed by a forced delete.
    pub closed_connections: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
    /// A persistent drive's state directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
    /// A persistent drive: true when its data was saved and kept, false
    /// when the state directory was removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_kept: Option<bool>,
}

/// The daemon memory budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    pub limit_bytes: u64,
    /// Memory all drives hold now.
    pub used_bytes: u64,
    /// Memory promised to drives (their sizes or limits, plus metadata).
    pub committed_bytes: u64,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    /// "ok".
    pub status: String,
    pub version: String,
    pub pid: u32,
    pub uptime_s: f64,
    pub started_unix_s: u64,
    pub api_socket: String,
    pub nbd_socket: String,
    pub nbd_tcp: Vec<String>,
    pub state_dir: String,
    pub config_file: Option<String>,
    pub metrics_enabled: bool,
    pub drives: u64,
    pub memory_budget: Budget,
}

/// `GET /v1/drives/{name}/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriveStats {
    pub name: String,
    pub size_bytes: u64,
    pub allocated_bytes: u64,
    pub mem_limit_bytes: Option<u64>,
    pub connections: u64,
    /// Null when metrics are off.
    pub totals: Option<StatsTotals>,
    /// Null when metrics are off or before the first full interval.
    pub rates: Option<StatsRates>,
    /// A ready persistent drive's persistence figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persist: Option<PersistStatusInfo>,
}

/// `GET /v1/stats`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsReport {
    pub metrics_enabled: bool,
    pub memory_budget: Budget,
    pub drives: Vec<DriveStats>,
    /// RAM caches with their counters and request rates.
    #[serde(default)]
    pub caches: Vec<super::caches::CacheInfo>,
}

/// `POST /v1/attachments`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateAttachment {
    pub drive: String,
    /// Absolute path of an existing directory: empty, not a mount point,
    /// not `/`.
    pub mountpoint: String,
    /// Attach over a non-empty directory or a mount point anyway (never
    /// over `/`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// An attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentInfo {
    pub id: u64,
    pub drive: String,
    pub mountpoint: String,
    /// The file to hand to losetup.
    pub file: String,
}

/// `GET /v1/attachments`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttachmentList {
    pub attachments: Vec<AttachmentInfo>,
}

/// Every error body: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable, machine-readable (see docs/api.md).
    pub code: String,
    /// For people: what went wrong and what to do.
    pub message: String,
}
