//! The serving process's end of the link to its supervisor
//! ([`super::supervisor`]): taken from the environment once, first thing
//! in `ramd daemon`; holds what was handed back at start (until the
//! daemon adopts it) and sends what the supervisor must keep.
//!
//! Invariants: the link is close-on-exec once taken (nothing the daemon
//! starts inherits it, so the supervisor sees EOF exactly when this
//! process is gone); a record sent is a whole message (SEQPACKET), so
//! sends from several threads need no lock; the hand-back is read whole
//! (up to its END record) before the daemon creates any drive.
//!
//! If the supervisor dies, this process keeps serving (losing every
//! volatile drive now, to avoid maybe losing them later, would be the
//! wrong trade): a watcher thread sees EOF, logs an error, and
//! [`Serving::status`] says the supervisor is gone.
//!
//! Under systemd with a descriptor store and no supervisor, the keeper is
//! systemd (`fdstore.rs`): the same entries, put and forgotten through
//! the same calls; the hand-back is what systemd passed at start.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use super::fdstore::{self, FdStore};
use super::link::{self, LinkError};
use super::wire::Kind;

/// The key prefix of listening sockets (`super::listeners`), kept apart
/// from the drives' entries.
pub const LISTENER_PREFIX: &str = "listen/";
/// The key prefix of caches' kept dirty data (`control::caches::kept`),
/// kept apart from the drives' entries.
pub const CACHE_PREFIX: &str = "cache/";
/// The key prefix of kept FUSE sessions (`control::kept_attachments`).
pub const ATTACH_PREFIX: &str = "attach/";
/// The link's descriptor number, set by the supervisor.
pub const FD_ENV: &str = "RAMD_HANDOVER_FD";
/// How many times the supervisor restarted the serving process.
pub const RESTARTS_ENV: &str = "RAMD_RESTARTS";
/// Why it last did ("signal 9", "exit 3").
pub const REASON_ENV: &str = "RAMD_LAST_RESTART";
/// The supervisor's pid.
pub const SUPERVISOR_ENV: &str = "RAMD_SUPERVISOR_PID";

/// One entry handed back: its key, blob and descriptors.
pub struct Entry {
    pub key: String,
    pub blob: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

/// What `GET /v1/health` says of the supervision.
#[derive(Debug, Clone)]
pub struct Status {
    pub supervisor_pid: u32,
    pub restarts: u64,
    pub last_restart_reason: Option<String>,
    pub supervisor_alive: bool,
}

/// Who keeps the entries.
enum Keeper {
    /// A supervisor, at the other end of this link.
    Link(OwnedFd),
    /// systemd's descriptor store.
    Systemd(FdStore),
}

/// The link (see the module docs).
pub struct Serving {
    keeper: Keeper,
    supervisor_pid: u32,
    restarts: u64,
    last_reason: Option<String>,
    gone: AtomicBool,
    upgrading: AtomicBool,
    handed_back: Mutex<Option<Vec<Entry>>>,
    /// Listening sockets handed back, by key, until bound again
    /// (`super::listeners`).
    listeners: Mutex<HashMap<String, (OwnedFd, Vec<u8>)>>,
    /// Caches' kept dirty data and FUSE sessions handed back, until
    /// their owners take them ([`Serving::take_kept`]).
    side: Mutex<Vec<Entry>>,
}

static SERVING: OnceLock<Serving> = OnceLock::new();

/// Takes the link when a supervisor started this process (`FD_ENV` set),
/// reading the hand-back; Ok(false) when none did. Call before any thread
/// starts (it removes the variables from the environment).
pub fn init_from_env() -> Result<bool, LinkError> {
    let Some(fd) = std::env::var(FD_ENV).ok() else {
        return init_from_systemd();
    };
    let fd: RawFd = fd.parse().ok().filter(|&n: &RawFd| n > 2).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{FD_ENV}={fd} is not a descriptor number above 2"),
        )
    })?;
    let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
    let (restarts, supervisor_pid) = (num(RESTARTS_ENV).unwrap_or(0), num(SUPERVISOR_ENV));
    let last_reason = std::env::var(REASON_ENV).ok().filter(|r| !r.is_empty());
    for k in [FD_ENV, RESTARTS_ENV, REASON_ENV, SUPERVISOR_ENV] {
        std::env::remove_var(k);
    }
    // SAFETY: the supervisor passed this descriptor, open, for this
    // process alone, and nothing else here owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&sock, rustix::io::FdFlags::CLOEXEC).map_err(std::io::Error::from)?;
    let entries = read_hand_back(sock.as_fd())?;
    let keeper = Keeper::Link(sock);
    let pid = supervisor_pid.unwrap_or(0) as u32;
    Ok(SERVING
        .set(Serving::new(keeper, pid, restarts, last_reason, entries))
        .is_ok())
}

/// The key of the count of starts kept in systemd's store.
const STARTS_KEY: &str = "starts";

/// Under systemd with a descriptor store (`$FDSTORE`, `NOTIFY_SOCKET`):
/// systemd is the keeper; what it passed back is the hand-back.
fn init_from_systemd() -> Result<bool, LinkError> {
    let Some(max) = fdstore::configured() else {
        return Ok(false);
    };
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return Ok(false);
    }
    let (store, passed) = FdStore::from_env(max)?;
    let mut entries: Vec<Entry> = passed
        .into_iter()
        .map(|(key, blob, fds)| Entry { key, blob, fds })
        .collect();
    // Starts are counted in the store itself: systemd says nothing of them.
    let starts = entries
        .iter()
        .position(|e| e.key == STARTS_KEY)
        .map(|i| entries.swap_remove(i))
        .and_then(|e| String::from_utf8(e.blob).ok()?.parse::<u64>().ok())
        .unwrap_or(0);
    store.put(STARTS_KEY, (starts + 1).to_string().as_bytes(), &[])?;
    let reason = (starts > 0).then(|| "systemd started the service again".to_owned());
    let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32);
    let keeper = Keeper::Systemd(store);
    Ok(SERVING
        .set(Serving::new(keeper, parent, starts, reason, entries))
        .is_ok())
}

/// Every PUT up to END.
fn read_hand_back(sock: BorrowedFd<'_>) -> Result<Vec<Entry>, LinkError> {
    let mut entries = Vec::new();
    loop {
        match link::recv(sock)? {
            None => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the supervisor closed the link before its hand-back ended",
                )
                .into())
            }
            Some((r, _)) if r.kind == Kind::End => return Ok(entries),
            Some((r, fds)) if r.kind == Kind::Put => entries.push(Entry {
                key: r.key,
                blob: r.blob,
                fds,
            }),
            Some(_) => {}
        }
    }
}

/// The link, when a supervisor started this process.
pub fn get() -> Option<&'static Serving> {
    SERVING.get()
}

impl Serving {
    fn new(
        keeper: Keeper,
        supervisor_pid: u32,
        restarts: u64,
        last_reason: Option<String>,
        entries: Vec<Entry>,
    ) -> Serving {
        let (side, entries): (Vec<Entry>, Vec<Entry>) = entries
            .into_iter()
            .partition(|e| e.key.starts_with(CACHE_PREFIX) || e.key.starts_with(ATTACH_PREFIX));
        let (listeners, handed_back): (Vec<Entry>, Vec<Entry>) = entries
            .into_iter()
            .partition(|e| e.key.starts_with(LISTENER_PREFIX));
        let listeners = listeners
            .into_iter()
            .filter_map(|e| Some((e.key, (e.fds.into_iter().next()?, e.blob))))
            .collect();
        Serving {
            keeper,
            supervisor_pid,
            restarts,
            last_reason,
            gone: AtomicBool::new(false),
            upgrading: AtomicBool::new(false),
            handed_back: Mutex::new(Some(handed_back)),
            listeners: Mutex::new(listeners),
            side: Mutex::new(side),
        }
    }

    /// The entries under `prefix` ([`CACHE_PREFIX`], [`ATTACH_PREFIX`])
    /// handed back at start (once).
    pub fn take_kept(&self, prefix: &str) -> Vec<Entry> {
        let mut side = self.side.lock().unwrap_or_else(|e| e.into_inner());
        let (taken, rest) = std::mem::take(&mut *side)
            .into_iter()
            .partition(|e| e.key.starts_with(prefix));
        *side = rest;
        taken
    }

    /// True when systemd's descriptor store is the keeper (no supervisor
    /// process: `ramd upgrade` is `systemctl restart` there).
    pub fn under_systemd(&self) -> bool {
        matches!(self.keeper, Keeper::Systemd(_))
    }

    /// What was handed back at start (once; later calls get nothing).
    pub fn take_handed_back(&self) -> Vec<Entry> {
        self.handed_back
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default()
    }

    /// The listening socket handed back under `key` (once), with the
    /// blob it was kept with.
    pub fn take_listener(&self, key: &str) -> Option<(OwnedFd, Vec<u8>)> {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
    }

    /// How many listening sockets handed back nobody took yet.
    pub fn unclaimed_listeners(&self) -> usize {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// The keys of the listening sockets nobody took back.
    pub fn drain_listeners(&self) -> Vec<String> {
        let mut l = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        l.drain().map(|(k, _)| k).collect()
    }

    /// Asks the supervisor to keep `fds` and `blob` under `key`
    /// (replacing what it kept there).
    pub fn put(&self, key: &str, blob: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), LinkError> {
        match &self.keeper {
            Keeper::Link(sock) => link::send(sock.as_fd(), Kind::Put, key, blob, fds),
            Keeper::Systemd(store) => Ok(store.put(key, blob, fds)?),
        }
    }

    /// Asks the supervisor to drop what it keeps under `key`.
    pub fn forget(&self, key: &str) -> Result<(), LinkError> {
        match &self.keeper {
            Keeper::Link(sock) => link::send(sock.as_fd(), Kind::Forget, key, &[], &[]),
            Keeper::Systemd(store) => Ok(store.forget(key)?),
        }
    }

    /// Tells the supervisor that this process is about to exit so that
    /// `binary` takes over (`ramd upgrade`); the caller then stops the
    /// process the way SIGTERM does, leaving its ublk devices for the
    /// next one ([`Serving::upgrading`]).
    pub fn request_upgrade(&self, binary: &std::path::Path) -> Result<(), LinkError> {
        use std::os::unix::ffi::OsStrExt;
        let Keeper::Link(sock) = &self.keeper else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "under systemd's descriptor store there is no supervisor to start another binary: install it and run `systemctl restart` on the unit (the store is kept across restarts)",
            )
            .into());
        };
        link::send(
            sock.as_fd(),
            Kind::Upgrade,
            "",
            binary.as_os_str().as_bytes(),
            &[],
        )?;
        self.upgrading.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Whether this process is stopping for an upgrade.
    pub fn upgrading(&self) -> bool {
        self.upgrading.load(Ordering::SeqCst)
    }

    /// Tells the supervisor this process serves.
    pub fn ready(&self) -> Result<(), LinkError> {
        match &self.keeper {
            Keeper::Link(sock) => link::send(sock.as_fd(), Kind::Ready, "", &[], &[]),
            Keeper::Systemd(_) => Ok(()),
        }
    }

    /// Starts the thread that notices the supervisor's death.
    pub fn watch(&'static self) -> std::io::Result<()> {
        let Keeper::Link(sock) = &self.keeper else {
            return Ok(());
        };
        std::thread::Builder::new()
            .name("ramd-supervised".into())
            .spawn(move || {
                // The supervisor sends nothing after the hand-back: the
                // next thing is EOF, when it is gone.
                while let Ok(Some(_)) = link::recv(sock.as_fd()) {}
                self.gone.store(true, Ordering::SeqCst);
                tracing::error!(
                    supervisor_pid = self.supervisor_pid,
                    "the supervisor is gone: this process keeps serving, but a crash now loses every RAM drive (restart the daemon to be supervised again)"
                );
            })
            .map(|_| ())
    }

    pub fn status(&self) -> Status {
        Status {
            supervisor_pid: self.supervisor_pid,
            restarts: self.restarts,
            last_restart_reason: self.last_reason.clone(),
            supervisor_alive: !self.gone.load(Ordering::SeqCst),
        }
    }
}
