//! Restores of snapshots: into a new RAM drive, into a new persistent
//! drive (`persistent.rs`), and at start for `restore_from`.
//!
//! # Invariants
//!
//! - A restored drive is served only once every chunk is verified and
//!   written. A RAM drive: the restore fills a store no export reaches,
//!   and the drive is registered with it only then
//!   (`Drives::create_from`, `Source::Adopted`).
//!   A persistent drive: the restore fills a staged state directory, which
//!   is made durable and renamed into place before the drive is
//!   registered and loaded like any persistent drive (`persistent.rs`);
//!   a crash at any point leaves no partial drive.
//! - One restore per target name at a time; the name must be free (and,
//!   for a persistent drive, its state directory hold no drive).
//! - At start, `restore_from` fills a persistent drive's state directory
//!   before the drive is created, and a RAM drive before the NBD server
//!   binds: neither is ever served empty or partial.

use std::sync::Arc;

use super::error::SnapshotsError;
use super::ids::parse_id;
use super::jobs::{Job, JobKind, Outcome};
use super::persistent::{self, DiskRestore};
use super::service::Snapshots;
use crate::block::backend::Backend;
use crate::control::drives::persistent::{drives_dir, probe, Found};
use crate::control::drives::spec::{check_compress, parse_drive_spec, DriveSpec, PersistSpec};
use crate::control::drives::{DriveData, DriveState, Drives, Source};
use crate::control::ledger::Origin;
use crate::control::remotes::RemoteSpec;
use crate::snapshot::source::BackendSink;
use crate::snapshot::{
    self, Keys, Manifest, Progress, Remote, RestoreOptions, RestoreReport, SnapshotError,
    SnapshotId,
};
use crate::store::compressed::{Algorithm, CompressedStore};
use crate::store::{MemoryBudget, RamStore};

/// A restore asked for.
#[derive(Debug, Clone)]
pub struct RestoreRequest {
    pub remote: String,
    /// The drive (or cache) whose snapshot to restore.
    pub drive: String,
    /// The snapshot (full id or `MS-SUFFIX`); None: the newest.
    pub snapshot: Option<String>,
    /// The new drive's name (None: `drive`).
    pub target: Option<String>,
    /// Make the new drive persistent with these settings (None: RAM).
    pub persist: Option<PersistSpec>,
    /// Keep the new drive compressed (None: the raw store).
    pub compress: Option<Algorithm>,
    /// The new drive's memory limit (None: unlimited).
    pub mem_limit_bytes: Option<u64>,
}

/// Frees the target name when the restore ends, however it ends.
struct Restoring {
    snapshots: Arc<Snapshots>,
    name: String,
}

impl Drop for Restoring {
    fn drop(&mut self) {
        self.snapshots.restoring.lock().remove(&self.name);
    }
}

impl Snapshots {
    /// Starts restoring a snapshot into a new drive (see the module
    /// invariants); the target name is checked free now and claimed at
    /// the end.
    pub fn start_restore(
        self: &Arc<Self>,
        drives: Arc<Drives>,
        req: &RestoreRequest,
    ) -> Result<Arc<Job>, SnapshotsError> {
        let spec = self.remotes.get(&req.remote)?;
        let target = req.target.clone().unwrap_or_else(|| req.drive.clone());
        crate::control::drives::spec::check_name(&target)
            .map_err(|e| SnapshotsError::Drive(e.into()))?;
        if drives.get(&target).is_ok() {
            return Err(SnapshotsError::TargetExists(target));
        }
        if req.persist.is_some() {
            let dir = drives.drive_dir(&target)?;
            if probe(&dir) != Found::New {
                return Err(SnapshotsError::StateDirTaken { name: target, dir });
            }
        }
        let id = req
            .snapshot
            .as_deref()
            .map(|s| parse_id(&req.drive, s))
            .transpose()?;
        let remote = spec.open()?;
        if !self.restoring.lock().insert(target.clone()) {
            return Err(SnapshotsError::Restoring(target));
        }
        let guard = Restoring {
            snapshots: self.clone(),
            name: target.clone(),
        };
        let job = self.jobs.start(JobKind::Restore, &req.drive, &req.remote);
        let (j, req) = (job.clone(), req.clone());
        tokio::spawn(async move {
            let _guard = guard;
            let outcome = match &req.persist {
                None => restore_new(&drives, &spec, &remote, &req, id, &target, &j).await,
                Some(p) => {
                    let p = p.clone();
                    restore_persistent(&drives, &spec, &remote, &req, id, &target, p, &j).await
                }
            };
            match outcome {
                Ok((id, label, report)) => {
                    tracing::info!(drive = %target, snapshot = %id, label = %label, remote = %req.remote, bytes = report.bytes_written, persistent = req.persist.is_some(), "drive restored from snapshot; serving it");
                    j.finish(Outcome::Restored {
                        id: id.to_string(),
                        label,
                        drive: target,
                        report,
                        persistent: req.persist.is_some(),
                    });
                }
                Err(e) => {
                    tracing::warn!(drive = %target, remote = %req.remote, "restore from snapshot failed (nothing was kept): {e}");
                    j.finish(Outcome::Failed(e.to_string()));
                }
            }
        });
        Ok(job)
    }

    /// At start, before the drives are created: fills the state directory
    /// of each persistent `(drive, remote)` due (see `restores_due`) from
    /// the newest snapshot of the drive, crash-safely; the drive is then
    /// created from it like any stored drive. Stale staged restores are
    /// removed first. A remote without a snapshot leaves the drive to be
    /// created empty (logged). Runs its own runtime.
    pub fn restore_to_disk_at_start(
        &self,
        declared: &[(DriveSpec, Origin)],
        which: &[(String, String)],
        state_dir: &std::path::Path,
        budget: &Arc<MemoryBudget>,
    ) -> Result<(), SnapshotsError> {
        persistent::remove_stale(&drives_dir(state_dir));
        let disk: Vec<(&DriveSpec, &Origin, &String)> = which
            .iter()
            .filter_map(|(d, r)| {
                let (spec, origin) = declared.iter().find(|(s, _)| &s.name == d)?;
                spec.persist.is_some().then_some((spec, origin, r))
            })
            .collect();
        if disk.is_empty() {
            return Ok(());
        }
        let rt = runtime()?;
        for (spec, origin, remote) in disk {
            let dir = drives_dir(state_dir).join(&spec.name);
            let r = self.remotes.get(remote)?;
            let opened = r.open()?;
            let Some(id) = rt
                .block_on(snapshot::list_snapshots(&opened, Some(&spec.name)))?
                .pop()
            else {
                tracing::info!(drive = %spec.name, remote = %remote, "restore_from: the remote holds no snapshot of the drive yet; it starts empty");
                continue;
            };
            let (manifest, keys) = rt.block_on(manifest_with_keys(&opened, &r, &id))?;
            tracing::info!(drive = %spec.name, snapshot = %id, remote = %remote, dir = %dir.display(), "restore_from: restoring the persistent drive's state directory before creating it");
            let mut restored_spec = spec.clone();
            restored_spec.size_bytes = manifest.geometry.size_bytes;
            let job = DiskRestore {
                remote: opened,
                id,
                keys,
                spec: restored_spec,
                origin: origin.name().to_owned(),
                dir,
                budget: budget.clone(),
            };
            let report = job.run(rt.handle(), &mut progress_logger(&spec.name))?;
            tracing::info!(drive = %spec.name, bytes = report.bytes_written, "restore_from: state directory restored; the drive loads from it");
        }
        Ok(())
    }

    /// At start, before NBD serves: fills each RAM `(drive, remote)` from
    /// the newest snapshot of the drive (a remote without one leaves the
    /// drive empty, logged). Persistent drives were restored before they
    /// were created ([`Snapshots::restore_to_disk_at_start`]) and are
    /// skipped. Runs its own runtime (the daemon's starts later).
    pub fn restore_at_start(
        &self,
        drives: &Drives,
        which: &[(String, String)],
    ) -> Result<(), SnapshotsError> {
        let ram: Vec<_> = which
            .iter()
            .filter(|(d, _)| drives.get(d).is_ok_and(|d| d.persist.is_none()))
            .collect();
        if ram.is_empty() {
            return Ok(());
        }
        let rt = runtime()?;
        for (drive, remote) in ram {
            rt.block_on(self.restore_existing(drives, drive, remote))?;
        }
        Ok(())
    }

    async fn restore_existing(
        &self,
        drives: &Drives,
        drive: &str,
        remote: &str,
    ) -> Result<(), SnapshotsError> {
        let spec = self.remotes.get(remote)?;
        let r = spec.open()?;
        let Some(id) = snapshot::list_snapshots(&r, Some(drive)).await?.pop() else {
            tracing::info!(drive = %drive, remote = %remote, "restore_from: the remote holds no snapshot of the drive yet; it starts empty");
            return Ok(());
        };
        let d = drives.get_ready(drive)?;
        // Through the export (whatever the drive's kind), before NBD
        // serves: a read-only drive takes the restore's writes meanwhile.
        let backend = d.export.backend.clone();
        let (manifest, keys) = manifest_with_keys(&r, &spec, &id).await?;
        if manifest.geometry.size_bytes > backend.size() {
            return Err(SnapshotsError::TooLarge {
                id: id.to_string(),
                drive: drive.to_owned(),
                snapshot_bytes: manifest.geometry.size_bytes,
                drive_bytes: backend.size(),
            });
        }
        tracing::info!(drive = %drive, snapshot = %id, remote = %remote, "restore_from: restoring the drive before serving it");
        let mut sink = BackendSink(&*backend);
        let opts = RestoreOptions {
            keys,
            ..RestoreOptions::default()
        };
        let read_only = d.export.is_read_only();
        d.export.set_read_only(false);
        let restored = snapshot::restore(&r, &id, &mut sink, &opts, &mut |_| {}).await;
        let flushed = backend.flush();
        d.export.set_read_only(read_only);
        let report = restored?;
        flushed?;
        tracing::info!(drive = %drive, snapshot = %id, bytes = report.bytes_written, "restore_from: drive restored");
        Ok(())
    }
}

/// A runtime for restores at start (the daemon's starts later).
fn runtime() -> Result<tokio::runtime::Runtime, SnapshotsError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ramd-restore")
        .enable_all()
        .build()
        .map_err(SnapshotsError::Runtime)
}

/// Logs a restore's progress at every tenth of it (restores at start have
/// no job to show it).
fn progress_logger(drive: &str) -> impl FnMut(&Progress) + Send {
    let drive = drive.to_owned();
    let mut last_tenth = 0;
    move |p: &Progress| {
        let tenth = (p.bytes_done * 10).checked_div(p.bytes_total).unwrap_or(0);
        if tenth > last_tenth {
            last_tenth = tenth;
            tracing::info!(drive = %drive, "restore_from: {}% restored", tenth * 10);
        }
    }
}

/// Reads a manifest with the remote's key when it has one, else (or when
/// the snapshot is not encrypted) without: returns the keys that fit.
async fn manifest_with_keys(
    r: &Remote,
    spec: &RemoteSpec,
    id: &SnapshotId,
) -> Result<(Manifest, Option<Arc<Keys>>), SnapshotsError> {
    let keys = spec.keys()?;
    if let Some(k) = &keys {
        match snapshot::read_manifest(r, id, Some(k)).await {
            Ok(m) => return Ok((m, keys)),
            Err(SnapshotError::NoSuchSnapshot { .. }) | Err(SnapshotError::Remote(_)) => {}
            Err(keyed) => {
                return match snapshot::read_manifest(r, id, None).await {
                    Ok(m) => Ok((m, None)),
                    Err(_) => Err(keyed.into()),
                }
            }
        }
    }
    Ok((snapshot::read_manifest(r, id, None).await?, None))
}

/// The snapshot a restore reads: the one asked for, else the newest.
async fn pick(
    r: &Remote,
    req: &RestoreRequest,
    id: Option<SnapshotId>,
) -> Result<SnapshotId, SnapshotsError> {
    match id {
        Some(id) => Ok(id),
        None => snapshot::list_snapshots(r, Some(&req.drive))
            .await?
            .pop()
            .ok_or_else(|| SnapshotsError::NoSnapshot {
                remote: req.remote.clone(),
                drive: req.drive.clone(),
            }),
    }
}

/// The spec of a restore's new drive: `target` of `size` with the
/// request's compression and memory limit; every other setting its
/// default (through the spec parser).
fn new_drive_spec(
    target: &str,
    size: u64,
    req: &RestoreRequest,
) -> Result<DriveSpec, SnapshotsError> {
    let mut spec = parse_drive_spec(&format!("{target}={size}"))
        .map_err(|e| SnapshotsError::Drive(e.into()))?;
    spec.compress = req.compress;
    spec.mem_limit_bytes = req.mem_limit_bytes;
    check_compress(&spec).map_err(|e| SnapshotsError::Drive(e.into()))?;
    Ok(spec)
}

/// The body of a restore job: newest (or given) snapshot into a new store,
/// then the drive registered with it. Returns the snapshot's id and label.
async fn restore_new(
    drives: &Arc<Drives>,
    spec: &RemoteSpec,
    r: &Remote,
    req: &RestoreRequest,
    id: Option<SnapshotId>,
    target: &str,
    job: &Job,
) -> Result<(SnapshotId, String, RestoreReport), SnapshotsError> {
    let id = pick(r, req, id).await?;
    let (manifest, keys) = manifest_with_keys(r, spec, &id).await?;
    let size = manifest.geometry.size_bytes;
    let drive_spec = new_drive_spec(target, size, req)?;
    // Before any chunk is fetched: a drive the budget cannot take is
    // refused now, not after the whole download.
    drives.check_room(&drive_spec)?;
    let (limit, budget) = (req.mem_limit_bytes, drives.budget().clone());
    let (data, store): (DriveData, Arc<dyn Backend>) = match req.compress {
        None => {
            // In a memfd a supervisor keeps, when there is one (the
            // drive is then kept like any RAM drive: drives::kept).
            let opts = crate::store::StoreOptions {
                mem_limit_bytes: limit,
                shared_memory: crate::handover::serving::get().is_some(),
                ..Default::default()
            };
            let s = Arc::new(RamStore::with_options(size, opts, budget)?);
            (DriveData::Ram(s.clone()), s)
        }
        Some(algo) => {
            // Kept in memfds when a supervisor serves (drives::kept).
            let s = match crate::handover::serving::get() {
                Some(_) => CompressedStore::kept(size, algo, limit, budget, false, false),
                None => CompressedStore::new(size, algo, limit, budget),
            };
            let s = Arc::new(s.map_err(|e| SnapshotsError::Drive(e.into()))?);
            (DriveData::Compressed(s.clone()), s)
        }
    };
    let mut sink = BackendSink(&*store);
    let opts = RestoreOptions {
        keys,
        ..RestoreOptions::default()
    };
    let mut on_progress = |p: &Progress| *job.progress.lock() = *p;
    let report = snapshot::restore(r, &id, &mut sink, &opts, &mut on_progress).await?;
    drives.create_from(drive_spec, Source::Adopted(data))?;
    Ok((id, manifest.label, report))
}

/// The body of a restore job into a new persistent drive: the state
/// directory restored crash-safely (`persistent.rs`), then the drive
/// registered, loaded from it, and reported once it serves.
#[allow(clippy::too_many_arguments)]
async fn restore_persistent(
    drives: &Arc<Drives>,
    spec: &RemoteSpec,
    r: &Remote,
    req: &RestoreRequest,
    id: Option<SnapshotId>,
    target: &str,
    persist: PersistSpec,
    job: &Arc<Job>,
) -> Result<(SnapshotId, String, RestoreReport), SnapshotsError> {
    let id = pick(r, req, id).await?;
    let (manifest, keys) = manifest_with_keys(r, spec, &id).await?;
    let mut drive_spec = new_drive_spec(target, manifest.geometry.size_bytes, req)?;
    drive_spec.persist = Some(persist);
    drives.check_room(&drive_spec)?;
    let dir = drives.drive_dir(target)?;
    let disk = DiskRestore {
        remote: r.clone(),
        id: id.clone(),
        keys,
        spec: drive_spec.clone(),
        origin: Source::Restored.origin().name().to_owned(),
        dir: dir.clone(),
        budget: drives.budget().clone(),
    };
    let (rt, j) = (tokio::runtime::Handle::current(), job.clone());
    let report = tokio::task::spawn_blocking(move || {
        let mut on_progress = |p: &Progress| *j.progress.lock() = *p;
        disk.run(&rt, &mut on_progress)
    })
    .await
    .map_err(|e| SnapshotsError::Engine(e.into()))??;
    // The state directory holds the whole drive now: register it (it
    // loads like any persistent drive); if that is refused, take the
    // directory back out so no later start loads a drive nobody asked
    // for under a name someone else has.
    let (d2, s2) = (drives.clone(), drive_spec.clone());
    let created = tokio::task::spawn_blocking(move || d2.create_from(s2, Source::Restored))
        .await
        .map_err(|e| SnapshotsError::Engine(e.into()))?;
    let drive = match created {
        Ok(c) => c.drive,
        Err(e) => {
            persistent::withdraw(&dir);
            return Err(e.into());
        }
    };
    wait_loaded(drives, &drive.name, &dir).await?;
    Ok((id, manifest.label, report))
}

/// Waits until the drive `name` has loaded from `dir` (ready), or says
/// why it did not.
async fn wait_loaded(
    drives: &Drives,
    name: &str,
    dir: &std::path::Path,
) -> Result<(), SnapshotsError> {
    loop {
        let d = drives.get(name)?;
        let state = d.state.lock().clone();
        match state {
            DriveState::Ready => return Ok(()),
            DriveState::Failed(reason) => {
                return Err(SnapshotsError::NotLoaded {
                    name: name.to_owned(),
                    dir: dir.to_owned(),
                    reason,
                })
            }
            DriveState::Restoring => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
        }
    }
}
