//! The dashboard's session cookie, and the CSRF rule for the requests it
//! authorizes (pure: headers in, decisions out; `auth` applies them; the
//! sessions themselves are `control::sessions`).
//!
//! ```text
//! POST /session {"code"}  ──► 204  Set-Cookie: __Host-ramd_PORT=<session id>; Path=/; Secure;
//!   (the sign-in page)             HttpOnly; SameSite=Strict; Max-Age=min(30 days, token's life)
//!                                  (plaintext loopback: ramd_session_PORT=..., no Secure)
//! later requests          ──► Cookie: __Host-ramd_PORT=<session id>
//! cookie + not GET/HEAD   ──► also X-Ramd-Csrf: 1, Origin (when sent) = the Host's,
//!                             Sec-Fetch-Site (when sent) = same-origin; else 403 csrf_refused
//! ```
//!
//! Why each piece:
//! - The cookie holds a random session id, never a token: cookies are
//!   sent to every port of a host, so another web service there receives
//!   it. A session id is no bearer token, works only as this cookie, only
//!   from the address that signed in, and only while its token lives.
//! - `__Host-` (under TLS) makes browsers take the cookie only from a
//!   secure origin, for the whole host, without a Domain: no other site
//!   or subdomain can plant or widen it. HttpOnly keeps it from scripts
//!   (an injected one cannot read it), Secure keeps it off plain HTTP,
//!   SameSite=Strict keeps other sites' pages from sending it at all.
//! - Its name carries the port: cookies are scoped by host, not port, so
//!   two daemons on one host would otherwise overwrite each other's
//!   session. `auth` tries every session cookie a request carries (at
//!   most [`MAX_SESSION_COOKIES`]) and takes the first that is a session.
//! - SameSite is a browser promise, so state-changing requests made with
//!   the cookie also need the custom header: a page on another origin
//!   cannot add one without a CORS preflight, which this server never
//!   grants. Origin and Sec-Fetch-Site, when a browser sends them, must
//!   say the request comes from the dashboard's own origin.
//! - A bearer header needs none of this: browsers never add one on their
//!   own.

use axum::http::{header, HeaderMap};

/// What a session cookie's name starts with under TLS.
pub const SECURE_PREFIX: &str = "__Host-ramd_";
/// What a session cookie's name starts with in plaintext (loopback only;
/// `__Host-` needs Secure, which browsers refuse over plain HTTP).
pub const PLAIN_PREFIX: &str = "ramd_session_";
/// The header the dashboard's script adds to every state-changing request.
pub const CSRF_HEADER: &str = "x-ramd-csrf";
/// Longest a browser keeps the session: 30 days, less when the token
/// expires sooner (it may be revoked any time before).
pub const MAX_AGE_S: u64 = 30 * 24 * 3600;
/// Most session cookies a request's sessions are looked up from.
pub const MAX_SESSION_COOKIES: usize = 4;

/// The session cookie's name for a dashboard on `port`.
pub fn cookie_name(port: u16, tls: bool) -> String {
    let prefix = if tls { SECURE_PREFIX } else { PLAIN_PREFIX };
    format!("{prefix}{port}")
}

/// The cookie's Max-Age for a token expiring at `expires_unix_s`: the
/// token's life left, at most [`MAX_AGE_S`], so a browser drops the
/// cookie when the token stops working.
pub fn max_age_s(expires_unix_s: Option<u64>, now_unix_s: u64) -> u64 {
    expires_unix_s.map_or(MAX_AGE_S, |e| e.saturating_sub(now_unix_s).min(MAX_AGE_S))
}

/// The `Set-Cookie` value that starts session `id`, kept for
/// `max_age_s` seconds.
pub fn set_cookie(port: u16, tls: bool, id: &str, max_age_s: u64) -> String {
    let secure = if tls { "; Secure" } else { "" };
    format!(
        "{}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{secure}",
        cookie_name(port, tls)
    )
}

/// The `Set-Cookie` value that ends the session on `port`.
pub fn clear_cookie(port: u16, tls: bool) -> String {
    set_cookie(port, tls, "", 0)
}

/// The values of the session cookies in `headers`, in order, at most
/// [`MAX_SESSION_COOKIES`] (a browser sends one `Cookie` header; several
/// are read too).
pub fn session_ids(headers: &HeaderMap) -> Vec<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| name.starts_with(SECURE_PREFIX) || name.starts_with(PLAIN_PREFIX))
        .map(|(_, value)| value.trim().trim_matches('"'))
        .filter(|value| !value.is_empty())
        .take(MAX_SESSION_COOKIES)
        .collect()
}

/// Why a cookie-authorized request that changes something was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrfError {
    /// The custom header is missing.
    #[error("a request that changes something with the dashboard's session cookie must carry the header X-Ramd-Csrf: 1 (the dashboard's own page sends it; a script calling the API should use an Authorization: Bearer header instead)")]
    MissingHeader,
    /// `Origin` names another origin (or there is no Host to compare).
    #[error("refused a cross-origin request from {origin}: the dashboard's session cookie works only on requests from its own pages")]
    CrossOrigin { origin: String },
    /// `Sec-Fetch-Site` says another site or origin made the request.
    #[error("refused a request the browser marked Sec-Fetch-Site: {site}: the dashboard's session cookie works only on requests from its own pages")]
    CrossSite { site: String },
}

/// The CSRF rule (see the module docs) for a cookie-authorized request
/// that is not GET or HEAD.
pub fn check_csrf(headers: &HeaderMap) -> Result<(), CsrfError> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if text(CSRF_HEADER).map(str::trim) != Some("1") {
        return Err(CsrfError::MissingHeader);
    }
    if let Some(site) = text("sec-fetch-site") {
        if site != "same-origin" {
            return Err(CsrfError::CrossSite {
                site: site.to_owned(),
            });
        }
    }
    if let Some(origin) = text(header::ORIGIN.as_str()) {
        let host = text(header::HOST.as_str());
        if !same_origin(origin, host) {
            return Err(CsrfError::CrossOrigin {
                origin: origin.to_owned(),
            });
        }
    }
    Ok(())
}

/// True when `origin` (`scheme://host[:port]`) names `host` (the Host
/// header, `host[:port]`). The scheme is not compared: a listener serves
/// one scheme only, so a request that reached it with this Host came over
/// that scheme.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else { return false };
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https") && authority.eq_ignore_ascii_case(host.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn cookies_carry_the_port_and_the_flags() {
        let c = set_cookie(8443, true, "sid", MAX_AGE_S);
        assert_eq!(
            c,
            "__Host-ramd_8443=sid; Path=/; HttpOnly; SameSite=Strict; Max-Age=2592000; Secure"
        );
        let plain = set_cookie(80, false, "sid", 60);
        assert!(plain.starts_with("ramd_session_80=sid;") && !plain.contains("Secure"));
        // The cookie lives as long as the token, at most 30 days.
        assert_eq!(max_age_s(None, 1000), MAX_AGE_S);
        assert_eq!(max_age_s(Some(1000 + 3600), 1000), 3600);
        assert_eq!(max_age_s(Some(1000 + 2 * MAX_AGE_S), 1000), MAX_AGE_S);
        assert_eq!(max_age_s(Some(10), 1000), 0);
        assert!(clear_cookie(80, false).starts_with("ramd_session_80=; "));
        assert!(clear_cookie(80, true).contains("Max-Age=0; Secure"));
    }

    #[test]
    fn session_ids_are_found_among_other_cookies() {
        let h = headers(&[
            ("cookie", "a=1; __Host-ramd_80=s1; ramd_token_9=old; b=2"),
            ("cookie", "ramd_session_81=\"s2\"; ramd_session_82="),
        ]);
        assert_eq!(session_ids(&h), ["s1", "s2"]);
        assert!(session_ids(&headers(&[("cookie", "other=1")])).is_empty());
        let many = (0..10)
            .map(|i| format!("ramd_session_{i}=t{i}"))
            .collect::<Vec<_>>()
            .join("; ");
        assert_eq!(
            session_ids(&headers(&[("cookie", &many)])).len(),
            MAX_SESSION_COOKIES
        );
    }

    #[test]
    fn csrf_needs_the_header_and_the_same_origin() {
        let ok = [
            ("x-ramd-csrf", "1"),
            ("host", "127.0.0.1:8443"),
            ("origin", "https://127.0.0.1:8443"),
            ("sec-fetch-site", "same-origin"),
        ];
        assert_eq!(check_csrf(&headers(&ok)), Ok(()));
        assert_eq!(check_csrf(&headers(&ok[..2])), Ok(()));
        assert_eq!(
            check_csrf(&headers(&ok[1..])),
            Err(CsrfError::MissingHeader)
        );
        let evil = [
            ("x-ramd-csrf", "1"),
            ("host", "127.0.0.1:8443"),
            ("origin", "https://evil.example"),
        ];
        assert!(matches!(
            check_csrf(&headers(&evil)),
            Err(CsrfError::CrossOrigin { .. })
        ));
        let other_port = [
            ("x-ramd-csrf", "1"),
            ("host", "127.0.0.1:8443"),
            ("origin", "https://127.0.0.1:9000"),
        ];
        assert!(check_csrf(&headers(&other_port)).is_err());
        let cross_site = [("x-ramd-csrf", "1"), ("sec-fetch-site", "cross-site")];
        assert!(matches!(
            check_csrf(&headers(&cross_site)),
            Err(CsrfError::CrossSite { .. })
        ));
        let no_host = [("x-ramd-csrf", "1"), ("origin", "http://localhost:80")];
        assert!(check_csrf(&headers(&no_host)).is_err());
        assert!(check_csrf(&headers(&[("x-ramd-csrf", "0")])).is_err());
    }
}
