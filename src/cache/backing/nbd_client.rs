//! A small blocking NBD client, used as a cache backing
//! (`nbd://host:port/export`, `nbd+unix:///export?socket=PATH`).
//!
//! Built on the pure codec in `proto`: fixed newstyle handshake with
//! NBD_OPT_GO (falling back to NBD_OPT_EXPORT_NAME for servers without
//! it), simple replies only (no structured replies are negotiated, so a
//! READ reply is header plus data), one request in flight per connection,
//! except for `write_many`, which sends a window of writes before it reads
//! their replies (write-back of scattered blocks).
//!
//! # Connections
//!
//! A small pool: up to `connections` sockets when the server advertises
//! multi-conn (then a FLUSH on any one covers writes on all), else one.
//! A request takes an idle connection or opens one; after any socket or
//! protocol error the connection is dropped and the next request opens a
//! new one, so a server that restarts is picked up again without help.
//! Every socket has read and write timeouts, so a hung server yields an
//! error instead of a hung cache.
//!
//! Requests larger than the server's maximum payload are split.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::backend::{self, check_range, Backend, Caps, Extent};
use crate::nbd::proto::*;

/// Errors of connecting and of the handshake.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URI is not one we understand.
    #[error("invalid NBD URI '{uri}': {why} (expected nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH)")]
    BadUri { uri: String, why: String },
    /// The socket could not be opened or failed during the handshake.
    #[error("cannot connect to {target}: {source}")]
    Connect { target: String, source: io::Error },
    /// The server broke the protocol.
    #[error("NBD server {target} broke the protocol: {why}")]
    Protocol { target: String, why: String },
    /// The server refused the export.
    #[error("NBD server {target} refused export '{export}': {why}")]
    Refused {
        target: String,
        export: String,
        why: String,
    },
}

/// Where an NBD server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tcp { host: String, port: u16 },
    Unix { socket: PathBuf },
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub address: Address,
    /// Export name ("" selects the server's default export).
    pub export: String,
}

/// The IANA port for NBD.
pub const DEFAULT_PORT: u16 = 10809;

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl NbdUri {
    /// True when `s` looks like an NBD URI (so a backing spec is not a path).
    pub fn is_uri(s: &str) -> bool {
        s.starts_with("nbd:") || s.starts_with("nbd+") || s.starts_with("nbds")
    }

    /// Parses `nbd://HOST[:PORT][/EXPORT]` or
    /// `nbd+unix:///[EXPORT]?socket=PATH` (the forms of the NBD URI spec
    /// that need no TLS).
    pub fn parse(uri: &str) -> Result<NbdUri, ClientError> {
        let bad = |why: &str| ClientError::BadUri {
            uri: uri.to_owned(),
            why: why.to_owned(),
        };
        let (scheme, rest) = uri.split_once("://").ok_or_else(|| bad("no '://'"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path).ok_or_else(|| bad("bad %-escape in the export name"))?;
        let params: Vec<(&str, &str)> = query
            .map(|q| {
                q.split('&')
                    .filter(|p| !p.is_empty())
                    .map(|p| p.split_once('=').unwrap_or((p, "")))
                    .collect()
            })
            .unwrap_or_default();
        match scheme {
            "nbd" => {
                if authority.is_empty() {
                    return Err(bad("no host"));
                }
                if let Some((k, _)) = params.first() {
                    return Err(bad(&format!("unsupported parameter '{k}'")));
                }
                let (host, port) = if let Some(h) = authority.strip_prefix('[') {
                    // [IPv6]:port
                    let (h, after) = h.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
                    let port = match after.strip_prefix(':') {
                        Some(p) => p.parse().map_err(|_| bad("bad port"))?,
                        None if after.is_empty() => DEFAULT_PORT,
                        None => return Err(bad("junk after ']'")),
                    };
                    (h.to_owned(), port)
                } else {
                    match authority.rsplit_once(':') {
                        Some((h, p)) => (h.to_owned(), p.parse().map_err(|_| bad("bad port"))?),
                        None => (authority.to_owned(), DEFAULT_PORT),
                    }
                };
                Ok(NbdUri {
                    address: Address::Tcp { host, port },
                    export,
                })
            }
            "nbd+unix" => {
                if !authority.is_empty() {
                    return Err(bad(
                        "a unix URI has no host: use nbd+unix:///EXPORT?socket=PATH",
                    ));
                }
                let mut socket = None;
                for (k, v) in params {
                    match k {
                        "socket" => {
                            socket = Some(percent_decode(v).ok_or_else(|| bad("bad %-escape"))?)
                        }
                        other => return Err(bad(&format!("unsupported parameter '{other}'"))),
                    }
                }
                let socket = socket
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| bad("missing ?socket=PATH"))?;
                Ok(NbdUri {
                    address: Address::Unix {
                        socket: PathBuf::from(socket),
                    },
                    export,
                })
            }
            s if s.starts_with("nbds") => Err(bad("TLS (nbds) is not supported yet")),
            other => Err(bad(&format!("unknown scheme '{other}'"))),
        }
    }

    /// Where the server is, for messages.
    pub fn target(&self) -> String {
        match &self.address {
            Address::Tcp { host, port } => format!("{host}:{port}"),
            Address::Unix { socket } => socket.display().to_string(),
        }
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.address {
            Address::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd://[{host}]:{port}/{}", self.export)
            }
            Address::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{}", self.export),
            Address::Unix { socket } => {
                write!(f, "nbd+unix:///{}?socket={}", self.export, socket.display())
            }
        }
    }
}

/// Settings of a client.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Most connections when the server allows multi-conn.
    pub connections: usize,
    /// Limit for connecting and for each socket read or write.
    pub timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connections: 4,
            timeout: Duration::from_secs(30),
        }
    }
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the handshake told us about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    pub min_block: u32,
    pub max_payload: u32,
}

/// One negotiated connection.
struct Conn {
    stream: Stream,
    next_cookie: u64,
}

impl Conn {
    fn open(uri: &NbdUri, opts: &ClientOptions) -> Result<(Conn, ExportInfo), ClientError> {
        let target = uri.target();
        let connect_err = |source| ClientError::Connect {
            target: target.clone(),
            source,
        };
        let mut stream = match &uri.address {
            Address::Tcp { host, port } => {
                let addrs: Vec<_> = (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(connect_err)?
                    .collect();
                let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
                let mut found = None;
                for a in addrs {
                    match TcpStream::connect_timeout(&a, opts.timeout) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let s = found.ok_or_else(|| connect_err(last))?;
                s.set_nodelay(true).map_err(connect_err)?;
                s.set_read_timeout(Some(opts.timeout))
                    .map_err(connect_err)?;
                s.set_write_timeout(Some(opts.timeout))
                    .map_err(connect_err)?;
                Stream::Tcp(s)
            }
            Address::Unix { socket } => {
                let s = UnixStream::connect(socket).map_err(connect_err)?;
                s.set_read_timeout(Some(opts.timeout))
                    .map_err(connect_err)?;
                s.set_write_timeout(Some(opts.timeout))
                    .map_err(connect_err)?;
                Stream::Unix(s)
            }
        };
        let info = handshake(&mut stream, &uri.export).map_err(|e| match e {
            HandshakeError::Io(source) => ClientError::Connect {
                target: target.clone(),
                source,
            },
            HandshakeError::Protocol(why) => ClientError::Protocol {
                target: target.clone(),
                why,
            },
            HandshakeError::Refused(why) => ClientError::Refused {
                target: target.clone(),
                export: uri.export.clone(),
                why,
            },
        })?;
        Ok((
            Conn {
                stream,
                next_cookie: 1,
            },
            info,
        ))
    }

    /// Sends one request and waits for its reply. An `Err` from the socket
    /// or the protocol means the connection is unusable; an NBD error in
    /// the reply is `Ok(Err(errno))`.
    fn request(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
        read_into: Option<&mut [u8]>,
    ) -> io::Result<Result<(), u32>> {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let mut out = Vec::with_capacity(REQUEST_HEADER_BYTES + payload.len().min(64 << 10));
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
        if payload.len() <= 64 << 10 {
            out.extend_from_slice(payload);
            self.stream.write_all(&out)?;
        } else {
            self.stream.write_all(&out)?;
            self.stream.write_all(payload)?;
        }
        let reply = self.read_reply_header()?;
        if reply.cookie != cookie {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "reply for cookie {} while waiting for {cookie}",
                    reply.cookie
                ),
            ));
        }
        if reply.error != 0 {
            return Ok(Err(reply.error));
        }
        if let Some(buf) = read_into {
            self.stream.read_exact(buf)?;
        }
        Ok(Ok(()))
    }
}

impl Conn {
    /// Reads one simple reply header (no structured replies are
    /// negotiated).
    fn read_reply_header(&mut self) -> io::Result<SimpleReply> {
        let mut h = [0u8; SIMPLE_REPLY_BYTES];
        self.stream.read_exact(&mut h)?;
        match parse_simple_reply(&h) {
            Ok(Parse::Done(r, _)) => Ok(r),
            Ok(Parse::Incomplete) => unreachable!("a full header was read"),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    }

    /// Sends every write of `pieces` (each at most the server's maximum
    /// payload) before reading any reply, then reads one reply per write,
    /// in whatever order the server sends them: one round trip for all.
    /// Returns each write's NBD error (0: done), in the order given. An
    /// `Err` means the connection is unusable.
    ///
    /// Cannot deadlock against a server that stops reading while its
    /// replies are not read: the replies (16 bytes each, at most
    /// `PIPELINE_MAX` of them) always fit in the socket's buffer.
    fn write_pipelined(&mut self, pieces: &[(u64, &[u8])]) -> io::Result<Vec<u32>> {
        debug_assert!(pieces.len() <= PIPELINE_MAX);
        let first = self.next_cookie;
        self.next_cookie += pieces.len() as u64;
        let mut out = Vec::with_capacity(REQUEST_HEADER_BYTES * pieces.len() + (64 << 10));
        for (i, &(offset, data)) in pieces.iter().enumerate() {
            encode_request(
                &mut out,
                &Request {
                    flags: 0,
                    command: CMD_WRITE,
                    cookie: first + i as u64,
                    offset,
                    len: data.len() as u32,
                },
            );
            if data.len() <= 64 << 10 {
                out.extend_from_slice(data);
            } else {
                self.stream.write_all(&out)?;
                out.clear();
                self.stream.write_all(data)?;
            }
            if out.len() >= 256 << 10 {
                self.stream.write_all(&out)?;
                out.clear();
            }
        }
        self.stream.write_all(&out)?;
        let mut errors = vec![u32::MAX; pieces.len()];
        for _ in 0..pieces.len() {
            let reply = self.read_reply_header()?;
            let i = reply.cookie.wrapping_sub(first);
            if i >= pieces.len() as u64 || errors[i as usize] != u32::MAX {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "reply for cookie {} while waiting for {first}..{}",
                        reply.cookie,
                        first + pieces.len() as u64
                    ),
                ));
            }
            errors[i as usize] = reply.error;
        }
        Ok(errors)
    }
}

/// Most writes `write_many` keeps in flight on one connection.
const PIPELINE_MAX: usize = 64;
/// Most payload bytes `write_many` sends before it reads the replies.
const PIPELINE_BYTES: usize = 8 << 20;

enum HandshakeError {
    Io(io::Error),
    Protocol(String),
    Refused(String),
}

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        HandshakeError::Io(e)
    }
}

fn read_option_reply(s: &mut Stream) -> Result<(OptionReplyHeader, Vec<u8>), HandshakeError> {
    let mut h = [0u8; OPTION_REPLY_HEADER_BYTES];
    s.read_exact(&mut h)?;
    let header = match parse_option_reply_header(&h) {
        Ok(Parse::Done(r, _)) => r,
        Ok(Parse::Incomplete) => unreachable!("a full header was read"),
        Err(e) => return Err(HandshakeError::Protocol(e.to_string())),
    };
    if header.len > MAX_OPTION_BYTES {
        return Err(HandshakeError::Protocol(format!(
            "option reply of {} bytes",
            header.len
        )));
    }
    let mut data = vec![0u8; header.len as usize];
    s.read_exact(&mut data)?;
    Ok((header, data))
}

fn handshake(s: &mut Stream, export: &str) -> Result<ExportInfo, HandshakeError> {
    let mut g = [0u8; GREETING_BYTES];
    s.read_exact(&mut g)?;
    let flags = match parse_greeting(&g) {
        Ok(Parse::Done(f, _)) => f,
        Ok(Parse::Incomplete) => unreachable!("a full greeting was read"),
        Err(e) => {
            return Err(HandshakeError::Protocol(format!(
                "{e} (only fixed-newstyle servers are supported)"
            )))
        }
    };
    if flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(HandshakeError::Protocol(
            "server does not speak fixed newstyle".into(),
        ));
    }
    let no_zeroes = flags & FLAG_NO_ZEROES != 0;
    let client_flags = CLIENT_FIXED_NEWSTYLE | if no_zeroes { CLIENT_NO_ZEROES } else { 0 };
    s.write_all(&client_flags.to_be_bytes())?;
    let mut out = Vec::new();
    encode_option(
        &mut out,
        OPT_GO,
        &encode_info_request(export, &[INFO_BLOCK_SIZE]),
    );
    s.write_all(&out)?;
    let mut info = ExportInfo {
        size: 0,
        flags: 0,
        min_block: 1,
        max_payload: MAX_PAYLOAD_BYTES,
    };
    let mut have_export = false;
    loop {
        let (h, data) = read_option_reply(s)?;
        if h.option != OPT_GO {
            return Err(HandshakeError::Protocol(format!(
                "reply to option {} while waiting for GO",
                h.option
            )));
        }
        match h.reply {
            REP_ACK => break,
            REP_INFO => match parse_info_reply(&data) {
                Ok(InfoReply::Export { size, flags }) => {
                    info.size = size;
                    info.flags = flags;
                    have_export = true;
                }
                Ok(InfoReply::BlockSize { min, max, .. }) => {
                    info.min_block = min.max(1);
                    info.max_payload = max.clamp(min.max(1), MAX_PAYLOAD_BYTES);
                }
                Ok(_) => {}
                Err(e) => return Err(HandshakeError::Protocol(e.0)),
            },
            REP_ERR_UNSUP => return export_name_fallback(s, export, no_zeroes),
            r if h.is_error() => {
                let msg = String::from_utf8_lossy(&data).into_owned();
                let kind = match r {
                    REP_ERR_UNKNOWN => "no such export",
                    REP_ERR_POLICY => "refused by policy",
                    REP_ERR_TLS_REQD => "the server requires TLS",
                    REP_ERR_BLOCK_SIZE_REQD => "the server requires block size negotiation",
                    REP_ERR_SHUTDOWN => "the server is shutting down",
                    _ => "error",
                };
                return Err(HandshakeError::Refused(if msg.is_empty() {
                    kind.to_owned()
                } else {
                    format!("{kind}: {msg}")
                }));
            }
            other => {
                return Err(HandshakeError::Protocol(format!(
                    "unexpected option reply type {other}"
                )))
            }
        }
    }
    if !have_export {
        return Err(HandshakeError::Protocol(
            "GO succeeded without NBD_INFO_EXPORT".into(),
        ));
    }
    Ok(info)
}

/// For servers without NBD_OPT_GO.
fn export_name_fallback(
    s: &mut Stream,
    export: &str,
    no_zeroes: bool,
) -> Result<ExportInfo, HandshakeError> {
    let mut out = Vec::new();
    encode_option(&mut out, OPT_EXPORT_NAME, export.as_bytes());
    s.write_all(&out)?;
    let mut buf = vec![0u8; export_name_reply_bytes(no_zeroes)];
    s.read_exact(&mut buf)?;
    match parse_export_name_reply(&buf, no_zeroes) {
        Parse::Done((size, flags), _) => Ok(ExportInfo {
            size,
            flags,
            min_block: 1,
            max_payload: MAX_PAYLOAD_BYTES,
        }),
        Parse::Incomplete => unreachable!("the whole reply was read"),
    }
}

struct Pool {
    idle: Vec<Conn>,
    /// Connections open (idle or in use).
    open: usize,
}

/// A connected NBD export, usable as a [`Backend`].
pub struct NbdClient {
    uri: NbdUri,
    opts: ClientOptions,
    info: ExportInfo,
    /// Most connections at once (1 unless the server allows multi-conn).
    max_conns: usize,
    pool: Mutex<Pool>,
    returned: Condvar,
}

impl NbdClient {
    /// Connects and negotiates the export (one connection; more are opened
    /// on demand).
    pub fn connect(uri: &NbdUri, opts: ClientOptions) -> Result<NbdClient, ClientError> {
        let (conn, info) = Conn::open(uri, &opts)?;
        let max_conns = if info.flags & TFLAG_CAN_MULTI_CONN != 0 {
            opts.connections.max(1)
        } else {
            1
        };
        Ok(NbdClient {
            uri: uri.clone(),
            opts,
            info,
            max_conns,
            pool: Mutex::new(Pool {
                idle: vec![conn],
                open: 1,
            }),
            returned: Condvar::new(),
        })
    }

    pub fn info(&self) -> ExportInfo {
        self.info
    }

    pub fn uri(&self) -> &NbdUri {
        &self.uri
    }

    pub fn is_read_only(&self) -> bool {
        self.info.flags & TFLAG_READ_ONLY != 0
    }

    fn has(&self, flag: u16) -> bool {
        self.info.flags & flag != 0
    }

    fn checkout(&self) -> io::Result<Conn> {
        let deadline = Instant::now() + self.opts.timeout;
        let mut p = self.pool.lock();
        loop {
            if let Some(c) = p.idle.pop() {
                return Ok(c);
            }
            if p.open < self.max_conns {
                p.open += 1;
                drop(p);
                return match Conn::open(&self.uri, &self.opts) {
                    Ok((c, info)) if info.size == self.info.size => Ok(c),
                    Ok((_, info)) => {
                        self.lost();
                        Err(io::Error::other(format!(
                            "NBD export {} changed size from {} to {} bytes",
                            self.uri, self.info.size, info.size
                        )))
                    }
                    Err(e) => {
                        self.lost();
                        Err(io::Error::other(e.to_string()))
                    }
                };
            }
            if self.returned.wait_until(&mut p, deadline).timed_out() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no NBD connection became free in time",
                ));
            }
        }
    }

    fn checkin(&self, c: Conn) {
        self.pool.lock().idle.push(c);
        self.returned.notify_one();
    }

    /// A connection was dropped.
    fn lost(&self) {
        self.pool.lock().open -= 1;
        self.returned.notify_one();
    }

    /// One request on a pooled connection; a broken connection is dropped.
    fn call(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
        read_into: Option<&mut [u8]>,
    ) -> backend::Result<()> {
        let mut c = self.checkout()?;
        match c.request(command, flags, offset, len, payload, read_into) {
            Ok(r) => {
                self.checkin(c);
                r.map_err(|errno| {
                    self.server_error(command_name(command), offset, len as usize, errno)
                })
            }
            Err(e) => {
                drop(c);
                self.lost();
                Err(self.connection_error(command_name(command), e))
            }
        }
    }

    /// The server answered `what` at `offset+len` with `errno`.
    fn server_error(&self, what: &str, offset: u64, len: usize, errno: u32) -> backend::Error {
        let e = io_error_for_errno(errno);
        backend::Error::Io(io::Error::new(
            e.kind(),
            format!(
                "NBD server {} failed {what} at {offset}+{len}: {e}",
                self.uri.target()
            ),
        ))
    }

    /// The connection broke during `what` (it has been dropped).
    fn connection_error(&self, what: &str, e: io::Error) -> backend::Error {
        backend::Error::Io(io::Error::new(
            e.kind(),
            format!(
                "NBD connection to {} failed during {what}: {e}",
                self.uri.target()
            ),
        ))
    }

    fn max_piece(&self) -> usize {
        self.info.max_payload.max(4096) as usize
    }
}

impl Drop for NbdClient {
    /// Says goodbye on every idle connection (NBD_CMD_DISC), as a polite
    /// client does; the server then closes without logging a dropped client.
    fn drop(&mut self) {
        for mut c in self.pool.get_mut().idle.drain(..) {
            let mut out = Vec::with_capacity(REQUEST_HEADER_BYTES);
            encode_request(
                &mut out,
                &Request {
                    flags: 0,
                    command: CMD_DISC,
                    cookie: c.next_cookie,
                    offset: 0,
                    len: 0,
                },
            );
            let _ = c.stream.write_all(&out);
        }
    }
}

impl Backend for NbdClient {
    fn size(&self) -> u64 {
        self.info.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> backend::Result<()> {
        check_range(offset, buf.len() as u64, self.info.size)?;
        let max = self.max_piece();
        let mut at = 0;
        while at < buf.len() {
            let n = (buf.len() - at).min(max);
            let piece = &mut buf[at..at + n];
            self.call(CMD_READ, 0, offset + at as u64, n as u32, &[], Some(piece))?;
            at += n;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> backend::Result<()> {
        check_range(offset, data.len() as u64, self.info.size)?;
        if self.is_read_only() {
            return Err(backend::Error::ReadOnly);
        }
        let native_fua = fua && self.has(TFLAG_SEND_FUA);
        let max = self.max_piece();
        let mut at = 0;
        while at < data.len() {
            let n = (data.len() - at).min(max);
            let flags = if native_fua { CMD_FLAG_FUA } else { 0 };
            self.call(
                CMD_WRITE,
                flags,
                offset + at as u64,
                n as u32,
                &data[at..at + n],
                None,
            )?;
            at += n;
        }
        if fua && !native_fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Pipelined: the writes (split at the server's maximum payload) go out
    /// in windows of up to `PIPELINE_MAX` requests / `PIPELINE_BYTES`, each
    /// window on one connection with one round trip, so a write-back of
    /// many scattered blocks to a distant server is not bound by one round
    /// trip per block.
    fn write_many(&self, writes: &[(u64, &[u8])]) -> backend::Result<()> {
        if self.is_read_only() && !writes.is_empty() {
            return Err(backend::Error::ReadOnly);
        }
        let max = self.max_piece();
        let mut pieces: Vec<(u64, &[u8])> = Vec::with_capacity(writes.len());
        for &(offset, data) in writes {
            check_range(offset, data.len() as u64, self.info.size)?;
            let mut at = 0;
            while at < data.len() {
                let n = (data.len() - at).min(max);
                pieces.push((offset + at as u64, &data[at..at + n]));
                at += n;
            }
        }
        let mut start = 0;
        while start < pieces.len() {
            let (mut end, mut bytes) = (start, 0);
            while end < pieces.len()
                && end - start < PIPELINE_MAX
                && (end == start || bytes + pieces[end].1.len() <= PIPELINE_BYTES)
            {
                bytes += pieces[end].1.len();
                end += 1;
            }
            let window = &pieces[start..end];
            let mut c = self.checkout()?;
            match c.write_pipelined(window) {
                Ok(errors) => {
                    self.checkin(c);
                    if let Some((i, &errno)) = errors.iter().enumerate().find(|(_, &e)| e != 0) {
                        let (offset, data) = window[i];
                        return Err(self.server_error("WRITE", offset, data.len(), errno));
                    }
                }
                Err(e) => {
                    drop(c);
                    self.lost();
                    let what = format!("{} pipelined WRITEs", window.len());
                    return Err(self.connection_error(&what, e));
                }
            }
            start = end;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> backend::Result<()> {
        check_range(offset, len, self.info.size)?;
        if self.is_read_only() {
            return Err(backend::Error::ReadOnly);
        }
        if self.has(TFLAG_SEND_WRITE_ZEROES) {
            let flags = if may_trim { 0 } else { CMD_FLAG_NO_HOLE };
            let mut pos = offset;
            let end = offset + len;
            while pos < end {
                let n = (end - pos).min(1 << 30);
                self.call(CMD_WRITE_ZEROES, flags, pos, n as u32, &[], None)?;
                pos += n;
            }
            return Ok(());
        }
        let zeroes = vec![0u8; len.min(self.max_piece() as u64) as usize];
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let n = (end - pos).min(zeroes.len() as u64);
            self.write(pos, &zeroes[..n as usize], false)?;
            pos += n;
        }
        Ok(())
    }

    /// Our trait promises zeroes after a trim, which NBD_CMD_TRIM does not:
    /// so a trim is a WRITE_ZEROES that may punch holes.
    fn trim(&self, offset: u64, len: u64) -> backend::Result<()> {
        self.write_zeroes(offset, len, true)
    }

    fn flush(&self) -> backend::Result<()> {
        if !self.has(TFLAG_SEND_FLUSH) {
            // No volatile cache on the server: writes are durable already.
            return Ok(());
        }
        // One connection, or multi-conn (a flush on one covers all).
        self.call(CMD_FLUSH, 0, 0, 0, &[], None)
    }

    fn extents(&self, offset: u64, len: u64) -> backend::Result<Vec<Extent>> {
        check_range(offset, len, self.info.size)?;
        Ok(vec![Extent {
            len,
            hole: false,
            zero: false,
        }])
    }

    fn capabilities(&self) -> Caps {
        let writable = !self.is_read_only();
        Caps {
            can_trim: writable,
            can_zero: writable,
            can_fast_zero: false,
            can_fua: writable,
            can_flush: true,
            can_multi_conn: self.max_conns > 1,
            can_extents: false,
            can_cache: false,
            ..super::PLAIN_CAPS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse() {
        let u = NbdUri::parse("nbd://example.com:10810/disk%201").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "example.com".into(),
                port: 10810
            }
        );
        assert_eq!(u.export, "disk 1");
        let u = NbdUri::parse("nbd://127.0.0.1").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "127.0.0.1".into(),
                port: DEFAULT_PORT
            }
        );
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd://[::1]:999/x").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "::1".into(),
                port: 999
            }
        );
        assert_eq!(u.to_string(), "nbd://[::1]:999/x");
        let u = NbdUri::parse("nbd+unix:///ram0?socket=/run/ramd/nbd.sock").unwrap();
        assert_eq!(
            u.address,
            Address::Unix {
                socket: "/run/ramd/nbd.sock".into()
            }
        );
        assert_eq!(u.export, "ram0");
        assert_eq!(u.to_string(), "nbd+unix:///ram0?socket=/run/ramd/nbd.sock");
        let u = NbdUri::parse("nbd+unix://?socket=/tmp/s").unwrap();
        assert_eq!(u.export, "");
    }

    #[test]
    fn bad_uris_explain() {
        for (uri, why) in [
            ("nbd:/x", "://"),
            ("nbd:///x", "no host"),
            ("nbd://h:port/x", "bad port"),
            ("nbd+unix:///x", "socket"),
            ("nbd+unix://host/x?socket=/s", "no host"),
            ("nbds://h/x", "TLS"),
            ("http://h/x", "scheme"),
            ("nbd+unix:///x?socket=/s&tls=on", "tls"),
            ("nbd://h/%zz", "escape"),
        ] {
            let e = NbdUri::parse(uri).unwrap_err().to_string();
            assert!(e.contains(why), "{uri}: {e}");
            assert!(e.contains("expected nbd://"), "{e}");
        }
        assert!(NbdUri::is_uri("nbd+unix:///x?socket=/s"));
        assert!(!NbdUri::is_uri("/dev/sdb"));
    }
}
