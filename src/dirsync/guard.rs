//! Guard rails: which directories may be added, and how full a RAM copy is.
//!
//! Checks on add (each with an error that says what to do): the path is
//! absolute and canonical, a real directory, not a system tree or a shared
//! scratch/home root (never, not even forced: a subdirectory is the answer),
//! not holding or inside ramd's own directories, not a mount point and not
//! containing one, not on tmpfs/ramfs (it is in RAM already), owned by the
//! expected user, not inside or around another managed directory, not in
//! use by other processes (see [`super::holders`]; `--force` overrides only
//! this one), and its content fits the size limit and at most
//! [`MEMORY_SHARE_PERCENT`]% of available memory.
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

/// System trees never to put in RAM, not even forced: the system would
/// break, or they are virtual already.
const SYSTEM_TREES: &[&str] = &[
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
    "/var/lib",
    "/var/cache",
    "/var/spool",
    "/lost+found",
];

/// Trees whose every subdirectory is refused too: the operating system's
/// own files and virtual filesystems.
const SYSTEM_PREFIXES: &[&str] = &["/boot", "/dev", "/etc", "/proc", "/run", "/sys", "/usr"];

/// Shared scratch and home roots: every program (or user) writes there, so
/// nothing can be kept consistent; a subdirectory can be kept in RAM.
const SHARED_TREES: &[(&str, &str)] = &[
    ("/tmp", "shared scratch space every program writes to"),
    ("/var/tmp", "shared scratch space every program writes to"),
    ("/home", "the root of every user's home directory"),
    (
        "/root",
        "root's home directory, where every root shell and program writes",
    ),
    ("/srv", "the root of the data this machine serves"),
    ("/mnt", "the root of temporary mount points"),
    ("/media", "the root of removable media mount points"),
];

/// A RAM copy may take at most this share of the memory available when it
/// is added (`MemAvailable`), so the rest of the system keeps room.
pub const MEMORY_SHARE_PERCENT: u64 = 50;

/// Why a directory cannot be added.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// path must be absolute and canonical
    #[error("{given} is not a canonical absolute path; use {canonical}")]
    NotCanonical { given: PathBuf, canonical: PathBuf },
    /// the path does not exist or is not a directory
    #[error("{path} is not a directory ({reason})")]
    NotADirectory { path: PathBuf, reason: String },
    /// a system tree (refused even with --force)
    #[error("{path} is a system directory; ramd never keeps it in RAM (not even with --force): programs would lose writes made there after a crash and the system could break; keep a directory of your own in RAM instead")]
    Forbidden { path: PathBuf },
    /// below a tree of the operating system (refused even with --force)
    #[error("{path} is inside {tree}, which belongs to the operating system; ramd never keeps it in RAM (not even with --force); keep a directory of your own in RAM instead")]
    SystemTree { path: PathBuf, tree: PathBuf },
    /// a shared scratch or home root (refused even with --force)
    #[error("{path} is {what}; ramd never keeps it in RAM as a whole (not even with --force): keep the subdirectory you need there in RAM instead (for example {example})")]
    Shared {
        path: PathBuf,
        what: &'static str,
        example: String,
    },
    /// other filesystems are mounted inside
    #[error("{path} contains mount points of other filesystems ({mounts}); a RAM copy would hide them; unmount them or keep a directory without mounts inside in RAM")]
    ContainsMounts { path: PathBuf, mounts: String },
    /// other processes use the directory
    #[error("{path} is in use by other processes: {holders}. Programs that keep files or their working directory there would go on using the on-disk copy hidden under the RAM copy; stop them (or cd out) and add it again, or add it with --force (what such programs write to the on-disk copy is then kept and reported as conflicts by each sync)")]
    InUse {
        path: PathBuf,
        holders: String,
        count: usize,
    },
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
    /// content larger than the share of available memory a copy may take
    #[error("{path} holds {need}, more than a RAM copy may take: {share}% of the memory available now ({avail}) is {max}; keep a smaller subdirectory in RAM, free memory, or use overlay mode (RAM then holds only what is written)")]
    NoMemory {
        path: PathBuf,
        need: String,
        avail: String,
        max: String,
        share: u64,
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
    check_tree(path)?;
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
    check_no_mounts_inside(&mounts, path)?;
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

/// Refuses system trees, what is below the operating system's trees and
/// shared scratch / home roots (pure; `path` is canonical).
pub fn check_tree(path: &Path) -> Result<(), GuardError> {
    if SYSTEM_TREES.iter().any(|f| Path::new(f) == path) {
        return Err(GuardError::Forbidden { path: path.into() });
    }
    if let Some(tree) = SYSTEM_PREFIXES
        .iter()
        .map(Path::new)
        .find(|t| path.starts_with(t))
    {
        return Err(GuardError::SystemTree {
            path: path.into(),
            tree: tree.into(),
        });
    }
    if let Some((_, what)) = SHARED_TREES.iter().find(|(t, _)| Path::new(t) == path) {
        let example = match path.to_str() {
            Some("/home") => "/home/alice/.cache".to_string(),
            Some("/root") => "/root/.cache".to_string(),
            _ => path.join("build").display().to_string(),
        };
        return Err(GuardError::Shared {
            path: path.into(),
            what,
            example,
        });
    }
    Ok(())
}

/// Refuses a directory with mount points of other filesystems below it
/// (pure).
pub fn check_no_mounts_inside(mounts: &[mountinfo::Mount], path: &Path) -> Result<(), GuardError> {
    let mut inside: Vec<String> = mounts
        .iter()
        .filter(|m| m.mount_point != path && m.mount_point.starts_with(path))
        .map(|m| format!("{} ({})", m.mount_point.display(), m.fs_type))
        .collect();
    if inside.is_empty() {
        return Ok(());
    }
    inside.dedup();
    let n = inside.len();
    inside.truncate(5);
    if n > 5 {
        inside.push(format!("and {} more", n - 5));
    }
    Err(GuardError::ContainsMounts {
        path: path.into(),
        mounts: inside.join(", "),
    })
}

/// Refuses a directory other processes use (see [`super::holders`]).
pub fn check_not_in_use(path: &Path, holders: &[super::holders::Holder]) -> Result<(), GuardError> {
    if holders.is_empty() {
        return Ok(());
    }
    Err(GuardError::InUse {
        path: path.into(),
        holders: super::holders::describe(holders, 8),
        count: holders.len(),
    })
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

/// For tmpfs mode: the content must fit the limit and at most
/// [`MEMORY_SHARE_PERCENT`]% of available memory (checked before anything
/// is copied).
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
    let max_bytes = (mem_available_bytes as u128 * MEMORY_SHARE_PERCENT as u128 / 100) as u64;
    if need_bytes > max_bytes {
        return Err(GuardError::NoMemory {
            path: path.into(),
            need: format_size(need_bytes),
            avail: format_size(mem_available_bytes),
            max: format_size(max_bytes),
            share: MEMORY_SHARE_PERCENT,
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
    fn size_check_refuses_more_than_half_of_available_memory() {
        let p = Path::new("/x");
        let gib = 1u64 << 30;
        assert!(check_size(p, 5 * gib, None, 10 * gib).is_ok());
        let e = check_size(p, 6 * gib, None, 10 * gib)
            .unwrap_err()
            .to_string();
        for want in ["6 GiB", "50%", "10 GiB", "5 GiB", "overlay"] {
            assert!(e.contains(want), "want {want:?} in {e}");
        }
    }

    #[test]
    fn system_and_shared_trees_are_refused() {
        for p in ["/", "/etc", "/usr", "/var", "/var/lib", "/boot"] {
            assert!(
                matches!(check_tree(Path::new(p)), Err(GuardError::Forbidden { .. })),
                "{p}"
            );
        }
        for p in [
            "/etc/ssh",
            "/usr/lib",
            "/proc/1",
            "/sys/kernel",
            "/run/user/1000",
            "/dev/shm",
        ] {
            assert!(
                matches!(check_tree(Path::new(p)), Err(GuardError::SystemTree { .. })),
                "{p}"
            );
        }
        for p in ["/tmp", "/var/tmp", "/home", "/root", "/srv"] {
            let e = check_tree(Path::new(p)).unwrap_err();
            assert!(matches!(e, GuardError::Shared { .. }), "{p}");
            assert!(e.to_string().contains("subdirectory"), "{e}");
        }
        for p in [
            "/tmp/build",
            "/root/.cache",
            "/home/alice",
            "/var/log",
            "/srv/www",
            "/usrx",
        ] {
            check_tree(Path::new(p)).unwrap();
        }
    }

    #[test]
    fn mounts_inside_are_refused() {
        let t = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\
                 2 1 8:2 / /data/a/disk rw - ext4 /dev/sdb1 rw\n\
                 3 1 0:3 / /data/ab rw - tmpfs tmpfs rw\n";
        let m = mountinfo::parse(t).unwrap();
        let e = check_no_mounts_inside(&m, Path::new("/data/a")).unwrap_err();
        assert!(e.to_string().contains("/data/a/disk (ext4)"), "{e}");
        check_no_mounts_inside(&m, Path::new("/data/a/disk")).unwrap();
        check_no_mounts_inside(&m, Path::new("/data/b")).unwrap();
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
            Err(GuardError::SystemTree { .. })
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
