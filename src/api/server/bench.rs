//! `/v1/bench/latest`: the last `ramd bench` report and its plot, kept for
//! the dashboard.
//!
//! `ramd bench` measures in the command's own process (the daemon serves
//! the drive, it does not drive the load), then `PUT`s its report here; the
//! daemon keeps it in `STATE_DIR/bench/latest.json` (directory 0700, file
//! 0600, replaced atomically: a temporary file, fsync, rename, fsync of
//! the directory, so a crash leaves the previous report or the new one)
//! and serves it back with `GET` (404 `no_bench_results` before the first).
//!
//! Writing is for the unix socket and admin tokens (the token layer
//! refuses read-only tokens on a `PUT`). The plot is shown by the
//! dashboard, so it must be a plain SVG document: anything that could run
//! in a browser (scripts, event handlers, `javascript:` links, foreign
//! objects) or fetch from elsewhere (any link or `url()` reference: ramd's
//! own plots have none) is refused with 422 `invalid_bench_report`. This
//! is defence in depth, not the dashboard's protection: the page shows the
//! plot only as an `<img>`, where nothing runs or loads, under a CSP. It
//! keeps a stored plot harmless should it be opened some other way.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::{blocking, ApiError};
use crate::api::wire::bench::{BenchLatest, REPORT_VERSION};
use crate::control::Daemon;

/// Most bytes of a stored plot (a full profile's plot is ~100 KiB).
const SVG_MAX_BYTES: usize = 1 << 20;

/// Why the last report could not be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum BenchStoreError {
    /// No report was stored yet.
    #[error(
        "no benchmark results yet: run `ramd bench DRIVE` (it sends its report to the daemon)"
    )]
    NoResults,
    /// The file or its directory failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The stored file is not a report.
    #[error("{} is not a benchmark report ({reason}); the next `ramd bench` replaces it", path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// A report this daemon cannot keep.
    #[error("{0}")]
    Invalid(#[from] InvalidReport),
}

/// What is wrong with a report sent to `PUT`.
#[derive(Debug, thiserror::Error)]
pub enum InvalidReport {
    /// A report shape this daemon does not know.
    #[error("report version {got}: this daemon keeps version {REPORT_VERSION} (update the daemon or the command line so both are the same ramd)")]
    Version { got: u32 },
    /// A plot too large to keep.
    #[error("the plot is {0} bytes: at most {SVG_MAX_BYTES} are kept")]
    SvgTooLarge(usize),
    /// Not an SVG document, or one a browser would run code from.
    #[error(
        "the plot is refused: {0} (the dashboard shows it, so it must be a plain SVG document)"
    )]
    Svg(&'static str),
}

impl From<BenchStoreError> for ApiError {
    fn from(e: BenchStoreError) -> Self {
        let (status, code) = match &e {
            BenchStoreError::NoResults => (StatusCode::NOT_FOUND, "no_bench_results"),
            BenchStoreError::Invalid(_) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_bench_report")
            }
            BenchStoreError::Io { .. } | BenchStoreError::Corrupt { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "bench_store_error")
            }
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// `STATE_DIR/bench/latest.json`.
fn latest_path(d: &Daemon) -> PathBuf {
    d.settings.state_dir.join("bench").join("latest.json")
}

pub async fn get(State(d): State<Arc<Daemon>>) -> Result<Json<BenchLatest>, ApiError> {
    let path = latest_path(&d);
    let mut latest = blocking(move || Ok(load(&path)?)).await?;
    // Even a report stored by an older daemon: its plot drawn here.
    latest.svg = crate::bench::plot::svg(&latest.report);
    Ok(Json(latest))
}

pub async fn put(
    State(d): State<Arc<Daemon>>,
    body: Result<Json<BenchLatest>, JsonRejection>,
) -> Result<Json<BenchLatest>, ApiError> {
    let Json(mut latest) = body?;
    check(&latest).map_err(BenchStoreError::from)?;
    // The plot kept and served is the one this daemon draws from the
    // figures, never the client's text: a filter on SVG markup cannot be
    // complete (namespaced `<x:script>`, an `onload=` after a `">"` inside
    // an attribute slipped past it), and a plot opened in its own tab runs
    // in the dashboard's origin.
    latest.svg = crate::bench::plot::svg(&latest.report);
    let path = latest_path(&d);
    let stored = latest.clone();
    blocking(move || Ok(store(&path, &stored)?)).await?;
    tracing::info!(
        profile = %latest.report.profile,
        targets = latest.report.targets.len(),
        results = latest.report.results.len(),
        "benchmark report stored"
    );
    Ok(Json(latest))
}

/// Refuses a report this daemon cannot keep or the dashboard must not show.
pub fn check(latest: &BenchLatest) -> Result<(), InvalidReport> {
    if latest.report.version != REPORT_VERSION {
        return Err(InvalidReport::Version {
            got: latest.report.version,
        });
    }
    check_svg(&latest.svg)
}

/// A plain SVG document: starts as one, and holds nothing a browser runs
/// or fetches (checked on the lowercased text, so case does not hide it;
/// links and references are refused whatever they point at, since a
/// quoting or an escape could hide where).
pub fn check_svg(svg: &str) -> Result<(), InvalidReport> {
    if svg.len() > SVG_MAX_BYTES {
        return Err(InvalidReport::SvgTooLarge(svg.len()));
    }
    let text = svg.to_ascii_lowercase();
    let start = text.trim_start();
    if !(start.starts_with("<svg") || start.starts_with("<?xml")) || !text.contains("</svg>") {
        return Err(InvalidReport::Svg("it is not an SVG document"));
    }
    let refused: [(&str, &'static str); 8] = [
        ("<script", "it holds a script"),
        ("javascript:", "it holds a javascript: link"),
        ("<foreignobject", "it holds a foreignObject"),
        ("<!entity", "it declares entities"),
        ("<?xml-stylesheet", "it links a stylesheet"),
        ("href", "it holds a link or reference (href)"),
        ("url(", "it references a resource (url())"),
        ("@import", "it imports a stylesheet"),
    ];
    if let Some((_, why)) = refused.iter().find(|(needle, _)| text.contains(needle)) {
        return Err(InvalidReport::Svg(why));
    }
    if has_event_handler(&text) {
        return Err(InvalidReport::Svg("it holds an event handler attribute"));
    }
    Ok(())
}

/// An attribute named `on...=` (onload, onclick, ...) inside a tag.
fn has_event_handler(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut in_tag = false;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'<' => in_tag = true,
            b'>' => in_tag = false,
            // After white space, or a `/` or quote, which HTML parsers
            // also take as the end of the previous attribute.
            b'o' if in_tag
                && i > 0
                && (bytes[i - 1].is_ascii_whitespace()
                    || matches!(bytes[i - 1], b'/' | b'"' | b'\'')) =>
            {
                let rest = &bytes[i..];
                if rest.starts_with(b"on") {
                    let name_end = rest[2..]
                        .iter()
                        .position(|c| !c.is_ascii_alphabetic())
                        .map_or(rest.len(), |p| p + 2);
                    let after = rest[name_end..].iter().find(|c| !c.is_ascii_whitespace());
                    if name_end > 2 && after == Some(&b'=') {
                        return true;
                    }
                }
            }
            _ => {}
        }
    }
    false
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BenchStoreError {
    let path = path.to_owned();
    move |source| BenchStoreError::Io { op, path, source }
}

/// The stored report.
pub fn load(path: &Path) -> Result<BenchLatest, BenchStoreError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(BenchStoreError::NoResults)
        }
        Err(e) => return Err(io("read", path)(e)),
    };
    serde_json::from_slice(&bytes).map_err(|e| BenchStoreError::Corrupt {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Replaces the stored report atomically (see the module docs).
pub fn store(path: &Path, latest: &BenchLatest) -> Result<(), BenchStoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io("create", dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io("chmod", dir))?;
    let mut bytes = serde_json::to_vec(latest).expect("a report serializes");
    bytes.push(b'\n');
    // One writer at a time: PUTs are rare, and a shared temporary name
    // would let two of them interleave their bytes.
    static WRITING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _one = WRITING.lock();
    crate::paths::replace_private_file(path, &bytes).map_err(|e| BenchStoreError::Io {
        op: e.op,
        path: e.path,
        source: e.source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_svg_is_kept_and_active_content_refused() {
        let ok = r#"<svg xmlns="http://www.w3.org/2000/svg" width="10"><text x="1">on = off</text></svg>"#;
        check_svg(ok).unwrap();
        for bad in [
            "<html></html>",
            r#"<svg><script>alert(1)</script></svg>"#,
            r#"<svg><a href="javascript:alert(1)">x</a></svg>"#,
            r#"<svg onload="alert(1)"></svg>"#,
            r#"<svg><rect ONCLICK = "x"/></svg>"#,
            r#"<svg><image href="http://example.com/x.png"/></svg>"#,
            r#"<svg><foreignObject></foreignObject></svg>"#,
            // Spellings a naive check misses.
            r#"<svg/onload="alert(1)"></svg>"#,
            r#"<svg><rect x="1"onclick="x"/></svg>"#,
            r#"<svg><image href = 'http://example.com/x.png'/></svg>"#,
            r#"<svg><use xlink:href="//example.com/x.svg#a"/></svg>"#,
            r#"<svg><rect style="fill:url(//example.com/x)"/></svg>"#,
            r#"<svg><style>@import 'x.css';</style></svg>"#,
            r#"<?xml-stylesheet href="x.css"?><svg></svg>"#,
        ] {
            assert!(check_svg(bad).is_err(), "{bad} was accepted");
        }
        let huge = format!("<svg>{}</svg>", " ".repeat(SVG_MAX_BYTES));
        assert!(matches!(
            check_svg(&huge),
            Err(InvalidReport::SvgTooLarge(_))
        ));
    }
}
