//! What a push reads: a drive, or a cache.
//!
//! A drive's snapshot is its data as NBD clients see it. A cache's
//! snapshot is its *logical image*: what a client reading the cache's
//! export sees, i.e. the backing with the cache's dirty data on top. Its
//! dirty data is written back (and the backing flushed) first, so that
//! after a push the backing holds at least everything in the snapshot;
//! then a cut of the cache's export is read through the cache (hits from
//! RAM, misses from the backing; a push is one long sequential stream, so
//! past the cache's `sequential_cutoff` it bypasses the cache instead of
//! evicting its working set). Writes made while the push runs are not in
//! the snapshot, as for a drive.
//!
//! Restoring a cache's snapshot makes a drive (`ramd restore NAME --from
//! REMOTE --as DRIVE`); copying it onto a backing is the user's move.

use std::sync::Arc;

use super::error::SnapshotsError;
use super::policy::TargetKind;
use crate::block::cut::{Cut, CutError};
use crate::block::Export;
use crate::control::caches::{CacheEntry, Caches, Live};
use crate::control::drives::{Drive, Drives};

/// A drive or a cache to push.
pub enum Target {
    Drive(Arc<Drive>),
    Cache {
        caches: Arc<Caches>,
        entry: Arc<CacheEntry>,
        live: Live,
    },
}

impl Target {
    /// The drive `name`, ready.
    pub fn drive(drives: &Drives, name: &str) -> Result<Target, SnapshotsError> {
        Ok(Target::Drive(drives.get_ready(name)?))
    }

    /// The cache `name`, serving.
    pub fn cache(caches: &Arc<Caches>, name: &str) -> Result<Target, SnapshotsError> {
        let (entry, live) = caches.live(name)?;
        Ok(Target::Cache {
            caches: caches.clone(),
            entry,
            live,
        })
    }

    /// A drive or a cache named `name` (in `kind`'s table).
    pub fn find(
        kind: TargetKind,
        drives: &Drives,
        caches: &Arc<Caches>,
        name: &str,
    ) -> Result<Target, SnapshotsError> {
        match kind {
            TargetKind::Drive => Target::drive(drives, name),
            TargetKind::Cache => Target::cache(caches, name),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Target::Drive(d) => &d.name,
            Target::Cache { entry, .. } => &entry.name,
        }
    }

    pub fn kind(&self) -> TargetKind {
        match self {
            Target::Drive(_) => TargetKind::Drive,
            Target::Cache { .. } => TargetKind::Cache,
        }
    }

    /// True when the data is encrypted at rest: it leaves the host only
    /// encrypted.
    pub fn is_encrypted(&self) -> bool {
        match self {
            Target::Drive(d) => d.is_encrypted(),
            Target::Cache { .. } => false,
        }
    }

    /// True when the push must write back first (then cut, in the job).
    pub fn writes_back(&self) -> bool {
        matches!(self, Target::Cache { .. })
    }

    /// A cache's dirty data written back and its backing flushed
    /// (blocking I/O: call off the async threads); nothing for a drive.
    /// Returns the bytes written back.
    pub fn write_back(&self) -> Result<u64, SnapshotsError> {
        match self {
            Target::Drive(_) => Ok(0),
            Target::Cache { caches, entry, .. } => Ok(caches.sync(&entry.name)?.written_back_bytes),
        }
    }

    fn export(&self) -> &Arc<Export> {
        match self {
            Target::Drive(d) => &d.export,
            Target::Cache { live, .. } => &live.export,
        }
    }

    /// Its size now (a push's cut keeps it while it runs).
    pub fn size_bytes(&self) -> u64 {
        self.export().backend.size()
    }

    /// Opens the point-in-time cut the push reads.
    pub fn begin_cut(&self, chunk_bytes: u64) -> Result<Cut, SnapshotsError> {
        self.export().begin_cut(chunk_bytes).map_err(|e| match e {
            CutError::Busy => SnapshotsError::Busy(self.name().to_owned()),
            e => SnapshotsError::Cut {
                drive: self.name().to_owned(),
                source: e,
            },
        })
    }
}
