//! A state disk that fills up and gets some room back: a checkpoint must
//! not take the room the journal needs, or every FLUSH fails until the
//! disk has room for the whole checkpoint (outside testing watched FLUSH
//! return EIO for 18 s after 40 MiB were freed: the retried checkpoint
//! wrote the image in place until the disk was full again). And a failed
//! save leaves no temporary file behind.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

/// A tmpfs mounted for the test, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        run(tool("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size}"))
            .arg("tmpfs")
            .arg(at))
        .ok();
        Tmpfs(at.to_owned())
    }

    fn free_bytes(&self) -> u64 {
        let st = rustix::fs::statvfs(&self.0).unwrap();
        st.f_bavail * st.f_frsize
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = try_run(tool("umount").arg("-l").arg(&self.0), TOOL_TIMEOUT);
    }
}

const MIB: u64 = 1 << 20;

/// Writes `len` bytes of pattern `seed` at `offset`, then FLUSH: "ok" or
/// the errno name of the failed FLUSH.
fn write_and_flush(uri: &str, offset: u64, seed: u64, len: u64) -> String {
    let script = r#"
import nbd, sys, errno
uri, off, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
h = nbd.NBD(); h.connect_uri(uri)
h.pwrite(bytes((seed * 131 + i * 7 + (i >> 12)) & 255 for i in range(n)), off)
try:
    h.flush()
    print("ok")
except nbd.Error as e:
    print(errno.errorcode.get(e.errnum, e.errnum))
h.shutdown()
"#;
    let out = python(
        script,
        &[
            uri,
            &offset.to_string(),
            &seed.to_string(),
            &len.to_string(),
        ],
    )
    .ok();
    out.stdout.trim().to_owned()
}

fn pattern(seed: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((seed * 131 + i * 7 + (i >> 12)) & 255) as u8)
        .collect()
}

fn status(d: &Daemon) -> Value {
    let (code, body) = d.http("GET", "/v1/drives/full", None);
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["persist"]["status"].clone()
}

#[test]
fn a_checkpoint_leaves_the_journal_room_and_flush_recovers_with_it() {
    if !require_root_block_devices()
        || !require(&["mount"])
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let fs = Tmpfs::mount(&state, "64M");
    let mut d = Daemon::launch(
        &[
            "daemon",
            "--state-dir",
            state.to_str().unwrap(),
            "--drive",
            "full=32M,persist,durability=flush,sync-interval=1h",
        ]
        .map(String::from),
        &[],
    );
    wait_until("the drive to be ready", DAEMON_TIMEOUT, || {
        d.http("GET", "/v1/drives/full", None)
            .1
            .contains("\"ready\"")
    });
    // Leave 20 MiB free; 16 MiB of new data go into the journal.
    let filler = state.join("filler");
    let free = fs.free_bytes();
    std::fs::write(&filler, vec![1u8; (free - 20 * MIB) as usize]).unwrap();
    assert_eq!(write_and_flush(&d.uri("full"), 0, 1, 16 * MIB), "ok");
    // A sync checkpoints: with 4 MiB free it cannot move 16 MiB into the
    // image, and must not try until the disk is full.
    let out = run(d.cli().args(["sync", "full"])).ok();
    assert!(out.status.success(), "{out}");
    // 8 MiB come back, less than the checkpoint needs: the retried
    // checkpoint must leave room for the journal.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .unwrap();
    f.set_len(f.metadata().unwrap().len() - 8 * MIB).unwrap();
    drop(f);
    run(d.cli().args(["sync", "full"])).ok();
    // Every FLUSH works while the journal has room.
    for i in 0..4 {
        let got = write_and_flush(&d.uri("full"), (16 + i) * MIB, 2 + i, MIB);
        assert_eq!(
            got,
            "ok",
            "FLUSH {i} after room came back; log:\n{}",
            d.log()
        );
    }
    let st = status(&d);
    assert_eq!(st["checkpoints"], 0, "{st}");
    assert!(d.log().contains("checkpoint postponed"), "{}", d.log());
    assert!(d.log().contains("kept for the journal"), "{}", d.log());
    // All the room back: the checkpoint completes, the journal empties.
    std::fs::remove_file(&filler).unwrap();
    run(d.cli().args(["sync", "full"])).ok();
    let st = status(&d);
    assert_eq!(st["last_error"], Value::Null, "{st}");
    assert_eq!(st["journal_bytes"], 0, "{st}");
    assert!(
        !state.join("full/drive.json.tmp").exists(),
        "a temporary settings file was left behind"
    );
    d.kill9();
    d.restart();
    wait_until("the drive to be ready again", DAEMON_TIMEOUT, || {
        d.http("GET", "/v1/drives/full", None)
            .1
            .contains("\"ready\"")
    });
    let back = root.path().join("back.img");
    run(tool("nbdcopy").arg(d.uri("full")).arg(&back)).ok();
    let img = std::fs::read(&back).unwrap();
    assert!(
        img[..(16 * MIB) as usize] == pattern(1, 16 * MIB)[..],
        "the first 16 MiB differ"
    );
    for i in 0..4u64 {
        let at = ((16 + i) * MIB) as usize;
        assert!(
            img[at..at + MIB as usize] == pattern(2 + i, MIB)[..],
            "MiB {} differs",
            16 + i
        );
    }
}

/// A drive synced into the journal and never checkpointed restores from
/// the journal, and says how much it restored (it said "restored 0 B").
#[test]
fn a_restore_from_the_journal_counts_what_it_restored() {
    if !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let mut d = Daemon::launch(
        &[
            "daemon",
            "--drive",
            "full=8M,persist,durability=flush,sync-interval=1h",
        ]
        .map(String::from),
        &[],
    );
    wait_until("the drive to be ready", DAEMON_TIMEOUT, || {
        d.http("GET", "/v1/drives/full", None)
            .1
            .contains("\"ready\"")
    });
    assert_eq!(write_and_flush(&d.uri("full"), 0, 9, 2 * MIB), "ok");
    d.kill9();
    d.restart();
    wait_until("the drive restored", DAEMON_TIMEOUT, || {
        d.http("GET", "/v1/drives/full", None)
            .1
            .contains("\"ready\"")
    });
    let out = run(d.cli().args(["info", "full"])).ok();
    assert!(
        out.stdout.contains("2 MiB of pages from the journal"),
        "{out}"
    );
}
