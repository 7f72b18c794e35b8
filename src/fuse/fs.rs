//! The FUSE filesystem behind `ramd attach`: a directory holding one file,
//! named after the drive, whose bytes are the drive's.
//!
//! ```text
//!  MOUNTPOINT/          inode 1, dr-xr-xr-x
//!  MOUNTPOINT/NAME      inode 2, -rw------- (-r-------- while locked), size = drive size
//! ```
//!
//! [`DriveFs::handle`] answers one decoded request; it takes `&self` and
//! keeps no per-request state, so every queue thread of a mount
//! (`fuse::session`) calls it at once. Requests go straight to the
//! drive's `Backend` (no NBD hop), through `block::validate` like NBD
//! requests, with errnos from the same table. The file is opened in
//! direct-I/O mode with parallel direct writes: the kernel keeps no page
//! cache for it (what NBD clients write is what the file shows, and a
//! detach has nothing to write back) and does not serialise writers.
//! `fallocate` punch-hole (what a loop device sends for discard) trims,
//! zero-range writes zeroes; fsync flushes: the drive's durability promise
//! (a persistent drive's sync mode) is what FLUSH means over NBD too.
//!
//! The file cannot change size (`ramd resize` does that); a truncate to its
//! current size is accepted, any other is EPERM.

use std::ffi::OsStr;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::proto::{self, Attr, Op};
use crate::block::backend::{Backend, Error as BackendError};
use crate::block::{self, Export};
use crate::metrics::{ConnRecorder, Op as MetricOp};

const ROOT_INO: u64 = 1;
const FILE_INO: u64 = 2;
/// Attributes may be cached this long: short, because `ramd resize` and
/// `ramd lock` change them behind the kernel's back.
const TTL_S: u64 = 1;
/// Largest READ or WRITE the kernel may send in one request (256 pages).
pub const MAX_IO_BYTES: u32 = 1 << 20;
/// Asynchronous requests (direct I/O from a loop device) the kernel may
/// keep in flight: at least what fio's QD64 x 2 jobs send.
const MAX_BACKGROUND: u16 = 256;
/// `fallocate` mode bits (linux/falloc.h).
const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
const FALLOC_FL_ZERO_RANGE: u32 = 0x10;
/// `d_type` values for READDIR.
const DT_DIR: u32 = 4;
const DT_REG: u32 = 8;

/// How a handled request is answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// Nothing more to send: FORGET and INTERRUPT (the kernel expects no
    /// answer), or a READ already sent through the [`Sink`].
    None,
    Error(i32),
    /// Success; the body (possibly empty) is in the scratch buffer.
    Body,
}

/// What a queue thread lends a request: a reply buffer and its recorder.
pub struct Scratch {
    pub body: Vec<u8>,
    pub rec: Option<ConnRecorder>,
}

/// Sends a successful reply whose body is `data`, in one write.
pub trait Sink {
    fn send_data(&mut self, unique: u64, data: &[IoSlice<'_>]) -> std::io::Result<()>;
}

/// One attached drive as a filesystem.
pub struct DriveFs {
    /// The drive's export: its backend (behind the read-only layer) and name.
    export: Arc<Export>,
    /// Owner of the file and directory: the daemon's user, the only one
    /// (with root, where the mount allows it) whose requests are served.
    uid: u32,
    gid: u32,
    /// Timestamps shown for the file (the attach time).
    since_s: u64,
    /// The drive works in place (`Caps::direct_io`, fixed for a backend):
    /// READs are sent from its pages. Read once, not per request.
    direct_io: bool,
}

impl DriveFs {
    pub fn new(export: Arc<Export>) -> DriveFs {
        let direct_io = export.backend.capabilities().direct_io;
        DriveFs {
            direct_io,
            export,
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            since_s: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    pub fn export(&self) -> &Arc<Export> {
        &self.export
    }

    fn backend(&self) -> &dyn Backend {
        &*self.export.backend
    }

    fn attr(&self, ino: u64) -> Attr {
        let (mode, size, nlink) = if ino == ROOT_INO {
            (libc::S_IFDIR | 0o555, 0, 2)
        } else if self.export.is_read_only() {
            (libc::S_IFREG | 0o400, self.backend().size(), 1)
        } else {
            (libc::S_IFREG | 0o600, self.backend().size(), 1)
        };
        Attr {
            ino,
            size,
            time_s: self.since_s,
            mode,
            nlink,
            uid: self.uid,
            gid: self.gid,
        }
    }

    /// Answers one request. `sink` sends READ data in place; the rest
    /// is described by the returned [`Reply`].
    pub fn handle(
        &self,
        header: &proto::Header,
        op: Op<'_>,
        s: &mut Scratch,
        sink: &mut dyn Sink,
    ) -> Reply {
        s.body.clear();
        if header.uid != self.uid && header.uid != 0 && header.opcode != proto::INIT {
            return Reply::Error(libc::EACCES);
        }
        match op {
            Op::Init { .. } | Op::Destroy => Reply::Error(libc::EPROTO),
            Op::Forget | Op::Interrupt => Reply::None,
            Op::Lookup(name) => self.lookup(header.nodeid, name, s),
            Op::GetAttr => self.getattr(header.nodeid, s),
            Op::SetAttr { valid, size } => self.setattr(header.nodeid, valid, size, s),
            Op::Open { flags } => self.open(header.nodeid, flags, s),
            Op::OpenDir => {
                proto::open_out(&mut s.body, 0);
                Reply::Body
            }
            Op::Read { offset, size } => self.read(header, offset, size, s, sink),
            Op::Write {
                offset,
                data,
                flags,
            } => self.write(header.nodeid, offset, data, flags, s),
            // close(2): nothing is buffered here (direct I/O).
            Op::Flush | Op::Release | Op::Access => Reply::Body,
            Op::Fsync => self.fsync(s),
            Op::Statfs => {
                proto::statfs_out(&mut s.body, self.backend().size().div_ceil(4096));
                Reply::Body
            }
            Op::ReadDir { offset, size } => self.readdir(header.nodeid, offset, size, s),
            Op::Fallocate {
                offset,
                length,
                mode,
            } => self.fallocate(header.nodeid, offset, length, mode, s),
            Op::Unsupported => Reply::Error(libc::ENOSYS),
        }
    }

    /// The INIT reply's terms, given the kernel's offered flags.
    pub fn init_terms(offered: u64, max_readahead: u32) -> proto::InitReply {
        let want = proto::ASYNC_READ
            | proto::BIG_WRITES
            | proto::ASYNC_DIO
            | proto::PARALLEL_DIROPS
            | proto::MAX_PAGES;
        proto::InitReply {
            flags: offered & want,
            max_readahead: max_readahead.min(MAX_IO_BYTES),
            max_write: MAX_IO_BYTES,
            max_pages: (MAX_IO_BYTES / 4096) as u16,
            max_background: MAX_BACKGROUND,
        }
    }

    fn lookup(&self, parent: u64, name: &OsStr, s: &mut Scratch) -> Reply {
        if parent != ROOT_INO || name != OsStr::new(&self.export.name) {
            return Reply::Error(libc::ENOENT);
        }
        proto::entry_out(&mut s.body, &self.attr(FILE_INO), TTL_S);
        Reply::Body
    }

    fn getattr(&self, ino: u64, s: &mut Scratch) -> Reply {
        if ino != ROOT_INO && ino != FILE_INO {
            return Reply::Error(libc::ENOENT);
        }
        proto::attr_out(&mut s.body, &self.attr(ino), TTL_S);
        Reply::Body
    }

    fn setattr(&self, ino: u64, valid: u32, size: u64, s: &mut Scratch) -> Reply {
        if ino != FILE_INO && ino != ROOT_INO {
            return Reply::Error(libc::ENOENT);
        }
        // Only a no-op truncate is allowed; modes and times are fixed.
        if valid & proto::FATTR_SIZE != 0 && (ino != FILE_INO || size != self.backend().size()) {
            return Reply::Error(libc::EPERM);
        }
        proto::attr_out(&mut s.body, &self.attr(ino), TTL_S);
        Reply::Body
    }

    fn open(&self, ino: u64, flags: u32, s: &mut Scratch) -> Reply {
        if ino != FILE_INO {
            return Reply::Error(libc::EISDIR);
        }
        let writes = flags as i32 & libc::O_ACCMODE != libc::O_RDONLY;
        if writes && self.export.is_read_only() {
            return Reply::Error(block::Refusal::ReadOnly.errno().fuse());
        }
        let open_flags = proto::FOPEN_DIRECT_IO | proto::FOPEN_PARALLEL_DIRECT_WRITES;
        proto::open_out(&mut s.body, open_flags);
        Reply::Body
    }

    fn read(
        &self,
        header: &proto::Header,
        offset: u64,
        size: u32,
        s: &mut Scratch,
        sink: &mut dyn Sink,
    ) -> Reply {
        let started = Instant::now();
        if header.nodeid != FILE_INO {
            return Reply::Error(libc::EISDIR);
        }
        // A file reads short at its end (the kernel never asks past it
        // unless the drive shrank meanwhile).
        let end = self.backend().size();
        let len = (size as u64).min(end.saturating_sub(offset)) as usize;
        let sent = self.send_in_place(header.unique, offset, len, sink);
        if sent {
            record(&mut s.rec, MetricOp::Read, len as u64, Ok(()), started);
            return Reply::None;
        }
        s.body.resize(len, 0);
        match self.backend().read(offset, &mut s.body) {
            Ok(()) => {
                record(&mut s.rec, MetricOp::Read, len as u64, Ok(()), started);
                Reply::Body
            }
            Err(e) => {
                let n = errno(&e);
                record(&mut s.rec, MetricOp::Read, 0, Err(n), started);
                Reply::Error(n)
            }
        }
    }

    /// Sends a READ's bytes from the drive's memory in one write when the
    /// drive offers the whole range at once (a RAM drive); false when the
    /// caller must copy (other backends, or an error to report).
    fn send_in_place(&self, unique: u64, offset: u64, len: usize, sink: &mut dyn Sink) -> bool {
        if !self.direct_io || len == 0 {
            return false;
        }
        let mut sent = false;
        let r = self.backend().read_with(offset, len, &mut |slices| {
            let offered: usize = slices.iter().map(|s| s.len()).sum();
            if offered < len || slices.len() > MAX_SLICES {
                return Ok(0);
            }
            sink.send_data(unique, slices)?;
            sent = true;
            Ok(len)
        });
        match r {
            Ok(_) => sent,
            // The request was answered if `sent`; a failed send (the
            // request was interrupted) needs nothing more.
            Err(_) => sent,
        }
    }

    fn write(&self, ino: u64, offset: u64, data: &[u8], flags: u32, s: &mut Scratch) -> Reply {
        let started = Instant::now();
        if ino != FILE_INO {
            return Reply::Error(libc::EISDIR);
        }
        let result = self
            .check(block::Command::Write, offset, data.len() as u64)
            .and_then(|()| {
                let sync = flags as i32 & (libc::O_SYNC | libc::O_DSYNC) != 0;
                self.backend()
                    .write(offset, data, sync)
                    .map_err(|e| errno(&e))
            });
        record(
            &mut s.rec,
            MetricOp::Write,
            data.len() as u64,
            result,
            started,
        );
        match result {
            Ok(()) => {
                proto::write_out(&mut s.body, data.len() as u32);
                Reply::Body
            }
            Err(n) => Reply::Error(n),
        }
    }

    fn fsync(&self, s: &mut Scratch) -> Reply {
        let started = Instant::now();
        let result = self.backend().flush().map_err(|e| errno(&e));
        record(&mut s.rec, MetricOp::Flush, 0, result, started);
        match result {
            Ok(()) => Reply::Body,
            Err(n) => Reply::Error(n),
        }
    }

    fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: u32, s: &mut Scratch) -> Reply {
        let started = Instant::now();
        if ino != FILE_INO {
            return Reply::Error(libc::EISDIR);
        }
        let (op, result) = if mode & FALLOC_FL_PUNCH_HOLE != 0 {
            let r = self
                .check(block::Command::Trim, offset, len)
                .and_then(|()| self.backend().trim(offset, len).map_err(|e| errno(&e)));
            (MetricOp::Trim, r)
        } else if mode & FALLOC_FL_ZERO_RANGE != 0 {
            let r = self
                .check(block::Command::WriteZeroes, offset, len)
                .and_then(|()| {
                    let r = self.backend().write_zeroes(offset, len, false);
                    r.map_err(|e| errno(&e))
                });
            (MetricOp::WriteZeroes, r)
        } else if mode & !FALLOC_FL_KEEP_SIZE == 0 {
            // Plain preallocation inside the file: RAM needs none.
            // Checked as a write: the file cannot grow.
            let r = self.check(block::Command::WriteZeroes, offset, len);
            (MetricOp::Cache, r)
        } else {
            (MetricOp::Cache, Err(libc::EOPNOTSUPP))
        };
        record(&mut s.rec, op, len, result, started);
        match result {
            Ok(()) => Reply::Body,
            Err(n) => Reply::Error(n),
        }
    }

    fn readdir(&self, ino: u64, offset: u64, size: u32, s: &mut Scratch) -> Reply {
        if ino != ROOT_INO {
            return Reply::Error(libc::ENOTDIR);
        }
        let entries = [
            (ROOT_INO, DT_DIR, "."),
            (ROOT_INO, DT_DIR, ".."),
            (FILE_INO, DT_REG, self.export.name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            let next = (i + 1) as u64;
            if !proto::dirent(
                &mut s.body,
                size as usize,
                *ino,
                next,
                *kind,
                name.as_bytes(),
            ) {
                break;
            }
        }
        Reply::Body
    }

    /// Checks a change request with the rules every frontend shares
    /// (`block::validate`). The file cannot grow: writing past its end is
    /// "no space".
    fn check(&self, command: block::Command, offset: u64, len: u64) -> Result<(), i32> {
        let limits = block::Limits {
            size: self.backend().size(),
            read_only: self.export.is_read_only(),
            // The kernel splits requests at max_write.
            max_len: u64::MAX,
        };
        let req = block::Request {
            command,
            offset,
            len,
        };
        block::validate(req, &limits)
            .map(|_| ())
            .map_err(|r| r.errno().fuse())
    }
}

/// More slices than this and a READ is copied instead (writev's limit is
/// 1024 including the header).
const MAX_SLICES: usize = 512;

fn record(
    rec: &mut Option<ConnRecorder>,
    op: MetricOp,
    bytes: u64,
    r: Result<(), i32>,
    started: Instant,
) {
    if let Some(rec) = rec.as_mut() {
        rec.record(op, bytes, r.map_err(|e| e as u32), started);
    }
}

/// The errno a backend error is reported as.
fn errno(e: &BackendError) -> i32 {
    block::Errno::of(e).fuse()
}
