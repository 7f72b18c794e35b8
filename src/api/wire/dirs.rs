//! Wire types of `/v1/dirs`: what the API says about directories kept in
//! RAM. They mirror the directory manager's types field for field (the JSON
//! is the one docs/api.md and docs/openapi.yaml describe), so clients such
//! as the CLI depend on the API and not on `dirsync`. The handlers convert
//! with the `From` impls in `api::server::dir_wire`, whose test checks the
//! JSON is the same.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::ErrorDetail;
use super::values::{DurationValue, SizeValue};

/// How the RAM copy is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountMode {
    /// A tmpfs filled with a copy of the directory.
    Tmpfs,
    /// overlayfs over the on-disk copy, a tmpfs upper.
    Overlay,
}

/// Where a directory is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DirStatus {
    /// Being filled / mounted.
    Activating,
    /// In RAM and synced on schedule.
    Active,
    /// Start-up recovery failed; see `last_error`.
    Failed,
}

/// How full a RAM copy is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsageLevel {
    /// Below 80%.
    Ok,
    /// At least 80%.
    Warning,
    /// At least 95%.
    Critical,
    /// No space (or no inodes) left.
    Full,
}

/// Space and inode use of a tmpfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub used_bytes: u64,
    pub total_bytes: u64,
    pub used_inodes: u64,
    pub total_inodes: u64,
}

/// What a sync did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncReport {
    pub entries_scanned: u64,
    pub unchanged: u64,
    pub files_copied: u64,
    pub bytes_copied: u64,
    pub links_made: u64,
    pub specials_made: u64,
    pub dirs_created: u64,
    pub entries_deleted: u64,
    pub dir_attrs_set: u64,
    pub xattrs_dropped: u64,
    pub retries: u64,
    /// Files (relative paths) that kept changing: left for the next sync.
    pub changed_during_sync: Vec<PathBuf>,
    /// Destination-only entries kept, not deleted.
    #[serde(default)]
    pub conflicts: Vec<PathBuf>,
    pub duration_ms: u64,
}

/// A complete recovery copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryCopy {
    pub path: PathBuf,
    /// Seconds since the epoch, UTC.
    pub created_unix_s: u64,
}

/// Who asked for a directory to be kept in RAM.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DirOrigin {
    /// `ramd dir add` / `POST /v1/dirs`.
    #[default]
    Api,
    /// A `[[dir]]` in this config file.
    Config { file: PathBuf },
}

/// Counters of a directory's syncs since the daemon started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncTotals {
    pub syncs: u64,
    pub failed_syncs: u64,
    pub files_copied: u64,
    pub bytes_copied: u64,
    pub entries_deleted: u64,
    pub files_skipped_changing: u64,
    pub duration_ms: u64,
}

/// One directory (`GET /v1/dirs/{id}`, an element of `GET /v1/dirs`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirInfo {
    pub path: PathBuf,
    pub id: String,
    pub mode: MountMode,
    pub size_limit_bytes: Option<u64>,
    pub sync_interval_ms: u64,
    pub status: DirStatus,
    /// None when not mounted.
    pub usage: Option<Usage>,
    /// The fuller of space and inodes, percent.
    pub usage_percent: Option<u64>,
    pub usage_level: Option<UsageLevel>,
    /// ms since the epoch.
    pub last_sync_unix_ms: Option<u64>,
    pub last_sync: Option<SyncReport>,
    pub last_error: Option<String>,
    /// Oldest first.
    pub recovery_copies: Vec<RecoveryCopy>,
    pub notes: Vec<String>,
    pub origin: DirOrigin,
    pub totals: SyncTotals,
}

/// What stopping (removing) a directory did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum StopOutcome {
    /// Synced and unmounted: PATH is a normal directory again.
    Released {
        report: SyncReport,
        lazy_unmount: bool,
        /// Processes that still had files in the RAM copy (forced remove).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        still_open: Vec<String>,
        /// Where the RAM copy stays until they close.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kept_until_closed: Option<PathBuf>,
    },
    /// Files were open for writing: synced and left mounted for the next
    /// daemon.
    HandedOver { report: SyncReport },
    /// Was not active; nothing to do.
    Inactive,
}

/// An interval in a request: milliseconds, or a duration like `"10m"`.
pub type IntervalValue = DurationValue;

/// `POST /v1/dirs`: keep a directory in RAM.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddDir {
    /// Absolute path of an existing directory.
    pub path: String,
    /// Time between periodic syncs (default 10m, at least 1s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<IntervalValue>,
    /// overlayfs (on-disk copy as lower dir, RAM holds only changes)
    /// instead of a full tmpfs copy.
    #[serde(default)]
    pub overlay: bool,
    /// tmpfs size limit (default: the kernel's, half of RAM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<SizeValue>,
    /// Dated recovery copies kept after crashes (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_generations: Option<u32>,
    /// Add even though other processes use the directory (refused
    /// otherwise, naming them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// `PATCH /v1/dirs/{id}`: absent fields stay as they are.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchDir {
    /// Time between periodic syncs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<IntervalValue>,
    /// New size limit; "none" for the tmpfs default (half of RAM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<SizeValue>,
    /// Dated recovery copies kept (older ones are deleted at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_generations: Option<u32>,
}

/// A directory after `PATCH /v1/dirs/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirPatched {
    #[serde(flatten)]
    pub info: DirInfo,
    /// Set for a directory declared in the config (its settings are
    /// applied again at the next start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

/// `GET /v1/dirs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirList {
    pub dirs: Vec<DirInfo>,
}

/// `POST /v1/dirs/{id}/sync`: what one sync did (durable on return).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirSynced {
    pub path: String,
    pub id: String,
    pub report: SyncReport,
}

/// One directory's result in `POST /v1/dirs/sync`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirSyncResult {
    pub path: String,
    /// Set when the sync succeeded.
    #[serde(default)]
    pub report: Option<SyncReport>,
    /// Set when it failed.
    #[serde(default)]
    pub error: Option<ErrorDetail>,
}

/// `POST /v1/dirs/sync`: every active directory synced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirSyncAll {
    pub results: Vec<DirSyncResult>,
}

/// `DELETE /v1/dirs/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirRemoved {
    pub path: String,
    pub id: String,
    /// What the final sync and unmount did.
    pub result: StopOutcome,
    /// Set when the directory is declared in the config (it comes back at
    /// the next start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}
