//! The NBD wire protocol as pure code: constants, parsers and encoders.
//! Nothing here does I/O; parsers take byte slices and say `Incomplete` when
//! more bytes are needed, encoders append to a `Vec<u8>`.
//!
//! All integers are big-endian ("network byte order").
//!
//! ```text
//! Handshake (fixed newstyle)
//!   S: "NBDMAGIC" u64 | "IHAVEOPT" u64 | handshake flags u16
//!   C: client flags u32
//!   C: "IHAVEOPT" u64 | option u32 | length u32 | data[length]       (repeated)
//!   S: 0x3e889045565a9 u64 | option u32 | reply type u32 | length u32 | data
//!
//! Transmission
//!   C: 0x25609513 u32 | flags u16 | type u16 | cookie u64 | offset u64 | length u32
//!      [+ length bytes of payload for WRITE]                           (28 bytes)
//!   S: simple     0x67446698 u32 | error u32 | cookie u64 [+ data for READ]
//!   S: structured 0x668e33ef u32 | flags u16 | type u16 | cookie u64 | length u32
//!                 [+ length bytes of chunk payload]                   (20 bytes)
//! ```

use crate::block::backend::{Error, Extent};

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_PLATFORM: u32 = (1 << 31) + 4;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = (1 << 31) + 8;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// Info types (NBD_OPT_INFO / NBD_OPT_GO).
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_ROTATIONAL: u16 = 1 << 4;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_SEND_DF: u16 = 1 << 7;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;
pub const TFLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply chunk types and flags.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// Block status flags of base:allocation.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// Error values.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The one metadata context we serve, and its id.
pub const META_BASE_ALLOCATION: &str = "base:allocation";
pub const META_BASE_ALLOCATION_ID: u32 = 1;

/// Largest READ/WRITE payload accepted (and advertised as maximum block size).
pub const MAX_PAYLOAD_BYTES: u32 = 32 << 20;
/// Largest option payload read into memory; longer options are drained and
/// answered with NBD_REP_ERR_TOO_BIG.
pub const MAX_OPTION_BYTES: u32 = 64 * 1024;
/// Longest string (export name, context) the spec allows.
pub const MAX_STRING_BYTES: usize = 4096;

pub const REQUEST_HEADER_BYTES: usize = 28;
pub const OPTION_HEADER_BYTES: usize = 16;
pub const SIMPLE_REPLY_BYTES: usize = 16;
pub const CHUNK_HEADER_BYTES: usize = 20;

/// Maps a backend error to the NBD errno sent to the client, from the one
/// errno table every frontend shares (`block::Errno`).
pub fn errno_for(err: &Error) -> u32 {
    crate::block::Errno::of(err).nbd()
}

/// The name of an NBD command, for messages and metrics.
pub fn command_name(cmd: u16) -> &'static str {
    match cmd {
        CMD_READ => "read",
        CMD_WRITE => "write",
        CMD_DISC => "disc",
        CMD_FLUSH => "flush",
        CMD_TRIM => "trim",
        CMD_CACHE => "cache",
        CMD_WRITE_ZEROES => "write_zeroes",
        CMD_BLOCK_STATUS => "block_status",
        _ => "unknown",
    }
}

/// Result of parsing bytes that may not all have arrived yet.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse<T> {
    /// A complete item and the number of bytes it used.
    Done(T, usize),
    /// More bytes are needed; nothing was consumed.
    Incomplete,
}

/// A protocol violation after which the connection cannot continue.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The magic number at the start of a message is wrong.
    #[error("bad magic 0x{found:x} (expected 0x{expected:x}): not an NBD client, or the stream lost sync")]
    BadMagic { found: u64, expected: u64 },
    /// The client set flags this server does not know.
    #[error("unknown client flags 0x{0:x}")]
    UnknownClientFlags(u32),
    /// The client does not speak fixed newstyle.
    #[error("client does not support the fixed newstyle handshake (client flags 0x{0:x})")]
    NotFixedNewstyle(u32),
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

// ---------------------------------------------------------------- handshake

/// The server's opening: magic, IHAVEOPT, handshake flags.
pub fn encode_greeting(out: &mut Vec<u8>) {
    out.extend_from_slice(&NBDMAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
}

/// Client flags the server accepts; returns whether NO_ZEROES was asked.
pub fn check_client_flags(flags: u32) -> Result<bool, ProtoError> {
    if flags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0 {
        return Err(ProtoError::UnknownClientFlags(flags));
    }
    if flags & CLIENT_FIXED_NEWSTYLE == 0 {
        return Err(ProtoError::NotFixedNewstyle(flags));
    }
    Ok(flags & CLIENT_NO_ZEROES != 0)
}

/// An option header: which option and how many data bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

/// Parses a 16-byte option header.
pub fn parse_option_header(buf: &[u8]) -> Result<Parse<OptionHeader>, ProtoError> {
    if buf.len() < OPTION_HEADER_BYTES {
        return Ok(Parse::Incomplete);
    }
    let magic = be64(buf);
    if magic != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            found: magic,
            expected: IHAVEOPT,
        });
    }
    Ok(Parse::Done(
        OptionHeader {
            option: be32(&buf[8..]),
            len: be32(&buf[12..]),
        },
        OPTION_HEADER_BYTES,
    ))
}

/// Appends an option reply.
pub fn encode_option_reply(out: &mut Vec<u8>, option: u32, reply: u32, data: &[u8]) {
    out.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// A malformed option payload, answered with NBD_REP_ERR_INVALID.
#[derive(Debug, PartialEq, Eq)]
pub struct InvalidOption(pub String);

/// A cursor over option data that fails with a description when short.
struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], InvalidOption> {
        if self.buf.len() < n {
            return Err(InvalidOption(format!(
                "{} option truncated: {field} needs {n} bytes, {} left",
                self.what,
                self.buf.len()
            )));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u16(&mut self, field: &str) -> Result<u16, InvalidOption> {
        Ok(be16(self.take(2, field)?))
    }
    fn u32(&mut self, field: &str) -> Result<u32, InvalidOption> {
        Ok(be32(self.take(4, field)?))
    }
    /// A u32-length-prefixed UTF-8 string of at most MAX_STRING_BYTES.
    fn string(&mut self, field: &str) -> Result<String, InvalidOption> {
        let len = self.u32(field)? as usize;
        if len > MAX_STRING_BYTES {
            return Err(InvalidOption(format!(
                "{} option: {field} is {len} bytes, longer than the {MAX_STRING_BYTES}-byte limit",
                self.what
            )));
        }
        let bytes = self.take(len, field)?;
        let s = std::str::from_utf8(bytes).map_err(|_| {
            InvalidOption(format!("{} option: {field} is not valid UTF-8", self.what))
        })?;
        if s.contains('\0') {
            return Err(InvalidOption(format!(
                "{} option: {field} contains NUL",
                self.what
            )));
        }
        Ok(s.to_owned())
    }
    fn finish(&self) -> Result<(), InvalidOption> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(InvalidOption(format!(
                "{} option has {} unexpected trailing bytes",
                self.what,
                self.buf.len()
            )))
        }
    }
}

/// The data of NBD_OPT_INFO and NBD_OPT_GO.
#[derive(Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// Parses NBD_OPT_INFO / NBD_OPT_GO data.
pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, InvalidOption> {
    let mut r = Reader {
        buf: data,
        what: "INFO/GO",
    };
    let name = r.string("export name")?;
    let n = r.u16("number of information requests")?;
    let mut requests = Vec::with_capacity(n as usize);
    for _ in 0..n {
        requests.push(r.u16("information request")?);
    }
    r.finish()?;
    Ok(InfoRequest { name, requests })
}

/// Parses NBD_OPT_EXPORT_NAME data (the whole payload is the name).
pub fn parse_export_name(data: &[u8]) -> Result<String, InvalidOption> {
    if data.len() > MAX_STRING_BYTES {
        return Err(InvalidOption("export name longer than 4096 bytes".into()));
    }
    let s = std::str::from_utf8(data)
        .map_err(|_| InvalidOption("export name is not valid UTF-8".into()))?;
    Ok(s.to_owned())
}

/// The data of NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, PartialEq, Eq)]
pub struct MetaRequest {
    pub export: String,
    pub queries: Vec<String>,
}

/// Parses meta context option data.
pub fn parse_meta_request(data: &[u8]) -> Result<MetaRequest, InvalidOption> {
    let mut r = Reader {
        buf: data,
        what: "META_CONTEXT",
    };
    let export = r.string("export name")?;
    let n = r.u32("number of queries")?;
    // Each query needs at least its 4-byte length: bound before allocating.
    if n as usize > r.buf.len() / 4 {
        return Err(InvalidOption(format!(
            "META_CONTEXT option claims {n} queries but carries only {} bytes",
            r.buf.len()
        )));
    }
    let mut queries = Vec::with_capacity(n as usize);
    for _ in 0..n {
        queries.push(r.string("query")?);
    }
    r.finish()?;
    Ok(MetaRequest { export, queries })
}

/// Which of our contexts a query selects. Queries are `namespace:name`;
/// for LIST, `base:` alone selects every context of the namespace.
pub fn meta_query_matches(query: &str, listing: bool) -> bool {
    query == META_BASE_ALLOCATION || (listing && query == "base:")
}

/// Appends an NBD_REP_INFO payload of type NBD_INFO_EXPORT.
pub fn encode_info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut d = Vec::with_capacity(12);
    d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    d.extend_from_slice(&size.to_be_bytes());
    d.extend_from_slice(&flags.to_be_bytes());
    d
}

/// An NBD_REP_INFO payload carrying a string (NAME or DESCRIPTION).
pub fn encode_info_string(kind: u16, s: &str) -> Vec<u8> {
    let mut d = Vec::with_capacity(2 + s.len());
    d.extend_from_slice(&kind.to_be_bytes());
    d.extend_from_slice(s.as_bytes());
    d
}

/// An NBD_REP_INFO payload of type NBD_INFO_BLOCK_SIZE.
pub fn encode_info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut d = Vec::with_capacity(14);
    d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    d.extend_from_slice(&min.to_be_bytes());
    d.extend_from_slice(&preferred.to_be_bytes());
    d.extend_from_slice(&max.to_be_bytes());
    d
}

/// An NBD_REP_SERVER payload: name length, name, description.
pub fn encode_rep_server(name: &str, description: &str) -> Vec<u8> {
    let mut d = Vec::with_capacity(4 + name.len() + description.len());
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(description.as_bytes());
    d
}

/// An NBD_REP_META_CONTEXT payload: context id and name.
pub fn encode_rep_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut d = Vec::with_capacity(4 + name.len());
    d.extend_from_slice(&id.to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d
}

/// What the server sends after NBD_OPT_EXPORT_NAME: size, flags, and 124
/// zero bytes unless the client asked for NO_ZEROES.
pub fn encode_export_name_reply(out: &mut Vec<u8>, size: u64, flags: u16, no_zeroes: bool) {
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; 124]);
    }
}

// ------------------------------------------------------------- transmission

/// A transmission-phase request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl Request {
    /// Bytes of payload that follow the header on the wire.
    #[inline]
    pub fn payload_len(&self) -> usize {
        if self.command == CMD_WRITE {
            self.len as usize
        } else {
            0
        }
    }
}

/// Parses a 28-byte request header (not its payload).
#[inline]
pub fn parse_request(buf: &[u8]) -> Result<Parse<Request>, ProtoError> {
    if buf.len() < REQUEST_HEADER_BYTES {
        return Ok(Parse::Incomplete);
    }
    let magic = be32(buf);
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::BadMagic {
            found: magic as u64,
            expected: REQUEST_MAGIC as u64,
        });
    }
    Ok(Parse::Done(
        Request {
            flags: be16(&buf[4..]),
            command: be16(&buf[6..]),
            cookie: be64(&buf[8..]),
            offset: be64(&buf[16..]),
            len: be32(&buf[24..]),
        },
        REQUEST_HEADER_BYTES,
    ))
}

/// Appends a request header (used by tests and the NBD client).
pub fn encode_request(out: &mut Vec<u8>, r: &Request) {
    out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&r.flags.to_be_bytes());
    out.extend_from_slice(&r.command.to_be_bytes());
    out.extend_from_slice(&r.cookie.to_be_bytes());
    out.extend_from_slice(&r.offset.to_be_bytes());
    out.extend_from_slice(&r.len.to_be_bytes());
}

/// Appends a simple reply header (data, if any, follows).
#[inline]
pub fn encode_simple_reply(out: &mut Vec<u8>, cookie: u64, error: u32) {
    let mut h = [0u8; SIMPLE_REPLY_BYTES];
    h[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&error.to_be_bytes());
    h[8..].copy_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&h);
}

/// Appends a structured reply chunk header for a payload of `len` bytes.
#[inline]
pub fn encode_chunk_header(out: &mut Vec<u8>, flags: u16, kind: u16, cookie: u64, len: u32) {
    let mut h = [0u8; CHUNK_HEADER_BYTES];
    h[..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..].copy_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&h);
}

/// Appends a final NBD_REPLY_TYPE_ERROR chunk with a message.
pub fn encode_structured_error(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    let mut msg = message.as_bytes();
    if msg.len() > MAX_STRING_BYTES {
        let mut end = MAX_STRING_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        msg = &msg[..end];
    }
    encode_chunk_header(
        out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        6 + msg.len() as u32,
    );
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

/// Appends a final NBD_REPLY_TYPE_NONE chunk: success with no payload.
pub fn encode_structured_done(out: &mut Vec<u8>, cookie: u64) {
    encode_chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0);
}

/// Appends a final NBD_REPLY_TYPE_BLOCK_STATUS chunk for base:allocation.
/// Extents are clipped so their sum never exceeds `len`; with `req_one`
/// only the first is sent. Returns the bytes described.
pub fn encode_block_status(
    out: &mut Vec<u8>,
    cookie: u64,
    context_id: u32,
    extents: &[Extent],
    len: u64,
    req_one: bool,
) -> u64 {
    let take = if req_one { 1 } else { extents.len() };
    let mut descs: Vec<(u32, u32)> = Vec::with_capacity(take.min(extents.len()));
    let mut covered = 0u64;
    for e in extents.iter().take(take) {
        if covered >= len {
            break;
        }
        // A descriptor length is u32: split long extents at 4 GiB - 4 KiB.
        let mut remaining = e.len.min(len - covered);
        let flags = (if e.hole { STATE_HOLE } else { 0 }) | (if e.zero { STATE_ZERO } else { 0 });
        while remaining > 0 {
            let n = remaining.min(u32::MAX as u64 & !4095) as u32;
            descs.push((n, flags));
            covered += n as u64;
            remaining -= n as u64;
            if req_one {
                break;
            }
        }
    }
    let payload = 4 + 8 * descs.len() as u32;
    encode_chunk_header(
        out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        cookie,
        payload,
    );
    out.extend_from_slice(&context_id.to_be_bytes());
    for (n, f) in descs {
        out.extend_from_slice(&n.to_be_bytes());
        out.extend_from_slice(&f.to_be_bytes());
    }
    covered
}

// ------------------------------------------------------------ client side
//
// What an NBD client (cache::backing::nbd_client) sends and parses: the mirror images of
// the server-side functions above, equally pure.

pub const GREETING_BYTES: usize = 18;
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;

/// Parses the server's opening (fixed newstyle only); returns its
/// handshake flags.
pub fn parse_greeting(buf: &[u8]) -> Result<Parse<u16>, ProtoError> {
    if buf.len() < GREETING_BYTES {
        return Ok(Parse::Incomplete);
    }
    for (at, expected) in [(0, NBDMAGIC), (8, IHAVEOPT)] {
        let found = be64(&buf[at..]);
        if found != expected {
            return Err(ProtoError::BadMagic { found, expected });
        }
    }
    Ok(Parse::Done(be16(&buf[16..]), GREETING_BYTES))
}

/// Appends an option request: IHAVEOPT, option, length, data.
pub fn encode_option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// The data of NBD_OPT_GO / NBD_OPT_INFO: export name and info requests.
pub fn encode_info_request(name: &str, requests: &[u16]) -> Vec<u8> {
    let mut d = Vec::with_capacity(6 + name.len() + 2 * requests.len());
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
    for r in requests {
        d.extend_from_slice(&r.to_be_bytes());
    }
    d
}

/// An option reply header: which option it answers, the reply type and
/// how many data bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply: u32,
    pub len: u32,
}

impl OptionReplyHeader {
    /// True for NBD_REP_ERR_* replies.
    pub fn is_error(&self) -> bool {
        self.reply & (1 << 31) != 0
    }
}

/// Parses a 20-byte option reply header.
pub fn parse_option_reply_header(buf: &[u8]) -> Result<Parse<OptionReplyHeader>, ProtoError> {
    if buf.len() < OPTION_REPLY_HEADER_BYTES {
        return Ok(Parse::Incomplete);
    }
    let magic = be64(buf);
    if magic != OPT_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            found: magic,
            expected: OPT_REPLY_MAGIC,
        });
    }
    Ok(Parse::Done(
        OptionReplyHeader {
            option: be32(&buf[8..]),
            reply: be32(&buf[12..]),
            len: be32(&buf[16..]),
        },
        OPTION_REPLY_HEADER_BYTES,
    ))
}

/// The payload of an NBD_REP_INFO reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfoReply {
    Export {
        size: u64,
        flags: u16,
    },
    BlockSize {
        min: u32,
        preferred: u32,
        max: u32,
    },
    Name(String),
    Description(String),
    /// An information type this client does not know (ignored).
    Unknown(u16),
}

/// Parses an NBD_REP_INFO payload.
pub fn parse_info_reply(data: &[u8]) -> Result<InfoReply, InvalidOption> {
    let mut r = Reader {
        buf: data,
        what: "REP_INFO",
    };
    let kind = r.u16("information type")?;
    let reply = match kind {
        INFO_EXPORT => {
            let size = be64(r.take(8, "export size")?);
            let flags = r.u16("transmission flags")?;
            InfoReply::Export { size, flags }
        }
        INFO_BLOCK_SIZE => InfoReply::BlockSize {
            min: r.u32("minimum block size")?,
            preferred: r.u32("preferred block size")?,
            max: r.u32("maximum block size")?,
        },
        INFO_NAME | INFO_DESCRIPTION => {
            let text = String::from_utf8_lossy(r.buf).into_owned();
            r.buf = &[];
            if kind == INFO_NAME {
                InfoReply::Name(text)
            } else {
                InfoReply::Description(text)
            }
        }
        other => {
            r.buf = &[];
            InfoReply::Unknown(other)
        }
    };
    r.finish()?;
    Ok(reply)
}

/// Bytes of the server's answer to NBD_OPT_EXPORT_NAME.
pub fn export_name_reply_bytes(no_zeroes: bool) -> usize {
    if no_zeroes {
        10
    } else {
        134
    }
}

/// Parses the answer to NBD_OPT_EXPORT_NAME: size and transmission flags.
pub fn parse_export_name_reply(buf: &[u8], no_zeroes: bool) -> Parse<(u64, u16)> {
    let n = export_name_reply_bytes(no_zeroes);
    if buf.len() < n {
        return Parse::Incomplete;
    }
    Parse::Done((be64(buf), be16(&buf[8..])), n)
}

/// A simple reply header as the client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: u32,
    pub cookie: u64,
}

/// Parses a 16-byte simple reply header (a structured reply is a protocol
/// error for a client that did not negotiate them).
pub fn parse_simple_reply(buf: &[u8]) -> Result<Parse<SimpleReply>, ProtoError> {
    if buf.len() < SIMPLE_REPLY_BYTES {
        return Ok(Parse::Incomplete);
    }
    let magic = be32(buf);
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            found: magic as u64,
            expected: SIMPLE_REPLY_MAGIC as u64,
        });
    }
    Ok(Parse::Done(
        SimpleReply {
            error: be32(&buf[4..]),
            cookie: be64(&buf[8..]),
        },
        SIMPLE_REPLY_BYTES,
    ))
}

/// The OS error for an NBD error value (NBD uses Linux's numbers; anything
/// unknown is EIO).
pub fn io_error_for_errno(errno: u32) -> std::io::Error {
    match errno {
        EPERM | EIO | ENOMEM | EINVAL | ENOSPC | EOVERFLOW | ENOTSUP | ESHUTDOWN => {
            std::io::Error::from_raw_os_error(errno as i32)
        }
        _ => std::io::Error::from_raw_os_error(libc::EIO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req_bytes(magic: u32, flags: u16, cmd: u16, cookie: u64, off: u64, len: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&magic.to_be_bytes());
        v.extend_from_slice(&flags.to_be_bytes());
        v.extend_from_slice(&cmd.to_be_bytes());
        v.extend_from_slice(&cookie.to_be_bytes());
        v.extend_from_slice(&off.to_be_bytes());
        v.extend_from_slice(&len.to_be_bytes());
        v
    }

    #[test]
    fn request_roundtrip_and_truncation() {
        let r = Request {
            flags: 1,
            command: CMD_WRITE,
            cookie: 0xdead_beef,
            offset: u64::MAX,
            len: u32::MAX,
        };
        let mut v = Vec::new();
        encode_request(&mut v, &r);
        assert_eq!(v.len(), REQUEST_HEADER_BYTES);
        for cut in 0..v.len() {
            assert_eq!(parse_request(&v[..cut]).unwrap(), Parse::Incomplete);
        }
        assert_eq!(parse_request(&v).unwrap(), Parse::Done(r, 28));
        assert_eq!(r.payload_len(), u32::MAX as usize);
    }

    #[test]
    fn request_bad_magic() {
        let v = req_bytes(0x2560_9514, 0, 0, 0, 0, 0);
        assert!(matches!(
            parse_request(&v),
            Err(ProtoError::BadMagic {
                found: 0x2560_9514,
                ..
            })
        ));
        let zeros = [0u8; 28];
        assert!(parse_request(&zeros).is_err());
    }

    #[test]
    fn option_header() {
        let mut v = Vec::new();
        v.extend_from_slice(&IHAVEOPT.to_be_bytes());
        v.extend_from_slice(&OPT_GO.to_be_bytes());
        v.extend_from_slice(&7u32.to_be_bytes());
        assert_eq!(parse_option_header(&v[..15]).unwrap(), Parse::Incomplete);
        assert_eq!(
            parse_option_header(&v).unwrap(),
            Parse::Done(
                OptionHeader {
                    option: OPT_GO,
                    len: 7
                },
                16
            )
        );
        v[0] = b'X';
        assert!(parse_option_header(&v).is_err());
    }

    #[test]
    fn client_flags() {
        assert_eq!(check_client_flags(1), Ok(false));
        assert_eq!(check_client_flags(3), Ok(true));
        assert_eq!(check_client_flags(0), Err(ProtoError::NotFixedNewstyle(0)));
        assert_eq!(
            check_client_flags(4 | 1),
            Err(ProtoError::UnknownClientFlags(5))
        );
    }

    fn info_data(name: &str, reqs: &[u16]) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
        for r in reqs {
            d.extend_from_slice(&r.to_be_bytes());
        }
        d
    }

    #[test]
    fn info_request_parses_and_rejects_malformed() {
        let d = info_data("ram0", &[INFO_NAME, INFO_BLOCK_SIZE]);
        assert_eq!(
            parse_info_request(&d).unwrap(),
            InfoRequest {
                name: "ram0".into(),
                requests: vec![1, 3]
            }
        );
        // Every truncation is an error, never a panic.
        for cut in 0..d.len() {
            assert!(parse_info_request(&d[..cut]).is_err(), "cut {cut}");
        }
        let mut trailing = d.clone();
        trailing.push(0);
        assert!(parse_info_request(&trailing).is_err());
        // Name length larger than the payload.
        let mut lying = d.clone();
        lying[..4].copy_from_slice(&1000u32.to_be_bytes());
        assert!(parse_info_request(&lying).is_err());
        // Name length beyond the string limit.
        let mut huge = d;
        huge[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&huge).unwrap_err().0.contains("limit"));
        // Invalid UTF-8.
        let bad = info_data("\u{fffd}", &[]);
        let mut bad = bad;
        bad[4] = 0xff;
        assert!(parse_info_request(&bad).is_err());
    }

    #[test]
    fn meta_request_bounds_query_count() {
        let mut d = Vec::new();
        d.extend_from_slice(&4u32.to_be_bytes());
        d.extend_from_slice(b"ram0");
        d.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_meta_request(&d).unwrap_err().0.contains("claims"));
        let mut d = Vec::new();
        d.extend_from_slice(&0u32.to_be_bytes());
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&15u32.to_be_bytes());
        d.extend_from_slice(b"base:allocation");
        let m = parse_meta_request(&d).unwrap();
        assert_eq!(m.export, "");
        assert_eq!(m.queries, vec!["base:allocation"]);
        assert!(meta_query_matches("base:", true));
        assert!(!meta_query_matches("base:", false));
        assert!(!meta_query_matches("qemu:dirty-bitmap:x", true));
    }

    #[test]
    fn replies_encode() {
        let mut v = Vec::new();
        encode_simple_reply(&mut v, 7, EINVAL);
        assert_eq!(&v[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(be32(&v[4..]), 22);
        assert_eq!(be64(&v[8..]), 7);
        v.clear();
        encode_structured_error(&mut v, 9, ENOSPC, &"x".repeat(5000));
        assert_eq!(be16(&v[6..]), REPLY_TYPE_ERROR);
        assert_eq!(be32(&v[16..]) as usize, 6 + MAX_STRING_BYTES);
        assert_eq!(v.len(), 20 + 6 + MAX_STRING_BYTES);
    }

    #[test]
    fn block_status_clips_and_req_one() {
        let ext = [
            Extent {
                len: 4096,
                hole: true,
                zero: true,
            },
            Extent {
                len: 8192,
                hole: false,
                zero: false,
            },
        ];
        let mut v = Vec::new();
        assert_eq!(encode_block_status(&mut v, 1, 1, &ext, 6000, false), 6000);
        assert_eq!(be32(&v[16..]), 4 + 16);
        assert_eq!(be32(&v[24..]), 4096);
        assert_eq!(be32(&v[28..]), STATE_HOLE | STATE_ZERO);
        assert_eq!(be32(&v[32..]), 1904);
        assert_eq!(be32(&v[36..]), 0);
        v.clear();
        assert_eq!(encode_block_status(&mut v, 1, 1, &ext, 1 << 20, true), 4096);
        assert_eq!(be32(&v[16..]), 12);
        v.clear();
        let big = [Extent {
            len: 8 << 30,
            hole: true,
            zero: true,
        }];
        assert_eq!(
            encode_block_status(&mut v, 1, 1, &big, 8 << 30, false),
            8 << 30
        );
    }

    #[test]
    fn errno_mapping() {
        assert_eq!(errno_for(&Error::ReadOnly), EPERM);
        assert_eq!(errno_for(&Error::NoSpace("x".into())), ENOSPC);
        assert_eq!(
            errno_for(&Error::OutOfRange {
                offset: 0,
                len: 1,
                size: 0
            }),
            EINVAL
        );
        assert_eq!(
            errno_for(&Error::Io(std::io::Error::from_raw_os_error(libc::EDQUOT))),
            ENOSPC
        );
        assert_eq!(errno_for(&Error::Io(std::io::Error::other("x"))), EIO);
    }

    #[test]
    fn client_side_greeting_and_option_replies() {
        let mut g = Vec::new();
        encode_greeting(&mut g);
        for cut in 0..g.len() {
            assert_eq!(parse_greeting(&g[..cut]).unwrap(), Parse::Incomplete);
        }
        assert_eq!(
            parse_greeting(&g).unwrap(),
            Parse::Done(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES, 18)
        );
        let mut old = g.clone();
        old[8] = 0; // oldstyle servers send a size here
        assert!(parse_greeting(&old).is_err());

        let mut r = Vec::new();
        encode_option_reply(
            &mut r,
            OPT_GO,
            REP_INFO,
            &encode_info_export(1 << 30, 0x1234),
        );
        let Parse::Done(h, n) = parse_option_reply_header(&r).unwrap() else {
            panic!()
        };
        assert_eq!((h.option, h.reply, h.len, n), (OPT_GO, REP_INFO, 12, 20));
        assert!(!h.is_error());
        assert_eq!(
            parse_info_reply(&r[20..]).unwrap(),
            InfoReply::Export {
                size: 1 << 30,
                flags: 0x1234
            }
        );
        for cut in 0..12 {
            assert!(parse_info_reply(&r[20..20 + cut]).is_err(), "cut {cut}");
        }
        assert_eq!(
            parse_info_reply(&encode_info_block_size(1, 4096, 1 << 25)).unwrap(),
            InfoReply::BlockSize {
                min: 1,
                preferred: 4096,
                max: 1 << 25
            }
        );
        assert_eq!(
            parse_info_reply(&encode_info_string(INFO_NAME, "ram0")).unwrap(),
            InfoReply::Name("ram0".into())
        );
        assert_eq!(
            parse_info_reply(&[0, 99, 1, 2]).unwrap(),
            InfoReply::Unknown(99)
        );
        let err = OptionReplyHeader {
            option: OPT_GO,
            reply: REP_ERR_UNKNOWN,
            len: 0,
        };
        assert!(err.is_error());
        let mut bad = r.clone();
        bad[0] ^= 1;
        assert!(parse_option_reply_header(&bad).is_err());
    }

    #[test]
    fn client_side_options_requests_and_replies() {
        let d = encode_info_request("disk", &[INFO_BLOCK_SIZE]);
        assert_eq!(
            parse_info_request(&d).unwrap(),
            InfoRequest {
                name: "disk".into(),
                requests: vec![INFO_BLOCK_SIZE]
            }
        );
        let mut o = Vec::new();
        encode_option(&mut o, OPT_GO, &d);
        assert_eq!(
            parse_option_header(&o).unwrap(),
            Parse::Done(
                OptionHeader {
                    option: OPT_GO,
                    len: d.len() as u32
                },
                16
            )
        );
        let mut v = Vec::new();
        encode_simple_reply(&mut v, 42, EIO);
        assert_eq!(parse_simple_reply(&v[..15]).unwrap(), Parse::Incomplete);
        assert_eq!(
            parse_simple_reply(&v).unwrap(),
            Parse::Done(
                SimpleReply {
                    error: EIO,
                    cookie: 42
                },
                16
            )
        );
        let mut s = Vec::new();
        encode_chunk_header(&mut s, 0, 0, 1, 0);
        assert!(parse_simple_reply(&s).is_err());
        let mut e = Vec::new();
        encode_export_name_reply(&mut e, 5 << 20, 3, false);
        assert_eq!(parse_export_name_reply(&e[..133], false), Parse::Incomplete);
        assert_eq!(
            parse_export_name_reply(&e, false),
            Parse::Done((5 << 20, 3), 134)
        );
        assert_eq!(
            io_error_for_errno(ENOSPC).raw_os_error(),
            Some(libc::ENOSPC)
        );
        assert_eq!(io_error_for_errno(9999).raw_os_error(), Some(libc::EIO));
    }
}
