//! One daemon per directory: an exclusive `flock` on the on-disk directory.
//!
//! The lock is taken on the directory inode as it is on disk (reached
//! through the disk view, see [`super::mounts`]), not on a lock file in a
//! runtime directory: two daemons with different runtime or state
//! directories, or in different mount namespaces, still meet on the same
//! inode. The kernel drops the lock when the holder dies, so a crash never
//! leaves a stale lock. The holder's pid comes from `/proc/locks`.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;

/// Locking errors.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// another process manages the directory
    #[error("{path} is already managed by another ramd ({holder}); stop it or remove the directory there first")]
    Held { path: PathBuf, holder: String },
    /// flock failed
    #[error("cannot lock {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Holds the lock until dropped.
#[derive(Debug)]
pub struct DirLock {
    /// The locked directory, kept open: closing it releases the lock.
    _dir: File,
}

impl DirLock {
    /// Locks `dir` (the on-disk directory of `path`) without waiting.
    pub fn acquire(dir: File, path: &Path) -> Result<DirLock, LockError> {
        match rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(DirLock { _dir: dir }),
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let holder = dir
                    .metadata()
                    .ok()
                    .and_then(|m| {
                        let text = std::fs::read_to_string("/proc/locks").ok()?;
                        flock_holder(&text, m.dev(), m.ino())
                    })
                    .map(|pid| format!("pid {pid}"))
                    .unwrap_or_else(|| "another process".to_string());
                Err(LockError::Held {
                    path: path.to_path_buf(),
                    holder,
                })
            }
            Err(e) => Err(LockError::Io {
                path: path.to_path_buf(),
                source: e.into(),
            }),
        }
    }
}

/// Finds the pid holding a FLOCK on (dev, ino) in `/proc/locks` text:
/// `1: FLOCK  ADVISORY  WRITE 4242 fd:00:1234 0 EOF` (device as hex
/// major:minor).
pub fn flock_holder(text: &str, dev: u64, ino: u64) -> Option<u32> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Blocked waiters are listed as "1: -> FLOCK ...": skip them.
        if f.len() < 6 || f[1] != "FLOCK" {
            continue;
        }
        let mut id = f[5].split(':');
        let (Some(ma), Some(mi), Some(i)) = (id.next(), id.next(), id.next()) else {
            continue;
        };
        if u32::from_str_radix(ma, 16).ok() == Some(major)
            && u32::from_str_radix(mi, 16).ok() == Some(minor)
            && i.parse::<u64>().ok() == Some(ino)
        {
            return f[4].parse().ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_holder() {
        let dev = libc::makedev(0xfd, 0x01);
        let text = "1: POSIX  ADVISORY  WRITE 10 fd:01:55 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 4242 fd:01:55 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 77 fd:01:55 0 EOF\n";
        assert_eq!(flock_holder(text, dev, 55), Some(4242));
        assert_eq!(flock_holder(text, dev, 56), None);
        assert_eq!(flock_holder("garbage\n1: FLOCK x", dev, 55), None);
    }

    #[test]
    fn second_lock_is_refused_with_pid() {
        let dir = tempfile::tempdir().unwrap();
        let a = DirLock::acquire(File::open(dir.path()).unwrap(), dir.path()).unwrap();
        let err = DirLock::acquire(File::open(dir.path()).unwrap(), dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(a);
        DirLock::acquire(File::open(dir.path()).unwrap(), dir.path()).unwrap();
    }
}
