//! A snapshot restore that the memory budget cannot take is refused
//! before anything is downloaded (it used to fetch every chunk first).

mod common;

use std::time::Duration;

use common::garage::{add_remote, cli, creds_file, job, push, serial, write_drive};
use common::snapshots::{drive_names, start_garage, start_restore};
use common::{random_bytes, wait_until, Daemon};

const MIB: usize = 1 << 20;

#[test]
fn a_restore_over_the_budget_is_refused_before_it_downloads() {
    let _serial = serial();
    let Some(g) = start_garage(&["nbdcopy"]) else {
        return;
    };
    let d = Daemon::launch(
        &["serve", "--mem-budget", "200M", "--drive", "db=120M"].map(String::from),
        &[],
    );
    let creds = creds_file(d.dir(), &g, None);
    add_remote(&d, &g, "g", &g.bucket, &creds);
    write_drive(&d, "db", &random_bytes(32 * MIB, 7));
    push(&d, &g, "db", "g");
    // A copy beside the original: 120 MiB more than the 200 MiB budget
    // has unpromised.
    let started = start_restore(&d, &g, &["db", "--from", "g", "--as", "copy"]);
    let id = started["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no job id in {started}"));
    let mut ended = serde_json::Value::Null;
    wait_until("the restore job to end", Duration::from_secs(120), || {
        ended = job(&d, id);
        ended["state"] != "running"
    });
    assert_eq!(ended["state"], "failed", "{ended}");
    assert!(ended.to_string().contains("memory budget"), "{ended}");
    assert_eq!(
        ended["progress"]["bytes_transferred"], 0,
        "downloaded before refusing: {ended}"
    );
    assert!(!drive_names(&d).contains(&"copy".to_owned()));
}

/// The dedup figure moves and says what it counts (outside testing read
/// "dedup 1.0x" on every push as a stuck figure): 1.0x for a first push
/// of distinct data, 16.0x after 1 MiB of 16 changed, none when nothing
/// new is sent.
#[test]
fn a_push_says_how_much_less_than_the_data_it_sent() {
    let _serial = serial();
    let Some(g) = start_garage(&["nbdcopy"]) else {
        return;
    };
    let d = Daemon::launch(&["serve", "--drive", "db=16M"].map(String::from), &[]);
    let creds = creds_file(d.dir(), &g, None);
    add_remote(&d, &g, "g", &g.bucket, &creds);
    let mut data = random_bytes(16 * MIB, 1);
    write_drive(&d, "db", &data);
    let push_line = || {
        cli(&d, &g, &["snapshot", "create", "db", "--to", "g"])
            .ok()
            .stdout
    };
    let first = push_line();
    assert!(first.contains("1.0x less than the data"), "{first}");
    data[..MIB].copy_from_slice(&random_bytes(MIB, 2));
    write_drive(&d, "db", &data);
    let second = push_line();
    assert!(second.contains("16.0x less than the data"), "{second}");
    assert!(second.contains("60 on the remote already"), "{second}");
    let third = push_line();
    assert!(third.contains("nothing new to send"), "{third}");
}
