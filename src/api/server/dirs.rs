//! `/v1/dirs`: directories kept in RAM: list, add, get, remove, sync one,
//! sync all.
//!
//! `{id}` is a directory's id (`ramd dir list` shows it) or its path,
//! percent-encoded as one segment (`/v1/dirs/%2Fvar%2Flog`). Everything
//! here mounts, walks trees or fsyncs, so it runs on blocking threads; a
//! sync answers once the on-disk copy is durable.

use std::path::Path;
use std::sync::Arc;

use axum::extract::connect_info::ConnectInfo;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;

use super::host_paths::Peer;
use super::{blocking, ApiError};
use crate::api::wire::dirs::DirInfo as WireDirInfo;
use crate::api::wire::dirs::{
    AddDir, DirList, DirPatched, DirRemoved, DirSyncAll, DirSyncResult, DirSynced, IntervalValue,
    PatchDir,
};
use crate::api::wire::drives::DeleteQuery;
use crate::api::wire::error::ErrorDetail;
use crate::api::wire::values::SizeValue;
use crate::control::dirs::{clean_path, parse_interval_ms};
use crate::control::Daemon;
use crate::dirsync::manager::{
    AddRequest, DirChange, DirOrigin, DEFAULT_DIR_SYNC_INTERVAL_MS, DEFAULT_RECOVERY_GENERATIONS,
    MIN_DIR_SYNC_INTERVAL_MS,
};
use crate::dirsync::mounts::MountMode;
use crate::size::parse as parse_size;

/// Mounting needs root; say so plainly instead of a mount's EPERM.
fn require_root() -> Result<(), ApiError> {
    let uid = rustix::process::geteuid();
    if uid.is_root() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "not_permitted",
        format!(
            "keeping a directory in RAM mounts a tmpfs over it, which needs root, and this daemon runs as uid {}; run the daemon as root (systemctl start ramd)",
            uid.as_raw()
        ),
    ))
}

fn interval_ms(v: &IntervalValue) -> Result<u64, ApiError> {
    match v {
        IntervalValue::Millis(ms) if *ms < MIN_DIR_SYNC_INTERVAL_MS => {
            Err(ApiError::invalid(format!(
                "interval {ms} ms is shorter than the minimum of {MIN_DIR_SYNC_INTERVAL_MS} ms"
            )))
        }
        IntervalValue::Millis(ms) => Ok(*ms),
        IntervalValue::Text(t) => {
            parse_interval_ms(t).map_err(|e| ApiError::invalid(e.to_string()))
        }
    }
}

/// A size limit in a request: a size of at least one byte.
fn size_limit(v: &SizeValue) -> Result<u64, ApiError> {
    let b = parse_size(&v.as_text()).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_size",
            e.to_string(),
        )
    })?;
    if b == 0 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_size",
            "a size limit must be at least 1 byte (leave it out, or \"none\", for the tmpfs default, half of RAM)",
        ));
    }
    Ok(b)
}

fn notice(info_origin: &DirOrigin, path: &Path) -> Option<String> {
    match info_origin {
        DirOrigin::Config { file } => Some(format!(
            "{} is declared in {}: it is kept in RAM again when the daemon restarts; delete its [[dir]] from the file to keep it on disk",
            path.display(),
            file.display()
        )),
        DirOrigin::Api => None,
    }
}

pub async fn list(State(d): State<Arc<Daemon>>) -> Result<Json<DirList>, ApiError> {
    blocking(move || {
        Ok(Json(DirList {
            dirs: d.dirs.manager.list().into_iter().map(Into::into).collect(),
        }))
    })
    .await
}

pub async fn add(
    State(d): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    who: super::host_paths::Requester,
    body: Result<Json<AddDir>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Json(req) = body?;
    super::host_paths::host_path(&d.settings.api_policy, who, "path", &req.path)?;
    let path = clean_path(Path::new(&req.path)).map_err(|e| ApiError::invalid(e.to_string()))?;
    let sync_interval_ms = match &req.interval {
        Some(v) => interval_ms(v)?,
        None => DEFAULT_DIR_SYNC_INTERVAL_MS,
    };
    let size_limit_bytes = req.size_limit.as_ref().map(size_limit).transpose()?;
    require_root()?;
    let add = AddRequest {
        path,
        mode: if req.overlay {
            MountMode::Overlay
        } else {
            MountMode::Tmpfs
        },
        size_limit_bytes,
        sync_interval_ms,
        recovery_generations: req
            .recovery_generations
            .unwrap_or(DEFAULT_RECOVERY_GENERATIONS),
        // Root may keep anyone's directory in RAM; others only their own.
        expected_uid: peer.uid.filter(|&u| u != 0),
        origin: DirOrigin::Api,
        force: req.force,
    };
    let info: WireDirInfo = blocking(move || Ok(d.dirs.add(add)?.into())).await?;
    let location = format!("/v1/dirs/{}", info.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(info),
    ))
}

pub async fn get(
    State(d): State<Arc<Daemon>>,
    UrlPath(key): UrlPath<String>,
) -> Result<Json<WireDirInfo>, ApiError> {
    blocking(move || {
        let path = d.dirs.resolve(&key)?;
        Ok(Json(d.dirs.manager.info(&path)?.into()))
    })
    .await
}

pub async fn patch(
    State(d): State<Arc<Daemon>>,
    UrlPath(key): UrlPath<String>,
    body: Result<Json<PatchDir>, JsonRejection>,
) -> Result<Json<DirPatched>, ApiError> {
    let Json(req) = body?;
    if req.interval.is_none() && req.size_limit.is_none() && req.recovery_generations.is_none() {
        return Err(ApiError::invalid(
            "nothing to change: give interval, size_limit or recovery_generations",
        ));
    }
    let change = DirChange {
        sync_interval_ms: req.interval.as_ref().map(interval_ms).transpose()?,
        size_limit_bytes: match &req.size_limit {
            Some(SizeValue::Text(t)) if matches!(t.trim(), "none" | "default") => Some(None),
            Some(v) => Some(Some(size_limit(v)?)),
            None => None,
        },
        recovery_generations: req.recovery_generations,
    };
    blocking(move || {
        let path = d.dirs.resolve(&key)?;
        let info = d.dirs.reconfigure(&path, &change)?;
        let notice = match &info.origin {
            DirOrigin::Config { file } => Some(format!(
                "{} is declared in {}: the file's settings apply again at the next start; edit the file to keep this change",
                path.display(),
                file.display()
            )),
            DirOrigin::Api => None,
        };
        Ok(Json(DirPatched {
            info: info.into(),
            notice,
        }))
    })
    .await
}

pub async fn delete(
    State(d): State<Arc<Daemon>>,
    UrlPath(key): UrlPath<String>,
    query: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<Json<DirRemoved>, ApiError> {
    let Query(q) = query?;
    blocking(move || {
        let path = d.dirs.resolve(&key)?;
        let info = d.dirs.manager.info(&path)?;
        let result = d.dirs.remove(&path, q.force)?;
        Ok(Json(DirRemoved {
            path: path.display().to_string(),
            id: info.id,
            result: result.into(),
            notice: notice(&info.origin, &path),
        }))
    })
    .await
}

pub async fn sync(
    State(d): State<Arc<Daemon>>,
    UrlPath(key): UrlPath<String>,
) -> Result<Json<DirSynced>, ApiError> {
    blocking(move || {
        let path = d.dirs.resolve(&key)?;
        let id = d.dirs.manager.info(&path)?.id;
        let report = d.dirs.sync(&path)?;
        Ok(Json(DirSynced {
            path: path.display().to_string(),
            id,
            report: report.into(),
        }))
    })
    .await
}

pub async fn sync_all(State(d): State<Arc<Daemon>>) -> Result<Json<DirSyncAll>, ApiError> {
    blocking(move || {
        let results = d
            .dirs
            .sync_all()
            .into_iter()
            .map(|(path, r)| {
                let (report, error) = match r {
                    Ok(report) => (Some(report.into()), None),
                    Err(e) => (
                        None,
                        Some(ErrorDetail {
                            code: e.code().to_owned(),
                            message: e.to_string(),
                        }),
                    ),
                };
                DirSyncResult {
                    path: path.display().to_string(),
                    report,
                    error,
                }
            })
            .collect();
        Ok(Json(DirSyncAll { results }))
    })
    .await
}
