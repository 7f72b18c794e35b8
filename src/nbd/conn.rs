//! The transmission phase of one connection.
//!
//! The loop is built to minimise syscalls and wake-ups per request:
//!
//! ```text
//!   read() as much as the socket holds ──► inbuf [start .. end)
//!        ▲                                    │ parse every complete request
//!        │                                    ▼ validate, run inline on the RAM store
//!   write() every reply in one call  ◄── out (replies appended, READ data
//!                                            copied straight from the store)
//! ```
//!
//! With a queue depth of 64, one `read` typically carries dozens of requests
//! and one `write` returns all their replies. Replies may be sent in any
//! order by the protocol; we send them in request order.
//!
//! Large WRITEs whose payload has not fully arrived (64 KiB and more on a
//! RAM drive, 2 MiB and more on other backends) are streamed: each piece of
//! up to 512 KiB is received into a bounce buffer that stays in L2, then
//! written to the store. No store lock is ever held while waiting for a
//! client, so a client that stalls mid-payload delays nobody else.
//!
//! # Invariants
//!
//! - **A reply to a WRITE is sent only after its whole payload was read.**
//!   A WRITE refused before it runs (oversized, read-only, bad flags, past
//!   the end) or part-way (ENOSPC from a full memory limit) has the rest of
//!   its payload drained first; then the error reply goes out and the
//!   connection goes on. The spec allows an early reply, but libnbd cannot
//!   take one (it drops the connection), and nbdkit and nbd-server drain
//!   first too.
//! - **What a client can make a connection hold is bounded**, whatever it
//!   sends: the input buffer holds at most one gathered WRITE (under 64 KiB
//!   on RAM drives, under 2 MiB elsewhere; refused payloads are drained, not
//!   gathered) and shrinks back to 512 KiB when idle; replies are written out
//!   once 1 MiB is pending and the output buffer is trimmed back after each
//!   write; READs over 1 MiB from backends that do not work in place go out a
//!   piece at a time; the bounce buffer is 512 KiB. About 3.5 MiB per
//!   connection at most, 1.5 MiB typical (mostly untouched address space).
//!   [`buffer_bytes`] reports the sum over all connections.

use std::io::{self, IoSlice, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use super::handshake::Negotiated;
use super::proto::*;
use super::transport::Transport;
use super::wait::Wait;
use crate::block;
use crate::block::backend::{Backend, Caps};
use crate::block::Export;
use crate::metrics::{ConnRecorder, Op};

/// Input buffer size while idle.
const IN_DEFAULT_BYTES: usize = 512 * 1024;
/// Above this, an empty input buffer is shrunk back to the default.
const IN_SHRINK_BYTES: usize = 1 << 20;
/// Replies are written once this many bytes are pending.
const OUT_FLUSH_BYTES: usize = 1 << 20;
/// The output buffer's capacity is trimmed back to this after a send.
const OUT_KEEP_BYTES: usize = OUT_FLUSH_BYTES + 64 * 1024;
/// READs longer than this on backends that do not work in place are read
/// and sent a piece at a time (`Conn::piecewise_read`).
const READ_PIECE_BYTES: usize = 1 << 20;
/// WRITEs at least this long whose payload has not fully arrived are streamed
/// through the bounce buffer instead of being gathered whole in `inbuf`
/// (backends that do not keep their data in RAM; see
/// `Conn::streamed_write_min_bytes`). Gathering a 1 MiB write in `inbuf`
/// reads it in larger pieces; streaming bounds a connection's buffer.
const STREAMED_WRITE_MIN_BYTES: usize = 2 << 20;
/// The bounce buffer a streamed WRITE is received into, piece by piece: big
/// enough that each `recv` takes all the socket holds, small enough to stay
/// in L2, so the kernel copies into hot cache lines and the store then
/// streams them into the drive (`store::ntcopy`). Measured on 1 MiB
/// sequential writes (`bench/seqwrite.sh`): 64 KiB 2.4-2.5 GiB/s, 256 KiB
/// 3.2-3.8, 512 KiB 3.9, 1 MiB 3.6; receiving straight into the drive's
/// (cold) memory instead made 1.9-2.6.
const BOUNCE_BYTES: usize = 512 * 1024;
/// READs at least this long go through the zero-copy path when the backend
/// works in place (`Backend::direct_io`): the data is sent straight from the
/// drive. Below this, gathering many requests per syscall wins. WRITEs this
/// long are streamed through the bounce buffer instead of gathered.
const DIRECT_MIN_BYTES: usize = 64 * 1024;

/// Bytes that every connection's buffers hold together (input, output and
/// bounce buffers, by capacity): what clients make the daemon keep beside
/// the drives. Reported in /metrics.
static BUFFER_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes all connections' buffers hold now.
pub fn buffer_bytes() -> u64 {
    BUFFER_BYTES.load(Ordering::Relaxed)
}

/// One connection's share of `BUFFER_BYTES`, given back when it ends.
#[derive(Default)]
struct HeldBuffers(usize);

impl HeldBuffers {
    fn account(&mut self, now: usize) {
        if now > self.0 {
            BUFFER_BYTES.fetch_add((now - self.0) as u64, Ordering::Relaxed);
        } else if now < self.0 {
            BUFFER_BYTES.fetch_sub((self.0 - now) as u64, Ordering::Relaxed);
        }
        self.0 = now;
    }
}

impl Drop for HeldBuffers {
    fn drop(&mut self) {
        self.account(0);
    }
}

/// What to do after a request.
#[derive(PartialEq, Eq)]
enum Next {
    Continue,
    Disconnect,
}

/// A refused request: errno plus a message for structured replies.
struct Refusal {
    errno: u32,
    message: String,
}

fn refuse(errno: u32, message: impl Into<String>) -> Refusal {
    Refusal {
        errno,
        message: message.into(),
    }
}

/// Serves requests until the client disconnects, the stream fails, or the
/// client breaks the protocol (returned as an error).
pub(super) fn transmission<S: Transport, W: Wait>(
    stream: &mut S,
    neg: &Negotiated,
    mut wait: W,
) -> io::Result<()> {
    let mut conn = Conn {
        export: &neg.export,
        backend: &*neg.export.backend,
        caps: neg.export.backend.capabilities(),
        structured: neg.structured,
        base_allocation: neg.base_allocation,
        read_only: neg.read_only,
        out: Vec::with_capacity(OUT_KEEP_BYTES),
        bounce: Vec::new(),
        rec: neg.export.metrics.as_ref().map(|m| m.connection()),
        sent_bytes: 0,
    };
    let mut input = Input::new();
    let mut held = HeldBuffers::default();
    loop {
        held.account(input.buf.capacity() + conn.out.capacity() + conn.bounce.capacity());
        // `batch`: requests run since the last read, the client's depth.
        let (next, batch) = conn.run_buffered(&mut input, stream)?;
        if !conn.out.is_empty() {
            conn.send(stream)?;
        }
        if next == Next::Disconnect {
            return Ok(());
        }
        input.tidy();
        let sent = std::mem::take(&mut conn.sent_bytes);
        let n = match wait.read(stream, &mut input.buf[input.end..], batch, sent) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if let Some(r) = conn.rec.as_mut() {
            r.batch_started();
        }
        input.end += n;
    }
}

/// A connection's input: bytes read, of which `[start, end)` are not parsed
/// yet, and what is left of a refused WRITE's payload.
struct Input {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Payload bytes of a refused WRITE still to be skipped, and its
    /// refusal: sent only once the whole payload is read, because libnbd
    /// (and other clients) cannot take a reply while they are still sending.
    discard: u64,
    pending: Option<(Request, Refusal)>,
}

impl Input {
    fn new() -> Self {
        Input {
            buf: vec![0u8; IN_DEFAULT_BYTES],
            start: 0,
            end: 0,
            discard: 0,
            pending: None,
        }
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Skips what is buffered of a refused payload; true once none is left.
    fn drain(&mut self) -> bool {
        let n = self.discard.min(self.buffered() as u64);
        self.start += n as usize;
        self.discard -= n;
        self.discard == 0
    }

    /// Skips a refused WRITE's header; its payload is drained as it comes
    /// and `refusal` sent after it.
    fn refuse(&mut self, req: Request, refusal: Refusal) {
        self.start += REQUEST_HEADER_BYTES;
        self.discard = req.len as u64;
        self.pending = Some((req, refusal));
    }

    /// Makes room for a whole request of `total` bytes from `start`.
    fn make_room(&mut self, total: usize) {
        if self.buf.len() - self.start < total {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.buffered());
            if self.buf.len() < total {
                self.buf.resize(total, 0);
            }
        }
    }

    /// After a batch: starts over when all was parsed (shrinking a grown
    /// buffer back), else moves the rest to the front when space runs low.
    fn tidy(&mut self) {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
            if self.buf.len() > IN_SHRINK_BYTES {
                self.buf.truncate(IN_DEFAULT_BYTES);
                self.buf.shrink_to_fit();
            }
        } else if self.buf.len() - self.end < REQUEST_HEADER_BYTES.max(self.buf.len() / 4) {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.buffered());
        }
    }
}

/// What became of the next buffered request.
enum Step {
    /// It ran (or was answered with an error).
    Ran(Next),
    /// It was refused before its payload arrived; the payload is drained.
    Refused,
    /// Its payload has not all arrived: read more first.
    Incomplete,
}

/// The frontend-neutral command of an NBD command (None: unknown).
#[inline]
fn block_command(command: u16) -> Option<block::Command> {
    use block::Command as C;
    Some(match command {
        CMD_READ => C::Read,
        CMD_WRITE => C::Write,
        CMD_FLUSH => C::Flush,
        CMD_TRIM => C::Trim,
        CMD_WRITE_ZEROES => C::WriteZeroes,
        CMD_CACHE => C::Cache,
        CMD_BLOCK_STATUS => C::BlockStatus,
        CMD_DISC => C::Disconnect,
        _ => return None,
    })
}

struct Conn<'a> {
    export: &'a Export,
    backend: &'a dyn Backend,
    /// The backend's capabilities, read once: whether it works in place
    /// and the pieces large writes are split into.
    caps: Caps,
    structured: bool,
    base_allocation: bool,
    /// The access rules gave this client a read-only grant: writes get
    /// EPERM even when the export itself is read-write.
    read_only: bool,
    /// Replies not yet written.
    out: Vec<u8>,
    /// One piece of a streamed WRITE, received before any lock is taken.
    bounce: Vec<u8>,
    /// Counts requests and times batches; None when metrics are off.
    rec: Option<ConnRecorder>,
    /// Reply bytes written since the poller last looked (it bounds the
    /// client's backlog with them).
    sent_bytes: usize,
}

/// The metrics kind of a command (None for DISC and unknown commands).
#[inline]
fn op_of(command: u16) -> Option<Op> {
    Some(match command {
        CMD_READ => Op::Read,
        CMD_WRITE => Op::Write,
        CMD_FLUSH => Op::Flush,
        CMD_TRIM => Op::Trim,
        CMD_WRITE_ZEROES => Op::WriteZeroes,
        CMD_CACHE => Op::Cache,
        CMD_BLOCK_STATUS => Op::BlockStatus,
        _ => return None,
    })
}

impl Conn<'_> {
    /// Runs every complete request in `input`, in order; returns what the
    /// last one asked for and how many ran.
    fn run_buffered<S: Transport>(
        &mut self,
        input: &mut Input,
        stream: &mut S,
    ) -> io::Result<(Next, usize)> {
        let mut batch = 0usize;
        loop {
            if !input.drain() {
                return Ok((Next::Continue, batch));
            }
            if let Some((req, r)) = input.pending.take() {
                self.reply_error(&req, &r);
            }
            let req = match parse_request(&input.buf[input.start..input.end]) {
                Ok(Parse::Done(req, _)) => req,
                Ok(Parse::Incomplete) => return Ok((Next::Continue, batch)),
                Err(e) => {
                    self.send(stream)?;
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            };
            match self.dispatch(&req, input, stream)? {
                Step::Ran(next) => {
                    batch += 1;
                    if next == Next::Disconnect {
                        return Ok((next, batch));
                    }
                }
                Step::Refused => {}
                Step::Incomplete => return Ok((Next::Continue, batch)),
            }
        }
    }

    /// Runs `req`, whose header starts `input`'s unparsed bytes, by the
    /// path that fits it: refused before its payload, a large READ sent
    /// apart from the batch, a large WRITE streamed as it arrives, or
    /// (the common case) inline from the buffer once it is all there.
    fn dispatch<S: Transport>(
        &mut self,
        req: &Request,
        input: &mut Input,
        stream: &mut S,
    ) -> io::Result<Step> {
        let total = REQUEST_HEADER_BYTES + req.payload_len();
        let unread = input.buffered() < total;
        if let Some(r) = self.refuse_unread_write(req, unread) {
            // Drained through the input buffer, never gathered whole.
            input.refuse(*req, r);
            return Ok(Step::Refused);
        }
        if req.command == CMD_READ && self.reads_apart(req) {
            self.send(stream)?;
            if self.caps.direct_io {
                self.direct_read(req, stream)?;
            } else {
                self.piecewise_read(req, stream)?;
            }
            input.start += total;
            return Ok(Step::Ran(Next::Continue));
        }
        if unread && self.streams(req) {
            // A large WRITE whose payload is still arriving: stream it
            // into the store piece by piece instead of gathering it.
            self.send(stream)?;
            let buffered = &input.buf[input.start + REQUEST_HEADER_BYTES..input.end];
            if let Some((left, r)) = self.streamed_write(req, buffered, stream)? {
                if left == 0 {
                    self.reply_error(req, &r);
                } else {
                    input.discard = left;
                    input.pending = Some((*req, r));
                }
            }
            (input.start, input.end) = (0, 0);
            return Ok(Step::Ran(Next::Continue));
        }
        if unread {
            input.make_room(total);
            return Ok(Step::Incomplete);
        }
        let payload = &input.buf[input.start + REQUEST_HEADER_BYTES..input.start + total];
        let next = self.handle(req, payload);
        input.start += total;
        if self.out.len() >= OUT_FLUSH_BYTES {
            self.send(stream)?;
        }
        Ok(Step::Ran(next))
    }

    /// A valid READ sent on its own, outside the batch: zero-copy from a
    /// drive that works in place (64 KiB and more), or a piece at a time
    /// from one that does not (over 1 MiB).
    fn reads_apart(&self, req: &Request) -> bool {
        let len = req.len as usize;
        let apart = if self.caps.direct_io {
            len >= DIRECT_MIN_BYTES
        } else {
            len > READ_PIECE_BYTES
        };
        apart && self.validate(req).is_ok()
    }

    /// A valid WRITE long enough to be streamed as it arrives.
    fn streams(&self, req: &Request) -> bool {
        req.command == CMD_WRITE
            && req.len as usize >= self.streamed_write_min_bytes()
            && self.validate(req).is_ok()
    }

    /// Writes every pending reply and clears the buffer; their requests'
    /// latency is recorded once the bytes are out.
    #[inline]
    fn send<S: Write>(&mut self, stream: &mut S) -> io::Result<()> {
        stream.write_all(&self.out)?;
        self.sent_bytes += self.out.len();
        self.out.clear();
        if self.out.capacity() > OUT_KEEP_BYTES {
            self.out.shrink_to(OUT_KEEP_BYTES);
        }
        if let Some(r) = self.rec.as_mut() {
            r.replies_sent();
        }
        Ok(())
    }

    /// Counts a successful request.
    #[inline]
    fn count_done(&mut self, req: &Request) {
        if let Some(r) = self.rec.as_mut() {
            if let Some(op) = op_of(req.command) {
                let bytes = if req.command == CMD_FLUSH || req.command == CMD_BLOCK_STATUS {
                    0
                } else {
                    req.len as u64
                };
                r.done(op, bytes);
            }
        }
    }

    /// Checks a request before any backend sees it: command, flags, access,
    /// size and range. The one place requests are validated.
    fn validate(&self, req: &Request) -> Result<(), Refusal> {
        // FUA is valid on every command (the spec: a server that offers
        // SEND_FUA must accept it everywhere); it only matters for writes.
        let allowed = CMD_FLAG_FUA
            | match req.command {
                CMD_READ => CMD_FLAG_DF,
                CMD_WRITE | CMD_TRIM => 0,
                CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
                CMD_FLUSH | CMD_CACHE | CMD_DISC => 0,
                other => return Err(refuse(EINVAL, format!("unknown command {other}"))),
            };
        if req.flags & !allowed != 0 {
            return Err(refuse(
                EINVAL,
                format!(
                    "flags 0x{:x} are not valid for {}",
                    req.flags & !allowed,
                    command_name(req.command)
                ),
            ));
        }
        if req.flags & CMD_FLAG_DF != 0 && !self.structured {
            return Err(refuse(EINVAL, "DF needs structured replies"));
        }
        if req.command == CMD_BLOCK_STATUS && !self.base_allocation {
            return Err(refuse(
                EINVAL,
                "block status needs base:allocation negotiated",
            ));
        }
        let Some(command) = block_command(req.command) else {
            return Err(refuse(EINVAL, format!("unknown command {}", req.command)));
        };
        let limits = block::Limits {
            size: self.backend.size(),
            read_only: self.read_only || self.export.is_read_only(),
            max_len: MAX_PAYLOAD_BYTES as u64,
        };
        let request = block::Request {
            command,
            offset: req.offset,
            len: req.len as u64,
        };
        match block::validate(request, &limits) {
            Ok(_) => Ok(()),
            Err(block::Refusal::ReadOnly) => Err(refuse(
                EPERM,
                format!("drive '{}' is read-only", self.export.name),
            )),
            Err(r) => Err(refuse(r.errno().nbd(), r.to_string())),
        }
    }

    /// Validates and runs one request, appending its reply.
    #[inline]
    fn handle(&mut self, req: &Request, payload: &[u8]) -> Next {
        if let Err(r) = self.validate(req) {
            self.reply_error(req, &r);
            return Next::Continue;
        }
        let result = match req.command {
            CMD_READ => return self.read(req),
            CMD_WRITE => self
                .backend
                .write(req.offset, payload, req.flags & CMD_FLAG_FUA != 0),
            CMD_FLUSH => self.backend.flush(),
            CMD_TRIM => self
                .backend
                .trim(req.offset, req.len as u64)
                .and_then(|_| self.flush_if_fua(req)),
            CMD_WRITE_ZEROES => {
                let may_trim = req.flags & CMD_FLAG_NO_HOLE == 0;
                self.backend
                    .write_zeroes(req.offset, req.len as u64, may_trim)
                    .and_then(|_| self.flush_if_fua(req))
            }
            CMD_CACHE => self.backend.cache(req.offset, req.len as u64),
            CMD_BLOCK_STATUS => return self.block_status(req),
            CMD_DISC => return Next::Disconnect,
            _ => unreachable!("validate() refuses unknown commands"),
        };
        match result {
            Ok(()) => {
                encode_simple_reply(&mut self.out, req.cookie, 0);
                self.count_done(req);
            }
            Err(e) => self.reply_backend_error(req, &e),
        }
        Next::Continue
    }

    /// The refusal of a WRITE that is not run: oversized, or (when its
    /// payload has not all arrived) invalid. Its payload is then drained
    /// through the input buffer instead of being gathered there whole, so
    /// a header alone cannot make the connection hold 32 MiB.
    fn refuse_unread_write(&self, req: &Request, unread: bool) -> Option<Refusal> {
        // An oversized WRITE never fits the buffer: `validate` refuses it
        // (block::Refusal::TooLong) like any other invalid one.
        if req.command == CMD_WRITE && (unread || req.len > MAX_PAYLOAD_BYTES) {
            return self.validate(req).err();
        }
        None
    }

    /// WRITEs at least this long whose payload is still arriving are
    /// streamed (`streamed_write`) instead of gathered in the input buffer.
    fn streamed_write_min_bytes(&self) -> usize {
        if self.caps.direct_io {
            DIRECT_MIN_BYTES
        } else {
            STREAMED_WRITE_MIN_BYTES
        }
    }

    /// Runs a validated WRITE whose payload starts with `buffered` and
    /// continues on `stream`. Each round receives what the socket holds
    /// (up to `BOUNCE_BYTES`) into the bounce buffer and writes it at once,
    /// so the store's copy of one piece overlaps the client sending the
    /// next. No store lock is ever held while waiting on the client: a
    /// stalled client cannot block other connections.
    ///
    /// On a RAM drive pieces are whatever arrived. Other backends get
    /// pieces that end on `PIECE_BYTES` boundaries (a cache then never
    /// writes part of a block it could have written whole); the unaligned
    /// tail of a round waits at the front of the bounce buffer.
    ///
    /// When the backend refuses part-way (a full memory limit), returns the
    /// refusal and how many payload bytes remain unread on the stream: the
    /// caller drains them before it replies. A stream error, or the client
    /// hanging up mid-payload, ends the connection.
    fn streamed_write<S: Transport>(
        &mut self,
        req: &Request,
        buffered: &[u8],
        stream: &mut S,
    ) -> io::Result<Option<(u64, Refusal)>> {
        let len = req.len as usize;
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let align = if self.caps.direct_io {
            1
        } else {
            self.caps.piece_bytes.max(1) as usize
        };
        if self.bounce.len() < BOUNCE_BYTES {
            self.bounce.resize(BOUNCE_BYTES, 0);
        }
        // Payload [0, done) is written; [done, done + held) sits in bounce.
        let (mut done, mut held) = (0usize, 0usize);
        while done < len {
            let offset = req.offset + done as u64;
            // The longest prefix of `avail` bytes that ends on an aligned
            // offset or at the end of the payload.
            let piece_len = |avail: usize| {
                if avail == len - done {
                    avail
                } else {
                    let end = (offset + avail as u64) / align as u64 * align as u64;
                    end.saturating_sub(offset) as usize
                }
            };
            let from_buffered = held == 0 && done < buffered.len();
            let n = if from_buffered {
                let n = piece_len(buffered.len() - done);
                if n == 0 {
                    // Less than one aligned piece left: carry it over.
                    held = buffered.len() - done;
                    self.bounce[..held].copy_from_slice(&buffered[done..]);
                    continue;
                }
                n
            } else {
                let want = (BOUNCE_BYTES - held).min(len - done - held);
                match stream.read_now(&mut self.bounce[held..held + want])? {
                    Some(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "client hung up in the middle of a WRITE payload",
                        ))
                    }
                    Some(got) => held += got,
                    None => {
                        stream.wait_readable()?;
                        continue;
                    }
                }
                let n = piece_len(held);
                if n == 0 {
                    continue;
                }
                n
            };
            let piece = if from_buffered {
                &buffered[done..done + n]
            } else {
                &self.bounce[..n]
            };
            // FUA on the last piece covers the earlier ones too.
            if let Err(e) = self.backend.write(offset, piece, fua && done + n == len) {
                let unread = len - (done + held).max(buffered.len());
                return Ok(Some((unread as u64, refuse(errno_for(&e), e.to_string()))));
            }
            done += n;
            if !from_buffered {
                self.bounce.copy_within(n..held, 0);
                held -= n;
            }
        }
        encode_simple_reply(&mut self.out, req.cookie, 0);
        self.count_done(req);
        Ok(None)
    }

    /// Runs a validated READ by sending its data straight from the backend
    /// (`Backend::read_with`) behind the reply header: one copy, drive to
    /// socket. `out` must be empty (earlier replies written). Data is only
    /// handed to the socket while it has room, under the backend's locks;
    /// waiting for room happens with no lock held. A backend error before
    /// any data left becomes an error reply; after (only a shrink racing
    /// with the read can cause one), the reply cannot be taken back, so the
    /// connection ends.
    fn direct_read<S: Transport>(&mut self, req: &Request, stream: &mut S) -> io::Result<()> {
        debug_assert!(self.out.is_empty());
        let len = req.len as usize;
        let (mut done, mut header_sent) = (0usize, 0usize);
        self.encode_read_header(req);
        while done < len {
            let mut stream_error = None;
            let header = &self.out[header_sent..];
            let result =
                self.backend
                    .read_with(req.offset + done as u64, len - done, &mut |slices| {
                        // The header's unsent rest goes first, in the same call.
                        let mut iov = Vec::with_capacity(slices.len() + 1);
                        if !header.is_empty() {
                            iov.push(IoSlice::new(header));
                        }
                        iov.extend_from_slice(slices);
                        let n = stream.send_now(&iov).inspect_err(|e| {
                            stream_error = Some(io::Error::new(e.kind(), e.to_string()))
                        })?;
                        let from_header = n.min(header.len());
                        header_sent += from_header;
                        Ok(n - from_header)
                    });
            if let Some(e) = stream_error {
                return Err(e);
            }
            match result {
                Ok(0) => stream.wait_writable()?,
                Ok(n) => done += n,
                Err(e) if header_sent == 0 => {
                    self.out.clear();
                    self.reply_backend_error(req, &e);
                    return Ok(());
                }
                Err(e) => {
                    if let Some(r) = self.rec.as_mut() {
                        r.failed(Some(Op::Read), errno_for(&e));
                    }
                    return Err(io::Error::other(format!(
                        "{} at offset {} failed after its reply started: {e}",
                        command_name(req.command),
                        req.offset
                    )));
                }
            }
        }
        // The header goes first in every gather, so all of it went out.
        debug_assert_eq!(header_sent, self.out.len());
        self.sent_bytes += header_sent + done;
        self.out.clear();
        self.count_done(req);
        if let Some(r) = self.rec.as_mut() {
            r.replies_sent();
        }
        Ok(())
    }

    /// Runs a validated READ longer than `READ_PIECE_BYTES` on a backend
    /// that does not work in place (a cache): the data is read and sent a
    /// piece at a time, so the connection never holds more than one piece.
    /// `out` must be empty. An error before anything was sent becomes an
    /// error reply; after, the reply cannot be taken back and the
    /// connection ends, as in `direct_read`.
    fn piecewise_read<S: Write>(&mut self, req: &Request, stream: &mut S) -> io::Result<()> {
        debug_assert!(self.out.is_empty());
        let len = req.len as usize;
        self.encode_read_header(req);
        let mut done = 0usize;
        while done < len {
            let n = READ_PIECE_BYTES.min(len - done);
            let at = self.out.len();
            self.out.resize(at + n, 0);
            if let Err(e) = self
                .backend
                .read(req.offset + done as u64, &mut self.out[at..])
            {
                if done == 0 {
                    self.out.clear();
                    self.reply_backend_error(req, &e);
                    return Ok(());
                }
                if let Some(r) = self.rec.as_mut() {
                    r.failed(Some(Op::Read), errno_for(&e));
                }
                return Err(io::Error::other(format!(
                    "READ at offset {} failed after its reply started: {e}",
                    req.offset
                )));
            }
            stream.write_all(&self.out)?;
            self.sent_bytes += self.out.len();
            self.out.clear();
            done += n;
        }
        self.count_done(req);
        if let Some(r) = self.rec.as_mut() {
            r.replies_sent();
        }
        Ok(())
    }

    /// The header of a successful READ reply of `req.len` (> 0) bytes: one
    /// OFFSET_DATA chunk (never fragmented, so DF always holds) or a simple
    /// reply. The data follows.
    fn encode_read_header(&mut self, req: &Request) {
        if self.structured {
            let chunk_len = 8 + req.len;
            encode_chunk_header(
                &mut self.out,
                REPLY_FLAG_DONE,
                REPLY_TYPE_OFFSET_DATA,
                req.cookie,
                chunk_len,
            );
            self.out.extend_from_slice(&req.offset.to_be_bytes());
        } else {
            encode_simple_reply(&mut self.out, req.cookie, 0);
        }
    }

    fn flush_if_fua(&self, req: &Request) -> crate::block::backend::Result<()> {
        if req.flags & CMD_FLAG_FUA != 0 {
            self.backend.flush()
        } else {
            Ok(())
        }
    }

    /// READ: the reply header goes into `out`, then the data is copied from
    /// the store straight behind it (one copy, no intermediate buffer).
    fn read(&mut self, req: &Request) -> Next {
        let mark = self.out.len();
        let len = req.len as usize;
        if self.structured && len == 0 {
            encode_structured_done(&mut self.out, req.cookie);
            self.count_done(req);
            return Next::Continue;
        }
        self.encode_read_header(req);
        let data_at = self.out.len();
        // Zero-filled first: handing the backend uninitialised bytes as a
        // slice is undefined behaviour; the fill costs ~1% of a 4 KiB read.
        self.out.resize(data_at + len, 0);
        let result = self.backend.read(req.offset, &mut self.out[data_at..]);
        match result {
            Ok(()) => self.count_done(req),
            Err(e) => {
                self.out.truncate(mark);
                self.reply_backend_error(req, &e);
            }
        }
        Next::Continue
    }

    fn block_status(&mut self, req: &Request) -> Next {
        match self.backend.extents(req.offset, req.len as u64) {
            Ok(ext) if !ext.is_empty() => {
                let one = req.flags & CMD_FLAG_REQ_ONE != 0;
                let id = META_BASE_ALLOCATION_ID;
                encode_block_status(&mut self.out, req.cookie, id, &ext, req.len as u64, one);
                self.count_done(req);
            }
            Ok(_) => self.reply_error(req, &refuse(EIO, "no extents returned")),
            Err(e) => self.reply_backend_error(req, &e),
        }
        Next::Continue
    }

    fn reply_backend_error(&mut self, req: &Request, e: &crate::block::backend::Error) {
        let r = refuse(errno_for(e), e.to_string());
        self.reply_error(req, &r);
    }

    fn reply_error(&mut self, req: &Request, r: &Refusal) {
        if let Some(rec) = self.rec.as_mut() {
            rec.failed(op_of(req.command), r.errno);
        }
        tracing::debug!(
            export = %self.export.name,
            command = command_name(req.command),
            offset = req.offset,
            len = req.len,
            errno = r.errno,
            "{}",
            r.message
        );
        if self.structured {
            encode_structured_error(&mut self.out, req.cookie, r.errno, &r.message);
        } else {
            encode_simple_reply(&mut self.out, req.cookie, r.errno);
        }
    }
}

#[cfg(test)]
mod streamed_write_tests {
    use std::cell::Cell;
    use std::collections::VecDeque;
    use std::io::Read;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::block::backend::Result;
    use crate::store::{MemoryBudget, RamStore};

    /// A RAM drive that records each write's (offset, len, fua) and says
    /// whether it works in place.
    struct Recording {
        store: RamStore,
        direct: bool,
        writes: Mutex<Vec<(u64, usize, bool)>>,
    }

    impl crate::block::Layer for Recording {
        fn inner(&self) -> &dyn Backend {
            &self.store
        }
        fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
            self.writes.lock().unwrap().push((offset, data.len(), fua));
            self.store.write(offset, data, fua)
        }
        fn capabilities(&self) -> Caps {
            Caps {
                direct_io: self.direct,
                ..self.store.capabilities()
            }
        }
    }

    /// A client whose bytes arrive in bursts: a read takes at most what is
    /// left of the current burst; once it is used up, non-blocking reads
    /// find nothing until the server waits, and the next burst arrives.
    struct Bursts {
        bursts: VecDeque<Vec<u8>>,
        arrived: Cell<bool>,
        replies: Vec<u8>,
    }

    impl Bursts {
        fn new(wire: &[u8], burst_lens: &[usize]) -> Self {
            let mut bursts = VecDeque::new();
            let mut at = 0;
            for &n in burst_lens.iter().cycle() {
                if at == wire.len() {
                    break;
                }
                let n = n.min(wire.len() - at);
                bursts.push_back(wire[at..at + n].to_vec());
                at += n;
            }
            Bursts {
                bursts,
                arrived: Cell::new(true),
                replies: Vec::new(),
            }
        }

        fn take(&mut self, buf: &mut [u8]) -> usize {
            let Some(b) = self.bursts.front_mut() else {
                return 0;
            };
            let n = b.len().min(buf.len());
            buf[..n].copy_from_slice(&b[..n]);
            b.drain(..n);
            if b.is_empty() {
                self.bursts.pop_front();
                self.arrived.set(false);
            }
            n
        }
    }

    impl Read for Bursts {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.arrived.set(true);
            Ok(self.take(buf))
        }
    }

    impl Write for Bursts {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.replies.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Transport for Bursts {
        fn read_now(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
            if !self.arrived.get() && !self.bursts.is_empty() {
                return Ok(None);
            }
            Ok(Some(self.take(buf)))
        }
        fn wait_readable(&self) -> io::Result<()> {
            self.arrived.set(true);
            Ok(())
        }
        fn wait_writable(&self) -> io::Result<()> {
            Ok(())
        }
        fn send_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            bufs.iter().map(|b| self.write(b)).sum()
        }
    }

    /// Serves one FUA WRITE of `len` bytes at `offset` arriving in bursts
    /// of `burst_lens`, then DISC. Checks the reply, the drive's bytes,
    /// that each byte was written once and FUA came with the last piece;
    /// returns the backend's record of writes.
    fn run(direct: bool, offset: u64, len: usize, burst_lens: &[usize]) -> Vec<(u64, usize, bool)> {
        let store = RamStore::new(16 << 20, None, Arc::new(MemoryBudget::new(u64::MAX))).unwrap();
        let backend = Arc::new(Recording {
            store,
            direct,
            writes: Mutex::new(Vec::new()),
        });
        let neg = Negotiated {
            export: Arc::new(Export::new("d", "", backend.clone(), false)),
            structured: false,
            base_allocation: false,
            read_only: false,
        };
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let mut wire = Vec::new();
        let request = |flags, command, cookie, offset, len| Request {
            flags,
            command,
            cookie,
            offset,
            len,
        };
        encode_request(
            &mut wire,
            &request(CMD_FLAG_FUA, CMD_WRITE, 1, offset, len as u32),
        );
        wire.extend_from_slice(&data);
        encode_request(&mut wire, &request(0, CMD_DISC, 2, 0, 0));
        let mut stream = Bursts::new(&wire, burst_lens);
        transmission(&mut stream, &neg, crate::nbd::wait::Blocking).unwrap();
        assert_eq!(stream.replies.len(), 16, "one simple reply");
        assert_eq!(&stream.replies[4..8], &[0; 4], "the write succeeded");
        let mut back = vec![0u8; len];
        backend.store.read(offset, &mut back).unwrap();
        assert!(back == data, "the drive holds the payload");
        let writes = backend.writes.lock().unwrap().clone();
        assert_eq!(writes.iter().map(|w| w.1).sum::<usize>(), len, "{writes:?}");
        let fua: Vec<bool> = writes.iter().map(|w| w.2).collect();
        assert!(
            !fua[..fua.len() - 1].contains(&true) && fua[fua.len() - 1],
            "{writes:?}"
        );
        writes
    }

    #[test]
    fn ram_drive_writes_each_burst_as_it_arrives() {
        let writes = run(true, 12_345, 3 << 20, &[100_000, 37_000, 700_000]);
        assert!(writes.len() > 3, "streamed in pieces: {writes:?}");
        assert!(writes
            .iter()
            .all(|w| w.1 <= BOUNCE_BYTES.max(IN_DEFAULT_BYTES)));
        // A write that has fully arrived is gathered, not streamed.
        assert_eq!(run(true, 0, 200_000, &[1 << 20]).len(), 1);
    }

    #[test]
    fn other_backends_get_pieces_that_end_on_chunk_boundaries() {
        let len = 6 << 20;
        for bursts in [
            &[100_000usize, 37_000, 700_000][..],
            &[1_000, 65_536],
            &[5 << 20],
        ] {
            let writes = run(false, 12_345, len, bursts);
            let end = 12_345 + len as u64;
            for &(offset, n, _) in &writes {
                let piece_end = offset + n as u64;
                assert!(
                    piece_end == end || piece_end % (64 * 1024) == 0,
                    "piece {offset}+{n} ends off a boundary: {writes:?}"
                );
            }
        }
    }

    /// A backend error answers that request with its errno and the
    /// connection goes on serving the next one.
    #[test]
    fn a_failing_backend_gets_eio_and_the_connection_goes_on() {
        let store = RamStore::new(1 << 20, None, Arc::new(MemoryBudget::new(u64::MAX))).unwrap();
        let faulty = Arc::new(crate::sim::Faulty::new(Arc::new(store)));
        faulty.set_bad(Some(4096..8192));
        let neg = Negotiated {
            export: Arc::new(Export::new("d", "", faulty.clone(), false)),
            structured: false,
            base_allocation: false,
            read_only: false,
        };
        let mut wire = Vec::new();
        let request = |command, cookie, offset| Request {
            flags: 0,
            command,
            cookie,
            offset,
            len: if command == CMD_DISC { 0 } else { 4096 },
        };
        encode_request(&mut wire, &request(CMD_READ, 1, 4096));
        encode_request(&mut wire, &request(CMD_READ, 2, 0));
        encode_request(&mut wire, &request(CMD_DISC, 3, 0));
        let mut stream = Bursts::new(&wire, &[1 << 20]);
        transmission(&mut stream, &neg, crate::nbd::wait::Blocking).unwrap();
        let r = &stream.replies;
        assert_eq!(r.len(), 16 + 16 + 4096, "an error reply, then a read's");
        assert_eq!(&r[4..8], &(libc::EIO as u32).to_be_bytes(), "EIO");
        assert_eq!(&r[8..16], &1u64.to_be_bytes());
        assert_eq!(&r[20..24], &[0; 4], "the next read succeeds");
        assert_eq!(faulty.failed(), 1);
    }
}
