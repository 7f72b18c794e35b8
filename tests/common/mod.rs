//! Helpers shared by the integration tests that drive a real `ramd serve`
//! process with the command-line NBD clients users run (nbdinfo, qemu-img,
//! nbdsh, fio, nbdfuse, ...).
//!
//! Everything here is bounded: every child process gets a timeout and every
//! wait a deadline, so a hung tool or daemon fails the test with a message
//! instead of hanging `cargo test`.

// Each integration-test crate that includes this module uses a subset of it.
#![allow(dead_code)]

pub mod block;
pub mod garage;
pub mod guest;
pub mod mounts;
pub mod nbdkit;
pub mod nbdserver;
pub mod openapi;
pub mod pki;
pub mod pysession;
pub mod snapshots;

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Set to 1 to skip (instead of fail) tests whose tools are not installed.
pub const SKIP_ENV: &str = "RAMD_SKIP_MISSING_TOOLS";

/// Default limit for one client-tool run. Generous: the machine may be busy
/// running other tests; nothing here takes more than a few seconds when idle.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(90);

/// How long the daemon may take to create its socket or to exit on SIGTERM.
/// Generous for the same reason.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(60);

/// The deadline of a [`wait_until`] for something that takes a moment when
/// idle (a background thread's next round, a daemon noticing a change).
/// Generous, since the machine may be busy: it only costs time when the
/// awaited thing never happens, that is when the test fails anyway.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The Debian 12 package that provides each tool the tests use. The message
/// for a missing tool names it, and scripts/test-deps.sh installs them all.
fn package_for(tool: &str) -> &'static str {
    match tool {
        "qemu-img" | "qemu-io" => "qemu-utils",
        "nbdinfo" | "nbdcopy" | "nbdfuse" => "libnbd-bin",
        "nbdsh" => "python3-libnbd",
        "fio" => "fio",
        "nbdkit" => "nbdkit",
        "losetup" | "mount" | "umount" => "mount",
        "fstrim" => "util-linux",
        "mkfs.ext4" | "e2fsck" => "e2fsprogs",
        "fusermount3" => "fuse3",
        "sha256sum" | "cp" | "sync" => "coreutils",
        "curl" => "curl",
        "openssl" => "openssl",
        "chromium" => "chromium",
        "chromedriver" => "chromium-driver",
        other => panic!("test bug: no package known for tool '{other}'"),
    }
}

/// The PATH children run with: the system directories first, then the
/// caller's PATH. System first because a pyenv (or similar) `python3` earlier
/// on PATH lacks Debian's `nbd` module, and nbdsh is a shell script that runs
/// plain `python3 -m nbd`; the sbin directories because losetup, mkfs.ext4
/// and e2fsck live there and may be missing from a non-login PATH.
pub fn child_path() -> OsString {
    let mut dirs = vec![
        PathBuf::from("/usr/sbin"),
        PathBuf::from("/usr/bin"),
        PathBuf::from("/sbin"),
        PathBuf::from("/bin"),
    ];
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(dirs).expect("PATH entries contain no ':'")
}

fn find_tool(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&child_path())
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// A command for a client tool, run with [`child_path`].
pub fn tool(name: &str) -> Command {
    let mut c = Command::new(name);
    c.env("PATH", child_path());
    c
}

/// The `ramd` binary under test.
pub fn ramd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ramd"))
}

/// Reports a missing prerequisite: panics (a missing tool must not look like a
/// pass), or with RAMD_SKIP_MISSING_TOOLS=1 prints a skip notice and returns
/// false so the test can return early.
#[track_caller]
fn prerequisite_missing(message: &str) -> bool {
    if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
        eprintln!("SKIPPED: {message} ({SKIP_ENV}=1)");
        return false;
    }
    panic!("{message} (or run scripts/test-deps.sh; set {SKIP_ENV}=1 to skip such tests)");
}

/// True when every tool is installed. Otherwise fails the test, or skips it
/// (returns false) when RAMD_SKIP_MISSING_TOOLS=1. Use as
/// `if !require(&["nbdinfo"]) { return; }`.
#[track_caller]
pub fn require(tools: &[&str]) -> bool {
    for &t in tools {
        let package = package_for(t);
        if find_tool(t).is_none() {
            return prerequisite_missing(&format!(
                "missing tool {t}: install with apt-get install {package}"
            ));
        }
        // Upstream fio builds may lack the libnbd engine the fio tests use.
        if t == "fio" {
            let help = try_run(tool("fio").arg("--enghelp=nbd"), TOOL_TIMEOUT);
            if !help.is_ok_and(|o| o.stdout.contains("uri")) {
                return prerequisite_missing(
                    "missing tool fio with the nbd ioengine: install with apt-get install fio",
                );
            }
        }
    }
    true
}

/// True when `/usr/bin/python3` can import `module` (from Debian's
/// `package`). Fails or skips like [`require`].
#[track_caller]
pub fn require_python_module(module: &str, package: &str) -> bool {
    let ok = try_run(
        tool("/usr/bin/python3").args(["-c", &format!("import {module}")]),
        TOOL_TIMEOUT,
    )
    .is_ok_and(|o| o.status.success());
    if ok {
        return true;
    }
    prerequisite_missing(&format!(
        "missing Python module {module}: install with apt-get install {package}"
    ))
}

/// Runs a Python script with Debian's python3 (which has the nbd and
/// prometheus_client modules), passing `args` as sys.argv[1:].
pub fn python(script: &str, args: &[&str]) -> Output {
    run(tool("/usr/bin/python3").arg("-c").arg(script).args(args))
}

/// True when the test can attach block devices: root, /dev/fuse and loop
/// devices. Fails or skips like [`require`].
#[track_caller]
pub fn require_root_block_devices() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return prerequisite_missing("this test needs root (it uses losetup and mount)");
    }
    for (dev, hint) in [
        (
            "/dev/fuse",
            "load the fuse module or give the container /dev/fuse",
        ),
        (
            "/dev/loop-control",
            "load the loop module or give the container loop devices",
        ),
    ] {
        if !Path::new(dev).exists() {
            return prerequisite_missing(&format!("missing {dev}: {hint}"));
        }
    }
    true
}

/// What a finished child printed, and how it ended.
#[derive(Debug)]
pub struct Output {
    pub cmdline: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Asserts the command succeeded.
    #[track_caller]
    pub fn ok(self) -> Output {
        assert!(self.status.success(), "command failed: {self}");
        self
    }

    /// Asserts the command failed (non-zero exit).
    #[track_caller]
    pub fn failed(self) -> Output {
        assert!(
            !self.status.success(),
            "command succeeded but should have failed: {self}"
        );
        self
    }

    /// The exit code; panics when the child was killed by a signal.
    #[track_caller]
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("killed by a signal: {self}"))
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}\n  status: {}\n  stdout:\n{}\n  stderr:\n{}",
            self.cmdline, self.status, self.stdout, self.stderr
        )
    }
}

/// Waits for `child` at most `timeout`; None when it is still running.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() >= deadline => return None,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("cannot wait for child {}: {e}", child.id()),
        }
    }
}

/// Polls `cond` every 20 ms until it holds; panics after `timeout`. Wait
/// on what the test can observe this way, never with a fixed sleep and
/// then an assertion: on a busy machine that sleep may be too short.
#[track_caller]
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_all(mut f: File) -> String {
    let mut bytes = Vec::new();
    let _ = f
        .seek(SeekFrom::Start(0))
        .and_then(|_| f.read_to_end(&mut bytes));
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `program arg...` for messages, quoting only arguments that need it
/// (Command's Debug form also prints the PATH we set, which is noise).
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| {
            let a = a.to_string_lossy();
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_=+/.,:@%".contains(c));
            if plain {
                a.into_owned()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` to completion with stdin closed, capturing its output; an Err
/// (with whatever it printed) when it cannot start or outlives `timeout`.
/// Never panics, so it is safe in `Drop` during unwinding.
pub fn try_run(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    let cmdline = describe(cmd);
    // Files, not pipes: a chatty child can never block on a full pipe while
    // we poll for its exit.
    let capture = || tempfile::tempfile().map_err(|e| format!("cannot create a temp file: {e}"));
    let (out, err) = (capture()?, capture()?);
    let clone = |f: &File| {
        f.try_clone()
            .map_err(|e| format!("cannot dup a temp file: {e}"))
    };
    cmd.stdin(Stdio::null())
        .stdout(clone(&out)?)
        .stderr(clone(&err)?);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {cmdline}: {e}"))?;
    let Some(status) = wait_timeout(&mut child, timeout) else {
        let _ = child.kill();
        // Bounded: a child stuck in the kernel (say, on a hung FUSE mount)
        // cannot die until that I/O ends; leave it rather than hang too.
        let _ = wait_timeout(&mut child, Duration::from_secs(5));
        return Err(format!(
            "{cmdline} did not finish within {timeout:?}\n  stdout:\n{}\n  stderr:\n{}",
            read_all(out),
            read_all(err)
        ));
    };
    Ok(Output {
        cmdline,
        status,
        stdout: read_all(out),
        stderr: read_all(err),
    })
}

/// [`try_run`] with [`TOOL_TIMEOUT`], panicking when the command cannot run
/// or hangs. The exit status is left to the caller (`.ok()`, `.failed()`).
#[track_caller]
pub fn run(cmd: &mut Command) -> Output {
    try_run(cmd, TOOL_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

/// A child that is killed (and reaped, bounded) when the guard drops, so a
/// failing test leaves no background load running.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = wait_timeout(&mut self.0, Duration::from_secs(5));
        }
    }
}

/// Sends `sig` to a child process.
pub fn signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill has no memory preconditions; the pid is our own child,
    // not yet reaped, so it cannot name an unrelated process.
    unsafe { libc::kill(pid, sig) };
}

/// A random test's seed: `$var` when set (to replay a run), else from the
/// clock; printed with how to replay it. Never even (xorshift needs a
/// non-zero state).
pub fn seed_from_env(var: &str, what: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1;
    eprintln!("{what} seed {seed} (replay with {var}={seed})");
    seed
}

/// Deterministic pseudo-random bytes from `ramd::sim::Rng`: incompressible
/// test data without a `rand` dependency, reproducible from the seed.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    ramd::sim::Rng::seed(seed).bytes(len)
}

/// Bytes to write: never zero (a write lost to a hole shows), different
/// for every `seed` below 251, and different in every 4 KiB page (a write
/// that landed elsewhere shows). `pattern_at(offset, ..)` is the part from
/// `offset` on of one long pattern, so the bytes at a drive offset are the
/// same whatever write put them there. [`PATTERN_PY`] makes the same
/// bytes in Python.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    pattern_at(0, len, seed)
}

/// See [`pattern`].
pub fn pattern_at(offset: u64, len: usize, seed: u64) -> Vec<u8> {
    let s = seed % 251 * 101;
    (offset..offset + len as u64)
        .map(|p| ((p * 131 + (p >> 12) * 7 + s) % 251) as u8 + 1)
        .collect()
}

/// Python for scripts that write or check [`pattern`]'s bytes: defines
/// `pattern(n, seed, at=0)`, the same as `pattern_at(at, n, seed)`.
pub const PATTERN_PY: &str = "
def pattern(n, seed, at=0):
    s = seed % 251 * 101
    return bytes((p * 131 + (p >> 12) * 7 + s) % 251 + 1 for p in range(at, at + n))
";

/// Text from a vocabulary in an order no two pages share: lz4 ~2x, zstd
/// a good deal better (as logs and source trees are).
pub fn word_salad(len: usize, seed: u64) -> Vec<u8> {
    let words = [
        "drive ", "page ", "memory ", "zstd ", "lz4 ", "ramd ", "idle\n", "sync ", "cache ",
        "block ", "write ", "read ", "tail ", "flush\n",
    ];
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(words[(x % words.len() as u64) as usize].as_bytes());
        out.extend_from_slice(&x.to_le_bytes()[..(x % 3) as usize]);
    }
    out.truncate(len);
    out
}

/// A running `ramd daemon` in its own temporary directory (which also holds
/// the sockets, its log and any files the test makes). Dropping it stops the
/// daemon: SIGTERM, a bounded wait, then SIGKILL.
pub struct Daemon {
    dir: tempfile::TempDir,
    socket: PathBuf,
    api_socket: PathBuf,
    child: Option<Child>,
    /// The command line and environment, for [`Daemon::restart`].
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Daemon {
    /// Starts `ramd serve` with one `--drive` per spec and waits for its
    /// sockets (the NBD socket and API socket in the temp dir).
    #[track_caller]
    pub fn start(drives: &[&str]) -> Daemon {
        let mut args = vec!["serve".to_owned()];
        for d in drives {
            args.push("--drive".into());
            args.push((*d).into());
        }
        Daemon::launch(&args, &[])
    }

    /// Starts `ramd ARGS... --socket DIR/nbd.sock --api-socket DIR/api.sock
    /// --no-config --state-dir DIR/state` (ARGS starts with `daemon` or
    /// `serve`; `--config` / `--state-dir` in ARGS replace those defaults)
    /// with extra environment, and waits until the API socket exists.
    #[track_caller]
    pub fn launch(args: &[String], env: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("ramd-test-")
            .tempdir()
            .expect("create a temp dir");
        let socket = dir.path().join("nbd.sock");
        let api_socket = dir.path().join("api.sock");
        let mut d = Daemon {
            dir,
            socket,
            api_socket,
            child: None,
            args: args.to_vec(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        d.spawn();
        d
    }

    /// The state directory (persistent drives): DIR/state unless the
    /// command line names another.
    pub fn state_dir(&self) -> PathBuf {
        match self.args.iter().position(|a| a == "--state-dir") {
            Some(i) => PathBuf::from(&self.args[i + 1]),
            None => self.dir.path().join("state"),
        }
    }

    /// Starts the daemon process with the saved command line (its log is
    /// appended to) and waits for its sockets.
    #[track_caller]
    fn spawn(&mut self) {
        // Stale sockets of a killed daemon would look like a ready one.
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(&self.api_socket);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("ramd.log"))
            .expect("open the daemon log");
        let mut cmd = ramd();
        cmd.args(&self.args)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--api-socket")
            .arg(&self.api_socket);
        if !self.args.iter().any(|a| a == "--config") {
            cmd.arg("--no-config");
        }
        if !self.args.iter().any(|a| a == "--state-dir") {
            cmd.arg("--state-dir").arg(self.dir.path().join("state"));
        }
        // Its own runtime directory: daemons of tests running in parallel
        // must not take over each other's ublk records or directories.
        if !self.args.iter().any(|a| a == "--runtime-dir") {
            cmd.arg("--runtime-dir").arg(self.dir.path().join("run"));
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup the log"))
            .stderr(log);
        self.child = Some(cmd.spawn().expect("spawn ramd"));
        let (nbd, api) = (self.socket.clone(), self.api_socket.clone());
        // The API listening, not just its file there: after a kill -9 the
        // dead daemon's socket files stay until the new one has taken the
        // lock over and bound its own (a stale one refuses connections).
        // The API is bound after the NBD socket, so both are ready then;
        // the NBD socket is not probed, so no test sees an extra client.
        wait_until("ramd to listen on its sockets", DAEMON_TIMEOUT, || {
            if let Some(status) = self.child_mut().try_wait().expect("try_wait ramd") {
                panic!("ramd exited early with {status}; log:\n{}", self.log());
            }
            nbd.exists() && std::os::unix::net::UnixStream::connect(&api).is_ok()
        });
    }

    /// Kills the daemon with SIGKILL (a crash: nothing is saved) and reaps
    /// it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.id(), libc::SIGKILL);
            let _ = c.wait();
        }
    }

    /// Starts the daemon again (after `kill9` or `terminate`) with the same
    /// command line, sockets and state directory.
    #[track_caller]
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the daemon is still running");
        self.spawn();
    }

    /// The API socket.
    pub fn api_socket(&self) -> &Path {
        &self.api_socket
    }

    /// A `ramd` client command aimed at this daemon.
    pub fn cli(&self) -> Command {
        let mut c = ramd();
        c.env("RAMD_API_SOCKET", &self.api_socket);
        c
    }

    /// One HTTP request to the API: (status, body).
    #[track_caller]
    pub fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        http(&self.api_socket, method, path, body)
    }

    fn child_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("ramd was already stopped")
    }

    /// The temporary directory the daemon and the test share.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("ramd is running").id()
    }

    /// The NBD URI of an export ("" is the default export).
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    /// Everything the daemon logged so far. Its lines reach the file from
    /// a writer thread of their own, a moment after the event (at exit
    /// they are all written): to look for a line of a running daemon, use
    /// [`Daemon::wait_log`].
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ramd.log")).unwrap_or_default()
    }

    /// Waits (bounded, generously) until the log satisfies `holds`;
    /// returns the log then. For lines of a running daemon (see
    /// [`Daemon::log`]); a line being there means every line logged
    /// before it is there too.
    #[track_caller]
    pub fn wait_log(&self, what: &str, holds: impl Fn(&str) -> bool) -> String {
        let mut log = String::new();
        let waiting = format!("{what} in the daemon's log");
        // The log itself is printed on failure by Daemon's drop.
        wait_until(&waiting, WAIT_TIMEOUT, || {
            log = self.log();
            holds(&log)
        });
        log
    }

    /// True while the daemon process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().expect("try_wait ramd").is_none(),
            None => false,
        }
    }

    /// SIGKILL, as a crash: waits for the daemon to die and forgets it
    /// (so dropping the guard signals nothing).
    #[track_caller]
    pub fn kill_hard(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("ramd is running");
        let _ = child.kill();
        wait_timeout(&mut child, DAEMON_TIMEOUT).expect("ramd dies on SIGKILL")
    }

    /// Sends SIGTERM and waits (bounded) for the daemon to exit.
    #[track_caller]
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.pid();
        signal(pid, libc::SIGTERM);
        match wait_timeout(self.child_mut(), DAEMON_TIMEOUT) {
            Some(status) => {
                self.child = None;
                status
            }
            None => {
                signal(pid, libc::SIGKILL);
                let _ = self.child_mut().wait();
                self.child = None;
                panic!(
                    "ramd did not exit within {DAEMON_TIMEOUT:?} of SIGTERM; log:\n{}",
                    self.log()
                );
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The test failed: the daemon's side of the story helps.
            eprintln!(
                "--- ramd log ({}) ---\n{}",
                self.dir().display(),
                self.log()
            );
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), libc::SIGTERM);
        if wait_timeout(&mut child, DAEMON_TIMEOUT).is_none() {
            eprintln!("ramd ignored SIGTERM; killing it");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One HTTP/1.1 request over a unix socket (Connection: close): the
/// status and the (de-chunked) body. Panics on transport errors.
#[track_caller]
pub fn http(socket: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    use std::io::Write;
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    s.set_read_timeout(Some(TOOL_TIMEOUT)).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: ramd\r\nConnection: close\r\n");
    if body.is_some() {
        req.push_str("Content-Type: application/json\r\n");
    }
    let body = body.unwrap_or("");
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).expect("UTF-8 response");
    let (head, rest) = text.split_once("\r\n\r\n").expect("a header block");
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head}"));
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        let mut out = String::new();
        let mut r = rest;
        loop {
            let (len, tail) = r.split_once("\r\n").expect("chunk size line");
            let n = usize::from_str_radix(len.trim(), 16).expect("hex chunk size");
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            r = &tail[n + 2..];
        }
        out
    } else {
        rest.to_owned()
    };
    (status, body)
}
