//! The status and metrics of a persistent drive, as the daemon shows them
//! (`ramd info`, the API, `/metrics`). Plain data: the drive fills it in.

use std::time::Duration;

use super::durability::Durability;
use crate::metrics::Histogram;

/// What the drive's persistence is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncState {
    /// Nothing running; the last sync (if any) succeeded.
    Idle,
    /// A sync is running.
    Syncing,
    /// The last sync failed; quick retries with backoff are under way.
    Retrying,
    /// Syncs keep failing: quick retries are used up and it is retried every
    /// interval. The drive serves from RAM; the disk holds an older state.
    Failing,
}

impl SyncState {
    /// Lower-case name for tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncState::Idle => "idle",
            SyncState::Syncing => "syncing",
            SyncState::Retrying => "retrying",
            SyncState::Failing => "failing",
        }
    }
}

/// A point-in-time copy of a persistent drive's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistStatus {
    /// The promise in force.
    pub durability: Durability,
    /// Periodic sync interval.
    pub sync_interval_ms: u64,
    /// What persistence is doing.
    pub state: SyncState,
    /// When the newest durable state was made (ms since the Unix epoch).
    pub last_sync_unix_ms: Option<u64>,
    /// The moment the disk's state shows: when the last successful sync
    /// took its cut (ms since the Unix epoch). Every write acknowledged
    /// before it is on disk. After a restore with no sync yet: when the
    /// restored state was last checkpointed.
    pub durable_as_of_unix_ms: Option<u64>,
    /// Bytes the running sync has saved so far (0 when none runs).
    pub sync_done_bytes: u64,
    /// Dirty bytes the running sync set out to save (0 when none runs).
    pub sync_total_bytes: u64,
    /// Duration of every successful sync since open (for /metrics).
    pub sync_durations: Histogram,
    /// The newest durable generation.
    pub durable_gen: u64,
    /// Duration of the last successful sync.
    pub last_sync_duration: Option<Duration>,
    /// Longest sync since the drive was opened.
    pub max_sync_duration: Duration,
    /// Bytes changed in RAM and not yet on disk (pages x 4 KiB).
    pub dirty_bytes: u64,
    /// Committed journal bytes not yet checkpointed into the image.
    pub journal_bytes: u64,
    /// Memory held right now by copies of pages a running sync still has
    /// to save (copy-on-write).
    pub snapshot_copy_bytes: u64,
    /// Successful syncs since open (including ones with nothing to write).
    pub syncs_ok: u64,
    /// Failed syncs since open.
    pub syncs_failed: u64,
    /// Failures in a row (0 when healthy).
    pub consecutive_failures: u32,
    /// Checkpoints since open.
    pub checkpoints: u64,
    /// Bytes written to disk since open (journal, image, table, meta).
    pub bytes_written: u64,
    /// The last error (sync or checkpoint), if any since the last success.
    pub last_error: Option<String>,
    /// When `last_error` happened.
    pub last_error_unix_ms: Option<u64>,
    /// How long the restore at open took (None for a new drive).
    pub restore_duration: Option<Duration>,
}
