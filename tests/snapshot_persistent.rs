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

use common::garage::{
    add_remote, assert_same, cli, creds_file, json, push, read_drive, serial, wait_job,
    write_drive, Garage,
};
use common::mounts::{require_root, Scratch};
use common::openapi::Spec;
use common::{random_bytes, require, run, tool, wait_until, Daemon};

const MIB: usize = 1 << 20;

/// A daemon with no drive (its own state directory).
fn empty_daemon(extra: &[&str]) -> Daemon {
    let mut args = vec!["serve".to_owned(), "--no-default-drive".to_owned()];
    args.extend(extra.iter().map(|s| s.to_string()));
    Daemon::launch(&args, &[])
}

/// The names of `d`'s drives.
fn drive_names(d: &Daemon) -> Vec<String> {
    let l = json(&run(d.cli().args(["list", "--json"])).ok());
    l["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap().to_owned())
        .collect()
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
    if !require(&["nbdcopy"]) {
        return;
    }
    let Some(g) = Garage::start() else { return };
    let a = Daemon::start(&["db=256M"]);
    let creds = creds_file(a.dir(), &g, None);
    add_remote(&a, &g, "g", &g.bucket, &creds);
    let data = random_bytes(256 * MIB, 80);
    write_drive(&a, "db", &data);
    push(&a, &g, "db", "g");

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
    let (code, job) = spec.call(
        &b,
        "POST",
        "/v1/snapshots/restore",
        "/v1/snapshots/restore",
        Some(r#"{"remote": "g", "drive": "db", "as": "viaapi", "persist": true, "sync_interval": "10s"}"#),
    );
    assert_eq!(code, 202, "{job}");
    let done = wait_job(&b, job["id"].as_u64().unwrap());
    assert_eq!(done["restore"]["persistent"], true, "{done}");
    let job_path = format!("/v1/snapshots/jobs/{}", job["id"]);
    spec.call(&b, "GET", "/v1/snapshots/jobs/{id}", &job_path, None);
    let info = json(&run(b.cli().args(["info", "viaapi", "--json"])).ok());
    assert_eq!(info["persist"]["sync_interval_ms"], 10_000, "{info}");
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
    let info = json(&run(b.cli().args(["info", "db", "--json"])).ok());
    assert_eq!(info["kind"], "persistent", "{info}");
    assert_eq!(info["state"], "ready", "{info}");
    assert_eq!(info["persist"]["durability"], "flush", "{info}");
    assert_same(
        &read_drive(&b, "db"),
        &data,
        "the restored persistent drive",
    );
    assert_eq!(drives_dir_entries(&b), vec!["db".to_owned()]);

    // A restart loads it from its state directory (no remote involved).
    b.terminate();
    b.restart();
    wait_until("db to load", Duration::from_secs(120), || {
        json(&run(b.cli().args(["info", "db", "--json"])).ok())["state"] == "ready"
    });
    assert_same(
        &read_drive(&b, "db"),
        &data,
        "the persistent drive after a restart",
    );

    // kill -9 in the middle of a restore into a persistent drive.
    let job = json(
        &cli(
            &b,
            &g,
            &[
                "restore",
                "db",
                "--from",
                "g",
                "--persist",
                "--as",
                "db2",
                "--no-wait",
                "--json",
            ],
        )
        .ok(),
    );
    let id = job["id"].as_u64().unwrap();
    let staged = b.state_dir().join("drives/.restoring-db2");
    wait_until("the restore to start", Duration::from_secs(60), || {
        staged.exists()
    });
    let (_, body) = b.http("GET", &format!("/v1/snapshots/jobs/{id}"), None);
    let j: serde_json::Value = serde_json::from_str(&body).unwrap();
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
    wait_until("db to load", Duration::from_secs(120), || {
        json(&run(b.cli().args(["info", "db", "--json"])).ok())["state"] == "ready"
    });
    assert_eq!(drive_names(&b), vec!["db".to_owned()]);
    assert_eq!(drives_dir_entries(&b), vec!["db".to_owned()]);
    assert!(
        b.log()
            .contains("a restore from a snapshot that did not finish"),
        "{}",
        b.log()
    );
    // The next restore of that name works.
    cli(
        &b,
        &g,
        &["restore", "db", "--from", "g", "--persist", "--as", "db2"],
    )
    .ok();
    assert_same(&read_drive(&b, "db2"), &data, "the restore after the crash");
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
    if !require(&["nbdcopy"]) {
        return;
    }
    let Some(g) = Garage::start() else { return };
    let a = Daemon::start(&["db=32M"]);
    let creds = creds_file(a.dir(), &g, None);
    add_remote(&a, &g, "g", &g.bucket, &creds);
    let data = random_bytes(32 * MIB, 90);
    write_drive(&a, "db", &data);
    push(&a, &g, "db", "g");

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ramd.toml");
    std::fs::write(
        &config,
        format!(
            "[[remote]]\nname = \"g\"\nurl = \"s3://{}/ramd\"\nendpoint = \"{}\"\nregion = \"{}\"\ncredentials_file = \"{}\"\n\n[[drive]]\nname = \"db\"\nsize = \"32M\"\npersist = true\nrestore_from = \"g\"\n",
            g.bucket,
            g.endpoint,
            g.region,
            creds.display()
        ),
    )
    .unwrap();
    let mut b = Daemon::launch(
        &[
            "serve".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        &[],
    );
    let ready = || json(&run(b.cli().args(["info", "db", "--json"])).ok())["state"] == "ready";
    wait_until("db to load", Duration::from_secs(120), ready);
    assert_same(
        &read_drive(&b, "db"),
        &data,
        "restore_from into a persistent drive",
    );
    let info = json(&run(b.cli().args(["info", "db", "--json"])).ok());
    assert_eq!(info["kind"], "persistent", "{info}");
    // The second start finds its state directory: no restore again.
    b.terminate();
    b.restart();
    wait_until("db to load again", Duration::from_secs(120), || {
        json(&run(b.cli().args(["info", "db", "--json"])).ok())["state"] == "ready"
    });
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
    if !require(&["nbdcopy", "nbdinfo", "mount"]) || !require_root() {
        return;
    }
    let Some(g) = Garage::start() else { return };
    let a = Daemon::start(&["db=64M"]);
    let creds = creds_file(a.dir(), &g, None);
    add_remote(&a, &g, "g", &g.bucket, &creds);
    let data = random_bytes(64 * MIB, 100);
    write_drive(&a, "db", &data);
    push(&a, &g, "db", "g");

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
    let other = random_bytes(8 * MIB, 101);
    write_drive(&b, "other", &other);

    let job = json(
        &cli(
            &b,
            &g,
            &[
                "restore",
                "db",
                "--from",
                "g",
                "--persist",
                "--no-wait",
                "--json",
            ],
        )
        .ok(),
    );
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
    cli(&b, &g, &["restore", "db", "--from", "g", "--as", "inram"]).ok();
    assert_same(&read_drive(&b, "inram"), &data, "the restore into RAM");
    drop(b);
    drop(scratch);
}
