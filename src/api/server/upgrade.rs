//! `POST /v1/upgrade` (`ramd upgrade`): hands every drive, ublk device
//! and client to another ramd binary (docs/restart.md). Refused unless a
//! supervisor runs this process (409 `not_supervised`: stopping it would
//! end every RAM drive), over the unix socket only (it runs a program as
//! the daemon's user: 403 `unix_socket_only` for token callers), and for
//! a path that is not an executable file answering `--version` with
//! "ramd ..." (422 `bad_binary`). Accepted (202): this process tells its
//! supervisor which binary comes next, then stops the way SIGTERM stops
//! it but leaves its ublk devices to the next process; the supervisor
//! starts the new binary with everything kept, and starts this one again
//! if the new one fails before it serves.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::{Extension, Json};

use super::auth::Caller;
use super::{blocking, ApiError};
use crate::api::wire::health::{UpgradeRequest, Upgrading};
use crate::handover::serving;

fn bad_binary(why: String) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "bad_binary", why)
}

/// The binary an upgrade starts: the one asked for, else the path this
/// process was started from (its new contents, after a package upgrade
/// replaced the file).
fn binary_of(req: &UpgradeRequest) -> Result<PathBuf, ApiError> {
    if let Some(b) = &req.binary {
        return Ok(PathBuf::from(b));
    }
    let exe = std::env::current_exe().map_err(|e| {
        bad_binary(format!(
            "cannot tell which binary this is: {e}; give --binary"
        ))
    })?;
    let s = exe.to_string_lossy();
    Ok(PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(&s)))
}

/// An executable file that says it is ramd; returns its version line.
fn check_binary(path: &std::path::Path) -> Result<String, ApiError> {
    let meta =
        std::fs::metadata(path).map_err(|e| bad_binary(format!("{}: {e}", path.display())))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(bad_binary(format!(
            "{} is not an executable file",
            path.display()
        )));
    }
    let out = std::process::Command::new(path)
        .arg("--version")
        .output()
        .map_err(|e| bad_binary(format!("{} --version: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || !text.starts_with("ramd ") {
        return Err(bad_binary(format!(
            "{} --version did not answer \"ramd VERSION\" (got {text:?}): not a ramd binary",
            path.display()
        )));
    }
    Ok(text)
}

pub async fn upgrade(
    caller: Option<Extension<Caller>>,
    body: Result<Json<UpgradeRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<Upgrading>), ApiError> {
    super::auth::unix_socket_only(
        caller.as_ref(),
        "an upgrade runs a program as the daemon's user, so it is asked",
        "ramd upgrade",
    )?;
    let req = body.map(|Json(r)| r).unwrap_or_default();
    let Some(s) = serving::get().filter(|s| s.status().supervisor_alive) else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_supervised",
            "no supervisor keeps this daemon's drives (start it with `ramd daemon --supervise`): stopping it for an upgrade would end every RAM drive",
        ));
    };
    let binary = binary_of(&req)?;
    let b2 = binary.clone();
    let new_version = blocking(move || check_binary(&b2)).await?;
    s.request_upgrade(&binary)
        .map_err(|e| ApiError::internal(format!("cannot tell the supervisor: {e}")))?;
    tracing::info!(binary = %binary.display(), new_version = %new_version, "upgrade: stopping this process; the supervisor starts the new binary with every drive kept");
    // Stop as SIGTERM does: the API's graceful shutdown lets this
    // request's answer go out before the process stops.
    // SAFETY: kill(2) on our own pid with a valid signal; SIGTERM is
    // blocked in every thread and taken by the signal thread.
    unsafe { libc::kill(std::process::id() as libc::pid_t, libc::SIGTERM) };
    Ok((
        StatusCode::ACCEPTED,
        Json(Upgrading {
            binary: binary.display().to_string(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
            new_version,
        }),
    ))
}
