//! `/v1/attachments`: drives exposed as files through FUSE.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::types::{AttachmentInfo, AttachmentList, CreateAttachment};
use super::{blocking, ApiError};
use crate::attach;
use crate::daemon::Daemon;

fn view(a: attach::AttachmentInfo) -> AttachmentInfo {
    AttachmentInfo {
        id: a.id,
        drive: a.drive,
        mountpoint: a.mountpoint.display().to_string(),
        file: a.file.display().to_string(),
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
    let drive = d.registry.get_ready(&req.drive)?;
    let info = blocking(move || {
        Ok(d.attachments
            .attach(drive, std::path::Path::new(&req.mountpoint))?)
    })
    .await?;
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
