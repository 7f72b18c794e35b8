//! The FUSE kernel protocol, as much of it as one file in one directory
//! needs: decoding requests read from `/dev/fuse` and encoding replies.
//! Pure: no I/O, so every malformed input is tested here.
//!
//! Layouts follow `include/uapi/linux/fuse.h` (protocol 7.x, native byte
//! order, the kernel's own). A request is a 40-byte `fuse_in_header`
//! followed by the opcode's argument struct and any payload; a reply is a
//! 16-byte `fuse_out_header` followed by the opcode's reply struct or
//! data, written to the device in one `writev`.
//!
//! Invariants:
//! - `decode` never trusts a length: the header's `len` must equal the
//!   bytes read, and every argument struct must fit in what follows it;
//!   anything else is [`Malformed`] (answered EINVAL, never a panic).
//! - Replies are built into caller-owned buffers: no allocation per
//!   request on the data path (READ/WRITE).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// The protocol version we speak (major, minor). 7.31 brought
/// FUSE_MAX_PAGES (1 MiB requests); FOPEN_PARALLEL_DIRECT_WRITES needs
/// 7.36, which older kernels simply ignore.
pub const VERSION: (u32, u32) = (7, 38);

pub const IN_HEADER_BYTES: usize = 40;
pub const OUT_HEADER_BYTES: usize = 16;
/// `fuse_write_in` / `fuse_read_in`.
const RW_IN_BYTES: usize = 40;
/// The smallest read buffer the kernel accepts on `/dev/fuse`.
pub const MIN_READ_BUFFER_BYTES: usize = 8192;

// Opcodes (enum fuse_opcode).
pub const LOOKUP: u32 = 1;
pub const FORGET: u32 = 2;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const FLUSH: u32 = 25;
pub const INIT: u32 = 26;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const FSYNCDIR: u32 = 30;
pub const ACCESS: u32 = 34;
pub const INTERRUPT: u32 = 36;
pub const DESTROY: u32 = 38;
pub const BATCH_FORGET: u32 = 42;
pub const FALLOCATE: u32 = 43;

// INIT flags (fuse_init_in/out.flags; flags2 holds bits 32..).
pub const ASYNC_READ: u64 = 1 << 0;
pub const BIG_WRITES: u64 = 1 << 5;
pub const ASYNC_DIO: u64 = 1 << 15;
pub const PARALLEL_DIROPS: u64 = 1 << 18;
pub const MAX_PAGES: u64 = 1 << 22;
pub const INIT_EXT: u64 = 1 << 30;
/// `FUSE_OVER_IO_URING` (7.42, in flags2): requests may be served through
/// io_uring ring entries (`fuse::uring`) instead of `read`/`writev`.
pub const OVER_IO_URING: u64 = 1 << 41;

// OPEN reply flags.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

/// SETATTR: the size field is valid.
pub const FATTR_SIZE: u32 = 1 << 3;

/// A request the kernel sent that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("request of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("header says {header} bytes, {read} were read")]
    Length { header: u32, read: usize },
    #[error("opcode {opcode}: arguments need {need} bytes, {have} follow the header")]
    Args {
        opcode: u32,
        need: usize,
        have: usize,
    },
    #[error("WRITE of {size} bytes carries {have} bytes of data")]
    Payload { size: u32, have: usize },
}

/// The fields of `fuse_in_header` a filesystem uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
}

/// A decoded request; `'a` borrows the buffer it was read into.
#[derive(Debug, PartialEq, Eq)]
pub enum Op<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
    },
    Lookup(&'a OsStr),
    /// FORGET and BATCH_FORGET: never answered.
    Forget,
    GetAttr,
    SetAttr {
        valid: u32,
        size: u64,
    },
    Open {
        flags: u32,
    },
    OpenDir,
    Read {
        offset: u64,
        size: u32,
    },
    Write {
        offset: u64,
        data: &'a [u8],
        /// The open(2) flags of the file (O_SYNC, O_DSYNC).
        flags: u32,
    },
    Flush,
    Release,
    Fsync,
    Statfs,
    ReadDir {
        offset: u64,
        size: u32,
    },
    Fallocate {
        offset: u64,
        length: u64,
        mode: u32,
    },
    Access,
    /// Never answered; the interrupted request is answered as usual (ours
    /// never wait).
    Interrupt,
    Destroy,
    /// Anything else: answered ENOSYS, which tells the kernel not to ask
    /// again for most opcodes.
    Unsupported,
}

/// A little-endian-free reader: the kernel writes native byte order.
/// `b` is the opcode's argument struct; `payload` what follows it (a
/// LOOKUP's name, a WRITE's data). From `/dev/fuse` both come in one
/// buffer ([`split_classic`]); an io_uring entry has them in two.
struct Args<'a> {
    opcode: u32,
    b: &'a [u8],
    payload: &'a [u8],
}

impl<'a> Args<'a> {
    fn need(&self, n: usize) -> Result<(), Malformed> {
        if self.b.len() < n {
            return Err(Malformed::Args {
                opcode: self.opcode,
                need: n,
                have: self.b.len(),
            });
        }
        Ok(())
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_ne_bytes(self.b[at..at + 4].try_into().expect("4 bytes"))
    }
    fn u64(&self, at: usize) -> u64 {
        u64::from_ne_bytes(self.b[at..at + 8].try_into().expect("8 bytes"))
    }
}

/// Decodes one request as read from the device.
pub fn decode(buf: &[u8]) -> Result<(Header, Op<'_>), Malformed> {
    if buf.len() < IN_HEADER_BYTES {
        return Err(Malformed::Short(buf.len()));
    }
    let h = Args {
        opcode: 0,
        b: buf,
        payload: &[],
    };
    let len = h.u32(0);
    if len as usize != buf.len() {
        return Err(Malformed::Length {
            header: len,
            read: buf.len(),
        });
    }
    let header = in_header(&h);
    let (b, payload) = split_classic(header.opcode, &buf[IN_HEADER_BYTES..]);
    let a = Args {
        opcode: header.opcode,
        b,
        payload,
    };
    Ok((header, op(&a)?))
}

fn in_header(h: &Args<'_>) -> Header {
    Header {
        opcode: h.u32(4),
        unique: h.u64(8),
        nodeid: h.u64(16),
        uid: h.u32(24),
    }
}

/// Splits what follows a `/dev/fuse` request's header into the argument
/// struct and the payload after it (see [`Args`]).
fn split_classic(opcode: u32, rest: &[u8]) -> (&[u8], &[u8]) {
    match opcode {
        LOOKUP => (&[], rest),
        WRITE => rest.split_at(RW_IN_BYTES.min(rest.len())),
        _ => (rest, &[]),
    }
}

/// Decodes one request delivered in an io_uring ring entry: the
/// `fuse_in_header` from the header buffer's `in_out`, the argument struct
/// from its `op_in`, and `payload` (the payload buffer's first
/// `ring_ent_in_out.payload_sz` bytes). The kernel puts a request's first
/// argument in `op_in` and the rest in the payload (`fuse_uring_args_to_ring`,
/// fs/fuse/dev_uring.c); a LOOKUP's first argument is empty, its name is the
/// payload. The header's `len` is not checked: it counts bytes that are
/// split across two buffers.
pub fn decode_ring<'a>(
    in_out: &[u8; URING_IN_OUT_BYTES],
    op_in: &'a [u8; URING_OP_IN_BYTES],
    payload: &'a [u8],
) -> Result<(Header, Op<'a>), Malformed> {
    let h = Args {
        opcode: 0,
        b: in_out,
        payload: &[],
    };
    let header = in_header(&h);
    let a = Args {
        opcode: header.opcode,
        b: op_in,
        payload,
    };
    Ok((header, op(&a)?))
}

fn op<'a>(a: &Args<'a>) -> Result<Op<'a>, Malformed> {
    Ok(match a.opcode {
        INIT => init(a)?,
        LOOKUP => {
            // A NUL-terminated name.
            let name = a.payload.split(|&c| c == 0).next().unwrap_or(&[]);
            Op::Lookup(OsStr::from_bytes(name))
        }
        FORGET | BATCH_FORGET => Op::Forget,
        GETATTR => Op::GetAttr,
        SETATTR => {
            a.need(88)?;
            Op::SetAttr {
                valid: a.u32(0),
                size: a.u64(16),
            }
        }
        OPEN => {
            a.need(8)?;
            Op::Open { flags: a.u32(0) }
        }
        OPENDIR => Op::OpenDir,
        READ | READDIR => {
            a.need(RW_IN_BYTES)?;
            let (offset, size) = (a.u64(8), a.u32(16));
            if a.opcode == READ {
                Op::Read { offset, size }
            } else {
                Op::ReadDir { offset, size }
            }
        }
        WRITE => write(a)?,
        FLUSH => Op::Flush,
        RELEASE | RELEASEDIR => Op::Release,
        FSYNC | FSYNCDIR => Op::Fsync,
        STATFS => Op::Statfs,
        FALLOCATE => {
            a.need(32)?;
            Op::Fallocate {
                offset: a.u64(8),
                length: a.u64(16),
                mode: a.u32(24),
            }
        }
        ACCESS => Op::Access,
        INTERRUPT => Op::Interrupt,
        DESTROY => Op::Destroy,
        _ => Op::Unsupported,
    })
}

fn init<'a>(a: &Args<'a>) -> Result<Op<'a>, Malformed> {
    a.need(16)?;
    let mut flags = a.u32(12) as u64;
    // fuse_init_in grew flags2 (and reserved words) with INIT_EXT.
    if flags & INIT_EXT != 0 && a.b.len() >= 20 {
        flags |= (a.u32(16) as u64) << 32;
    }
    Ok(Op::Init {
        major: a.u32(0),
        minor: a.u32(4),
        max_readahead: a.u32(8),
        flags,
    })
}

fn write<'a>(a: &Args<'a>) -> Result<Op<'a>, Malformed> {
    a.need(RW_IN_BYTES)?;
    let size = a.u32(16);
    let data = a.payload;
    if data.len() != size as usize {
        return Err(Malformed::Payload {
            size,
            have: data.len(),
        });
    }
    Ok(Op::Write {
        offset: a.u64(8),
        data,
        flags: a.u32(32),
    })
}

// FUSE over io_uring (7.42; include/uapi/linux/fuse.h, fs/fuse/dev_uring.c).
//
//  header buffer (iov[0] of a REGISTER), struct fuse_uring_req_header:
//  ┌──────────────────────────────┬──────────────────────┬────────────────────────┐
//  │ in_out 128 B                 │ op_in 128 B          │ ring_ent_in_out 32 B   │
//  │ fetch: fuse_in_header (40)   │ the opcode's first   │ flags u64, commit_id   │
//  │ commit: fuse_out_header (16) │ argument struct      │ u64, payload_sz u32,   │
//  │                              │                      │ padding u32, rsvd u64  │
//  └──────────────────────────────┴──────────────────────┴────────────────────────┘
//  payload buffer (iov[1]): the request's other arguments on fetch (a
//  WRITE's data), the reply body on commit; payload_sz says how much.

pub const URING_IN_OUT_BYTES: usize = 128;
pub const URING_OP_IN_BYTES: usize = 128;
pub const URING_ENT_IN_OUT_BYTES: usize = 32;
/// `enum fuse_uring_cmd`, the SQE's `cmd_op`.
pub const URING_CMD_REGISTER: u32 = 1;
pub const URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// The SQE128 command area that holds `struct fuse_uring_cmd_req`.
pub const URING_CMD_AREA_BYTES: usize = 80;

/// `struct fuse_uring_req_header` (288 bytes): one ring entry's header
/// buffer, shared with the kernel while the entry is registered.
#[repr(C, align(8))]
pub struct RingHeader {
    pub in_out: [u8; URING_IN_OUT_BYTES],
    pub op_in: [u8; URING_OP_IN_BYTES],
    pub ent_in_out: [u8; URING_ENT_IN_OUT_BYTES],
}

impl RingHeader {
    pub const fn zeroed() -> RingHeader {
        RingHeader {
            in_out: [0; URING_IN_OUT_BYTES],
            op_in: [0; URING_OP_IN_BYTES],
            ent_in_out: [0; URING_ENT_IN_OUT_BYTES],
        }
    }

    /// `ring_ent_in_out.commit_id`: what COMMIT_AND_FETCH must name (the
    /// request's `unique`).
    pub fn commit_id(&self) -> u64 {
        u64::from_ne_bytes(self.ent_in_out[8..16].try_into().expect("8 bytes"))
    }

    /// `ring_ent_in_out.payload_sz`: bytes of the payload buffer in use.
    pub fn payload_sz(&self) -> u32 {
        u32::from_ne_bytes(self.ent_in_out[16..20].try_into().expect("4 bytes"))
    }

    /// Writes the reply to the request `unique`: `fuse_out_header` in
    /// `in_out` and `payload_sz` (the body already in the payload buffer;
    /// 0 with an error).
    pub fn set_reply(&mut self, unique: u64, error: i32, payload_sz: usize) {
        let body = if error == 0 { payload_sz } else { 0 };
        self.in_out[..OUT_HEADER_BYTES].copy_from_slice(&out_header(unique, error, body));
        self.ent_in_out[16..20].copy_from_slice(&(body as u32).to_ne_bytes());
    }
}

/// `struct fuse_uring_cmd_req` (flags u64, commit_id u64, qid u16,
/// padding[6]) at the start of the 80-byte command area, the rest zero.
pub fn uring_cmd(commit_id: u64, qid: u16) -> [u8; URING_CMD_AREA_BYTES] {
    let mut c = [0u8; URING_CMD_AREA_BYTES];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

/// Appends native-order integers to a reply.
pub struct Out<'a>(pub &'a mut Vec<u8>);

impl Out<'_> {
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn zeroes(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

/// `fuse_out_header` for a reply of `body_len` bytes after it.
pub fn out_header(unique: u64, error: i32, body_len: usize) -> [u8; OUT_HEADER_BYTES] {
    let mut h = [0u8; OUT_HEADER_BYTES];
    h[0..4].copy_from_slice(&((OUT_HEADER_BYTES + body_len) as u32).to_ne_bytes());
    // The kernel wants the negated errno.
    h[4..8].copy_from_slice(&(-error).to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

/// What the filesystem offers at INIT.
#[derive(Debug, Clone, Copy)]
pub struct InitReply {
    /// INIT flags we want, intersected with what the kernel offered.
    pub flags: u64,
    pub max_readahead: u32,
    pub max_write: u32,
    pub max_pages: u16,
    pub max_background: u16,
}

/// `fuse_init_out` (64 bytes).
pub fn init_out(body: &mut Vec<u8>, r: &InitReply) {
    Out(body)
        .u32(VERSION.0)
        .u32(VERSION.1)
        .u32(r.max_readahead)
        .u32(r.flags as u32)
        .u16(r.max_background)
        .u16(r.max_background * 3 / 4) // congestion_threshold
        .u32(r.max_write)
        .u32(1) // time_gran: nanoseconds
        .u16(r.max_pages)
        .u16(0) // map_alignment
        .u32((r.flags >> 32) as u32)
        .zeroes(28);
}

/// A file's attributes (`fuse_attr`, 88 bytes).
#[derive(Debug, Clone, Copy)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// Seconds since the epoch, for atime, mtime and ctime alike.
    pub time_s: u64,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
}

fn attr(o: &mut Out<'_>, a: &Attr) {
    o.u64(a.ino)
        .u64(a.size)
        .u64(a.size.div_ceil(512))
        .u64(a.time_s)
        .u64(a.time_s)
        .u64(a.time_s)
        .zeroes(12) // nanoseconds
        .u32(a.mode)
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u32(0) // rdev
        .u32(4096) // blksize
        .u32(0); // flags
}

/// `fuse_entry_out` (128 bytes): LOOKUP's reply.
pub fn entry_out(body: &mut Vec<u8>, a: &Attr, valid_s: u64) {
    let mut o = Out(body);
    o.u64(a.ino).u64(0).u64(valid_s).u64(valid_s).zeroes(8);
    attr(&mut o, a);
}

/// `fuse_attr_out` (104 bytes): GETATTR's and SETATTR's reply.
pub fn attr_out(body: &mut Vec<u8>, a: &Attr, valid_s: u64) {
    let mut o = Out(body);
    o.u64(valid_s).zeroes(8);
    attr(&mut o, a);
}

/// `fuse_open_out` (16 bytes).
pub fn open_out(body: &mut Vec<u8>, open_flags: u32) {
    Out(body).u64(0).u32(open_flags).u32(0);
}

/// `fuse_write_out` (8 bytes).
pub fn write_out(body: &mut Vec<u8>, size: u32) {
    Out(body).u32(size).u32(0);
}

/// `fuse_statfs_out` (80 bytes), in 4 KiB blocks.
pub fn statfs_out(body: &mut Vec<u8>, blocks: u64) {
    Out(body)
        .u64(blocks)
        .u64(0)
        .u64(0)
        .u64(2) // files
        .u64(0)
        .u32(4096) // bsize
        .u32(255) // namelen
        .u32(4096) // frsize
        .zeroes(28);
}

/// Appends a `fuse_dirent` if it fits within `max` bytes of `body`;
/// false when it does not (the listing continues at the next READDIR).
pub fn dirent(
    body: &mut Vec<u8>,
    max: usize,
    ino: u64,
    next: u64,
    dtype: u32,
    name: &[u8],
) -> bool {
    let len = (24 + name.len()).next_multiple_of(8);
    if body.len() + len > max {
        return false;
    }
    let start = body.len();
    Out(body)
        .u64(ino)
        .u64(next)
        .u32(name.len() as u32)
        .u32(dtype);
    body.extend_from_slice(name);
    body.resize(start + len, 0);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(opcode: u32, args: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        let len = (IN_HEADER_BYTES + args.len()) as u32;
        Out(&mut b)
            .u32(len)
            .u32(opcode)
            .u64(7)
            .u64(2)
            .u32(1000)
            .u32(1000)
            .u32(42)
            .u32(0);
        b.extend_from_slice(args);
        b
    }

    fn rw_in(offset: u64, size: u32, flags: u32) -> Vec<u8> {
        let mut b = Vec::new();
        Out(&mut b)
            .u64(0)
            .u64(offset)
            .u32(size)
            .u32(0)
            .u64(0)
            .u32(flags)
            .u32(0);
        b
    }

    #[test]
    fn decodes_reads_writes_and_their_header() {
        let buf = request(READ, &rw_in(4096, 512, 0));
        let (h, op) = decode(&buf).unwrap();
        assert_eq!(
            h,
            Header {
                opcode: READ,
                unique: 7,
                nodeid: 2,
                uid: 1000
            }
        );
        assert_eq!(
            op,
            Op::Read {
                offset: 4096,
                size: 512
            }
        );
        let mut args = rw_in(8192, 3, libc::O_DSYNC as u32);
        args.extend_from_slice(b"abc");
        let buf = request(WRITE, &args);
        let (_, op) = decode(&buf).unwrap();
        assert_eq!(
            op,
            Op::Write {
                offset: 8192,
                data: b"abc",
                flags: libc::O_DSYNC as u32
            }
        );
    }

    #[test]
    fn malformed_requests_are_errors_not_panics() {
        assert_eq!(decode(&[0; 10]), Err(Malformed::Short(10)));
        let mut b = request(READ, &rw_in(0, 1, 0));
        b[0] = 200;
        assert!(matches!(decode(&b), Err(Malformed::Length { .. })));
        assert!(matches!(
            decode(&request(READ, &[0; 12])),
            Err(Malformed::Args { opcode: READ, .. })
        ));
        let mut args = rw_in(0, 10, 0);
        args.extend_from_slice(b"abc");
        assert_eq!(
            decode(&request(WRITE, &args)),
            Err(Malformed::Payload { size: 10, have: 3 })
        );
        assert!(matches!(
            decode(&request(FALLOCATE, &[0; 8])),
            Err(Malformed::Args { .. })
        ));
        assert!(matches!(
            decode(&request(INIT, &[0; 4])),
            Err(Malformed::Args { .. })
        ));
        // Every opcode with any short argument block: never a panic.
        for opcode in 0..64 {
            for n in 0..48 {
                let _ = decode(&request(opcode, &vec![0xff; n]));
            }
        }
    }

    #[test]
    fn init_reads_flags2_only_with_init_ext() {
        let mut args = Vec::new();
        Out(&mut args)
            .u32(7)
            .u32(41)
            .u32(1 << 17)
            .u32((INIT_EXT | ASYNC_DIO) as u32)
            .u32(1 << 9)
            .zeroes(44);
        let buf = request(INIT, &args);
        let (_, op) = decode(&buf).unwrap();
        assert_eq!(
            op,
            Op::Init {
                major: 7,
                minor: 41,
                max_readahead: 1 << 17,
                flags: INIT_EXT | ASYNC_DIO | (1 << 41)
            }
        );
    }

    #[test]
    fn ring_layouts_match_linux_fuse_h() {
        use std::mem::{align_of, offset_of, size_of};
        // struct fuse_uring_req_header: 128 + 128 + 32.
        assert_eq!(size_of::<RingHeader>(), 288);
        assert_eq!(align_of::<RingHeader>(), 8);
        assert_eq!(offset_of!(RingHeader, op_in), 128);
        assert_eq!(offset_of!(RingHeader, ent_in_out), 256);
        let mut h = RingHeader::zeroed();
        // fuse_uring_ent_in_out: flags @0, commit_id @8, payload_sz @16.
        h.ent_in_out[8..16].copy_from_slice(&77u64.to_ne_bytes());
        h.ent_in_out[16..20].copy_from_slice(&4096u32.to_ne_bytes());
        assert_eq!((h.commit_id(), h.payload_sz()), (77, 4096));
        h.set_reply(77, 0, 8);
        assert_eq!(&h.in_out[..16], &out_header(77, 0, 8));
        assert_eq!(h.payload_sz(), 8);
        // An error carries no payload.
        h.set_reply(77, libc::EIO, 8);
        assert_eq!(h.payload_sz(), 0);
        assert_eq!(&h.in_out[4..8], &(-libc::EIO).to_ne_bytes());
        // struct fuse_uring_cmd_req: flags @0, commit_id @8, qid @16.
        let c = uring_cmd(0x0102_0304_0506_0708, 3);
        assert_eq!(&c[..8], &[0; 8]);
        assert_eq!(&c[8..16], &0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(&c[16..18], &3u16.to_ne_bytes());
        assert!(c[18..].iter().all(|&b| b == 0));
    }

    /// A ring entry as the kernel fills it: header, first argument, payload.
    fn ring_request(opcode: u32, op_in: &[u8]) -> RingHeader {
        let mut h = RingHeader::zeroed();
        let req = request(opcode, &[]);
        h.in_out[..IN_HEADER_BYTES].copy_from_slice(&req);
        h.op_in[..op_in.len()].copy_from_slice(op_in);
        h
    }

    #[test]
    fn decodes_ring_entries() {
        let h = ring_request(READ, &rw_in(4096, 512, 0));
        let (hd, op) = decode_ring(&h.in_out, &h.op_in, &[]).unwrap();
        assert_eq!(
            (hd.opcode, hd.unique, hd.nodeid, hd.uid),
            (READ, 7, 2, 1000)
        );
        assert_eq!(
            op,
            Op::Read {
                offset: 4096,
                size: 512
            }
        );
        // WRITE: fuse_write_in in op_in, the data in the payload.
        let h = ring_request(WRITE, &rw_in(8192, 3, 0));
        let (_, op) = decode_ring(&h.in_out, &h.op_in, b"abc").unwrap();
        assert_eq!(
            op,
            Op::Write {
                offset: 8192,
                data: b"abc",
                flags: 0
            }
        );
        assert_eq!(
            decode_ring(&h.in_out, &h.op_in, b"ab"),
            Err(Malformed::Payload { size: 3, have: 2 })
        );
        // LOOKUP: an empty first argument, the name in the payload.
        let h = ring_request(LOOKUP, &[]);
        let (_, op) = decode_ring(&h.in_out, &h.op_in, b"ram0\0").unwrap();
        assert_eq!(op, Op::Lookup(OsStr::new("ram0")));
        // Garbage in every byte: never a panic.
        for opcode in 0..64 {
            let mut h = ring_request(opcode, &[0xff; 128]);
            h.in_out[..4].copy_from_slice(&u32::MAX.to_ne_bytes());
            let _ = decode_ring(&h.in_out, &h.op_in, &[0xff; 7]);
        }
    }

    #[test]
    fn replies_have_the_kernel_sizes() {
        let a = Attr {
            ino: 2,
            size: 1 << 20,
            time_s: 1,
            mode: libc::S_IFREG | 0o600,
            nlink: 1,
            uid: 0,
            gid: 0,
        };
        let mut b = Vec::new();
        entry_out(&mut b, &a, 1);
        assert_eq!(b.len(), 128);
        b.clear();
        attr_out(&mut b, &a, 1);
        assert_eq!(b.len(), 104);
        b.clear();
        init_out(
            &mut b,
            &InitReply {
                flags: ASYNC_DIO | (1 << 41),
                max_readahead: 0,
                max_write: 1 << 20,
                max_pages: 256,
                max_background: 64,
            },
        );
        assert_eq!(b.len(), 64);
        // fuse_init_out.flags2 is at 32 (after map_alignment at 30).
        assert_eq!(&b[32..36], &(1u32 << 9).to_ne_bytes(), "flags2");
        b.clear();
        statfs_out(&mut b, 5);
        assert_eq!(b.len(), 80);
        let h = out_header(9, libc::ENOENT, 0);
        assert_eq!(&h[4..8], &(-libc::ENOENT).to_ne_bytes());
        b.clear();
        assert!(dirent(&mut b, 64, 1, 1, 4, b"."));
        assert_eq!(b.len(), 32);
        assert!(!dirent(&mut b, 64, 2, 2, 8, b"a-long-drive-name"));
    }
}
