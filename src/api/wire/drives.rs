//! `/v1/drives`: create, list, show, patch (resize, lock) and delete drives.
//!
//! Request bodies reject unknown fields, so a typo is an error, not a
//! silent no-op (and fields added later are refused by older daemons, not
//! ignored). docs/openapi.yaml describes the same shapes.

use serde::{Deserialize, Serialize};

use super::persistence::PersistInfo;
use super::snapshots::SnapshotStatus;
use super::values::{DurationValue, SizeValue};

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
    /// `lz4`, `zstd`, `zstd:LEVEL`, `lz4+zstd[:LEVEL]` or `off` (absent: off). A compressed
    /// drive's promise is `min(size, mem_limit)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<String>,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub overcommit: bool,
    /// Lock the drive's memory in RAM as it is written (never swapped);
    /// refused when the daemon's RLIMIT_MEMLOCK is too low.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lock_memory: bool,
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
    /// Who may see the drive over NBD (absent: everyone; a persistent
    /// drive restored from its state directory keeps its stored rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<DriveAccess>,
}

/// A drive's NBD access rules (docs/tls.md, "Who may see an export").
/// Every list empty: the drive is open to every client that reaches a
/// listener.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveAccess {
    /// Client-certificate identities (CN or first SAN) that may see it;
    /// empty: any identity, anonymous included (unless
    /// `read_only_identities` lists some).
    #[serde(default)]
    pub allow_identities: Vec<String>,
    /// Identities that may see it read-only.
    #[serde(default)]
    pub read_only_identities: Vec<String>,
    /// Source networks: CIDRs (`10.0.0.0/8`, `127.0.0.1/32`) or `unix`
    /// for the unix socket; empty: any.
    #[serde(default)]
    pub allow_networks: Vec<String>,
}

/// `PATCH`'s `access`: each list given replaces the drive's; absent ones
/// stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_identities: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_identities: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_networks: Option<Vec<String>>,
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
    /// New NBD access rules. New connections see them at once; open
    /// connections they no longer allow what they negotiated are closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<AccessPatch>,
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
    /// Its memory is locked in RAM (`--lock-memory`).
    #[serde(default)]
    pub lock_memory: bool,
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
    /// Who may see it over NBD.
    #[serde(default)]
    pub access: DriveAccess,
    /// Set on changes to a drive the daemon re-creates at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
    /// A persistent drive's persistence; absent for RAM drives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persist: Option<PersistInfo>,
    /// Why a failed drive failed (the precise error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A compressed drive's memory figures; absent for raw drives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<CompressionInfo>,
    /// Snapshot pushes of this drive, per remote (absent when none ran and
    /// none is scheduled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotStatus>,
    /// The drive's NVMe/TCP subsystem NQN (absent when the daemon serves
    /// no NVMe/TCP, `--nvme-listen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme_nqn: Option<String>,
    /// The NVMe/TCP hosts connected now: host NQN and controllers (one
    /// per `nvme connect`); absent when none is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvme_hosts: Vec<NvmeHost>,
}

/// An NVMe/TCP host connected to a drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmeHost {
    pub host_nqn: String,
    pub controllers: u64,
}

/// A compressed drive's memory figures, like zram's `mm_stat` (each shard
/// is read in turn, so concurrent writes may skew sums by a few pages).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompressionInfo {
    /// `lz4`, `zstd:LEVEL` or `lz4+zstd:LEVEL`.
    pub algorithm: String,
    /// Logical bytes of every page that is not a hole (`orig_data_size`).
    pub orig_data_bytes: u64,
    /// Sum of the stored objects' lengths (`compr_data_size`).
    pub compr_data_bytes: u64,
    /// Pages held (classes, raw pages, free pages kept for reuse): what
    /// the memory limit and budget are charged.
    pub slab_bytes: u64,
    /// Page tables and bookkeeping (not charged).
    pub metadata_bytes: u64,
    /// `slab_bytes + metadata_bytes` (`mem_used_total`).
    pub mem_used_bytes: u64,
    /// Same-filled pages, zero pages included (no bytes stored).
    pub same_pages: u64,
    /// Pages that do not compress to 4032 bytes or less, kept raw.
    pub huge_pages: u64,
    /// Pages kept compressed.
    pub compressed_pages: u64,
    /// Compaction passes run.
    pub compact_runs: u64,
    /// Objects compaction moved.
    pub compact_moved_objects: u64,
    /// Bytes of the pages compaction gave back.
    pub compact_freed_bytes: u64,
    /// Pages held by the second codec (`lz4+zstd`: idle pages recompressed
    /// with zstd; part of `compressed_pages`). 0 for other algorithms.
    pub recompressed_pages: u64,
    /// Pages recompression tried (recompressed, or kept as they were).
    pub recompress_attempts: u64,
    /// Bytes recompression took off the objects it replaced.
    pub recompress_saved_bytes: u64,
    /// CPU time the recompression worker spent, in milliseconds.
    pub recompress_cpu_ms: u64,
    /// Sweeps of every page the worker made because host memory was short.
    pub urgent_sweeps: u64,
    /// `orig_data_bytes / mem_used_bytes`; 0 when the drive holds nothing.
    pub ratio: f64,
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
