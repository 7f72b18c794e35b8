//! The NBD load generator: one connection per job, `iodepth` requests in
//! flight on it, pipelined over a non-blocking socket.
//!
//! The handshake is `cache::backing::nbd_client`'s (the client ramd
//! already uses for NBD cache backings); the transmission phase is
//! `nbd::proto`'s encoder and reply parser. That client keeps one request
//! in flight per connection, so the pipelining is here:
//!
//! ```text
//!  loop: encode requests for every free slot (cookie = slot) into `out`
//!        write what the socket takes            (never blocks)
//!        read what the socket has into `inbuf`  (never blocks)
//!        parse replies: header, then a READ's data; free the slot, record
//!        neither moved a byte: poll(2) for POLLIN (| POLLOUT with output)
//! ```
//!
//! Non-blocking in both directions, so a depth of large writes and reads
//! cannot deadlock with a server that stops reading while its replies are
//! not read (both socket buffers full). No structured replies are
//! negotiated: a READ's reply is its header and exactly its data.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::{AlignedBuf, EngineError, Live, Offsets, Until, Workload};
use crate::bench::latency::Recorder;
use crate::cache::backing::nbd_client::{connect_plain, ClientOptions, NbdUri};
use crate::nbd::proto::{
    encode_request, parse_simple_reply, Parse, Request, CMD_DISC, CMD_READ, CMD_WRITE,
    REQUEST_HEADER_BYTES,
};

/// Longest time without a byte moved before the job gives up.
const STALL: Duration = Duration::from_secs(30);
/// Bytes read per `read` call.
const READ_CHUNK: usize = 256 << 10;

/// One job's connection.
pub struct NbdJob {
    sock: File,
}

/// A request in flight.
#[derive(Clone, Copy)]
struct Slot {
    start: Instant,
    offset: u64,
    read: bool,
}

impl NbdJob {
    /// Connects and negotiates the export (before the clock starts).
    pub fn open(uri: &NbdUri) -> Result<NbdJob, crate::bench::BenchError> {
        let opts = ClientOptions {
            connections: 1,
            timeout: Duration::from_secs(30),
        };
        let (fd, _info): (OwnedFd, _) = connect_plain(uri, &opts)?;
        let sock = File::from(fd);
        set_nonblocking(&sock).map_err(|source| crate::bench::BenchError::Io {
            what: "set the NBD socket non-blocking".into(),
            source,
        })?;
        Ok(NbdJob { sock })
    }

    /// Runs the workload until `until`, recording into `rec`.
    pub fn run(
        &mut self,
        w: &Workload,
        seed: u64,
        until: Until<'_>,
        live: &Live,
        rec: &mut Recorder,
    ) -> Result<(), EngineError> {
        let mut pipe = Pipe::new(w, seed);
        let result = pipe.run(&mut self.sock, until, live, rec);
        if result.is_ok() {
            self.goodbye();
        }
        result
    }

    /// NBD_CMD_DISC, best effort.
    fn goodbye(&mut self) {
        let mut out = Vec::with_capacity(REQUEST_HEADER_BYTES);
        encode_request(
            &mut out,
            &Request {
                flags: 0,
                command: CMD_DISC,
                cookie: u64::MAX,
                offset: 0,
                len: 0,
            },
        );
        let _ = self.sock.write(&out);
    }
}

/// The pipelining state of one run.
struct Pipe {
    w: Workload,
    offsets: Offsets,
    data: AlignedBuf,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Vec<u8>,
    in_len: usize,
    /// Data bytes of the current READ reply still to skip.
    skip: usize,
    stopping: bool,
}

impl Pipe {
    fn new(w: &Workload, seed: u64) -> Pipe {
        let depth = w.iodepth.max(1) as usize;
        Pipe {
            w: *w,
            offsets: Offsets::new(w, seed),
            data: AlignedBuf::new(w.block_bytes as usize, seed ^ 0x5eed),
            slots: vec![None; depth],
            free: (0..depth).rev().collect(),
            out: Vec::with_capacity(depth * (REQUEST_HEADER_BYTES + 64)),
            out_pos: 0,
            inbuf: vec![0; READ_CHUNK + w.block_bytes as usize],
            in_len: 0,
            skip: 0,
            stopping: false,
        }
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn run(
        &mut self,
        sock: &mut File,
        until: Until<'_>,
        live: &Live,
        rec: &mut Recorder,
    ) -> Result<(), EngineError> {
        let mut last_progress = Instant::now();
        loop {
            let now = Instant::now();
            if until.reached(now) {
                self.stopping = true;
            }
            if !self.stopping {
                self.submit(now);
            }
            let wrote = self.write_out(sock)?;
            if self.stopping && self.in_flight() == 0 {
                return Ok(());
            }
            let done = self.read_in(sock, live, rec)?;
            if wrote || done {
                last_progress = Instant::now();
                continue;
            }
            if last_progress.elapsed() > STALL {
                return Err(EngineError::Protocol(format!(
                    "no reply for {} s with {} requests in flight",
                    STALL.as_secs(),
                    self.in_flight()
                )));
            }
            let want_out = self.out_pos < self.out.len();
            wait(sock, want_out).map_err(EngineError::io("poll the NBD socket"))?;
        }
    }

    /// Encodes a request for every free slot, all stamped `now`.
    fn submit(&mut self, now: Instant) {
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
        while let Some(i) = self.free.pop() {
            let (offset, read) = self.offsets.draw();
            let len = self.w.block_bytes as u32;
            encode_request(
                &mut self.out,
                &Request {
                    flags: 0,
                    command: if read { CMD_READ } else { CMD_WRITE },
                    cookie: i as u64,
                    offset,
                    len,
                },
            );
            if !read {
                self.out.extend_from_slice(self.data.as_slice());
            }
            self.slots[i] = Some(Slot {
                start: now,
                offset,
                read,
            });
        }
    }

    /// Writes what the socket takes; true when it took something.
    fn write_out(&mut self, sock: &mut File) -> Result<bool, EngineError> {
        let mut wrote = false;
        while self.out_pos < self.out.len() {
            match sock.write(&self.out[self.out_pos..]) {
                Ok(0) => {
                    return Err(EngineError::Protocol(
                        "the server closed the connection".into(),
                    ))
                }
                Ok(n) => {
                    self.out_pos += n;
                    wrote = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(EngineError::io("write to the NBD socket")(e)),
            }
        }
        Ok(wrote)
    }

    /// Reads what the socket has and completes the replies in it; true
    /// when it read something.
    fn read_in(
        &mut self,
        sock: &mut File,
        live: &Live,
        rec: &mut Recorder,
    ) -> Result<bool, EngineError> {
        let n = match sock.read(&mut self.inbuf[self.in_len..]) {
            Ok(0) => {
                return Err(EngineError::Protocol(
                    "the server closed the connection".into(),
                ))
            }
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                return Ok(false)
            }
            Err(e) => return Err(EngineError::io("read from the NBD socket")(e)),
        };
        self.in_len += n;
        let now = Instant::now();
        let completed = self.parse(now, rec)?;
        live.add(completed);
        Ok(true)
    }

    /// Consumes every whole reply in `inbuf`; the number completed.
    fn parse(&mut self, now: Instant, rec: &mut Recorder) -> Result<u64, EngineError> {
        let mut pos = 0;
        let mut completed = 0;
        loop {
            if self.skip > 0 {
                let n = self.skip.min(self.in_len - pos);
                self.skip -= n;
                pos += n;
                if self.skip > 0 {
                    break;
                }
            }
            let reply = match parse_simple_reply(&self.inbuf[pos..self.in_len]) {
                Ok(Parse::Done(r, used)) => {
                    pos += used;
                    r
                }
                Ok(Parse::Incomplete) => break,
                Err(e) => return Err(EngineError::Protocol(e.to_string())),
            };
            let slot = self.complete(reply.cookie)?;
            if reply.error != 0 {
                rec.errors += 1;
                return Err(EngineError::Nbd {
                    command: if slot.read { "READ" } else { "WRITE" },
                    offset: slot.offset,
                    errno: reply.error,
                });
            }
            let ns = now.saturating_duration_since(slot.start).as_nanos() as u64;
            if slot.read {
                rec.read.record(ns, self.w.block_bytes);
                self.skip = self.w.block_bytes as usize;
            } else {
                rec.write.record(ns, self.w.block_bytes);
            }
            completed += 1;
        }
        self.inbuf.copy_within(pos..self.in_len, 0);
        self.in_len -= pos;
        Ok(completed)
    }

    /// Frees the slot of `cookie`.
    fn complete(&mut self, cookie: u64) -> Result<Slot, EngineError> {
        let slot = usize::try_from(cookie)
            .ok()
            .and_then(|i| Some((i, self.slots.get_mut(i)?.take()?)));
        let Some((i, slot)) = slot else {
            return Err(EngineError::Protocol(format!(
                "a reply for cookie {cookie}, which is not in flight"
            )));
        };
        self.free.push(i);
        Ok(slot)
    }
}

fn set_nonblocking(f: &File) -> std::io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(f)?;
    rustix::fs::fcntl_setfl(f, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}

/// Waits until the socket can be read (or written, with `want_out`), at
/// most 100 ms so the deadline and Ctrl-C are seen.
fn wait(sock: &File, want_out: bool) -> std::io::Result<()> {
    let mut events = libc::POLLIN;
    if want_out {
        events |= libc::POLLOUT;
    }
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd, owned by this frame, for the call's
    // duration.
    let r = unsafe { libc::poll(&mut pfd, 1, 100) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}
