//! Bearer-token authentication: an axum middleware for every listener
//! that is not the unix socket (the API over TCP now, issue 20's
//! dashboard next, which adds a `?token=` to cookie exchange in front of
//! the same check).
//!
//! ```text
//! request ──► Authorization: Bearer ramd_<id>_<secret>
//!               missing                     401 token_required  + WWW-Authenticate: Bearer
//!               unknown, revoked, malformed 401 invalid_token   + WWW-Authenticate: Bearer error="invalid_token"
//!               read-only, not GET/HEAD     403 token_read_only
//!               else ──► the route, with a [`Caller`] extension naming the token
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

use super::ApiError;
use crate::control::tokens::{Role, Token, Tokens};

/// The token a request came with, for handlers that treat token callers
/// differently from the unix socket's (token management refuses them).
#[derive(Debug, Clone)]
pub struct Caller(pub Token);

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token that is not (or no longer) one of the daemon's.
    Invalid,
    /// A read-only token on a route that changes something.
    ReadOnly { name: String, method: Method },
}

/// The token that authorizes `method` with these headers.
pub fn authorize(
    tokens: &Tokens,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Token, AuthError> {
    let presented = bearer(headers)?;
    let token = tokens.verify(presented).ok_or(AuthError::Invalid)?;
    let reads_only = matches!(*method, Method::GET | Method::HEAD);
    if token.role == Role::ReadOnly && !reads_only {
        return Err(AuthError::ReadOnly {
            name: token.name,
            method: method.clone(),
        });
    }
    Ok(token)
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
    match authorize(&tokens, req.method(), req.headers()) {
        Ok(token) => {
            req.extensions_mut().insert(Caller(token));
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
                "this API needs a bearer token (Authorization: Bearer ramd_...); make one on the daemon's host with `ramd token create --read-only` or `--admin` (docs/api.md, \"Remote access\")".to_owned(),
                r#"Bearer realm="ramd""#,
            ),
            AuthError::Invalid => (
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                "the bearer token is unknown or revoked (see `ramd token list` on the daemon's host)".to_owned(),
                r#"Bearer realm="ramd", error="invalid_token""#,
            ),
            AuthError::ReadOnly { name, method } => {
                let message = format!("token '{name}' is read-only: {method} needs an admin token (`ramd token create --admin`)");
                return ApiError::new(StatusCode::FORBIDDEN, "token_read_only", message)
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
}
