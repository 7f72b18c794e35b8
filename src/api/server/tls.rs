//! `POST /v1/tls/reload`: reads the certificates directory again, as
//! SIGHUP does. New NBD connections get the new certificates; running
//! ones keep theirs. A directory that does not load changes nothing: 422
//! `tls_reload_failed` with the reason (409 `tls_not_configured` when the
//! daemon has no certificates at all).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::{blocking, ApiError};
use crate::api::wire::tls::TlsReloaded;
use crate::control::config::verify_peer_name;
use crate::control::{Daemon, TlsReloadError};

impl From<TlsReloadError> for ApiError {
    fn from(e: TlsReloadError) -> Self {
        let (status, code) = match &e {
            TlsReloadError::NotConfigured => (StatusCode::CONFLICT, "tls_not_configured"),
            TlsReloadError::Load(_) => (StatusCode::UNPROCESSABLE_ENTITY, "tls_reload_failed"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

pub async fn reload(State(d): State<Arc<Daemon>>) -> Result<Json<TlsReloaded>, ApiError> {
    let d2 = d.clone();
    let dir = blocking(move || Ok(d2.reload_tls()?)).await?;
    let client_certificates = d
        .tls
        .as_ref()
        .map_or("off", |t| verify_peer_name(t.client_certs()));
    Ok(Json(TlsReloaded {
        certificates_dir: dir.display().to_string(),
        client_certificates: client_certificates.into(),
    }))
}
