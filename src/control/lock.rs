//! One daemon per API socket: an exclusive `flock` on `<api socket>.lock`,
//! a file (mode 0600, never followed if a symlink) that holds the owner's
//! pid.
//!
//! # Invariants
//!
//! - The lock is held only on the file the path names *now*: after taking
//!   the flock we check that the path still leads to the inode we locked
//!   (a daemon that exits removes the file while holding it, so a successor
//!   that opened the old inode retries on the new one). Two daemons never
//!   both believe they hold it.
//! - The kernel releases a `flock` when the holder's last descriptor
//!   closes, which for a killed process happens only after it has freed
//!   all its memory: with gigabytes in drives that takes a while during
//!   which the process already shows as dead (a zombie). A lock whose
//!   recorded holder is dead or exiting is therefore waited for (polled,
//!   bounded by [`EXIT_WAIT`]) and taken the moment it is released; only
//!   a live holder is refused at once, by pid.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a lock held by a dead or exiting daemon is waited for.
pub const EXIT_WAIT: Duration = Duration::from_secs(60);
/// How often a lock held by an exiting daemon is tried again.
const RETRY_INTERVAL: Duration = Duration::from_millis(5);
/// How long an empty lock file (its holder is between `flock` and writing
/// its pid, or is removing it at exit) is waited for.
const EMPTY_WAIT: Duration = Duration::from_secs(2);
/// `PF_EXITING` in /proc/PID/stat's flags: the task is in `do_exit`.
const PF_EXITING: u64 = 0x4;

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another daemon holds it.
    #[error("another ramd daemon{} is already running on {socket}; stop it{} or give this one another --api-socket / --runtime-dir", pid.map(|p| format!(" (pid {p})")).unwrap_or_default(), pid.map(|p| format!(" (kill {p})")).unwrap_or_default())]
    Held { socket: PathBuf, pid: Option<u32> },
    /// The previous daemon died but the kernel has not released its lock
    /// within [`EXIT_WAIT`].
    #[error("the previous ramd daemon{} on {socket} has died but still holds its lock after {waited_s} s (the kernel is still tearing it down); try again later", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    StillExiting {
        socket: PathBuf,
        pid: Option<u32>,
        waited_s: u64,
    },
    /// The lock file could not be opened or written.
    #[error("cannot lock {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The held lock; released (and the file removed) on drop.
pub struct PidLock {
    /// Kept open: closing the file releases the lock.
    file: File,
    path: PathBuf,
}

/// The lock file of an API socket.
pub fn lock_path(api_socket: &Path) -> PathBuf {
    let mut p = api_socket.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// One try at the lock.
enum Attempt {
    /// Ours: the flock is held on the file the path names.
    Locked(File),
    /// Someone holds it; the pid the file records, if any.
    Busy(Option<u32>),
    /// We locked an inode the path no longer names: try again.
    Replaced,
}

/// Whether the process that recorded `pid` can still be holding the lock
/// on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// Running: refuse.
    Alive,
    /// Gone, a zombie, or in `do_exit`: its lock goes away by itself.
    Exiting,
}

/// Looks the holder up in /proc: absent, state Z/X, or `PF_EXITING` set
/// on its main thread means exiting.
fn holder_state(pid: u32) -> Holder {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Holder::Exiting;
    };
    // "PID (COMM) STATE PPID PGRP SESSION TTY TPGID FLAGS ...": COMM may
    // hold spaces and parentheses, so split after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return Holder::Alive;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first().copied().unwrap_or("");
    let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
    if matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0 {
        Holder::Exiting
    } else {
        Holder::Alive
    }
}

fn try_lock(path: &Path) -> std::io::Result<Attempt> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    lock_opened(file, path)
}

/// Takes the flock on `file`, opened from `path` a moment ago.
fn lock_opened(mut file: File, path: &Path) -> std::io::Result<Attempt> {
    // SAFETY: flock on an fd we own; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e);
        }
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        return Ok(Attempt::Busy(text.trim().parse().ok()));
    }
    let ours = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.dev() == ours.dev() && m.ino() == ours.ino() => Ok(Attempt::Locked(file)),
        Ok(_) => Ok(Attempt::Replaced),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Attempt::Replaced),
        Err(e) => Err(e),
    }
}

impl PidLock {
    /// Takes the lock for `api_socket`, writing our pid into the file. The
    /// socket's directory must exist (the daemon checks and creates it
    /// first, see `paths::ensure_runtime_dir`).
    pub fn acquire(api_socket: &Path) -> Result<PidLock, LockError> {
        Self::acquire_within(api_socket, EXIT_WAIT)
    }

    /// [`PidLock::acquire`] waiting at most `wait` for an exiting holder.
    pub fn acquire_within(api_socket: &Path, wait: Duration) -> Result<PidLock, LockError> {
        let path = lock_path(api_socket);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let started = Instant::now();
        let mut told = false;
        loop {
            let pid = match try_lock(&path).map_err(io)? {
                Attempt::Locked(mut file) => {
                    file.set_len(0).map_err(io)?;
                    file.seek(SeekFrom::Start(0)).map_err(io)?;
                    writeln!(file, "{}", std::process::id()).map_err(io)?;
                    return Ok(PidLock { file, path });
                }
                Attempt::Replaced => continue,
                Attempt::Busy(pid) => pid,
            };
            let limit = if pid.is_some() {
                wait
            } else {
                EMPTY_WAIT.min(wait)
            };
            let exiting = pid.map_or(true, |p| holder_state(p) == Holder::Exiting);
            if !exiting {
                return Err(LockError::Held {
                    socket: api_socket.to_owned(),
                    pid,
                });
            }
            if started.elapsed() >= limit {
                return Err(match pid {
                    None => LockError::Held {
                        socket: api_socket.to_owned(),
                        pid,
                    },
                    Some(_) => LockError::StillExiting {
                        socket: api_socket.to_owned(),
                        pid,
                        waited_s: started.elapsed().as_secs(),
                    },
                });
            }
            if let (Some(p), false) = (pid, told) {
                told = true;
                tracing::info!(
                    "the previous daemon (pid {p}) has died but the kernel has not released its lock yet (it is still freeing its memory); taking the lock as soon as it is released"
                );
            }
            std::thread::sleep(RETRY_INTERVAL);
        }
    }
}

impl Drop for PidLock {
    fn drop(&mut self) {
        // Remove while still holding the lock: a successor that opened the
        // old file sees (after its flock) that the path no longer names it
        // and retries on a fresh one.
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.set_len(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_names_the_first_pid() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("api.sock");
        let first = PidLock::acquire(&sock).unwrap();
        let e = PidLock::acquire(&sock)
            .err()
            .expect("second lock must fail");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(first);
        PidLock::acquire(&sock).unwrap();
    }

    #[test]
    fn lock_file_is_private_and_a_symlink_is_not_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("api.sock");
        let lock = PidLock::acquire(&sock).unwrap();
        let mode = std::fs::metadata(lock_path(&sock))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        drop(lock);
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep me").unwrap();
        std::os::unix::fs::symlink(&target, lock_path(&sock)).unwrap();
        assert!(PidLock::acquire(&sock).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    }

    #[test]
    fn a_lock_on_a_removed_inode_is_not_taken_as_ours() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("api.sock");
        let path = lock_path(&sock);
        let first = PidLock::acquire(&sock).unwrap();
        // A successor opened the file before the first daemon removed it.
        let stale = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        drop(first);
        // Its flock succeeds on the removed inode, which is not the lock.
        assert!(matches!(
            lock_opened(stale, &path).unwrap(),
            Attempt::Replaced
        ));
        // Meanwhile a third daemon made and locked a fresh file.
        let third = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        assert!(matches!(
            lock_opened(third, &path).unwrap(),
            Attempt::Locked(_)
        ));
    }

    #[test]
    fn own_process_is_alive_and_a_missing_pid_is_exiting() {
        assert_eq!(holder_state(std::process::id()), Holder::Alive);
        assert_eq!(holder_state(u32::MAX - 1), Holder::Exiting);
    }
}
