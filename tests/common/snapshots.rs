//! Steps the daemon-level snapshot tests (tests/snapshot_*.rs) share,
//! built on the helpers at the end of garage.rs: a Garage with a daemon
//! that knows it as remote `g`, drives filled with random data over NBD,
//! restores started or checked byte for byte, jobs watched while they
//! move, and the config-file and metrics pieces those tests read.
//!
//! This module uses garage.rs and never the other way round (no import
//! circle between the two files).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::garage::{
    add_remote, assert_same, cli, creds_file, job, json, push, read_drive, start_push, write_drive,
    Garage,
};
use super::{random_bytes, require, run, wait_until, Daemon};

/// The `tools` checked, then a Garage started. None (the test returns)
/// when a tool or Garage is missing and RAMD_SKIP_MISSING_TOOLS=1. Take
/// `serial()` before calling it.
#[track_caller]
pub fn start_garage(tools: &[&str]) -> Option<Garage> {
    if !require(tools) {
        return None;
    }
    Garage::start()
}

/// The start of most daemon-level snapshot tests: [`start_garage`], a
/// daemon with `drives` (`NAME=SIZE` specs) and, through a 0600
/// credentials file (returned too), Garage added to it as remote `g`.
#[track_caller]
pub fn garage_and_daemon(tools: &[&str], drives: &[&str]) -> Option<(Garage, Daemon, PathBuf)> {
    let g = start_garage(tools)?;
    let a = Daemon::start(drives);
    let creds = creds_file(a.dir(), &g, None);
    add_remote(&a, &g, "g", &g.bucket, &creds);
    Some((g, a, creds))
}

/// A daemon with no drive (its own state directory), with `extra` flags.
#[track_caller]
pub fn empty_daemon(extra: &[&str]) -> Daemon {
    let mut args = vec!["serve".to_owned(), "--no-default-drive".to_owned()];
    args.extend(extra.iter().map(|s| s.to_string()));
    Daemon::launch(&args, &[])
}

/// `ramd serve --config CONFIG` with extra environment.
#[track_caller]
pub fn config_daemon(config: &Path, env: &[(&str, &str)]) -> Daemon {
    Daemon::launch(
        &[
            "serve".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        env,
    )
}

/// A `[[remote]]` table for Garage named `g`, at `s3://BUCKET/PREFIX`,
/// with a `credentials_file` when one is given (else the daemon takes
/// the key from its environment).
pub fn remote_toml(g: &Garage, prefix: &str, creds: Option<&Path>) -> String {
    let mut toml = format!(
        "[[remote]]\nname = \"g\"\nurl = \"s3://{}/{prefix}\"\nendpoint = \"{}\"\nregion = \"{}\"\n",
        g.bucket, g.endpoint, g.region
    );
    if let Some(creds) = creds {
        toml.push_str(&format!("credentials_file = \"{}\"\n", creds.display()));
    }
    toml
}

/// `len` random bytes from `seed`, written at the start of drive `name`
/// with nbdcopy; the bytes.
#[track_caller]
pub fn write_random(d: &Daemon, name: &str, len: usize, seed: u64) -> Vec<u8> {
    let data = random_bytes(len, seed);
    write_drive(d, name, &data);
    data
}

/// `len` random bytes from `seed` written to drive `name`, then pushed to
/// remote `g` (the push must succeed); the bytes.
#[track_caller]
pub fn push_random(d: &Daemon, g: &Garage, name: &str, len: usize, seed: u64) -> Vec<u8> {
    let data = write_random(d, name, len, seed);
    push(d, g, name, "g");
    data
}

/// Starts a push of drive `name` to remote `g` and kills `d` with -9 once
/// some of it is uploaded, but not all (the job is still running then).
#[track_caller]
pub fn kill9_mid_push(d: &mut Daemon, g: &Garage, name: &str) {
    let job = start_push(d, g, name, "g");
    wait_transferring(
        d,
        job["id"].as_u64().unwrap(),
        "the push to upload something",
        "the push ended before the kill",
    );
    d.kill9();
}

/// The names of `d`'s drives.
#[track_caller]
pub fn drive_names(d: &Daemon) -> Vec<String> {
    let l = json(&run(d.cli().args(["list", "--json"])).ok());
    l["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap().to_owned())
        .collect()
}

/// `ramd info NAME --json`.
#[track_caller]
pub fn info(d: &Daemon, name: &str) -> serde_json::Value {
    json(&run(d.cli().args(["info", name, "--json"])).ok())
}

/// Starts `ramd restore ARGS` without waiting; the job's JSON.
#[track_caller]
pub fn start_restore(d: &Daemon, g: &Garage, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["restore"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--no-wait", "--json"]);
    json(&cli(d, g, &all).ok())
}

/// `ramd restore ARGS` (it must succeed), then the drive it made (the
/// name after `--as`, else the snapshot's drive: the first of ARGS),
/// read back with nbdcopy, must be `want`.
#[track_caller]
pub fn restore_matches(d: &Daemon, g: &Garage, args: &[&str], want: &[u8], what: &str) {
    let mut all = vec!["restore"];
    all.extend_from_slice(args);
    cli(d, g, &all).ok();
    let name = args
        .iter()
        .position(|a| *a == "--as")
        .map_or(args[0], |i| args[i + 1]);
    assert_same(&read_drive(d, name), want, what);
}

/// Waits (`waiting_for` names the wait) until job `id` has moved some
/// bytes, failing with `ended_too_soon` if it is no longer running: for
/// a fault injected in the middle of a push or a restore.
#[track_caller]
pub fn wait_transferring(d: &Daemon, id: u64, waiting_for: &str, ended_too_soon: &str) {
    wait_until(waiting_for, Duration::from_secs(120), || {
        let j = job(d, id);
        assert_eq!(j["state"], "running", "{ended_too_soon}: {j}");
        j["progress"]["bytes_transferred"].as_u64().unwrap() > 0
    });
}

/// Asserts that `d`'s /metrics holds each of `families` (a family name
/// with the start of its labels, or a whole line's start).
#[track_caller]
pub fn assert_metrics_show(d: &Daemon, families: &[&str]) {
    let (_, m) = d.http("GET", "/metrics", None);
    for family in families {
        assert!(m.contains(family), "{family} missing:\n{m}");
    }
}

/// The value of the first line of /metrics text `m` that starts with
/// `prefix` (a family and its labels), if there is one.
pub fn metric(m: &str, prefix: &str) -> Option<u64> {
    m.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
}
