//! Snapshots of caches (issue 18: "per cache: its dirty data written back
//! first"), end to end with a real daemon, a single-node Garage and
//! nbdcopy: a write-back cache over a file, pushed on demand and on its
//! `[[cache]]` schedule.
//!
//! - on demand (`ramd snapshot create CACHE --to R`): the dirty data is
//!   in the backing file when the push is done, and the snapshot restores
//!   (as a drive) to the cache's logical image, byte for byte;
//! - on schedule: pushes show in /metrics under `cache="NAME"`, in `ramd
//!   snapshot status` and in `ramd info` / `GET /v1/caches/{name}`.

mod common;

use std::time::Duration;

use common::garage::{assert_same, cli, creds_file, json, serial, write_drive};
use common::openapi::Spec;
use common::snapshots::{
    assert_metrics_show, info, metric, remote_toml, restore_matches, start_garage,
};
use common::{random_bytes, run, wait_until, Daemon};

const MIB: usize = 1 << 20;

#[test]
fn a_write_back_cache_is_written_back_then_pushed_on_demand_and_on_schedule() {
    let _serial = serial();
    let Some(g) = start_garage(&["nbdcopy"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    // The backing holds old data the cache has not seen.
    let mut image = random_bytes(32 * MIB, 70);
    std::fs::write(&backing, &image).unwrap();
    let creds = creds_file(dir.path(), &g, None);
    let config = dir.path().join("ramd.toml");
    std::fs::write(
        &config,
        format!(
            r#"{remote}
[[cache]]
name = "c1"
backing = "{backing}"
size = "16M"
mode = "writeback"
max_dirty_age = "1h"
dirty_high = "90"
dirty_low = "80"
sequential_cutoff = "0"
snapshot_interval = "10s"
snapshot_remote = "g"
snapshot_keep_last = 3
"#,
            remote = remote_toml(&g, "caches", Some(&creds)),
            backing = backing.display()
        ),
    )
    .unwrap();
    let a = Daemon::launch(
        &[
            "serve".into(),
            "--no-default-drive".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        &[],
    );

    // 4 MiB of new data: dirty in the cache's RAM (the flusher waits an
    // hour, below 90% dirty; no sequential bypass), not in the backing.
    let new = random_bytes(4 * MIB, 71);
    image[..4 * MIB].copy_from_slice(&new);
    write_drive(&a, "c1", &new);
    let on_disk = std::fs::read(&backing).unwrap();
    assert!(
        on_disk[..4 * MIB] != new[..],
        "the write reached the backing before any write-back"
    );

    // On demand: written back first, then pushed. (A scheduled push may
    // be running at that moment: then this one is refused as busy, and
    // tried again.)
    let mut job = serde_json::Value::Null;
    wait_until(
        "an on-demand push of the cache",
        Duration::from_secs(120),
        || {
            let out = cli(&a, &g, &["snapshot", "create", "c1", "--to", "g", "--json"]);
            if out.stderr.contains("already being taken") {
                return false;
            }
            job = json(&out.ok());
            true
        },
    );
    assert_eq!(job["state"], "done", "{job}");
    assert_same(
        &std::fs::read(&backing).unwrap(),
        &image,
        "the backing after the cache's push (its dirty data written back)",
    );
    a.wait_log("the write-back", |l| {
        l.contains("cache written back before its snapshot")
    });
    let id = job["push"]["snapshot"].as_str().unwrap().to_owned();
    assert!(id.starts_with("c1/"), "{job}");

    // The snapshot is the cache's logical image: restored as a drive.
    restore_matches(
        &a,
        &g,
        &["c1", "--from", "g", "--snapshot", &id, "--as", "c1-copy"],
        &image,
        "the restored snapshot of the cache",
    );

    // On schedule: at least one push after the on-demand one.
    let pushes = "ramd_snapshot_pushes_total{cache=\"c1\",remote=\"g\"}";
    wait_until(
        "a scheduled push of the cache",
        Duration::from_secs(120),
        || {
            let (_, m) = a.http("GET", "/metrics", None);
            metric(&m, pushes).is_some_and(|n| n >= 2)
        },
    );
    assert_metrics_show(
        &a,
        &[
            "ramd_snapshot_last_success_timestamp_seconds{cache=\"c1\",remote=\"g\"}",
            "ramd_snapshot_age_seconds{cache=\"c1\",remote=\"g\"}",
            "ramd_snapshot_uploaded_bytes_total{cache=\"c1\",remote=\"g\"}",
            "ramd_snapshot_failures_total{cache=\"c1\",remote=\"g\"} 0",
        ],
    );
    let status = json(&run(a.cli().args(["snapshot", "status", "c1", "--json"])).ok());
    let s = &status["statuses"][0];
    assert_eq!(s["kind"], "cache", "{status}");
    assert_eq!(s["interval_ms"], 10_000, "{status}");
    assert!(s["last_snapshot"].is_string(), "{status}");
    // `ramd info` and the API show the same state.
    let c1 = info(&a, "c1");
    assert_eq!(c1["snapshots"][0]["remote"], "g", "{c1}");
    assert!(c1["snapshots"][0]["pushes_total"].as_u64().unwrap() >= 2);
    let text = run(a.cli().args(["info", "c1"])).ok();
    assert!(text.stdout.contains("snapshots to g"), "{text}");
    // The answers match docs/openapi.yaml.
    let spec = Spec::load();
    let (code, body) = spec.call(
        &a,
        "GET",
        "/v1/caches/{name}/snapshots",
        "/v1/caches/c1/snapshots",
        None,
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["statuses"][0]["kind"], "cache", "{body}");
    spec.call(&a, "GET", "/v1/caches/{name}", "/v1/caches/c1", None);
    spec.call(&a, "GET", "/v1/remotes", "/v1/remotes", None);
    let job_path = format!("/v1/snapshots/jobs/{}", job["id"]);
    spec.call(&a, "GET", "/v1/snapshots/jobs/{id}", &job_path, None);
    let listed = json(
        &cli(
            &a,
            &g,
            &["snapshot", "list", "c1", "--remote", "g", "--json"],
        )
        .ok(),
    );
    assert!(
        listed["snapshots"].as_array().unwrap().len() >= 2,
        "{listed}"
    );
    // A name that is neither a drive nor a cache is refused as such.
    let out = run(a.cli().args(["snapshot", "create", "nothing", "--to", "g"])).failed();
    assert!(out.stderr.contains("nothing"), "{out}");
}
