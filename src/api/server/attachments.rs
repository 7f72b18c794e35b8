//! `/v1/attachments`: drives and caches exposed as files through FUSE.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::{blocking, ApiError};
use crate::api::wire::attachments::{AttachmentInfo, AttachmentList, CreateAttachment};
use crate::control::caches::error::Unavailable;
use crate::control::caches::CachesError;
use crate::control::drives::DriveError;
use crate::control::ledger::LedgerError;
use crate::control::Daemon;
use crate::fuse::{self, Attachable};

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
        mountpoint: a.mountpoint.display().to_string(),
        file: a.file.display().to_string(),
        path: a.path.kind().to_owned(),
        queues: a.path.queues() as u32,
    }
}

pub async fn list(State(d): State<Arc<Daemon>>) -> Json<AttachmentList> {
    Json(AttachmentList {
        attachments: d.attachments.list().into_iter().map(view).collect(),
    })
}

pub async fn create(
    State(d): State<Arc<Daemon>>,
    body: Result<Json<CreateAttachment>, JsonRejection>,
) -> Result<(StatusCode, Json<AttachmentInfo>), ApiError> {
    let Json(req) = body?;
    let drive = attachable(&d, &req.drive)?;
    let mountpoint = super::host_paths::absolute("mountpoint", &req.mountpoint)?;
    let info = blocking(move || Ok(d.attachments.attach(drive, &mountpoint, req.force)?)).await?;
    Ok((StatusCode::CREATED, Json(view(info))))
}

pub async fn delete(
    State(d): State<Arc<Daemon>>,
    Path(id): Path<String>,
) -> Result<Json<AttachmentInfo>, ApiError> {
    let id: u64 = id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "attachment_not_found",
            format!("no attachment '{id}': ids are numbers (see GET /v1/attachments)"),
        )
    })?;
    let info = blocking(move || Ok(d.attachments.detach(id)?)).await?;
    Ok(Json(view(info)))
}
