//! `ramd daemon --supervise`: a tiny process that starts the serving
//! process (this binary again, same arguments, the link's descriptor in
//! [`serving::FD_ENV`]), keeps the descriptors it registers (each RAM
//! drive's memfd, with its settings as an opaque blob), and when it dies
//! of a signal (kill -9, a crash) or exits non-zero after it was ready,
//! starts it again and hands everything back, so RAM drives come back
//! with their bytes.
//!
//! It is small on purpose, so that it does not crash itself: no drive
//! code, no network, no parsing beyond the record header
//! ([`super::wire`]); one thread reading the link, the main one waiting
//! for signals. SIGTERM, SIGINT and SIGHUP go to the serving process;
//! after SIGTERM or SIGINT its exit, whatever the status, ends the
//! supervisor with it. An exit 0 ends it too (a graceful stop: RAM drives
//! end, as without a supervisor). A non-zero exit before the serving
//! process said it was ready ends the supervisor with that code when no
//! serving process was ever ready (nothing was served, so nothing kept
//! holds an acknowledged write: a bad configuration does not loop), or
//! when nothing but listening sockets and counts is kept. A restart is at once
//! after a run that served for at least a second, and for the first
//! three in a row of runs that did not; further ones wait 100 ms,
//! doubling up to 5 s (a crash loop does not spin).
//!
//! Upgrades (`ramd upgrade`): the serving process sends `Kind::Upgrade`
//! with the new binary's path, then stops gracefully (exit 0). The
//! supervisor then starts that binary instead, with everything kept; if
//! it ends before it said it was ready (it cannot read the hand-over's
//! version, it crashes at start), the binary before it is started again,
//! everything still kept, and the reason says so. The supervisor itself
//! is never replaced (it is small and rarely changes: restart the daemon
//! to upgrade it).
//!
//! If the supervisor is killed, the serving process keeps serving
//! (`serving` module docs) but is no longer protected; the memfds live on
//! in the serving process's mappings until it exits.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::link;
use super::serving;
use super::wire::Kind;

/// What is kept: key → (blob, descriptors).
type Kept = Arc<Mutex<BTreeMap<String, (Vec<u8>, Vec<OwnedFd>)>>>;

/// What one run of the serving process tells the supervisor (written by
/// the thread reading its records).
#[derive(Default)]
struct RunState {
    ready: AtomicBool,
    /// The binary an upgrade asked for (`Kind::Upgrade`).
    upgrade: Mutex<Option<PathBuf>>,
}

/// What happens after a run ends.
enum Next {
    Exit(i32),
    Restart,
}

/// The supervisor's memory across runs.
struct Supervisor {
    args: Vec<OsString>,
    kept: Kept,
    /// The binary started next: this one (`/proc/self/exe`) until an
    /// upgrade succeeds.
    binary: PathBuf,
    /// An upgrade being tried: (new binary, the one before).
    trying: Option<(PathBuf, PathBuf)>,
    restarts: u64,
    reason: String,
    quick: u32,
    backoff: Duration,
    /// Some serving process said it was ready (served) in this
    /// supervisor's life.
    served: bool,
}

/// Runs the supervisor over the serving process started with `args` (the
/// daemon's arguments, without the program name); returns the exit code.
pub fn run(args: Vec<OsString>) -> i32 {
    let signals = block_signals();
    let mut sv = Supervisor {
        args,
        kept: Arc::default(),
        binary: PathBuf::from("/proc/self/exe"),
        trying: None,
        restarts: 0,
        reason: String::new(),
        quick: 0,
        backoff: Duration::from_millis(100),
        served: false,
    };
    loop {
        let started = Instant::now();
        let state = Arc::new(RunState::default());
        let (mut child, reader) = match sv.start(&state) {
            Ok(c) => c,
            Err(e) if sv.trying.is_some() => {
                sv.roll_back(&format!("it did not start: {e}"));
                continue;
            }
            Err(e) => {
                eprintln!("ramd supervisor: cannot start the serving process: {e}");
                return 1;
            }
        };
        let (status, stopping) = wait_child(&mut child, &signals);
        let _ = reader.join();
        match sv.after(status, stopping, &state) {
            Next::Exit(code) => return code,
            Next::Restart => {}
        }
        eprintln!(
            "ramd supervisor: the serving process (pid {}) ended ({}); restart {}, handing back {} kept entries",
            child.id(),
            sv.reason,
            sv.restarts,
            sv.kept.lock().unwrap_or_else(|e| e.into_inner()).len()
        );
        // A stop asked for while the process was dying, or during the
        // wait before the restart, is a stop: no restart.
        let wait = sv.pace(started, state.ready.load(Ordering::SeqCst));
        if stop_asked(&signals, wait) {
            eprintln!("ramd supervisor: stopped before the restart");
            return 0;
        }
    }
}

/// Waits up to `wait` for SIGTERM or SIGINT (SIGHUP and SIGCHLD are
/// taken and ignored: no process runs); true if one came. Takes one that
/// is already pending even when `wait` is zero.
fn stop_asked(signals: &libc::sigset_t, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ts = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `signals` is an initialised set of blocked signals, `ts`
        // a valid timespec; a null siginfo pointer is allowed.
        let sig = unsafe { libc::sigtimedwait(signals, std::ptr::null_mut(), &ts) };
        match sig {
            libc::SIGTERM | libc::SIGINT => return true,
            s if s > 0 => continue,
            _ if Instant::now() >= deadline => return false,
            _ => continue,
        }
    }
}

impl Supervisor {
    /// Decides what follows a run that ended with `status`.
    fn after(&mut self, status: ExitStatus, stopping: bool, state: &RunState) -> Next {
        let ready = state.ready.load(Ordering::SeqCst);
        let upgrade = state
            .upgrade
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if stopping {
            return Next::Exit(status.code().unwrap_or(1));
        }
        if self.trying.is_some() && !ready {
            self.roll_back(&describe(status));
            return Next::Restart;
        }
        self.trying = None;
        self.served |= ready;
        // Listening sockets and counts alone are not worth restarting a
        // process that cannot start (a bad setting would loop forever),
        // nor is anything when nothing was ever served.
        let keeps = self
            .kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .any(|k| !k.starts_with("listen/") && !k.starts_with("metrics/"));
        match (status.code(), upgrade) {
            (Some(0), Some(new)) => {
                self.reason = format!("upgrade to {}", new.display());
                self.trying = Some((new.clone(), std::mem::replace(&mut self.binary, new)));
                self.quick = 0;
            }
            (Some(0), None) => return Next::Exit(0),
            (Some(c), _) if !ready && (!keeps || !self.served) => return Next::Exit(c),
            _ => self.reason = describe(status),
        }
        self.restarts += 1;
        Next::Restart
    }

    /// The upgrade being tried failed before it served (`why`): the
    /// binary before it is started again, with everything kept.
    fn roll_back(&mut self, why: &str) {
        let (new, previous) = self.trying.take().expect("an upgrade is being tried");
        self.reason = format!(
            "upgrade to {} failed before serving ({why}): back on the previous binary",
            new.display()
        );
        eprintln!("ramd supervisor: {}", self.reason);
        self.binary = previous;
        self.restarts += 1;
    }

    /// How long to wait before a restart: nothing, unless the process
    /// keeps dying young (see the module docs).
    fn pace(&mut self, started: Instant, served: bool) -> Duration {
        if served && started.elapsed() >= Duration::from_secs(1) {
            (self.quick, self.backoff) = (0, Duration::from_millis(100));
        }
        self.quick += 1;
        if self.quick <= 3 {
            return Duration::ZERO;
        }
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(5));
        wait
    }

    /// Starts the serving process, hands back what is kept, and starts the
    /// thread that reads its records.
    fn start(
        &self,
        state: &Arc<RunState>,
    ) -> std::io::Result<(Child, std::thread::JoinHandle<()>)> {
        let (ours, theirs) = link::pair()?;
        // The child's end must outlive exec: a copy without close-on-exec,
        // closed here once the child has it.
        let inherited = rustix::io::dup(&theirs)?;
        drop(theirs);
        let child = Command::new(&self.binary)
            .args(&self.args)
            .env(serving::FD_ENV, inherited.as_raw_fd().to_string())
            .env(serving::RESTARTS_ENV, self.restarts.to_string())
            .env(serving::REASON_ENV, &self.reason)
            .env(serving::SUPERVISOR_ENV, std::process::id().to_string())
            .spawn()?;
        drop(inherited);
        hand_back(&ours, &self.kept);
        let (kept, state) = (self.kept.clone(), state.clone());
        let reader = std::thread::Builder::new()
            .name("supervisor-link".into())
            .spawn(move || read_records(&ours, &kept, &state));
        match reader {
            Ok(r) => Ok((child, r)),
            Err(e) => {
                // No process runs unsupervised.
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }
}

/// "signal 9", "exit 3".
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (_, Some(s)) => format!("signal {s}"),
        _ => "unknown".into(),
    }
}

/// Sends every kept entry, then END. A failure is the child's death,
/// seen next by `wait_child`.
fn hand_back(sock: &OwnedFd, kept: &Kept) {
    let kept = kept.lock().unwrap_or_else(|e| e.into_inner());
    for (key, (blob, fds)) in kept.iter() {
        if let Err(e) = link::send(sock.as_fd(), Kind::Put, key, blob, &link::borrow_all(fds)) {
            eprintln!("ramd supervisor: handing back {key}: {e}");
            return;
        }
    }
    if let Err(e) = link::send(sock.as_fd(), Kind::End, "", &[], &[]) {
        eprintln!("ramd supervisor: ending the hand-back: {e}");
    }
}

/// Keeps what the serving process registers, until it closes the link.
fn read_records(sock: &OwnedFd, kept: &Kept, state: &RunState) {
    loop {
        match link::recv(sock.as_fd()) {
            Ok(None) => return,
            Ok(Some((r, fds))) => {
                let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
                match r.kind {
                    Kind::Put => {
                        k.insert(r.key, (r.blob, fds));
                    }
                    Kind::Forget => {
                        k.remove(&r.key);
                    }
                    Kind::Ready => state.ready.store(true, Ordering::SeqCst),
                    Kind::Upgrade => {
                        use std::os::unix::ffi::OsStrExt;
                        let path = PathBuf::from(std::ffi::OsStr::from_bytes(&r.blob));
                        *state.upgrade.lock().unwrap_or_else(|e| e.into_inner()) = Some(path);
                    }
                    Kind::End => {}
                }
            }
            // A refused record changes nothing kept; the link goes on.
            Err(link::LinkError::Io(e)) => {
                eprintln!("ramd supervisor: reading the link: {e}");
                return;
            }
            Err(e) => eprintln!("ramd supervisor: {e}"),
        }
    }
}

/// Forwards signals until the child ends; returns its status and whether
/// a stop (SIGTERM, SIGINT) was asked for.
fn wait_child(child: &mut Child, signals: &libc::sigset_t) -> (ExitStatus, bool) {
    let mut stopping = false;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return (status, stopping);
        }
        let mut sig: libc::c_int = 0;
        // SAFETY: `signals` is an initialised set; `sig` is a valid out
        // pointer for the call's duration.
        let r = unsafe { libc::sigwait(signals, &mut sig) };
        if r != 0 {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        if matches!(sig, libc::SIGTERM | libc::SIGINT | libc::SIGHUP) {
            stopping |= sig != libc::SIGHUP;
            // SAFETY: kill(2) with the child's pid and a valid signal has
            // no memory effects; the child is not reaped yet, so the pid
            // is still its own.
            unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        }
    }
}

/// Blocks SIGTERM, SIGINT, SIGHUP and SIGCHLD in this thread and every
/// thread started after (`sigwait` takes them), returning the set.
fn block_signals() -> libc::sigset_t {
    // SAFETY: the set is initialised by sigemptyset before any other use;
    // pthread_sigmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}
