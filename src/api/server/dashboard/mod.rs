//! The web dashboard (`ramd daemon --http ADDR`, docs/dashboard.md): one
//! page, its scripts and styles built into the binary (`assets`), served
//! beside the whole REST API on the same TCP listener (`api::server::tcp`
//! with TLS, the same bearer tokens).
//!
//! ```text
//! GET /signin           ──► the sign-in page (no credential needed); its script takes the
//!                           code from the URL's #fragment, drops it from the address bar,
//!                           and POSTs it:
//! POST /session {code}  ──► CSRF rule, failure budget ──► code valid ──► 204 + Set-Cookie (session)
//!                                                         else       ──► 401 code_invalid / code_expired
//! GET /                 ──► gate: cookie or bearer ──► index.html  (else the 401 page)
//! GET /assets/NAME      ──► gate ──► assets (ETag, revalidated); signin.js needs none
//! /v1/..., /metrics     ──► gate (= auth: bearer or cookie, CSRF, roles) ──► the API's handlers
//! POST /logout          ──► gate: CSRF rule only ──► the session ended, the cookie cleared
//! ```
//!
//! Invariants:
//! - Every path but the sign-in page, its script, the code exchange and
//!   the sign-out goes through `auth::admit`, as on `--api-listen`: a
//!   read-only session is refused (403) whatever its page shows; a
//!   cookie-authorized change needs the CSRF header (`session`).
//! - A sign-in code is a one-time, short-lived secret
//!   (`control::sessions`), carried in the URL's fragment: the server,
//!   its logs and any proxy never see it in a request line, the page
//!   removes it from the address bar before it uses it, and once used
//!   (or 5 minutes old) it is worth nothing in history or `ps` output.
//! - The exchange obeys the CSRF rule: another site cannot make the
//!   browser sign in to a session of the attacker's choosing (login
//!   CSRF), since it cannot add the header without a CORS preflight.
//! - The page runs no inline script and loads nothing from elsewhere: the
//!   Content-Security-Policy allows this origin only (and `blob:` images,
//!   the benchmark's SVG plot shown as an image, where it can run nothing).
//!
//! The page's own code (assets/app.js, assets/charts.js) is plain
//! JavaScript with no framework and no build step; the charts are a small
//! canvas line chart written for it (assets/charts.js) rather than a
//! vendored library: six charts of a few series each need little, and a
//! library would bring a license and an update duty for no gain.

pub mod api;
pub mod assets;
pub mod pages;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::JsonRejection;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};

use super::auth::{self, AuthError, Caller, Gatekeeper};
use super::conns::ConnState;
use super::session;
use super::ApiError;
use crate::api::wire::dashboard::SignIn;
use crate::control::api_listen::HttpEndpoint;
use crate::control::ledger::now_unix_s;
use crate::control::sessions::{CodeRefused, RedeemError};
use crate::control::Daemon;

/// The Content-Security-Policy of every answer: this origin only.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Paths served without a credential (the sign-in page and its script).
const OPEN_PATHS: [&str; 2] = ["/signin", "/assets/signin.js"];

/// What the gate needs: the gatekeeper, and the cookie's name and flags.
#[derive(Clone)]
struct Gate {
    keeper: Gatekeeper,
    endpoint: HttpEndpoint,
}

/// The router of the `--http` listener bound at `endpoint`: the API's
/// routes and the dashboard's, every one behind the gate.
pub fn router(daemon: Arc<Daemon>, endpoint: HttpEndpoint, keeper: Gatekeeper) -> Router {
    let gate = Gate { keeper, endpoint };
    let routes = super::api_routes()
        .route("/", get(index))
        .route("/signin", get(signin_page))
        .route("/session", post(start_session))
        .route("/logout", post(logout))
        .route("/assets/{name}", get(assets::get));
    super::with_fallbacks(routes)
        .layer(Extension(ConnectInfo(super::host_paths::Peer {
            uid: None,
        })))
        .layer(Extension(gate.clone()))
        .layer(axum::middleware::from_fn_with_state(gate, gate_request))
        .layer(axum::middleware::from_fn(super::log_request))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(daemon)
}

/// The sign-in routes, then `auth` for everything else (see the module
/// docs); the page itself gets an HTML refusal, the rest JSON.
async fn gate_request(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let page = path == "/";
    if OPEN_PATHS.contains(&path) && matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    if matches!(path, "/session" | "/logout") && req.method() == Method::POST {
        // Signing in needs no session, and signing out works for any
        // (a read-only one, one whose token is gone); both only from the
        // page itself (the CSRF rule).
        return match session::check_csrf(req.headers()) {
            Ok(()) => next.run(req).await,
            Err(e) => AuthError::Csrf(e).into_response(),
        };
    }
    let conn = req.extensions().get::<Arc<ConnState>>().cloned();
    match auth::admit(&gate.keeper, req.method(), req.headers(), conn.as_deref()) {
        Ok((token, via)) => {
            req.extensions_mut().insert(Caller(token));
            req.extensions_mut().insert(via);
            next.run(req).await
        }
        Err(e) if page => pages::refused(&e),
        Err(e) => e.into_response(),
    }
}

/// `GET /signin`: the page whose script exchanges the link's code.
async fn signin_page() -> Response {
    let mut res = axum::response::Html(assets::SIGNIN_HTML).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// `POST /session {"code": ...}`: a session for a valid sign-in code,
/// as a cookie (204); 401 for a code used already, unknown or expired.
async fn start_session(
    Extension(gate): Extension<Gate>,
    conn: Option<Extension<Arc<ConnState>>>,
    body: Result<Json<SignIn>, JsonRejection>,
) -> Response {
    let addr = conn.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.addr);
    let keeper = &gate.keeper;
    let now = Instant::now();
    if let Err(retry_after_s) = keeper.throttle.check(addr, now) {
        return AuthError::Throttled { retry_after_s }.into_response();
    }
    let Json(SignIn { code }) = match body {
        Ok(b) => b,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let new = match keeper.sessions.redeem(code.trim(), addr) {
        Ok(new) => new,
        Err(RedeemError::Code(why)) => {
            auth::note_failure(&keeper.throttle, addr, now, &AuthError::Invalid);
            let code = match why {
                CodeRefused::Unknown => "code_invalid",
                CodeRefused::Expired => "code_expired",
            };
            return ApiError::new(StatusCode::UNAUTHORIZED, code, why.to_string()).into_response();
        }
        Err(RedeemError::Random(e)) => return ApiError::internal(e.to_string()).into_response(),
    };
    let Ok(token) = keeper.tokens.by_id(&new.token_id) else {
        keeper.sessions.end(&new.id);
        let why =
            "the token of this sign-in link was revoked or has expired: run `ramd dashboard` again";
        return ApiError::new(StatusCode::UNAUTHORIZED, "code_invalid", why).into_response();
    };
    tracing::info!(token = %token.name, id = %token.id, client = %addr, "dashboard session started");
    let max_age_s = session::max_age_s(token.expires_unix_s, now_unix_s());
    let (port, tls) = (gate.endpoint.addr.port(), gate.endpoint.tls);
    let cookie = session::set_cookie(port, tls, &new.id, max_age_s);
    let mut res = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

/// `GET /`: the page (the gate has let the caller in).
async fn index() -> Response {
    let mut res = axum::response::Html(assets::INDEX_HTML).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// `POST /logout`: ends this browser's session and clears its cookie
/// (the token stays valid until `ramd token revoke`).
async fn logout(Extension(gate): Extension<Gate>, headers: axum::http::HeaderMap) -> Response {
    for id in session::session_ids(&headers) {
        gate.keeper.sessions.end(id);
    }
    let cookie = session::clear_cookie(gate.endpoint.addr.port(), gate.endpoint.tls);
    let mut res = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

/// The headers every answer of this listener carries; `no-store` unless
/// the handler chose its own caching.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}
