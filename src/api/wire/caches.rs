//! The JSON bodies of `/v1/caches`, shared by the server and the client
//! (kept apart from `types` so each resource's shapes live together).
//! Request bodies reject unknown fields. docs/openapi.yaml describes the
//! same shapes.

use serde::{Deserialize, Serialize};

pub use super::drives::{AccessPatch, DriveAccess};
pub use super::values::DurationValue;
use super::values::{SizeValue, StatsRates, StatsTotals};

/// A percentage in a request: a number or text like `"50%"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PercentValue {
    Number(u64),
    Text(String),
}

impl PercentValue {
    pub fn as_text(&self) -> String {
        match self {
            PercentValue::Number(n) => n.to_string(),
            PercentValue::Text(t) => t.clone(),
        }
    }
}

/// `POST /v1/caches`: a cache in front of `backing`. Options left out take
/// their defaults (docs/cache.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateCache {
    /// The cache's name, which is also its NBD export name.
    pub name: String,
    /// A file, a block device, `nbd://HOST[:PORT]/EXPORT` or
    /// `nbd+unix:///EXPORT?socket=PATH`.
    pub backing: String,
    /// RAM for cached data.
    pub size: SizeValue,
    /// `writethrough`, `writearound` or `writeback`.
    pub mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<SizeValue>,
    /// `s3fifo`, `lru` or `fifo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequential_cutoff: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_high: Option<PercentValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_low: Option<PercentValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_dirty_age: Option<DurationValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writeback_max_io: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_initial: Option<DurationValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_max: Option<DurationValue>,
    /// Open a file or block device with O_DIRECT.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_connections: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_timeout: Option<DurationValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_timeout: Option<DurationValue>,
    /// Who may see the cache over NBD and NVMe/TCP: the drives' rules
    /// (absent: open to every client that reaches a listener).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<DriveAccess>,
}

/// `PATCH /v1/caches/{name}`: what may change at run time.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchCache {
    /// Each list given replaces the cache's; absent ones stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<AccessPatch>,
}

/// `DELETE /v1/caches/{name}?force=true`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteCacheQuery {
    #[serde(default)]
    pub force: bool,
}

/// How a cache was set up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheSettings {
    pub mode: String,
    pub policy: String,
    pub block_bytes: u64,
    /// The RAM asked for (`size`).
    pub cache_bytes: u64,
    pub sequential_cutoff_bytes: u64,
    pub dirty_high_percent: u8,
    pub dirty_low_percent: u8,
    pub max_dirty_age_ms: u64,
    pub writeback_max_io_bytes: u64,
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    pub direct: bool,
    pub nbd_connections: u64,
    pub nbd_timeout_ms: u64,
    pub shutdown_timeout_ms: u64,
}

/// The backing and its health.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackingInfo {
    /// As given at creation.
    pub spec: String,
    /// `file`, `block-device` or `nbd`.
    pub kind: String,
    /// `healthy`, `failing` (the last call failed; requests that need it
    /// get EIO, cached data is served, dirty data is kept and retried) or
    /// `unavailable` (never opened; retried in the background).
    pub state: String,
    pub failing_for_ms: u64,
    pub consecutive_failures: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub flush_errors: u64,
    /// Write-back retries after failures.
    pub retries: u64,
    /// When the next retry (or, when unavailable, the next attempt to open
    /// the backing) happens; 0: none pending.
    pub next_retry_in_ms: u64,
    pub last_error: Option<String>,
    /// Attempts to open an unavailable backing so far (0 once open).
    pub open_attempts: u64,
}

/// Cache counters (totals since creation; blocks for hits and misses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheCounters {
    /// RAM the cache may hold (its size in whole blocks, at most the
    /// backing's size).
    pub capacity_bytes: u64,
    /// RAM holding cached blocks now.
    pub resident_bytes: u64,
    /// RAM the cache holds now (cached blocks plus empty slots it keeps;
    /// drops when memory is given back under pressure).
    #[serde(default)]
    pub memory_bytes: u64,
    /// Cached data not yet written back (write-back mode).
    pub dirty_bytes: u64,
    pub read_hits: u64,
    pub read_misses: u64,
    /// read_hits / (read_hits + read_misses); 0 without reads.
    pub read_hit_ratio: f64,
    pub write_hits: u64,
    pub write_misses: u64,
    pub write_hit_ratio: f64,
    /// Over reads and writes.
    pub hit_ratio: f64,
    pub evictions: u64,
    /// Blocks dropped because their data changed underneath (write-around,
    /// zero, trim).
    pub invalidations: u64,
    pub writeback_bytes: u64,
    /// Recent write-back throughput.
    pub writeback_rate_bytes_per_s: u64,
    /// Age of the oldest dirty block (0: nothing dirty).
    pub writeback_lag_ms: u64,
    /// Requests that bypassed the cache (sequential cutoff, no room).
    pub bypassed_requests: u64,
    pub bypassed_bytes: u64,
    pub backing_read_bytes: u64,
    pub backing_write_bytes: u64,
    /// Memory given back to the host under memory pressure (clean blocks
    /// dropped, empty slots released).
    #[serde(default)]
    pub given_back_bytes: u64,
}

/// The NBD requests the cache's export served (as for drives).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheIo {
    /// Null when metrics are off.
    pub totals: Option<StatsTotals>,
    /// Null when metrics are off or before the first full interval.
    pub rates: Option<StatsRates>,
}

/// A cache as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheInfo {
    pub name: String,
    /// Always "cache" (drives say "ram").
    pub kind: String,
    /// `opening`, `ready`, `unavailable` or `closing`.
    pub state: String,
    /// "config" or "api".
    pub origin: String,
    pub created_unix_s: u64,
    /// The export's size: the backing's (null until the backing is open).
    pub size_bytes: Option<u64>,
    /// Memory promised to the cache from the daemon budget.
    pub promised_bytes: u64,
    /// Open NBD connections.
    pub connections: u64,
    /// Mountpoints where it is attached through FUSE (`ramd attach`).
    pub attachments: Vec<String>,
    pub uri: String,
    pub tcp_uris: Vec<String>,
    pub backing: BackingInfo,
    pub settings: CacheSettings,
    /// Who may see it over NBD and NVMe/TCP (every list empty: open).
    #[serde(default)]
    pub access: DriveAccess,
    /// Null until the backing is open.
    pub stats: Option<CacheCounters>,
    /// Null until the backing is open.
    pub io: Option<CacheIo>,
    /// Snapshot pushes of this cache's logical image, per remote (absent
    /// when none ran and none is scheduled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<super::snapshots::SnapshotStatus>,
    /// The cache's NVMe/TCP subsystem NQN (absent when the daemon serves
    /// no NVMe/TCP, `--nvme-listen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme_nqn: Option<String>,
    /// The NVMe/TCP hosts connected now; absent when none is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvme_hosts: Vec<super::drives::NvmeHost>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

/// `GET /v1/caches`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheList {
    pub caches: Vec<CacheInfo>,
}

/// `DELETE /v1/caches/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheDeleted {
    pub name: String,
    /// NBD connections closed by a forced delete.
    pub closed_connections: u64,
    /// Dirty bytes written back before the cache went.
    pub written_back_bytes: u64,
    /// Dirty bytes dropped by a forced delete (the backing could not take
    /// them).
    pub dropped_dirty_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

/// `POST /v1/caches/{name}/sync`: on return, every block that was dirty
/// when the sync began is on the backing and the backing is flushed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheSynced {
    pub name: String,
    pub written_back_bytes: u64,
    /// Dirty bytes written after the sync began.
    pub dirty_bytes: u64,
    pub duration_ms: u64,
}
