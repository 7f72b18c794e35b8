//! `ramd attach` under load: concurrent fio with verification on a loop
//! device (direct I/O) over the attach file, and kill -9 of the daemon
//! while that device is busy (the I/O fails, nothing hangs). Needs root,
//! /dev/fuse, loop devices and fio.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// A loop device (direct I/O) over an attached file, detached on drop.
struct Loop(Option<String>);

impl Loop {
    fn over(file: &Path) -> Loop {
        let out = run(tool("losetup")
            .args(["-f", "--show", "--direct-io=on"])
            .arg(file))
        .ok();
        Loop(Some(out.stdout.trim().to_owned()))
    }
    fn dev(&self) -> &str {
        self.0.as_deref().unwrap()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Some(dev) = self.0.take() {
            let _ = try_run(tool("losetup").args(["-d", &dev]), TOOL_TIMEOUT);
        }
    }
}

/// Writes completed on block device `dev` (/sys/block/NAME/stat).
fn writes_completed(dev: &str) -> u64 {
    let name = Path::new(dev).file_name().unwrap().to_str().unwrap();
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
    stat.split_whitespace().nth(4).unwrap().parse().unwrap()
}

/// Attaches `drive` at DIR/fuse and returns the file.
fn attach(d: &Daemon, drive: &str) -> PathBuf {
    let fuse = d.dir().join("fuse");
    std::fs::create_dir_all(&fuse).unwrap();
    run(d.cli().args(["attach", drive]).arg(&fuse)).ok();
    fuse.join(drive)
}

fn ready() -> bool {
    require(&["losetup", "fio", "umount"]) && require_root_block_devices()
}

#[test]
fn concurrent_fio_verify_on_a_loop_device_over_the_attach_file() {
    if !ready() {
        return;
    }
    let d = Daemon::start(&["ram0=256M"]);
    let file = attach(&d, "ram0");
    // The API and /metrics say which path serves the mount.
    let (_, body) = d.http("GET", "/v1/attachments", None);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let path = v["attachments"][0]["path"].as_str().unwrap().to_owned();
    let queues = v["attachments"][0]["queues"].as_u64().unwrap();
    assert!(path == "fuse-classic" || path == "fuse-uring", "{body}");
    assert!(queues >= 1, "{body}");
    let (_, metrics) = d.http("GET", "/metrics", None);
    let series = format!(
        "ramd_attachment_queues{{drive=\"ram0\",mountpoint=\"{}\",path=\"{path}\"}} {queues}",
        file.parent().unwrap().display()
    );
    assert!(metrics.contains(&series), "{series} not in:\n{metrics}");
    let info = run(d.cli().args(["info", "ram0"])).ok();
    assert!(
        info.stdout.contains(&format!("({path}, {queues} queues)")),
        "{info}"
    );
    let lo = Loop::over(&file);
    // Four writers, each on its own 48 MiB region, 4 KiB-64 KiB blocks at
    // QD16, every block checked (crc32c) after the writes.
    let out = run(tool("fio")
        .args([
            "--name=verify",
            "--ioengine=libaio",
            "--direct=1",
            "--rw=randwrite",
            "--bsrange=4k-64k",
            "--iodepth=16",
            "--numjobs=4",
            "--size=48m",
            "--offset_increment=48m",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--do_verify=1",
            "--randrepeat=0",
            "--group_reporting",
        ])
        .arg(format!("--filename={}", lo.dev())));
    assert_eq!(out.code(), 0, "fio verify failed: {out}");
    assert!(!out.stdout.contains("verify: bad"), "{out}");
    // What fio wrote through the loop device is what the drive holds.
    let mut via_loop = vec![0u8; 1 << 20];
    let mut via_nbd = vec![0u8; 1 << 20];
    use std::io::Read;
    std::fs::File::open(lo.dev())
        .unwrap()
        .read_exact(&mut via_loop)
        .unwrap();
    std::fs::File::open(&file)
        .unwrap()
        .read_exact(&mut via_nbd)
        .unwrap();
    assert!(via_loop == via_nbd, "the loop device and the file disagree");
    drop(lo);
    run(d.cli().arg("detach").arg(file.parent().unwrap())).ok();
}

#[test]
fn kill9_while_the_mount_is_busy_fails_its_io_and_hangs_nothing() {
    if !ready() {
        return;
    }
    let mut d = Daemon::start(&["ram0=128M"]);
    let file = attach(&d, "ram0");
    let fuse = file.parent().unwrap().to_owned();
    let lo = Loop::over(&file);
    // A writer that would run for ten minutes.
    let mut fio = KillOnDrop(
        tool("fio")
            .args([
                "--name=busy",
                "--ioengine=libaio",
                "--direct=1",
                "--rw=randrw",
                "--bs=4k",
                "--iodepth=32",
                "--time_based",
                "--runtime=600",
                "--size=64m",
            ])
            .arg(format!("--filename={}", lo.dev()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Its writes reach the device (not a fixed sleep: a busy machine may
    // not have started fio's I/O by then).
    wait_until("fio's writes on the loop device", WAIT_TIMEOUT, || {
        writes_completed(lo.dev()) > 0
    });
    assert!(
        wait_timeout(&mut fio.0, Duration::ZERO).is_none(),
        "fio ended before the kill"
    );
    d.kill9();
    // The writer's I/O fails and it ends, long before its ten minutes.
    let status = wait_timeout(&mut fio.0, WAIT_TIMEOUT)
        .expect("fio still running a minute after the daemon died: I/O hangs");
    assert!(!status.success(), "fio succeeded on a dead drive");
    // The mount answers at once: the connection is gone, not hanging.
    let out = try_run(tool("stat").arg(&file), WAIT_TIMEOUT).expect("stat on the dead mount hangs");
    assert_ne!(out.code(), 0, "{out}");
    assert!(
        out.stderr.contains("not connected") || out.stderr.contains("No such"),
        "{out}"
    );
    // And it comes apart cleanly.
    drop(lo);
    run(tool("umount").arg("-l").arg(&fuse)).ok();
}
