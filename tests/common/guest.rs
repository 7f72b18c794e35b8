//! Scripts run as root in a QEMU guest with a real kernel block layer
//! (`scripts/guest.sh run`): ublk_drv, nbd, nvme-tcp, nvmet-tcp, brd,
//! null_blk, md/raid1 and loop, which this machine's kernel lacks. The guest
//! sees the host's filesystem (through 9p, with a tmpfs overlay), so the
//! script runs this repository's `ramd` and the host's tools against the
//! guest kernel's devices; `$RAMD` is the binary under test.
//!
//! One boot takes ~10 s of emulation (TCG) before the script starts, so a
//! test groups its checks into one script. Guest figures are only ratios
//! within one run, never speeds. Needs `scripts/guest.sh setup` once
//! (scripts/test-deps.sh runs it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{describe, try_run, SKIP_ENV};

/// The script's own time limit in the guest (`--timeout`). Generous: the
/// guest is emulated and the machine may be busy with other builds.
pub const SCRIPT_TIMEOUT: Duration = Duration::from_secs(600);

/// What the host allows on top of the script's limit for the boot and the
/// power-off before guest.sh kills QEMU (RAMD_GUEST_BOOT_ALLOWANCE).
pub const BOOT_ALLOWANCE: Duration = Duration::from_secs(180);

/// The harness script, in this repository.
pub fn guest_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/guest.sh")
}

/// How a guest script ended, and what it printed.
#[derive(Debug)]
pub struct GuestOutput {
    /// The script's exit code.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// The guest kernel's messages at the end of the script.
    pub dmesg: String,
    /// The serial console (the guest's init and kernel oopses).
    pub console: String,
    /// Host seconds from QEMU's start to the script's start (the boot).
    pub boot_secs: f64,
    /// Guest seconds the script ran.
    pub script_secs: f64,
    /// What guest.sh itself printed on stderr (timings, dmesg tail).
    pub harness: String,
    /// The results share (`$GUEST_RESULTS` in the guest is its `results`).
    dir: tempfile::TempDir,
}

impl GuestOutput {
    /// Asserts the script exited 0.
    #[track_caller]
    pub fn ok(self) -> GuestOutput {
        assert_eq!(self.code, 0, "guest script failed: {self}");
        self
    }

    /// A file the script left in `$GUEST_RESULTS`, if it did.
    pub fn file(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join("results").join(name)).ok()
    }

    /// The last `n` lines of dmesg.
    pub fn dmesg_tail(&self, n: usize) -> String {
        let lines: Vec<&str> = self.dmesg.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl std::fmt::Display for GuestOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit code {} (boot {:.1}s, script {:.1}s)\n  stdout:\n{}\n  stderr:\n{}\n  \
             guest dmesg (last 60 lines):\n{}",
            self.code,
            self.boot_secs,
            self.script_secs,
            self.stdout,
            self.stderr,
            self.dmesg_tail(60)
        )
    }
}

/// True when `scripts/guest.sh setup` was done (QEMU, the guest kernel and
/// its initramfs are there). Otherwise fails the test naming the command,
/// or skips it (returns false) when RAMD_SKIP_MISSING_TOOLS=1, like
/// [`super::require`].
#[track_caller]
pub fn require_guest() -> bool {
    require(false)
}

/// [`require_guest`] for the second guest, whose kernel is Debian
/// unstable's newest (`RAMD_GUEST_NEXT=1 scripts/guest.sh setup`): for
/// what 6.12 lacks (ublk's UPDATE_SIZE).
#[track_caller]
pub fn require_next_guest() -> bool {
    require(true)
}

#[track_caller]
fn require(next: bool) -> bool {
    let mut cmd = Command::new("bash");
    cmd.arg(guest_sh()).arg("check");
    if next {
        cmd.env("RAMD_GUEST_NEXT", "1");
    }
    let check = try_run(&mut cmd, Duration::from_secs(60));
    let why = match check {
        Ok(o) if o.status.success() => return true,
        Ok(o) => o.stderr.trim().to_owned(),
        Err(e) => e,
    };
    let setup = if next {
        "RAMD_GUEST_NEXT=1 scripts/guest.sh setup"
    } else {
        "scripts/guest.sh setup"
    };
    let message = format!(
        "the guest-kernel harness is not set up: {why}; run `{setup}` as root \
         (scripts/test-deps.sh does)"
    );
    if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
        eprintln!("SKIPPED: {message} ({SKIP_ENV}=1)");
        return false;
    }
    panic!("{message} (set {SKIP_ENV}=1 to skip such tests)");
}

/// Runs `script` (bash) in a fresh guest with the default 2 vCPUs and 2 GiB,
/// `$RAMD` set to the binary under test, the repository as the working
/// directory. Panics when the guest fails to boot or the script outlives
/// [`SCRIPT_TIMEOUT`] (with the console, output so far and dmesg); the
/// script's exit code is the caller's to judge (`.ok()`).
#[track_caller]
pub fn run(script: &str) -> GuestOutput {
    run_with(script, &[])
}

/// Runs `script`, which must exit 0 after printing `end` (its last
/// check passed), and echoes its `observed:` lines to the test log.
#[track_caller]
pub fn run_to_end(script: &str, end: &str) -> GuestOutput {
    let out = run(script).ok();
    assert!(out.stdout.contains(end), "the script ended early: {out}");
    for line in out.stdout.lines().filter(|l| l.starts_with("observed:")) {
        eprintln!("{line}");
    }
    out
}

/// [`run`] in the second guest (Debian unstable's newest kernel).
#[track_caller]
pub fn run_next(script: &str) -> GuestOutput {
    run_in(script, &[], true)
}

/// [`run`] with extra `guest.sh run` options (`--mem 4G`, `--cpus 1`, ...).
#[track_caller]
pub fn run_with(script: &str, options: &[&str]) -> GuestOutput {
    run_in(script, options, false)
}

#[track_caller]
fn run_in(script: &str, options: &[&str], next: bool) -> GuestOutput {
    let results = tempfile::Builder::new()
        .prefix("ramd-guest-")
        .tempdir()
        .expect("create a temp dir");
    let script_file = results.path().join("script.sh");
    std::fs::write(&script_file, script).expect("write the guest script");
    let out_dir = results.path().join("results");
    let mut cmd = Command::new("bash");
    cmd.arg(guest_sh())
        .arg("run")
        .args(options)
        .arg("--timeout")
        .arg(SCRIPT_TIMEOUT.as_secs().to_string())
        .arg("--results")
        .arg(&out_dir)
        .arg("-e")
        .arg(format!("RAMD={}", env!("CARGO_BIN_EXE_ramd")))
        .arg(&script_file)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env(
            "RAMD_GUEST_BOOT_ALLOWANCE",
            BOOT_ALLOWANCE.as_secs().to_string(),
        );
    if next {
        cmd.env("RAMD_GUEST_NEXT", "1");
    }
    let cmdline = describe(&cmd);
    // guest.sh kills QEMU itself at its deadline; this bound only catches
    // a hung guest.sh (QEMU dies with it: setpriv --pdeathsig).
    let limit = SCRIPT_TIMEOUT + BOOT_ALLOWANCE + Duration::from_secs(60);
    let started = Instant::now();
    let harness = try_run(&mut cmd, limit).unwrap_or_else(|e| panic!("{e}"));
    let read = |name: &str| std::fs::read_to_string(out_dir.join(name)).unwrap_or_default();
    let code = read("exit_code").trim().parse::<i32>().ok();
    let status = read("status");
    let Some(code) = code.filter(|_| status.trim() == "ok") else {
        panic!(
            "the guest did not run the script to its end ({cmdline} exited {} after {:.0?}; \
             status {:?}):\n  guest.sh stdout:\n{}\n  guest.sh stderr:\n{}\n  console:\n{}",
            harness.status,
            started.elapsed(),
            status.trim(),
            harness.stdout,
            harness.stderr,
            read("console.log"),
        );
    };
    let uptime = |name: &str| {
        read(name)
            .split_whitespace()
            .next()
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // The boot: from guest.sh's start to the guest's first write of
    // `started` (close enough to QEMU's start: guest.sh starts it at once).
    let boot_secs = std::fs::metadata(out_dir.join("started"))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .map(|since| started.elapsed().as_secs_f64() - since.as_secs_f64())
        .unwrap_or(0.0);
    let out = GuestOutput {
        code,
        stdout: read("stdout"),
        stderr: read("stderr"),
        dmesg: read("dmesg"),
        console: read("console.log"),
        boot_secs,
        script_secs: uptime("finished") - uptime("started"),
        harness: harness.stderr,
        dir: results,
    };
    eprintln!(
        "guest: boot {:.1}s, script {:.1}s, exit code {}",
        out.boot_secs, out.script_secs, out.code
    );
    out
}
