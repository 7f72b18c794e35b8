//! Restoring a snapshot into a persistent drive's state directory, so
//! that a crash at any moment leaves either no drive or the whole one.
//!
//! ```text
//!  STATE/drives/.restoring-NAME   made new (drive.json, then the engine's
//!        │                        files, meta last), filled chunk by chunk
//!        │                        (every chunk verified first), saved every
//!        │                        256 MiB and closed: sync + checkpoint,
//!        │                        fsynced                    ◄── durable here
//!        ▼ rename (atomic), fsync STATE/drives
//!  STATE/drives/NAME              a complete drive: registered, loaded
//!                                 like any persistent drive (restoring,
//!                                 then ready), served only then
//! ```
//!
//! # Invariants
//!
//! - `STATE/drives/NAME` never holds a partial restore: it appears by one
//!   rename, after the staged copy is durable. A crash before leaves only
//!   `.restoring-NAME`, which is not a drive (its name is not a drive
//!   name: never scanned nor loaded) and is removed at the next start
//!   ([`remove_stale`]) or by the next restore of that name.
//! - A failure (a corrupt chunk, a full disk, the remote gone) removes the
//!   staged copy and reports the precise cause; nothing is registered.
//! - Saving every [`SAVE_EVERY_BYTES`] bounds the journal, so the disk
//!   needs about the image's size plus that much, not twice the image.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{SnapshotsError, StagingError};
use crate::block::backend::Backend;
use crate::control::drives::persistent::{self, DiskDrive};
use crate::control::drives::spec::DriveSpec;
use crate::snapshot::SnapshotId;
use crate::snapshot::{self, ChunkSink, Keys, Progress, Remote, RestoreOptions, RestoreReport};
use crate::store::MemoryBudget;

/// Name prefix of staged restores in `STATE/drives` (a drive name cannot
/// start with a dot).
pub const STAGING_PREFIX: &str = ".restoring-";

/// The restored data is saved (journal, then checkpoint into the image)
/// each time this much was written.
pub const SAVE_EVERY_BYTES: u64 = 256 << 20;

/// Where the restore of `dir` (`STATE/drives/NAME`) is staged.
pub fn staging_dir(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy().into_owned());
    dir.with_file_name(format!("{STAGING_PREFIX}{name}"))
}

/// Removes staged restores a crash cut short (at start, before anything
/// restores). Logged; never fatal.
pub fn remove_stale(drives_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(drives_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(STAGING_PREFIX) {
            continue;
        }
        match std::fs::remove_dir_all(e.path()) {
            Ok(()) => tracing::warn!(
                "removed {}: a restore from a snapshot that did not finish (the daemon stopped during it); nothing of it was in use",
                e.path().display()
            ),
            Err(err) => tracing::error!("cannot remove the unfinished restore {}: {err}", e.path().display()),
        }
    }
}

/// Writes a restore into a staged persistent drive, saving it every
/// [`SAVE_EVERY_BYTES`]. A failed save stops the restore (kept in
/// `failed` for the precise error).
struct StagingSink<'a> {
    drive: &'a DiskDrive,
    unsaved_bytes: u64,
    failed: Option<crate::persist::Error>,
}

impl ChunkSink for StagingSink<'_> {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.drive
            .write(offset, data, false)
            .map_err(std::io::Error::other)?;
        self.unsaved_bytes += data.len() as u64;
        if self.unsaved_bytes >= SAVE_EVERY_BYTES {
            self.unsaved_bytes = 0;
            if let Err(e) = self.drive.sync() {
                let text = e.to_string();
                self.failed = Some(e);
                return Err(std::io::Error::other(text));
            }
        }
        Ok(())
    }
}

/// One restore into a state directory.
pub struct DiskRestore {
    pub remote: Remote,
    pub id: SnapshotId,
    pub keys: Option<Arc<Keys>>,
    /// The drive: its name, the snapshot's size, and its persistence.
    pub spec: DriveSpec,
    /// Who asked ("api", "config", "command-line"), for `drive.json`.
    pub origin: String,
    /// `STATE/drives/NAME`: must hold no drive.
    pub dir: PathBuf,
    pub budget: Arc<MemoryBudget>,
}

impl DiskRestore {
    /// Restores into the staged copy, makes it durable and moves it into
    /// place (see the module docs). Blocking: call on a thread that may
    /// block, with a handle of the runtime the remote's I/O runs on.
    pub fn run(
        &self,
        rt: &tokio::runtime::Handle,
        progress: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<RestoreReport, SnapshotsError> {
        let staging = staging_dir(&self.dir);
        if staging.exists() {
            // A restore of this name that a crash cut short.
            let _ = std::fs::remove_dir_all(&staging);
        }
        let result = self.fill_and_publish(rt, &staging, progress);
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        result
    }

    fn disk(&self, source: impl Into<StagingError>) -> SnapshotsError {
        SnapshotsError::Disk {
            name: self.spec.name.clone(),
            dir: self.dir.clone(),
            source: Box::new(source.into()),
        }
    }

    fn fill_and_publish(
        &self,
        rt: &tokio::runtime::Handle,
        staging: &Path,
        progress: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<RestoreReport, SnapshotsError> {
        let persist = self.spec.persist.clone().unwrap_or_default();
        let drive = persistent::create_new(
            staging,
            &self.spec,
            &persist,
            &self.origin,
            self.budget.clone(),
            false,
        )
        .map_err(|e| self.disk(e))?;
        let mut sink = StagingSink {
            drive: &drive,
            unsaved_bytes: 0,
            failed: None,
        };
        let opts = RestoreOptions {
            keys: self.keys.clone(),
            ..RestoreOptions::default()
        };
        let restored = rt.block_on(snapshot::restore(
            &self.remote,
            &self.id,
            &mut sink,
            &opts,
            progress,
        ));
        if let Some(e) = sink.failed.take() {
            return Err(self.disk(e));
        }
        let report = restored?;
        drive.close().map_err(|e| self.disk(e))?;
        drop(drive);
        publish(staging, &self.dir).map_err(|e| self.disk(e))?;
        Ok(report)
    }
}

/// Moves the durable staged copy into place: one rename, then the
/// directory holding both synced so the rename survives a power cut.
fn publish(staging: &Path, dir: &Path) -> Result<(), StagingError> {
    std::fs::rename(staging, dir).map_err(|source| StagingError::Rename {
        from: staging.to_owned(),
        to: dir.to_owned(),
        source,
    })?;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    std::fs::File::open(parent)
        .and_then(|f| f.sync_all())
        .map_err(|source| StagingError::SyncDir {
            dir: parent.to_owned(),
            source,
        })
}

/// Takes a published restore back out (its drive could not be
/// registered): moved aside, then removed, so no later start loads it.
pub fn withdraw(dir: &Path) {
    let staging = staging_dir(dir);
    if std::fs::rename(dir, &staging).is_ok() {
        let _ = std::fs::remove_dir_all(&staging);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_restores_are_siblings_that_are_not_drives_and_go_at_start() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("db");
        let st = staging_dir(&dir);
        assert_eq!(st, root.path().join(".restoring-db"));
        assert!(crate::control::drives::spec::check_name(".restoring-db").is_err());
        std::fs::create_dir_all(st.join("x")).unwrap();
        std::fs::create_dir(root.path().join("other")).unwrap();
        remove_stale(root.path());
        assert!(!st.exists());
        assert!(root.path().join("other").exists());
    }
}
