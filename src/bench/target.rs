//! What may be measured, and what `ramd bench` refuses to write to (pure:
//! the facts come from `prepare`, which looks at the path, or from the
//! daemon's API).
//!
//! The rule: ramd bench writes only to what the user named and only where
//! nothing is lost, unless `--destructive` says otherwise.
//!
//! ```text
//!  named                        without --destructive          with it
//!  directory                    scratch file + scratch dir     the same
//!                               inside, removed afterwards
//!  file that does not exist     created, removed afterwards    the same
//!  empty file                   used, emptied afterwards       the same
//!  file holding data            refused                        overwritten, cut back to
//!                                                              its length afterwards
//!  block device                 refused                        overwritten (opened O_EXCL:
//!                                                              never while mounted)
//!  drive holding no data        used, trimmed afterwards       the same
//!  drive holding data           refused                        overwritten, trimmed
//!  cache                        refused (writes reach the      overwritten
//!                               backing)
//!  anything else (a socket,     refused                        refused
//!  a character device)
//!  anything on a kernel          refused                        refused
//!  pseudo-filesystem (/proc,
//!  /sys, cgroup, debugfs, ...)
//! ```
//!
//! The last row matters because the others go by what `stat` says, and
//! the kernel's own files are not what they seem: /proc/sysrq-trigger is
//! an "empty regular file" that writing random bytes to would crash the
//! machine, a directory in a cgroup filesystem makes a cgroup.

use std::path::{Path, PathBuf};

use crate::size::format_size;

/// What a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Drive,
    Cache,
    File,
    Directory,
    BlockDevice,
}

impl Kind {
    /// As the report spells it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Drive => "drive",
            Kind::Cache => "cache",
            Kind::File => "file",
            Kind::Directory => "directory",
            Kind::BlockDevice => "block-device",
        }
    }
}

/// A drive or cache of the daemon, as its API describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    pub name: String,
    /// `Kind::Drive` or `Kind::Cache`.
    pub kind: Kind,
    /// Its NBD URI (plaintext: the unix socket, or TCP without TLS).
    pub uri: String,
    pub size_bytes: u64,
    /// The drive's memory limit (the prefill must fit).
    pub mem_limit_bytes: Option<u64>,
    /// Memory the drive holds: data the write tests would overwrite.
    pub allocated_bytes: u64,
    pub read_only: bool,
    /// A cache's backing (where its writes go).
    pub backing: Option<String>,
}

/// What the user asked to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    Export(ExportSpec),
    /// A file, directory or block device (`--compare`).
    Path(PathBuf),
}

impl TargetSpec {
    /// The name the report and table use.
    pub fn name(&self) -> String {
        match self {
            TargetSpec::Export(e) => e.name.clone(),
            TargetSpec::Path(p) => p.display().to_string(),
        }
    }
}

/// What a path is (looked up by `prepare`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathFacts {
    /// Nothing there.
    Missing,
    File {
        len: u64,
    },
    Directory,
    BlockDevice,
    /// Something else: its kind, for the message.
    Other(&'static str),
    /// A file or directory of a kernel pseudo-filesystem (its name).
    Pseudo(&'static str),
}

/// How a path will be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathPlan {
    /// An empty file: fill it, empty it afterwards.
    EmptyFile,
    /// A file with data, overwritten (`--destructive`).
    Overwrite,
    /// A scratch file and directory inside, removed afterwards.
    Directory,
    /// The device, overwritten (`--destructive`).
    BlockDevice,
}

/// Why a target is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A block device without `--destructive`.
    #[error("{} is a block device: the write tests would overwrite whatever it holds (a filesystem, a partition table). Name a directory on a filesystem instead (ramd bench writes a scratch file there and removes it), or give --destructive if the device holds nothing you need", .0.display())]
    BlockDevice(PathBuf),
    /// A file holding data without `--destructive`.
    #[error("{} holds {} of data that the write tests would overwrite: name its directory instead (ramd bench writes a scratch file there and removes it), or give --destructive to overwrite it", path.display(), format_size(*len))]
    FileHasData { path: PathBuf, len: u64 },
    /// Neither a file, a directory nor a block device.
    #[error("{} is a {what}: ramd bench measures files, directories and block devices", path.display())]
    Unsupported { path: PathBuf, what: &'static str },
    /// On one of the kernel's pseudo-filesystems.
    #[error("{} is on {fs}, one of the kernel's own filesystems, whose files are controls rather than storage (writing to them can change or crash the system): name a directory on a disk filesystem instead", path.display())]
    PseudoFs { path: PathBuf, fs: &'static str },
    /// A path that does not exist (a typo, or a mount that is not there:
    /// a new file would measure whatever filesystem holds the name).
    #[error("{} does not exist: name an existing directory (ramd bench writes a scratch file there and removes it), file or block device", .0.display())]
    Missing(PathBuf),
    /// A drive holding data without `--destructive`.
    #[error("drive '{name}' holds {} of data that the write tests would overwrite: bench an empty drive (ramd create bench --size 2G && ramd bench bench), or give --destructive to overwrite it (the bench trims what it wrote afterwards)", format_size(*bytes))]
    DriveHasData { name: String, bytes: u64 },
    /// A cache without `--destructive`.
    #[error("cache '{name}' writes through to its backing {backing}: the write tests would overwrite the backing's data. Give --destructive if it holds nothing you need")]
    Cache { name: String, backing: String },
    /// A read-only drive or cache.
    #[error("'{0}' is read-only and every profile writes: unlock it (ramd unlock {0}) or bench another drive")]
    ReadOnly(String),
    /// A drive too small to hold a working set.
    #[error("'{name}' has {} of room (size or memory limit): ramd bench needs at least {}", format_size(*room), format_size(MIN_WORKING_SET_BYTES))]
    TooSmall { name: String, room: u64 },
    /// `--size` below the smallest working set.
    #[error("--size {} is below the {} a working set needs: give --size 16M or more", format_size(*wanted), format_size(MIN_WORKING_SET_BYTES))]
    SizeTooSmall { wanted: u64 },
}

/// The smallest working set worth measuring.
pub const MIN_WORKING_SET_BYTES: u64 = 16 << 20;

/// Granularity of working sets (every block size divides it).
pub const WORKING_SET_ALIGN: u64 = 1 << 20;

/// How `path` will be used, or why not.
pub fn decide_path(path: &Path, facts: PathFacts, destructive: bool) -> Result<PathPlan, Refusal> {
    match facts {
        PathFacts::Missing => Err(Refusal::Missing(path.to_owned())),
        PathFacts::File { len: 0 } => Ok(PathPlan::EmptyFile),
        PathFacts::File { .. } if destructive => Ok(PathPlan::Overwrite),
        PathFacts::File { len } => Err(Refusal::FileHasData {
            path: path.to_owned(),
            len,
        }),
        PathFacts::Directory => Ok(PathPlan::Directory),
        PathFacts::BlockDevice if destructive => Ok(PathPlan::BlockDevice),
        PathFacts::BlockDevice => Err(Refusal::BlockDevice(path.to_owned())),
        PathFacts::Other(what) => Err(Refusal::Unsupported {
            path: path.to_owned(),
            what,
        }),
        PathFacts::Pseudo(fs) => Err(Refusal::PseudoFs {
            path: path.to_owned(),
            fs,
        }),
    }
}

/// Whether a drive or cache may be written, and the working set it allows:
/// `wanted` bytes, at most its size and memory limit, in whole MiB.
pub fn decide_export(e: &ExportSpec, destructive: bool, wanted: u64) -> Result<u64, Refusal> {
    if e.read_only {
        return Err(Refusal::ReadOnly(e.name.clone()));
    }
    if !destructive {
        if e.kind == Kind::Cache {
            return Err(Refusal::Cache {
                name: e.name.clone(),
                backing: e.backing.clone().unwrap_or_else(|| "(unknown)".into()),
            });
        }
        if e.allocated_bytes > 0 {
            return Err(Refusal::DriveHasData {
                name: e.name.clone(),
                bytes: e.allocated_bytes,
            });
        }
    }
    // The prefill must fit under the limit with room for the tests'
    // metadata: 7/8 of it.
    let room = e
        .mem_limit_bytes
        .map_or(e.size_bytes, |l| e.size_bytes.min(l / 8 * 7));
    working_set(&e.name, wanted, room)
}

/// `wanted` bytes within `room`, aligned down, at least the minimum.
pub fn working_set(name: &str, wanted: u64, room: u64) -> Result<u64, Refusal> {
    if wanted < MIN_WORKING_SET_BYTES {
        return Err(Refusal::SizeTooSmall { wanted });
    }
    let ws = wanted.min(room) / WORKING_SET_ALIGN * WORKING_SET_ALIGN;
    if ws < MIN_WORKING_SET_BYTES {
        return Err(Refusal::TooSmall {
            name: name.to_owned(),
            room,
        });
    }
    Ok(ws)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drive(allocated: u64) -> ExportSpec {
        ExportSpec {
            name: "d".into(),
            kind: Kind::Drive,
            uri: "nbd+unix:///d?socket=/x".into(),
            size_bytes: 1 << 30,
            mem_limit_bytes: None,
            allocated_bytes: allocated,
            read_only: false,
            backing: None,
        }
    }

    #[test]
    fn paths_are_written_only_where_nothing_is_lost() {
        let p = Path::new("/x/y");
        let plan = |f, d| decide_path(p, f, d);
        use PathFacts as F;
        // Not even with --destructive: /mnt/missing would measure the
        // filesystem that holds /mnt.
        let e = plan(F::Missing, true).unwrap_err();
        assert!(matches!(e, Refusal::Missing(_)), "{e}");
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert_eq!(plan(F::File { len: 0 }, false), Ok(PathPlan::EmptyFile));
        assert!(matches!(
            plan(F::File { len: 5 }, false),
            Err(Refusal::FileHasData { len: 5, .. })
        ));
        assert_eq!(plan(F::File { len: 5 }, true), Ok(PathPlan::Overwrite));
        assert_eq!(plan(F::Directory, false), Ok(PathPlan::Directory));
        let e = plan(F::BlockDevice, false).unwrap_err();
        assert!(e.to_string().contains("--destructive"), "{e}");
        assert_eq!(plan(F::BlockDevice, true), Ok(PathPlan::BlockDevice));
        assert!(plan(F::Other("socket"), true).is_err());
        let e = plan(F::Pseudo("procfs"), true).unwrap_err();
        assert!(e.to_string().contains("procfs"), "{e}");
    }

    #[test]
    fn drives_and_caches_need_consent_to_lose_data() {
        assert_eq!(decide_export(&drive(0), false, 256 << 20), Ok(256 << 20));
        assert!(matches!(
            decide_export(&drive(4096), false, 1 << 30),
            Err(Refusal::DriveHasData { bytes: 4096, .. })
        ));
        assert_eq!(decide_export(&drive(4096), true, 2 << 30), Ok(1 << 30));
        let mut cache = drive(0);
        cache.kind = Kind::Cache;
        cache.backing = Some("/dev/sdb".into());
        let e = decide_export(&cache, false, 1 << 30).unwrap_err();
        assert!(e.to_string().contains("/dev/sdb"), "{e}");
        assert!(decide_export(&cache, true, 1 << 30).is_ok());
        let mut ro = drive(0);
        ro.read_only = true;
        assert!(matches!(
            decide_export(&ro, true, 1 << 30),
            Err(Refusal::ReadOnly(_))
        ));
        let mut limited = drive(0);
        limited.mem_limit_bytes = Some(64 << 20);
        assert_eq!(decide_export(&limited, false, 1 << 30), Ok(56 << 20));
        limited.mem_limit_bytes = Some(8 << 20);
        assert!(matches!(
            decide_export(&limited, false, 1 << 30),
            Err(Refusal::TooSmall { .. })
        ));
        // A --size below the minimum is named as such, whatever the room.
        let e = decide_export(&drive(0), false, 8 << 20).unwrap_err();
        assert_eq!(e, Refusal::SizeTooSmall { wanted: 8 << 20 });
        assert!(e.to_string().contains("--size 8 MiB"), "{e}");
    }
}
