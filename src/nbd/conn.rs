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
//! WRITEs of 4 MiB and more whose payload has not fully arrived are
//! streamed: each 64 KiB piece is received into a bounce buffer that stays
//! in L2, then written to the store, so a connection never buffers more than
//! 4 MiB. No store lock is ever held while waiting for a client, so a client
//! that stalls mid-payload delays nobody else.
//!
//! Bounds: the input buffer grows to hold one whole smaller request when
//! needed and shrinks back when idle; output is written out whenever it
//! passes `OUT_FLUSH_BYTES`. A WRITE larger than 32 MiB is refused with
//! EINVAL and its payload drained without being stored, so the stream stays
//! in sync and the connection goes on.

use std::io::{self, IoSlice, Read, Write};

use super::export::Export;
use super::handshake::Negotiated;
use super::proto::*;
use crate::backend::Backend;
use crate::metrics::{ConnRecorder, Op};

/// Input buffer size while idle.
const IN_DEFAULT_BYTES: usize = 512 * 1024;
/// Above this, an empty input buffer is shrunk back to the default.
const IN_SHRINK_BYTES: usize = 4 << 20;
/// Replies are written once this many bytes are pending.
const OUT_FLUSH_BYTES: usize = 1 << 20;
/// WRITEs at least this long whose payload has not fully arrived are streamed
/// through a small bounce buffer instead of being gathered whole in `inbuf`.
/// Measured: gathering a 1 MiB write is ~15% faster (it reads in larger
/// pieces and blocks less often); streaming bounds a connection's buffer.
const STREAMED_WRITE_MIN_BYTES: usize = 4 << 20;
/// Piece size of a streamed WRITE: the store's lock chunk, small enough that
/// the bounce buffer stays in L2 and the copy out of it is cheap.
const PIECE_BYTES: usize = 64 * 1024;
/// READs and WRITEs at least this long go through the zero-copy paths when
/// the backend works in place (`Backend::direct_io`): WRITE payloads still
/// in the socket are received straight into the drive, READ data is sent
/// straight from it. Below this, gathering many requests per syscall wins.
const DIRECT_MIN_BYTES: usize = 64 * 1024;

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
pub fn transmission<S: Transport>(
    stream: &mut S,
    neg: &Negotiated,
    poll_us: u32,
) -> io::Result<()> {
    let mut conn = Conn {
        export: &neg.export,
        backend: &*neg.export.backend,
        structured: neg.structured,
        base_allocation: neg.base_allocation,
        out: Vec::with_capacity(OUT_FLUSH_BYTES + 64 * 1024),
        bounce: vec![0u8; PIECE_BYTES],
        rec: neg.export.metrics.as_ref().map(|m| m.connection()),
    };
    let mut inbuf = vec![0u8; IN_DEFAULT_BYTES];
    let mut poller = Poller::new(poll_us);
    let (mut start, mut end) = (0usize, 0usize);
    // Payload bytes of an oversized WRITE still to be skipped.
    let mut discard: u64 = 0;
    loop {
        let mut next = Next::Continue;
        // Requests run since the last read: the client's pipelining depth.
        let mut batch = 0usize;
        while next == Next::Continue {
            if discard > 0 {
                let n = discard.min((end - start) as u64);
                start += n as usize;
                discard -= n;
                if discard > 0 {
                    break;
                }
            }
            let req = match parse_request(&inbuf[start..end]) {
                Ok(Parse::Done(req, _)) => req,
                Ok(Parse::Incomplete) => break,
                Err(e) => {
                    conn.send(stream)?;
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            };
            if req.command == CMD_WRITE && req.len > MAX_PAYLOAD_BYTES {
                start += REQUEST_HEADER_BYTES;
                discard = req.len as u64;
                conn.reply_error(&req, &oversized(&req));
                continue;
            }
            let total = REQUEST_HEADER_BYTES + req.payload_len();
            let direct = req.len as usize >= DIRECT_MIN_BYTES
                && conn.backend.direct_io()
                && conn.validate(&req).is_ok();
            if direct && req.command == CMD_WRITE && end - start < total {
                // A large WRITE whose payload is still arriving: receive
                // the rest straight into the drive.
                conn.send(stream)?;
                let buffered = &inbuf[start + REQUEST_HEADER_BYTES..end];
                discard = conn.direct_write(&req, buffered, stream)?;
                batch += 1;
                (start, end) = (0, 0);
                continue;
            }
            if direct && req.command == CMD_READ {
                conn.send(stream)?;
                conn.direct_read(&req, stream)?;
                batch += 1;
                start += total;
                continue;
            }
            if end - start < total
                && req.command == CMD_WRITE
                && req.len as usize >= STREAMED_WRITE_MIN_BYTES
                && conn.validate(&req).is_ok()
            {
                // A large WRITE whose payload is still arriving: stream it
                // into the store piece by piece instead of gathering it.
                conn.send(stream)?;
                let buffered = &inbuf[start + REQUEST_HEADER_BYTES..end];
                discard = conn.streamed_write(&req, buffered, stream)?;
                (start, end) = (0, 0);
                continue;
            }
            if end - start < total {
                if inbuf.len() - start < total {
                    // Make room for the whole request at the front.
                    inbuf.copy_within(start..end, 0);
                    (start, end) = (0, end - start);
                    if inbuf.len() < total {
                        inbuf.resize(total, 0);
                    }
                }
                break;
            }
            let payload = &inbuf[start + REQUEST_HEADER_BYTES..start + total];
            next = conn.handle(&req, payload);
            batch += 1;
            start += total;
            if conn.out.len() >= OUT_FLUSH_BYTES {
                conn.send(stream)?;
            }
        }
        if !conn.out.is_empty() {
            conn.send(stream)?;
        }
        if next == Next::Disconnect {
            return Ok(());
        }
        if start == end {
            (start, end) = (0, 0);
            if inbuf.len() > IN_SHRINK_BYTES {
                inbuf.truncate(IN_DEFAULT_BYTES);
                inbuf.shrink_to_fit();
            }
        } else if inbuf.len() - end < REQUEST_HEADER_BYTES.max(inbuf.len() / 4) {
            inbuf.copy_within(start..end, 0);
            (start, end) = (0, end - start);
        }
        let n = match poller.read(stream, &mut inbuf[end..], batch) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if let Some(r) = conn.rec.as_mut() {
            r.batch_started();
        }
        end += n;
    }
}

/// A connection's byte stream, able to try a read without blocking.
pub trait Transport: Read + Write {
    /// Reads what is available now; `Ok(None)` when nothing is.
    fn read_now(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;
    /// Bytes received and not yet read (what `read_now` would return at most).
    fn available(&self) -> io::Result<usize>;
    /// Blocks until there is something to read, or the peer has hung up.
    fn wait_readable(&self) -> io::Result<()>;
    /// Blocks until the stream can take more bytes.
    fn wait_writable(&self) -> io::Result<()>;
    /// Sends what the stream takes now of `bufs` (gathered in order)
    /// without blocking; 0 when it takes nothing.
    fn send_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
}

/// Fills all of `dst` from bytes the stream has already received (the
/// caller checked `available()`), never blocking.
fn recv_exact_now<S: Transport>(stream: &mut S, dst: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < dst.len() {
        match stream.read_now(&mut dst[got..])? {
            Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Some(n) => got += n,
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "received bytes vanished from the socket",
                ))
            }
        }
    }
    Ok(())
}

/// Reads a connection's next bytes, polling briefly before it blocks when
/// that pays off.
///
/// Why poll: when a connection thread blocks, its vCPU may halt, and on a VM
/// the wake-up after the next request costs tens of microseconds, more than
/// a RAM request itself. For a client with one request in flight (QD1) the
/// next request comes one client round trip after our reply (~25 us here),
/// so polling up to `poll_us` with non-blocking reads halves its latency.
/// `sched_yield` between tries lets any other runnable thread on this CPU
/// (the client itself, on a small machine) go first.
///
/// Why not always: a pipelining client sends continuously; polling then
/// catches every request alone and pays two syscalls each, where sleeping
/// lets requests pile up into large batches (measured at QD128 on one
/// connection: 2.7 us of server CPU per I/O without polling, 5.3 with). Such
/// a client shows itself by its next request arriving within a few
/// microseconds, or by batches of several requests, so after a streak of
/// quick polls, or a multi-request batch, polling pauses for a while.
/// Polls that run out without a request are pure loss, and worse on a
/// small machine: the spinning thread takes the CPU the client needs to
/// send (measured with a write-back cache beside its flusher on 2 vCPUs:
/// p99 4.5 ms with polling, 0.8 ms without). A streak of those pauses
/// polling too.
struct Poller {
    poll_us: u32,
    /// Consecutive polls answered within `QUICK_US`.
    quick_streak: u32,
    /// Consecutive polls that ran out without a request.
    miss_streak: u32,
    /// Reads left before polling is tried again.
    pause: u32,
}

/// A poll answered this fast means the client did not wait for our reply.
const QUICK_US: u64 = 12;
/// Quick polls in a row that mark a pipelining client.
const QUICK_STREAK: u32 = 8;
/// Polls in a row that caught nothing before polling pauses.
const MISS_STREAK: u32 = 4;
/// Reads without polling before probing again.
const PAUSE_READS: u32 = 512;

impl Poller {
    fn new(poll_us: u32) -> Self {
        Poller {
            poll_us,
            quick_streak: 0,
            miss_streak: 0,
            pause: 0,
        }
    }

    /// Reads into `buf` after a batch of `batch` requests.
    fn read<S: Transport>(
        &mut self,
        stream: &mut S,
        buf: &mut [u8],
        batch: usize,
    ) -> io::Result<usize> {
        if batch > 1 {
            self.pause = self.pause.max(PAUSE_READS);
        }
        if self.pause > 0 {
            self.pause -= 1;
        } else if self.poll_us > 0 {
            let start = std::time::Instant::now();
            let limit = std::time::Duration::from_micros(self.poll_us as u64);
            loop {
                if let Some(n) = stream.read_now(buf)? {
                    self.miss_streak = 0;
                    if start.elapsed() < std::time::Duration::from_micros(QUICK_US) {
                        self.quick_streak += 1;
                        if self.quick_streak >= QUICK_STREAK {
                            self.quick_streak = 0;
                            self.pause = PAUSE_READS;
                        }
                    } else {
                        self.quick_streak = 0;
                    }
                    return Ok(n);
                }
                if start.elapsed() >= limit {
                    self.miss_streak += 1;
                    if self.miss_streak >= MISS_STREAK {
                        self.miss_streak = 0;
                        self.pause = PAUSE_READS;
                    }
                    break;
                }
                std::thread::yield_now();
            }
        }
        loop {
            match stream.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }
}

fn oversized(req: &Request) -> Refusal {
    refuse(
        EINVAL,
        format!(
            "{} of {} bytes exceeds the maximum payload of {} bytes (32 MiB); split the request",
            command_name(req.command),
            req.len,
            MAX_PAYLOAD_BYTES
        ),
    )
}

struct Conn<'a> {
    export: &'a Export,
    backend: &'a dyn Backend,
    structured: bool,
    base_allocation: bool,
    /// Replies not yet written.
    out: Vec<u8>,
    /// One piece of a streamed WRITE, received before any lock is taken.
    bounce: Vec<u8>,
    /// Counts requests and times batches; None when metrics are off.
    rec: Option<ConnRecorder>,
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
    /// Writes every pending reply and clears the buffer; their requests'
    /// latency is recorded once the bytes are out.
    #[inline]
    fn send<S: Write>(&mut self, stream: &mut S) -> io::Result<()> {
        stream.write_all(&self.out)?;
        self.out.clear();
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
        let writes = matches!(req.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        if writes && self.export.is_read_only() {
            return Err(refuse(
                EPERM,
                format!("drive '{}' is read-only", self.export.name),
            ));
        }
        if matches!(req.command, CMD_READ) && req.len > MAX_PAYLOAD_BYTES {
            return Err(oversized(req));
        }
        if matches!(req.command, CMD_FLUSH | CMD_DISC) {
            return Ok(());
        }
        if req.command == CMD_BLOCK_STATUS {
            if !self.base_allocation {
                return Err(refuse(
                    EINVAL,
                    "block status needs base:allocation negotiated",
                ));
            }
            if req.len == 0 {
                return Err(refuse(EINVAL, "block status of zero bytes"));
            }
        }
        let size = self.backend.size();
        let in_range = req
            .offset
            .checked_add(req.len as u64)
            .is_some_and(|end| end <= size);
        if !in_range {
            let errno = if matches!(req.command, CMD_WRITE | CMD_WRITE_ZEROES) {
                ENOSPC
            } else {
                EINVAL
            };
            return Err(refuse(
                errno,
                format!(
                    "{} at offset {} length {} is beyond the end of the drive ({size} bytes)",
                    command_name(req.command),
                    req.offset,
                    req.len
                ),
            ));
        }
        Ok(())
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

    /// Runs a validated WRITE whose payload starts with `buffered` and
    /// continues on `stream`, in pieces of at most `PIECE_BYTES` aligned to
    /// the store's 64 KiB lock chunks. Each piece not yet buffered is read
    /// into a cache-hot bounce buffer first and only then written, so no
    /// store lock is ever held while waiting on the client: a stalled client
    /// cannot block other connections. Returns how many payload bytes remain
    /// unread on the stream (non-zero only when the backend refused part-way;
    /// the caller discards them). A stream error ends the connection.
    fn streamed_write<S: Read>(
        &mut self,
        req: &Request,
        buffered: &[u8],
        stream: &mut S,
    ) -> io::Result<u64> {
        let len = req.len as usize;
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let mut done = 0usize;
        while done < len {
            let offset = req.offset + done as u64;
            let n = (PIECE_BYTES - (offset % PIECE_BYTES as u64) as usize).min(len - done);
            let piece: &[u8] = if done + n <= buffered.len() {
                &buffered[done..done + n]
            } else {
                // The piece may start inside the buffered part or past it.
                let rest = &buffered[done.min(buffered.len())..];
                self.bounce[..rest.len()].copy_from_slice(rest);
                let from_buf = rest.len();
                stream.read_exact(&mut self.bounce[from_buf..n])?;
                &self.bounce[..n]
            };
            // FUA on the last piece covers the earlier ones too.
            let result = self.backend.write(offset, piece, fua && done + n == len);
            if let Err(e) = result {
                self.reply_backend_error(req, &e);
                return Ok((len - (done + n).max(buffered.len())) as u64);
            }
            done += n;
        }
        encode_simple_reply(&mut self.out, req.cookie, 0);
        self.count_done(req);
        Ok(0)
    }

    /// Runs a validated WRITE whose payload starts with `buffered` and
    /// continues on `stream`, receiving the rest straight into the backend
    /// (`Backend::write_with`) as it arrives: one copy, socket to drive.
    /// Only bytes the socket already holds are received under the
    /// backend's locks; waiting for more happens with no lock held, so a
    /// stalled client delays nobody else. Returns the payload bytes left
    /// unread on the stream (non-zero only when the backend refused
    /// part-way; the caller discards them). A stream error, or the client
    /// hanging up mid-payload, ends the connection.
    fn direct_write<S: Transport>(
        &mut self,
        req: &Request,
        buffered: &[u8],
        stream: &mut S,
    ) -> io::Result<u64> {
        let len = req.len as usize;
        if !buffered.is_empty() {
            if let Err(e) = self.backend.write(req.offset, buffered, false) {
                self.reply_backend_error(req, &e);
                return Ok((len - buffered.len()) as u64);
            }
        }
        let mut done = buffered.len();
        while done < len {
            let avail = stream.available()?;
            if avail == 0 {
                stream.wait_readable()?;
                if stream.available()? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "client hung up in the middle of a WRITE payload",
                    ));
                }
                continue;
            }
            let (mut received, mut stream_error) = (0usize, None);
            let result = self.backend.write_with(
                req.offset + done as u64,
                avail.min(len - done),
                &mut |dst| {
                    recv_exact_now(stream, dst).inspect_err(|e| {
                        stream_error = Some(io::Error::new(e.kind(), e.to_string()))
                    })?;
                    received += dst.len();
                    Ok(())
                },
            );
            if let Some(e) = stream_error {
                return Err(e);
            }
            match result {
                Ok(n) => done += n,
                Err(e) => {
                    self.reply_backend_error(req, &e);
                    return Ok((len - done - received) as u64);
                }
            }
        }
        match self.flush_if_fua(req) {
            Ok(()) => {
                encode_simple_reply(&mut self.out, req.cookie, 0);
                self.count_done(req);
            }
            Err(e) => self.reply_backend_error(req, &e),
        }
        Ok(0)
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
        self.out.clear();
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

    fn flush_if_fua(&self, req: &Request) -> crate::backend::Result<()> {
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

    fn reply_backend_error(&mut self, req: &Request, e: &crate::backend::Error) {
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
mod poller_tests {
    use super::*;

    /// A stream whose non-blocking reads answer from a script (`true`: a
    /// byte is there), and whose blocking reads always return one byte.
    struct Scripted {
        polls: std::collections::VecDeque<bool>,
        blocking_reads: usize,
        nonblocking_reads: usize,
    }

    impl Scripted {
        fn new(script: &[bool]) -> Self {
            Scripted {
                polls: script.iter().copied().collect(),
                blocking_reads: 0,
                nonblocking_reads: 0,
            }
        }
    }

    impl Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.blocking_reads += 1;
            buf[0] = 0;
            Ok(1)
        }
    }

    impl Write for Scripted {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Transport for Scripted {
        fn read_now(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
            self.nonblocking_reads += 1;
            // Past the script's end the client never answers a poll.
            if self.polls.pop_front().unwrap_or(false) {
                buf[0] = 0;
                Ok(Some(1))
            } else {
                Ok(None)
            }
        }
        fn available(&self) -> io::Result<usize> {
            Ok(0)
        }
        fn wait_readable(&self) -> io::Result<()> {
            Ok(())
        }
        fn wait_writable(&self) -> io::Result<()> {
            Ok(())
        }
        fn send_now(&mut self, _bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            Ok(0)
        }
    }

    /// Polls that catch nothing, MISS_STREAK in a row, pause polling: the
    /// next reads block at once, without a single non-blocking try.
    #[test]
    fn empty_polls_in_a_row_pause_polling() {
        // A poll window of 1 us: each empty poll ends after a try or two.
        let mut p = Poller::new(1);
        let mut s = Scripted::new(&[]);
        let mut buf = [0u8; 16];
        for _ in 0..MISS_STREAK {
            assert_eq!(p.read(&mut s, &mut buf, 1).unwrap(), 1);
        }
        assert_eq!(s.blocking_reads, MISS_STREAK as usize);
        assert_eq!(p.pause, PAUSE_READS, "polling did not pause");
        let tries = s.nonblocking_reads;
        for _ in 0..10 {
            p.read(&mut s, &mut buf, 1).unwrap();
        }
        assert_eq!(s.nonblocking_reads, tries, "a paused poller still polled");
        assert_eq!(p.pause, PAUSE_READS - 10);
    }

    /// A poll that catches a request resets the streak of empty ones: a
    /// client that answers most polls (QD1) keeps being polled.
    #[test]
    fn a_caught_request_resets_the_miss_streak() {
        let mut p = Poller::new(1);
        let mut buf = [0u8; 16];
        // Fewer rounds than QUICK_STREAK: quick hits alone pause nothing.
        for round in 0..QUICK_STREAK - 1 {
            let mut empty = Scripted::new(&[]);
            for _ in 0..MISS_STREAK - 1 {
                p.read(&mut empty, &mut buf, 1).unwrap();
            }
            assert_eq!(p.pause, 0, "round {round}: paused before the streak");
            let mut hit = Scripted::new(&[true]);
            p.read(&mut hit, &mut buf, 1).unwrap();
            assert_eq!(hit.blocking_reads, 0, "the hit was not caught by polling");
            assert_eq!(p.miss_streak, 0);
            assert_eq!(p.pause, 0);
        }
    }

    /// A batch of several requests means a pipelining client: no polling
    /// for the next PAUSE_READS reads.
    #[test]
    fn a_multi_request_batch_pauses_polling() {
        let mut p = Poller::new(50);
        let mut s = Scripted::new(&[true; 4]);
        let mut buf = [0u8; 16];
        p.read(&mut s, &mut buf, 3).unwrap();
        assert_eq!(s.nonblocking_reads, 0);
        assert_eq!(s.blocking_reads, 1);
        assert_eq!(p.pause, PAUSE_READS - 1);
    }
}
