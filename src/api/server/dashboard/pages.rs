//! The dashboard's refusal pages: what a browser shows at `/` without a
//! valid session, or with a link whose token is unknown or revoked. Plain
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
            "This session has ended",
            "The token this browser holds is unknown or was revoked. Run <code>ramd dashboard</code> on the daemon's host again and open the new URL.",
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

/// The page for `/?token=` with a token that is not (or no longer) one
/// of the daemon's, or has expired.
pub fn link_refused(expired: bool) -> Response {
    if expired {
        return page(
            StatusCode::UNAUTHORIZED,
            "This link has expired",
            "The token in this link has expired. Run <code>ramd dashboard</code> on the daemon's host again (<code>--expires</code> sets how long a link lasts) and open the new URL.",
        );
    }
    page(
        StatusCode::UNAUTHORIZED,
        "This link's token is not valid",
        "The token in this link is unknown or was revoked (<code>ramd token list</code> shows the tokens). Run <code>ramd dashboard</code> on the daemon's host again and open the new URL.",
    )
}

/// A sign-in link followed from another site (login CSRF: that site
/// could sign this browser in with a token of its own).
pub fn link_from_elsewhere() -> Response {
    page(
        StatusCode::FORBIDDEN,
        "Open the link yourself",
        "This sign-in link was followed from another site, which could sign you in to a session of its choosing, so it is refused. Paste the URL <code>ramd dashboard</code> printed into the address bar instead.",
    )
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
