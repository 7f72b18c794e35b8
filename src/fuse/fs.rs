//! The FUSE filesystem behind `ramd attach`: a directory holding one file,
//! named after the drive, whose bytes are the drive's.
//!
//! ```text
//!  MOUNTPOINT/          inode 1, dr-xr-xr-x
//!  MOUNTPOINT/NAME      inode 2, -rw------- (-r-------- while locked), size = drive size
//! ```
//!
//! Requests go straight to the drive's `Backend` (no NBD hop). The file is
//! opened in direct-I/O mode: the kernel keeps no page cache for it, so
//! what NBD clients write is what the file shows and a detach has nothing
//! left to write back (a filesystem on a loop device above keeps its own
//! cache, as on any disk). `fallocate` punch-hole (what a loop device sends
//! for discard) trims, zero-range writes zeroes; fsync flushes.
//!
//! The file cannot change size (`ramd resize` does that); a truncate to its
//! current size is accepted, any other is EPERM.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};

use crate::backend::{Backend, Error as BackendError};
use crate::block;
use crate::metrics::{ConnRecorder, Op};
use crate::nbd::Export;

const ROOT_INO: u64 = 1;
const FILE_INO: u64 = 2;
/// Attributes may be cached this long: short, because `ramd resize` and
/// `ramd lock` change them behind the kernel's back.
const TTL: Duration = Duration::from_secs(1);
/// Largest write the kernel may send in one request.
const MAX_WRITE_BYTES: u32 = 1 << 20;
/// `fallocate` mode bits (linux/falloc.h).
const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// One attached drive as a filesystem.
pub struct DriveFs {
    /// The drive's export: its backend, name and read-only switch.
    export: Arc<Export>,
    /// Records this attachment's I/O in the drive's metrics (None: off).
    rec: Option<ConnRecorder>,
    /// Owner of the file and directory: the daemon's user.
    uid: u32,
    gid: u32,
    /// Timestamps shown for the file (the attach time).
    since: SystemTime,
}

impl DriveFs {
    pub fn new(export: Arc<Export>) -> DriveFs {
        let rec = export.metrics.as_ref().map(|m| m.connection());
        DriveFs {
            export,
            rec,
            // SAFETY: getuid/getgid have no preconditions and cannot fail.
            uid: unsafe { libc::getuid() },
            // SAFETY: as above.
            gid: unsafe { libc::getgid() },
            since: SystemTime::now(),
        }
    }

    fn backend(&self) -> &dyn Backend {
        &*self.export.backend
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let (kind, perm, size, nlink) = if ino == ROOT_INO {
            (FileType::Directory, 0o555, 0, 2)
        } else {
            let perm = if self.export.is_read_only() {
                0o400
            } else {
                0o600
            };
            (FileType::RegularFile, perm, self.backend().size(), 1)
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.since,
            mtime: self.since,
            ctime: self.since,
            crtime: self.since,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn record(&mut self, op: Op, bytes: u64, result: Result<(), i32>, started: Instant) {
        if let Some(r) = self.rec.as_mut() {
            r.record(op, bytes, result.map_err(|e| e as u32), started);
        }
    }

    /// Checks a change request with the rules every frontend shares
    /// (`block::validate`); the offset, or the errno when refused. The file
    /// cannot grow: writing past its end is "no space".
    fn check(&self, command: block::Command, offset: i64, len: u64) -> Result<u64, i32> {
        let offset = u64::try_from(offset).map_err(|_| libc::EINVAL)?;
        let limits = block::Limits {
            size: self.backend().size(),
            read_only: self.export.is_read_only(),
            // The kernel splits writes at max_write.
            max_len: u64::MAX,
        };
        let req = block::Request {
            command,
            offset,
            len,
        };
        block::validate(req, &limits)
            .map(|_| offset)
            .map_err(|r| r.errno().fuse())
    }
}

/// The errno a backend error is reported as.
fn errno(e: &BackendError) -> i32 {
    block::Errno::of(e).fuse()
}

impl Filesystem for DriveFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        let _ = config.set_max_readahead(MAX_WRITE_BYTES);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT_INO && name == OsStr::new(&self.export.name) {
            reply.entry(&TTL, &self.attr(FILE_INO), 0);
        } else {
            reply.error(libc::ENOENT);
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match ino {
            ROOT_INO | FILE_INO => reply.attr(&TTL, &self.attr(ino)),
            _ => reply.error(libc::ENOENT),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        if ino != FILE_INO && ino != ROOT_INO {
            return reply.error(libc::ENOENT);
        }
        // Only a no-op truncate is allowed; modes and times are fixed.
        if size.is_some_and(|s| ino != FILE_INO || s != self.backend().size()) {
            return reply.error(libc::EPERM);
        }
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if ino != FILE_INO {
            return reply.error(libc::EISDIR);
        }
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writes && self.export.is_read_only() {
            return reply.error(block::Refusal::ReadOnly.errno().fuse());
        }
        reply.opened(0, fuser::consts::FOPEN_DIRECT_IO);
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let started = Instant::now();
        if ino != FILE_INO {
            return reply.error(libc::EISDIR);
        }
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        let end = self.backend().size();
        let len = (size as u64).min(end.saturating_sub(offset)) as usize;
        let mut buf = vec![0u8; len];
        match self.backend().read(offset, &mut buf) {
            Ok(()) => {
                self.record(Op::Read, len as u64, Ok(()), started);
                reply.data(&buf);
            }
            Err(e) => {
                let n = errno(&e);
                self.record(Op::Read, 0, Err(n), started);
                reply.error(n);
            }
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let started = Instant::now();
        if ino != FILE_INO {
            return reply.error(libc::EISDIR);
        }
        let result = self
            .check(block::Command::Write, offset, data.len() as u64)
            .and_then(|off| {
                let sync = flags & (libc::O_SYNC | libc::O_DSYNC) != 0;
                self.backend().write(off, data, sync).map_err(|e| errno(&e))
            });
        self.record(Op::Write, data.len() as u64, result, started);
        match result {
            Ok(()) => reply.written(data.len() as u32),
            Err(n) => reply.error(n),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        // close(2): nothing is buffered here (direct I/O).
        reply.ok();
    }

    fn fsync(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let started = Instant::now();
        let result = self.backend().flush().map_err(|e| errno(&e));
        self.record(Op::Flush, 0, result, started);
        match result {
            Ok(()) => reply.ok(),
            Err(n) => reply.error(n),
        }
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let started = Instant::now();
        if ino != FILE_INO {
            return reply.error(libc::EISDIR);
        }
        let Ok(len) = u64::try_from(length) else {
            return reply.error(libc::EINVAL);
        };
        let (op, result) = if mode & FALLOC_FL_PUNCH_HOLE != 0 {
            let r = self
                .check(block::Command::Trim, offset, len)
                .and_then(|off| self.backend().trim(off, len).map_err(|e| errno(&e)));
            (Op::Trim, r)
        } else if mode & FALLOC_FL_ZERO_RANGE != 0 {
            let r = self
                .check(block::Command::WriteZeroes, offset, len)
                .and_then(|off| {
                    self.backend()
                        .write_zeroes(off, len, false)
                        .map_err(|e| errno(&e))
                });
            (Op::WriteZeroes, r)
        } else if mode & !FALLOC_FL_KEEP_SIZE == 0 {
            // Plain preallocation inside the file: RAM needs none.
            // Checked as a write: the file cannot grow.
            let r = self
                .check(block::Command::WriteZeroes, offset, len)
                .map(|_| ());
            (Op::Cache, r)
        } else {
            (Op::Cache, Err(libc::EOPNOTSUPP))
        };
        self.record(op, len, result, started);
        match result {
            Ok(()) => reply.ok(),
            Err(n) => reply.error(n),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT_INO {
            return reply.error(libc::ENOTDIR);
        }
        let entries = [
            (ROOT_INO, FileType::Directory, "."),
            (ROOT_INO, FileType::Directory, ".."),
            (FILE_INO, FileType::RegularFile, self.export.name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset.max(0) as usize) {
            if reply.add(*ino, (i + 1) as i64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let blocks = self.backend().size().div_ceil(4096);
        reply.statfs(blocks, 0, 0, 2, 0, 4096, 255, 4096);
    }
}
