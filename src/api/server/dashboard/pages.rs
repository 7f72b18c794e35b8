//! The dashboard's refusal pages: what a browser shows at `/` without a
//! valid session (a sign-in link's own refusals are shown by the sign-in
//! page from the JSON answer of `POST /session`). Plain
//! HTML with no style or script (the stylesheet is behind the same gate),
//! and the next step spelled out.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};

use crate::api::server::auth::AuthError;

/// The page for a request to `/` that `auth` refused.
pub fn refused(e: &AuthError) -> Response {
    let (status, title, text) = match e {
        AuthError::Missing => (
            StatusCode::UNAUTHORIZED,
            "Sign in with a dashboard link",
            "This ramd dashboard needs a token. On the daemon's host, run <code>ramd dashboard</code> (read-only) or <code>ramd dashboard --admin</code> and open the URL it prints: the page keeps the token in a cookie and drops it from the address bar.",
        ),
        AuthError::Invalid => (
            StatusCode::UNAUTHORIZED,
            "This token is not valid",
            "The bearer token of this request is unknown or was revoked. Run <code>ramd dashboard</code> on the daemon's host and open the link it prints.",
        ),
        AuthError::SessionEnded => (
            StatusCode::UNAUTHORIZED,
            "This session has ended",
            "This browser's session has ended: it signed out, its token was revoked, the daemon restarted, or the browser's address changed. Run <code>ramd dashboard</code> on the daemon's host again and open the new link.",
        ),
        AuthError::Throttled { .. } => (
            StatusCode::TOO_MANY_REQUESTS,
            "Too many failed sign-ins",
            "Too many failed sign-ins came from this address. Wait a few seconds and reload.",
        ),
        AuthError::Expired { .. } => (
            StatusCode::UNAUTHORIZED,
            "This session has expired",
            "The token this browser holds has expired (dashboard links last 7 days unless <code>ramd dashboard --expires</code> says otherwise). Run <code>ramd dashboard</code> on the daemon's host again and open the new URL.",
        ),
        AuthError::ReadOnly { .. } | AuthError::Csrf(_) => (
            StatusCode::FORBIDDEN,
            "Refused",
            "This request is not allowed with this session.",
        ),
    };
    page(status, title, text)
}

/// A page with a title and a paragraph of trusted HTML (constants of this
/// file only: no caller's text goes in unescaped).
fn page(status: StatusCode, title: &'static str, html: &'static str) -> Response {
    let body = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ramd: {title}</title></head>\n<body><h1>{title}</h1>\n<p>{html}</p>\n<p>See docs/dashboard.md.</p></body></html>\n"
    );
    let mut res = (status, Html(body)).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if status == StatusCode::UNAUTHORIZED {
        res.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(r#"Bearer realm="ramd""#),
        );
    }
    res
}
