//! `/v1/tokens`: the bearer tokens of the API over TCP.
//!
//! Making and revoking tokens is for the unix socket only (its owner:
//! root or the daemon's user). A token caller, even an admin, gets 403
//! `unix_socket_only`: a stolen token cannot mint others that outlive its
//! revocation. Listing (names, ids, roles, dates; never secrets) is a GET
//! like any other.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::{Extension, Json};

use super::auth::Caller;
use super::{blocking, ApiError};
use crate::api::wire::tokens::{
    CreateToken, CreatedToken, TokenInfo, TokenList, TokenRevoked, TokenRole,
};
use crate::control::ledger::now_unix_s;
use crate::control::tokens::{Role, Token, TokenError};
use crate::control::Daemon;

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        let (status, code) = match &e {
            TokenError::BadName(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_name"),
            TokenError::Taken(_) => (StatusCode::CONFLICT, "token_exists"),
            TokenError::NotFound(_) => (StatusCode::NOT_FOUND, "token_not_found"),
            TokenError::TooMany => (StatusCode::CONFLICT, "too_many_tokens"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "tokens_error"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

fn wire_role(r: Role) -> TokenRole {
    match r {
        Role::ReadOnly => TokenRole::ReadOnly,
        Role::Admin => TokenRole::Admin,
    }
}

fn info(t: Token) -> TokenInfo {
    TokenInfo {
        name: t.name,
        id: t.id,
        role: wire_role(t.role),
        created_unix_s: t.created_unix_s,
        expires_unix_s: t.expires_unix_s,
    }
}

/// Refuses token callers (see the module docs).
fn unix_socket_only(caller: Option<Extension<Caller>>) -> Result<(), ApiError> {
    super::auth::unix_socket_only(
        caller.as_ref(),
        "tokens are made and revoked",
        "ramd token ...",
    )
}

pub async fn list(State(d): State<Arc<Daemon>>) -> Json<TokenList> {
    Json(TokenList {
        tokens: d.tokens.list().into_iter().map(info).collect(),
    })
}

pub async fn create(
    State(d): State<Arc<Daemon>>,
    caller: Option<Extension<Caller>>,
    body: Result<Json<CreateToken>, JsonRejection>,
) -> Result<(StatusCode, Json<CreatedToken>), ApiError> {
    unix_socket_only(caller)?;
    let Json(req) = body?;
    let lifetime = parse_expires(req.expires.as_deref().unwrap_or("never"))?;
    let expires_unix_s = lifetime.map(|l| now_unix_s().saturating_add(l.as_secs()));
    let role = match req.role {
        TokenRole::ReadOnly => Role::ReadOnly,
        TokenRole::Admin => Role::Admin,
    };
    let new = blocking(move || {
        Ok(d.tokens
            .create_expiring(role, req.name.as_deref(), expires_unix_s)?)
    })
    .await?;
    let t = new.token;
    tracing::info!(token = %t.name, id = %t.id, role = wire_role(t.role).name(), "API token created");
    let created = CreatedToken {
        name: t.name,
        id: t.id,
        role: wire_role(t.role),
        created_unix_s: t.created_unix_s,
        expires_unix_s: t.expires_unix_s,
        token: new.secret,
    };
    Ok((StatusCode::CREATED, Json(created)))
}

/// A token's or link's lifetime: `never` (None), or a duration of at
/// least a second (`7d`, `12h`, `90m`).
pub(crate) fn parse_expires(text: &str) -> Result<Option<std::time::Duration>, ApiError> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("never") {
        return Ok(None);
    }
    let bad = |why: String| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_expires",
            format!("expires '{text}': {why}; give a duration such as 7d, 12h or 30m, or never"),
        )
    };
    let d = humantime::parse_duration(text).map_err(|e| bad(e.to_string()))?;
    if d.as_secs() == 0 {
        return Err(bad("a token must work for at least a second".into()));
    }
    Ok(Some(d))
}

pub async fn revoke(
    State(d): State<Arc<Daemon>>,
    caller: Option<Extension<Caller>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<TokenRevoked>, ApiError> {
    unix_socket_only(caller)?;
    let t = blocking(move || Ok(d.tokens.revoke(&name)?)).await?;
    tracing::info!(token = %t.name, id = %t.id, "API token revoked");
    Ok(Json(TokenRevoked { name: t.name }))
}
