//! Which processes use a directory: open files, working directories, root
//! directories and memory mappings, read from `/proc`.
//!
//! A program that has a file open in a directory when ramd mounts the RAM
//! copy over it keeps using the on-disk copy hidden underneath, while new
//! opens go to RAM; a sync would then overwrite its writes. So an add is
//! refused while such programs exist (unless forced), naming them, and a
//! forced remove names the programs still using the RAM copy.
//!
//! Invariants:
//! - [`holders`] is pure: it takes what [`scan`] read and decides; the
//!   daemon's own pid is never a holder.
//! - A use matches when its path is the directory itself or below it,
//!   compared component-wise (`/a/bc` is not below `/a/b`), or when the
//!   file's device is the given one (a RAM copy no longer at PATH).
//! - Processes that vanish or cannot be read during the scan are skipped
//!   (a process that exits no longer holds anything).

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How a process uses a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Use {
    /// Its working directory.
    Cwd,
    /// Its root directory (chroot).
    Root,
    /// An open file descriptor.
    Fd(u32),
    /// A memory mapping.
    Map,
}

impl fmt::Display for Use {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Use::Cwd => write!(f, "cwd"),
            Use::Root => write!(f, "root"),
            Use::Fd(n) => write!(f, "fd {n}"),
            Use::Map => write!(f, "mmap"),
        }
    }
}

/// One use: how, the path the kernel shows, and the device of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    pub how: Use,
    pub path: PathBuf,
    /// `st_dev` of the file (None when it could not be read).
    pub dev: Option<u64>,
}

/// What one process uses, as read from `/proc/<pid>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcFiles {
    pub pid: u32,
    /// `/proc/<pid>/comm`.
    pub comm: String,
    pub uses: Vec<Usage>,
}

/// A process using the directory, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    /// (how, path), sorted, at most one `Map` per path.
    pub uses: Vec<(Use, PathBuf)>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.pid, self.comm)?;
        for (i, (how, path)) in self.uses.iter().take(3).enumerate() {
            let sep = if i == 0 { ": " } else { ", " };
            write!(f, "{sep}{how} {}", path.display())?;
        }
        if self.uses.len() > 3 {
            write!(f, ", {} more", self.uses.len() - 3)?;
        }
        Ok(())
    }
}

/// What to look for.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// Paths at or below this directory.
    Under(&'a Path),
    /// Files on this device (a filesystem, e.g. one tmpfs).
    Device(u64),
}

impl Target<'_> {
    fn matches(&self, u: &Usage) -> bool {
        match self {
            Target::Under(dir) => u.path.starts_with(dir),
            Target::Device(dev) => u.dev == Some(*dev),
        }
    }
}

/// The processes among `procs` (but `own_pid`) using `target`, by pid.
pub fn holders(procs: &[ProcFiles], target: Target<'_>, own_pid: u32) -> Vec<Holder> {
    let mut out: Vec<Holder> = procs
        .iter()
        .filter(|p| p.pid != own_pid)
        .filter_map(|p| {
            let mut uses: Vec<(Use, PathBuf)> = p
                .uses
                .iter()
                .filter(|u| target.matches(u))
                .map(|u| (u.how, u.path.clone()))
                .collect();
            uses.sort();
            uses.dedup();
            (!uses.is_empty()).then(|| Holder {
                pid: p.pid,
                comm: p.comm.clone(),
                uses,
            })
        })
        .collect();
    out.sort_by_key(|h| h.pid);
    out
}

/// `1234 (bash): cwd /x; 5678 (python3): fd 3 /x/db` (at most `max`
/// processes, then how many more).
pub fn describe(holders: &[Holder], max: usize) -> String {
    let mut parts: Vec<String> = holders.iter().take(max).map(|h| h.to_string()).collect();
    if holders.len() > max {
        parts.push(format!("and {} more", holders.len() - max));
    }
    parts.join("; ")
}

/// The path a `/proc/<pid>/fd/N` link shows, without the ` (deleted)` the
/// kernel appends to unlinked files (they are still open there).
fn link_path(link: PathBuf) -> PathBuf {
    let s = link.as_os_str().as_encoded_bytes();
    match s.strip_suffix(b" (deleted)") {
        // SAFETY: stripping an ASCII suffix from valid encoded bytes
        // leaves valid encoded bytes.
        Some(p) => PathBuf::from(unsafe { std::ffi::OsStr::from_encoded_bytes_unchecked(p) }),
        None => link,
    }
}

/// The file mappings in a `/proc/<pid>/maps` text: (path, device), one
/// per path and device. The device is the line's `major:minor` (hex), so
/// no file is looked up.
pub fn mapped_files(maps: &str) -> Vec<(PathBuf, Option<u64>)> {
    let mut out: Vec<(PathBuf, Option<u64>)> = maps
        .lines()
        .filter_map(|line| {
            // address perms offset dev inode [path]
            let dev_field = line.split_whitespace().nth(3);
            let mut rest = line;
            for _ in 0..5 {
                rest = rest.trim_start().split_once(' ')?.1;
            }
            let p = rest.trim_start();
            if !p.starts_with('/') {
                return None;
            }
            Some((
                link_path(PathBuf::from(p.to_string())),
                dev_field.and_then(parse_dev),
            ))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `fd:01` (hex major:minor) as a `dev_t`.
fn parse_dev(text: &str) -> Option<u64> {
    let (ma, mi) = text.split_once(':')?;
    Some(libc::makedev(
        u32::from_str_radix(ma, 16).ok()?,
        u32::from_str_radix(mi, 16).ok()?,
    ))
}

/// Everything one process uses (None when it vanished or is unreadable).
/// With `with_dev`, each open file and directory is `stat`ed through
/// `/proc` for its device (which can block on a hung network
/// filesystem: only a forced remove asks for it).
fn read_proc(pid: u32, with_dev: bool) -> Option<ProcFiles> {
    let base = PathBuf::from(format!("/proc/{pid}"));
    let comm = std::fs::read_to_string(base.join("comm")).ok()?;
    let mut uses = Vec::new();
    let mut push = |how: Use, link: &Path| {
        if let Ok(target) = std::fs::read_link(link) {
            if target.is_absolute() {
                let dev = with_dev
                    .then(|| std::fs::metadata(link).ok().map(|m| m.dev()))
                    .flatten();
                uses.push(Usage {
                    how,
                    path: link_path(target),
                    dev,
                });
            }
        }
    };
    push(Use::Cwd, &base.join("cwd"));
    push(Use::Root, &base.join("root"));
    for ent in std::fs::read_dir(base.join("fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Some(n) = ent.file_name().to_str().and_then(|n| n.parse().ok()) {
            push(Use::Fd(n), &ent.path());
        }
    }
    if let Ok(maps) = std::fs::read_to_string(base.join("maps")) {
        for (path, dev) in mapped_files(&maps) {
            uses.push(Usage {
                how: Use::Map,
                path,
                dev,
            });
        }
    }
    Some(ProcFiles {
        pid,
        comm: comm.trim_end().to_string(),
        uses,
    })
}

/// Reads every process in `/proc` (devices of open files only with
/// `with_dev`, see [`read_proc`]).
pub fn scan(with_dev: bool) -> Vec<ProcFiles> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| read_proc(pid, with_dev))
        .collect()
}

/// The processes (but this one) using `target` now.
pub fn find(target: Target<'_>) -> Vec<Holder> {
    let with_dev = matches!(target, Target::Device(_));
    holders(&scan(with_dev), target, std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(how: Use, path: &str, dev: u64) -> Usage {
        Usage {
            how,
            path: path.into(),
            dev: Some(dev),
        }
    }

    #[test]
    fn finds_cwd_fds_and_maps_below_the_directory_only() {
        let procs = vec![
            ProcFiles {
                pid: 10,
                comm: "bash".into(),
                uses: vec![u(Use::Cwd, "/tmp/x", 1), u(Use::Fd(0), "/dev/pts/0", 2)],
            },
            ProcFiles {
                pid: 7,
                comm: "python3".into(),
                uses: vec![
                    u(Use::Fd(3), "/tmp/x/db", 1),
                    u(Use::Map, "/tmp/x/lib.so", 1),
                    u(Use::Fd(4), "/tmp/xy/other", 1),
                ],
            },
            ProcFiles {
                pid: 99,
                comm: "ramd".into(),
                uses: vec![u(Use::Cwd, "/tmp/x", 1)],
            },
            ProcFiles {
                pid: 5,
                comm: "idle".into(),
                uses: vec![u(Use::Cwd, "/", 3)],
            },
        ];
        let h = holders(&procs, Target::Under(Path::new("/tmp/x")), 99);
        assert_eq!(h.iter().map(|h| h.pid).collect::<Vec<_>>(), [7, 10]);
        assert_eq!(
            h[0].to_string(),
            "7 (python3): fd 3 /tmp/x/db, mmap /tmp/x/lib.so"
        );
        assert_eq!(
            describe(&h, 1),
            "7 (python3): fd 3 /tmp/x/db, mmap /tmp/x/lib.so; and 1 more"
        );
        let by_dev = holders(&procs, Target::Device(2), 99);
        assert_eq!(by_dev.len(), 1);
        assert_eq!(by_dev[0].uses, [(Use::Fd(0), PathBuf::from("/dev/pts/0"))]);
        assert!(holders(&procs, Target::Under(Path::new("/srv")), 99).is_empty());
    }

    #[test]
    fn parses_maps_and_deleted_links() {
        let maps = "\
7f00-7f01 r--p 00000000 fd:01 1234                       /usr/lib/libc.so.6
7f01-7f02 rw-p 00000000 00:00 0                          [heap]
7f02-7f03 rw-s 00000000 fd:01 55                         /data/my file (deleted)
7f03-7f04 r--p 00000000 00:00 0
7f04-7f05 r-xp 00001000 fd:01 1234                       /usr/lib/libc.so.6
";
        assert_eq!(
            mapped_files(maps),
            [
                (PathBuf::from("/data/my file"), Some(libc::makedev(0xfd, 1))),
                (
                    PathBuf::from("/usr/lib/libc.so.6"),
                    Some(libc::makedev(0xfd, 1))
                )
            ]
        );
        assert_eq!(link_path("/a/b (deleted)".into()), PathBuf::from("/a/b"));
        assert_eq!(link_path("/a/b".into()), PathBuf::from("/a/b"));
    }

    #[test]
    fn scan_sees_this_process_cwd() {
        let me = read_proc(std::process::id(), true).unwrap();
        let cwd = std::env::current_dir().unwrap();
        let dev = std::fs::metadata(&cwd).unwrap().dev();
        assert!(me
            .uses
            .iter()
            .any(|u| u.how == Use::Cwd && u.path == cwd && u.dev == Some(dev)));
        assert!(read_proc(std::process::id(), false)
            .unwrap()
            .uses
            .iter()
            .all(|u| u.how == Use::Map || u.dev.is_none()));
    }
}
