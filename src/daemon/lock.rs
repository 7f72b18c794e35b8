//! One daemon per API socket: an exclusive `flock` on `<api socket>.lock`,
//! a file that holds the owner's pid.
//!
//! The lock dies with the process (even on SIGKILL), so a stale file never
//! blocks a restart; a live owner is named in the refusal.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another daemon holds it.
    #[error("another ramd daemon{} is already running on {socket}; stop it{} or give this one another --api-socket / --runtime-dir", pid.map(|p| format!(" (pid {p})")).unwrap_or_default(), pid.map(|p| format!(" (kill {p})")).unwrap_or_default())]
    Held { socket: PathBuf, pid: Option<u32> },
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

impl PidLock {
    /// Takes the lock for `api_socket`, writing our pid into the file.
    pub fn acquire(api_socket: &Path) -> Result<PidLock, LockError> {
        let path = lock_path(api_socket);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // SAFETY: flock on an fd we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(LockError::Held {
                    socket: api_socket.to_owned(),
                    pid: text.trim().parse().ok(),
                });
            }
            return Err(io(e));
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(PidLock { file, path })
    }
}

impl Drop for PidLock {
    fn drop(&mut self) {
        // Remove while still holding the lock, so a successor that opened
        // the old file retries on a fresh one... or simply finds none.
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
}
