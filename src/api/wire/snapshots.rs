//! The JSON bodies of `/v1/remotes`, `/v1/snapshots` and
//! `/v1/drives/{name}/snapshots`, shared by the server and the client.
//! Request bodies reject unknown fields. No shape here carries a secret:
//! a remote shows where its credentials come from, never what they are.
//! docs/openapi.yaml describes the same shapes.

use serde::{Deserialize, Serialize};

/// A remote: where snapshots go.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoteInfo {
    pub name: String,
    /// `s3://BUCKET/PREFIX`.
    pub url: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Where the credentials come from: `file PATH`, `config`,
    /// `environment` or `missing`.
    pub credentials: String,
    pub encrypt_key_file: Option<String>,
    /// The chunk size of pushes to it, in bytes.
    #[serde(default)]
    pub chunk_bytes: u64,
    /// `config` or `api`.
    pub origin: String,
}

/// `GET /v1/remotes`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteList {
    pub remotes: Vec<RemoteInfo>,
}

/// `POST /v1/remotes`: no secrets, only a path to a credentials file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddRemote {
    pub name: String,
    /// `s3://BUCKET/PREFIX`.
    pub url: String,
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    /// Absolute path of a TOML file (mode 0600) with `access_key_id` and
    /// `secret_access_key`; none: the daemon's environment.
    #[serde(default)]
    pub credentials_file: Option<String>,
    /// Absolute path of the snapshot key (32 bytes or 64 hex digits).
    #[serde(default)]
    pub encrypt_key_file: Option<String>,
    /// The chunk size of pushes (bytes or "256K"; a power of two from
    /// 64 KiB to 64 MiB) [default: the engine's].
    #[serde(default)]
    pub chunk_size: Option<super::values::SizeValue>,
}

/// `DELETE /v1/remotes/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteRemoved {
    pub name: String,
}

/// One snapshot on a remote.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// `DRIVE/MILLISECONDS-SUFFIX`.
    pub id: String,
    pub drive: String,
    pub remote: String,
    /// When the cut was taken.
    pub created_unix_ms: u64,
    /// The label given at push time (null: none, or pushed by a ramd that
    /// kept it only in the manifest, or sealed with a key this daemon
    /// lacks).
    #[serde(default)]
    pub label: Option<String>,
}

/// A remote that could not be listed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoteFailure {
    pub remote: String,
    pub message: String,
}

/// `GET /v1/snapshots`: oldest first per remote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotInfo>,
    /// Remotes that could not be listed (only when no remote was named).
    #[serde(default)]
    pub failed: Vec<RemoteFailure>,
}

/// `GET /v1/snapshots` query.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotQuery {
    #[serde(default)]
    pub drive: Option<String>,
    #[serde(default)]
    pub remote: Option<String>,
}

/// `POST /v1/drives/{name}/snapshots`: push a snapshot now.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    pub remote: String,
    #[serde(default)]
    pub label: Option<String>,
    /// Encrypt with the remote's key.
    #[serde(default)]
    pub encrypt: bool,
}

/// `POST /v1/snapshots/restore`: a snapshot into a new drive.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreSnapshot {
    pub remote: String,
    /// The drive whose snapshot to restore.
    pub drive: String,
    /// Its id (`DRIVE/MS-SUFFIX` or `MS-SUFFIX`); none: the newest.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// The new drive's name; none: `drive`.
    #[serde(default, rename = "as")]
    pub as_name: Option<String>,
    /// Make the new drive persistent: its state directory is written (and
    /// durable) before the drive is served.
    #[serde(default)]
    pub persist: bool,
    /// `none`, `periodic` (default) or `flush`; needs `persist`.
    #[serde(default)]
    pub durability: Option<String>,
    /// Background sync interval (default 60s); needs `persist`.
    #[serde(default)]
    pub sync_interval: Option<super::values::DurationValue>,
    /// Encrypt the state directory (AES-256-GCM); needs `key_file`.
    #[serde(default)]
    pub encrypt: bool,
    /// Absolute path of the state directory's key.
    #[serde(default)]
    pub key_file: Option<String>,
    /// Keep the new drive's pages compressed: `lz4`, `zstd[:LEVEL]`,
    /// `lz4+zstd[:LEVEL]` (absent or `off`: a raw drive).
    #[serde(default)]
    pub compress: Option<String>,
    /// The new drive's memory limit (`none`: unlimited, the default).
    #[serde(default)]
    pub mem_limit: Option<super::values::SizeValue>,
}

/// `POST /v1/snapshots/prune`: retention, then GC of unneeded chunks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneRequest {
    pub remote: String,
    /// Keep the N newest per drive.
    #[serde(default)]
    pub keep_last: Option<u64>,
    /// Keep the newest of each of the N most recent days, per drive.
    #[serde(default)]
    pub keep_daily: Option<u64>,
    /// Unreferenced chunks younger than this stay (a push may be about to
    /// name them) [default: 2 hours].
    #[serde(default)]
    pub grace_ms: Option<u64>,
}

/// What a prune did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PruneReport {
    pub remote: String,
    pub snapshots_kept: u64,
    pub snapshots_deleted: u64,
    pub chunks_referenced: u64,
    pub chunks_young: u64,
    pub chunks_deleted: u64,
    pub bytes_freed: u64,
}

/// `DELETE /v1/snapshots/{remote}/{drive}/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotDeleted {
    pub remote: String,
    pub id: String,
}

/// How far a job is.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobProgress {
    pub chunks_done: u64,
    pub chunks_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Object bytes sent or received so far.
    pub bytes_transferred: u64,
}

/// What a finished push did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PushResult {
    pub snapshot: String,
    /// The label given (null: none).
    #[serde(default)]
    pub label: Option<String>,
    pub chunks_total: u64,
    pub chunks_uploaded: u64,
    pub chunks_skipped: u64,
    pub chunks_deduped: u64,
    pub chunks_zero: u64,
    /// Drive bytes in non-zero chunks.
    pub bytes_data: u64,
    /// Object bytes sent (chunks and manifest).
    pub bytes_uploaded: u64,
    /// Drive data per plaintext byte uploaded; none when nothing needed
    /// uploading.
    pub dedup_ratio: Option<f64>,
}

/// What a finished restore did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreResult {
    pub snapshot: String,
    /// The snapshot's label, from its manifest (null: none).
    #[serde(default)]
    pub label: Option<String>,
    /// The new drive.
    pub drive: String,
    pub chunks_fetched: u64,
    pub chunks_zero: u64,
    pub bytes_downloaded: u64,
    pub bytes_written: u64,
    /// The new drive is persistent (its state directory was durable
    /// before it was served).
    #[serde(default)]
    pub persistent: bool,
}

/// A push or restore running in the daemon (`GET /v1/snapshots/jobs/{id}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub id: u64,
    /// `push` or `restore`.
    pub kind: String,
    pub drive: String,
    pub remote: String,
    /// `running`, `done` or `failed`.
    pub state: String,
    pub error: Option<String>,
    pub progress: JobProgress,
    pub push: Option<PushResult>,
    pub restore: Option<RestoreResult>,
    pub started_unix_ms: u64,
    pub finished_unix_ms: Option<u64>,
}

/// One drive's (or cache's) pushes to one remote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotStatus {
    /// The drive's or cache's name.
    pub drive: String,
    /// `drive` or `cache`.
    #[serde(default = "drive_kind")]
    pub kind: String,
    pub remote: String,
    /// The scheduled interval, when the drive has one for this remote.
    pub interval_ms: Option<u64>,
    pub running: bool,
    pub last_snapshot: Option<String>,
    /// Its label (null: none).
    #[serde(default)]
    pub last_label: Option<String>,
    pub last_success_unix_ms: Option<u64>,
    /// The last push's error (cleared by a success).
    pub last_error: Option<String>,
    pub last_error_unix_ms: Option<u64>,
    pub pushes_total: u64,
    pub failures_total: u64,
    pub bytes_uploaded_total: u64,
    pub last_dedup_ratio: Option<f64>,
}

fn drive_kind() -> String {
    "drive".into()
}

/// `GET /v1/drives/{name}/snapshots` (and `/v1/caches/{name}/snapshots`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotStatusList {
    pub statuses: Vec<SnapshotStatus>,
    /// `restore_from` of the drive, when set.
    pub restore_from: Option<String>,
}
