//! Guard rails: which directories may be added, and how full a RAM copy is.
//!
//! Checks on add (each with an error that says what to do): the path is
//! absolute and canonical, a real directory, not a system directory or one
//! holding ramd's own state, not a mount point already, not on tmpfs/ramfs
//! (it is in RAM already), owned by the expected user, not inside or around
//! another managed directory, and its content fits the size limit.
//!
//! Usage levels: a RAM copy at 80% of its tmpfs is a warning, at 95% a
//! critical warning, and with no space left writes fail with ENOSPC (the
//! kernel's answer to programs; ramd reports it). [`UsageTracker`] reports
//! each level change once, with hysteresis so a copy hovering at a boundary
//! does not flood the log.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::mountinfo;
use crate::size::format_size;

const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Directories never to put in RAM: the system would break, or they are
/// virtual already.
const FORBIDDEN: &[&str] = &[
    "/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin",
    "/sys", "/usr", "/var", "/var/lib",
];

/// Why a directory cannot be added.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// path must be absolute and canonical
    #[error("{given} is not a canonical absolute path; use {canonical}")]
    NotCanonical { given: PathBuf, canonical: PathBuf },
    /// the path does not exist or is not a directory
    #[error("{path} is not a directory ({reason})")]
    NotADirectory { path: PathBuf, reason: String },
    /// a system directory
    #[error("{path} is a system directory; only directories below it can be kept in RAM")]
    Forbidden { path: PathBuf },
    /// the directory holds ramd's own files
    #[error(
        "{path} contains or is inside ramd's own {what} directory {dir}; choose another directory"
    )]
    OwnFiles {
        path: PathBuf,
        what: &'static str,
        dir: PathBuf,
    },
    /// already a mount point
    #[error("{path} is already a mount point ({fs_type} from {source_name}); unmount it first or choose the directory on disk")]
    MountPoint {
        path: PathBuf,
        fs_type: String,
        source_name: String,
    },
    /// already on tmpfs
    #[error("{path} is on tmpfs/ramfs already (it is in RAM); nothing to do")]
    InRam { path: PathBuf },
    /// wrong owner
    #[error("{path} is owned by uid {actual}, expected uid {expected}; refusing to manage another user's directory")]
    Owner {
        path: PathBuf,
        actual: u32,
        expected: u32,
    },
    /// overlaps a managed directory
    #[error("{path} overlaps {other}, which is already kept in RAM; remove that one first")]
    Overlaps { path: PathBuf, other: PathBuf },
    /// content larger than the limit
    #[error("{path} holds {need} but the size limit is {limit}; raise the size limit (or use overlay mode)")]
    TooBig {
        path: PathBuf,
        need: String,
        limit: String,
    },
    /// content larger than available memory
    #[error("{path} holds {need} but only {avail} of memory is available; free memory or use overlay mode")]
    NoMemory {
        path: PathBuf,
        need: String,
        avail: String,
    },
    /// I/O error while checking
    #[error("cannot check {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// mount table unreadable
    #[error(transparent)]
    MountInfo(#[from] mountinfo::MountInfoError),
}

/// What the add checks need to know.
#[derive(Debug, Clone)]
pub struct AddCheck<'a> {
    /// The directory to add.
    pub path: &'a Path,
    /// Required owner, if any.
    pub expected_uid: Option<u32>,
    /// Directories already managed.
    pub managed: &'a [PathBuf],
    /// ramd's own directories (runtime, state): never inside PATH.
    pub own_dirs: &'a [(&'static str, PathBuf)],
}

/// Runs every check but the size checks (see [`check_size`]).
pub fn check_add(c: &AddCheck<'_>) -> Result<(), GuardError> {
    let path = c.path;
    let canonical = std::fs::canonicalize(path).map_err(|e| GuardError::NotADirectory {
        path: path.into(),
        reason: e.to_string(),
    })?;
    if canonical != path {
        return Err(GuardError::NotCanonical {
            given: path.into(),
            canonical,
        });
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| GuardError::Io {
        path: path.into(),
        source: e,
    })?;
    if !meta.is_dir() {
        return Err(GuardError::NotADirectory {
            path: path.into(),
            reason: "not a directory".into(),
        });
    }
    if FORBIDDEN.iter().any(|f| Path::new(f) == path) {
        return Err(GuardError::Forbidden { path: path.into() });
    }
    for (what, dir) in c.own_dirs {
        if dir.starts_with(path) || path.starts_with(dir) {
            return Err(GuardError::OwnFiles {
                path: path.into(),
                what,
                dir: dir.clone(),
            });
        }
    }
    for other in c.managed {
        if other.starts_with(path) || path.starts_with(other) {
            return Err(GuardError::Overlaps {
                path: path.into(),
                other: other.clone(),
            });
        }
    }
    let mounts = mountinfo::read()?;
    if let Some(m) = mountinfo::top_mount_at(&mounts, path) {
        return Err(GuardError::MountPoint {
            path: path.into(),
            fs_type: m.fs_type.clone(),
            source_name: m.source.clone(),
        });
    }
    let dir = std::fs::File::open(path).map_err(|e| GuardError::Io {
        path: path.into(),
        source: e,
    })?;
    let fs = rustix::fs::fstatfs(&dir).map_err(|e| GuardError::Io {
        path: path.into(),
        source: e.into(),
    })?;
    let magic = fs.f_type as i64;
    if magic == TMPFS_MAGIC || magic == RAMFS_MAGIC {
        return Err(GuardError::InRam { path: path.into() });
    }
    if let Some(expected) = c.expected_uid {
        if meta.uid() != expected {
            return Err(GuardError::Owner {
                path: path.into(),
                actual: meta.uid(),
                expected,
            });
        }
    }
    Ok(())
}

/// Bytes of RAM a tmpfs copy of `dir` needs: allocated blocks of every
/// entry (sparse files count what they hold), hard links once.
pub fn content_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for ent in std::fs::read_dir(&d)? {
            let ent = ent?;
            let m = match std::fs::symlink_metadata(ent.path()) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
                continue;
            }
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(ent.path());
            }
        }
    }
    Ok(total)
}

/// For tmpfs mode: the content must fit the limit and available memory.
pub fn check_size(
    path: &Path,
    need_bytes: u64,
    limit_bytes: Option<u64>,
    mem_available_bytes: u64,
) -> Result<(), GuardError> {
    if let Some(limit) = limit_bytes {
        if need_bytes > limit {
            return Err(GuardError::TooBig {
                path: path.into(),
                need: format_size(need_bytes),
                limit: format_size(limit),
            });
        }
    }
    if need_bytes > mem_available_bytes {
        return Err(GuardError::NoMemory {
            path: path.into(),
            need: format_size(need_bytes),
            avail: format_size(mem_available_bytes),
        });
    }
    Ok(())
}

/// `MemAvailable` from /proc/meminfo (u64::MAX when unknown).
pub fn mem_available_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kib| kib * 1024)
        .unwrap_or(u64::MAX)
}

/// How full a RAM copy is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum UsageLevel {
    /// Below 80%.
    Ok,
    /// At least 80%.
    Warning,
    /// At least 95%.
    Critical,
    /// No space (or no inodes) left: writes fail with ENOSPC.
    Full,
}

/// Warning threshold in percent.
pub const WARN_PERCENT: u64 = 80;
/// Critical threshold in percent.
pub const CRITICAL_PERCENT: u64 = 95;
/// A level is left only when usage drops this many points below its
/// threshold (hysteresis).
pub const HYSTERESIS_PERCENT: u64 = 2;

/// Space and inode use of a tmpfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub used_bytes: u64,
    pub total_bytes: u64,
    pub used_inodes: u64,
    pub total_inodes: u64,
}

impl Usage {
    /// `statvfs` of the filesystem at `path`.
    pub fn of(path: &Path) -> std::io::Result<Usage> {
        let v = rustix::fs::statvfs(path)?;
        Ok(Usage {
            used_bytes: (v.f_blocks - v.f_bfree) * v.f_frsize,
            total_bytes: v.f_blocks * v.f_frsize,
            used_inodes: v.f_files - v.f_ffree,
            total_inodes: v.f_files,
        })
    }

    /// The fuller of space and inodes, in percent (0-100).
    pub fn percent(&self) -> u64 {
        let p = |u: u64, t: u64| {
            if t == 0 {
                0
            } else {
                (u as u128 * 100 / t as u128) as u64
            }
        };
        p(self.used_bytes, self.total_bytes).max(p(self.used_inodes, self.total_inodes))
    }

    /// The level with no history (see [`UsageTracker`] for hysteresis).
    pub fn level(&self) -> UsageLevel {
        let full = |u: u64, t: u64| t > 0 && u >= t;
        if full(self.used_bytes, self.total_bytes) || full(self.used_inodes, self.total_inodes) {
            return UsageLevel::Full;
        }
        match self.percent() {
            p if p >= CRITICAL_PERCENT => UsageLevel::Critical,
            p if p >= WARN_PERCENT => UsageLevel::Warning,
            _ => UsageLevel::Ok,
        }
    }
}

/// Remembers the last reported level; reports changes once.
#[derive(Debug, Clone, Copy)]
pub struct UsageTracker {
    /// The level last reported.
    level: UsageLevel,
}

impl Default for UsageTracker {
    fn default() -> Self {
        UsageTracker {
            level: UsageLevel::Ok,
        }
    }
}

impl UsageTracker {
    /// The level last reported.
    pub fn level(&self) -> UsageLevel {
        self.level
    }

    /// Feeds a new measurement; returns the new level when it changed.
    /// Rising is immediate; falling waits until usage is
    /// [`HYSTERESIS_PERCENT`] below the threshold of the current level.
    pub fn update(&mut self, u: &Usage) -> Option<UsageLevel> {
        let raw = u.level();
        // Full is exact (any free space ends it); the percent levels fall
        // with hysteresis.
        let next = if raw >= self.level || self.level == UsageLevel::Full {
            raw
        } else {
            let p = u.percent();
            let threshold = match self.level {
                UsageLevel::Full | UsageLevel::Critical => CRITICAL_PERCENT,
                UsageLevel::Warning => WARN_PERCENT,
                UsageLevel::Ok => 0,
            };
            if p + HYSTERESIS_PERCENT <= threshold {
                raw
            } else {
                self.level
            }
        };
        (next != self.level).then(|| {
            self.level = next;
            next
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(pct: u64) -> Usage {
        Usage {
            used_bytes: pct,
            total_bytes: 100,
            used_inodes: 1,
            total_inodes: 1000,
        }
    }

    #[test]
    fn levels() {
        assert_eq!(usage(0).level(), UsageLevel::Ok);
        assert_eq!(usage(79).level(), UsageLevel::Ok);
        assert_eq!(usage(80).level(), UsageLevel::Warning);
        assert_eq!(usage(95).level(), UsageLevel::Critical);
        assert_eq!(usage(100).level(), UsageLevel::Full);
        let inodes_full = Usage {
            used_inodes: 1000,
            ..usage(1)
        };
        assert_eq!(inodes_full.level(), UsageLevel::Full);
        assert_eq!(
            Usage {
                total_bytes: 0,
                total_inodes: 0,
                ..usage(0)
            }
            .level(),
            UsageLevel::Ok
        );
    }

    #[test]
    fn tracker_reports_once_with_hysteresis() {
        let mut t = UsageTracker::default();
        assert_eq!(t.update(&usage(50)), None);
        assert_eq!(t.update(&usage(81)), Some(UsageLevel::Warning));
        assert_eq!(t.update(&usage(82)), None);
        assert_eq!(t.update(&usage(79)), None, "inside hysteresis band");
        assert_eq!(t.update(&usage(96)), Some(UsageLevel::Critical));
        assert_eq!(t.update(&usage(100)), Some(UsageLevel::Full));
        assert_eq!(t.update(&usage(99)), Some(UsageLevel::Critical));
        assert_eq!(t.update(&usage(50)), Some(UsageLevel::Ok));
    }

    #[test]
    fn size_checks() {
        let p = Path::new("/x");
        assert!(check_size(p, 10, Some(10), 100).is_ok());
        let e = check_size(p, 11, Some(10), 100).unwrap_err().to_string();
        assert!(e.contains("raise the size limit"), "{e}");
        assert!(matches!(
            check_size(p, 200, None, 100),
            Err(GuardError::NoMemory { .. })
        ));
    }

    #[test]
    fn refuses_tmpfs_symlinks_and_system_dirs() {
        let managed = [];
        let own = [];
        let check = |p: &Path| {
            check_add(&AddCheck {
                path: p,
                expected_uid: None,
                managed: &managed,
                own_dirs: &own,
            })
        };
        assert!(matches!(
            check(Path::new("/dev/shm")),
            Err(GuardError::MountPoint { .. }) | Err(GuardError::InRam { .. })
        ));
        assert!(matches!(
            check(Path::new("/usr")),
            Err(GuardError::Forbidden { .. })
        ));
        assert!(matches!(
            check(Path::new("/nonexistent-ramd")),
            Err(GuardError::NotADirectory { .. })
        ));
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("l");
        std::os::unix::fs::symlink(d.path(), &link).unwrap();
        assert!(matches!(check(&link), Err(GuardError::NotCanonical { .. })));
        let ok = std::fs::canonicalize(d.path()).unwrap();
        check(&ok).unwrap();
        let err = check_add(&AddCheck {
            path: &ok,
            expected_uid: Some(4242),
            managed: &managed,
            own_dirs: &own,
        })
        .unwrap_err();
        assert!(
            matches!(
                err,
                GuardError::Owner {
                    actual: _,
                    expected: 4242,
                    ..
                }
            ),
            "{err}"
        );
        let inner = ok.join("sub");
        std::fs::create_dir(&inner).unwrap();
        let err = check_add(&AddCheck {
            path: &inner,
            expected_uid: None,
            managed: std::slice::from_ref(&ok),
            own_dirs: &own,
        })
        .unwrap_err();
        assert!(matches!(err, GuardError::Overlaps { .. }));
    }
}
