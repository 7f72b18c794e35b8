//! A graceful stop saves every persistent drive whatever happens to the
//! daemon's stderr: a pipe whose reader died with the same Ctrl-C
//! (`ramd daemon 2>&1 | tee log`), or a pipe that is full because nobody
//! reads it. Before the fix, the first case panicked in tracing's error
//! report (exit 101, every drive after the first lost its unsaved data)
//! and the second hung the shutdown in the signal thread's first log line.

mod common;

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const DRIVES: [&str; 3] = ["p1", "p2", "p3"];
const DATA_BYTES: usize = 64 << 20;

/// `ramd daemon` with three persistent drives whose writes stay unsaved
/// until shutdown (periodic, one sync an hour), its stderr to `stderr`.
fn start(dir: &Path, stderr: Stdio) -> Child {
    let mut cmd = ramd();
    cmd.arg("daemon")
        .arg("--no-config")
        .arg("--socket")
        .arg(dir.join("nbd.sock"))
        .arg("--api-socket")
        .arg(dir.join("api.sock"))
        .arg("--state-dir")
        .arg(dir.join("state"));
    for name in DRIVES {
        cmd.arg("--drive").arg(format!(
            "{name}=64M,persist,durability=periodic,sync-interval=1h"
        ));
    }
    let _ = std::fs::remove_file(dir.join("api.sock"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn ramd");
    let api = dir.join("api.sock");
    wait_until("ramd to listen", DAEMON_TIMEOUT, || {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("ramd exited early with {s}");
        }
        std::os::unix::net::UnixStream::connect(&api).is_ok()
    });
    for name in DRIVES {
        wait_until(&format!("drive {name} ready"), DAEMON_TIMEOUT, || {
            http(&api, "GET", &format!("/v1/drives/{name}"), None)
                .1
                .contains("\"ready\"")
        });
    }
    child
}

fn uri(dir: &Path, name: &str) -> String {
    format!(
        "nbd+unix:///{name}?socket={}",
        dir.join("nbd.sock").display()
    )
}

/// Fills every drive with its own random 64 MiB through nbdcopy (no
/// flush asked: the data is dirty in RAM until the shutdown saves it).
fn fill(dir: &Path) {
    for (i, name) in DRIVES.iter().enumerate() {
        let src = dir.join(format!("{name}.src"));
        std::fs::write(&src, random_bytes(DATA_BYTES, 17 + i as u64)).unwrap();
        run(tool("nbdcopy").arg(&src).arg(uri(dir, name))).ok();
    }
}

/// Each drive read back after a restart (stderr to a file) equals what
/// was written.
fn check_after_restart(dir: &Path) {
    let log = File::create(dir.join("restart.log")).unwrap();
    let mut d = start(dir, Stdio::from(log));
    for name in DRIVES {
        let back = dir.join(format!("{name}.back"));
        run(tool("nbdcopy").arg(uri(dir, name)).arg(&back)).ok();
        let same = std::fs::read(&back).unwrap()
            == std::fs::read(dir.join(format!("{name}.src"))).unwrap();
        assert!(same, "drive {name} lost its data across the stop");
    }
    signal(d.id(), libc::SIGTERM);
    assert!(wait_timeout(&mut d, DAEMON_TIMEOUT).is_some_and(|s| s.success()));
}

/// A pipe (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: pipe2 succeeded, so both descriptors are open and ours alone.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

#[test]
fn sigint_with_stderr_on_a_pipe_whose_reader_died_saves_every_drive() {
    if !require(&["nbdcopy"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // `ramd daemon 2>&1 | cat`, where Ctrl-C ends `cat` too (as `tee`).
    let mut d = start(dir, Stdio::piped());
    let mut reader = Command::new("cat")
        .stdin(Stdio::from(d.stderr.take().unwrap()))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn cat");
    fill(dir);
    // The reader goes first, so every log line of the shutdown meets a
    // broken pipe.
    let _ = reader.kill();
    let _ = reader.wait();
    signal(d.id(), libc::SIGINT);
    let status = wait_timeout(&mut d, Duration::from_secs(120)).expect("ramd exits on SIGINT");
    assert!(
        status.success(),
        "ramd ended with {status} on a broken stderr"
    );
    check_after_restart(dir);
}

#[test]
fn sigterm_with_a_full_stderr_pipe_saves_every_drive_and_exits() {
    if !require(&["nbdcopy"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (read_end, write_end) = pipe();
    let mut d = start(dir, Stdio::from(write_end.try_clone().unwrap()));
    fill(dir);
    // Fill the pipe to the brim (nobody reads it): every later write to
    // it blocks. Through a second open of the pipe, so that O_NONBLOCK is
    // ours alone and the daemon's descriptor still blocks.
    let ours = format!("/proc/self/fd/{}", write_end.as_raw_fd());
    let mut w = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(ours)
        .expect("open the pipe again");
    drop(write_end);
    let chunk = vec![b'x'; 4096];
    while w.write(&chunk).is_ok() {}
    signal(d.id(), libc::SIGTERM);
    let status = wait_timeout(&mut d, Duration::from_secs(120));
    if status.is_none() {
        let _ = d.kill();
        let _ = d.wait();
    }
    drop((read_end, w));
    let status = status.expect("ramd exits on SIGTERM although its stderr is full");
    assert!(
        status.success(),
        "ramd ended with {status} on a full stderr"
    );
    check_after_restart(dir);
}
