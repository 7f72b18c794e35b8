//! The dashboard's files, built into the binary (`include_bytes!`: no
//! CDN, no build step, nothing fetched at run time), served under
//! `/assets/NAME` with an ETag and `Cache-Control: no-cache`: a browser
//! keeps them and asks again with `If-None-Match` (304 when unchanged),
//! so an upgraded daemon's page is never mixed with an old script.
//!
//! Files (src/api/server/dashboard/assets/): `index.html` (the page,
//! served at `/`), `app.js` (data, tables, actions, events), `charts.js`
//! (the canvas line chart), `style.css`, `favicon.svg`; `signin.html`
//! (served at `/signin`) and `signin.js`, the sign-in page (`dashboard`). All are ours,
//! under the crate's license.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::api::server::ApiError;

/// The page, served at `/`.
pub const INDEX_HTML: &str = include_str!("assets/index.html");
/// The sign-in page, served at `/signin` (no credential needed).
pub const SIGNIN_HTML: &str = include_str!("assets/signin.html");

/// A file under `/assets/`.
pub struct Asset {
    pub name: &'static str,
    pub mime: &'static str,
    pub body: &'static [u8],
}

/// Every file under `/assets/`.
pub const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        mime: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/app.js"),
    },
    Asset {
        name: "charts.js",
        mime: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/charts.js"),
    },
    Asset {
        name: "signin.js",
        mime: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/signin.js"),
    },
    Asset {
        name: "style.css",
        mime: "text/css; charset=utf-8",
        body: include_bytes!("assets/style.css"),
    },
    Asset {
        name: "favicon.svg",
        mime: "image/svg+xml",
        body: include_bytes!("assets/favicon.svg"),
    },
];

/// Each asset's ETag (the start of its SHA-256), in `ASSETS` order.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = ring::digest::digest(&ring::digest::SHA256, a.body);
            let hex: String = digest.as_ref()[..12]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("\"{hex}\"")
        })
        .collect()
});

/// `GET /assets/{name}`.
pub async fn get(Path(name): Path<String>, headers: HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|a| a.name == name) else {
        let names: Vec<_> = ASSETS.iter().map(|a| a.name).collect();
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "no_such_asset",
            format!(
                "no dashboard asset '{name}' (there are: {})",
                names.join(", ")
            ),
        )
        .into_response();
    };
    let (asset, etag) = (&ASSETS[i], ETAGS[i].as_str());
    let cached = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut res = if cached {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut res = asset.body.into_response();
        res.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.mime));
        res
    };
    let h = res.headers_mut();
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-cache"),
    );
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    res
}
