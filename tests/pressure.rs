//! Memory pressure (issue 19): a daemon in a memory cgroup with a limit
//! far below its drive's size stops taking new pages at its reserve, so
//! the client gets ENOSPC and the daemon lives, instead of the kernel's
//! OOM killer ending it (with every drive). Real pressure from a real
//! cgroup (v1's memory controller here; v2 where that is what is mounted).

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
    fn new(limit_bytes: u64) -> Cgroup {
        let name = format!("ramd-pressure-{}", std::process::id());
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
    let cgroup = Cgroup::new(LIMIT_BYTES);
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), "[daemon]\npressure_min_available = \"128M\"\n").unwrap();
    let args: Vec<String> = [
        "daemon",
        "--config",
        cfg.path().to_str().unwrap(),
        "--drive",
        "big=2G",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut d = Daemon::launch(&args, &[]);
    cgroup.add(d.pid());
    wait_until(
        "the watcher to see the cgroup",
        Duration::from_secs(10),
        || health(&d)["memory_pressure"]["cgroup_limit_bytes"] == LIMIT_BYTES,
    );
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
    wait_until("writes to be taken again", Duration::from_secs(15), || {
        write(&d, 64 << 20)["error"].is_null()
    });
    assert!(d.is_running());
}
