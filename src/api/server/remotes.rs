//! `/v1/remotes`: the object-storage places snapshots go (list, add,
//! remove). Answers never hold credentials, only where they come from.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;

use super::ApiError;
use crate::api::wire::snapshots::{AddRemote, RemoteInfo, RemoteList, RemoteRemoved};
use crate::control::remotes::{parse_chunk_size, RemoteSpec, RemotesError, StoredRemote};
use crate::control::Daemon;

/// The status and code of a remote's refusal.
pub(crate) fn status_code(e: &RemotesError) -> (StatusCode, &'static str) {
    use RemotesError as R;
    match e {
        R::Name(_)
        | R::Url(_)
        | R::Endpoint(_)
        | R::RelativePath { .. }
        | R::Open { .. }
        | R::ChunkSize { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_remote"),
        R::Exists(_) => (StatusCode::CONFLICT, "remote_exists"),
        R::NotFound(_) => (StatusCode::NOT_FOUND, "remote_not_found"),
        R::FromConfig(_) => (StatusCode::CONFLICT, "remote_from_config"),
        R::Save { .. } | R::Load { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "remote_state"),
        R::Credentials { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "remote_credentials"),
        R::NoKey(_) | R::EncryptedDrive { .. } | R::Key { .. } => {
            (StatusCode::UNPROCESSABLE_ENTITY, "snapshot_key")
        }
    }
}

impl From<RemotesError> for ApiError {
    fn from(e: RemotesError) -> Self {
        let (status, code) = status_code(&e);
        ApiError::new(status, code, e.to_string())
    }
}

/// The API view of a remote.
pub(crate) fn info(s: &RemoteSpec) -> RemoteInfo {
    RemoteInfo {
        name: s.name.clone(),
        url: s.url.to_string(),
        endpoint: s.endpoint.clone(),
        region: s.region.clone(),
        credentials: s.credentials_source(),
        encrypt_key_file: s.encrypt_key_file.as_ref().map(|p| p.display().to_string()),
        chunk_bytes: s.chunk_bytes(),
        origin: s.origin.name().to_owned(),
    }
}

pub async fn list(State(d): State<Arc<Daemon>>) -> Json<RemoteList> {
    Json(RemoteList {
        remotes: d.snapshots.remotes.list().iter().map(info).collect(),
    })
}

pub async fn add(
    State(d): State<Arc<Daemon>>,
    who: super::host_paths::Requester,
    body: Result<Json<AddRemote>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Json(req) = body?;
    let chunk_bytes = req
        .chunk_size
        .as_ref()
        .map(|c| parse_chunk_size(&c.as_text()))
        .transpose()?;
    let stored = StoredRemote {
        name: req.name,
        url: req.url,
        endpoint: req.endpoint,
        region: req.region,
        credentials_file: file(&d, who, &req.credentials_file, "credentials_file")?,
        encrypt_key_file: file(&d, who, &req.encrypt_key_file, "encrypt_key_file")?,
        chunk_bytes,
    };
    let d2 = d.clone();
    // Writes the state file: off the async threads.
    let spec = super::blocking(move || Ok(d2.snapshots.remotes.add(&stored)?)).await?;
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, format!("/v1/remotes/{}", spec.name))],
        Json(info(&spec)),
    ))
}

pub async fn get(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<RemoteInfo>, ApiError> {
    Ok(Json(info(&d.snapshots.remotes.get(&name)?)))
}

pub async fn remove(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<RemoteRemoved>, ApiError> {
    let s = super::blocking(move || Ok(d.snapshots.remotes.remove(&name)?)).await?;
    Ok(Json(RemoteRemoved { name: s.name }))
}

/// An optional file path of a request, if the requester may name it.
fn file(
    d: &Daemon,
    who: super::host_paths::Requester,
    text: &Option<String>,
    field: &str,
) -> Result<Option<std::path::PathBuf>, ApiError> {
    text.as_deref()
        .map(|t| super::host_paths::host_path(&d.settings.api_policy, who, field, t))
        .transpose()
}
