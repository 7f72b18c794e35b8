//! A small blocking NBD client, used as a cache backing
//! (`nbd://host:port/export`, `nbd+unix:///export?socket=PATH`, and over
//! TLS `nbds://...` and `nbds+unix://...`).
//!
//! - `uri`: the NBD URI spec's four schemes and libnbd's TLS parameters
//!   (pure parsing).
//! - `handshake`: one connection: socket, greeting, NBD_OPT_STARTTLS and
//!   the TLS handshake for `nbds`, NBD_OPT_GO (falling back to
//!   NBD_OPT_EXPORT_NAME for servers without it).
//! - `tls`: the rustls client configuration (CA, client certificate for
//!   mutual TLS) and what each TLS failure means.
//! - `transport`: plain socket or TLS session, an enum (plaintext pays no
//!   boxing and no virtual call per request).
//! - here: the connection pool and the [`Backend`] calls.
//!
//! Simple replies only (no structured replies are negotiated, so a READ
//! reply is header plus data), one request in flight per connection,
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
//! error instead of a hung cache. The TLS configuration is built once per
//! client, so its connections and reconnections share it (and resume the
//! TLS session).
//!
//! Requests larger than the server's maximum payload are split.

mod handshake;
pub mod tls;
mod transport;
pub mod uri;

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::block::backend::{self, check_range, Backend, Caps, Extent};
use crate::nbd::proto::*;
use tls::TlsClient;
use transport::Stream;
pub use uri::{Address, NbdUri, TlsParams, DEFAULT_PORT};

/// Errors of connecting and of the handshake. The TLS ones say what to
/// change; the cache API returns them as they are.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URI is not one we understand.
    #[error("invalid NBD URI '{uri}': {why} (expected nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH, or nbds:// / nbds+unix:// with tls-certificates=DIR)")]
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
    /// An `nbds` URI, but the server refused NBD_OPT_STARTTLS.
    #[error("NBD server {target} does not support TLS (it answered NBD_OPT_STARTTLS with {reply}): start it with TLS (nbdkit --tls=require --tls-certificates=DIR, qemu-nbd --tls-creds=ID), or use nbd:// only on a network you trust")]
    TlsUnsupported { target: String, reply: String },
    /// A plaintext URI, but the server serves only over TLS.
    #[error("NBD server {target} requires TLS (NBD_REP_ERR_TLS_REQD): use nbds:// (or nbds+unix://) with tls-certificates=DIR holding ca-cert.pem, the CA that signed the server's certificate")]
    TlsRequired { target: String },
    /// The server's certificate is not signed by our CA (or has expired).
    #[error("the certificate of NBD server {target} is not trusted ({why}): put the CA that signed it in {} (tls-certificates=DIR), or renew the server's certificate if it has expired", ca.display())]
    CertificateNotTrusted {
        target: String,
        ca: PathBuf,
        why: String,
    },
    /// The server's certificate is good but for another name.
    #[error("the certificate of NBD server {target} is not valid for '{name}' ({why}): connect by a name or address the certificate holds, or set tls-hostname=NAME in the URI")]
    WrongHostName {
        target: String,
        name: String,
        why: String,
    },
    /// The server verifies client certificates and refused ours (or
    /// wanted one we did not have).
    #[error("NBD server {target} refused our client certificate ({why}): put client-cert.pem and client-key.pem, signed by a CA the server trusts, in the tls-certificates directory")]
    ClientCertificateRefused { target: String, why: String },
    /// The certificate files could not be used.
    #[error("cannot use the TLS certificates in '{}': {source}", dir.display())]
    TlsFiles {
        dir: PathBuf,
        source: tls::CertFileError,
    },
    /// Any other TLS failure (no common protocol version or cipher, a
    /// broken record).
    #[error("TLS with NBD server {target} failed: {source}")]
    Tls {
        target: String,
        source: rustls::Error,
    },
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
    fn open(
        uri: &NbdUri,
        opts: &ClientOptions,
        tls: Option<&TlsClient>,
    ) -> Result<(Conn, ExportInfo), ClientError> {
        let (stream, info) = handshake::open(uri, opts, tls)?;
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
        // Sends what a TLS stream still holds; nothing for plaintext.
        self.stream.flush()?;
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
        self.stream.flush()?;
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

struct Pool {
    idle: Vec<Conn>,
    /// Connections open (idle or in use).
    open: usize,
}

/// A connected NBD export, usable as a [`Backend`].
pub struct NbdClient {
    uri: NbdUri,
    opts: ClientOptions,
    /// Built once from the URI's TLS parameters, shared by every
    /// connection (None: plaintext).
    tls: Option<TlsClient>,
    info: ExportInfo,
    /// Most connections at once (1 unless the server allows multi-conn).
    max_conns: usize,
    pool: Mutex<Pool>,
    returned: Condvar,
}

impl std::fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdClient")
            .field("uri", &self.uri.to_string())
            .field("info", &self.info)
            .field("max_conns", &self.max_conns)
            .finish()
    }
}

impl NbdClient {
    /// Connects and negotiates the export (one connection; more are opened
    /// on demand).
    pub fn connect(uri: &NbdUri, opts: ClientOptions) -> Result<NbdClient, ClientError> {
        let tls = match &uri.tls {
            Some(params) => Some(TlsClient::new(params, &uri.target())?),
            None => None,
        };
        let (conn, info) = Conn::open(uri, &opts, tls.as_ref())?;
        let max_conns = if info.flags & TFLAG_CAN_MULTI_CONN != 0 {
            opts.connections.max(1)
        } else {
            1
        };
        Ok(NbdClient {
            uri: uri.clone(),
            opts,
            tls,
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
                return match Conn::open(&self.uri, &self.opts, self.tls.as_ref()) {
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

/// One negotiated plaintext connection, for a client that pipelines its
/// own requests (`ramd bench`'s load generator): the socket right after
/// NBD_OPT_GO (simple replies, no structured replies negotiated), in
/// blocking mode with the options' timeouts, and what the export is. The
/// caller speaks the transmission phase with `nbd::proto`.
pub fn connect_plain(
    uri: &NbdUri,
    opts: &ClientOptions,
) -> Result<(std::os::fd::OwnedFd, ExportInfo), ClientError> {
    if uri.tls.is_some() {
        return Err(ClientError::BadUri {
            uri: uri.to_string(),
            why: "this client speaks plaintext NBD only".into(),
        });
    }
    match handshake::open(uri, opts, None)? {
        (Stream::Plain(transport::Socket::Unix(s)), info) => Ok((s.into(), info)),
        (Stream::Plain(transport::Socket::Tcp(s)), info) => Ok((s.into(), info)),
        (Stream::Tls(_), _) => unreachable!("no TLS client was given"),
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
            let _ = c.stream.write_all(&out).and_then(|_| c.stream.flush());
            c.stream.close();
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
