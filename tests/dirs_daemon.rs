//! Directories in RAM through the real daemon (root; real tmpfs/overlay
//! mounts): `ramd dir` and `/v1/dirs` round trips checked file by file,
//! every API error, `[[dir]]` in the config (and bad ones failing with
//! file:line), kill -9 of the daemon in the middle of syncs many times
//! (the on-disk copy is always each file's old or new version; the restarted
//! daemon keeps the RAM content as a recovery copy), SIGTERM syncing before
//! exit, a simulated reboot, usage warnings, metrics and `install-units`.
//!
//! Every test works in its own directory under the cargo target dir (a disk
//! filesystem: ramd refuses directories already on tmpfs) with its own
//! runtime and state directories, and detaches every mount below it at the
//! end, pass or fail.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::mounts::{require_root, Scratch};
use common::openapi::Spec;
use common::*;
use ramd::dirsync::mountinfo;
use serde_json::{json, Value};

impl Scratch {
    /// `ramd daemon` with this scratch's runtime and state directories.
    fn daemon(&self, extra: &[&str]) -> Daemon {
        let mut args: Vec<String> = vec![
            "daemon".into(),
            "--no-default-drive".into(),
            "--runtime-dir".into(),
            self.path("run").display().to_string(),
            "--state-dir".into(),
            self.path("state").display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let d = Daemon::launch(&args, &[]);
        // The API socket exists before directories are restored; the first
        // request is answered once start-up is done (READY=1).
        let (status, body) = d.http("GET", "/v1/health", None);
        assert_eq!(status, 200, "{body}");
        d
    }
    /// The on-disk copy of a managed directory (the daemon's private view).
    fn disk_view(&self, id: &str) -> PathBuf {
        self.path(&format!("run/dirs/{id}/disk"))
    }
}

fn fs_type_at(path: &Path) -> Option<String> {
    mountinfo::top_mount_at(&mountinfo::read().unwrap(), path).map(|m| m.fs_type.clone())
}

/// Everything a round trip keeps, per entry (relative path).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: u32,
    mode: u32,
    /// crc32c of a file's content.
    crc: Option<u32>,
    target: Option<PathBuf>,
    /// The first path with the same inode (hard links).
    link_of: Option<PathBuf>,
    xattrs: Vec<(std::ffi::OsString, Vec<u8>)>,
}

/// The tree under `root`; names starting with `.ramd-` (the sync's own
/// temporaries) are left out when `skip_internal`.
fn snapshot_with(root: &Path, skip_internal: bool) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, PathBuf> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(root.join(&rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            if skip_internal && name.to_string_lossy().starts_with(".ramd-") {
                continue;
            }
            let r = rel.join(&name);
            let p = root.join(&r);
            let m = std::fs::symlink_metadata(&p).unwrap();
            let link_of = (m.nlink() > 1 && !m.is_dir())
                .then(|| inodes.entry(m.ino()).or_insert(r.clone()).clone());
            out.insert(
                r.clone(),
                Entry {
                    kind: m.mode() & libc::S_IFMT,
                    mode: if m.file_type().is_symlink() {
                        0
                    } else {
                        m.mode() & 0o7777
                    },
                    crc: m
                        .is_file()
                        .then(|| crc32c::crc32c(&std::fs::read(&p).unwrap())),
                    target: m
                        .file_type()
                        .is_symlink()
                        .then(|| std::fs::read_link(&p).unwrap()),
                    link_of,
                    xattrs: ramd::dirsync::meta::read_xattrs(&p).unwrap(),
                },
            );
            if m.is_dir() {
                stack.push(r);
            }
        }
    }
    out
}

fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    snapshot_with(root, false)
}

#[track_caller]
fn assert_same(a: &BTreeMap<PathBuf, Entry>, b: &BTreeMap<PathBuf, Entry>, what: &str) {
    let diff: Vec<&PathBuf> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .collect();
    assert!(diff.is_empty(), "{what}: entries differ: {diff:?}");
}

/// Files of every kind: data, empty, nested, symlinks, a hard link, modes.
fn make_tree(root: &Path) {
    let w = |rel: &str, data: &[u8]| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    };
    w("a.txt", b"alpha");
    w("empty", b"");
    w("sub/b.bin", &random_bytes(200_000, 1));
    w("sub/deeper/c", &random_bytes(5000, 2));
    std::fs::set_permissions(
        root.join("sub/deeper/c"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::os::unix::fs::symlink("sub/b.bin", root.join("link")).unwrap();
    std::os::unix::fs::symlink("nowhere", root.join("dangling")).unwrap();
    std::fs::hard_link(root.join("a.txt"), root.join("sub/a-again")).unwrap();
    let xattr = |rel: &str, value: &[u8]| {
        rustix::fs::lsetxattr(
            root.join(rel),
            "user.ramd-test",
            value,
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap()
    };
    xattr("sub/b.bin", b"kept");
    xattr("sub", b"on a directory");
}

fn change_tree(root: &Path) {
    std::fs::write(root.join("a.txt"), b"alpha, rewritten").unwrap();
    std::fs::write(root.join("new"), random_bytes(70_000, 3)).unwrap();
    std::fs::remove_file(root.join("sub/deeper/c")).unwrap();
    std::fs::create_dir_all(root.join("fresh/dir")).unwrap();
    std::fs::write(root.join("fresh/dir/x"), b"x").unwrap();
}

fn cli_ok(d: &Daemon, args: &[&str]) -> Output {
    let out = run(d.cli().args(args));
    assert_eq!(out.code(), 0, "{out}");
    out
}

fn cli_json(d: &Daemon, args: &[&str]) -> Value {
    let out = cli_ok(d, args);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// `%2F...`: a path as one URL segment.
fn enc(p: &Path) -> String {
    p.display()
        .to_string()
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn cli_round_trip_with_checksums() {
    if !require_root() {
        return;
    }
    let s = Scratch::new("dirs-daemon", "cli");
    let dir = s.mkdir("data/profile");
    make_tree(&dir);
    let before = snapshot(&dir);
    let d = s.daemon(&[]);

    let out = cli_ok(
        &d,
        &[
            "dir",
            "add",
            dir.to_str().unwrap(),
            "--interval",
            "1h",
            "--size-limit",
            "64M",
        ],
    );
    assert!(
        out.stdout.contains("is in RAM (tmpfs, limit 64 MiB)"),
        "{out}"
    );
    assert!(out.stdout.contains("every 1h"), "{out}");
    assert_eq!(fs_type_at(&dir).as_deref(), Some("tmpfs"));
    assert_same(&before, &snapshot(&dir), "the RAM copy");

    let info = cli_json(&d, &["dir", "info", dir.to_str().unwrap(), "--json"]);
    let id = info["id"].as_str().unwrap().to_owned();
    assert_eq!(info["status"], "active");
    assert_eq!(info["sync_interval_ms"], 3_600_000);
    // By id too.
    let by_id = cli_json(&d, &["dir", "info", &id, "--json"]);
    assert_eq!(by_id["path"], dir.display().to_string());

    change_tree(&dir);
    let out = cli_ok(&d, &["dir", "sync", dir.to_str().unwrap()]);
    assert!(
        out.stdout
            .starts_with(&format!("synced {}: 3 files copied", dir.display())),
        "{out}"
    );
    assert!(out.stdout.contains("deleted"), "{out}");
    let in_ram = snapshot(&dir);
    assert_same(&in_ram, &snapshot(&s.disk_view(&id)), "the on-disk copy");

    // The table: usage, state, last sync.
    let out = cli_ok(&d, &["dir", "list"]);
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(&dir.display().to_string()))
        .unwrap_or_else(|| panic!("{out}"));
    for want in ["tmpfs", "64 MiB", "active", "s ago", "1h"] {
        assert!(line.contains(want), "want {want:?} in {line:?}");
    }
    let list = cli_json(&d, &["dir", "list", "--json"]);
    Spec::load().check("GET", "/v1/dirs", 200, &list.to_string());
    assert_eq!(list["dirs"][0]["totals"]["syncs"], 1);

    // Sync all, then remove: a normal directory with the latest content.
    std::fs::write(dir.join("last"), b"just before remove").unwrap();
    let out = cli_ok(&d, &["dir", "sync", "--all"]);
    assert!(out.stdout.contains("1 file copied"), "{out}");
    let in_ram = snapshot(&dir);
    let out = cli_ok(&d, &["dir", "remove", dir.to_str().unwrap()]);
    assert!(out.stdout.contains("is a normal directory again"), "{out}");
    assert_eq!(fs_type_at(&dir), None);
    assert_same(&in_ram, &snapshot(&dir), "after remove");
    let out = cli_ok(&d, &["dir", "list"]);
    assert!(out.stdout.contains("no directories in RAM"), "{out}");
    // Errors: exit 1 with the daemon's message.
    let out = run(d.cli().args(["dir", "sync", dir.to_str().unwrap()]));
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("is not kept in RAM"), "{out}");
    let out = run(d.cli().args(["dir", "add", "/no/such/dir"]));
    assert_eq!(out.code(), 1, "{out}");
    let out = run(d.cli().args(["dir", "sync"]));
    assert_eq!(out.code(), 2, "{out}");
    assert!(s.path("run/dirs").read_dir().unwrap().next().is_none());
}

#[test]
fn api_round_trip_and_every_error() {
    if !require_root() {
        return;
    }
    let spec = Spec::load();
    let s = Scratch::new("dirs-daemon", "api");
    let dir = s.mkdir("data/work");
    make_tree(&dir);
    let d = s.daemon(&[]);
    let call = |method: &str, template: &str, path: &str, body: Option<&str>| -> (u16, Value) {
        spec.call(&d, method, template, path, body)
    };
    let expect_err = |method: &str,
                      template: &str,
                      path: &str,
                      body: Option<&str>,
                      status: u16,
                      code: &str|
     -> String {
        let (s, v) = call(method, template, path, body);
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{method} {path} {body:?}: {v}"
        );
        v["error"]["message"].as_str().unwrap().to_owned()
    };
    let (list, one, sync_one) = ("/v1/dirs", "/v1/dirs/{id}", "/v1/dirs/{id}/sync");

    let body =
        json!({"path": dir, "interval": "10m", "size_limit": "32M", "recovery_generations": 2})
            .to_string();
    let (st, v) = call("POST", list, list, Some(&body));
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (v["mode"].as_str(), v["size_limit_bytes"].as_u64()),
        (Some("tmpfs"), Some(32 << 20))
    );
    assert_eq!(v["origin"], json!({"kind": "api"}));
    assert_eq!(fs_type_at(&dir).as_deref(), Some("tmpfs"));

    // By id and by encoded path.
    let (st, v) = call("GET", one, &format!("/v1/dirs/{id}"), None);
    assert_eq!((st, v["path"].as_str()), (200, dir.to_str()));
    let (st, v) = call("GET", one, &format!("/v1/dirs/{}", enc(&dir)), None);
    assert_eq!((st, v["id"].as_str()), (200, Some(id.as_str())));

    change_tree(&dir);
    let (st, v) = call(
        "POST",
        sync_one,
        &format!("/v1/dirs/{}/sync", enc(&dir)),
        None,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["report"]["files_copied"], 3, "{v}");
    assert_same(
        &snapshot(&dir),
        &snapshot(&s.disk_view(&id)),
        "synced through the API",
    );
    let (st, v) = call("POST", "/v1/dirs/sync", "/v1/dirs/sync", None);
    assert_eq!(st, 200);
    assert_eq!(v["results"][0]["report"]["files_copied"], 0, "{v}");

    // Overlay mode, and a second directory.
    let ov = s.mkdir("data/overlay");
    std::fs::write(ov.join("lower"), b"from disk").unwrap();
    let body = json!({"path": ov, "overlay": true, "interval": 60000}).to_string();
    let (st, v) = call("POST", list, list, Some(&body));
    assert_eq!((st, v["mode"].as_str()), (201, Some("overlay")), "{v}");
    assert_eq!(fs_type_at(&ov).as_deref(), Some("overlay"));
    std::fs::write(ov.join("upper"), b"written in RAM").unwrap();

    // Errors.
    let m = expect_err(
        "POST",
        list,
        list,
        Some(&json!({"path": dir}).to_string()),
        409,
        "dir_exists",
    );
    assert!(m.contains("already kept in RAM"), "{m}");
    expect_err(
        "POST",
        list,
        list,
        Some(r#"{"path":"relative/dir"}"#),
        422,
        "relative_path",
    );
    expect_err(
        "POST",
        list,
        list,
        Some(&json!({"path": dir.join("sub"), "interval": "10ms"}).to_string()),
        422,
        "invalid_request",
    );
    expect_err(
        "POST",
        list,
        list,
        Some(&json!({"path": dir.join("sub"), "interval": "often"}).to_string()),
        422,
        "invalid_request",
    );
    expect_err(
        "POST",
        list,
        list,
        Some(&json!({"path": dir.join("sub"), "size_limit": "12Q"}).to_string()),
        422,
        "invalid_size",
    );
    expect_err(
        "POST",
        list,
        list,
        Some(&json!({"path": dir.join("sub"), "colour": 1}).to_string()),
        400,
        "unknown_field",
    );
    expect_err("POST", list, list, Some("{"), 400, "bad_json");
    expect_err("POST", list, list, Some("{}"), 422, "invalid_request");
    let m = expect_err(
        "POST",
        list,
        list,
        Some(&json!({"path": dir.join("sub")}).to_string()),
        422,
        "dir_refused",
    );
    assert!(m.contains("overlaps"), "{m}");
    let m = expect_err(
        "POST",
        list,
        list,
        Some(&json!({"path": s.path("data/missing")}).to_string()),
        422,
        "dir_refused",
    );
    assert!(m.contains("not a directory"), "{m}");
    let mp = s.mkdir("data/mountpoint");
    rustix::mount::mount(
        "ramd-test",
        &mp,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .unwrap();
    let m = expect_err(
        "POST",
        list,
        list,
        Some(&json!({"path": mp}).to_string()),
        422,
        "dir_refused",
    );
    assert!(m.contains("mount point"), "{m}");
    let big = s.mkdir("data/big");
    std::fs::write(big.join("f"), random_bytes(300 << 10, 4)).unwrap();
    let m = expect_err(
        "POST",
        list,
        list,
        Some(&json!({"path": big, "size_limit": "128K"}).to_string()),
        507,
        "ram_full",
    );
    assert!(m.contains("raise the size limit"), "{m}");
    assert_eq!(fs_type_at(&big), None, "a refused add mounts nothing");
    expect_err(
        "GET",
        one,
        "/v1/dirs/nope-00000000",
        None,
        404,
        "dir_not_found",
    );
    expect_err(
        "GET",
        one,
        &format!("/v1/dirs/{}", enc(&big)),
        None,
        404,
        "dir_not_found",
    );
    expect_err(
        "POST",
        sync_one,
        "/v1/dirs/nope/sync",
        None,
        404,
        "dir_not_found",
    );
    expect_err("DELETE", one, "/v1/dirs/nope", None, 404, "dir_not_found");
    expect_err(
        "DELETE",
        one,
        &format!("/v1/dirs/{id}?forse=1"),
        None,
        400,
        "unknown_field",
    );

    // New settings: interval, a bigger tmpfs, fewer recovery copies.
    let p = "/v1/dirs/{id}";
    let path = format!("/v1/dirs/{id}");
    let (st, v) = call(
        "PATCH",
        p,
        &path,
        Some(r#"{"interval":"30m","size_limit":"48M"}"#),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["sync_interval_ms"], 1_800_000, "{v}");
    assert_eq!(v["size_limit_bytes"], 48 << 20, "{v}");
    assert_eq!(
        v["usage"]["total_bytes"],
        48 << 20,
        "the tmpfs was resized: {v}"
    );
    assert!(v.get("notice").is_none(), "{v}");
    let (st, v) = call(
        "PATCH",
        p,
        &path,
        Some(r#"{"size_limit":"none","recovery_generations":1}"#),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["size_limit_bytes"], Value::Null, "{v}");
    assert!(
        v["usage"]["total_bytes"].as_u64().unwrap() > 48 << 20,
        "{v}"
    );
    let m = expect_err(
        "PATCH",
        p,
        &path,
        Some(r#"{"size_limit":"16K"}"#),
        422,
        "invalid_request",
    );
    assert!(m.contains("cannot be set"), "{m}");
    expect_err("PATCH", p, &path, Some("{}"), 422, "invalid_request");
    expect_err(
        "PATCH",
        p,
        &path,
        Some(r#"{"interval":"1ms"}"#),
        422,
        "invalid_request",
    );
    expect_err(
        "PATCH",
        p,
        &path,
        Some(r#"{"size_limit":0}"#),
        422,
        "invalid_size",
    );
    expect_err(
        "PATCH",
        p,
        &path,
        Some(r#"{"intervall":"1m"}"#),
        400,
        "unknown_field",
    );
    expect_err(
        "PATCH",
        p,
        "/v1/dirs/nope",
        Some(r#"{"interval":"1m"}"#),
        404,
        "dir_not_found",
    );
    // Read back.
    let (_, v) = call("GET", one, &path, None);
    assert_eq!(v["sync_interval_ms"], 1_800_000, "{v}");

    // A file open for writing blocks remove; force goes ahead.
    let mut open = File::create(dir.join("open-for-writing")).unwrap();
    open.write_all(b"busy").unwrap();
    let m = expect_err(
        "DELETE",
        one,
        &format!("/v1/dirs/{id}"),
        None,
        409,
        "dir_busy",
    );
    assert!(m.contains("fuser"), "{m}");
    assert_eq!(fs_type_at(&dir).as_deref(), Some("tmpfs"), "still in RAM");
    drop(open);
    let in_ram = snapshot(&dir);
    let (st, v) = call("DELETE", one, &format!("/v1/dirs/{id}"), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["result"]["outcome"], "released", "{v}");
    assert!(v.get("notice").is_none(), "{v}");
    assert_eq!(fs_type_at(&dir), None);
    assert_same(&in_ram, &snapshot(&dir), "after DELETE");

    let (st, v) = call(
        "DELETE",
        one,
        &format!("/v1/dirs/{}?force=true", enc(&ov)),
        None,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(fs_type_at(&ov), None);
    assert_eq!(std::fs::read(ov.join("upper")).unwrap(), b"written in RAM");
    assert_eq!(std::fs::read(ov.join("lower")).unwrap(), b"from disk");
    let (_, v) = call("GET", list, list, None);
    assert_eq!(v["dirs"], json!([]));
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn config_dirs_come_up_mounted_and_bad_ones_fail_with_file_line() {
    if !require_root() {
        return;
    }
    let s = Scratch::new("dirs-daemon", "config");
    let logs = s.mkdir("data/logs");
    std::fs::write(logs.join("old.log"), b"before ramd").unwrap();
    let declared = format!(
        "[[dir]]\npath = \"{}/\"\ninterval = \"2s\"\nsize_limit = \"16M\"\n",
        logs.display()
    );
    let cfg = write(&s.base, "ramd.toml", &declared);
    let cfg_arg = cfg.display().to_string();
    let mut d = s.daemon(&["--config", &cfg_arg]);
    assert_eq!(fs_type_at(&logs).as_deref(), Some("tmpfs"));
    let list = cli_json(&d, &["dir", "list", "--json"]);
    let x = &list["dirs"][0];
    assert_eq!(x["path"], logs.display().to_string());
    assert_eq!(x["origin"], json!({"kind": "config", "file": cfg_arg}));
    assert_eq!(
        (
            x["sync_interval_ms"].as_u64(),
            x["size_limit_bytes"].as_u64()
        ),
        (Some(2000), Some(16 << 20))
    );
    assert_eq!(std::fs::read(logs.join("old.log")).unwrap(), b"before ramd");
    // The interval syncs on its own (bounded wait, no timing assertion).
    std::fs::write(logs.join("new.log"), b"periodic").unwrap();
    let id = x["id"].as_str().unwrap().to_owned();
    wait_until("a periodic sync", Duration::from_secs(60), || {
        s.disk_view(&id).join("new.log").exists()
    });
    // Changing a declared directory works until the next start, and says so.
    let out = cli_ok(
        &d,
        &["dir", "set", logs.to_str().unwrap(), "--interval", "5s"],
    );
    assert!(out.stderr.contains("declared in"), "{out}");
    assert!(out.stdout.contains("synced every 5s"), "{out}");
    // Removing a declared directory works until the next start, and says so.
    let out = cli_ok(&d, &["dir", "remove", logs.to_str().unwrap()]);
    assert!(out.stderr.contains("declared in"), "{out}");
    assert!(d.terminate().success());
    // Next start: declared, so back in RAM.
    let mut d = s.daemon(&["--config", &cfg_arg]);
    assert_eq!(fs_type_at(&logs).as_deref(), Some("tmpfs"));
    // Changed settings are applied at start (synced, re-added).
    write(&s.base, "ramd.toml", &declared.replace("16M", "24M"));
    assert!(d.terminate().success());
    let mut d = s.daemon(&["--config", &cfg_arg]);
    let list = cli_json(&d, &["dir", "list", "--json"]);
    assert_eq!(list["dirs"][0]["size_limit_bytes"], 24 << 20);
    std::fs::write(logs.join("kept.log"), b"written in RAM").unwrap();
    // No longer declared by the same file: synced and back on disk at start.
    write(&s.base, "ramd.toml", "# no dirs\n");
    assert!(d.terminate().success());
    let d = s.daemon(&["--config", &cfg_arg]);
    assert_eq!(fs_type_at(&logs), None);
    assert_eq!(cli_json(&d, &["dir", "list", "--json"])["dirs"], json!([]));
    assert_eq!(
        std::fs::read(logs.join("kept.log")).unwrap(),
        b"written in RAM"
    );
    drop(d);

    // Bad [[dir]]s: the daemon refuses to start, naming file:line:column.
    let mp = s.mkdir("data/mp");
    rustix::mount::mount(
        "ramd-test",
        &mp,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .unwrap();
    let ok_dir = s.mkdir("data/fine");
    let api = s.path("bad-api.sock");
    for (text, want) in [
        (
            format!("[[dir]]\npath = \"{}\"\ncolour = 1\n", logs.display()),
            ":3:1: unknown field `colour`".to_string(),
        ),
        (
            format!(
                "[[dir]]\npath = \"{}\"\ninterval = \"often\"\n",
                logs.display()
            ),
            ":3:12: invalid interval".into(),
        ),
        (
            "[[dir]]\npath = \"relative\"\n".into(),
            ":2:8: the directory must be an absolute path".into(),
        ),
        (
            format!(
                "[[dir]]\npath = \"{}\"\nsize_limit = \"1Q\"\n",
                logs.display()
            ),
            ":3:14: ".into(),
        ),
        (
            format!(
                "[[dir]]\npath = \"{}\"\n\n[[dir]]\npath = \"{}\"\n",
                ok_dir.display(),
                s.path("data/missing").display()
            ),
            format!(
                ":5:8: cannot keep {} in RAM",
                s.path("data/missing").display()
            ),
        ),
        (
            format!(
                "[[dir]]\npath = \"{}\"\n\n[[dir]]\npath = \"{}\"\n",
                ok_dir.display(),
                mp.display()
            ),
            format!(
                ":5:8: cannot keep {} in RAM: {} is already a mount point",
                mp.display(),
                mp.display()
            ),
        ),
    ] {
        let bad = write(&s.base, "bad.toml", &text);
        let out = run(ramd()
            .args(["daemon", "--no-default-drive", "--config"])
            .arg(&bad)
            .arg("--runtime-dir")
            .arg(s.path("run"))
            .arg("--state-dir")
            .arg(s.path("state"))
            .arg("--api-socket")
            .arg(&api)
            .arg("--socket")
            .arg(s.path("bad-nbd.sock")));
        assert_eq!(out.code(), 1, "{out}");
        let want = format!("{}{want}", bad.display());
        assert!(out.stderr.contains(&want), "want {want:?} in: {out}");
        assert!(!api.exists(), "API socket left behind: {out}");
        // The good directory declared before the bad one was released.
        assert_eq!(fs_type_at(&ok_dir), None, "{out}");
    }
}

// ---- kill -9 of the daemon in the middle of syncs ---------------------------

/// A self-checking file: `NAME vK\n`, data derived from (name, k), then
/// `\ncrc XXXXXXXX\n` over everything before. Same length for every k.
fn versioned(name: &str, k: u64, len: usize) -> Vec<u8> {
    let mut body = format!("{name} v{k:010}\n").into_bytes();
    body.extend(random_bytes(
        len,
        crc32c::crc32c(name.as_bytes()) as u64 ^ k,
    ));
    let crc = crc32c::crc32c(&body);
    body.extend(format!("\ncrc {crc:08x}\n").into_bytes());
    body
}

/// The version a self-checking file holds, or None when it is torn.
fn version_of(bytes: &[u8]) -> Option<u64> {
    let n = bytes.len();
    if n < 14 || &bytes[n - 14..n - 9] != b"\ncrc " {
        return None;
    }
    let crc = u32::from_str_radix(std::str::from_utf8(&bytes[n - 9..n - 1]).ok()?, 16).ok()?;
    if crc32c::crc32c(&bytes[..n - 14]) != crc {
        return None;
    }
    let head = std::str::from_utf8(&bytes[..bytes.iter().position(|&b| b == b'\n')?]).ok()?;
    head.rsplit_once(" v")?.1.parse().ok()
}

/// Writes versions into `dir` (the RAM copy) until `stop`: files replaced
/// by rename, one rewritten in place, a 4 MiB file, and whole directories
/// appearing and going.
fn writer(dir: PathBuf, stop: Arc<AtomicBool>, mut k: u64) -> u64 {
    let replace = |name: &str, data: &[u8]| {
        let tmp = dir.join(format!(".w-{name}"));
        std::fs::write(&tmp, data).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    };
    let inplace = File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join("inplace"))
        .unwrap();
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        for i in 0..8 {
            let name = format!("f{i}");
            replace(&name, &versioned(&name, k, 8000 + i * 1000));
        }
        inplace
            .write_all_at(&versioned("inplace", k, 64 << 10), 0)
            .unwrap();
        if k % 3 == 0 {
            replace("big", &versioned("big", k, 4 << 20));
        }
        let tmp = dir.join(format!(".w-d{k}"));
        std::fs::create_dir(&tmp).unwrap();
        for j in 0..3 {
            let name = format!("g{j}");
            std::fs::write(tmp.join(&name), versioned(&name, k, 3000)).unwrap();
        }
        std::fs::rename(&tmp, dir.join(format!("d{k}"))).unwrap();
        // Gone at once (a sync never sees it half deleted), then deleted.
        let old = dir.join(format!("d{}", k.saturating_sub(2)));
        let gone = dir.join(format!(".w-gone{k}"));
        if std::fs::rename(&old, &gone).is_ok() {
            std::fs::remove_dir_all(&gone).unwrap();
        }
    }
    k
}

/// Every file the writer makes is a whole version; every `dN` directory
/// holds its three files. Returns the number of sync temporaries found.
#[track_caller]
fn check_consistent(root: &Path, round: u32) -> usize {
    let mut temporaries = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut names = Vec::new();
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let p = e.path();
            if name.starts_with(".ramd-") {
                temporaries += 1;
                continue;
            }
            names.push(name.clone());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
                continue;
            }
            if name.starts_with(".w-") || name == "seed" {
                continue;
            }
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                version_of(&bytes).is_some(),
                "round {round}: {} is torn on disk ({} bytes)",
                p.display(),
                bytes.len()
            );
        }
        let is_version_dir = d
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('d') && d != root);
        if is_version_dir {
            names.sort();
            assert_eq!(
                names,
                ["g0", "g1", "g2"],
                "round {round}: half directory {}",
                d.display()
            );
        }
    }
    temporaries
}

/// One API sync request; false when the daemon did not answer (killed).
fn try_sync(socket: &Path, id: &str) -> bool {
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let req = format!("POST /v1/dirs/{id}/sync HTTP/1.1\r\nHost: ramd\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = String::new();
    s.read_to_string(&mut out).is_ok() && out.starts_with("HTTP/1.1 200")
}

#[test]
fn kill_9_the_daemon_during_syncs_many_times() {
    if !require_root() {
        return;
    }
    let s = Scratch::new("dirs-daemon", "kill9");
    let dir = s.mkdir("data/hot");
    std::fs::write(dir.join("seed"), b"on disk from the start").unwrap();
    std::fs::write(dir.join("inplace"), versioned("inplace", 0, 64 << 10)).unwrap();
    let mut d = s.daemon(&[]);
    let v = cli_json(
        &d,
        &[
            "dir",
            "add",
            dir.to_str().unwrap(),
            "--interval",
            "1s",
            "--recovery-generations",
            "2",
            "--json",
        ],
    );
    let id = v["id"].as_str().unwrap().to_owned();
    let seed = common::seed_from_env("RAMD_KILL9_SEED", "kill -9 test");
    let mut rng = seed;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut k, mut mid_sync, rounds) = (0u64, 0, 24);
    for round in 1..=rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let w = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || writer(dir, stop, k))
        };
        let syncer = {
            let (sock, id, stop) = (d.api_socket().to_owned(), id.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut ok = 0;
                while !stop.load(Ordering::Relaxed) {
                    if try_sync(&sock, &id) {
                        ok += 1;
                    } else {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                ok
            })
        };
        // The behaviour under test: a kill at a random moment of the
        // writes and syncs (nothing is asserted about what it interrupts
        // but at least one sync over all the rounds, see below).
        std::thread::sleep(Duration::from_millis(200 + next() % 700));
        signal(d.pid(), libc::SIGKILL);
        assert!(!d.terminate().success(), "killed");
        stop.store(true, Ordering::Relaxed);
        k = w.join().expect("writer");
        syncer.join().expect("syncer");

        // The mounts outlive the daemon: PATH is still the RAM copy and the
        // disk view still shows the on-disk copy.
        let disk = s.disk_view(&id);
        let temporaries = check_consistent(&disk, round);
        if temporaries > 0 {
            mid_sync += 1;
        }
        let ram = snapshot(&dir);
        let on_disk = snapshot_with(&disk, true);

        d = s.daemon(&[]);
        let info = cli_json(&d, &["dir", "info", &id, "--json"]);
        assert_eq!(info["status"], "active", "round {round}: {info}");
        let copies = info["recovery_copies"].as_array().unwrap();
        assert_eq!(
            copies.len(),
            (round as usize).min(2),
            "round {round}: generations bounded: {info}"
        );
        let newest = PathBuf::from(copies.last().unwrap()["path"].as_str().unwrap());
        assert_same(
            &ram,
            &snapshot(&newest),
            &format!("round {round}: the recovery copy"),
        );
        assert_same(
            &on_disk,
            &snapshot(&dir),
            &format!("round {round}: restored from disk"),
        );
        assert!(info["notes"].to_string().contains("saved to"), "{info}");
    }
    eprintln!("{rounds} kills, {mid_sync} left sync temporaries on disk (killed mid-sync)");
    assert!(mid_sync >= 1, "no kill landed in the middle of a sync");
    // The next sync cleans up; SIGTERM syncs the rest.
    cli_ok(&d, &["dir", "sync", &id]);
    assert_eq!(
        check_consistent(&s.disk_view(&id), 0),
        0,
        "temporaries left after a sync"
    );
    std::fs::write(dir.join("final"), b"synced at stop").unwrap();
    let ram = snapshot(&dir);
    assert!(d.terminate().success());
    assert_eq!(fs_type_at(&dir), None);
    assert_same(&ram, &snapshot(&dir), "after SIGTERM");
}

#[test]
fn sigterm_syncs_before_exit_and_a_reboot_restores_from_disk() {
    if !require_root() {
        return;
    }
    let s = Scratch::new("dirs-daemon", "stop");
    let dir = s.mkdir("data/state");
    std::fs::write(dir.join("a"), b"1").unwrap();
    let mut d = s.daemon(&[]);
    cli_ok(
        &d,
        &["dir", "add", dir.to_str().unwrap(), "--interval", "1h"],
    );
    std::fs::write(dir.join("at-stop"), b"written just before SIGTERM").unwrap();
    let status = d.terminate();
    assert!(status.success(), "{status}");
    assert_eq!(fs_type_at(&dir), None, "released at stop");
    assert_eq!(
        std::fs::read(dir.join("at-stop")).unwrap(),
        b"written just before SIGTERM"
    );
    assert!(d.log().contains("synced and released"), "{}", d.log());

    // Clean start: restored, no recovery copy.
    let mut d = s.daemon(&[]);
    assert_eq!(fs_type_at(&dir).as_deref(), Some("tmpfs"));
    let info = cli_json(&d, &["dir", "info", dir.to_str().unwrap(), "--json"]);
    assert_eq!(info["recovery_copies"], json!([]), "{info}");
    std::fs::write(dir.join("synced"), b"synced").unwrap();
    cli_ok(&d, &["dir", "sync", dir.to_str().unwrap()]);
    std::fs::write(dir.join("lost"), b"never synced").unwrap();

    // "Reboot": the daemon dies, every mount goes, /run is emptied.
    signal(d.pid(), libc::SIGKILL);
    d.terminate();
    s.unmount_all();
    std::fs::remove_dir_all(s.path("run")).unwrap();
    assert!(!dir.join("lost").exists());
    let d = s.daemon(&[]);
    assert_eq!(fs_type_at(&dir).as_deref(), Some("tmpfs"), "{}", d.log());
    assert_eq!(std::fs::read(dir.join("synced")).unwrap(), b"synced");
    assert!(!dir.join("lost").exists());
    let info = cli_json(&d, &["dir", "info", dir.to_str().unwrap(), "--json"]);
    assert_eq!(
        info["recovery_copies"],
        json!([]),
        "nothing in RAM survived a reboot: {info}"
    );
    d.wait_log("the restore", |l| {
        l.contains("restored into RAM from the on-disk copy")
    });
}

#[test]
fn usage_warnings_metrics_and_install_units() {
    if !require_root() {
        return;
    }
    let spec = Spec::load();
    let s = Scratch::new("dirs-daemon", "usage");
    let dir = s.mkdir("data/small");
    let d = s.daemon(&[]);
    let body = json!({"path": dir, "size_limit": "1M"}).to_string();
    let (st, text) = d.http("POST", "/v1/dirs", Some(&body));
    assert_eq!(st, 201, "{text}");
    let id = serde_json::from_str::<Value>(&text).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let get = || {
        let (st, text) = d.http("GET", &format!("/v1/dirs/{id}"), None);
        spec.check("GET", "/v1/dirs/{id}", st, &text);
        serde_json::from_str::<Value>(&text).unwrap()
    };
    assert_eq!(get()["usage_level"], "ok");

    std::fs::write(dir.join("fill"), random_bytes(850 << 10, 5)).unwrap();
    let v = get();
    assert_eq!(v["usage_level"], "warning", "{v}");
    assert!(v["usage_percent"].as_u64().unwrap() >= 80, "{v}");
    let out = cli_ok(&d, &["dir", "list"]);
    assert!(out.stdout.contains("warning"), "{out}");
    assert!(out.stdout.contains("% full"), "{out}");
    wait_until(
        "the 80% warning in the log",
        Duration::from_secs(60),
        || d.log().contains("RAM copy is over 80% full"),
    );
    std::fs::write(dir.join("more"), random_bytes(130 << 10, 6)).unwrap();
    assert_eq!(get()["usage_level"], "critical");
    let err = std::fs::write(dir.join("overflow"), random_bytes(1 << 20, 7)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(get()["usage_level"], "full");
    std::fs::remove_file(dir.join("overflow")).unwrap();
    // Raising the limit ends the warning.
    let out = cli_ok(&d, &["dir", "set", &id, "--size-limit", "8M"]);
    assert!(out.stdout.contains("limit 8 MiB"), "{out}");
    assert_eq!(get()["usage_level"], "ok");
    wait_until(
        "usage back to normal in the log",
        Duration::from_secs(60),
        || d.log().contains("RAM copy usage back to normal"),
    );
    let out = run(d.cli().args(["dir", "set", &id]));
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("nothing to change"), "{out}");

    // Metrics.
    cli_ok(&d, &["dir", "sync", &id]);
    let (_, text) = d.http("GET", "/metrics", None);
    let label = format!("{{dir=\"{}\"}}", dir.display());
    for want in [
        "ramd_dirs 1\n".to_string(),
        format!("ramd_dir_active{label} 1\n"),
        format!("ramd_dir_syncs_total{label} 1\n"),
        format!("ramd_dir_sync_failures_total{label} 0\n"),
        format!("ramd_dir_synced_files_total{label} 2\n"),
        format!("ramd_dir_ram_size_bytes{label} 8388608\n"),
        format!("ramd_dir_recovery_copies{label} 0\n"),
    ] {
        assert!(text.contains(&want), "want {want:?} in:\n{text}");
    }
    for want in [
        "ramd_dir_ram_usage_ratio",
        "ramd_dir_last_sync_timestamp_seconds",
        "ramd_dir_last_sync_duration_seconds",
        "ramd_dir_synced_bytes_total",
    ] {
        assert!(
            text.contains(&format!("{want}{label} ")),
            "want {want} in:\n{text}"
        );
    }
    let stats = cli_ok(&d, &["stats"]);
    assert!(stats.stdout.contains("DIRECTORY"), "{stats}");

    // install-units: --dry-run writes nothing; --dir writes the units with
    // this directory's mount in the ordering drop-in.
    let units = s.path("units");
    let out = cli_ok(
        &d,
        &[
            "install-units",
            "--dry-run",
            "--dir",
            units.to_str().unwrap(),
        ],
    );
    assert!(out.stdout.contains("would write"), "{out}");
    assert!(out.stdout.contains("Type=notify"), "{out}");
    assert!(!units.exists(), "--dry-run wrote files");
    let out = cli_ok(
        &d,
        &[
            "install-units",
            "--dir",
            units.to_str().unwrap(),
            "--bin",
            "/opt/ramd/ramd",
        ],
    );
    assert!(out.stdout.contains("systemctl daemon-reload"), "{out}");
    let service = std::fs::read_to_string(units.join("ramd.service")).unwrap();
    assert!(
        service.contains("ExecStart=/opt/ramd/ramd daemon"),
        "{service}"
    );
    let sleep = std::fs::read_to_string(units.join("ramd-sleep.service")).unwrap();
    assert!(
        sleep.contains("ExecStart=/opt/ramd/ramd dir sync --all"),
        "{sleep}"
    );
    let drop_in = std::fs::read_to_string(units.join("ramd.service.d/dirs.conf")).unwrap();
    let unit = ramd::cli::units::escape_path(&dir);
    assert!(
        drop_in.contains(&format!("After={unit}.mount\n")),
        "{drop_in}"
    );
    if let Ok(o) = try_run(tool("systemd-escape").arg("--path").arg(&dir), TOOL_TIMEOUT) {
        if o.status.success() {
            assert_eq!(o.stdout.trim(), unit, "systemd-escape disagrees");
        }
    }
}

/// POST /v1/dirs with `body`: (status, JSON answer).
fn post_dir(d: &Daemon, body: Value) -> (u16, Value) {
    let (st, text) = d.http("POST", "/v1/dirs", Some(&body.to_string()));
    (st, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Issue 15 item 6: system trees, shared scratch and home roots, a
/// directory with other filesystems mounted inside and anything in ramd's
/// own state or runtime directory are refused, with or without force, with
/// a message saying what to do instead.
#[test]
fn add_refuses_system_trees_shared_roots_mounts_inside_and_own_dirs() {
    if !require_root() {
        return;
    }
    let s = Scratch::new("dirs-daemon", "refuse-trees");
    let d = s.daemon(&[]);
    let refused = |path: &Path, want: &str| {
        for force in [false, true] {
            let (st, v) = post_dir(&d, json!({"path": path, "force": force}));
            assert_eq!(
                (st, v["error"]["code"].as_str()),
                (422, Some("dir_refused")),
                "{} force={force}: {v}",
                path.display()
            );
            let m = v["error"]["message"].as_str().unwrap();
            assert!(m.contains(want), "{}: want {want:?} in {m}", path.display());
        }
    };
    for (p, want) in [
        (
            "/tmp",
            "keep the subdirectory you need there in RAM instead",
        ),
        ("/var/tmp", "not even with --force"),
        ("/root", "/root/.cache"),
        ("/home", "subdirectory"),
        ("/srv", "subdirectory"),
        ("/etc", "system directory"),
        ("/", "system directory"),
        ("/usr/lib", "belongs to the operating system"),
    ] {
        if Path::new(p).is_dir() && std::fs::canonicalize(p).unwrap() == Path::new(p) {
            refused(Path::new(p), want);
        }
    }
    let out = run(d.cli().args(["dir", "add", "/tmp", "--force"]));
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("subdirectory"), "{out}");

    // Another filesystem mounted inside.
    let outer = s.mkdir("data/outer");
    let inner = s.mkdir("data/outer/sub/mnt");
    rustix::mount::mount(
        "ramd-test",
        &inner,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .unwrap();
    refused(&outer, &format!("{} (tmpfs)", inner.display()));

    // ramd's own state and runtime directories, not only their dirs/.
    refused(&s.mkdir("state/drives"), "ramd's own state directory");
    refused(&s.mkdir("run/other"), "ramd's own runtime directory");
    assert_eq!(fs_type_at(&outer), None, "nothing mounted by a refusal");
    let (_, v) = d.http("GET", "/v1/dirs", None);
    assert_eq!(
        serde_json::from_str::<Value>(&v).unwrap()["dirs"],
        json!([])
    );
}

/// Issue 15 item 6: a directory other processes use (working directory,
/// open file) is refused, naming them as "pid (comm)", unless forced.
#[test]
fn add_refuses_a_directory_other_processes_use_unless_forced() {
    if !require_root() {
        return;
    }
    let s = Scratch::new("dirs-daemon", "in-use");
    let dir = s.mkdir("data/busy");
    std::fs::write(dir.join("log"), b"line\n").unwrap();
    let d = s.daemon(&[]);
    let cwd_holder = KillOnDrop(
        std::process::Command::new("sleep")
            .arg("600")
            .current_dir(&dir)
            .spawn()
            .unwrap(),
    );
    let fd_holder = KillOnDrop(
        std::process::Command::new("tail")
            .arg("-f")
            .arg(dir.join("log"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (cwd_pid, fd_pid) = (cwd_holder.0.id(), fd_holder.0.id());
    // tail opens its file right after it starts.
    wait_until("tail has the file open", WAIT_TIMEOUT, || {
        std::fs::read_dir(format!("/proc/{fd_pid}/fd"))
            .unwrap()
            .any(|e| std::fs::read_link(e.unwrap().path()).ok() == Some(dir.join("log")))
    });
    let (st, v) = post_dir(&d, json!({"path": dir}));
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (409, Some("dir_busy")),
        "{v}"
    );
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains(&format!("{cwd_pid} (sleep): cwd {}", dir.display())),
        "{m}"
    );
    assert!(m.contains(&format!("{fd_pid} (tail): fd ")), "{m}");
    assert!(m.contains("--force"), "{m}");
    assert_eq!(fs_type_at(&dir), None, "a refused add mounts nothing");
    let out = run(d.cli().args(["dir", "add", dir.to_str().unwrap()]));
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("(sleep): cwd"), "{out}");

    // Forced: added, and the log says who was using it.
    let out = cli_ok(&d, &["dir", "add", dir.to_str().unwrap(), "--force"]);
    assert!(out.stdout.contains("is in RAM"), "{out}");
    assert_eq!(fs_type_at(&dir).as_deref(), Some("tmpfs"));
    d.wait_log("the forced add", |l| l.contains("added with --force"));
    drop(fd_holder);
    drop(cwd_holder);
    cli_ok(&d, &["dir", "remove", dir.to_str().unwrap()]);
    // Nobody left: no force needed.
    let (st, v) = post_dir(&d, json!({"path": dir}));
    assert_eq!(st, 201, "{v}");
    cli_ok(&d, &["dir", "remove", dir.to_str().unwrap()]);
}

/// Issue 15 item 6: the content must fit at most half of the memory
/// available, refused before anything is copied, with the figures.
#[test]
fn add_refuses_content_over_half_of_available_memory_before_copying() {
    if !require_root() {
        return;
    }
    let s = Scratch::new("dirs-daemon", "too-big");
    let dir = s.mkdir("data/big");
    let avail = ramd::dirsync::guard::mem_available_bytes();
    // Allocated (unwritten) blocks count like data and cost no time.
    let len = avail / 2 + (1 << 30);
    let f = File::create(dir.join("big")).unwrap();
    // SAFETY: fallocate on an open file descriptor we own.
    let rc = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, len as i64) };
    if rc != 0 {
        eprintln!(
            "skipped: fallocate of {len} bytes failed: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    drop(f);
    let d = s.daemon(&[]);
    let (st, v) = post_dir(&d, json!({"path": dir}));
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (507, Some("ram_full")),
        "{v}"
    );
    let m = v["error"]["message"].as_str().unwrap();
    for want in [
        "more than a RAM copy may take",
        "50% of the memory available",
        "overlay",
    ] {
        assert!(m.contains(want), "want {want:?} in {m}");
    }
    assert_eq!(fs_type_at(&dir), None, "nothing was mounted or copied");
    assert!(
        std::fs::read_dir(s.path("run/dirs"))
            .map(|mut r| r.next().is_none())
            .unwrap_or(true),
        "no runtime directory was made"
    );
    std::fs::remove_file(dir.join("big")).unwrap();
}

/// Issue 15 item 6: entries a program that had the directory open before
/// it went into RAM writes to the on-disk copy below it are never deleted
/// by a sync: kept, and reported as conflicts (API, CLI, log).
#[test]
fn sync_keeps_entries_written_to_the_disk_copy_after_add() {
    if !require_root() {
        return;
    }
    let s = Scratch::new("dirs-daemon", "conflicts");
    let dir = s.mkdir("data/shared");
    std::fs::write(dir.join("kept"), b"k").unwrap();
    std::fs::write(dir.join("to-delete"), b"d").unwrap();
    let d = s.daemon(&[]);
    // This process holds the directory and a file in it (as a program with
    // its working directory there would), so the add needs force.
    let old_handle = File::open(&dir).unwrap();
    let mut old_file = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("kept"))
        .unwrap();
    let (st, v) = post_dir(&d, json!({"path": dir, "force": true}));
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    // Through its old handles the program writes to the disk copy.
    let fd = rustix::fs::openat(
        &old_handle,
        "written-on-disk",
        rustix::fs::OFlags::CREATE | rustix::fs::OFlags::WRONLY,
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .unwrap();
    rustix::io::write(&fd, b"behind the RAM copy").unwrap();
    drop(fd);
    rustix::fs::mkdirat(
        &old_handle,
        "dir-on-disk",
        rustix::fs::Mode::from_raw_mode(0o755),
    )
    .unwrap();
    old_file.write_all(b" + written behind").unwrap();
    assert!(!dir.join("written-on-disk").exists(), "PATH shows RAM");
    assert_eq!(
        std::fs::read(dir.join("kept")).unwrap(),
        b"k",
        "RAM is stale"
    );
    // Meanwhile in RAM: a deletion and a new file.
    std::fs::remove_file(dir.join("to-delete")).unwrap();
    std::fs::write(dir.join("new-in-ram"), b"n").unwrap();

    let (st, text) = d.http("POST", &format!("/v1/dirs/{id}/sync"), None);
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    Spec::load().check("POST", "/v1/dirs/{id}/sync", 200, &text);
    let mut conflicts: Vec<String> = v["report"]["conflicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    conflicts.sort();
    assert_eq!(conflicts.len(), 3, "{v}");
    let aside = conflicts[1].clone();
    assert_eq!(
        (conflicts[0].as_str(), conflicts[2].as_str()),
        ("dir-on-disk", "written-on-disk"),
        "{v}"
    );
    assert!(aside.starts_with("kept.ramd-conflict-"), "{v}");
    assert_eq!(v["report"]["entries_deleted"], 1, "{v}");
    let disk = s.disk_view(&id);
    assert_eq!(
        std::fs::read(disk.join("written-on-disk")).unwrap(),
        b"behind the RAM copy"
    );
    assert!(disk.join("dir-on-disk").is_dir());
    assert!(
        !disk.join("to-delete").exists(),
        "deleted in RAM: deleted on disk"
    );
    assert_eq!(std::fs::read(disk.join("new-in-ram")).unwrap(), b"n");
    // The file RAM also has: RAM's version at its name, the one written
    // behind kept aside, where the program's fd still writes.
    assert_eq!(std::fs::read(disk.join("kept")).unwrap(), b"k");
    old_file.write_all(b" + more").unwrap();
    assert_eq!(
        std::fs::read(disk.join(&aside)).unwrap(),
        b"k + written behind + more"
    );
    d.wait_log("the conflict", |l| l.contains("kept on disk, not in RAM"));
    // Reported at every sync until resolved, also by the CLI; nothing new
    // is set aside.
    let out = cli_ok(&d, &["dir", "sync", dir.to_str().unwrap()]);
    assert!(out.stdout.contains("3 kept on disk (conflict)"), "{out}");
    assert!(out.stderr.contains("behind the RAM copy"), "{out}");
    assert!(out.stderr.contains("written-on-disk"), "{out}");
    let out = cli_ok(&d, &["dir", "list"]);
    assert!(
        out.stdout
            .contains("3 entries written to the on-disk copy behind the RAM copy kept there"),
        "{out}"
    );
    drop(old_handle);
    drop(old_file);
    // After remove, PATH shows both sides' work.
    cli_ok(&d, &["dir", "remove", dir.to_str().unwrap()]);
    assert_eq!(
        std::fs::read(dir.join("written-on-disk")).unwrap(),
        b"behind the RAM copy"
    );
    assert!(dir.join("dir-on-disk").is_dir() && dir.join("new-in-ram").exists());
    assert!(!dir.join("to-delete").exists());
    assert_eq!(std::fs::read(dir.join("kept")).unwrap(), b"k");
    assert_eq!(
        std::fs::read(dir.join(&aside)).unwrap(),
        b"k + written behind + more"
    );
}

/// Issue 15 item 6: `dir remove --force` while a writer never stops:
/// PATH is frozen, synced and detached at once (new opens go to the disk
/// copy), the writer is named, and what it writes to the RAM copy after
/// the final sync is saved as a recovery copy when it closes: nothing lost.
#[test]
fn remove_force_with_a_writer_that_never_stops_loses_nothing() {
    if !require_root() {
        return;
    }
    let s = Scratch::new("dirs-daemon", "drain");
    let dir = s.mkdir("data/busy");
    std::fs::write(dir.join("a"), b"a").unwrap();
    let d = s.daemon(&[]);
    let (st, v) = post_dir(&d, json!({"path": dir}));
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    let mut writer = File::create(dir.join("log")).unwrap();
    writer.write_all(b"before remove\n").unwrap();
    let me = std::process::id();

    let (st, text) = d.http("DELETE", &format!("/v1/dirs/{id}"), None);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (409, Some("dir_busy")),
        "{v}"
    );
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains(&format!("{me} (")), "names the writer: {m}");
    assert!(m.contains("--force"), "{m}");

    let (st, text) = d.http("DELETE", &format!("/v1/dirs/{id}?force=true"), None);
    assert_eq!(st, 200, "{text}");
    Spec::load().check("DELETE", "/v1/dirs/{id}", 200, &text);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["result"]["outcome"], "released", "{v}");
    let still = v["result"]["still_open"].to_string();
    assert!(still.contains(&format!("{me} (")), "{v}");
    assert!(still.contains("/log"), "{v}");
    let kept = PathBuf::from(v["result"]["kept_until_closed"].as_str().unwrap());
    assert!(kept.starts_with(s.path("run/dirs")), "{v}");
    // PATH is the disk copy, with everything up to the final sync.
    assert_eq!(fs_type_at(&dir), None);
    assert_eq!(std::fs::read(dir.join("log")).unwrap(), b"before remove\n");
    std::fs::write(dir.join("opened-after"), b"on disk").unwrap();
    // The writer goes on (into the detached RAM copy), then stops.
    writer.write_all(b"after remove\n").unwrap();
    drop(writer);
    let rec = s.path(&format!("state/dirs/{id}/recovery"));
    wait_until("the late writes are saved", Duration::from_secs(30), || {
        recovery_files(&rec).iter().any(|f| {
            f.ends_with("log") && std::fs::read(f).unwrap() == b"before remove\nafter remove\n"
        })
    });
    wait_until("the RAM copy is freed", WAIT_TIMEOUT, || {
        !s.path(&format!("run/dirs/{id}")).exists()
    });
    d.wait_log("the recovery copy", |l| {
        l.contains("saved as a recovery copy")
    });
    // Nothing on disk was overwritten by the late writes.
    assert_eq!(std::fs::read(dir.join("log")).unwrap(), b"before remove\n");
    assert_eq!(std::fs::read(dir.join("opened-after")).unwrap(), b"on disk");
    assert_eq!(fs_type_at(&kept), None);
}

/// Files in the recovery copies under `rec`.
fn recovery_files(rec: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(rec)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|c| std::fs::read_dir(c.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .collect()
}
