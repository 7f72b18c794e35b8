//! The snapshot service: pushes of drives to remotes (on request and on
//! schedule), listings, deletes, prune (retention + GC) and restores into
//! new drives, with the per drive+remote state the API and /metrics show.
//!
//! # Invariants
//!
//! - A push reads a point-in-time cut of the drive (`block::cut`): writes
//!   made while it runs are not in the snapshot, and the drive serves
//!   them all along. One push per drive at a time (the cut allows one);
//!   a second is refused with [`SnapshotsError::Busy`].
//! - A failed push changes nothing a client sees: the drive keeps
//!   serving, earlier snapshots stay (the engine writes the manifest
//!   last), the error is kept as the drive+remote's `last_error` and
//!   counted, and the next push resumes (skips chunks already there).
//! - A restored drive is served only once every chunk is verified and
//!   written: the restore fills a store no export reaches, and the drive
//!   is registered with it only then (`Drives::adopt_ram`). At start, the
//!   drives `restore_from` fills are restored before the NBD server binds.
//! - Secrets: nothing here logs or returns credentials; errors name the
//!   remote (`s3://bucket/prefix`) and the object.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use super::error::SnapshotsError;
use super::jobs::{Job, JobKind, Jobs, Outcome};
use super::policy::DrivePolicy;
use crate::block::cut::CutError;
use crate::control::drives::spec::parse_drive_spec;
use crate::control::drives::Drives;
use crate::control::ledger::Origin;
use crate::control::remotes::{RemoteSpec, Remotes, RemotesError};
use crate::snapshot::remote::now_ms;
use crate::snapshot::source::BackendSink;
use crate::snapshot::{
    self, GcOptions, GcReport, Keys, Manifest, Progress, PushOptions, PushReport, Remote,
    RestoreOptions, RestoreReport, Retention, SnapshotError, SnapshotId, DEFAULT_CHUNK_BYTES,
};
use crate::store::RamStore;

/// The state of one drive's pushes to one remote.
#[derive(Debug, Clone, Default)]
pub struct PushStatus {
    /// The newest snapshot this daemon pushed.
    pub last_snapshot: Option<String>,
    pub last_success_unix_ms: Option<u64>,
    /// The last push's error, cleared by a success.
    pub last_error: Option<String>,
    pub last_error_unix_ms: Option<u64>,
    pub pushes_total: u64,
    pub failures_total: u64,
    /// Object bytes sent by every push (chunks and manifests).
    pub bytes_uploaded_total: u64,
    /// The last push's drive data per plaintext byte uploaded (None:
    /// nothing needed uploading).
    pub last_dedup_ratio: Option<f64>,
    /// A push is running now.
    pub running: bool,
}

/// A push asked for.
#[derive(Debug, Clone)]
pub struct PushRequest {
    pub drive: String,
    pub remote: String,
    pub label: String,
    pub encrypt: bool,
}

/// A restore asked for.
#[derive(Debug, Clone)]
pub struct RestoreRequest {
    pub remote: String,
    /// The drive whose snapshot to restore.
    pub drive: String,
    /// The snapshot (full id or `MS-SUFFIX`); None: the newest.
    pub snapshot: Option<String>,
    /// The new drive's name (None: `drive`).
    pub target: Option<String>,
}

/// The daemon's snapshot side.
pub struct Snapshots {
    pub remotes: Remotes,
    /// Per drive, from the config.
    policies: BTreeMap<String, DrivePolicy>,
    /// Per (drive, remote). A plain mutex: never held across `.await`.
    status: Mutex<BTreeMap<(String, String), PushStatus>>,
    pub jobs: Jobs,
    /// Drives with a push running.
    running: Mutex<HashSet<String>>,
}

impl Snapshots {
    pub fn new(remotes: Remotes, policies: BTreeMap<String, DrivePolicy>) -> Snapshots {
        let status = policies
            .iter()
            .filter_map(|(d, p)| {
                p.remote
                    .clone()
                    .map(|r| ((d.clone(), r), PushStatus::default()))
            })
            .collect();
        Snapshots {
            remotes,
            policies,
            status: Mutex::new(status),
            jobs: Jobs::default(),
            running: Mutex::new(HashSet::new()),
        }
    }

    pub fn policies(&self) -> &BTreeMap<String, DrivePolicy> {
        &self.policies
    }

    /// Every (drive, remote, status) known, by drive then remote.
    pub fn statuses(&self) -> Vec<(String, String, PushStatus)> {
        self.status
            .lock()
            .iter()
            .map(|((d, r), s)| (d.clone(), r.clone(), s.clone()))
            .collect()
    }

    fn update(&self, drive: &str, remote: &str, f: impl FnOnce(&mut PushStatus)) {
        let mut map = self.status.lock();
        f(map
            .entry((drive.to_owned(), remote.to_owned()))
            .or_default());
    }

    /// Starts a push in the background (on the current tokio runtime);
    /// the checks that can fail at once (remote, key, drive, cut) are
    /// made before it returns.
    pub fn start_push(
        self: &Arc<Self>,
        drives: &Drives,
        req: &PushRequest,
    ) -> Result<(Arc<Job>, tokio::task::JoinHandle<()>), SnapshotsError> {
        let spec = self.remotes.get(&req.remote)?;
        let keys = match (req.encrypt, spec.keys()?) {
            (true, None) => return Err(RemotesError::NoKey(req.remote.clone()).into()),
            (true, k) => k,
            (false, _) => None,
        };
        let remote = spec.open()?;
        let drive = drives.get_ready(&req.drive)?;
        if !snapshot::manifest::valid_drive_name(&req.drive) {
            return Err(SnapshotsError::DriveName(req.drive.clone()));
        }
        if !self.running.lock().insert(req.drive.clone()) {
            return Err(SnapshotsError::Busy(req.drive.clone()));
        }
        let cut = match drive.export.begin_cut(DEFAULT_CHUNK_BYTES) {
            Ok(c) => c,
            Err(e) => {
                self.running.lock().remove(&req.drive);
                return Err(match e {
                    CutError::Busy => SnapshotsError::Busy(req.drive.clone()),
                    e => SnapshotsError::Cut {
                        drive: req.drive.clone(),
                        source: e,
                    },
                });
            }
        };
        self.update(&req.drive, &req.remote, |s| s.running = true);
        let job = self.jobs.start(JobKind::Push, &req.drive, &req.remote);
        let mut opts = PushOptions::new(&req.drive);
        opts.label = req.label.clone();
        opts.keys = keys;
        let (me, j, req) = (self.clone(), job.clone(), req.clone());
        let handle = tokio::spawn(async move {
            // A cut is the engine's ChunkSource (snapshot::source).
            let mut source = cut;
            let progress = j.clone();
            let mut on_progress = move |p: &Progress| *progress.progress.lock() = *p;
            let result = snapshot::push(&remote, &mut source, &opts, &mut on_progress).await;
            drop(source);
            me.running.lock().remove(&req.drive);
            me.record_push(&j, &req, &remote, result);
        });
        Ok((job, handle))
    }

    /// Keeps a push's outcome in its job and in the drive+remote state.
    fn record_push(
        &self,
        job: &Job,
        req: &PushRequest,
        remote: &Remote,
        result: Result<PushReport, SnapshotError>,
    ) {
        let now = now_ms();
        match result {
            Ok(report) => {
                let id = report
                    .id
                    .as_ref()
                    .map_or_else(String::new, |i| i.to_string());
                let ratio = report.dedup_ratio();
                tracing::info!(
                    drive = %req.drive, remote = %req.remote, snapshot = %id,
                    uploaded_bytes = report.bytes_uploaded,
                    chunks_uploaded = report.chunks_uploaded,
                    chunks_skipped = report.chunks_skipped,
                    "snapshot pushed to {}", remote.label()
                );
                self.update(&req.drive, &req.remote, |s| {
                    s.running = false;
                    s.pushes_total += 1;
                    s.last_snapshot = Some(id.clone());
                    s.last_success_unix_ms = Some(now);
                    s.last_error = None;
                    s.bytes_uploaded_total += report.bytes_uploaded;
                    s.last_dedup_ratio = ratio.is_finite().then_some(ratio);
                });
                job.finish(Outcome::Pushed { id, report });
            }
            Err(e) => {
                let msg = e.to_string();
                tracing::warn!(drive = %req.drive, remote = %req.remote, "snapshot push failed (the drive keeps serving; the next push resumes): {msg}");
                self.update(&req.drive, &req.remote, |s| {
                    s.running = false;
                    s.pushes_total += 1;
                    s.failures_total += 1;
                    s.last_error = Some(msg.clone());
                    s.last_error_unix_ms = Some(now);
                });
                job.finish(Outcome::Failed(msg));
            }
        }
    }

    /// The snapshots on `remote` (every remote when None), of `drive`
    /// (every drive when None): (remote, id) oldest first per remote, and
    /// the remotes that could not be listed with why.
    pub async fn list(
        &self,
        remote: Option<&str>,
        drive: Option<&str>,
    ) -> Result<(Vec<(String, SnapshotId)>, Vec<(String, String)>), SnapshotsError> {
        let specs = match remote {
            Some(r) => vec![self.remotes.get(r)?],
            None => self.remotes.list(),
        };
        let (mut found, mut failed) = (Vec::new(), Vec::new());
        for spec in specs {
            let listed = async {
                let r = spec.open()?;
                Ok::<_, SnapshotsError>(snapshot::list_snapshots(&r, drive).await?)
            }
            .await;
            match listed {
                Ok(ids) => found.extend(ids.into_iter().map(|id| (spec.name.clone(), id))),
                Err(e) if remote.is_some() => return Err(e),
                Err(e) => failed.push((spec.name.clone(), e.to_string())),
            }
        }
        Ok((found, failed))
    }

    /// Deletes one snapshot's manifest (its chunks go at the next prune).
    pub async fn delete(
        &self,
        remote: &str,
        drive: &str,
        id: &str,
    ) -> Result<SnapshotId, SnapshotsError> {
        let id = parse_id(drive, id)?;
        let spec = self.remotes.get(remote)?;
        let r = spec.open()?;
        let name = id.object_name();
        if !r.exists(&name).await.map_err(SnapshotError::from)? {
            return Err(SnapshotError::NoSuchSnapshot {
                id: id.to_string(),
                remote: r.label().to_owned(),
            }
            .into());
        }
        r.delete(&name).await.map_err(SnapshotError::from)?;
        tracing::info!(remote = %remote, snapshot = %id, "snapshot deleted (its chunks go at the next prune)");
        Ok(id)
    }

    /// Applies `retention` on `remote` and deletes the chunks no kept
    /// snapshot needs (older than `grace_ms`).
    pub async fn prune(
        &self,
        remote: &str,
        retention: Retention,
        grace_ms: Option<u64>,
    ) -> Result<GcReport, SnapshotsError> {
        if retention.keep_last == Some(0) || retention.keep_daily == Some(0) {
            return Err(SnapshotsError::KeepNothing);
        }
        let spec = self.remotes.get(remote)?;
        let r = spec.open()?;
        let mut opts = GcOptions {
            retention,
            keys: spec.keys()?,
            ..GcOptions::default()
        };
        if let Some(g) = grace_ms {
            opts.grace_ms = g;
        }
        let report = snapshot::gc(&r, &opts).await?;
        tracing::info!(
            remote = %remote,
            snapshots_deleted = report.snapshots_deleted,
            chunks_deleted = report.chunks_deleted,
            bytes_freed = report.bytes_freed,
            "remote pruned"
        );
        Ok(report)
    }

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
        let id = req
            .snapshot
            .as_deref()
            .map(|s| parse_id(&req.drive, s))
            .transpose()?;
        let remote = spec.open()?;
        let job = self.jobs.start(JobKind::Restore, &req.drive, &req.remote);
        let (j, req) = (job.clone(), req.clone());
        tokio::spawn(async move {
            let outcome = restore_new(&drives, &spec, &remote, &req, id, &target, &j).await;
            match outcome {
                Ok((id, report)) => {
                    tracing::info!(drive = %target, snapshot = %id, remote = %req.remote, bytes = report.bytes_written, "drive restored from snapshot; serving it");
                    j.finish(Outcome::Restored {
                        id: id.to_string(),
                        drive: target,
                        report,
                    });
                }
                Err(e) => {
                    tracing::warn!(drive = %target, remote = %req.remote, "restore from snapshot failed: {e}");
                    j.finish(Outcome::Failed(e.to_string()));
                }
            }
        });
        Ok(job)
    }

    /// At start, before NBD serves: fills each `(drive, remote)` from the
    /// newest snapshot of the drive (a remote without one leaves the drive
    /// empty, logged). Runs its own runtime (the daemon's starts later).
    pub fn restore_at_start(
        &self,
        drives: &Drives,
        which: &[(String, String)],
    ) -> Result<(), SnapshotsError> {
        if which.is_empty() {
            return Ok(());
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ramd-restore")
            .enable_all()
            .build()
            .map_err(SnapshotsError::Runtime)?;
        for (drive, remote) in which {
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

/// A snapshot id from the CLI: the full `DRIVE/MS-SUFFIX` or `MS-SUFFIX`
/// of `drive`.
pub fn parse_id(drive: &str, text: &str) -> Result<SnapshotId, SnapshotsError> {
    let full = if text.contains('/') {
        text.to_owned()
    } else {
        format!("{drive}/{text}")
    };
    let id: SnapshotId = full.parse().map_err(|source| SnapshotsError::BadId {
        text: text.to_owned(),
        source,
    })?;
    if id.drive != drive {
        return Err(SnapshotsError::NoSnapshot {
            remote: String::new(),
            drive: drive.to_owned(),
        });
    }
    Ok(id)
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

/// The body of a restore job: newest (or given) snapshot into a new store,
/// then the drive registered with it.
async fn restore_new(
    drives: &Arc<Drives>,
    spec: &RemoteSpec,
    r: &Remote,
    req: &RestoreRequest,
    id: Option<SnapshotId>,
    target: &str,
    job: &Job,
) -> Result<(SnapshotId, RestoreReport), SnapshotsError> {
    let id = match id {
        Some(id) => id,
        None => snapshot::list_snapshots(r, Some(&req.drive))
            .await?
            .pop()
            .ok_or_else(|| SnapshotsError::NoSnapshot {
                remote: req.remote.clone(),
                drive: req.drive.clone(),
            })?,
    };
    let (manifest, keys) = manifest_with_keys(r, spec, &id).await?;
    let size = manifest.geometry.size_bytes;
    let store = Arc::new(RamStore::new(size, None, drives.budget().clone())?);
    let mut sink = BackendSink(&*store);
    let opts = RestoreOptions {
        keys,
        ..RestoreOptions::default()
    };
    let mut on_progress = |p: &Progress| *job.progress.lock() = *p;
    let report = snapshot::restore(r, &id, &mut sink, &opts, &mut on_progress).await?;
    // Through the spec parser, so every other setting takes its default.
    let drive_spec = parse_drive_spec(&format!("{target}={size}"))
        .map_err(|e| SnapshotsError::Drive(e.into()))?;
    drives.adopt_ram(&drive_spec, Origin::Api, store)?;
    Ok((id, report))
}
