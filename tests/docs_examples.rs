//! Every example in the documentation is one the daemon accepts: each
//! ```toml block of README.md and docs/*.md loads with the config parser
//! the daemon uses, each ```json block parses (drive.json as the daemon's
//! settings file), and each `curl ... -d '{...}'` body parses as the
//! request type of its route. A doc edit that breaks an example fails
//! here, not in a user's hands.

use std::path::{Path, PathBuf};

use ramd::api::wire::attachments::CreateAttachment;
use ramd::api::wire::caches::CreateCache;
use ramd::api::wire::dirs::{AddDir, PatchDir};
use ramd::api::wire::drives::{CreateDrive, PatchDrive};
use ramd::api::wire::persistence::RestoreRequest;
use ramd::control::config;
use ramd::control::drives::persistent::settings::DriveSettings;

/// README.md and every docs/*.md, sorted.
fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.sort();
    files.insert(0, root.join("README.md"));
    files
}

/// The fenced blocks of `lang` in `text` (blocks of other languages are
/// skipped whole, so their lines are never taken for fences): (1-based
/// line of the opening fence, contents).
fn fenced(text: &str, lang: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut inside: Option<(bool, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        match inside.as_mut() {
            Some(_) if t.starts_with("```") => {
                let (wanted, at, body) = inside.take().unwrap();
                if wanted {
                    out.push((at, body));
                }
            }
            Some((_, _, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None if t.starts_with("```") => {
                let wanted = t.trim_start_matches('`').trim() == lang;
                inside = Some((wanted, i + 1, String::new()));
            }
            None => {}
        }
    }
    out
}

#[test]
fn every_toml_example_loads_with_the_config_parser() {
    let mut seen = 0;
    let mut failures = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, body) in fenced(&text, "toml") {
            seen += 1;
            let name = PathBuf::from(format!("{}:{line}", file.display()));
            if let Err(e) = config::parse(&name, &body) {
                failures.push(format!("{e}\n{body}"));
            }
        }
    }
    assert!(seen >= 3, "found only {seen} toml examples");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_json_example_parses() {
    let mut seen = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, body) in fenced(&text, "json") {
            seen += 1;
            let at = format!("{}:{line}", file.display());
            let v: serde_json::Value =
                serde_json::from_str(&body).unwrap_or_else(|e| panic!("{at}: {e}\n{body}"));
            if file.ends_with("formats.md") && v.get("durability").is_some() {
                let s: DriveSettings = serde_json::from_value(v)
                    .unwrap_or_else(|e| panic!("{at}: not a drive.json: {e}\n{body}"));
                s.to_spec().unwrap_or_else(|e| panic!("{at}: {e}"));
            }
        }
    }
    assert!(seen >= 1, "found no json examples");
}

/// The `curl` command lines of a text, continuation lines joined.
fn curl_lines(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .filter(|l| l.contains("curl ") && l.contains("http://ramd/"))
        .map(str::to_owned)
        .collect()
}

/// Checks one request body against the type of its route.
fn check_body(method: &str, path: &str, body: &str) -> Result<(), String> {
    fn parse<T: serde::de::DeserializeOwned>(body: &str) -> Result<(), String> {
        serde_json::from_str::<T>(body)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        ("POST", ["v1", "drives"]) => parse::<CreateDrive>(body),
        ("PATCH", ["v1", "drives", _]) => parse::<PatchDrive>(body),
        ("POST", ["v1", "drives", _, "restore"]) => parse::<RestoreRequest>(body),
        ("POST", ["v1", "caches"]) => parse::<CreateCache>(body),
        ("POST", ["v1", "attachments"]) => parse::<CreateAttachment>(body),
        ("POST", ["v1", "dirs"]) => parse::<AddDir>(body),
        ("PATCH", ["v1", "dirs", _]) => parse::<PatchDir>(body),
        _ => Err(format!("no request type known for {method} {path}")),
    }
}

#[test]
fn every_curl_request_body_parses_as_its_route_type() {
    let mut seen = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in curl_lines(&text) {
            let Some((_, rest)) = line.split_once(" -d '") else {
                continue;
            };
            let body = rest.split('\'').next().unwrap();
            let method = line
                .split_once("-X ")
                .map_or("POST", |(_, m)| m.split_whitespace().next().unwrap());
            let url = line.split("http://ramd").nth(1).unwrap();
            let path = url
                .split(|c: char| c.is_whitespace() || c == '\'' || c == '?')
                .next()
                .unwrap();
            seen += 1;
            check_body(method, path, body)
                .unwrap_or_else(|e| panic!("{}: {line}: {e}", file.display()));
        }
    }
    assert!(seen >= 2, "found only {seen} curl bodies");
}
