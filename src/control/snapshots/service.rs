//! The snapshot service: pushes of drives and caches to remotes (on
//! request and on schedule), listings, deletes, prune (retention + GC),
//! with the per name+remote state the API and /metrics show. Restores are
//! in `restore.rs`.
//!
//! # Invariants
//!
//! - A push reads a point-in-time cut of the drive (`block::cut`): writes
//!   made while it runs are not in the snapshot, and the drive serves
//!   them all along. One push per drive at a time (the cut allows one);
//!   a second is refused with [`SnapshotsError::Busy`]. A cache is pushed
//!   the same way after its dirty data is written back (`target.rs`): its
//!   cut is taken once the write-back is done.
//! - Leases on the remote are tagged with this daemon's owner id
//!   (`owner.rs`), so after a crash its next push or prune deletes the
//!   leases its killed pushes left instead of waiting for them to expire.
//! - A failed push changes nothing a client sees: the drive keeps
//!   serving, earlier snapshots stay (the engine writes the manifest
//!   last), the error is kept as the drive+remote's `last_error` and
//!   counted, and the next push resumes (skips chunks already there).
//! - A restored drive is served only once every chunk is verified and
//!   written: the restore fills a store no export reaches, and the drive
//!   is registered with it only then (`Drives::create_from`,
//!   `Source::Adopted`). At start, the
//!   drives `restore_from` fills are restored before the NBD server binds.
//! - Secrets: nothing here logs or returns credentials; errors name the
//!   remote (`s3://bucket/prefix`) and the object.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use super::error::SnapshotsError;
use super::ids::parse_id;
use super::jobs::{Job, JobKind, Jobs, Outcome};
use super::policy::{DrivePolicy, TargetKind};
use super::target::Target;
use crate::block::cut::Cut;
use crate::control::remotes::{Remotes, RemotesError};
use crate::snapshot::lease::{LeaseConfig, LeaseOwner};
use crate::snapshot::remote::now_ms;
use crate::snapshot::{
    self, GcOptions, GcReport, Progress, PushOptions, PushReport, Remote, Retention, SnapshotError,
    SnapshotId,
};

/// The state of one drive's pushes to one remote.
#[derive(Debug, Clone, Default)]
pub struct PushStatus {
    /// The newest snapshot this daemon pushed.
    pub last_snapshot: Option<String>,
    /// Its label, when it has one.
    pub last_label: Option<String>,
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
    /// A drive's or a cache's.
    pub kind: TargetKind,
}

/// A snapshot in a listing.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The remote's name.
    pub remote: String,
    pub id: SnapshotId,
    /// Its label, when it has one a listing can read.
    pub label: Option<String>,
}

/// A push asked for.
#[derive(Debug, Clone)]
pub struct PushRequest {
    pub drive: String,
    pub remote: String,
    pub label: String,
    pub encrypt: bool,
}

/// The daemon's snapshot side.
pub struct Snapshots {
    pub remotes: Remotes,
    /// Per drive, from the config.
    policies: BTreeMap<String, DrivePolicy>,
    /// Per (drive, remote). A plain mutex: never held across `.await`.
    status: Mutex<BTreeMap<(String, String), PushStatus>>,
    pub jobs: Jobs,
    /// Drives and caches with a push running.
    running: Mutex<HashSet<String>>,
    /// Names a restore is filling now (one restore per name).
    pub(super) restoring: Mutex<HashSet<String>>,
    /// Tags this daemon's leases on remotes (`owner.rs`).
    pub(super) owner: Arc<LeaseOwner>,
}

impl Snapshots {
    pub fn new(
        remotes: Remotes,
        policies: BTreeMap<String, DrivePolicy>,
        owner: Arc<LeaseOwner>,
    ) -> Snapshots {
        let status = policies
            .iter()
            .filter_map(|(d, p)| {
                let s = PushStatus {
                    kind: p.kind,
                    ..PushStatus::default()
                };
                p.remote.clone().map(|r| ((d.clone(), r), s))
            })
            .collect();
        Snapshots {
            remotes,
            policies,
            status: Mutex::new(status),
            jobs: Jobs::default(),
            running: Mutex::new(HashSet::new()),
            restoring: Mutex::new(HashSet::new()),
            owner,
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

    /// Starts a push of `target` in the background (on the current tokio
    /// runtime); the checks that can fail at once (remote, key, name, a
    /// push running, a drive's cut) are made before it returns. A cache is
    /// written back first, in the job, and cut after.
    pub fn start_push(
        self: &Arc<Self>,
        target: Target,
        req: &PushRequest,
    ) -> Result<(Arc<Job>, tokio::task::JoinHandle<()>), SnapshotsError> {
        let spec = self.remotes.get(&req.remote)?;
        // A drive encrypted at rest is pushed encrypted, asked or not.
        let encrypt = req.encrypt || target.is_encrypted();
        let keys = match (encrypt, spec.keys()?) {
            (true, None) if !req.encrypt => {
                return Err(RemotesError::EncryptedDrive {
                    drive: req.drive.clone(),
                    remote: req.remote.clone(),
                }
                .into())
            }
            (true, None) => return Err(RemotesError::NoKey(req.remote.clone()).into()),
            (true, k) => k,
            (false, _) => None,
        };
        let remote = spec.open()?;
        if !snapshot::manifest::valid_drive_name(&req.drive) {
            return Err(SnapshotsError::DriveName(req.drive.clone()));
        }
        if !self.running.lock().insert(req.drive.clone()) {
            return Err(SnapshotsError::Busy(req.drive.clone()));
        }
        // The remote's chunk size, larger for a drive too big for it.
        let chunk_bytes = snapshot::chunk::chunk_bytes_for(target.size_bytes(), spec.chunk_bytes());
        // A drive's cut is taken now, so the snapshot is the drive as of
        // this answer; a cache's after its write-back.
        let cut = if target.writes_back() {
            None
        } else {
            match target.begin_cut(chunk_bytes) {
                Ok(c) => Some(c),
                Err(e) => {
                    self.running.lock().remove(&req.drive);
                    return Err(e);
                }
            }
        };
        let kind = target.kind();
        self.update(&req.drive, &req.remote, |s| {
            s.running = true;
            s.kind = kind;
        });
        let job = self.jobs.start(JobKind::Push, &req.drive, &req.remote);
        let mut opts = PushOptions::new(&req.drive);
        opts.label = req.label.clone();
        opts.keys = keys;
        opts.chunk_bytes = chunk_bytes;
        opts.lease = LeaseConfig::owned_by(self.owner.clone());
        let (me, j, req) = (self.clone(), job.clone(), req.clone());
        let handle = tokio::spawn(async move {
            let progress = j.clone();
            let mut on_progress = move |p: &Progress| *progress.progress.lock() = *p;
            let result = async {
                // A cut is the engine's ChunkSource (snapshot::source).
                let mut source = match cut {
                    Some(c) => c,
                    None => write_back_then_cut(target, chunk_bytes).await?,
                };
                Ok(snapshot::push(&remote, &mut source, &opts, &mut on_progress).await?)
            }
            .await;
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
        result: Result<PushReport, SnapshotsError>,
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
                    s.last_label = Some(req.label.clone()).filter(|l| !l.is_empty());
                    s.last_success_unix_ms = Some(now);
                    s.last_error = None;
                    s.bytes_uploaded_total += report.bytes_uploaded;
                    s.last_dedup_ratio = ratio.is_finite().then_some(ratio);
                });
                job.finish(Outcome::Pushed {
                    id,
                    label: req.label.clone(),
                    report,
                });
            }
            Err(e) => {
                let msg = e.to_string();
                tracing::warn!(drive = %req.drive, remote = %req.remote, "snapshot push failed (the drive or cache keeps serving; the next push resumes): {msg}");
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
    /// (every drive when None): (remote, id, label) oldest first per
    /// remote, and the remotes that could not be listed with why. Labels
    /// come from the manifests' metadata (`snapshot::label`), sealed ones
    /// opened with the remote's key; a key that does not load only hides
    /// those labels (restores and pushes report it).
    pub async fn list(
        &self,
        remote: Option<&str>,
        drive: Option<&str>,
    ) -> Result<(Vec<Listed>, Vec<(String, String)>), SnapshotsError> {
        let specs = match remote {
            Some(r) => vec![self.remotes.get(r)?],
            None => self.remotes.list(),
        };
        let (mut found, mut failed) = (Vec::new(), Vec::new());
        for spec in specs {
            let listed = async {
                let r = spec.open()?;
                let ids = snapshot::list_snapshots(&r, drive).await?;
                let keys = spec.keys().ok().flatten();
                let labels = snapshot::label::labels(&r, &ids, keys.as_deref()).await?;
                Ok::<_, SnapshotsError>(ids.into_iter().zip(labels))
            }
            .await;
            match listed {
                Ok(ids) => found.extend(ids.map(|(id, label)| Listed {
                    remote: spec.name.clone(),
                    id,
                    label,
                })),
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
            lease: LeaseConfig::owned_by(self.owner.clone()),
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
}

/// A cache's write-back (off the async threads), then its cut.
async fn write_back_then_cut(target: Target, chunk_bytes: u64) -> Result<Cut, SnapshotsError> {
    let target = tokio::task::spawn_blocking(move || {
        let bytes = target.write_back()?;
        tracing::info!(cache = %target.name(), written_back_bytes = bytes, "cache written back before its snapshot");
        Ok::<_, SnapshotsError>(target)
    })
    .await
    .map_err(|e| SnapshotsError::Engine(e.into()))??;
    target.begin_cut(chunk_bytes)
}
