//! Authentication of every request on a listener that is not the unix
//! socket (`--api-listen`, and `--http`, where the dashboard's gate adds
//! its sign-in routes in front of the same check: `dashboard::gate`).
//!
//! ```text
//! request ──► ADDR over its failure budget (`throttle`)  429 too_many_failures + Retry-After
//!         ──► Authorization: Bearer ramd_<id>_<secret>
//!             (none: the dashboard's session cookie, `session`, `control::sessions`)
//!               missing                     401 token_required  + WWW-Authenticate: Bearer
//!               unknown, revoked, malformed 401 invalid_token   + WWW-Authenticate: Bearer error="invalid_token"
//!               past its expiry             401 token_expired   + the same challenge
//!               a session that is no more   401 session_ended
//!                 (signed out, from another address, its token revoked, the daemon restarted)
//!               cookie, not GET/HEAD, no
//!                 X-Ramd-Csrf or cross-origin 403 csrf_refused
//!               read-only, not GET/HEAD     403 token_read_only
//!               else ──► the route, with [`Caller`] (the token) and [`Via`] extensions;
//!                        the connection counts as authenticated (`conns`)
//! ```
//!
//! Every route is behind it, unknown routes included (a caller without a
//! token learns nothing, not even which routes exist). A refused
//! credential is logged with the client's address (at most a line per
//! address every few seconds: `throttle`), never with its value: answers
//! and log lines name a token by its name and public id only. The unix
//! socket has no such layer: its mode (0600) is its access control.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::conns::ConnState;
use super::session::{self, CsrfError};
use super::throttle::{LogIt, Throttle};
use super::ApiError;
use crate::control::sessions::Sessions;
use crate::control::tokens::{Refused, Role, Token, Tokens};

/// The token a request came with, for handlers that treat token callers
/// differently from the unix socket's (token management refuses them).
#[derive(Debug, Clone)]
pub struct Caller(pub Token);

/// Refuses a token caller (403 `unix_socket_only`) for what only the
/// daemon's unix socket may ask: `what` says what and why ("tokens are
/// made and revoked"), `command` what to run on the daemon's host instead.
pub fn unix_socket_only(
    caller: Option<&axum::Extension<Caller>>,
    what: &str,
    command: &str,
) -> Result<(), ApiError> {
    match caller {
        None => Ok(()),
        Some(axum::Extension(Caller(t))) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "unix_socket_only",
            format!("{what} only through the daemon's unix socket (run `{command}` on its host as its user), not with a token (this is '{}')", t.name),
        )),
    }
}

/// How the token came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// An `Authorization: Bearer` header.
    Bearer,
    /// The dashboard's session cookie.
    Cookie,
}

/// What authentication needs: the tokens, the dashboard's sessions and
/// the failure budgets of client addresses.
#[derive(Debug, Clone)]
pub struct Gatekeeper {
    pub tokens: Arc<Tokens>,
    pub sessions: Arc<Sessions>,
    pub throttle: Arc<Throttle>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer` header and no session cookie.
    Missing,
    /// A token that is not (or no longer) one of the daemon's.
    Invalid,
    /// One of the daemon's tokens, past its expiry.
    Expired { name: String },
    /// Session cookies, none of them a live session from this address.
    SessionEnded,
    /// A read-only token on a route that changes something.
    ReadOnly { name: String, method: Method },
    /// The session cookie on a request that changes something, without
    /// the CSRF header or from another origin.
    Csrf(CsrfError),
    /// The client's address made too many failed attempts.
    Throttled { retry_after_s: u64 },
}

impl AuthError {
    /// True for a credential that was checked and refused (what the
    /// failure budget counts).
    pub fn is_failed_credential(&self) -> bool {
        matches!(
            self,
            AuthError::Invalid | AuthError::Expired { .. } | AuthError::SessionEnded
        )
    }

    /// True when a valid token was presented (the connection counts as
    /// authenticated even if this request is refused).
    fn token_was_valid(&self) -> bool {
        matches!(self, AuthError::ReadOnly { .. } | AuthError::Csrf(_))
    }
}

/// The token that authorizes `method` with these headers, from `addr`.
pub fn authorize(
    gate: &Gatekeeper,
    method: &Method,
    headers: &HeaderMap,
    addr: IpAddr,
) -> Result<Token, AuthError> {
    authorize_via(gate, method, headers, addr).map(|(token, _)| token)
}

/// [`authorize`], and how the token came.
pub fn authorize_via(
    gate: &Gatekeeper,
    method: &Method,
    headers: &HeaderMap,
    addr: IpAddr,
) -> Result<(Token, Via), AuthError> {
    let reads_only = matches!(*method, Method::GET | Method::HEAD);
    let (token, via) = match bearer(headers) {
        Ok(presented) => (gate.tokens.verify(presented).map_err(refused)?, Via::Bearer),
        Err(AuthError::Missing) => {
            let token = from_cookie(gate, headers, addr)?;
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

/// [`authorize_via`] behind the failure budget of the connection's
/// address (module docs); marks the connection authenticated, logs a
/// refused credential with the address.
pub fn admit(
    gate: &Gatekeeper,
    method: &Method,
    headers: &HeaderMap,
    conn: Option<&ConnState>,
) -> Result<(Token, Via), AuthError> {
    let addr = conn.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.addr);
    let now = Instant::now();
    if presents_credential(headers) {
        gate.throttle
            .check(addr, now)
            .map_err(|retry_after_s| AuthError::Throttled { retry_after_s })?;
    }
    let result = authorize_via(gate, method, headers, addr);
    let valid = match &result {
        Ok(_) => true,
        Err(e) if e.is_failed_credential() => {
            note_failure(&gate.throttle, addr, now, e);
            false
        }
        Err(e) => e.token_was_valid(),
    };
    if let (true, Some(c)) = (valid, conn) {
        c.mark_authenticated();
    }
    result
}

/// Counts a refused credential from `addr`, and logs it unless a line
/// about that address was written a moment ago.
pub fn note_failure(throttle: &Throttle, addr: IpAddr, now: Instant, e: &AuthError) {
    let what = match e {
        AuthError::Expired { .. } => "an expired token",
        AuthError::SessionEnded => "a dashboard session that has ended",
        _ => "an unknown or revoked token",
    };
    if let LogIt::Yes { suppressed } = throttle.failed(addr, now) {
        tracing::warn!(client = %addr, more_since_last_line = suppressed, "refused {what} from {addr}");
    }
}

/// True when the request carries a bearer header or a session cookie.
fn presents_credential(headers: &HeaderMap) -> bool {
    headers.contains_key(header::AUTHORIZATION) || !session::session_ids(headers).is_empty()
}

/// The token of the first session cookie that is a live session of this
/// address (`control::sessions`); expired when that session's token
/// expired.
fn from_cookie(gate: &Gatekeeper, headers: &HeaderMap, addr: IpAddr) -> Result<Token, AuthError> {
    let presented = session::session_ids(headers);
    if presented.is_empty() {
        return Err(AuthError::Missing);
    }
    let mut why = AuthError::SessionEnded;
    for id in presented {
        let Some(token_id) = gate.sessions.lookup(id, addr) else {
            continue;
        };
        match gate.tokens.by_id(&token_id) {
            Ok(token) => return Ok(token),
            Err(Refused::Expired(e)) => why = AuthError::Expired { name: e.name },
            Err(Refused::Unknown) => gate.sessions.end_token(&token_id),
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

/// The middleware: `axum::middleware::from_fn_with_state(gatekeeper, require_token)`.
pub async fn require_token(
    State(gate): State<Gatekeeper>,
    mut req: Request,
    next: Next,
) -> Response {
    let conn = req.extensions().get::<Arc<ConnState>>().cloned();
    match admit(&gate, req.method(), req.headers(), conn.as_deref()) {
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
            AuthError::SessionEnded => (
                StatusCode::UNAUTHORIZED,
                "session_ended",
                "this dashboard session has ended (signed out, its token was revoked, the daemon restarted, or the browser's address changed): run `ramd dashboard` on the daemon's host and open the new link".to_owned(),
                r#"Bearer realm="ramd", error="invalid_token""#,
            ),
            AuthError::Throttled { retry_after_s } => {
                let message = format!("too many failed sign-ins from this address: try again in {retry_after_s} s (each address gets a few failures at once, then one a second)");
                let mut res =
                    ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_failures", message)
                        .into_response();
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
                return res;
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

    const HOME: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn gate() -> (tempfile::TempDir, Gatekeeper) {
        let dir = tempfile::tempdir().unwrap();
        let g = Gatekeeper {
            tokens: Arc::new(Tokens::load(dir.path()).unwrap()),
            sessions: Arc::default(),
            throttle: Arc::default(),
        };
        (dir, g)
    }

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    fn cookie(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn roles_decide_by_method() {
        let (_dir, g) = gate();
        let ro = g.tokens.create(Role::ReadOnly, Some("ro")).unwrap().secret;
        let admin = g.tokens.create(Role::Admin, Some("admin")).unwrap().secret;
        let check = |t: &str, m: Method| authorize(&g, &m, &headers(&format!("bearer {t}")), HOME);
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
        let (_dir, g) = gate();
        let get = |h: &HeaderMap| authorize(&g, &Method::GET, h, HOME);
        assert_eq!(get(&HeaderMap::new()), Err(AuthError::Missing));
        assert_eq!(get(&headers("Basic dXNlcjpwdw==")), Err(AuthError::Missing));
        assert_eq!(get(&headers("Bearer")), Err(AuthError::Invalid));
        assert_eq!(get(&headers("Bearer nope")), Err(AuthError::Invalid));
    }

    #[test]
    fn a_session_cookie_is_its_tokens_rights_with_csrf_rules() {
        let (_dir, g) = gate();
        let admin = g.tokens.create(Role::Admin, Some("admin")).unwrap();
        let code = g.sessions.new_code(&admin.token.id).unwrap();
        let sid = g.sessions.redeem(&code, HOME).unwrap().id;
        let mut h = cookie(&format!(
            "x=1; ramd_session_9=stale; __Host-ramd_8443={sid}"
        ));
        let (t, via) = authorize_via(&g, &Method::GET, &h, HOME).unwrap();
        assert_eq!((t.name.as_str(), via), ("admin", Via::Cookie));
        assert!(matches!(
            authorize(&g, &Method::POST, &h, HOME),
            Err(AuthError::Csrf(CsrfError::MissingHeader))
        ));
        h.insert(session::CSRF_HEADER, HeaderValue::from_static("1"));
        assert!(authorize(&g, &Method::POST, &h, HOME).is_ok());
        // Not from another address, and the token itself is no session.
        let other = IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3));
        assert_eq!(
            authorize(&g, &Method::GET, &h, other),
            Err(AuthError::SessionEnded)
        );
        let as_cookie = cookie(&format!("__Host-ramd_1={}", admin.secret));
        assert_eq!(
            authorize(&g, &Method::GET, &as_cookie, HOME),
            Err(AuthError::SessionEnded)
        );
        // Nor is the session id a bearer token.
        assert_eq!(
            authorize(&g, &Method::GET, &headers(&format!("Bearer {sid}")), HOME),
            Err(AuthError::Invalid)
        );
        // A bearer header needs no CSRF header, and wins over the cookie.
        let mut b = headers(&format!("Bearer {}", admin.secret));
        b.insert(
            header::COOKIE,
            HeaderValue::from_static("ramd_session_1=nope"),
        );
        assert_eq!(
            authorize_via(&g, &Method::DELETE, &b, HOME).unwrap().1,
            Via::Bearer
        );
        // Revoking the token ends the session at once.
        g.tokens.revoke("admin").unwrap();
        assert_eq!(
            authorize(&g, &Method::GET, &h, HOME),
            Err(AuthError::SessionEnded)
        );
    }

    #[test]
    fn expired_tokens_are_refused_as_expired() {
        let (_dir, g) = gate();
        let past = crate::control::ledger::now_unix_s() - 1;
        let old = g
            .tokens
            .create_expiring(Role::Admin, Some("old"), Some(past))
            .unwrap();
        let expired = Err(AuthError::Expired { name: "old".into() });
        let get = |h: &HeaderMap| authorize(&g, &Method::GET, h, HOME);
        assert_eq!(get(&headers(&format!("Bearer {}", old.secret))), expired);
        let sid = g
            .sessions
            .redeem(&g.sessions.new_code(&old.token.id).unwrap(), HOME)
            .unwrap()
            .id;
        assert_eq!(
            get(&cookie(&format!(
                "ramd_session_1=nope; ramd_session_2={sid}"
            ))),
            expired
        );
        let res = AuthError::Expired { name: "old".into() }.into_response();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert!(res.headers().contains_key(header::WWW_AUTHENTICATE));
    }

    #[test]
    fn failures_from_an_address_are_throttled() {
        let (_dir, g) = gate();
        let good = g.tokens.create(Role::ReadOnly, Some("ro")).unwrap().secret;
        let conn = ConnState::for_tests(HOME);
        let bad = headers("Bearer ramd_000000000000_nope");
        let mut refused = 0;
        for _ in 0..200 {
            match admit(&g, &Method::GET, &bad, Some(&conn)) {
                Err(AuthError::Invalid) => refused += 1,
                Err(AuthError::Throttled { retry_after_s }) => assert!(retry_after_s >= 1),
                other => panic!("{other:?}"),
            }
        }
        assert!(refused <= 12, "{refused} checked in a burst");
        // While throttled, even a good token is not checked...
        let ok = headers(&format!("Bearer {good}"));
        assert!(matches!(
            admit(&g, &Method::GET, &ok, Some(&conn)),
            Err(AuthError::Throttled { .. })
        ));
        // ...from that address only; and requests without a credential
        // are not counted.
        let elsewhere = ConnState::for_tests(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
        assert!(admit(&g, &Method::GET, &ok, Some(&elsewhere)).is_ok());
        assert!(elsewhere.is_authenticated());
        assert_eq!(
            admit(&g, &Method::GET, &HeaderMap::new(), Some(&conn)),
            Err(AuthError::Missing)
        );
        let res = AuthError::Throttled { retry_after_s: 3 }.into_response();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[header::RETRY_AFTER], "3");
    }
}
