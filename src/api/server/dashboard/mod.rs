//! The web dashboard (`ramd daemon --http ADDR`, docs/dashboard.md): one
//! page, its scripts and styles built into the binary (`assets`), served
//! beside the whole REST API on the same TCP listener (`api::server::tcp`
//! with TLS, the same bearer tokens).
//!
//! ```text
//! GET /?token=ramd_...  ──► gate: token valid ──► 303 Location: /  + Set-Cookie (session)
//!                                  invalid    ──► 401 page "run ramd dashboard again"
//! GET /                 ──► gate: cookie or bearer ──► index.html  (else the 401 page)
//! GET /assets/NAME      ──► gate ──► assets (ETag, revalidated)
//! /v1/..., /metrics     ──► gate (= auth: bearer or cookie, CSRF, roles) ──► the API's handlers
//! POST /logout          ──► gate: CSRF rule only (any session, valid or not) ──► the cookie cleared
//! ```
//!
//! Invariants:
//! - Every path but the token exchange and the sign-out (which only
//!   clears the caller's own cookie) goes through `auth::authorize_via`,
//!   as on `--api-listen`: a read-only session is refused (403) whatever
//!   its page shows; a cookie-authorized change needs the CSRF header
//!   (`session`).
//! - A sign-in link is taken only when the browser opened it itself (the
//!   address bar, a bookmark, another program: `Sec-Fetch-Site: none`) or
//!   from this origin; one followed from another site is refused (403), or
//!   that site could sign the browser in to a session of its own choosing
//!   (login CSRF). Clients that send no `Sec-Fetch-Site` (curl, older
//!   browsers) are let through: the header is the only signal there is.
//! - The token leaves the address bar at once: the exchange answers with
//!   a redirect (not a page), so neither history nor a Referer keeps it;
//!   every answer also says `Referrer-Policy: no-referrer`.
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

use std::sync::Arc;

use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::auth::{self, AuthError, Caller};
use super::session;
use crate::control::api_listen::HttpEndpoint;
use crate::control::ledger::now_unix_s;
use crate::control::tokens::{Refused, Tokens};
use crate::control::Daemon;

/// The Content-Security-Policy of every answer: this origin only.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// What the gate needs: the tokens, and the cookie's name and flags.
#[derive(Clone)]
struct Gate {
    tokens: Arc<Tokens>,
    endpoint: HttpEndpoint,
}

/// The router of the `--http` listener bound at `endpoint`: the API's
/// routes and the dashboard's, every one behind the gate.
pub fn router(daemon: Arc<Daemon>, endpoint: HttpEndpoint) -> Router {
    let gate = Gate {
        tokens: daemon.tokens.clone(),
        endpoint,
    };
    let routes = super::api_routes()
        .route("/", get(index))
        .route("/logout", post(logout))
        .route("/assets/{name}", get(assets::get));
    super::with_fallbacks(routes)
        .layer(axum::Extension(ConnectInfo(super::host_paths::Peer {
            uid: None,
        })))
        .layer(axum::Extension(endpoint))
        .layer(axum::middleware::from_fn_with_state(gate, gate_request))
        .layer(axum::middleware::from_fn(super::log_request))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(daemon)
}

/// The token exchange, then `auth` for everything else (see the module
/// docs); the page itself gets an HTML refusal, the rest JSON.
async fn gate_request(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    let page = req.uri().path() == "/";
    if page && req.method() == Method::GET {
        if let Some(token) = link_token(&req) {
            if !opened_here(req.headers()) {
                tracing::warn!("dashboard sign-in link followed from another site: refused");
                return pages::link_from_elsewhere();
            }
            return exchange(&gate, &token);
        }
    }
    if req.uri().path() == "/logout" && req.method() == Method::POST {
        // Signing out only clears this browser's cookie, so any session
        // may: a read-only one (which may not POST elsewhere), and one
        // whose token was revoked or expired (whose stale cookie would
        // stay otherwise). From the page itself only (the CSRF rule).
        return match session::check_csrf(req.headers()) {
            Ok(()) => next.run(req).await,
            Err(e) => AuthError::Csrf(e).into_response(),
        };
    }
    match auth::authorize_via(&gate.tokens, req.method(), req.headers()) {
        Ok((token, via)) => {
            req.extensions_mut().insert(Caller(token));
            req.extensions_mut().insert(via);
            next.run(req).await
        }
        Err(e) if page => pages::refused(&e),
        Err(e) => e.into_response(),
    }
}

/// Whether a sign-in link was opened by the user (`Sec-Fetch-Site: none`),
/// from this origin, or by a client that does not say (see the module
/// docs).
fn opened_here(headers: &axum::http::HeaderMap) -> bool {
    match headers.get("sec-fetch-site").map(|v| v.as_bytes()) {
        None => true,
        Some(site) => site == b"none" || site == b"same-origin",
    }
}

/// The `token` of `/?token=...`, if the link has one.
fn link_token(req: &Request) -> Option<String> {
    let Query(mut q) =
        Query::<std::collections::HashMap<String, String>>::try_from_uri(req.uri()).ok()?;
    q.remove("token")
}

/// `/?token=`: a session cookie and a redirect to `/` for a valid token;
/// the refusal page for another.
fn exchange(gate: &Gate, token: &str) -> Response {
    let t = match gate.tokens.verify(token) {
        Ok(t) => t,
        Err(Refused::Expired(_)) => return pages::link_refused(true),
        Err(Refused::Unknown) => return pages::link_refused(false),
    };
    tracing::info!(token = %t.name, id = %t.id, "dashboard session started");
    let max_age_s = session::max_age_s(t.expires_unix_s, now_unix_s());
    let cookie = session::set_cookie(
        gate.endpoint.addr.port(),
        token,
        gate.endpoint.tls,
        max_age_s,
    );
    let mut res = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
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

/// `POST /logout`: forgets the session cookie in this browser (the token
/// stays valid until `ramd token revoke`).
async fn logout(axum::Extension(endpoint): axum::Extension<HttpEndpoint>) -> Response {
    let cookie = session::clear_cookie(endpoint.addr.port(), endpoint.tls);
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
