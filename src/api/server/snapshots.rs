//! `/v1/snapshots`, `/v1/drives/{name}/snapshots` and
//! `/v1/caches/{name}/snapshots`: push a drive or a cache now (a
//! background job), list, delete, prune, restore into a new RAM or
//! persistent drive (a job), follow a job, and a drive's or cache's push
//! state.
//!
//! Pushes and restores answer 202 with the job at once; the client polls
//! `GET /v1/snapshots/jobs/{id}` for progress and outcome.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;

use super::ApiError;
use crate::api::wire::snapshots::{
    CreateSnapshot, Job as WireJob, JobProgress, PruneReport, PruneRequest, PushResult,
    RemoteFailure, RestoreResult, RestoreSnapshot, SnapshotDeleted, SnapshotInfo, SnapshotList,
    SnapshotQuery, SnapshotStatus, SnapshotStatusList,
};
use crate::control::drives::spec::{parse_compress, parse_durability, PersistOptions};
use crate::control::snapshots::jobs::{Job, Outcome};
use crate::control::snapshots::{PushRequest, RestoreRequest, SnapshotsError, Target};
use crate::control::Daemon;
use crate::snapshot::{Retention, SnapshotError};

impl From<SnapshotsError> for ApiError {
    fn from(e: SnapshotsError) -> Self {
        use crate::snapshot::RemoteError as R;
        use SnapshotsError as S;
        let (status, code) = match &e {
            S::Remote(r) => super::remotes::status_code(r),
            S::Drive(_) => {
                let S::Drive(d) = e else { unreachable!() };
                return d.into();
            }
            S::Cache(_) => {
                let S::Cache(c) = e else { unreachable!() };
                return (*c).into();
            }
            S::Engine(SnapshotError::Remote(r))
            | S::Engine(SnapshotError::Lease(crate::snapshot::lease::LeaseError::Remote(r))) => {
                match r {
                    R::Unreachable { .. } => (StatusCode::BAD_GATEWAY, "remote_unreachable"),
                    R::BucketMissing { .. } => (StatusCode::BAD_GATEWAY, "bucket_missing"),
                    R::AccessDenied { .. } => (StatusCode::BAD_GATEWAY, "remote_denied"),
                    R::NotFound { .. } => (StatusCode::NOT_FOUND, "object_missing"),
                    R::Config { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_remote"),
                    R::Other { .. } => (StatusCode::BAD_GATEWAY, "remote_error"),
                }
            }
            S::Engine(SnapshotError::NoSuchSnapshot { .. }) | S::NoSnapshot { .. } => {
                (StatusCode::NOT_FOUND, "snapshot_not_found")
            }
            S::Engine(SnapshotError::Lease(_)) => (StatusCode::CONFLICT, "remote_busy"),
            S::Engine(_) => (StatusCode::BAD_GATEWAY, "snapshot_failed"),
            S::Busy(_) | S::Cut { .. } => (StatusCode::CONFLICT, "snapshot_running"),
            S::DriveName(_) | S::BadId { .. } | S::KeepNothing => {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request")
            }
            S::TargetExists(_) | S::StateDirTaken { .. } => (StatusCode::CONFLICT, "drive_exists"),
            S::Restoring(_) => (StatusCode::CONFLICT, "restore_running"),
            S::Disk { .. } | S::NotLoaded { .. } => {
                (StatusCode::INSUFFICIENT_STORAGE, "restore_disk")
            }
            S::Owner(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            S::TooLarge { .. } => (StatusCode::CONFLICT, "snapshot_too_large"),
            S::NoJob(_) => (StatusCode::NOT_FOUND, "job_not_found"),
            S::Store(_) => (StatusCode::INSUFFICIENT_STORAGE, "over_budget"),
            S::Runtime(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// The API view of a job.
fn job_view(j: &Job) -> WireJob {
    let p = *j.progress.lock();
    let (outcome, finished) = j.outcome.lock().clone();
    let mut w = WireJob {
        id: j.id,
        kind: j.kind.name().into(),
        drive: j.drive.clone(),
        remote: j.remote.clone(),
        state: "running".into(),
        error: None,
        progress: JobProgress {
            chunks_done: p.chunks_done,
            chunks_total: p.chunks_total,
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            bytes_transferred: p.bytes_transferred,
        },
        push: None,
        restore: None,
        started_unix_ms: j.started_unix_ms,
        finished_unix_ms: finished,
    };
    match outcome {
        Outcome::Running => {}
        Outcome::Failed(m) => {
            w.state = "failed".into();
            w.error = Some(m);
        }
        Outcome::Pushed {
            id,
            label,
            report: r,
        } => {
            w.state = "done".into();
            let ratio = r.dedup_ratio();
            w.push = Some(PushResult {
                snapshot: id,
                label: non_empty(label),
                chunks_total: r.chunks_total,
                chunks_uploaded: r.chunks_uploaded,
                chunks_skipped: r.chunks_skipped,
                chunks_deduped: r.chunks_deduped,
                chunks_zero: r.chunks_zero,
                bytes_data: r.bytes_data,
                bytes_uploaded: r.bytes_uploaded,
                dedup_ratio: ratio.is_finite().then_some(ratio),
            });
        }
        Outcome::Restored {
            id,
            label,
            drive,
            report: r,
            persistent,
        } => {
            w.state = "done".into();
            w.restore = Some(RestoreResult {
                snapshot: id,
                label: non_empty(label),
                drive,
                chunks_fetched: r.chunks_fetched,
                chunks_zero: r.chunks_zero,
                bytes_downloaded: r.bytes_downloaded,
                bytes_written: r.bytes_written,
                persistent,
            });
        }
    }
    w
}

/// A label as the API shows it: null for none.
fn non_empty(label: String) -> Option<String> {
    Some(label).filter(|l| !l.is_empty())
}

fn accepted(j: &Job) -> impl IntoResponse {
    (
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/v1/snapshots/jobs/{}", j.id))],
        Json(job_view(j)),
    )
}

/// What a push of drive or cache `name` asks for.
fn push_request(name: String, req: CreateSnapshot) -> PushRequest {
    PushRequest {
        drive: name,
        remote: req.remote,
        label: req.label.unwrap_or_default(),
        encrypt: req.encrypt,
    }
}

/// `POST /v1/drives/{name}/snapshots`: push now.
pub async fn create(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
    body: Result<Json<CreateSnapshot>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let req = push_request(name, body?.0);
    let target = Target::drive(&d.drives, &req.drive)?;
    let (job, _) = d.snapshots.start_push(target, &req)?;
    Ok(accepted(&job))
}

/// `POST /v1/caches/{name}/snapshots`: push a cache's logical image now
/// (its dirty data written back first, in the job).
pub async fn create_cache(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
    body: Result<Json<CreateSnapshot>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let req = push_request(name, body?.0);
    let target = Target::cache(&d.caches, &req.drive)?;
    let (job, _) = d.snapshots.start_push(target, &req)?;
    Ok(accepted(&job))
}

/// `GET /v1/drives/{name}/snapshots`: the drive's push state per remote.
pub async fn status(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<SnapshotStatusList>, ApiError> {
    d.drives.get(&name)?;
    Ok(Json(status_of(&d, &name)))
}

/// `GET /v1/caches/{name}/snapshots`: the cache's push state per remote.
pub async fn status_cache(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<SnapshotStatusList>, ApiError> {
    d.caches.get(&name)?;
    Ok(Json(status_of(&d, &name)))
}

/// A drive's push state (also part of its info).
pub(crate) fn status_of(d: &Daemon, name: &str) -> SnapshotStatusList {
    let policy = d.snapshots.policies().get(name);
    let statuses = d
        .snapshots
        .statuses()
        .into_iter()
        .filter(|(dr, _, _)| dr == name)
        .map(|(drive, remote, s)| SnapshotStatus {
            kind: s.kind.name().into(),
            interval_ms: policy
                .filter(|p| p.remote.as_deref() == Some(remote.as_str()))
                .and_then(|p| p.interval_ms),
            drive,
            remote,
            running: s.running,
            last_snapshot: s.last_snapshot,
            last_label: s.last_label,
            last_success_unix_ms: s.last_success_unix_ms,
            last_error: s.last_error,
            last_error_unix_ms: s.last_error_unix_ms,
            pushes_total: s.pushes_total,
            failures_total: s.failures_total,
            bytes_uploaded_total: s.bytes_uploaded_total,
            last_dedup_ratio: s.last_dedup_ratio,
        })
        .collect();
    SnapshotStatusList {
        statuses,
        restore_from: policy.and_then(|p| p.restore_from.clone()),
    }
}

/// `GET /v1/snapshots?drive=&remote=`.
pub async fn list(
    State(d): State<Arc<Daemon>>,
    query: Result<Query<SnapshotQuery>, QueryRejection>,
) -> Result<Json<SnapshotList>, ApiError> {
    let Query(q) = query?;
    let (found, failed) = d
        .snapshots
        .list(q.remote.as_deref(), q.drive.as_deref())
        .await?;
    Ok(Json(SnapshotList {
        snapshots: found
            .into_iter()
            .map(|l| SnapshotInfo {
                id: l.id.to_string(),
                drive: l.id.drive.clone(),
                remote: l.remote,
                created_unix_ms: l.id.created_ms,
                label: l.label,
            })
            .collect(),
        failed: failed
            .into_iter()
            .map(|(remote, message)| RemoteFailure { remote, message })
            .collect(),
    }))
}

/// `DELETE /v1/snapshots/{remote}/{drive}/{id}`.
pub async fn delete(
    State(d): State<Arc<Daemon>>,
    Path((remote, drive, id)): Path<(String, String, String)>,
) -> Result<Json<SnapshotDeleted>, ApiError> {
    let id = d.snapshots.delete(&remote, &drive, &id).await?;
    Ok(Json(SnapshotDeleted {
        remote,
        id: id.to_string(),
    }))
}

/// `POST /v1/snapshots/prune`.
pub async fn prune(
    State(d): State<Arc<Daemon>>,
    body: Result<Json<PruneRequest>, JsonRejection>,
) -> Result<Json<PruneReport>, ApiError> {
    let Json(req) = body?;
    let retention = Retention {
        keep_last: req.keep_last.map(|n| n as usize),
        keep_daily: req.keep_daily.map(|n| n as usize),
    };
    let r = d
        .snapshots
        .prune(&req.remote, retention, req.grace_ms)
        .await?;
    Ok(Json(PruneReport {
        remote: req.remote,
        snapshots_kept: r.snapshots_kept,
        snapshots_deleted: r.snapshots_deleted,
        chunks_referenced: r.chunks_referenced,
        chunks_young: r.chunks_young,
        chunks_deleted: r.chunks_deleted,
        bytes_freed: r.bytes_freed,
    }))
}

/// `POST /v1/snapshots/restore`: into a new drive (RAM, or persistent
/// with `persist`), served once verified (and, persistent, durable).
pub async fn restore(
    State(d): State<Arc<Daemon>>,
    who: super::host_paths::Requester,
    body: Result<Json<RestoreSnapshot>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Json(req) = body?;
    super::host_paths::key_file(&d.settings.api_policy, who, req.key_file.as_deref())?;
    let persist = PersistOptions {
        persist: req.persist,
        durability: req
            .durability
            .as_deref()
            .map(parse_durability)
            .transpose()?,
        sync_interval_ms: req
            .sync_interval
            .as_ref()
            .map(super::persistence::interval_ms)
            .transpose()?,
        encrypt: req.encrypt,
        key_file: req
            .key_file
            .as_deref()
            .map(super::persistence::key_path)
            .transpose()?,
    }
    .into_spec()?;
    let compress = req
        .compress
        .as_deref()
        .map(parse_compress)
        .transpose()?
        .flatten();
    let mem_limit_bytes = match &req.mem_limit {
        Some(v) => super::persistence::mem_limit(v)?,
        None => None,
    };
    let req = RestoreRequest {
        remote: req.remote,
        drive: req.drive,
        snapshot: req.snapshot,
        target: req.as_name,
        persist,
        compress,
        mem_limit_bytes,
    };
    let job = d.snapshots.start_restore(d.drives.clone(), &req)?;
    Ok(accepted(&job))
}

/// `GET /v1/snapshots/jobs/{id}`.
pub async fn job(
    State(d): State<Arc<Daemon>>,
    Path(id): Path<u64>,
) -> Result<Json<WireJob>, ApiError> {
    let j = d.snapshots.jobs.get(id).ok_or(SnapshotsError::NoJob(id))?;
    Ok(Json(job_view(&j)))
}
