//! Bearer-token authentication: an axum middleware for every listener
//! that is not the unix socket (`--api-listen`, and `--http`, where the
//! dashboard adds a `?token=` to cookie exchange in front of the same
//! check: `dashboard::gate`).
//!
//! ```text
//! request ──► Authorization: Bearer ramd_<id>_<secret>
//!             (none: the dashboard's session cookie, `session`)
//!               missing                     401 token_required  + WWW-Authenticate: Bearer
//!               unknown, revoked, malformed 401 invalid_token   + WWW-Authenticate: Bearer error="invalid_token"
//!               past its expiry             401 token_expired   + the same challenge
//!               cookie, not GET/HEAD, no
//!                 X-Ramd-Csrf or cross-origin 403 csrf_refused
//!               read-only, not GET/HEAD     403 token_read_only
//!               else ──► the route, with [`Caller`] (the token) and [`Via`] extensions
//! ```
//!
//! Every route is behind it, unknown routes included (a caller without a
//! token learns nothing, not even which routes exist). The token's value
//! is never logged nor echoed: answers and log lines name the token by
//! its name and public id only. The unix socket has no such layer: its
//! mode (0600) is its access control, as before.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::session::{self, CsrfError};
use super::ApiError;
use crate::control::tokens::{Refused, Role, Token, Tokens};

/// The token a request came with, for handlers that treat token callers
/// differently from the unix socket's (token management refuses them).
#[derive(Debug, Clone)]
pub struct Caller(pub Token);

/// How the token came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// An `Authorization: Bearer` header.
    Bearer,
    /// The dashboard's session cookie.
    Cookie,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token that is not (or no longer) one of the daemon's.
    Invalid,
    /// One of the daemon's tokens, past its expiry.
    Expired { name: String },
    /// A read-only token on a route that changes something.
    ReadOnly { name: String, method: Method },
    /// The session cookie on a request that changes something, without
    /// the CSRF header or from another origin.
    Csrf(CsrfError),
}

/// The token that authorizes `method` with these headers.
pub fn authorize(
    tokens: &Tokens,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Token, AuthError> {
    authorize_via(tokens, method, headers).map(|(token, _)| token)
}

/// [`authorize`], and how the token came.
pub fn authorize_via(
    tokens: &Tokens,
    method: &Method,
    headers: &HeaderMap,
) -> Result<(Token, Via), AuthError> {
    let reads_only = matches!(*method, Method::GET | Method::HEAD);
    let (token, via) = match bearer(headers) {
        Ok(presented) => (tokens.verify(presented).map_err(refused)?, Via::Bearer),
        Err(AuthError::Missing) => {
            let token = from_cookie(tokens, headers)?;
            if !reads_only {
                session::check_csrf(headers).map_err(AuthError::Csrf)?;
            }
            (token, Via::Cookie)
        }
        Err(e) => return Err(e),
    };
    if token.role == Role::ReadOnly && !reads_only {
        return Err(AuthError::ReadOnly {
            name: token.name,
            method: method.clone(),
        });
    }
    Ok((token, via))
}

/// The token of the first session cookie that verifies (`session`); if
/// none does, expired rather than unknown when one of them expired.
fn from_cookie(tokens: &Tokens, headers: &HeaderMap) -> Result<Token, AuthError> {
    let presented = session::session_tokens(headers);
    if presented.is_empty() {
        return Err(AuthError::Missing);
    }
    let mut why = AuthError::Invalid;
    for t in presented {
        match tokens.verify(t) {
            Ok(token) => return Ok(token),
            Err(Refused::Expired(e)) => why = AuthError::Expired { name: e.name },
            Err(Refused::Unknown) => {}
        }
    }
    Err(why)
}

/// The refusal of a token `Tokens::verify` did not accept.
pub fn refused(r: Refused) -> AuthError {
    match r {
        Refused::Unknown => AuthError::Invalid,
        Refused::Expired(t) => AuthError::Expired { name: t.name },
    }
}

/// The token of an `Authorization: Bearer TOKEN` header (scheme in any
/// case, as RFC 7235 says).
fn bearer(headers: &HeaderMap) -> Result<&str, AuthError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(AuthError::Missing);
    };
    let text = value.to_str().map_err(|_| AuthError::Invalid)?;
    let (scheme, token) = text.trim().split_once(' ').ok_or(AuthError::Invalid)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Missing);
    }
    Ok(token.trim())
}

/// The middleware: `axum::middleware::from_fn_with_state(tokens, require_token)`.
pub async fn require_token(
    State(tokens): State<Arc<Tokens>>,
    mut req: Request,
    next: Next,
) -> Response {
    match authorize_via(&tokens, req.method(), req.headers()) {
        Ok((token, via)) => {
            req.extensions_mut().insert(Caller(token));
            req.extensions_mut().insert(via);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        let (status, code, message, challenge) = match self {
            AuthError::Missing => (
                StatusCode::UNAUTHORIZED,
                "token_required",
                "this API needs a bearer token (Authorization: Bearer ramd_...), or the dashboard's session cookie (open the URL `ramd dashboard` prints); make a token on the daemon's host with `ramd token create --read-only` or `--admin` (docs/api.md, \"Remote access\")".to_owned(),
                r#"Bearer realm="ramd""#,
            ),
            AuthError::Invalid => (
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                "the bearer token is unknown or revoked (see `ramd token list` on the daemon's host)".to_owned(),
                r#"Bearer realm="ramd", error="invalid_token""#,
            ),
            AuthError::Expired { name } => (
                StatusCode::UNAUTHORIZED,
                "token_expired",
                format!("token '{name}' has expired: for the dashboard, run `ramd dashboard` on the daemon's host again and open the new link; for API clients, `ramd token create`"),
                r#"Bearer realm="ramd", error="invalid_token", error_description="the token has expired""#,
            ),
            AuthError::ReadOnly { name, method } => {
                let message = format!("token '{name}' is read-only: {method} needs an admin token (`ramd token create --admin`; in the dashboard, a link from `ramd dashboard --admin`)");
                return ApiError::new(StatusCode::FORBIDDEN, "token_read_only", message)
                    .into_response();
            }
            AuthError::Csrf(e) => {
                return ApiError::new(StatusCode::FORBIDDEN, "csrf_refused", e.to_string())
                    .into_response();
            }
        };
        let mut res = ApiError::new(status, code, message).into_response();
        res.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn roles_decide_by_method() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::load(dir.path()).unwrap();
        let ro = tokens.create(Role::ReadOnly, Some("ro")).unwrap().secret;
        let admin = tokens.create(Role::Admin, Some("admin")).unwrap().secret;
        let check = |t: &str, m: Method| authorize(&tokens, &m, &headers(&format!("bearer {t}")));
        assert!(check(&ro, Method::GET).is_ok());
        assert!(check(&ro, Method::HEAD).is_ok());
        for m in [Method::POST, Method::PATCH, Method::DELETE] {
            assert!(matches!(
                check(&ro, m.clone()),
                Err(AuthError::ReadOnly { .. })
            ));
            assert_eq!(check(&admin, m).unwrap().name, "admin");
        }
        assert_eq!(
            check("ramd_000000000000_x", Method::GET),
            Err(AuthError::Invalid)
        );
    }

    #[test]
    fn headers_without_a_bearer_token_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::load(dir.path()).unwrap();
        let get = |h: &HeaderMap| authorize(&tokens, &Method::GET, h);
        assert_eq!(get(&HeaderMap::new()), Err(AuthError::Missing));
        assert_eq!(get(&headers("Basic dXNlcjpwdw==")), Err(AuthError::Missing));
        assert_eq!(get(&headers("Bearer")), Err(AuthError::Invalid));
        assert_eq!(get(&headers("Bearer nope")), Err(AuthError::Invalid));
    }

    #[test]
    fn the_session_cookie_is_a_token_with_csrf_rules() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::load(dir.path()).unwrap();
        let admin = tokens.create(Role::Admin, Some("admin")).unwrap().secret;
        let mut h = HeaderMap::new();
        let cookie = format!("x=1; ramd_token_9=stale; ramd_token_8443={admin}");
        h.insert(header::COOKIE, HeaderValue::from_str(&cookie).unwrap());
        let (t, via) = authorize_via(&tokens, &Method::GET, &h).unwrap();
        assert_eq!((t.name.as_str(), via), ("admin", Via::Cookie));
        assert!(matches!(
            authorize(&tokens, &Method::POST, &h),
            Err(AuthError::Csrf(CsrfError::MissingHeader))
        ));
        h.insert(session::CSRF_HEADER, HeaderValue::from_static("1"));
        assert!(authorize(&tokens, &Method::POST, &h).is_ok());
        // A bearer header needs no CSRF header, and wins over the cookie.
        let mut b = headers(&format!("Bearer {admin}"));
        b.insert(
            header::COOKIE,
            HeaderValue::from_static("ramd_token_1=nope"),
        );
        assert_eq!(
            authorize_via(&tokens, &Method::DELETE, &b).unwrap().1,
            Via::Bearer
        );
        let mut bad = HeaderMap::new();
        bad.insert(
            header::COOKIE,
            HeaderValue::from_static("ramd_token_1=nope"),
        );
        assert_eq!(
            authorize(&tokens, &Method::GET, &bad),
            Err(AuthError::Invalid)
        );
    }

    #[test]
    fn expired_tokens_are_refused_as_expired() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::load(dir.path()).unwrap();
        let past = crate::control::ledger::now_unix_s() - 1;
        let old = tokens
            .create_expiring(Role::Admin, Some("old"), Some(past))
            .unwrap()
            .secret;
        let expired = Err(AuthError::Expired { name: "old".into() });
        let get = |h: &HeaderMap| authorize(&tokens, &Method::GET, h);
        assert_eq!(get(&headers(&format!("Bearer {old}"))), expired);
        let mut c = HeaderMap::new();
        let cookie = format!("ramd_token_1=nope; ramd_token_2={old}");
        c.insert(header::COOKIE, HeaderValue::from_str(&cookie).unwrap());
        assert_eq!(get(&c), expired);
        let res = AuthError::Expired { name: "old".into() }.into_response();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert!(res.headers().contains_key(header::WWW_AUTHENTICATE));
    }
}
