//! In-process protocol tests: a real `Server` on a unix socket (and TCP), and
//! a small client in this file that speaks raw NBD bytes, built with the
//! encoders and constants of `ramd::nbd::proto`.
//!
//! The client checks the server's replies against the spec as it parses
//! them (magic numbers, cookies, chunk bounds, non-empty error messages,
//! block status descriptor rules), so every test also checks conformance.
//!
//! Every socket has read and write timeouts: a server bug fails a test
//! instead of hanging it. A panic hook counts panics on the server's
//! connection threads (they would otherwise die silently), and stopping a
//! test server asserts that there were none and that `run()` returned.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use common::nbdserver::{
    server_panic_count, server_panics, server_panics_since, Drive, TestServer,
};
use common::{pattern, wait_until, WAIT_TIMEOUT};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use ramd::nbd::proto::*;
use ramd::nbd::ServerConfig;

const MIB: u64 = 1 << 20;
/// Longest any single socket read or write may block. Generous: the
/// machine may be busy, and it only costs time when a test fails.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a fuzzing client looks for server panics while it waits.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Cookies start high so a server that truncates them is caught.
const FIRST_COOKIE: u64 = 0xc00c_1e00_0000_0000;

// ------------------------------------------------------------------ server

/// The drives every test server exports. The first is the default export.
const DRIVES: &[Drive] = &[
    // Bigger than the 32 MiB payload limit, so the limit, not the size, is
    // what refuses a 33 MiB request.
    Drive::new("ram0", 40 * MIB).described("the default drive"),
    Drive::new("ro", MIB)
        .described("a read-only drive")
        .read_only(),
    Drive::new("tiny", MIB)
        .described("two pages of memory")
        .limited(2 * 4096),
    // Small, so random reads in the fuzz tests cannot ask for much.
    Drive::new("small", 2 * MIB).described("for fuzzing"),
];

/// A test server (`common::nbdserver`) exporting [`DRIVES`].
fn server() -> TestServer {
    server_with(|_| {})
}

/// A test server exporting [`DRIVES`] with `tweak` applied to its config.
fn server_with(tweak: impl FnOnce(&mut ServerConfig)) -> TestServer {
    TestServer::start(DRIVES, tweak)
}

/// This file's clients of a test server.
trait Clients {
    /// A connected client that has not read anything yet.
    fn connect(&self) -> Client;
    /// A client in the transmission phase on export `name`.
    fn open(&self, name: &str, opts: Opts) -> Client;
}

impl Clients for TestServer {
    fn connect(&self) -> Client {
        Client::unix(&self.socket)
    }

    fn open(&self, name: &str, opts: Opts) -> Client {
        let mut c = self.connect();
        c.start_newstyle();
        c.negotiate(name, opts);
        c
    }
}

// ------------------------------------------------------------------ client

/// A client socket of either kind.
trait Wire: Read + Write + Send + AsRawFd {
    fn shutdown_how(&self, how: Shutdown);
    fn timeouts(&self, read: Duration, write: Duration);
    fn clone_wire(&self) -> Box<dyn Wire>;
}

/// Implements `Wire` for a std socket type.
macro_rules! impl_wire {
    ($t:ty) => {
        impl Wire for $t {
            fn shutdown_how(&self, how: Shutdown) {
                // Fails only when the peer already went: nothing to do then.
                let _ = self.shutdown(how);
            }
            fn timeouts(&self, read: Duration, write: Duration) {
                self.set_read_timeout(Some(read)).unwrap();
                self.set_write_timeout(Some(write)).unwrap();
            }
            fn clone_wire(&self) -> Box<dyn Wire> {
                Box::new(self.try_clone().expect("clone socket"))
            }
        }
    };
}
impl_wire!(UnixStream);
impl_wire!(TcpStream);

/// What to negotiate before entering transmission.
#[derive(Clone, Copy, Debug)]
struct Opts {
    structured: bool,
    /// SET_META_CONTEXT base:allocation (needs `structured`).
    meta: bool,
}

const SIMPLE: Opts = Opts {
    structured: false,
    meta: false,
};
const STRUCTURED: Opts = Opts {
    structured: true,
    meta: true,
};
const STRUCTURED_NO_META: Opts = Opts {
    structured: true,
    meta: false,
};

/// One option reply.
#[derive(Debug)]
struct OptReply {
    option: u32,
    kind: u32,
    data: Vec<u8>,
}

impl OptReply {
    fn is_final(&self) -> bool {
        self.kind == REP_ACK || self.kind & (1 << 31) != 0
    }
    /// The payload of an NBD_REP_INFO of type `info`.
    fn info(&self, info: u16) -> Option<&[u8]> {
        (self.kind == REP_INFO && be16(&self.data) == info).then(|| &self.data[2..])
    }
}

/// A complete reply to one request, checked against the spec.
#[derive(Debug)]
struct Reply {
    command: u16,
    errno: u32,
    message: String,
    /// READ data, reassembled.
    data: Vec<u8>,
    /// BLOCK_STATUS descriptors: (length, flags).
    status: Vec<(u32, u32)>,
    /// Number of OFFSET_DATA / OFFSET_HOLE chunks (DF allows at most one).
    content_chunks: usize,
}

impl Reply {
    fn ok(self) -> Reply {
        assert_eq!(
            self.errno,
            0,
            "{} failed: errno {} {:?}",
            command_name(self.command),
            self.errno,
            self.message
        );
        self
    }

    fn err(self, errno: u32) -> Reply {
        assert_eq!(
            self.errno,
            errno,
            "{} should fail with {errno}, got {} {:?}",
            command_name(self.command),
            self.errno,
            self.message
        );
        self
    }
}

/// A structured reply being put together chunk by chunk.
struct Assembly {
    req: Request,
    errno: u32,
    message: String,
    data: Vec<u8>,
    /// Byte ranges of the request covered by content chunks.
    covered: Vec<(u64, u64)>,
    status: Option<Vec<(u32, u32)>>,
    content_chunks: usize,
}

struct Client {
    wire: Box<dyn Wire>,
    structured: bool,
    /// The base:allocation context id the server gave, if negotiated.
    meta_id: Option<u32>,
    size: u64,
    flags: u16,
    next_cookie: u64,
    /// Requests sent and not yet answered, by cookie.
    pending: HashMap<u64, Request>,
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

/// NBD_OPT_INFO / NBD_OPT_GO data: export name and information requests.
fn info_request(name: &str, requests: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
    for r in requests {
        d.extend_from_slice(&r.to_be_bytes());
    }
    d
}

/// NBD_OPT_{LIST,SET}_META_CONTEXT data: export name and queries.
fn meta_request(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// An option header (the server only parses these; clients build them).
fn option_header(option: u32, len: u32) -> Vec<u8> {
    let mut h = IHAVEOPT.to_be_bytes().to_vec();
    h.extend_from_slice(&option.to_be_bytes());
    h.extend_from_slice(&len.to_be_bytes());
    h
}

/// A request header the client does not track (garbage, or abandoned).
fn header_bytes(command: u16, flags: u16, offset: u64, len: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(REQUEST_HEADER_BYTES);
    let cookie = 0x0bad_c00c;
    encode_request(
        &mut out,
        &Request {
            flags,
            command,
            cookie,
            offset,
            len,
        },
    );
    out
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn is_closed_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

impl Client {
    fn with_wire(wire: Box<dyn Wire>) -> Client {
        wire.timeouts(IO_TIMEOUT, IO_TIMEOUT);
        Client {
            wire,
            structured: false,
            meta_id: None,
            size: 0,
            flags: 0,
            next_cookie: FIRST_COOKIE,
            pending: HashMap::new(),
        }
    }

    fn unix(path: &Path) -> Client {
        Client::with_wire(Box::new(
            UnixStream::connect(path).expect("connect unix socket"),
        ))
    }

    fn tcp(addr: SocketAddr) -> Client {
        Client::with_wire(Box::new(TcpStream::connect(addr).expect("connect tcp")))
    }

    fn send_bytes(&mut self, bytes: &[u8]) {
        self.wire.write_all(bytes).expect("send to server");
    }

    fn recv_bytes(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        self.wire.read_exact(&mut buf).unwrap_or_else(|e| {
            let what = if is_timeout(&e) {
                format!("no reply for {IO_TIMEOUT:?}")
            } else {
                e.to_string()
            };
            panic!(
                "reading {n} bytes from the server: {what}; {}",
                server_panics()
            )
        });
        buf
    }

    /// Asserts the server closes the connection without sending more.
    fn expect_closed(&mut self) {
        let mut buf = [0u8; 512];
        loop {
            match self.wire.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => panic!(
                    "expected the connection to close, got {n} more bytes: {:02x?}",
                    &buf[..n.min(64)]
                ),
                Err(e) if is_closed_error(&e) => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => panic!("expected the connection to close: {e}; {}", server_panics()),
            }
        }
    }

    /// Reads and discards until the server closes (fuzzing: replies are
    /// not checked, only that the server ends the connection).
    /// Fails as soon as a server thread panics (more panics than
    /// `panics_before`), rather than after the whole timeout.
    fn drain_until_closed(&mut self, panics_before: usize) {
        self.wire.timeouts(POLL_INTERVAL, IO_TIMEOUT);
        let deadline = Instant::now() + IO_TIMEOUT;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let failure = match self.wire.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => continue,
                Err(e) if is_closed_error(&e) => return,
                Err(e) if !is_timeout(&e) => panic!("reading from the server: {e}"),
                Err(_) if server_panic_count() > panics_before => "a server thread panicked",
                Err(_) if Instant::now() < deadline => continue,
                Err(_) => "the server did not close the connection",
            };
            // Unblocks a thread still writing to this connection.
            self.wire.shutdown_how(Shutdown::Both);
            panic!("{failure}; {}", server_panics_since(panics_before));
        }
    }

    // -------------------------------------------------------- handshake

    /// Reads the greeting, checks both magics, returns the handshake flags.
    fn greeting(&mut self) -> u16 {
        self.try_greeting()
            .expect("the server closed instead of greeting")
    }

    /// The greeting, or None when the server closed the connection instead.
    fn try_greeting(&mut self) -> Option<u16> {
        let mut g = [0u8; 18];
        match self.wire.read_exact(&mut g) {
            Ok(()) => {}
            Err(e) if is_closed_error(&e) => return None,
            Err(e) => panic!("reading the greeting: {e}"),
        }
        assert_eq!(be64(&g), NBDMAGIC, "greeting magic");
        assert_eq!(be64(&g[8..]), IHAVEOPT, "greeting IHAVEOPT");
        Some(be16(&g[16..]))
    }

    fn send_client_flags(&mut self, flags: u32) {
        self.send_bytes(&flags.to_be_bytes());
    }

    /// Greeting plus client flags FIXED_NEWSTYLE | NO_ZEROES.
    fn start_newstyle(&mut self) {
        self.greeting();
        self.send_client_flags(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
    }

    fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut msg = option_header(option, data.len() as u32);
        msg.extend_from_slice(data);
        self.send_bytes(&msg);
    }

    fn option_reply(&mut self) -> OptReply {
        let h = self.recv_bytes(20);
        assert_eq!(be64(&h), OPT_REPLY_MAGIC, "option reply magic");
        let len = be32(&h[16..]) as usize;
        OptReply {
            option: be32(&h[8..]),
            kind: be32(&h[12..]),
            data: self.recv_bytes(len),
        }
    }

    /// Sends an option and reads its replies up to the final one (ACK or an
    /// error), checking each names the option.
    fn option(&mut self, option: u32, data: &[u8]) -> Vec<OptReply> {
        self.send_option(option, data);
        self.option_replies(option)
    }

    fn option_replies(&mut self, option: u32) -> Vec<OptReply> {
        let mut replies = Vec::new();
        loop {
            let r = self.option_reply();
            assert_eq!(r.option, option, "reply names another option: {r:?}");
            let done = r.is_final();
            replies.push(r);
            if done {
                return replies;
            }
        }
    }

    /// Sends an option that must be refused with `kind` (and a message).
    fn option_error(&mut self, option: u32, data: &[u8], kind: u32) {
        let replies = self.option(option, data);
        assert_eq!(replies.len(), 1, "{replies:?}");
        assert_eq!(replies[0].kind, kind, "option {option}: {replies:?}");
        let msg = String::from_utf8(replies[0].data.clone()).expect("UTF-8 message");
        assert!(!msg.is_empty(), "option error without a message");
    }

    /// Sends an option that must be acknowledged with a single ACK.
    fn option_ack(&mut self, option: u32, data: &[u8]) {
        let replies = self.option(option, data);
        assert_eq!(replies.len(), 1, "{replies:?}");
        assert_eq!(replies[0].kind, REP_ACK, "option {option}: {replies:?}");
    }

    /// INFO or GO that must succeed; returns (size, transmission flags) from
    /// NBD_INFO_EXPORT and all the replies.
    fn info_or_go(&mut self, option: u32, name: &str, reqs: &[u16]) -> (u64, u16, Vec<OptReply>) {
        let replies = self.option(option, &info_request(name, reqs));
        assert_eq!(replies.last().unwrap().kind, REP_ACK, "{replies:?}");
        let export = replies
            .iter()
            .find_map(|r| r.info(INFO_EXPORT))
            .expect("NBD_INFO_EXPORT is mandatory");
        assert_eq!(export.len(), 10, "NBD_INFO_EXPORT length");
        (be64(export), be16(&export[8..]), replies)
    }

    /// STRUCTURED_REPLY and base:allocation as asked, then GO.
    fn negotiate(&mut self, name: &str, opts: Opts) {
        if opts.structured {
            self.option_ack(OPT_STRUCTURED_REPLY, &[]);
        }
        if opts.meta {
            let replies = self.option(
                OPT_SET_META_CONTEXT,
                &meta_request(name, &[META_BASE_ALLOCATION]),
            );
            assert_eq!(replies.len(), 2, "{replies:?}");
            assert_eq!(replies[0].kind, REP_META_CONTEXT);
            assert_eq!(&replies[0].data[4..], META_BASE_ALLOCATION.as_bytes());
            assert_eq!(replies[1].kind, REP_ACK);
            self.meta_id = Some(be32(&replies[0].data));
        }
        let (size, flags, _) = self.info_or_go(OPT_GO, name, &[]);
        self.structured = opts.structured;
        self.size = size;
        self.flags = flags;
    }

    // ----------------------------------------------------- transmission

    /// Appends one request to `out` (sent later, with others) and returns
    /// its cookie; `len` is what the header claims, `payload` what follows
    /// it (they differ on purpose in some tests).
    fn queue(
        &mut self,
        out: &mut Vec<u8>,
        command: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let req = Request {
            flags,
            command,
            cookie,
            offset,
            len,
        };
        encode_request(out, &req);
        out.extend_from_slice(payload);
        if command != CMD_DISC {
            self.pending.insert(cookie, req);
        }
        cookie
    }

    /// Sends one request (see `queue`).
    fn send(&mut self, command: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> u64 {
        let mut msg = Vec::with_capacity(REQUEST_HEADER_BYTES + payload.len());
        let cookie = self.queue(&mut msg, command, flags, offset, len, payload);
        self.send_bytes(&msg);
        cookie
    }

    /// Waits until the server has read everything this client sent (the
    /// socket's send queue is empty): the server is then known to be working
    /// on it, not merely about to.
    fn wait_until_consumed(&self) {
        let deadline = Instant::now() + IO_TIMEOUT;
        loop {
            let mut queued: libc::c_int = 0;
            // SAFETY: TIOCOUTQ (SIOCOUTQ) stores one c_int through the
            // pointer, which points at a live local; the fd is open.
            let rc = unsafe { libc::ioctl(self.wire.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
            assert_eq!(rc, 0, "SIOCOUTQ: {}", io::Error::last_os_error());
            if queued == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "the server stopped reading");
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// Bytes the server sent that this client has not read yet (FIONREAD).
    fn unread_bytes(&self) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD stores one c_int through the pointer, which
        // points at a live local; the fd is open.
        let rc = unsafe { libc::ioctl(self.wire.as_raw_fd(), libc::FIONREAD, &mut n) };
        assert_eq!(rc, 0, "FIONREAD: {}", io::Error::last_os_error());
        n as usize
    }

    /// Reads the next complete reply and checks it is well-formed.
    fn recv(&mut self) -> (u64, Reply) {
        let magic = be32(&self.recv_bytes(4));
        match magic {
            SIMPLE_REPLY_MAGIC => self.recv_simple(),
            STRUCTURED_REPLY_MAGIC => self.recv_structured(),
            other => panic!("bad reply magic {other:#x}"),
        }
    }

    fn take_pending(&mut self, cookie: u64) -> Request {
        self.pending
            .remove(&cookie)
            .unwrap_or_else(|| panic!("reply for unknown cookie {cookie:#x}"))
    }

    fn recv_simple(&mut self) -> (u64, Reply) {
        let h = self.recv_bytes(12);
        let (errno, cookie) = (be32(&h), be64(&h[4..]));
        let req = self.take_pending(cookie);
        assert!(
            !(self.structured && req.command == CMD_READ),
            "simple reply to READ after structured replies were negotiated"
        );
        assert!(
            !(errno == 0 && req.command == CMD_BLOCK_STATUS),
            "successful BLOCK_STATUS needs a structured reply"
        );
        let data = if req.command == CMD_READ && errno == 0 {
            self.recv_bytes(req.len as usize)
        } else {
            Vec::new()
        };
        let reply = Reply {
            command: req.command,
            errno,
            message: String::new(),
            data,
            status: Vec::new(),
            content_chunks: 0,
        };
        (cookie, reply)
    }

    /// Chunks up to the one flagged DONE. ramd never interleaves the chunks
    /// of different replies, so all chunks here must carry one cookie.
    fn recv_structured(&mut self) -> (u64, Reply) {
        assert!(self.structured, "structured reply without negotiation");
        let mut assembly: Option<(u64, Assembly)> = None;
        loop {
            let h = self.recv_bytes(CHUNK_HEADER_BYTES - 4);
            let (flags, kind, cookie, len) =
                (be16(&h), be16(&h[2..]), be64(&h[4..]), be32(&h[12..]));
            let payload = self.recv_bytes(len as usize);
            let (first_cookie, a) = assembly.get_or_insert_with(|| {
                let req = *self
                    .pending
                    .get(&cookie)
                    .unwrap_or_else(|| panic!("chunk for unknown cookie {cookie:#x}"));
                (cookie, Assembly::new(req))
            });
            assert_eq!(*first_cookie, cookie, "chunks of two replies interleaved");
            a.add(kind, flags, &payload, self.meta_id);
            if flags & REPLY_FLAG_DONE != 0 {
                let (cookie, a) = assembly.unwrap();
                self.take_pending(cookie);
                return (cookie, a.finish());
            }
            assert_eq!(
                be32(&self.recv_bytes(4)),
                STRUCTURED_REPLY_MAGIC,
                "chunk magic"
            );
        }
    }

    /// Sends one request and returns its reply.
    fn call(&mut self, command: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> Reply {
        let cookie = self.send(command, flags, offset, len, payload);
        let (got, reply) = self.recv();
        assert_eq!(got, cookie, "reply to another request");
        reply
    }

    fn cmd(&mut self, command: u16, flags: u16, offset: u64, len: u32) -> Reply {
        self.call(command, flags, offset, len, &[])
    }

    fn read(&mut self, offset: u64, len: u32) -> Vec<u8> {
        self.cmd(CMD_READ, 0, offset, len).ok().data
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.write_flags(offset, data, 0).ok();
    }

    fn write_flags(&mut self, offset: u64, data: &[u8], flags: u16) -> Reply {
        self.call(CMD_WRITE, flags, offset, data.len() as u32, data)
    }

    fn block_status(&mut self, offset: u64, len: u32, flags: u16) -> Vec<(u32, u32)> {
        self.cmd(CMD_BLOCK_STATUS, flags, offset, len).ok().status
    }
}

impl Assembly {
    fn new(req: Request) -> Assembly {
        let data = if req.command == CMD_READ {
            vec![0u8; req.len as usize]
        } else {
            Vec::new()
        };
        Assembly {
            req,
            errno: 0,
            message: String::new(),
            data,
            covered: Vec::new(),
            status: None,
            content_chunks: 0,
        }
    }

    /// Content chunks must lie inside the request and not overlap.
    fn cover(&mut self, offset: u64, len: u64) -> usize {
        let (start, end) = (self.req.offset, self.req.offset + self.req.len as u64);
        assert!(
            len > 0 && offset >= start && offset + len <= end,
            "content chunk {offset}+{len} outside {start}..{end}"
        );
        for &(o, l) in &self.covered {
            assert!(
                offset + len <= o || o + l <= offset,
                "content chunks overlap"
            );
        }
        self.covered.push((offset, len));
        self.content_chunks += 1;
        (offset - start) as usize
    }

    fn add(&mut self, kind: u16, flags: u16, payload: &[u8], meta_id: Option<u32>) {
        let is_read = self.req.command == CMD_READ;
        match kind {
            REPLY_TYPE_NONE => {
                assert!(
                    payload.is_empty() && flags & REPLY_FLAG_DONE != 0,
                    "bad NONE chunk"
                );
            }
            REPLY_TYPE_OFFSET_DATA => {
                assert!(is_read && payload.len() > 8, "bad OFFSET_DATA chunk");
                let at = self.cover(be64(payload), payload.len() as u64 - 8);
                self.data[at..at + payload.len() - 8].copy_from_slice(&payload[8..]);
            }
            REPLY_TYPE_OFFSET_HOLE => {
                assert!(is_read && payload.len() == 12, "bad OFFSET_HOLE chunk");
                let len = be32(&payload[8..]) as usize;
                let at = self.cover(be64(payload), len as u64);
                self.data[at..at + len].fill(0);
            }
            REPLY_TYPE_BLOCK_STATUS => {
                assert_eq!(
                    self.req.command, CMD_BLOCK_STATUS,
                    "status chunk for another command"
                );
                assert!(
                    payload.len() >= 12 && (payload.len() - 4) % 8 == 0,
                    "status chunk length {}",
                    payload.len()
                );
                assert_eq!(
                    Some(be32(payload)),
                    meta_id,
                    "status for a context not negotiated"
                );
                assert!(self.status.is_none(), "two status chunks for one context");
                let descs = payload[4..]
                    .chunks(8)
                    .map(|d| (be32(d), be32(&d[4..])))
                    .collect();
                self.status = Some(descs);
            }
            REPLY_TYPE_ERROR => {
                assert!(payload.len() >= 6, "short error chunk");
                let (errno, msg_len) = (be32(payload), be16(&payload[4..]) as usize);
                assert_ne!(errno, 0, "error chunk with errno 0");
                assert!(
                    6 + msg_len <= payload.len(),
                    "error message longer than its chunk"
                );
                self.message =
                    String::from_utf8(payload[6..6 + msg_len].to_vec()).expect("UTF-8 message");
                // The spec says SHOULD; ramd always explains its errors.
                assert!(
                    !self.message.is_empty(),
                    "structured error without a message"
                );
                self.errno = errno;
            }
            other => panic!("unexpected chunk type {other}"),
        }
    }

    fn finish(self) -> Reply {
        let req = self.req;
        if self.errno == 0 && req.command == CMD_READ {
            let covered: u64 = self.covered.iter().map(|c| c.1).sum();
            assert_eq!(
                covered, req.len as u64,
                "successful read does not cover the request"
            );
        }
        let status = self.status.unwrap_or_default();
        if self.errno == 0 && req.command == CMD_BLOCK_STATUS {
            check_descriptors(&req, &status);
        }
        Reply {
            command: req.command,
            errno: self.errno,
            message: self.message,
            data: self.data,
            status,
            content_chunks: self.content_chunks,
        }
    }
}

/// The spec's rules for block status descriptors.
fn check_descriptors(req: &Request, descs: &[(u32, u32)]) {
    assert!(!descs.is_empty(), "block status without descriptors");
    assert!(
        descs.iter().all(|d| d.0 > 0),
        "zero-length descriptor: {descs:?}"
    );
    if req.flags & CMD_FLAG_REQ_ONE != 0 {
        assert_eq!(descs.len(), 1, "REQ_ONE allows one descriptor: {descs:?}");
        assert!(
            descs[0].0 <= req.len,
            "REQ_ONE descriptor longer than the request"
        );
    } else {
        let before_last: u64 = descs[..descs.len() - 1].iter().map(|d| d.0 as u64).sum();
        assert!(
            before_last < req.len as u64,
            "descriptors continue past the request: {descs:?}"
        );
    }
}

const HOLE: u32 = STATE_HOLE | STATE_ZERO;
const DATA: u32 = 0;

/// Checks the transmission flags ramd should advertise.
fn assert_flags(flags: u16, read_only: bool, structured: bool) {
    assert_ne!(flags & TFLAG_HAS_FLAGS, 0, "HAS_FLAGS");
    assert_eq!(
        flags & TFLAG_READ_ONLY != 0,
        read_only,
        "READ_ONLY in {flags:#x}"
    );
    assert_eq!(flags & TFLAG_ROTATIONAL, 0, "RAM is not rotational");
    if !read_only {
        let want = TFLAG_SEND_FLUSH
            | TFLAG_SEND_FUA
            | TFLAG_SEND_TRIM
            | TFLAG_SEND_WRITE_ZEROES
            | TFLAG_SEND_FAST_ZERO
            | TFLAG_CAN_MULTI_CONN
            | TFLAG_SEND_CACHE;
        assert_eq!(flags & want, want, "flags {flags:#x}");
    } else {
        // Nothing that changes data is offered on a read-only export.
        let none =
            TFLAG_SEND_FUA | TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO;
        assert_eq!(flags & none, 0, "read-only flags {flags:#x}");
    }
    // SEND_DF must be clear without structured replies: checked only by
    // `send_df_is_advertised_only_with_structured_replies`, so one bug
    // fails one test.
    if structured {
        assert_ne!(flags & TFLAG_SEND_DF, 0, "SEND_DF with structured replies");
    }
}

fn assert_zero(bytes: &[u8]) {
    if let Some(i) = bytes.iter().position(|&b| b != 0) {
        panic!("byte {i} is {} where zeroes were expected", bytes[i]);
    }
}

// ---------------------------------------------------------------- handshake

#[test]
fn greeting_advertises_fixed_newstyle_and_no_zeroes() {
    let server = server();
    let mut c = server.connect();
    assert_eq!(c.greeting(), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
}

#[test]
fn bad_client_flags_close_the_connection() {
    let server = server();
    // Unknown bits; and clients that do not speak fixed newstyle.
    for flags in [
        CLIENT_FIXED_NEWSTYLE | 4,
        CLIENT_FIXED_NEWSTYLE | 1 << 31,
        0,
        CLIENT_NO_ZEROES,
    ] {
        let mut c = server.connect();
        c.greeting();
        c.send_client_flags(flags);
        c.expect_closed();
    }
}

#[test]
fn bad_option_magic_closes_the_connection() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    let mut msg = option_header(OPT_LIST, 0);
    msg[0] ^= 0xff;
    c.send_bytes(&msg);
    c.expect_closed();
}

#[test]
fn export_name_with_no_zeroes_sends_size_and_flags_only() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    c.send_option(OPT_EXPORT_NAME, b"ram0");
    let reply = c.recv_bytes(10);
    assert_eq!(be64(&reply), 40 * MIB);
    assert_flags(be16(&reply[8..]), false, false);
    // Transmission starts right after the flags: had 124 zero bytes been
    // sent, this reply would not start with a reply magic.
    assert_eq!(c.read(0, 16), vec![0; 16]);
}

#[test]
fn export_name_without_no_zeroes_sends_124_zero_bytes() {
    let server = server();
    let mut c = server.connect();
    c.greeting();
    c.send_client_flags(CLIENT_FIXED_NEWSTYLE);
    c.send_option(OPT_EXPORT_NAME, b"ro");
    let reply = c.recv_bytes(10 + 124);
    assert_eq!(be64(&reply), MIB);
    assert_flags(be16(&reply[8..]), true, false);
    assert_zero(&reply[10..]);
    assert_eq!(c.read(0, 16), vec![0; 16]);
}

#[test]
fn export_name_of_unknown_export_closes_the_connection() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    c.send_option(OPT_EXPORT_NAME, b"no-such-drive");
    c.expect_closed();
    // An oversized name is drained, then refused the same way.
    let mut c = server.connect();
    c.start_newstyle();
    c.send_option(OPT_EXPORT_NAME, &vec![b'x'; MAX_OPTION_BYTES as usize + 1]);
    c.expect_closed();
}

#[test]
fn abort_is_acknowledged_then_closed() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    c.option_ack(OPT_ABORT, &[]);
    c.expect_closed();
}

#[test]
fn list_names_every_export() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    let replies = c.option(OPT_LIST, &[]);
    let (servers, last) = replies.split_at(replies.len() - 1);
    assert_eq!(last[0].kind, REP_ACK);
    let mut listed: Vec<(String, String)> = servers
        .iter()
        .map(|r| {
            assert_eq!(r.kind, REP_SERVER, "{r:?}");
            let n = be32(&r.data) as usize;
            let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
            (text(&r.data[4..4 + n]), text(&r.data[4 + n..]))
        })
        .collect();
    listed.sort();
    let mut want: Vec<(String, String)> = DRIVES
        .iter()
        .map(|d| (d.name.to_owned(), d.description.to_owned()))
        .collect();
    want.sort();
    assert_eq!(listed, want);
    // LIST takes no data; the handshake goes on after refusing it.
    c.option_error(OPT_LIST, b"x", REP_ERR_INVALID);
    c.negotiate("ram0", SIMPLE);
    c.read(0, 1);
}

#[test]
fn starttls_is_unsupported_and_handshake_continues() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    c.option_error(OPT_STARTTLS, &[], REP_ERR_UNSUP);
    c.negotiate("ram0", SIMPLE);
    c.read(0, 1);
}

#[test]
fn info_and_go_report_name_description_and_block_size() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    let reqs = [INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE];
    for option in [OPT_INFO, OPT_GO] {
        let (size, flags, replies) = c.info_or_go(option, "tiny", &reqs);
        assert_eq!(size, MIB);
        assert_flags(flags, false, false);
        let info = |kind| {
            replies
                .iter()
                .find_map(|r| r.info(kind))
                .unwrap_or_else(|| panic!("no info {kind} in {replies:?}"))
        };
        assert_eq!(info(INFO_NAME), b"tiny");
        assert_eq!(info(INFO_DESCRIPTION), b"two pages of memory");
        let bs = info(INFO_BLOCK_SIZE);
        assert_eq!(bs.len(), 12);
        // Any alignment works, 4 KiB is best, 32 MiB is the payload limit.
        assert_eq!(
            (be32(bs), be32(&bs[4..]), be32(&bs[8..])),
            (1, 4096, 32 << 20)
        );
        assert!(replies
            .iter()
            .all(|r| r.kind == REP_INFO || r.kind == REP_ACK));
    }
    // After GO, transmission on "tiny".
    c.write(0, b"hello");
    assert_eq!(c.read(0, 5), b"hello");
}

#[test]
fn info_or_go_on_unknown_export_is_refused_and_handshake_continues() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    c.option_error(OPT_INFO, &info_request("nope", &[]), REP_ERR_UNKNOWN);
    c.option_error(OPT_GO, &info_request("nope", &[INFO_NAME]), REP_ERR_UNKNOWN);
    c.negotiate("ram0", SIMPLE);
    assert_eq!(c.size, 40 * MIB);
}

#[test]
fn empty_name_selects_the_default_export() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    let (size, _, replies) = c.info_or_go(OPT_INFO, "", &[INFO_NAME]);
    assert_eq!(size, 40 * MIB);
    assert_eq!(
        replies.iter().find_map(|r| r.info(INFO_NAME)),
        Some(&b"ram0"[..])
    );
    c.negotiate("", SIMPLE);
    c.write(MIB, b"default");
    // The same bytes through the canonical name.
    let mut other = server.open("ram0", SIMPLE);
    assert_eq!(other.read(MIB, 7), b"default");
    // And through NBD_OPT_EXPORT_NAME with an empty name.
    let mut old = server.connect();
    old.start_newstyle();
    old.send_option(OPT_EXPORT_NAME, b"");
    assert_eq!(be64(&old.recv_bytes(10)), 40 * MIB);
    assert_eq!(old.read(MIB, 7), b"default");
}

#[test]
fn structured_reply_is_acknowledged_and_takes_no_data() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    c.option_error(OPT_STRUCTURED_REPLY, b"x", REP_ERR_INVALID);
    c.option_ack(OPT_STRUCTURED_REPLY, &[]);
    let (_, flags, _) = c.info_or_go(OPT_GO, "ram0", &[]);
    assert_flags(flags, false, true);
    c.structured = true;
    assert_eq!(c.read(0, 3), vec![0; 3]);
}

#[test]
fn list_meta_context_offers_base_allocation() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    c.option_ack(OPT_STRUCTURED_REPLY, &[]);
    // No query lists everything; "base:" lists the namespace.
    let queries: [&[&str]; 3] = [&[], &["base:"], &[META_BASE_ALLOCATION]];
    for queries in queries {
        let replies = c.option(OPT_LIST_META_CONTEXT, &meta_request("ram0", queries));
        assert_eq!(replies.len(), 2, "{queries:?}: {replies:?}");
        assert_eq!(replies[0].kind, REP_META_CONTEXT);
        assert_eq!(&replies[0].data[4..], META_BASE_ALLOCATION.as_bytes());
        assert_eq!(replies[1].kind, REP_ACK);
    }
    // Unknown namespaces match nothing: just the ACK.
    c.option_ack(
        OPT_LIST_META_CONTEXT,
        &meta_request("ram0", &["x-other:thing"]),
    );
    // Unknown export.
    c.option_error(
        OPT_LIST_META_CONTEXT,
        &meta_request("nope", &[]),
        REP_ERR_UNKNOWN,
    );
    c.negotiate("ram0", STRUCTURED);
    assert_eq!(c.block_status(0, 4096, 0), vec![(4096, HOLE)]);
}

#[test]
fn set_meta_context_needs_structured_replies() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    let data = meta_request("ram0", &[META_BASE_ALLOCATION]);
    c.option_error(OPT_SET_META_CONTEXT, &data, REP_ERR_INVALID);
    c.negotiate("ram0", STRUCTURED);
    assert_eq!(c.block_status(0, 512, 0), vec![(512, HOLE)]);
}

#[test]
fn set_meta_context_selects_base_allocation() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    c.option_ack(OPT_STRUCTURED_REPLY, &[]);
    // Selecting nothing is not an error.
    c.option_ack(OPT_SET_META_CONTEXT, &meta_request("ram0", &[]));
    c.option_ack(
        OPT_SET_META_CONTEXT,
        &meta_request("ram0", &["x-other:thing"]),
    );
    // `negotiate` sets base:allocation, checks the reply and keeps the id
    // the client then expects in every status chunk.
    c.negotiate("ram0", STRUCTURED);
    assert!(c.meta_id.is_some());
    c.write(4096, &[1; 4096]);
    assert_eq!(
        c.block_status(0, 3 * 4096, 0),
        vec![(4096, HOLE), (4096, DATA), (4096, HOLE)]
    );
}

/// Contexts are chosen for one export; GO to another one drops them.
#[test]
fn meta_context_for_another_export_is_dropped_at_go() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    c.option_ack(OPT_STRUCTURED_REPLY, &[]);
    let replies = c.option(
        OPT_SET_META_CONTEXT,
        &meta_request("small", &[META_BASE_ALLOCATION]),
    );
    assert_eq!(replies.len(), 2);
    c.negotiate("ram0", STRUCTURED_NO_META);
    c.cmd(CMD_BLOCK_STATUS, 0, 0, 4096).err(EINVAL);
}

#[test]
fn unknown_options_are_unsupported_and_handshake_continues() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    // 11 is NBD_OPT_EXTENDED_HEADERS, which ramd does not implement.
    for option in [99, 11, 4, u32::MAX] {
        c.option_error(option, b"some data", REP_ERR_UNSUP);
    }
    c.negotiate("ram0", SIMPLE);
    c.read(0, 1);
}

#[test]
fn malformed_option_data_is_invalid_and_handshake_continues() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    let good = info_request("ram0", &[INFO_NAME]);
    let mut trailing = good.clone();
    trailing.push(0);
    let mut lying = good.clone();
    lying[..4].copy_from_slice(&100u32.to_be_bytes());
    let bad_info: [&[u8]; 5] = [&good[..3], &good[..good.len() - 1], &trailing, &lying, &[]];
    for data in bad_info {
        c.option_error(OPT_INFO, data, REP_ERR_INVALID);
        c.option_error(OPT_GO, data, REP_ERR_INVALID);
    }
    c.option_ack(OPT_STRUCTURED_REPLY, &[]);
    let meta = meta_request("ram0", &[META_BASE_ALLOCATION]);
    let mut meta_trailing = meta.clone();
    meta_trailing.push(0);
    for data in [&meta[..meta.len() - 2], &meta_trailing[..], &meta[..6]] {
        c.option_error(OPT_LIST_META_CONTEXT, data, REP_ERR_INVALID);
        c.option_error(OPT_SET_META_CONTEXT, data, REP_ERR_INVALID);
    }
    c.negotiate("ram0", STRUCTURED);
    c.read(0, 1);
}

#[test]
fn oversized_option_is_drained_and_refused() {
    let server = server();
    let mut c = server.connect();
    c.start_newstyle();
    for (option, len) in [
        (OPT_INFO, MAX_OPTION_BYTES + 1),
        (OPT_LIST, 3 * MIB as u32),
        (99, MAX_OPTION_BYTES + 7),
    ] {
        // Valid-looking bytes, so a server that did not drain them all would
        // read a misplaced option header and close the connection.
        c.option_error(option, &vec![0u8; len as usize], REP_ERR_TOO_BIG);
    }
    c.negotiate("ram0", SIMPLE);
    c.read(0, 1);
}

/// proto.md, transmission flags: the server "MUST leave [SEND_DF] clear if
/// structured replies have not been negotiated".
#[test]
fn send_df_is_advertised_only_with_structured_replies() {
    let server = server();
    for opts in [SIMPLE, STRUCTURED] {
        let c = server.open("ram0", opts);
        assert_eq!(
            c.flags & TFLAG_SEND_DF != 0,
            opts.structured,
            "GO with {opts:?}: flags {:#x}",
            c.flags
        );
    }
    let mut c = server.connect();
    c.start_newstyle();
    c.send_option(OPT_EXPORT_NAME, b"ram0");
    let flags = be16(&c.recv_bytes(10)[8..]);
    assert_eq!(
        flags & TFLAG_SEND_DF,
        0,
        "EXPORT_NAME without structured replies: flags {flags:#x}"
    );
}

// ------------------------------------------------------------- transmission

/// Every command's success path, in one mode of replies.
fn exercise_data_path(opts: Opts) {
    let server = server();
    let mut c = server.open("ram0", opts);
    assert_flags(c.flags, false, opts.structured);
    assert_eq!(c.size, 40 * MIB);

    // Never-written space reads as zeroes; a zero-length read is empty.
    assert_zero(&c.read(0, 3 * 4096));
    assert!(c.read(100, 0).is_empty());

    // Unaligned write across pages, read back whole and in unaligned parts.
    let data = pattern(10_000, 1);
    c.write(4095, &data);
    assert_eq!(c.read(4095, 10_000), data);
    assert_eq!(c.read(5000, 333), &data[905..905 + 333]);
    assert_zero(&c.read(4000, 95));
    assert_zero(&c.read(4095 + 10_000, 100));

    // FUA write, then FLUSH.
    c.write_flags(70_001, &pattern(1234, 2), CMD_FLAG_FUA).ok();
    c.cmd(CMD_FLUSH, 0, 0, 0).ok();
    assert_eq!(c.read(70_001, 1234), pattern(1234, 2));

    // TRIM of the middle page of three: it reads as zeroes.
    let base = MIB;
    let three = pattern(3 * 4096, 3);
    c.write(base, &three);
    c.cmd(CMD_TRIM, 0, base + 4096, 4096).ok();
    let back = c.read(base, 3 * 4096);
    assert_eq!(&back[..4096], &three[..4096]);
    assert_zero(&back[4096..8192]);
    assert_eq!(&back[8192..], &three[8192..]);

    // WRITE_ZEROES: NO_HOLE, FAST_ZERO, FUA and plain all read back zero.
    let zeroes = [CMD_FLAG_NO_HOLE, CMD_FLAG_FAST_ZERO, CMD_FLAG_FUA, 0];
    for (i, flags) in zeroes.into_iter().enumerate() {
        let at = 2 * MIB + i as u64 * 8192;
        c.write(at, &pattern(8192, 4));
        c.cmd(CMD_WRITE_ZEROES, flags, at + 100, 5000).ok();
        let back = c.read(at, 8192);
        assert_eq!(&back[..100], &pattern(8192, 4)[..100]);
        assert_zero(&back[100..5100]);
        assert_eq!(&back[5100..], &pattern(8192, 4)[5100..]);
    }

    // CACHE is accepted (RAM is always resident).
    c.cmd(CMD_CACHE, 0, 0, 65536).ok();

    if opts.structured {
        // TRIM left a hole; NO_HOLE zeroes keep pages allocated.
        assert_eq!(
            c.block_status(base, 3 * 4096, 0),
            vec![(4096, DATA), (4096, HOLE), (4096, DATA)]
        );
        c.cmd(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, base, 3 * 4096)
            .ok();
        assert_eq!(c.block_status(base, 3 * 4096, 0), vec![(3 * 4096, DATA)]);
        c.cmd(CMD_WRITE_ZEROES, 0, base, 3 * 4096).ok();
        assert_eq!(c.block_status(base, 3 * 4096, 0), vec![(3 * 4096, HOLE)]);
        // DF: the read arrives as exactly one content chunk.
        let r = c.cmd(CMD_READ, CMD_FLAG_DF, 4095, 10_000).ok();
        assert_eq!(r.content_chunks, 1);
        assert_eq!(r.data, data);
    } else {
        c.cmd(CMD_BLOCK_STATUS, 0, 0, 4096).err(EINVAL);
        c.cmd(CMD_READ, CMD_FLAG_DF, 4095, 10_000).err(EINVAL);
    }
    // The connection is still fine after errors.
    assert_eq!(c.read(4095, 10_000), data);
}

#[test]
fn data_path_with_simple_replies() {
    exercise_data_path(SIMPLE);
}

#[test]
fn data_path_with_structured_replies() {
    exercise_data_path(STRUCTURED);
}

#[test]
fn block_status_reports_holes_and_data() {
    let server = server();
    let mut c = server.open("ram0", STRUCTURED);
    let size = c.size as u32;
    assert_eq!(c.block_status(0, size, 0), vec![(size, HOLE)]);
    c.write(8192, &[9; 4096]);
    c.write(5 * 4096 + 7, &[9; 3]);
    assert_eq!(
        c.block_status(0, size, 0),
        vec![
            (8192, HOLE),
            (4096, DATA),
            (8192, HOLE),
            (4096, DATA),
            (size - 24576, HOLE)
        ]
    );
    // Unaligned start and length.
    assert_eq!(
        c.block_status(100, 8192, 0),
        vec![(8092, HOLE), (100, DATA)]
    );
    // REQ_ONE: only the first extent, never longer than the request.
    assert_eq!(
        c.block_status(0, size, CMD_FLAG_REQ_ONE),
        vec![(8192, HOLE)]
    );
    assert_eq!(c.block_status(8200, 10, CMD_FLAG_REQ_ONE), vec![(10, DATA)]);
    assert_eq!(
        c.block_status(size as u64 - 1, 1, CMD_FLAG_REQ_ONE),
        vec![(1, HOLE)]
    );
}

#[test]
fn disconnect_answers_earlier_requests_then_closes() {
    for opts in [SIMPLE, STRUCTURED] {
        let server = server();
        let mut c = server.open("ram0", opts);
        let w = c.send(CMD_WRITE, 0, 512, 4, b"disc");
        let r = c.send(CMD_READ, 0, 510, 8, &[]);
        c.send(CMD_DISC, 0, 0, 0, &[]);
        let mut replies: HashMap<u64, Reply> = (0..2).map(|_| c.recv()).collect();
        replies.remove(&w).expect("write reply").ok();
        assert_eq!(
            replies.remove(&r).expect("read reply").ok().data,
            b"\0\0disc\0\0"
        );
        c.expect_closed();
        // The write is kept.
        assert_eq!(server.open("ram0", opts).read(512, 4), b"disc");
    }
}

/// proto.md, command flags: FUA "is valid for all commands, provided
/// NBD_FLAG_SEND_FUA has been negotiated, in which case the server MUST
/// accept all commands with this bit set (even by ignoring the bit)".
#[test]
fn fua_is_accepted_on_every_command() {
    let server = server();
    let mut c = server.open("ram0", STRUCTURED);
    assert_ne!(c.flags & TFLAG_SEND_FUA, 0);
    let mut refused = Vec::new();
    for command in [
        CMD_READ,
        CMD_WRITE,
        CMD_FLUSH,
        CMD_TRIM,
        CMD_CACHE,
        CMD_WRITE_ZEROES,
        CMD_BLOCK_STATUS,
    ] {
        let (offset, len) = if command == CMD_FLUSH {
            (0, 0)
        } else {
            (4096, 16)
        };
        let payload = if command == CMD_WRITE {
            &[5u8; 16][..]
        } else {
            &[]
        };
        let r = c.call(command, CMD_FLAG_FUA, offset, len, payload);
        if r.errno != 0 {
            refused.push(format!("{}: {}", command_name(command), r.message));
        }
    }
    assert!(refused.is_empty(), "FUA refused: {refused:#?}");
}

/// WRITEs bigger than the server's input buffer (whose payload cannot all
/// have arrived when the header is parsed), unaligned, with and without FUA.
#[test]
fn large_writes_are_stored() {
    for opts in [SIMPLE, STRUCTURED] {
        let server = server();
        let mut c = server.open("ram0", opts);
        let data = pattern(3 * MIB as usize + 5, 6);
        c.write(12_345, &data);
        c.write_flags(8 * MIB + 1, &data, CMD_FLAG_FUA).ok();
        assert!(c.read(12_345, data.len() as u32) == data);
        assert!(c.read(8 * MIB + 1, data.len() as u32) == data);
        assert_zero(&c.read(12_345 + data.len() as u64, 4096));
        // The limit itself is accepted.
        let max = vec![7u8; MAX_PAYLOAD_BYTES as usize];
        c.write(0, &max);
        assert!(c.read(0, MAX_PAYLOAD_BYTES) == max);
    }
}

/// A large WRITE refused part-way (the drive's memory limit) has the rest of
/// its payload drained: the next request is parsed where it begins.
#[test]
fn large_write_beyond_memory_limit_is_enospc_and_drained() {
    for opts in [SIMPLE, STRUCTURED] {
        let server = server();
        let mut c = server.open("tiny", opts);
        c.write(0, &[1; 10]);
        // The payload is made of request headers: were any of it parsed as
        // requests, the replies would not match.
        let fake = header_bytes(CMD_WRITE, 0, 0, 0);
        let payload: Vec<u8> = fake.iter().copied().cycle().take(MIB as usize).collect();
        let w = c.send(CMD_WRITE, 0, 0, MIB as u32, &payload);
        let (cookie, reply) = c.recv();
        assert_eq!(cookie, w);
        reply.err(ENOSPC);
        c.write(4096, &[2; 10]);
        c.cmd(CMD_FLUSH, 0, 0, 0).ok();
        assert_eq!(c.read(4096, 10), [2; 10]);
    }
}

/// A client that stops in the middle of a large WRITE's payload (slow
/// network, or on purpose) must not stall other connections to the drive:
/// they read and write the same range meanwhile.
#[test]
fn stalled_writer_does_not_block_other_connections() {
    // Both are streamed through the connection's bounce buffer, written
    // piece by piece as they arrive: no store lock may be held while
    // waiting for the rest.
    for size in [MIB, 8 * MIB] {
        stalled_writer_case(size);
    }
}

fn stalled_writer_case(size: u64) {
    let server = server();
    let mut stalled = server.open("ram0", SIMPLE);
    let data = pattern(size as usize, 8);
    let w = stalled.send(CMD_WRITE, 0, 0, size as u32, &data[..100_000]);
    stalled.wait_until_consumed();
    // A head start for its connection thread to reach the wait for the rest
    // of the payload. Not needed for the test to pass: on a busy machine
    // the other connection may come first, which only tests less.
    thread::sleep(Duration::from_millis(50));
    let mut other = server.open("ram0", STRUCTURED);
    // The read must not wait for the stalled client. What it sees of a write
    // still in flight is old or new bytes (the spec leaves overlapping
    // unacknowledged requests unordered), never anything else.
    let seen = other.read(0, size as u32);
    for (i, (&got, &new)) in seen.iter().zip(&data).enumerate() {
        assert!(
            got == 0 || got == new,
            "byte {i} is {got}: neither old nor new"
        );
    }
    other.write(200_000, b"meanwhile");
    // The stalled write completes when the rest arrives.
    stalled.send_bytes(&data[100_000..]);
    let (cookie, reply) = stalled.recv();
    assert_eq!(cookie, w);
    reply.ok();
    assert!(other.read(0, size as u32) == data);
}

/// A client that asks for a large READ and then stops reading (its socket
/// fills up) must not stall writers to the same range: the server waits for
/// room with no store lock held. The reply it finally gets holds, per byte,
/// the old or the new data.
#[test]
fn stalled_reader_does_not_block_other_connections() {
    let server = server();
    let mut setup = server.open("ram0", SIMPLE);
    let old = pattern(32 * MIB as usize, 3);
    setup.write(0, &old);
    for opts in [SIMPLE, STRUCTURED] {
        let mut stalled = server.open("ram0", opts);
        let r = stalled.send(CMD_READ, 0, 0, 32 * MIB as u32, &[]);
        // Its connection thread is in the reply (which cannot fit the
        // socket) once the first bytes have come.
        wait_until("the first bytes of the reply", WAIT_TIMEOUT, || {
            stalled.unread_bytes() > 0
        });
        let mut other = server.open("ram0", STRUCTURED);
        let new = pattern(2 * MIB as usize, 4);
        other.write(MIB, &new);
        other.write(30 * MIB, &new);
        let (cookie, reply) = stalled.recv();
        assert_eq!(cookie, r);
        let data = reply.ok().data;
        assert_eq!(data.len(), 32 * MIB as usize);
        for (at, w) in [(MIB as usize, &new), (30 * MIB as usize, &new)] {
            for (i, &b) in data[at..at + w.len()].iter().enumerate() {
                assert!(
                    b == old[at + i] || b == w[i],
                    "byte {} neither old nor new",
                    at + i
                );
            }
        }
        assert!(data[..MIB as usize] == old[..MIB as usize]);
        // Put the old bytes back for the next round.
        other.write(MIB, &old[MIB as usize..3 * MIB as usize]);
        other.write(30 * MIB, &old[30 * MIB as usize..32 * MIB as usize]);
    }
}

// ------------------------------------------------------------------- errors

#[test]
fn unknown_command_is_einval_and_connection_continues() {
    for opts in [SIMPLE, STRUCTURED] {
        let server = server();
        let mut c = server.open("ram0", opts);
        for command in [8, 9, 42, u16::MAX] {
            c.cmd(command, 0, 0, 0).err(EINVAL);
        }
        c.write(0, b"still here");
        assert_eq!(c.read(0, 10), b"still here");
    }
}

#[test]
fn invalid_flags_are_einval() {
    for opts in [SIMPLE, STRUCTURED] {
        let server = server();
        let mut c = server.open("ram0", opts);
        let bad = [
            (CMD_READ, CMD_FLAG_NO_HOLE),
            (CMD_READ, CMD_FLAG_REQ_ONE),
            (CMD_READ, 1 << 15),
            (CMD_TRIM, CMD_FLAG_NO_HOLE),
            (CMD_FLUSH, CMD_FLAG_DF),
            (CMD_CACHE, CMD_FLAG_REQ_ONE),
            (CMD_WRITE_ZEROES, CMD_FLAG_DF),
            (CMD_BLOCK_STATUS, CMD_FLAG_NO_HOLE),
        ];
        for (command, flags) in bad {
            c.cmd(command, flags, 0, 16).err(EINVAL);
        }
        // A refused WRITE still has its payload consumed, and not stored.
        c.write_flags(0, &[7; 100], CMD_FLAG_REQ_ONE).err(EINVAL);
        c.write_flags(0, &[7; 100], CMD_FLAG_FAST_ZERO).err(EINVAL);
        assert_zero(&c.read(0, 100));
    }
}

#[test]
fn df_without_structured_replies_is_einval() {
    let server = server();
    let mut c = server.open("ram0", SIMPLE);
    c.cmd(CMD_READ, CMD_FLAG_DF, 0, 512).err(EINVAL);
    c.read(0, 512);
}

#[test]
fn block_status_without_meta_context_is_einval() {
    for opts in [SIMPLE, STRUCTURED_NO_META] {
        let server = server();
        let mut c = server.open("ram0", opts);
        c.cmd(CMD_BLOCK_STATUS, 0, 0, 4096).err(EINVAL);
        c.read(0, 512);
    }
}

#[test]
fn out_of_range_requests_are_refused() {
    for opts in [SIMPLE, STRUCTURED] {
        let server = server();
        let mut c = server.open("small", opts);
        let size = c.size;
        let past = [(size - 10, 11), (size, 1), (size + 4096, 0)];
        for (offset, len) in past {
            c.cmd(CMD_READ, 0, offset, len).err(EINVAL);
            c.call(CMD_WRITE, 0, offset, len, &vec![1; len as usize])
                .err(ENOSPC);
            c.cmd(CMD_TRIM, 0, offset, len).err(EINVAL);
            c.cmd(CMD_WRITE_ZEROES, 0, offset, len).err(ENOSPC);
            c.cmd(CMD_CACHE, 0, offset, len).err(EINVAL);
            if opts.meta {
                c.cmd(CMD_BLOCK_STATUS, 0, offset, len.max(1)).err(EINVAL);
            }
        }
        // offset + length overflows u64: an error, not a panic.
        for offset in [u64::MAX, u64::MAX - 50] {
            c.cmd(CMD_READ, 0, offset, 100).err(EINVAL);
            c.call(CMD_WRITE, 0, offset, 100, &[1; 100]).err(ENOSPC);
            c.cmd(CMD_TRIM, 0, offset, 100).err(EINVAL);
            c.cmd(CMD_WRITE_ZEROES, 0, offset, 100).err(ENOSPC);
        }
        // Exactly up to the end is fine.
        c.write(size - 3, b"end");
        assert_eq!(c.read(size - 3, 3), b"end");
        if opts.meta {
            // Zero-length status is refused rather than answered with nothing.
            c.cmd(CMD_BLOCK_STATUS, 0, 0, 0).err(EINVAL);
        }
    }
}

#[test]
fn oversized_read_is_einval() {
    for opts in [SIMPLE, STRUCTURED] {
        let server = server();
        let mut c = server.open("ram0", opts);
        c.cmd(CMD_READ, 0, 0, MAX_PAYLOAD_BYTES + 1).err(EINVAL);
        c.cmd(CMD_READ, 0, 0, u32::MAX).err(EINVAL);
        // The limit itself is allowed.
        assert_eq!(
            c.read(0, MAX_PAYLOAD_BYTES).len(),
            MAX_PAYLOAD_BYTES as usize
        );
    }
}

#[test]
fn oversized_write_is_drained_and_connection_continues() {
    for opts in [SIMPLE, STRUCTURED] {
        let server = server();
        let mut c = server.open("ram0", opts);
        let len = 33 << 20;
        // The payload is a request header repeated: were any of it parsed as
        // requests, the replies would not match.
        let fake = header_bytes(CMD_WRITE, 0, 0, 0);
        let payload: Vec<u8> = fake.iter().copied().cycle().take(len).collect();
        let w = c.send(CMD_WRITE, 0, 0, len as u32, &payload);
        let r = c.send(CMD_READ, 0, 0, 4096, &[]);
        let (cookie, reply) = c.recv();
        assert_eq!(cookie, w);
        reply.err(EINVAL);
        let (cookie, reply) = c.recv();
        assert_eq!(cookie, r);
        assert_zero(&reply.ok().data);
        c.write(0, b"after");
        assert_eq!(c.read(0, 5), b"after");
    }
}

#[test]
fn read_only_export_refuses_changes_with_eperm() {
    for opts in [SIMPLE, STRUCTURED] {
        let server = server();
        let mut c = server.open("ro", opts);
        assert_flags(c.flags, true, opts.structured);
        c.write_flags(0, b"nope", 0).err(EPERM);
        c.write_flags(0, b"nope", CMD_FLAG_FUA).err(EPERM);
        c.cmd(CMD_TRIM, 0, 0, 4096).err(EPERM);
        c.cmd(CMD_WRITE_ZEROES, 0, 0, 4096).err(EPERM);
        c.cmd(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 4096)
            .err(EPERM);
        // Reads, flushes and cache still work; the refused write stored nothing.
        assert_zero(&c.read(0, 4));
        c.cmd(CMD_FLUSH, 0, 0, 0).ok();
        c.cmd(CMD_CACHE, 0, 0, 4096).ok();
    }
}

#[test]
fn memory_limit_gives_enospc_but_overwrites_work() {
    for opts in [SIMPLE, STRUCTURED] {
        let server = server();
        let mut c = server.open("tiny", opts);
        c.write(0, &[1; 4096]);
        c.write(4096, &[2; 4096]);
        // A third fresh page does not fit in the two-page limit.
        c.write_flags(8192, &[3], 0).err(ENOSPC);
        c.cmd(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 3 * 4096, 1)
            .err(ENOSPC);
        // Overwrites of allocated pages still work, across both pages too.
        c.write(100, &[4; 200]);
        c.write(4000, &[5; 200]);
        let back = c.read(0, 8192);
        assert_eq!(&back[100..300], &[4; 200][..]);
        assert_eq!(&back[4000..4200], &[5; 200][..]);
        assert_zero(&c.read(8192, 1));
        // Freeing a page makes room again.
        c.cmd(CMD_TRIM, 0, 0, 4096).ok();
        c.write(8192, &[3]);
        assert_eq!(c.read(8192, 1), [3]);
    }
}

#[test]
fn bad_request_magic_closes_only_that_connection() {
    let server = server();
    let mut other = server.open("ram0", SIMPLE);
    let mut c = server.open("ram0", SIMPLE);
    // A good request, then garbage: the first is answered, then the close.
    let w = c.send(CMD_WRITE, 0, 0, 5, b"first");
    let mut bad = header_bytes(CMD_READ, 0, 0, 1);
    bad[0] ^= 0x80;
    c.send_bytes(&bad);
    let (cookie, reply) = c.recv();
    assert_eq!(cookie, w);
    reply.ok();
    c.expect_closed();
    // Other connections, old and new, are unaffected.
    assert_eq!(other.read(0, 5), b"first");
    assert_eq!(server.open("ram0", STRUCTURED).read(0, 5), b"first");
}

#[test]
fn client_vanishing_mid_message_does_not_hurt_the_server() {
    let server = server();
    // Half a request header.
    let mut c = server.open("ram0", SIMPLE);
    c.send_bytes(&header_bytes(CMD_READ, 0, 0, 1)[..14]);
    drop(c);
    // A write header with half its payload, small and large. A large one
    // (64 KiB and more) is received straight into the drive, so like a
    // disk's unacknowledged write it may be torn; a small one is gathered
    // first and stores nothing.
    for (offset, len) in [(4096, 61440), (MIB, 3 * MIB as u32)] {
        let mut c = server.open("ram0", STRUCTURED);
        c.send_bytes(&header_bytes(CMD_WRITE, 0, offset, len));
        c.send_bytes(&vec![9; len as usize / 2]);
        drop(c);
    }
    // Half an option header, and half an option's data.
    let mut c = server.connect();
    c.start_newstyle();
    c.send_bytes(&option_header(OPT_GO, 100)[..10]);
    drop(c);
    let mut c = server.connect();
    c.start_newstyle();
    c.send_bytes(&option_header(OPT_GO, 100));
    c.send_bytes(&[0; 50]);
    drop(c);
    // The server still serves, and the half-sent small write stored nothing.
    let mut c = server.open("ram0", SIMPLE);
    assert_zero(&c.read(4096, 61440));
}

#[test]
fn flood_of_pipelined_requests_gets_every_reply() {
    const N: u64 = 10_000;
    let server = server();
    let mut c = server.open("ram0", SIMPLE);
    // All requests first, in one go, then all replies. Every reply here is
    // a 16-byte header (160 KB in all), which fits the socket buffers, so a
    // client that does not read yet cannot stall a correct server.
    let mut batch = Vec::new();
    let mut sent = BTreeSet::new();
    for i in 0..N {
        let cookie = match i % 4 {
            0 | 1 => c.queue(&mut batch, CMD_WRITE, 0, i * 8, 8, &i.to_be_bytes()),
            2 => c.queue(&mut batch, CMD_FLUSH, 0, 0, 0, &[]),
            _ => c.queue(&mut batch, CMD_READ, 0, i * 8, 0, &[]),
        };
        sent.insert(cookie);
    }
    c.send_bytes(&batch);
    let mut answered = BTreeSet::new();
    for _ in 0..N {
        let (cookie, reply) = c.recv();
        reply.ok();
        assert!(
            answered.insert(cookie),
            "two replies for cookie {cookie:#x}"
        );
    }
    assert_eq!(answered, sent);
    // Every write landed where it should.
    let back = c.read(0, (N * 8) as u32);
    for i in (0..N).filter(|i| i % 4 < 2) {
        let at = (i * 8) as usize;
        assert_eq!(be64(&back[at..]), i, "write {i}");
    }
}

#[test]
fn concurrent_connections_share_one_drive() {
    const CONNS: usize = 4;
    const REGION: u64 = 100_003;
    let server = server();
    let barrier = Barrier::new(CONNS);
    thread::scope(|s| {
        for id in 0..CONNS {
            let (server, barrier) = (&server, &barrier);
            s.spawn(move || {
                let mut c = server.open("ram0", if id % 2 == 0 { SIMPLE } else { STRUCTURED });
                assert_ne!(c.flags & TFLAG_CAN_MULTI_CONN, 0);
                let mine = pattern(REGION as usize, id as u64);
                for (i, piece) in mine.chunks(30_000).enumerate() {
                    c.write(id as u64 * REGION + i as u64 * 30_000, piece);
                }
                c.cmd(CMD_FLUSH, 0, 0, 0).ok();
                // Everybody has written and flushed: read everybody's bytes.
                barrier.wait();
                for other in 0..CONNS {
                    let got = c.read(other as u64 * REGION, REGION as u32);
                    assert!(
                        got == pattern(REGION as usize, other as u64),
                        "connection {id} reads region {other}"
                    );
                }
            });
        }
    });
}

#[test]
fn connection_cap_closes_extra_connections() {
    let server = server_with(|c| c.max_connections = 2);
    let mut first = server.open("ram0", SIMPLE);
    // The second is tracked once it has been greeted.
    let mut second = server.connect();
    second.greeting();
    let mut third = server.connect();
    third.expect_closed();
    // The two admitted ones work.
    second.send_client_flags(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
    second.negotiate("ram0", SIMPLE);
    second.write(0, b"two");
    assert_eq!(first.read(0, 3), b"two");
    // When one leaves, a new client gets its place (once the server has
    // noticed, hence the bounded retries).
    drop(first);
    let mut admitted = None;
    wait_until("a connection admitted after one left", WAIT_TIMEOUT, || {
        let mut c = server.connect();
        admitted = c.try_greeting().map(|_| c);
        admitted.is_some()
    });
    let mut next = admitted.unwrap();
    next.send_client_flags(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
    next.negotiate("ram0", SIMPLE);
    assert_eq!(next.read(0, 3), b"two");
}

#[test]
fn tcp_listener_serves_the_same_protocol() {
    let server = server_with(|c| c.tcp = vec!["127.0.0.1:0".parse().unwrap()]);
    assert_eq!(server.tcp.len(), 1);
    assert_ne!(
        server.tcp[0].port(),
        0,
        "tcp_addrs() reports the bound port"
    );
    let mut c = Client::tcp(server.tcp[0]);
    c.start_newstyle();
    c.negotiate("ram0", STRUCTURED);
    c.write(4096, b"over tcp");
    assert_eq!(c.read(4096, 8), b"over tcp");
    assert_eq!(c.block_status(0, 8192, 0), vec![(4096, HOLE), (4096, DATA)]);
    // Same drive through the unix socket.
    assert_eq!(server.open("ram0", SIMPLE).read(4096, 8), b"over tcp");
}

#[test]
fn shutdown_answers_pending_requests_then_returns() {
    // Bounded so the replies fit the socket buffer even when the server
    // answers one request per batch (each small write costs ~1 KiB of
    // buffer accounting): this client reads no reply until it has sent all.
    const N: u64 = 64;
    let mut server = server();
    let mut c = server.open("ram0", STRUCTURED);
    let mut idle = server.open("small", SIMPLE);
    let mut cookies = Vec::new();
    // Replies stay small (the reads are 64 bytes) so that they fit in the
    // socket buffer while this client is still sending.
    for i in 0..N {
        cookies.push(c.send(CMD_WRITE, 0, i * 4096, 4096, &pattern(4096, i)));
        cookies.push(c.send(CMD_READ, 0, i * 4096, 64, &[]));
    }
    cookies.push(c.send(CMD_FLUSH, 0, 0, 0, &[]));
    // Everything is in the server's socket buffer; now stop.
    server.shutdown.shutdown();
    for (n, want) in cookies.iter().enumerate() {
        let (cookie, reply) = c.recv();
        assert_eq!(cookie, *want);
        let reply = reply.ok();
        if n % 2 == 1 && n < 2 * N as usize {
            assert_eq!(reply.data, pattern(64, (n / 2) as u64));
        }
    }
    c.expect_closed();
    idle.expect_closed();
    server.stop().expect("run() returns Ok after shutdown");
    assert!(!server.socket.exists(), "the unix socket is removed");
}

// ------------------------------------------------------------------ fuzzing

/// Proptest configuration: a fixed seed so runs are reproducible (set
/// PROPTEST_RNG_SEED to explore others), no regression files in the tree.
fn fuzz_config(cases: u32) -> Config {
    let base = Config::default();
    let rng_seed = match base.rng_seed {
        RngSeed::Random => RngSeed::Fixed(0x00f0_220d),
        fixed => fixed,
    };
    Config {
        cases,
        rng_seed,
        failure_persistence: None,
        max_shrink_iters: 64,
        ..base
    }
}

/// Sends `bytes` from one thread while another reads everything the server
/// says, until the server closes; then checks it still serves others.
fn feed_and_drain(server: &TestServer, mut c: Client, bytes: Vec<u8>) {
    let panics_before = server_panic_count();
    let mut writer = c.wire.clone_wire();
    thread::scope(|s| {
        s.spawn(move || {
            // The server may close first (bad magic): write errors are fine.
            let _ = writer.write_all(&bytes);
            writer.shutdown_how(Shutdown::Write);
        });
        c.drain_until_closed(panics_before);
    });
    // A server that recovers from a panic still closes the connection.
    assert_eq!(
        server_panic_count(),
        panics_before,
        "{}",
        server_panics_since(panics_before)
    );
    let mut probe = server.open("small", SIMPLE);
    probe.read(0, 8);
}

/// Requests: mostly well framed, some wild.
fn fuzz_request() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![6 => framed_request(), 1 => wild_request()]
}

/// Well-framed requests (a WRITE carries the payload its header claims)
/// with random commands, flags and ranges mostly inside the drive: these get
/// past validation into the data paths and keep the stream in sync for the
/// requests after them.
fn framed_request() -> impl Strategy<Value = Vec<u8>> {
    let commands = vec![
        CMD_READ,
        CMD_WRITE,
        CMD_FLUSH,
        CMD_TRIM,
        CMD_CACHE,
        CMD_WRITE_ZEROES,
        CMD_BLOCK_STATUS,
    ];
    let command = prop_oneof![10 => prop::sample::select(commands), 1 => any::<u16>()];
    let flags = prop_oneof![2 => Just(0u16), 3 => 0u16..32, 1 => any::<u16>()];
    let offset = prop_oneof![4 => 0u64..=2 * MIB, 1 => 2 * MIB - 70_000..=2 * MIB + 10];
    (command, flags, offset, 0u32..=70_000).prop_map(|(command, flags, offset, len)| {
        let mut out = header_bytes(command, flags, offset, len);
        if command == CMD_WRITE {
            out.extend(pattern(len as usize, 9));
        }
        out
    })
}

/// Anything goes: lengths up to 4 GiB, payloads shorter or longer than the
/// header claims, DISC.
fn wild_request() -> impl Strategy<Value = Vec<u8>> {
    let offset = prop_oneof![0u64..=2 * MIB + 10, Just(u64::MAX - 8), any::<u64>()];
    let len = prop_oneof![
        Just(MAX_PAYLOAD_BYTES),
        Just(MAX_PAYLOAD_BYTES + 1),
        any::<u32>(),
        0u32..=70_000,
    ];
    (0u16..=9, any::<u16>(), offset, len, 0usize..=70_000).prop_map(
        |(command, flags, offset, len, payload)| {
            let mut out = header_bytes(command, flags, offset, len);
            if command == CMD_WRITE {
                out.extend(pattern(payload, 9));
            }
            out
        },
    )
}

fn garbage() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..64)
}

/// Random bytes and random requests after a valid handshake: the server
/// answers or closes, never panics, and keeps serving.
#[test]
fn garbage_after_handshake_never_kills_the_server() {
    let server = server();
    // Garbage mostly ends the connection (bad magic), so it comes rarely.
    let item = prop_oneof![10 => fuzz_request(), 1 => garbage()];
    let strategy = (any::<bool>(), prop::collection::vec(item, 0..12));
    let mut runner = TestRunner::new(fuzz_config(256));
    runner
        .run(&strategy, |(structured, items)| {
            let opts = if structured { STRUCTURED } else { SIMPLE };
            let c = server.open("small", opts);
            feed_and_drain(&server, c, items.concat());
            Ok(())
        })
        .unwrap();
}

/// Option data: random bytes, or well-formed INFO/GO and meta requests for
/// known and unknown names.
fn option_data() -> impl Strategy<Value = Vec<u8>> {
    let name = || prop_oneof![Just(""), Just("small"), Just("nope")];
    prop_oneof![
        1 => garbage(),
        2 => (name(), prop::collection::vec(0u16..5, 0..4)).prop_map(|(n, r)| info_request(n, &r)),
        2 => (
            name(),
            prop::collection::vec(
                prop_oneof![Just("base:"), Just(META_BASE_ALLOCATION), Just("x:y")],
                0..3
            )
        )
            .prop_map(|(n, q)| meta_request(n, &q)),
    ]
}

/// A handshake message: an option (whose header may lie about its length)
/// or raw bytes. Mostly options that keep the handshake going, so that
/// sequences of them are explored; fewer that end it (EXPORT_NAME, ABORT,
/// GO), lies and garbage.
fn handshake_item() -> impl Strategy<Value = Vec<u8>> {
    let ongoing = vec![
        OPT_LIST,
        OPT_STARTTLS,
        OPT_INFO,
        OPT_STRUCTURED_REPLY,
        OPT_LIST_META_CONTEXT,
        OPT_SET_META_CONTEXT,
        11,
        99,
    ];
    let ending = vec![OPT_EXPORT_NAME, OPT_ABORT, OPT_GO];
    let option = prop_oneof![
        8 => prop::sample::select(ongoing),
        1 => prop::sample::select(ending),
        1 => any::<u32>(),
    ];
    let claimed = prop_oneof![9 => Just(None), 1 => any::<u32>().prop_map(Some)];
    let opt = (option, option_data(), claimed).prop_map(|(option, data, claimed)| {
        let mut out = option_header(option, claimed.unwrap_or(data.len() as u32));
        out.extend_from_slice(&data);
        out
    });
    prop_oneof![10 => opt, 1 => garbage()]
}

/// Random client flags and options during the handshake (and whatever
/// follows if they happen to reach transmission).
#[test]
fn garbage_during_handshake_never_kills_the_server() {
    let server = server();
    let flags = prop_oneof![4 => Just(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES), 1 => any::<u32>()];
    let strategy = (flags, prop::collection::vec(handshake_item(), 0..10));
    let mut runner = TestRunner::new(fuzz_config(256));
    runner
        .run(&strategy, |(flags, items)| {
            let mut bytes = flags.to_be_bytes().to_vec();
            bytes.extend(items.concat());
            feed_and_drain(&server, server.connect(), bytes);
            Ok(())
        })
        .unwrap();
}
