//! Parsing `/proc/self/mountinfo` (pure; no I/O but [`read`]).
//!
//! One line per mount (see proc(5)):
//!
//! ```text
//! 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//! │  │  │    │     │     │          │        │ │    │         └ super options
//! │  │  │    │     │     │          │        │ │    └ source (we tag ours "ramd-dir:<id>")
//! │  │  │    │     │     │          │        │ └ filesystem type
//! │  │  │    │     │     │          │        └ separator
//! │  │  │    │     │     │          └ optional fields (shared:N, master:N, ...)
//! │  │  │    │     │     └ per-mount options
//! │  │  │    │     └ mount point (octal escapes: \040 space, \011 tab, \012 newline, \134 \)
//! │  │  │    └ root of the mount inside its filesystem
//! │  │  └ st_dev
//! │  └ parent mount id
//! └ mount id
//! ```
//!
//! Later lines stack on earlier ones: when several mounts share a mount
//! point, the last one listed is the one path lookups see.

use std::path::{Path, PathBuf};

/// Errors reading or parsing the mount table.
#[derive(Debug, thiserror::Error)]
pub enum MountInfoError {
    /// cannot read /proc/self/mountinfo (is /proc mounted?)
    #[error("cannot read /proc/self/mountinfo (is /proc mounted?): {0}")]
    Read(#[from] std::io::Error),
    /// malformed mountinfo line
    #[error("malformed /proc/self/mountinfo line {line_no}: {line:?}")]
    Malformed { line_no: usize, line: String },
}

/// One mount, as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Unique id of this mount (parent ids refer to it).
    pub mount_id: u64,
    /// The mount this one sits on.
    pub parent_id: u64,
    /// Where it is mounted, unescaped.
    pub mount_point: PathBuf,
    /// Filesystem type (`tmpfs`, `overlay`, `ext4`...).
    pub fs_type: String,
    /// Source string: ours carry [`super::mounts::SOURCE_PREFIX`] and the dir id.
    pub source: String,
    /// Per-mount options (`rw`/`ro`, `nosuid`...).
    pub mount_options: String,
    /// Filesystem (superblock) options, e.g. tmpfs `size=...`.
    pub super_options: String,
}

impl Mount {
    /// True when the per-mount options say read-only.
    pub fn read_only(&self) -> bool {
        self.mount_options.split(',').any(|o| o == "ro")
    }
}

/// Undoes the kernel's octal escaping (`\040` and friends).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = &b[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(v) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    // Paths are bytes; mountinfo of non-UTF-8 paths is rare and lossy here.
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses the whole table.
pub fn parse(text: &str) -> Result<Vec<Mount>, MountInfoError> {
    let mut mounts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || MountInfoError::Malformed {
            line_no: n + 1,
            line: line.to_string(),
        };
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-").ok_or_else(bad)?;
        if sep < 6 || fields.len() < sep + 3 {
            return Err(bad());
        }
        mounts.push(Mount {
            mount_id: fields[0].parse().map_err(|_| bad())?,
            parent_id: fields[1].parse().map_err(|_| bad())?,
            mount_point: PathBuf::from(unescape(fields[4])),
            mount_options: fields[5].to_string(),
            fs_type: fields[sep + 1].to_string(),
            source: unescape(fields[sep + 2]),
            super_options: fields.get(sep + 3).copied().unwrap_or("").to_string(),
        });
    }
    Ok(mounts)
}

/// Reads and parses this process's mount table.
pub fn read() -> Result<Vec<Mount>, MountInfoError> {
    parse(&std::fs::read_to_string("/proc/self/mountinfo")?)
}

/// The mount path lookups see at `path` (the last listed there), if any.
pub fn top_mount_at<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mounts.iter().rev().find(|m| m.mount_point == path)
}

/// Every mount at or below `path`, deepest (latest) first: the order to
/// unmount them in.
pub fn mounts_under<'a>(mounts: &'a [Mount], path: &Path) -> Vec<&'a Mount> {
    let mut v: Vec<&Mount> = mounts
        .iter()
        .filter(|m| m.mount_point.starts_with(path))
        .collect();
    v.reverse();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw
1 0 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 1 0:35 / /home/u/my\\040cache rw,relatime shared:20 - tmpfs ramd-dir:ab12 rw,size=1048576k,mode=755
41 40 0:36 / /home/u/my\\040cache rw,relatime - overlay ramd-dir:ab12 rw,lowerdir=/run/x
";

    #[test]
    fn parses_fields_and_escapes() {
        let m = parse(SAMPLE).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[2].mount_point, PathBuf::from("/home/u/my cache"));
        assert_eq!(m[2].fs_type, "tmpfs");
        assert_eq!(m[2].source, "ramd-dir:ab12");
        assert_eq!(m[2].super_options, "rw,size=1048576k,mode=755");
        assert_eq!(m[0].mount_options, "rw,nosuid,nodev,noexec,relatime");
        assert_eq!((m[3].mount_id, m[3].parent_id), (41, 40));
        assert!(!m[1].read_only());
    }

    #[test]
    fn top_mount_is_the_last_listed() {
        let m = parse(SAMPLE).unwrap();
        let top = top_mount_at(&m, Path::new("/home/u/my cache")).unwrap();
        assert_eq!(top.fs_type, "overlay");
        assert!(top_mount_at(&m, Path::new("/home/u")).is_none());
        let under = mounts_under(&m, Path::new("/home/u"));
        assert_eq!(
            under.iter().map(|m| m.mount_id).collect::<Vec<_>>(),
            [41, 40]
        );
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in [
            "x",
            "1 2 3 4 5 6",
            "a 1 0:1 / / rw - ext4 /dev/x rw",
            "1 1 0:1 / / - ext4",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn unescape_edge_cases() {
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("tail\\04"), "tail\\04");
        assert_eq!(unescape("\\011\\012"), "\t\n");
        assert_eq!(unescape("\\999"), "\\999");
    }
}
