//! `--lock-memory`: a drive's memory locked in RAM as it is written, in a
//! real daemon. The kernel's own figures say what is locked:
//! `/proc/PID/smaps_rollup` `Locked:` (resident pages of locked mappings)
//! follows the data the drives hold, raw and compressed, up on writes and
//! down on trims; `/proc/PID/status` `VmLck:` (what `RLIMIT_MEMLOCK`
//! counts) is the locked mappings. Without `CAP_IPC_LOCK` (the daemon run
//! under `setpriv --bounding-set=-ipc_lock`) and with a low
//! `RLIMIT_MEMLOCK` (`prlimit`), drives that do not fit are refused with
//! a message saying how to raise the limit, and those that fit work.
//!
//! A missing tool fails its test (see `common::require`); set
//! RAMD_SKIP_MISSING_TOOLS=1 to skip instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{http, require, run, tool, wait_until, Daemon, KillOnDrop, DAEMON_TIMEOUT};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A `kB` field of a /proc file of `pid`, in bytes.
fn proc_kb(pid: u32, file: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} missing in /proc/{pid}/{file}:\n{text}"));
    let kb: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

/// Resident bytes of the daemon's locked mappings.
fn locked(pid: u32) -> u64 {
    proc_kb(pid, "smaps_rollup", "Locked:")
}

fn drive(socket: &Path, name: &str) -> Value {
    let (status, body) = http(socket, "GET", &format!("/v1/drives/{name}"), None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// Runs qemu-io commands against a drive.
fn qemu_io(uri: &str, cmds: &[&str]) {
    let mut c = tool("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    run(c.arg(uri)).ok();
}

/// Locked bytes within `slack` of `want`.
#[track_caller]
fn near(got: u64, want: u64, slack: u64, what: &str) {
    assert!(
        got + slack >= want && got <= want + slack,
        "{what}: {} MiB locked, want {} MiB (+-{} MiB)",
        got / MIB,
        want / MIB,
        slack / MIB
    );
}

#[test]
fn locked_drives_lock_what_they_hold() {
    if !require(&["qemu-io", "qemu-img"]) {
        return;
    }
    let d = Daemon::start(&[
        "l=256M,lock-memory",
        "free=256M",
        "z=512M,mem-limit=64M,compress=lz4,lock-memory",
    ]);
    let (pid, api) = (d.pid(), d.api_socket().to_owned());
    assert_eq!(drive(&api, "l")["lock_memory"], true);
    assert_eq!(drive(&api, "free")["lock_memory"], false);
    let info = run(d.cli().args(["info", "l"])).ok();
    assert!(info.stdout.contains("locked in RAM"), "{info}");
    // Nothing written: nothing resident, but the whole raw drive is
    // locked (what RLIMIT_MEMLOCK counts); the compressed one locks its
    // slab regions as it needs them.
    assert!(locked(pid) < MIB, "{} bytes locked", locked(pid));
    assert_eq!(proc_kb(pid, "status", "VmLck:"), 256 * MIB);

    // Written data is locked as it lands (prefaulted pages included: the
    // drive counts them as allocated too); the unlocked drive adds nothing.
    qemu_io(
        &d.uri("l"),
        &["write -P 0x11 0 48M", "write -P 0x22 100M 8M"],
    );
    qemu_io(&d.uri("free"), &["write -P 0x33 0 32M"]);
    let held = u(&drive(&api, "l"), "allocated_bytes");
    assert!(held >= 56 * MIB, "{held}");
    near(locked(pid), held, 2 * MIB, "after writes");
    // A trim gives the pages back, locked or not.
    qemu_io(&d.uri("l"), &["discard 0 32M"]);
    let after = u(&drive(&api, "l"), "allocated_bytes");
    assert_eq!(held - after, 32 * MIB);
    near(locked(pid), after, 2 * MIB, "after a trim");
    qemu_io(
        &d.uri("l"),
        &["read -P 0x11 32M 16M", "read -P 0x22 100M 8M"],
    );

    // A locked compressed drive locks its slab blocks: what it holds
    // compressed, not what it stores.
    let before = locked(pid);
    let text: Vec<u8> = b"a locked, compressed line of text, over and over\n"
        .iter()
        .cycle()
        .take((96 * MIB) as usize)
        .copied()
        .collect();
    let src = d.dir().join("text.img");
    std::fs::write(&src, &text).unwrap();
    run(tool("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(d.uri("z")))
    .ok();
    let z = drive(&api, "z");
    let slabs = u(&z["compression"], "slab_bytes");
    assert!(u(&z["compression"], "orig_data_bytes") >= 96 * MIB, "{z}");
    assert!(slabs < 64 * MIB && slabs > MIB, "{z}");
    let grew = locked(pid) - before;
    assert!(
        grew <= slabs + MIB && grew + MIB >= u(&z["compression"], "compr_data_bytes"),
        "compressed drive: {grew} bytes locked for {z}"
    );
    qemu_io(&d.uri("z"), &["discard 0 96M"]);
    near(
        locked(pid),
        before,
        2 * MIB,
        "after trimming the compressed drive",
    );
}

/// `ramd daemon` without CAP_IPC_LOCK and with RLIMIT_MEMLOCK of `limit`
/// bytes.
struct Limited {
    child: KillOnDrop,
    dir: tempfile::TempDir,
    api: PathBuf,
}

impl Limited {
    fn start(limit: u64) -> Limited {
        let dir = tempfile::Builder::new()
            .prefix("ramd-test-")
            .tempdir()
            .unwrap();
        let api = dir.path().join("api.sock");
        let ramd = common::ramd().get_program().to_owned();
        let log = std::fs::File::create(dir.path().join("ramd.log")).unwrap();
        let child = Command::new("prlimit")
            .arg(format!("--memlock={limit}:{limit}"))
            .args(["setpriv", "--bounding-set=-ipc_lock", "--"])
            .arg(ramd)
            .arg("daemon")
            .arg("--socket")
            .arg(dir.path().join("nbd.sock"))
            .arg("--api-socket")
            .arg(&api)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--no-config")
            .env("PATH", common::child_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prlimit and setpriv (util-linux) run ramd");
        let child = KillOnDrop(child);
        wait_until("ramd to listen", DAEMON_TIMEOUT, || {
            std::os::unix::net::UnixStream::connect(&api).is_ok()
        });
        Limited { child, dir, api }
    }

    fn cli(&self) -> Command {
        let mut c = common::ramd();
        c.env("RAMD_API_SOCKET", &self.api);
        c
    }

    fn uri(&self, name: &str) -> String {
        let sock = self.dir.path().join("nbd.sock");
        format!("nbd+unix:///{name}?socket={}", sock.display())
    }
}

#[test]
fn a_low_memlock_limit_refuses_what_does_not_fit_and_says_how_to_raise_it() {
    if !require(&["qemu-io", "qemu-img"]) {
        return;
    }
    // 8 MiB (an unprivileged default; the tests cannot raise the hard
    // limit without CAP_SYS_RESOURCE).
    let d = Limited::start(8 * MIB);
    // prlimit and setpriv exec the daemon: same process.
    let pid = d.child.0.id();
    let e = run(d
        .cli()
        .args(["create", "big", "--size", "1G", "--lock-memory"]))
    .failed();
    for want in [
        "asks to lock 1 GiB",
        "at most 8 MiB",
        "RLIMIT_MEMLOCK",
        "ulimit -l",
        "LimitMEMLOCK=",
        "CAP_IPC_LOCK",
    ] {
        assert!(e.stderr.contains(want), "want {want:?}: {e}");
    }
    // The same over the API, with its own code.
    let (status, body) = http(
        &d.api,
        "POST",
        "/v1/drives",
        Some(r#"{"name":"big","size":"1G","lock_memory":true}"#),
    );
    assert_eq!(status, 507, "{body}");
    assert!(body.contains("memlock_limit"), "{body}");
    // What fits is created, locked for real (without CAP_IPC_LOCK the
    // kernel holds it to the limit), and works.
    run(d
        .cli()
        .args(["create", "small", "--size", "4M", "--lock-memory"]))
    .ok();
    qemu_io(
        &d.uri("small"),
        &["write -P 0x5a 0 4M", "read -P 0x5a 0 4M"],
    );
    assert!(locked(pid) >= 4 * MIB, "{} locked", locked(pid));
    assert_eq!(proc_kb(pid, "status", "VmLck:"), 4 * MIB);
    // A second locked drive, a resize past the limit: refused too.
    let e = run(d
        .cli()
        .args(["create", "two", "--size", "5M", "--lock-memory"]))
    .failed();
    assert!(e.stderr.contains("other locked drives take 4 MiB"), "{e}");
    let e = run(d.cli().args(["resize", "small", "16M"])).failed();
    assert!(e.stderr.contains("RLIMIT_MEMLOCK"), "{e}");
    // A compressed drive counts its memory limit, not its size.
    run(d.cli().args(["delete", "small"])).ok();
    let out = run(d.cli().args([
        "create",
        "z",
        "--size",
        "4G",
        "--mem-limit",
        "2M",
        "--compress",
        "lz4",
        "--lock-memory",
    ]))
    .ok();
    assert!(out.stdout.contains("locked in RAM"), "{out}");
    let text: Vec<u8> = b"compressed and locked; "
        .iter()
        .cycle()
        .take((6 * MIB) as usize)
        .copied()
        .collect();
    let src = d.dir.path().join("text.img");
    std::fs::write(&src, &text).unwrap();
    run(tool("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(d.uri("z")))
    .ok();
    run(tool("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(d.uri("z")))
    .ok();
    assert_eq!(proc_kb(pid, "status", "VmLck:"), 2 * MIB);
    assert!(locked(pid) > 0 && locked(pid) <= 2 * MIB, "{}", locked(pid));
    // Drives that do not lock are not limited.
    run(d.cli().args(["create", "plain", "--size", "1G"])).ok();
}
