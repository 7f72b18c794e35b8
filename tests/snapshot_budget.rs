//! A snapshot restore that the memory budget cannot take is refused
//! before anything is downloaded (it used to fetch every chunk first).

mod common;

use std::time::Duration;

use common::garage::{add_remote, creds_file, job, push, serial, write_drive};
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
