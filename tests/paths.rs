//! Paths a user names are the paths the daemon uses: the CLI makes every
//! path absolute against its own working directory (not the daemon's),
//! the API refuses relative ones with 422 `relative_path`, and relative
//! runtime and state directories are made absolute at start (URIs name
//! absolute sockets; a directory in RAM leaves no mount behind).

mod common;

use std::path::{Component, Path, PathBuf};

use common::mounts::{require_root, Scratch};
use common::*;
use ramd::dirsync::mountinfo;
use serde_json::Value;

/// `to` relative to the test's working directory (`../..` up to `/`).
fn relative_from_cwd(to: &Path) -> PathBuf {
    let cwd = std::env::current_dir().unwrap();
    let ups = cwd
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    let mut rel = PathBuf::new();
    for _ in 0..ups {
        rel.push("..");
    }
    rel.join(to.strip_prefix("/").unwrap())
}

#[test]
fn a_relative_backing_names_the_file_in_the_clients_directory() {
    let d = Daemon::launch(&["daemon".into(), "--no-default-drive".into()], &[]);
    // The client works elsewhere than the daemon, with its own disk.img.
    let client_dir = tempfile::tempdir().unwrap();
    let img = client_dir.path().join("disk.img");
    std::fs::write(&img, vec![7u8; 4 << 20]).unwrap();
    let out = run(d.cli().current_dir(client_dir.path()).args([
        "cache",
        "create",
        "c",
        "--backing",
        "disk.img",
        "--size",
        "1M",
        "--mode",
        "writethrough",
    ]))
    .ok();
    assert!(out.stdout.contains('c'), "{out}");
    let (status, body) = d.http("GET", "/v1/caches/c", None);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["backing"]["spec"], img.display().to_string(), "{v}");

    // Over the API, a relative path is refused with what to give.
    let (status, body) = d.http(
        "POST",
        "/v1/caches",
        Some(r#"{"name": "r", "backing": "disk.img", "size": "1M", "mode": "writethrough"}"#),
    );
    assert_eq!(status, 422, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "relative_path", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("absolute path"),
        "{v}"
    );
    for (route, body) in [
        (
            "/v1/attachments",
            r#"{"drive": "c", "mountpoint": "mnt/x"}"#,
        ),
        (
            "/v1/remotes",
            r#"{"name": "s3", "url": "s3://b/p", "endpoint": "http://127.0.0.1:1", "region": "garage", "credentials_file": "creds"}"#,
        ),
    ] {
        let (status, text) = d.http("POST", route, Some(body));
        assert_eq!(status, 422, "{route}: {text}");
        assert!(text.contains("relative_path"), "{route}: {text}");
    }
}

#[test]
fn relative_runtime_and_state_dirs_are_made_absolute_at_start() {
    if !require_root() {
        return;
    }
    let s = Scratch::new("paths", "runtime");
    let dir = s.mkdir("data/cache");
    std::fs::write(dir.join("f"), b"in RAM").unwrap();
    let (run_dir, state_dir) = (s.path("run"), s.path("state"));
    let d = Daemon::launch(
        &[
            "daemon".into(),
            "--drive".into(),
            "t=16M".into(),
            "--runtime-dir".into(),
            relative_from_cwd(&run_dir).display().to_string(),
            "--state-dir".into(),
            relative_from_cwd(&state_dir).display().to_string(),
        ],
        &[],
    );
    let health = run(d.cli().args(["info", "t", "--json"])).ok();
    let v: Value = serde_json::from_str(&health.stdout).unwrap();
    let uri = v["uri"].as_str().unwrap();
    let socket = uri.split("socket=").nth(1).unwrap();
    assert!(Path::new(socket).is_absolute(), "{uri}");

    let mounts_under_run = || mountinfo::mounts_under(&mountinfo::read().unwrap(), &run_dir).len();
    for round in 0..2 {
        run(d.cli().args(["dir", "add", dir.to_str().unwrap()])).ok();
        assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"in RAM");
        run(d.cli().args(["dir", "remove", dir.to_str().unwrap()])).ok();
        assert_eq!(
            mounts_under_run(),
            0,
            "round {round}: mounts left under {}",
            run_dir.display()
        );
    }
    drop(d);
    assert_eq!(mounts_under_run(), 0);
}
