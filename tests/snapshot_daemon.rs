//! Drive snapshots through the daemon, end to end: a real `ramd daemon`,
//! a single-node Garage on loopback (tests/common/garage.rs), the `ramd`
//! CLI, and nbdcopy writing and reading the drives.
//!
//! - a snapshot restores byte for byte into a second daemon with its own
//!   state directory; an incremental push after changing 1% of the drive
//!   uploads about 1%;
//! - writes made after the push started are not in the snapshot;
//! - kill -9 in the middle of a push: the previous snapshot restores
//!   exactly, and the next push finishes (skipping what made it);
//! - Garage stopped mid-push: the push fails naming the remote, the drive
//!   keeps serving, and once Garage is back a push succeeds;
//! - wrong secret, missing bucket, a credentials file others may read:
//!   refused with a precise message; the secret is never in the daemon's
//!   log nor in any API or CLI output;
//! - scheduled pushes show in /metrics, and `restore_from` fills a drive
//!   of a new daemon before it is served.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::garage::{
    add_remote, assert_same, cli, creds_file, json, push, read_drive, serial, start_push, wait_job,
    write_drive,
};
use common::snapshots::{
    assert_metrics_show, config_daemon, empty_daemon, garage_and_daemon, kill9_mid_push, metric,
    push_random, remote_toml, restore_matches, start_garage, write_random,
};
use common::{random_bytes, run, wait_until, Daemon};

const MIB: usize = 1 << 20;

#[test]
fn snapshot_restores_exactly_and_pushes_are_incremental_and_point_in_time() {
    let _serial = serial();
    let Some((g, a, creds)) = garage_and_daemon(&["nbdcopy"], &["db=100M"]) else {
        return;
    };
    let listed = json(&cli(&a, &g, &["remote", "list", "--json"]).ok());
    assert_eq!(
        listed["remotes"][0]["credentials"],
        format!("file {}", creds.display())
    );

    let mut data = write_random(&a, "db", 100 * MIB, 1);
    let first = push(&a, &g, "db", "g");
    let full = first["push"]["bytes_uploaded"].as_u64().unwrap();
    assert!(full >= 100 * MIB as u64, "{first}");

    // 1% of the drive changes: about 1% goes up (its chunks + manifest).
    let changed = random_bytes(MIB, 2);
    data[10 * MIB..11 * MIB].copy_from_slice(&changed);
    write_drive(&a, "db", &data);
    let second = push(&a, &g, "db", "g");
    let inc = second["push"]["bytes_uploaded"].as_u64().unwrap();
    assert!(
        inc >= MIB as u64 && inc < 3 * MIB as u64,
        "incremental push uploaded {inc} bytes: {second}"
    );
    let chunk = listed["remotes"][0]["chunk_bytes"].as_u64().unwrap();
    assert_eq!(
        second["push"]["chunks_uploaded"].as_u64().unwrap(),
        (MIB as u64).div_ceil(chunk),
        "{second}"
    );

    // Point in time: once the push has started (the command returned),
    // what is written is not in the snapshot.
    let job = start_push(&a, &g, "db", "g");
    write_drive(&a, "db", &random_bytes(100 * MIB, 3));
    let third = wait_job(&a, job["id"].as_u64().unwrap());
    assert_eq!(third["state"], "done", "{third}");
    let third_id = third["push"]["snapshot"].as_str().unwrap().to_owned();

    // A second daemon, its own state directory, restores it exactly.
    let b = empty_daemon(&[]);
    add_remote(&b, &g, "g", &g.bucket, &creds);
    let snaps = json(
        &cli(
            &b,
            &g,
            &["snapshot", "list", "db", "--remote", "g", "--json"],
        )
        .ok(),
    );
    assert_eq!(snaps["snapshots"].as_array().unwrap().len(), 3, "{snaps}");
    let id = third_id.split('/').nth(1).unwrap();
    restore_matches(
        &b,
        &g,
        &["db", "--from", "g", "--snapshot", id, "--as", "copy"],
        &data,
        "restored point-in-time snapshot",
    );
    // Without --snapshot: the newest.
    restore_matches(
        &b,
        &g,
        &["db", "--from", "g"],
        &data,
        "restored newest snapshot",
    );
    // The name is taken now: refused, nothing changes.
    let again = cli(&b, &g, &["restore", "db", "--from", "g"]).failed();
    assert!(again.stderr.contains("already exists"), "{again}");

    for d in [&a, &b] {
        assert!(
            !d.log().contains(&g.secret),
            "the secret is in the daemon log"
        );
        let (_, metrics) = d.http("GET", "/metrics", None);
        assert!(!metrics.contains(&g.secret));
    }
    let (_, m) = a.http("GET", "/metrics", None);
    assert!(
        m.contains("ramd_snapshot_pushes_total{drive=\"db\",remote=\"g\"} 3"),
        "{m}"
    );
}

#[test]
fn kill9_mid_push_keeps_the_previous_snapshot_and_the_next_push_resumes() {
    let _serial = serial();
    let Some((g, mut a, _creds)) = garage_and_daemon(&["nbdcopy"], &["big=384M"]) else {
        return;
    };
    let old = push_random(&a, &g, "big", 8 * MIB, 10);

    let new = write_random(&a, "big", 384 * MIB, 11);
    // Some chunks up, not all: then the crash.
    kill9_mid_push(&mut a, &g, "big");
    a.restart();

    // The remote lists only the complete snapshot; it restores exactly.
    let snaps = json(
        &cli(
            &a,
            &g,
            &["snapshot", "list", "big", "--remote", "g", "--json"],
        )
        .ok(),
    );
    assert_eq!(snaps["snapshots"].as_array().unwrap().len(), 1, "{snaps}");
    // (The restarted daemon made an empty "big" from its --drive flag.)
    let mut want = old.clone();
    want.resize(384 * MIB, 0);
    restore_matches(
        &a,
        &g,
        &["big", "--from", "g", "--as", "before"],
        &want,
        "the snapshot before the crash",
    );

    // The next push finishes, skipping the chunks the killed one sent.
    write_drive(&a, "big", &new);
    let next = push(&a, &g, "big", "g");
    assert!(
        next["push"]["chunks_skipped"].as_u64().unwrap() > 0,
        "the push did not resume: {next}"
    );
}

#[test]
fn a_remote_going_down_fails_the_push_but_not_the_drive() {
    let _serial = serial();
    let Some((mut g, a, _creds)) = garage_and_daemon(&["nbdcopy"], &["db=256M"]) else {
        return;
    };
    let data = write_random(&a, "db", 256 * MIB, 20);

    let job = start_push(&a, &g, "db", "g");
    g.stop();
    let failed = wait_job(&a, job["id"].as_u64().unwrap());
    assert_eq!(failed["state"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains(&g.endpoint) || error.contains("s3://"),
        "{error}"
    );
    // The drive served all along, unchanged.
    assert_same(
        &read_drive(&a, "db"),
        &data,
        "the drive after a failed push",
    );
    let status = json(&cli(&a, &g, &["snapshot", "status", "db", "--json"]).ok());
    assert_eq!(status["statuses"][0]["failures_total"], 1, "{status}");
    assert!(status["statuses"][0]["last_error"].is_string(), "{status}");

    g.restart();
    // Garage may answer 503 for a moment after its restart: the first
    // push that goes through must be whole.
    let mut ok = serde_json::Value::Null;
    wait_until(
        "a push once Garage is back",
        Duration::from_secs(120),
        || {
            let out = run(a
                .cli()
                .args(["snapshot", "create", "db", "--to", "g", "--json"]));
            ok = json(&out);
            ok["state"] == "done"
        },
    );
    assert!(ok["push"]["snapshot"].is_string(), "{ok}");
    let status = json(&cli(&a, &g, &["snapshot", "status", "db", "--json"]).ok());
    assert!(status["statuses"][0]["last_error"].is_null(), "{status}");
    // `ramd info` shows the same state: the last snapshot and the failure
    // that came before it.
    let info = json(&cli(&a, &g, &["info", "db", "--json"]).ok());
    let snap = &info["snapshots"][0];
    assert_eq!(snap["remote"], "g", "{info}");
    assert_eq!(snap["last_snapshot"], ok["push"]["snapshot"], "{info}");
    assert!(snap["failures_total"].as_u64().unwrap() >= 1, "{info}");
    let text = cli(&a, &g, &["info", "db"]).ok();
    assert!(text.stdout.contains("snapshots to g"), "{text}");
    assert!(text.stdout.contains(" failed"), "{text}");
}

#[test]
fn bad_credentials_and_missing_buckets_are_named() {
    let _serial = serial();
    let Some(g) = start_garage(&["nbdcopy"]) else {
        return;
    };
    let a = Daemon::start(&["db=8M"]);
    write_random(&a, "db", 8 * MIB, 30);
    let wrong = creds_file(
        a.dir(),
        &g,
        Some("0000000000000000000000000000000000000000000000000000000000000000"),
    );
    add_remote(&a, &g, "wrong", &g.bucket, &wrong);
    let out = cli(&a, &g, &["snapshot", "create", "db", "--to", "wrong"]).failed();
    assert!(out.stderr.contains("access denied"), "{out}");

    let creds = creds_file(a.dir(), &g, None);
    add_remote(&a, &g, "nobucket", "no-such-bucket", &creds);
    let out = cli(&a, &g, &["snapshot", "create", "db", "--to", "nobucket"]).failed();
    assert!(
        out.stderr.contains("no-such-bucket") && out.stderr.contains("does not exist"),
        "{out}"
    );

    // A credentials file others may read is refused before any request.
    let open = a.dir().join("open.toml");
    std::fs::copy(&creds, &open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    add_remote(&a, &g, "open", &g.bucket, &open);
    let out = cli(&a, &g, &["snapshot", "create", "db", "--to", "open"]).failed();
    assert!(out.stderr.contains("chmod 600"), "{out}");

    // The remotes file is private.
    let mode = std::fs::metadata(a.state_dir().join("remotes.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let listed = cli(&a, &g, &["remote", "list", "--json"]).ok();
    assert!(!listed.stdout.contains("secret"), "{listed}");
    assert!(!a.log().contains(&g.secret));
}

#[test]
fn scheduled_pushes_show_in_metrics_and_restore_from_fills_a_new_daemon() {
    let _serial = serial();
    let Some(g) = start_garage(&["nbdcopy"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = |restore: bool| {
        let path = dir.path().join(if restore { "b.toml" } else { "a.toml" });
        let drive = if restore {
            "restore_from = \"g\"\n".to_owned()
        } else {
            "snapshot_interval = \"10s\"\nsnapshot_remote = \"g\"\nsnapshot_keep_last = 2\n"
                .to_owned()
        };
        std::fs::write(
            &path,
            format!(
                "{}\n[[drive]]\nname = \"db\"\nsize = \"16M\"\n{drive}",
                remote_toml(&g, "sched", None)
            ),
        )
        .unwrap();
        path
    };
    // Credentials from the daemon's environment.
    let env = [
        ("AWS_ACCESS_KEY_ID", g.key_id.as_str()),
        ("AWS_SECRET_ACCESS_KEY", g.secret.as_str()),
    ];
    let a = config_daemon(&config(false), &env);
    let data = write_random(&a, "db", 16 * MIB, 40);
    wait_until(
        "a scheduled push after the write",
        Duration::from_secs(120),
        || {
            let (_, m) = a.http("GET", "/metrics", None);
            let pushed = metric(&m, "ramd_snapshot_pushes_total{drive=\"db\"").unwrap_or(0);
            pushed >= 2
                && m.contains(
                    "ramd_snapshot_last_success_timestamp_seconds{drive=\"db\",remote=\"g\"}",
                )
        },
    );
    assert_metrics_show(
        &a,
        &[
            "ramd_snapshot_age_seconds{",
            "ramd_snapshot_uploaded_bytes_total{",
            "ramd_snapshot_failures_total{",
        ],
    );
    let status = json(&run(a.cli().args(["snapshot", "status", "db", "--json"])).ok());
    assert_eq!(status["statuses"][0]["interval_ms"], 10_000, "{status}");

    // A new daemon (its own state directory) with restore_from: the
    // drive holds the data when it is first served.
    let b = config_daemon(&config(true), &env);
    assert_same(&read_drive(&b, "db"), &data, "restore_from at start");
    b.wait_log("the restore", |l| {
        l.contains("restore_from: drive restored")
    });
    for d in [&a, &b] {
        assert!(
            !d.log().contains(&g.secret),
            "the secret is in the daemon log"
        );
    }
}
