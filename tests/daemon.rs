//! The daemon process: config files, the pid lock, sd_notify, the API
//! socket's mode, JSON logs, and a SIGTERM while I/O is in flight.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::Value;

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn config_with_two_drives_comes_up_with_both() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "ramd.toml",
        r#"# two drives
[daemon]
mem_budget = "512M"
max_connections = 16
metrics = true

[[drive]]
name = "alpha"
size = "32M"
mem_limit = "16M"

[[drive]]
name = "beta"
size = 1048576
read_only = true
"#,
    );
    let d = Daemon::launch(
        &[
            "daemon".into(),
            "--config".into(),
            cfg.display().to_string(),
        ],
        &[],
    );
    let (_, body) = d.http("GET", "/v1/drives", None);
    let v: Value = serde_json::from_str(&body).unwrap();
    let drives = v["drives"].as_array().unwrap();
    assert_eq!(drives.len(), 2, "{v}");
    assert_eq!(drives[0]["name"], "alpha");
    assert_eq!(drives[0]["size_bytes"], 32u64 << 20);
    assert_eq!(drives[0]["mem_limit_bytes"], 16u64 << 20);
    assert_eq!(drives[0]["origin"], "config");
    assert_eq!(drives[1]["name"], "beta");
    assert_eq!(drives[1]["read_only"], true);
    let (_, body) = d.http("GET", "/v1/health", None);
    let h: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(h["memory_budget"]["limit_bytes"], 512u64 << 20);
    assert_eq!(h["config_file"], cfg.display().to_string());
    // Changing a declared drive at run time is reported as ephemeral.
    let out = run(d.cli().args(["resize", "alpha", "64M"])).ok();
    assert!(out.stderr.contains("declared in"), "{out}");
    assert!(out.stderr.contains("ramd.toml"), "{out}");
}

#[test]
fn bad_config_fails_with_file_line_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let api = dir.path().join("api.sock");
    for (text, want) in [
        (
            "[daemon]\nmax_connections = 4\nturbo = true\n",
            ":3:1: unknown field `turbo`",
        ),
        (
            "[[drive]]\nname = \"a\"\nsize = \"12Q\"\n",
            ":3:8: unknown size unit",
        ),
        (
            "[[drive]]\nname = \"A\"\nsize = \"1G\"\n",
            ":2:8: invalid drive name 'A'",
        ),
        (
            "[[drive]]\nname = \"a\"\nsize = \"1M\"\n\n[[drive]]\nname = \"a\"\nsize = \"2M\"\n",
            ":6:8: drive 'a' is declared twice",
        ),
        ("[daemon]\nnbd_listen = [\"no-port\"]\n", ":2:"),
        ("[daemon\n", ":1:"),
    ] {
        let cfg = write(dir.path(), "bad.toml", text);
        let out = run(ramd()
            .args(["daemon", "--config"])
            .arg(&cfg)
            .arg("--api-socket")
            .arg(&api))
        .failed();
        assert_eq!(out.code(), 1, "{out}");
        let want = format!("{}{want}", cfg.display());
        assert!(out.stderr.contains(&want), "want {want:?} in: {out}");
        assert!(!api.exists(), "the daemon started anyway: {out}");
    }
    let out = run(ramd()
        .args(["daemon", "--config"])
        .arg(dir.path().join("missing.toml")))
    .failed();
    assert!(out.stderr.contains("cannot read config"), "{out}");
}

#[test]
fn second_daemon_on_the_same_api_socket_names_the_first_pid() {
    let d = Daemon::start(&["ram0=1M"]);
    let out = run(ramd()
        .args(["daemon", "--no-config", "--socket"])
        .arg(d.dir().join("other-nbd.sock"))
        .arg("--api-socket")
        .arg(d.api_socket()))
    .failed();
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("already running"), "{out}");
    assert!(out.stderr.contains(&format!("pid {}", d.pid())), "{out}");
    // The first daemon still answers.
    let (s, _) = d.http("GET", "/v1/health", None);
    assert_eq!(s, 200);
}

#[test]
fn api_socket_is_private_and_removed_at_exit_and_json_logs_parse() {
    let mut d = Daemon::launch(
        &["daemon".into(), "--log-format".into(), "json".into()],
        &[],
    );
    let mode = std::fs::metadata(d.api_socket())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "API socket mode {mode:o}");
    let (api, nbd) = (d.api_socket().to_owned(), d.socket().to_owned());
    let status = d.terminate();
    assert!(status.success(), "{status}: {}", d.log());
    assert!(!api.exists() && !nbd.exists(), "sockets left behind");
    let log = d.log();
    let mut lines = 0;
    for l in log.lines() {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{l}");
        lines += 1;
    }
    assert!(lines >= 3, "{log}");
    assert!(log.contains("ready"), "{log}");
}

#[test]
fn sd_notify_ready_then_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(DAEMON_TIMEOUT)).unwrap();
    let mut d = Daemon::launch(
        &["daemon".into()],
        &[("NOTIFY_SOCKET", path.to_str().unwrap())],
    );
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("READY=1 within the timeout");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    // The API answers by the time READY=1 is sent.
    assert_eq!(d.http("GET", "/v1/health", None).0, 200);
    signal(d.pid(), libc::SIGTERM);
    let n = sock.recv(&mut buf).expect("STOPPING=1 within the timeout");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.lines().any(|l| l == "STOPPING=1"), "{msg}");
    assert!(d.terminate().success());
}

/// Keeps 32 requests in flight (patterned writes and reads checked against
/// what was written) until the server goes away; prints a JSON summary.
const INFLIGHT_CLIENT: &str = r#"
import json, nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
BS, N = 4096, 2048
def pat(i):
    return (i.to_bytes(4, 'little') * (BS // 4))
for i in range(N):
    h.pwrite(pat(i), i * BS)
print("READY", flush=True)
done = bad = 0
err = None
inflight = {}
i = 0
try:
    while True:
        while len(inflight) < 32:
            blk = (i * 7919) % N
            if i % 2:
                buf = nbd.Buffer(BS)
                c = h.aio_pread(buf, blk * BS)
                inflight[c] = (blk, buf)
            else:
                c = h.aio_pwrite(pat(blk), blk * BS)
                inflight[c] = (blk, None)
            i += 1
        h.poll(-1)
        for c in list(inflight):
            if h.aio_command_completed(c):
                blk, buf = inflight.pop(c)
                if buf is not None and buf.to_bytearray() != pat(blk):
                    bad += 1
                done += 1
                if done == 256:
                    print("RUNNING", flush=True)
except nbd.Error as e:
    err = str(e)
print(json.dumps({"done": done, "bad": bad, "error": err}), flush=True)
"#;

#[test]
fn sigterm_with_requests_in_flight_ends_without_a_torn_reply() {
    if !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let mut d = Daemon::start(&["ram0=64M"]);
    let mut client = KillOnDrop(
        tool("/usr/bin/python3")
            .args(["-c", INFLIGHT_CLIENT, &d.uri("ram0")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the client"),
    );
    use std::io::BufRead;
    // The client's lines, read on a thread so that every wait is bounded.
    let stdout = client.0.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let next_line = |what: &str| {
        lines
            .recv_timeout(WAIT_TIMEOUT)
            .unwrap_or_else(|e| panic!("no {what} from the client: {e}"))
    };
    assert_eq!(next_line("READY"), "READY");
    // Once it has run at full depth for a while (not a fixed sleep: a busy
    // machine may not have got it going by then), stop the daemon.
    assert_eq!(next_line("RUNNING"), "RUNNING");
    let status = d.terminate();
    assert!(status.success(), "ramd exited with {status}: {}", d.log());
    let summary = next_line("summary");
    let v: Value = serde_json::from_str(&summary).unwrap();
    assert!(v["done"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["bad"], 0, "reads returned wrong data: {v}");
    // The connection ended by the server closing it between replies: libnbd
    // sees end-of-file, never a malformed (torn) reply.
    let err = v["error"].as_str().unwrap_or("").to_ascii_lowercase();
    for torn in [
        "magic",
        "unexpected",
        "cookie",
        "handle",
        "protocol",
        "unknown",
    ] {
        assert!(!err.contains(torn), "a torn reply: {v}");
    }
    assert!(
        [
            "dead",
            "disconnect",
            "closed",
            "eof",
            "reset",
            "not connected"
        ]
        .iter()
        .any(|w| err.contains(w)),
        "the connection should end by the server closing it: {v}"
    );
    assert!(wait_timeout(&mut client.0, WAIT_TIMEOUT).is_some());
}

/// A `ramd daemon` started by hand (not through [`Daemon`]): its output
/// goes to `log`; SIGTERM and a bounded wait on drop.
struct Raw {
    child: Option<std::process::Child>,
    log: std::path::PathBuf,
}

impl Raw {
    fn spawn(cmd: &mut std::process::Command, log: &std::path::Path) -> Raw {
        let f = std::fs::File::create(log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .expect("spawn ramd");
        Raw {
            child: Some(child),
            log: log.to_owned(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the API at `api` answers GET /v1/health with 200;
    /// panics with the log when the daemon exits first.
    #[track_caller]
    fn wait_serving(&mut self, api: &std::path::Path) {
        wait_until("the daemon to serve its API", DAEMON_TIMEOUT, || {
            let c = self.child.as_mut().unwrap();
            if let Some(status) = c.try_wait().unwrap() {
                panic!("ramd exited with {status}:\n{}", self.log());
            }
            try_health(api).is_some()
        });
    }
}

/// GET /v1/health's body when a daemon answers 200 on `api`; None on any
/// failure (a killed daemon's socket may accept and then reset).
fn try_health(api: &std::path::Path) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(api).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: ramd\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.starts_with("HTTP/1.1 200").then_some(text)
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.id(), libc::SIGTERM);
            if wait_timeout(&mut c, DAEMON_TIMEOUT).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn mode_of(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// `ramd daemon` with every path in `dir`, under `umask 000` (so only the
/// daemon's own modes protect anything).
fn daemon_in_runtime_dir(
    dir: &std::path::Path,
    runtime: &std::path::Path,
) -> std::process::Command {
    let mut c = std::process::Command::new("sh");
    c.arg("-c")
        .arg("umask 000; exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_ramd"))
        .args([
            "daemon",
            "--no-config",
            "--drive",
            "ram0=1M",
            "--runtime-dir",
        ])
        .arg(runtime)
        .arg("--state-dir")
        .arg(dir.join("state"));
    c
}

#[test]
fn runtime_dir_is_created_private_and_one_others_control_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("parent/run");
    let api = runtime.join("api.sock");
    // Absent: created 0700 (umask 000 notwithstanding), API socket 0600.
    let mut d = Raw::spawn(
        &mut daemon_in_runtime_dir(dir.path(), &runtime),
        &dir.path().join("1.log"),
    );
    d.wait_serving(&api);
    assert_eq!(mode_of(&runtime), 0o700, "runtime dir");
    assert_eq!(mode_of(&api), 0o600, "API socket under umask 000");
    assert_eq!(mode_of(&dir.path().join("parent")), 0o700, "created parent");
    drop(d);

    let refused = |what: &str, want: &[&str]| {
        let out = run(&mut daemon_in_runtime_dir(dir.path(), &runtime)).failed();
        assert_eq!(out.code(), 1, "{what}: {out}");
        for w in want {
            assert!(out.stderr.contains(w), "{what}: want {w:?} in {out}");
        }
        assert!(!api.exists(), "{what}: a socket was made anyway");
    };
    let set = |m| std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(m)).unwrap();
    // Another user's directory (the /tmp/ramd-UID another user made first).
    std::os::unix::fs::chown(&runtime, Some(65534), None).unwrap();
    set(0o777);
    refused(
        "another user's 0777 dir",
        &["owned by uid 65534", "Remove it", "XDG_RUNTIME_DIR"],
    );
    // Ours, but others may write in it.
    std::os::unix::fs::chown(&runtime, Some(0), None).unwrap();
    refused("a 0777 dir of ours", &["writable by", "chmod go-w"]);
    set(0o770);
    refused("a group-writable dir", &["writable by its group"]);
    // A symlink to a directory of ours is not taken either.
    set(0o700);
    let real = dir.path().join("real");
    std::fs::rename(&runtime, &real).unwrap();
    std::os::unix::fs::symlink(&real, &runtime).unwrap();
    refused("a symlink", &["symbolic link", "XDG_RUNTIME_DIR"]);
    // An existing directory of ours, 0755: used as it is.
    std::fs::remove_file(&runtime).unwrap();
    std::fs::rename(&real, &runtime).unwrap();
    set(0o755);
    let mut d = Raw::spawn(
        &mut daemon_in_runtime_dir(dir.path(), &runtime),
        &dir.path().join("2.log"),
    );
    d.wait_serving(&api);
    assert_eq!(mode_of(&runtime), 0o755);
    assert_eq!(mode_of(&api), 0o600);
}

#[test]
fn non_root_daemon_refuses_a_tmp_runtime_dir_another_user_made() {
    // The reported case: no XDG_RUNTIME_DIR, so a user's daemon uses
    // /tmp/ramd-UID, which another user created first (0777).
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: needs root to act as two users");
        return;
    }
    let uid = 64_917u32;
    let squatted = std::path::PathBuf::from(format!("/tmp/ramd-{uid}"));
    let _ = std::fs::remove_dir_all(&squatted);
    std::fs::create_dir(&squatted).unwrap();
    std::os::unix::fs::chown(&squatted, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&squatted, std::fs::Permissions::from_mode(0o777)).unwrap();
    let home = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(home.path(), Some(uid), Some(uid)).unwrap();
    let out = run(tool("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_ramd"))
        .args(["daemon", "--no-config", "--drive", "ram0=1M"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("XDG_STATE_HOME")
        .env("HOME", home.path()))
    .failed();
    let _ = std::fs::remove_dir_all(&squatted);
    assert_eq!(out.code(), 1, "{out}");
    assert!(
        out.stderr
            .contains(&format!("/tmp/ramd-{uid} is owned by uid 65534")),
        "{out}"
    );
    assert!(out.stderr.contains("XDG_RUNTIME_DIR"), "{out}");
}

#[test]
fn restart_right_after_kill_9_takes_the_dead_daemons_lock_over() {
    if !require(&["nbdcopy"]) {
        return;
    }
    // Memory in the drive makes the killed process take a while to exit:
    // it shows as dead (a zombie) while the kernel frees its pages, and
    // only then closes its files, the lock among them.
    let d = Daemon::start(&["ram0=1G"]);
    let fill = d.dir().join("fill.bin");
    std::fs::write(&fill, random_bytes(768 << 20, 14)).unwrap();
    run(tool("nbdcopy").arg(&fill).arg(d.uri("ram0"))).ok();
    std::fs::remove_file(&fill).unwrap();
    let old = d.pid();
    // No wait between the kill and the restart (a reaping parent would
    // wait until the exit is complete; a shell's `kill -9` does not).
    signal(old, libc::SIGKILL);
    let mut cmd = ramd();
    cmd.args(["daemon", "--no-config", "--drive", "ram0=1M", "--socket"])
        .arg(d.socket())
        .arg("--api-socket")
        .arg(d.api_socket())
        .arg("--state-dir")
        .arg(d.dir().join("state"));
    let mut new = Raw::spawn(&mut cmd, &d.dir().join("restart.log"));
    new.wait_serving(d.api_socket());
    let (_, body) = http(d.api_socket(), "GET", "/v1/health", None);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_ne!(v["pid"].as_u64(), Some(u64::from(old)), "{v}");
    assert!(!new.log().contains("already running"), "{}", new.log());
}
