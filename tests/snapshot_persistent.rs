//! Snapshots restored into persistent drives (issue 18: "into a new drive
//! (or a persistent drive's state dir)"), with a real daemon, a
//! single-node Garage and nbdcopy:
//!
//! - `ramd restore DRIVE --from R --persist` makes a persistent drive
//!   whose state directory holds the snapshot; after a restart the drive
//!   loads from its state directory, byte for byte;
//! - kill -9 in the middle of such a restore: no drive appears, not then
//!   and not after the restart (the staged copy is removed), and the next
//!   restore of that name works;
//! - `restore_from` for a declared persistent drive whose state directory
//!   is missing: restored once, then loaded from disk at the next start;
//! - a full disk (the state directory on a small tmpfs): the restore fails
//!   with ENOSPC named, nothing of it is left or served, and the daemon
//!   keeps serving its other drive and can restore into RAM.

mod common;

use std::time::Duration;

use common::garage::{add_remote, assert_same, cli, job, read_drive, serial, wait_job};
use common::mounts::{require_root, Scratch};
use common::openapi::Spec;
use common::snapshots::{
    config_daemon, drive_names, empty_daemon, garage_and_daemon, info, push_random, remote_toml,
    restore_matches, start_restore, write_random,
};
use common::{run, tool, wait_until, Daemon};

const MIB: usize = 1 << 20;

/// Waits (`what` names the wait) until `d`'s drive `name` is ready.
#[track_caller]
fn wait_ready(d: &Daemon, name: &str, what: &str) {
    wait_until(what, Duration::from_secs(120), || {
        info(d, name)["state"] == "ready"
    });
}

/// The entries of `STATE/drives`.
fn drives_dir_entries(d: &Daemon) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d.state_dir().join("drives"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn restore_into_a_persistent_drive_survives_restarts_and_a_crash_leaves_nothing() {
    let _serial = serial();
    let Some((g, a, creds)) = garage_and_daemon(&["nbdcopy"], &["db=256M"]) else {
        return;
    };
    let data = push_random(&a, &g, "db", 256 * MIB, 80);

    let mut b = empty_daemon(&[]);
    add_remote(&b, &g, "g", &g.bucket, &creds);
    let out = cli(
        &b,
        &g,
        &[
            "restore",
            "db",
            "--from",
            "g",
            "--persist",
            "--durability",
            "flush",
        ],
    )
    .ok();
    assert!(out.stdout.contains("persistent"), "{out}");
    // Through the API, checked against docs/openapi.yaml (a name whose
    // state directory holds a drive already is refused).
    let spec = Spec::load();
    let (code, accepted) = spec.call(
        &b,
        "POST",
        "/v1/snapshots/restore",
        "/v1/snapshots/restore",
        Some(r#"{"remote": "g", "drive": "db", "as": "viaapi", "persist": true, "sync_interval": "10s"}"#),
    );
    assert_eq!(code, 202, "{accepted}");
    let done = wait_job(&b, accepted["id"].as_u64().unwrap());
    assert_eq!(done["restore"]["persistent"], true, "{done}");
    let job_path = format!("/v1/snapshots/jobs/{}", accepted["id"]);
    spec.call(&b, "GET", "/v1/snapshots/jobs/{id}", &job_path, None);
    let viaapi = info(&b, "viaapi");
    assert_eq!(viaapi["persist"]["sync_interval_ms"], 10_000, "{viaapi}");
    run(b.cli().args(["delete", "viaapi", "--keep-data"])).ok();
    let (code, e) = spec.call(
        &b,
        "POST",
        "/v1/snapshots/restore",
        "/v1/snapshots/restore",
        Some(r#"{"remote": "g", "drive": "db", "as": "viaapi", "persist": true}"#),
    );
    assert_eq!(code, 409, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not empty"),
        "{e}"
    );
    let (code, e) = spec.call(
        &b,
        "POST",
        "/v1/snapshots/restore",
        "/v1/snapshots/restore",
        Some(r#"{"remote": "g", "drive": "db", "as": "x", "durability": "flush"}"#),
    );
    assert_eq!(code, 422, "{e}");
    std::fs::remove_dir_all(b.state_dir().join("drives/viaapi")).unwrap();
    let db = info(&b, "db");
    assert_eq!(db["kind"], "persistent", "{db}");
    assert_eq!(db["state"], "ready", "{db}");
    assert_eq!(db["persist"]["durability"], "flush", "{db}");
    assert_same(
        &read_drive(&b, "db"),
        &data,
        "the restored persistent drive",
    );
    assert_eq!(drives_dir_entries(&b), vec!["db".to_owned()]);

    // A restart loads it from its state directory (no remote involved).
    b.terminate();
    b.restart();
    wait_ready(&b, "db", "db to load");
    assert_same(
        &read_drive(&b, "db"),
        &data,
        "the persistent drive after a restart",
    );

    // kill -9 in the middle of a restore into a persistent drive.
    let started = start_restore(&b, &g, &["db", "--from", "g", "--persist", "--as", "db2"]);
    let id = started["id"].as_u64().unwrap();
    let staged = b.state_dir().join("drives/.restoring-db2");
    wait_until("the restore to start", Duration::from_secs(60), || {
        staged.exists()
    });
    let j = job(&b, id);
    assert_eq!(
        j["state"], "running",
        "the restore ended before the kill: {j}"
    );
    b.kill9();
    assert!(
        !b.state_dir().join("drives/db2").exists(),
        "a restore cut short left a state directory that would load as a drive"
    );
    b.restart();
    wait_ready(&b, "db", "db to load");
    assert_eq!(drive_names(&b), vec!["db".to_owned()]);
    assert_eq!(drives_dir_entries(&b), vec!["db".to_owned()]);
    b.wait_log("the unfinished restore noticed", |l| {
        l.contains("a restore from a snapshot that did not finish")
    });
    // The next restore of that name works.
    restore_matches(
        &b,
        &g,
        &["db", "--from", "g", "--persist", "--as", "db2"],
        &data,
        "the restore after the crash",
    );
    // Its state directory holds a drive now: another restore into it is
    // refused before anything is fetched.
    run(b.cli().args(["delete", "db2", "--keep-data"])).ok();
    let out = cli(
        &b,
        &g,
        &["restore", "db", "--from", "g", "--persist", "--as", "db2"],
    )
    .failed();
    assert!(out.stderr.contains("not empty"), "{out}");
}

#[test]
fn restore_from_fills_a_missing_persistent_drive_once() {
    let _serial = serial();
    let Some((g, a, creds)) = garage_and_daemon(&["nbdcopy"], &["db=32M"]) else {
        return;
    };
    let data = push_random(&a, &g, "db", 32 * MIB, 90);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ramd.toml");
    std::fs::write(
        &config,
        format!(
            "{}\n[[drive]]\nname = \"db\"\nsize = \"32M\"\npersist = true\nrestore_from = \"g\"\n",
            remote_toml(&g, "ramd", Some(&creds))
        ),
    )
    .unwrap();
    let mut b = config_daemon(&config, &[]);
    wait_ready(&b, "db", "db to load");
    assert_same(
        &read_drive(&b, "db"),
        &data,
        "restore_from into a persistent drive",
    );
    let db = info(&b, "db");
    assert_eq!(db["kind"], "persistent", "{db}");
    // The second start finds its state directory: no restore again.
    b.terminate();
    b.restart();
    wait_ready(&b, "db", "db to load again");
    assert_same(
        &read_drive(&b, "db"),
        &data,
        "the drive at the second start",
    );
    let restores = b
        .log()
        .matches("restore_from: restoring the persistent drive's state directory")
        .count();
    assert_eq!(restores, 1, "{}", b.log());
}

#[test]
fn a_full_disk_during_a_restore_leaves_nothing_and_the_daemon_serves_on() {
    let _serial = serial();
    if !require_root() {
        return;
    }
    let Some((g, a, creds)) = garage_and_daemon(&["nbdcopy", "nbdinfo", "mount"], &["db=64M"])
    else {
        return;
    };
    let data = push_random(&a, &g, "db", 64 * MIB, 100);

    // The state directory on a 40 MiB tmpfs: the 64 MiB drive cannot fit.
    let scratch = Scratch::new("snapshot", "full-disk");
    let state = scratch.mkdir("state");
    run(tool("mount")
        .args(["-t", "tmpfs", "-o", "size=40m,mode=0700", "tmpfs"])
        .arg(&state))
    .ok();
    let b = empty_daemon(&["--state-dir", state.to_str().unwrap()]);
    add_remote(&b, &g, "g", &g.bucket, &creds);
    run(b.cli().args(["create", "other", "--size", "8M"])).ok();
    let other = write_random(&b, "other", 8 * MIB, 101);

    let job = start_restore(&b, &g, &["db", "--from", "g", "--persist"]);
    let done = wait_job(&b, job["id"].as_u64().unwrap());
    assert_eq!(done["state"], "failed", "{done}");
    let error = done["error"].as_str().unwrap();
    assert!(
        error.contains("No space left on device")
            && error.contains(&state.join("drives/db").display().to_string())
            && error.contains("nothing was kept"),
        "{error}"
    );
    // Nothing of it is left, listed or served.
    assert!(!drive_names(&b).contains(&"db".to_owned()));
    assert!(
        drives_dir_entries(&b).is_empty(),
        "{:?}",
        drives_dir_entries(&b)
    );
    let out = run(tool("nbdinfo").arg(b.uri("db")));
    assert_ne!(out.code(), 0, "{out}");
    // The daemon serves on: its other drive, and a restore into RAM.
    assert_same(&read_drive(&b, "other"), &other, "the other drive");
    restore_matches(
        &b,
        &g,
        &["db", "--from", "g", "--as", "inram"],
        &data,
        "the restore into RAM",
    );
    drop(b);
    drop(scratch);
}

/// A drive encrypted at rest leaves the host only encrypted: a push to a
/// remote without a key is refused (saying how to add one), a push to a
/// remote with one is encrypted without `--encrypt` (a remote on the same
/// bucket without the key cannot restore it; with it, the restore is byte
/// for byte).
#[test]
fn an_encrypted_drives_snapshots_are_encrypted() {
    let _serial = serial();
    let Some((g, a, creds)) = garage_and_daemon(&["nbdcopy"], &[]) else {
        return;
    };
    let key = a.dir().join("drive.key");
    std::fs::write(&key, common::random_bytes(32, 7)).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let k = key.to_str().unwrap();
    run(a.cli().args([
        "create",
        "enc",
        "--size",
        "8M",
        "--persist",
        "--encrypt",
        "--key-file",
        k,
    ]))
    .ok();
    let data = write_random(&a, "enc", 8 * MIB, 95);
    let refused = cli(&a, &g, &["snapshot", "create", "enc", "--to", "g"]).failed();
    assert!(
        refused.stderr.contains("encrypted at rest")
            && refused.stderr.contains("--encrypt-key-file"),
        "{refused}"
    );
    let snap_key = a.dir().join("snapshots.key");
    std::fs::write(&snap_key, common::random_bytes(32, 8)).unwrap();
    std::fs::set_permissions(
        &snap_key,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let url = format!("s3://{}/ramd", g.bucket);
    let remote = |name: &str, key: Option<&std::path::Path>| {
        let mut args = vec![
            "remote".to_owned(),
            "add".into(),
            name.into(),
            url.clone(),
            "--endpoint".into(),
            g.endpoint.clone(),
            "--region".into(),
            g.region.clone(),
            "--credentials-file".into(),
            creds.display().to_string(),
        ];
        if let Some(key) = key {
            args.extend(["--encrypt-key-file".into(), key.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&a, &g, &args).ok();
    };
    remote("k", Some(&snap_key));
    common::garage::push(&a, &g, "enc", "k");
    // The same objects through a remote without the key: not readable.
    remote("nokey", None);
    let out = cli(
        &a,
        &g,
        &["restore", "enc", "--from", "nokey", "--as", "plain"],
    )
    .failed();
    assert!(
        out.stderr.contains("key") || out.stderr.contains("encrypt"),
        "{out}"
    );
    assert!(!drive_names(&a).contains(&"plain".to_owned()));
    restore_matches(
        &a,
        &g,
        &["enc", "--from", "k", "--as", "back"],
        &data,
        "encrypted push",
    );
}
