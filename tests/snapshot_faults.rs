//! Faults around daemon-level snapshot restores and leases (issue 18's
//! "Errors" and "Crash and fault cases"), with a real daemon, a
//! single-node Garage and nbdcopy:
//!
//! - one chunk object corrupted on Garage's disk, or replaced through S3
//!   by another chunk's (intact for the server, wrong for ramd): the
//!   restore refuses and names the object; nothing is registered;
//! - Garage stopped in the middle of a restore, a remote that cannot be
//!   reached, a bucket that does not exist: precise errors, nothing
//!   half-restored is registered or served, the daemon serves on;
//! - a push killed with -9 leaves its lease: another host's prune is
//!   refused while it is fresh, but the restarted daemon deletes its own
//!   leftover lease and prunes at once.

mod common;

use std::time::Duration;

use common::garage::{
    add_remote, assert_same, cli, json, push, read_drive, serial, wait_job, write_drive,
};
use common::snapshots::{
    drive_names, empty_daemon, garage_and_daemon, kill9_mid_push, start_restore, wait_transferring,
    write_random,
};
use common::{random_bytes, run, tool, wait_until, Daemon};

const MIB: usize = 1 << 20;

/// The chunk size of pushes to remote `name` of `d`.
fn chunk_bytes(d: &Daemon, name: &str) -> usize {
    let l = json(&run(d.cli().args(["remote", "list", "--json"])).ok());
    let r = l["remotes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no remote {name}: {l}"));
    r["chunk_bytes"].as_u64().unwrap() as usize
}

/// `chunks/ab/cdef...`: the object of an unencrypted chunk.
fn chunk_object(data: &[u8]) -> String {
    let h: String = ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("chunks/{}/{}", &h[..2], &h[2..])
}

#[test]
fn a_chunk_corrupted_on_the_servers_disk_is_named_and_nothing_is_restored() {
    let _serial = serial();
    let Some((g, a, _creds)) = garage_and_daemon(&["nbdcopy"], &["db=4M"]) else {
        return;
    };
    // One chunk of data, the rest zero: its blocks are the only new files
    // in Garage's data directory (the small manifest is stored inline in
    // its metadata).
    let chunk = write_random(&a, "db", chunk_bytes(&a, "g"), 110);
    let before = g.data_files();
    push(&a, &g, "db", "g");
    // (Garage also keeps small bookkeeping files there: blocks are the
    // files of about the chunk's size.)
    let new: Vec<_> = g
        .data_files()
        .into_iter()
        .filter(|f| !before.contains(f))
        .filter(|f| std::fs::metadata(f).is_ok_and(|m| m.len() >= 64 << 10))
        .collect();
    assert!(
        !new.is_empty(),
        "the push stored no block on Garage's disk: {:?}",
        g.data_files()
    );
    // Flip bytes in the middle of every block of that chunk object.
    for f in &new {
        let mut bytes = std::fs::read(f).unwrap();
        let mid = bytes.len() / 2;
        for b in &mut bytes[mid..mid + 64] {
            *b ^= 0xff;
        }
        std::fs::write(f, &bytes).unwrap();
    }
    let out = cli(&a, &g, &["restore", "db", "--from", "g", "--as", "copy"]).failed();
    let object = chunk_object(&chunk);
    assert!(
        out.stderr.contains(&object),
        "the error does not name {object}: {out}"
    );
    assert!(!drive_names(&a).contains(&"copy".to_owned()));
    let info = run(tool("nbdinfo").arg(a.uri("copy")));
    assert_ne!(info.code(), 0, "{info}");
    // Into a persistent drive: the same, and no state directory either.
    let out = cli(
        &a,
        &g,
        &["restore", "db", "--from", "g", "--as", "copy", "--persist"],
    )
    .failed();
    assert!(out.stderr.contains(&object), "{out}");
    assert!(!drive_names(&a).contains(&"copy".to_owned()));
    assert!(!a.state_dir().join("drives/copy").exists());
    assert!(!a.state_dir().join("drives/.restoring-copy").exists());

    // An object the server holds intact but that is not what its name
    // says (replaced by another chunk's object): ramd's own check.
    let two = [
        random_bytes(chunk.len(), 111),
        random_bytes(chunk.len(), 112),
    ]
    .concat();
    run(a.cli().args(["create", "two", "--size", "4M"])).ok();
    write_drive(&a, "two", &two);
    push(&a, &g, "two", "g");
    let (first, second) = (
        chunk_object(&two[..chunk.len()]),
        chunk_object(&two[chunk.len()..]),
    );
    let object_file = a.dir().join("object");
    g.s3_curl("GET", &format!("ramd/{second}"), None, &object_file);
    g.s3_curl(
        "PUT",
        &format!("ramd/{first}"),
        Some(&object_file),
        &a.dir().join("put-answer"),
    );
    let out = cli(&a, &g, &["restore", "two", "--from", "g", "--as", "copy2"]).failed();
    assert!(
        out.stderr.contains(&first) && out.stderr.contains("do not hash to its name"),
        "{out}"
    );
    assert!(!drive_names(&a).contains(&"copy2".to_owned()));
}

#[test]
fn restores_from_a_remote_that_is_down_or_has_no_bucket_register_nothing() {
    let _serial = serial();
    let Some((mut g, a, creds)) =
        garage_and_daemon(&["nbdcopy", "nbdinfo"], &["db=256M", "keep=8M"])
    else {
        return;
    };
    let data = write_random(&a, "db", 256 * MIB, 120);
    let keep = write_random(&a, "keep", 8 * MIB, 121);
    push(&a, &g, "db", "g");

    // Garage stops in the middle of a restore (persistent, so the staged
    // state directory exists meanwhile).
    let job = start_restore(&a, &g, &["db", "--from", "g", "--as", "half", "--persist"]);
    let id = job["id"].as_u64().unwrap();
    wait_transferring(
        &a,
        id,
        "the restore to fetch something",
        "the restore ended before Garage stopped",
    );
    g.stop();
    let failed = wait_job(&a, id);
    assert_eq!(failed["state"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains(&g.endpoint), "{error}");
    assert!(!drive_names(&a).contains(&"half".to_owned()));
    assert!(!a.state_dir().join("drives/half").exists());
    assert!(!a.state_dir().join("drives/.restoring-half").exists());
    let info = run(tool("nbdinfo").arg(a.uri("half")));
    assert_ne!(info.code(), 0, "{info}");

    // Down from the start: the error says the server cannot be reached.
    let out = cli(&a, &g, &["restore", "db", "--from", "g", "--as", "down"]).failed();
    assert!(out.stderr.contains("cannot reach the server"), "{out}");
    assert!(!drive_names(&a).contains(&"down".to_owned()));

    // A bucket that does not exist.
    g.restart();
    add_remote(&a, &g, "nobucket", "no-such-bucket", &creds);
    let out = cli(
        &a,
        &g,
        &[
            "restore",
            "db",
            "--from",
            "nobucket",
            "--as",
            "nob",
            "--persist",
        ],
    )
    .failed();
    assert!(
        out.stderr.contains("no-such-bucket") && out.stderr.contains("does not exist"),
        "{out}"
    );
    assert!(!drive_names(&a).contains(&"nob".to_owned()));
    assert!(!a.state_dir().join("drives/nob").exists());

    // The daemon served on all along, and restores once Garage is back.
    assert_same(&read_drive(&a, "keep"), &keep, "the other drive");
    wait_until(
        "a restore once Garage is back",
        Duration::from_secs(120),
        || {
            run(a
                .cli()
                .args(["restore", "db", "--from", "g", "--as", "whole"]))
            .code()
                == 0
        },
    );
    assert_same(
        &read_drive(&a, "whole"),
        &data,
        "the restore after the outage",
    );
}

#[test]
fn a_killed_pushs_lease_is_freed_by_its_restarted_daemon() {
    let _serial = serial();
    let Some((g, mut a, creds)) = garage_and_daemon(&["nbdcopy"], &["big=384M"]) else {
        return;
    };
    write_random(&a, "big", 384 * MIB, 130);
    kill9_mid_push(&mut a, &g, "big");

    // Another daemon (another owner): the killed push's lease is fresh, so
    // its prune waits for it to expire.
    let other = empty_daemon(&[]);
    add_remote(&other, &g, "g", &g.bucket, &creds);
    let out = cli(&other, &g, &["snapshot", "prune", "--remote", "g"]).failed();
    assert!(out.stderr.contains("the remote is busy"), "{out}");

    // The restarted daemon recognises its own leftover and goes on.
    a.restart();
    cli(&a, &g, &["snapshot", "prune", "--remote", "g"]).ok();
    a.wait_log("the leftover lease deleted", |l| {
        l.contains("deleted a lease left by an earlier run of this daemon")
    });
    cli(&other, &g, &["snapshot", "prune", "--remote", "g"]).ok();
    // And pushes work again.
    push(&a, &g, "big", "g");
}
