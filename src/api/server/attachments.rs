//! `/v1/attachments`: drives and caches exposed as files through FUSE, or
//! as ublk block devices.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;

use super::{blocking, ApiError};
use crate::api::wire::attachments::{AttachKind, AttachmentInfo, AttachmentList, CreateAttachment};
use crate::control::caches::error::Unavailable;
use crate::control::caches::CachesError;
use crate::control::drives::DriveError;
use crate::control::ledger::LedgerError;
use crate::control::Daemon;
use crate::fuse::{self, Attachable};
use crate::ublk;

/// The drive, or else the serving cache, of that name.
fn attachable(d: &Daemon, name: &str) -> Result<Arc<dyn Attachable>, ApiError> {
    match d.drives.get_ready(name) {
        Ok(drive) => return Ok(drive),
        Err(DriveError::Ledger(LedgerError::NotFound(_))) => {}
        Err(e) => return Err(e.into()),
    }
    match d.caches.get(name) {
        Ok(c) if c.live().is_some() => Ok(c),
        Ok(c) => Err(CachesError::from(Unavailable::NotAttachable {
            name: name.to_owned(),
            state: c.state().name(),
        })
        .into()),
        Err(_) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "drive_not_found",
            format!("no drive named '{name}', nor a cache (see `ramd list` and `ramd cache list`)"),
        )),
    }
}

fn view(a: fuse::AttachmentInfo) -> AttachmentInfo {
    AttachmentInfo {
        id: a.id,
        drive: a.drive,
        kind: AttachKind::Fuse,
        mountpoint: a.mountpoint.display().to_string(),
        file: a.file.display().to_string(),
        path: a.path.kind().to_owned(),
        queues: a.path.queues() as u32,
    }
}

fn view_ublk(a: ublk::DeviceInfo) -> AttachmentInfo {
    AttachmentInfo {
        id: a.id,
        kind: AttachKind::Ublk,
        mountpoint: String::new(),
        file: a.block_device().display().to_string(),
        path: "ublk".to_owned(),
        queues: u32::from(a.queues),
        drive: a.drive,
    }
}

pub async fn list(State(d): State<Arc<Daemon>>) -> Json<AttachmentList> {
    let mut attachments: Vec<AttachmentInfo> = d.attachments.list().into_iter().map(view).collect();
    attachments.extend(d.ublk.list().into_iter().map(view_ublk));
    attachments.sort_by_key(|a| a.id);
    Json(AttachmentList { attachments })
}

pub async fn create(
    State(d): State<Arc<Daemon>>,
    who: super::host_paths::Requester,
    body: Result<Json<CreateAttachment>, JsonRejection>,
) -> Result<(StatusCode, Json<AttachmentInfo>), ApiError> {
    let Json(req) = body?;
    let drive = attachable(&d, &req.drive)?;
    if req.kind == AttachKind::Ublk {
        if !req.mountpoint.is_empty() {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "bad_mountpoint",
                "a ublk attachment is a block device (/dev/ublkbN) and takes no mountpoint",
            ));
        }
        let info = blocking(move || Ok(d.ublk.attach(drive, d.attachments.reserve_id())?)).await?;
        return Ok((StatusCode::CREATED, Json(view_ublk(info))));
    }
    let mountpoint =
        super::host_paths::host_path(&d.settings.api_policy, who, "mountpoint", &req.mountpoint)?;
    let info = blocking(move || Ok(d.attachments.attach(drive, &mountpoint, req.force)?)).await?;
    Ok((StatusCode::CREATED, Json(view(info))))
}

/// `DELETE /v1/attachments/{id}?force=true`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetachQuery {
    /// ublk: remove the device even while it is mounted or open.
    #[serde(default)]
    pub force: bool,
}

pub async fn delete(
    State(d): State<Arc<Daemon>>,
    Path(id): Path<String>,
    query: Result<Query<DetachQuery>, QueryRejection>,
) -> Result<Json<AttachmentInfo>, ApiError> {
    let Query(q) = query?;
    let id: u64 = id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "attachment_not_found",
            format!("no attachment '{id}': ids are numbers (see GET /v1/attachments)"),
        )
    })?;
    if d.ublk.list().iter().any(|a| a.id == id) {
        let info = blocking(move || Ok(d.ublk.detach(id, q.force)?)).await?;
        return Ok(Json(view_ublk(info)));
    }
    let info = blocking(move || Ok(d.attachments.detach(id)?)).await?;
    Ok(Json(view(info)))
}
