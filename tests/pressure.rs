//! Memory pressure (issue 19): a daemon in a memory cgroup with a limit
//! far below its drive's size stops taking new pages at its reserve, so
//! the client gets ENOSPC and the daemon lives, instead of the kernel's
//! OOM killer ending it (with every drive); and while another process in
//! the cgroup needs memory, caches give back their clean blocks first.
//! Real pressure from a real cgroup (v1's memory controller here; v2 where
//! that is what is mounted).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

const LIMIT_BYTES: u64 = 640 << 20;

/// A memory cgroup of the test's own, removed on drop (after the daemon
/// in it has gone: declare it before the daemon).
struct Cgroup(PathBuf);

impl Cgroup {
    #[track_caller]
    fn new(test: &str, limit_bytes: u64) -> Cgroup {
        let name = format!("ramd-pressure-{}-{test}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2 = Path::new("/sys/fs/cgroup");
        let (dir, limit_file) = if v1.is_dir() {
            (v1.join(&name), "memory.limit_in_bytes")
        } else {
            (v2.join(&name), "memory.max")
        };
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| {
            panic!(
                "cannot make a memory cgroup at {} (root and a memory controller needed): {e}",
                dir.display()
            )
        });
        std::fs::write(dir.join(limit_file), limit_bytes.to_string())
            .expect("set the cgroup limit");
        Cgroup(dir)
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("move into the cgroup");
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn drive_json(d: &Daemon, name: &str) -> serde_json::Value {
    let (status, body) = d.http("GET", &format!("/v1/drives/{name}"), None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn health(d: &Daemon) -> serde_json::Value {
    let (status, body) = d.http("GET", "/v1/health", None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Writes up to `total` bytes of random data in 4 MiB requests; prints
/// how far it got and the errno of the request that failed.
const WRITER: &str = r#"
import errno, json, os, sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
total, step, done, err = int(sys.argv[2]), 4 << 20, 0, None
while done < total:
    try:
        h.pwrite(os.urandom(step), done)
    except nbd.Error as e:
        err = errno.errorcode.get(e.errnum, str(e.errnum))
        break
    done += step
print(json.dumps({"written": done, "error": err}))
"#;

fn write(d: &Daemon, total: u64) -> serde_json::Value {
    let out = python(WRITER, &[&d.uri("big"), &total.to_string()]).ok();
    serde_json::from_str(out.stdout.trim()).unwrap()
}

#[test]
fn a_drive_in_a_small_cgroup_gets_enospc_at_the_reserve_and_the_daemon_lives() {
    if !require(&["nbdsh"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let cgroup = Cgroup::new("drive", LIMIT_BYTES);
    let dir = tempfile::tempdir().unwrap();
    let mut d = daemon_in(&cgroup, dir.path(), &["--drive", "big=2G"]);
    let h = health(&d)["memory_pressure"].clone();
    assert_eq!(h["min_available_bytes"], 128u64 << 20, "{h}");

    // 1 GiB into a 640 MiB cgroup: refused at about 640 - 128 MiB.
    let w = write(&d, 1 << 30);
    assert_eq!(w["error"], "ENOSPC", "{w}");
    let written = w["written"].as_u64().unwrap();
    assert!((256 << 20..LIMIT_BYTES).contains(&written), "{w}");
    assert!(d.is_running(), "the daemon must survive; log:\n{}", d.log());
    let h = health(&d)["memory_pressure"].clone();
    assert!(h["refused_allocations"].as_u64().unwrap() > 0, "{h}");
    let (_, metrics) = d.http("GET", "/metrics", None);
    assert!(
        metrics.contains("ramd_memory_pressure_refused_allocations_total"),
        "{metrics}"
    );
    assert!(metrics.contains("ramd_memory_available_bytes"), "{metrics}");

    // Trim gives the memory back; the next reading lets writes in again.
    let trim =
        "import nbd, sys\nh = nbd.NBD()\nh.connect_uri(sys.argv[1])\nh.trim(h.get_size(), 0)\n";
    python(trim, &[&d.uri("big")]).ok();
    wait_until("writes to be taken again", WAIT_TIMEOUT, || {
        write(&d, 64 << 20)["error"].is_null()
    });
    assert!(d.is_running());
}

/// Takes memory in the cgroup gradually (4 MiB every 100 ms, touched),
/// like a process starting up beside the daemon: waits for a line on
/// stdin, prints "ok" with the total once it holds it all, then holds it
/// until stdin closes.
const HOG: &str = r#"
import sys, time
total = int(sys.argv[1])
sys.stdin.readline()
held = []
while len(held) * (4 << 20) < total:
    b = bytearray(4 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    held.append(b)
    time.sleep(0.1)
print("ok", len(held) * (4 << 20), flush=True)
sys.stdin.readline()
"#;

/// `ramd daemon` with a 128 MiB reserve and `extra` flags, in `cgroup`,
/// once its watcher sees the cgroup's limit; config in `dir`.
fn daemon_in(cgroup: &Cgroup, dir: &Path, extra: &[&str]) -> Daemon {
    let cfg = dir.join("ramd.toml");
    std::fs::write(&cfg, "[daemon]\npressure_min_available = \"128M\"\n").unwrap();
    let mut args = vec![
        "daemon".to_owned(),
        "--config".into(),
        cfg.display().to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let d = Daemon::launch(&args, &[]);
    cgroup.add(d.pid());
    wait_until("the watcher to see the cgroup", WAIT_TIMEOUT, || {
        health(&d)["memory_pressure"]["cgroup_limit_bytes"] == LIMIT_BYTES
    });
    d
}

/// Another process in the cgroup holding memory (see [`HOG`]).
struct Hog {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
}

impl Hog {
    /// Starts it in `cgroup` and waits until it holds `bytes`.
    #[track_caller]
    fn start(cgroup: &Cgroup, bytes: u64) -> Hog {
        use std::io::{BufRead, Write};
        let mut child = tool("/usr/bin/python3")
            .args(["-c", HOG, &bytes.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        cgroup.add(child.id());
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "go").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.starts_with("ok"),
            "the other process did not get its memory: '{line}'"
        );
        Hog { child, stdin }
    }

    /// Lets it go and waits for it.
    fn end(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

/// Whether two files hold the same bytes (read 1 MiB at a time).
fn same_files(a: &Path, b: &Path) -> bool {
    use std::io::Read;
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba).unwrap();
        if n == 0 {
            return fb.read(&mut bb).unwrap() == 0;
        }
        if fb.read_exact(&mut bb[..n]).is_err() || ba[..n] != bb[..n] {
            return false;
        }
    }
}

fn cache_stats(d: &Daemon) -> serde_json::Value {
    let (status, body) = d.http("GET", "/v1/caches/c", None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["stats"].clone()
}

#[test]
fn caches_give_back_clean_blocks_when_another_process_needs_the_memory() {
    if !require(&["nbdcopy"]) {
        return;
    }
    let cgroup = Cgroup::new("cache", LIMIT_BYTES);
    let tmp = tempfile::Builder::new()
        .prefix("ramd-pressure-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let backing = tmp.path().join("backing.img");
    std::fs::write(&backing, random_bytes(448 << 20, 19)).unwrap();
    let mut d = daemon_in(&cgroup, tmp.path(), &[]);
    run(d
        .cli()
        .args(["cache", "create", "c", "--size", "384M", "--mode"])
        .args([
            "writethrough",
            "--block-size",
            "64K",
            "--sequential-cutoff",
            "0",
            "--backing",
            backing.to_str().unwrap(),
        ]))
    .ok();
    // Fill the cache with clean blocks: 384 of the cgroup's 640 MiB.
    run(tool("nbdcopy").arg(d.uri("c")).arg("null:")).ok();
    let full = cache_stats(&d);
    assert!(
        full["memory_bytes"].as_u64().unwrap() >= 380 << 20,
        "{full}"
    );
    assert_eq!(full["given_back_bytes"], 0, "{full}");

    // Another process in the cgroup takes 320 MiB: without the cache's
    // memory it would not fit above the reserve.
    let hog = Hog::start(&cgroup, 320 << 20);
    assert!(d.is_running(), "the daemon must live; log:\n{}", d.log());

    // The kernel may first have found the other process room elsewhere
    // (the page cache charged to the cgroup); the daemon's watcher sees
    // the pressure at its next reading.
    let mut after = cache_stats(&d);
    wait_until("the cache to give back clean blocks", WAIT_TIMEOUT, || {
        after = cache_stats(&d);
        after["given_back_bytes"].as_u64().unwrap() >= 64 << 20
    });
    let given = after["given_back_bytes"].as_u64().unwrap();
    assert!(
        after["memory_bytes"].as_u64().unwrap() <= (384 << 20) - given + (64 << 10),
        "{after}"
    );
    let h = health(&d)["memory_pressure"].clone();
    assert!(h["given_back_bytes"].as_u64().unwrap() >= given, "{h}");
    assert!(h["episodes"].as_u64().unwrap() >= 1, "{h}");
    let (_, metrics) = d.http("GET", "/metrics", None);
    for family in [
        "ramd_memory_pressure_given_back_bytes_total",
        "ramd_cache_given_back_bytes_total",
        "ramd_cache_memory_bytes",
    ] {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
    wait_until("the give-back logged", WAIT_TIMEOUT, || {
        d.log().contains("caches gave back clean blocks")
    });

    // Nothing was lost: the cache still reads as its backing.
    let copy = tmp.path().join("copy.img");
    run(tool("nbdcopy").arg(d.uri("c")).arg(&copy)).ok();
    assert!(same_files(&backing, &copy), "the cache lost data");
    std::fs::remove_file(&copy).unwrap();

    // The other process ends: the cache grows back as it is read.
    hog.end();
    wait_until("the cache to grow back", WAIT_TIMEOUT, || {
        run(tool("nbdcopy").arg(d.uri("c")).arg("null:")).ok();
        cache_stats(&d)["memory_bytes"].as_u64().unwrap() >= 300 << 20
    });
    assert!(d.is_running());
}

/// While another process in the cgroup needs memory, an `lz4+zstd`
/// drive's worker is hurried: it sweeps every page now (urgent_sweeps),
/// the log names the drive, and the data stays as written.
#[test]
fn lz4_zstd_drives_recompress_when_another_process_needs_the_memory() {
    if !require(&["nbdcopy"]) {
        return;
    }
    let cgroup = Cgroup::new("recompress", LIMIT_BYTES);
    let tmp = tempfile::Builder::new()
        .prefix("ramd-pressure-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mut d = daemon_in(&cgroup, tmp.path(), &["--drive", "z=1G,compress=lz4+zstd"]);
    let data = word_salad(128 << 20, 21);
    let file = tmp.path().join("text.img");
    std::fs::write(&file, &data).unwrap();
    run(tool("nbdcopy").arg(&file).arg(d.uri("z"))).ok();
    std::fs::remove_file(&file).unwrap();

    // 480 MiB in the cgroup beside the drive: below the 128 MiB reserve.
    let hog = Hog::start(&cgroup, 480 << 20);
    let z = || {
        let (_, body) = d.http("GET", "/v1/drives/z", None);
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["compression"].clone()
    };
    wait_until("an urgent sweep", WAIT_TIMEOUT, || {
        z()["urgent_sweeps"].as_u64().unwrap() >= 1
    });
    wait_until("the hurry logged", WAIT_TIMEOUT, || {
        d.log()
            .contains("host memory is short: recompressing every page of z")
    });
    // The sweep is counted when it starts; its first pages come after.
    wait_until("pages recompressed", WAIT_TIMEOUT, || {
        z()["recompressed_pages"].as_u64().unwrap() > 0
    });
    assert!(d.is_running(), "the daemon must live; log:\n{}", d.log());
    hog.end();
    let back = tmp.path().join("back.img");
    run(tool("nbdcopy").arg(d.uri("z")).arg(&back)).ok();
    let got = std::fs::read(&back).unwrap();
    assert!(got[..data.len()] == data[..], "the drive's data changed");
}

/// A persistent drive restored while another process in the cgroup holds
/// the memory its data needs (a restart that meets the dead process's
/// memory still being freed): the restore is refused for the host's
/// memory, waits (`waiting_for_memory`, the reason shown), and starts
/// again once that process ends; the data comes back whole.
#[test]
fn a_restore_the_memory_refuses_waits_for_it_and_starts_again() {
    if !require(&["nbdcopy"]) {
        return;
    }
    let cgroup = Cgroup::new("restore", LIMIT_BYTES);
    let tmp = tempfile::Builder::new()
        .prefix("ramd-pressure-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let data = tmp.path().join("data.img");
    std::fs::write(&data, random_bytes(160 << 20, 23)).unwrap();
    let mut d = daemon_in(&cgroup, tmp.path(), &[]);
    let create = [
        "create",
        "p",
        "--size",
        "160M",
        "--persist",
        "--durability",
        "flush",
    ];
    run(d.cli().args(create)).ok();
    run(tool("nbdcopy").arg(&data).arg(d.uri("p"))).ok();
    run(d.cli().args(["delete", "p", "--keep-data"])).ok();

    // 420 of the cgroup's 640 MiB taken: less than the data's 160 MiB
    // left above the 128 MiB reserve.
    let hog = Hog::start(&cgroup, 420 << 20);
    run(d.cli().args(["create", "p", "--persist", "--no-wait"])).ok();
    let mut v = serde_json::Value::Null;
    wait_until("the restore to wait for memory", WAIT_TIMEOUT, || {
        v = drive_json(&d, "p");
        v["persist"]["restore"]["phase"] == "waiting_for_memory"
    });
    assert_eq!(v["state"], "restoring", "{v}");
    let why = v["persist"]["restore"]["error"].to_string();
    assert!(why.contains("memory is down to the reserve"), "{v}");
    assert!(d.log().contains("restore attempt 1 refused"), "{}", d.log());

    // The other process ends: the restore starts again and serves.
    hog.end();
    wait_until("the restore to end", WAIT_TIMEOUT, || {
        v = drive_json(&d, "p");
        v["state"] != "restoring"
    });
    assert_eq!(v["state"], "ready", "{v}\n{}", d.log());
    assert_eq!(v["persist"]["restore"]["phase"], "done", "{v}");
    let copy = tmp.path().join("copy.img");
    run(tool("nbdcopy").arg(d.uri("p")).arg(&copy)).ok();
    assert!(same_files(&data, &copy), "the restored drive lost data");
    assert!(d.terminate().success());
}
