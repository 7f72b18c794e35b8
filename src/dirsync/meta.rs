//! File metadata: what a sync compares, reads and re-creates.
//!
//! A [`Meta`] is the part of `lstat` the sync cares about. Two entries are
//! *the same* for the sync when [`Meta::same_content`] and
//! [`Meta::same_attributes`] hold and their xattrs are equal: the cheap
//! comparison rsync makes (type, size, mtime to the nanosecond, mode, owner),
//! plus xattrs. Data is copied hole by hole (`SEEK_DATA`/`SEEK_HOLE`), so a
//! sparse file stays sparse and a hole is never written as zeroes.
//!
//! Order of applying attributes to a copy (each step would undo an earlier
//! one otherwise): xattrs, then owner (chown clears set-uid/set-gid bits),
//! then mode, then timestamps (every other change touches ctime, not mtime,
//! but writing data does, so times go last).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use rustix::fs::{AtFlags, Timespec, Timestamps, CWD};

/// The file types a directory tree may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl Kind {
    fn from_mode(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => Kind::File,
        }
    }
}

/// The `lstat` fields a sync uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// File type: entries of different types are never "the same".
    pub kind: Kind,
    /// Permission bits including set-uid, set-gid and sticky (`0o7777`).
    pub perm: u32,
    /// Owner, preserved on copies.
    pub uid: u32,
    /// Group, preserved on copies.
    pub gid: u32,
    /// Size in bytes (for symlinks the target's length).
    pub size: u64,
    /// Modification time: the change detector, preserved to the nanosecond.
    pub mtime: (i64, i64),
    /// Access time, preserved on copies (not compared: reads change it).
    pub atime: (i64, i64),
    /// Change time: any write, chmod, chown or xattr change moves it, so a
    /// copy re-checks it to notice a file changing under it.
    pub ctime: (i64, i64),
    /// Device and inode: hard links share them.
    pub dev_ino: (u64, u64),
    /// Link count: above 1 the file may have other names in the tree.
    pub nlink: u64,
    /// Device number of character and block devices.
    pub rdev: u64,
}

impl Meta {
    /// `lstat(path)`.
    pub fn lstat(path: &Path) -> io::Result<Meta> {
        Ok(Meta::from_std(&std::fs::symlink_metadata(path)?))
    }

    /// `fstat(file)`.
    pub fn fstat(file: &File) -> io::Result<Meta> {
        Ok(Meta::from_std(&file.metadata()?))
    }

    fn from_std(m: &std::fs::Metadata) -> Meta {
        Meta {
            kind: Kind::from_mode(m.mode()),
            perm: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            atime: (m.atime(), m.atime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            dev_ino: (m.dev(), m.ino()),
            nlink: m.nlink(),
            rdev: m.rdev(),
        }
    }

    /// Same type, size and mtime (and device number): the data is taken to
    /// be unchanged, as rsync does.
    pub fn same_content(&self, other: &Meta) -> bool {
        self.kind == other.kind
            && self.size == other.size
            && (self.kind == Kind::Dir || self.mtime == other.mtime)
            && self.rdev == other.rdev
    }

    /// Same mode and owner (directories: and mtime).
    pub fn same_attributes(&self, other: &Meta) -> bool {
        self.perm == other.perm
            && self.uid == other.uid
            && self.gid == other.gid
            && (self.kind != Kind::Dir || self.mtime == other.mtime)
    }

    /// True when the file changed between two `stat`s of it.
    pub fn changed_since(&self, earlier: &Meta) -> bool {
        self.size != earlier.size || self.mtime != earlier.mtime || self.ctime != earlier.ctime
    }
}

/// Extended attributes of one entry, sorted by name.
pub type Xattrs = Vec<(OsString, Vec<u8>)>;

/// Retries a size-query-then-fetch xattr call while the value grows under us.
fn fetch_sized(
    mut query: impl FnMut() -> rustix::io::Result<usize>,
    mut fetch: impl FnMut(&mut [u8]) -> rustix::io::Result<usize>,
) -> io::Result<Vec<u8>> {
    for _ in 0..8 {
        let n = query()?;
        let mut buf = vec![0u8; n];
        match fetch(&mut buf) {
            Ok(got) => {
                buf.truncate(got);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::other("xattr keeps growing while being read"))
}

/// Reads every extended attribute of `path` (not following symlinks).
/// A filesystem without xattr support has none.
pub fn read_xattrs(path: &Path) -> io::Result<Xattrs> {
    let names = match fetch_sized(
        || rustix::fs::llistxattr_query(path),
        |b| rustix::fs::llistxattr(path, b),
    ) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = OsStr::from_bytes(name);
        match fetch_sized(
            || rustix::fs::lgetxattr_query(path, name),
            |b| rustix::fs::lgetxattr(path, name, b),
        ) {
            Ok(value) => out.push((name.to_os_string(), value)),
            // Removed between list and get: it no longer exists.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    out.sort();
    Ok(out)
}

/// Sets `want` on `path` and removes any other attribute it has. Returns how
/// many attributes the target filesystem refused as unsupported (those are
/// dropped, and the sync reports them); other errors fail.
pub fn write_xattrs(path: &Path, want: &Xattrs) -> io::Result<u64> {
    let have = read_xattrs(path)?;
    let mut dropped = 0;
    for (name, _) in &have {
        if !want.iter().any(|(n, _)| n == name) {
            rustix::fs::lremovexattr(path, name.as_os_str())?;
        }
    }
    for (name, value) in want {
        if have.iter().any(|(n, v)| n == name && v == value) {
            continue;
        }
        match rustix::fs::lsetxattr(
            path,
            name.as_os_str(),
            value,
            rustix::fs::XattrFlags::empty(),
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::OPNOTSUPP) | Err(rustix::io::Errno::PERM) => dropped += 1,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(dropped)
}

fn ts((sec, nsec): (i64, i64)) -> Timespec {
    Timespec {
        tv_sec: sec,
        tv_nsec: nsec as _,
    }
}

/// Applies owner, mode and times of `m` to `path` (xattrs separately, first).
/// Symlinks get owner and times only (their mode is meaningless on Linux).
pub fn apply_attributes(path: &Path, m: &Meta) -> io::Result<()> {
    rustix::fs::chownat(
        CWD,
        path,
        Some(rustix::fs::Uid::from_raw(m.uid)),
        Some(rustix::fs::Gid::from_raw(m.gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )?;
    if m.kind != Kind::Symlink {
        rustix::fs::chmodat(
            CWD,
            path,
            rustix::fs::Mode::from_raw_mode(m.perm),
            AtFlags::empty(),
        )?;
    }
    set_times(path, m)
}

/// Sets access and modification times of `path` (not following symlinks).
pub fn set_times(path: &Path, m: &Meta) -> io::Result<()> {
    let times = Timestamps {
        last_access: ts(m.atime),
        last_modification: ts(m.mtime),
    };
    rustix::fs::utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// Creates a non-regular, non-directory entry like `m` at `path` (symlink,
/// fifo, socket, device). `link_target` is the symlink's target.
pub fn create_special(path: &Path, m: &Meta, link_target: Option<&OsStr>) -> io::Result<()> {
    use rustix::fs::{FileType, Mode};
    match m.kind {
        Kind::Symlink => {
            let target = link_target.ok_or_else(|| io::Error::other("symlink without target"))?;
            rustix::fs::symlinkat(target, CWD, path)?;
        }
        Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev => {
            let ft = match m.kind {
                Kind::Fifo => FileType::Fifo,
                Kind::Socket => FileType::Socket,
                Kind::CharDev => FileType::CharacterDevice,
                _ => FileType::BlockDevice,
            };
            rustix::fs::mknodat(CWD, path, ft, Mode::from_raw_mode(0o600), m.rdev as _)?;
        }
        Kind::File | Kind::Dir => unreachable!("create_special called for {:?}", m.kind),
    }
    Ok(())
}

/// Reads a symlink's target.
pub fn read_link(path: &Path) -> io::Result<OsString> {
    Ok(std::fs::read_link(path)?.into_os_string())
}

/// Size of the copy buffer: large enough to stream, small enough to stay in
/// cache.
const COPY_CHUNK_BYTES: usize = 1 << 20;

/// Copies `len` bytes of `src`'s data into `dst` (an empty file), keeping
/// holes: only the ranges `SEEK_DATA` reports are read and written, and the
/// size is set at the end. Returns (bytes written, checksum); the checksum
/// covers the data ranges and their offsets, so [`checksum_data`] of the
/// source taken later tells whether the source still holds what was copied.
pub fn copy_data(src: &File, dst: &File, len: u64) -> io::Result<(u64, u32)> {
    let mut buf = vec![0u8; COPY_CHUNK_BYTES];
    let mut written = 0;
    let crc = walk_data(src, len, &mut buf, |off, data| {
        dst.write_all_at(data, off)?;
        written += data.len() as u64;
        Ok(())
    })?;
    dst.set_len(len)?;
    Ok((written, crc))
}

/// The checksum [`copy_data`] computes, for the first `len` bytes of `file`.
pub fn checksum_data(file: &File, len: u64) -> io::Result<u32> {
    let mut buf = vec![0u8; COPY_CHUNK_BYTES];
    walk_data(file, len, &mut buf, |_, _| Ok(()))
}

/// Calls `f(offset, bytes)` for each data chunk of the first `len` bytes of
/// `file`, skipping holes; returns the crc32c of every (offset, bytes).
fn walk_data(
    file: &File,
    len: u64,
    buf: &mut [u8],
    mut f: impl FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<u32> {
    use rustix::fs::SeekFrom;
    let mut crc = 0u32;
    let mut pos = 0u64;
    while pos < len {
        let data = match rustix::fs::seek(file, SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data after pos: the rest is a hole.
            Err(rustix::io::Errno::NXIO) => break,
            // No SEEK_DATA support: treat everything as data.
            Err(rustix::io::Errno::INVAL) => pos,
            Err(e) => return Err(e.into()),
        };
        if data >= len {
            break;
        }
        let hole = match rustix::fs::seek(file, SeekFrom::Hole(data)) {
            Ok(h) => h.min(len),
            Err(rustix::io::Errno::INVAL) => len,
            Err(e) => return Err(e.into()),
        };
        let mut off = data;
        while off < hole {
            let want = ((hole - off) as usize).min(buf.len());
            let got = file.read_at(&mut buf[..want], off)?;
            if got == 0 {
                // Shrunk under us: the caller's re-stat notices.
                return Ok(crc ^ 0xdead_beef);
            }
            crc = crc32c::crc32c_append(crc, &off.to_le_bytes());
            crc = crc32c::crc32c_append(crc, &buf[..got]);
            f(off, &buf[..got])?;
            off += got as u64;
        }
        pos = hole;
    }
    Ok(crc)
}

/// The bytes of an OS string, for names in errors and hashes.
pub fn name_bytes(name: &OsStr) -> Vec<u8> {
    name.to_os_string().into_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn sparse_copy_keeps_holes_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let src_path = dir.path().join("src");
        let src = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&src_path)
            .unwrap();
        src.set_len(8 << 20).unwrap();
        src.write_all_at(b"head", 0).unwrap();
        src.write_all_at(&[7u8; 5000], 4 << 20).unwrap();
        let dst = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.path().join("dst"))
            .unwrap();
        let (written, crc) = copy_data(&src, &dst, 8 << 20).unwrap();
        assert!(
            written < 1 << 20,
            "holes were copied as data: {written} bytes"
        );
        assert_eq!(crc, checksum_data(&src, 8 << 20).unwrap());
        assert_eq!(crc, checksum_data(&dst, 8 << 20).unwrap());
        let a = std::fs::read(&src_path).unwrap();
        let b = std::fs::read(dir.path().join("dst")).unwrap();
        assert_eq!(a, b);
        assert!(dst.metadata().unwrap().blocks() * 512 < 1 << 20);
    }

    #[test]
    fn checksum_sees_changes() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.path().join("f"))
            .unwrap();
        f.write_all(b"hello world").unwrap();
        let a = checksum_data(&f, 11).unwrap();
        f.write_all_at(b"J", 6).unwrap();
        assert_ne!(a, checksum_data(&f, 11).unwrap());
    }

    #[test]
    fn xattrs_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let want = vec![
            (OsString::from("user.a"), b"1".to_vec()),
            (OsString::from("user.b"), vec![0, 1, 2]),
        ];
        if write_xattrs(&p, &want).unwrap() > 0 {
            eprintln!("filesystem refuses user xattrs; skipping");
            return;
        }
        assert_eq!(read_xattrs(&p).unwrap(), want);
        let fewer = vec![want[1].clone()];
        write_xattrs(&p, &fewer).unwrap();
        assert_eq!(read_xattrs(&p).unwrap(), fewer);
    }
}
