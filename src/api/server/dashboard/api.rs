//! The dashboard's two API routes, on every listener (the unix socket
//! too):
//! - `POST /v1/dashboard/links` (unix socket only, like `/v1/tokens`):
//!   makes a token named `dashboard-<8 hex>` (read-only, or admin) that
//!   expires after `expires` (7 days unless asked otherwise: a link a
//!   day would otherwise leave a pile of live credentials) and a one-time
//!   sign-in code for it (`control::sessions`), and answers the `--http`
//!   URL that carries the code (never the token); `ramd dashboard` prints
//!   it. The token is an ordinary one: `ramd token list` shows it, `ramd
//!   token revoke` ends every session made from it.
//! - `GET /v1/whoami`: the caller's role, so the page offers only what it
//!   may do (the server refuses the rest anyway).

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use ring::rand::SecureRandom;

use crate::api::server::auth::{Caller, Via};
use crate::api::server::{blocking, ApiError};
use crate::api::wire::dashboard::{CreateDashboardLink, DashboardLink, Whoami};
use crate::api::wire::tokens::TokenRole;
use crate::control::ledger::now_unix_s;
use crate::control::sessions::CODE_TTL;
use crate::control::tokens::{Role, TokenError};
use crate::control::Daemon;

/// Where this machine's name is read from (for links to 0.0.0.0 / ::).
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";
/// Names tried before giving up on a free `dashboard-*` name.
const NAME_ATTEMPTS: usize = 4;
/// How long a link's token works unless the request says otherwise.
pub const DEFAULT_EXPIRES: &str = "7d";

fn wire_role(r: Role) -> TokenRole {
    match r {
        Role::ReadOnly => TokenRole::ReadOnly,
        Role::Admin => TokenRole::Admin,
    }
}

/// `GET /v1/whoami`.
pub async fn whoami(
    caller: Option<Extension<Caller>>,
    via: Option<Extension<Via>>,
) -> Json<Whoami> {
    let Some(Extension(Caller(t))) = caller else {
        return Json(Whoami {
            via: "unix_socket".into(),
            role: TokenRole::Admin,
            token_name: None,
            token_id: None,
            expires_unix_s: None,
        });
    };
    let via = match via {
        Some(Extension(Via::Cookie)) => "cookie",
        _ => "bearer",
    };
    Json(Whoami {
        via: via.into(),
        role: wire_role(t.role),
        token_name: Some(t.name),
        token_id: Some(t.id),
        expires_unix_s: t.expires_unix_s,
    })
}

/// `POST /v1/dashboard/links`.
pub async fn create_link(
    State(d): State<Arc<Daemon>>,
    caller: Option<Extension<Caller>>,
    body: Result<Json<CreateDashboardLink>, JsonRejection>,
) -> Result<(StatusCode, Json<DashboardLink>), ApiError> {
    crate::api::server::auth::unix_socket_only(
        caller.as_ref(),
        "dashboard links carry new tokens, so they are made",
        "ramd dashboard",
    )?;
    let Json(req) = body?;
    let Some(endpoint) = d.http else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "dashboard_off",
            "this daemon serves no dashboard: start it with --http ADDR (or http = \"ADDR\" in the config's [daemon] table), e.g. --http 127.0.0.1:8080 --tls off on this machine only; see docs/dashboard.md",
        ));
    };
    let host = match req.host {
        Some(h) => Some(check_host(&h)?),
        None if endpoint.addr.ip().is_unspecified() => Some(machine_name()),
        None => None,
    };
    let base_url = endpoint.base_url(host.as_deref());
    let role = if req.admin {
        Role::Admin
    } else {
        Role::ReadOnly
    };
    let lifetime =
        super::super::tokens::parse_expires(req.expires.as_deref().unwrap_or(DEFAULT_EXPIRES))?;
    let expires_unix_s = lifetime.map(|l| now_unix_s().saturating_add(l.as_secs()));
    let tokens = d.tokens.clone();
    let new = blocking(move || {
        for _ in 0..NAME_ATTEMPTS {
            match tokens.create_expiring(role, Some(&random_name()?), expires_unix_s) {
                Err(TokenError::Taken(_)) => continue,
                made => return Ok(made?),
            }
        }
        Err(ApiError::internal(
            "no free dashboard-* token name after several tries",
        ))
    })
    .await?;
    let t = new.token;
    let code = d
        .sessions
        .new_code(&t.id)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    tracing::info!(token = %t.name, id = %t.id, role = wire_role(t.role).name(), "dashboard link made");
    let link = DashboardLink {
        url: format!("{base_url}/signin#{code}"),
        sign_in_expires_unix_s: now_unix_s() + CODE_TTL.as_secs(),
        base_url: format!("{base_url}/"),
        token_name: t.name,
        role: wire_role(t.role),
        expires_unix_s: t.expires_unix_s,
    };
    Ok((StatusCode::CREATED, Json(link)))
}

/// `dashboard-` and 8 random hex digits.
fn random_name() -> Result<String, ApiError> {
    let mut bytes = [0u8; 4];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| ApiError::internal("the system's random number generator failed"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("dashboard-{hex}"))
}

/// A host name or IP address for a URL: letters, digits, `.`, `-`, `:`
/// (IPv6), 1-253 characters.
fn check_host(host: &str) -> Result<String, ApiError> {
    let h = host.trim().trim_start_matches('[').trim_end_matches(']');
    let fine = !h.is_empty()
        && h.len() <= 253
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
    if !fine {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_host",
            format!("'{host}' is not a host name or IP address for a URL (letters, digits, '.', '-', ':')"),
        ));
    }
    Ok(h.to_owned())
}

/// This machine's name (`localhost` when it cannot be read).
fn machine_name() -> String {
    std::fs::read_to_string(HOSTNAME_FILE)
        .ok()
        .and_then(|n| check_host(&n).ok())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::server::tokens::parse_expires;

    #[test]
    fn hosts_for_urls() {
        assert_eq!(check_host("db1.example.com").unwrap(), "db1.example.com");
        assert_eq!(check_host("[::1]").unwrap(), "::1");
        for bad in ["", "a/b", "x y", "evil.com/?", "a@b"] {
            let e = check_host(bad).unwrap_err();
            assert_eq!(e.code, "invalid_host", "{bad}");
        }
        assert!(random_name().unwrap().starts_with("dashboard-"));
        assert!(!machine_name().is_empty());
    }

    #[test]
    fn link_lifetimes() {
        let secs = |t: &str| parse_expires(t).unwrap().map(|d| d.as_secs());
        assert_eq!(secs(DEFAULT_EXPIRES), Some(7 * 86400));
        assert_eq!(secs("12h"), Some(12 * 3600));
        assert_eq!(secs(" Never "), None);
        for bad in ["", "0s", "500ms", "soon", "-1d"] {
            assert_eq!(
                parse_expires(bad).unwrap_err().code,
                "invalid_expires",
                "{bad}"
            );
        }
    }
}
