//! Opening one connection: the socket, the fixed-newstyle greeting, for
//! TLS URIs NBD_OPT_STARTTLS and the TLS handshake, then NBD_OPT_GO
//! (NBD_OPT_EXPORT_NAME for servers without it) over whichever stream we
//! now have:
//!
//! ```text
//!  connect ─▶ greeting, client flags ─┬─ plaintext ───────────────┬─▶ GO ─▶ ExportInfo
//!                                     └─ STARTTLS ─▶ ACK ─▶ TLS ──┘
//! ```
//!
//! The option steps are generic over the stream, so the plaintext path is
//! the code it always was. Failures become the precise [`ClientError`]s:
//! a server without TLS, a server that requires it, a certificate we do
//! not trust or that names another host, a client certificate the server
//! refused.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;

use crate::nbd::proto::*;

use super::tls::{classify, client_cert_why, rustls_error, TlsClient};
use super::transport::{Socket, Stream};
use super::uri::{Address, NbdUri};
use super::{ClientError, ClientOptions, ExportInfo};

/// What went wrong in the option phase, before it gets its context.
enum HandshakeError {
    Io(io::Error),
    Protocol(String),
    Refused(String),
    /// NBD_REP_ERR_TLS_REQD to an option sent in plaintext.
    TlsRequired,
    /// STARTTLS answered with an error reply (the reply's name).
    TlsUnsupported(String),
}

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        HandshakeError::Io(e)
    }
}

/// Connects to the server of `uri` and negotiates its export.
pub(super) fn open(
    uri: &NbdUri,
    opts: &ClientOptions,
    tls: Option<&TlsClient>,
) -> Result<(Stream, ExportInfo), ClientError> {
    let target = uri.target();
    let connect_err = |source| ClientError::Connect {
        target: target.clone(),
        source,
    };
    let mut sock = connect(&uri.address, opts).map_err(connect_err)?;
    let context = |e| error_for(e, uri, &target);
    let no_zeroes = greet(&mut sock).map_err(context)?;
    let Some(tls) = tls else {
        let info = negotiate(&mut sock, &uri.export, no_zeroes).map_err(context)?;
        return Ok((Stream::Plain(sock), info));
    };
    starttls(&mut sock).map_err(context)?;
    let tls_err = |e: io::Error| match rustls_error(&e) {
        Some(r) => classify(r.clone(), tls, &target),
        None => connect_err(e),
    };
    let mut stream = tls.handshake(sock).map_err(tls_err)?;
    match negotiate(&mut stream, &uri.export, no_zeroes) {
        Ok(info) => Ok((Stream::Tls(Box::new(stream)), info)),
        Err(HandshakeError::Io(e)) if rustls_error(&e).is_some() => Err(tls_err(e)),
        // TLS 1.3 ends the client's handshake before the server has
        // checked our certificate: a server that refuses it without an
        // alert (GnuTLS servers, nbdkit) just hangs up here.
        Err(HandshakeError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
            ) =>
        {
            Err(ClientError::ClientCertificateRefused {
                target,
                why: client_cert_why(
                    tls,
                    "the server hung up right after the TLS handshake, before any NBD option",
                ),
            })
        }
        Err(e) => Err(context(e)),
    }
}

/// A [`HandshakeError`] with the URI and server it happened with.
fn error_for(e: HandshakeError, uri: &NbdUri, target: &str) -> ClientError {
    let target = target.to_owned();
    match e {
        HandshakeError::Io(source) => ClientError::Connect { target, source },
        HandshakeError::Protocol(why) => ClientError::Protocol { target, why },
        HandshakeError::Refused(why) => ClientError::Refused {
            target,
            export: uri.export.clone(),
            why,
        },
        HandshakeError::TlsRequired => ClientError::TlsRequired { target },
        HandshakeError::TlsUnsupported(reply) => ClientError::TlsUnsupported { target, reply },
    }
}

/// The socket, with timeouts on every read and write.
fn connect(address: &Address, opts: &ClientOptions) -> io::Result<Socket> {
    match address {
        Address::Tcp { host, port } => {
            let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
            for a in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&a, opts.timeout) {
                    Ok(s) => {
                        s.set_nodelay(true)?;
                        s.set_read_timeout(Some(opts.timeout))?;
                        s.set_write_timeout(Some(opts.timeout))?;
                        return Ok(Socket::Tcp(s));
                    }
                    Err(e) => last = e,
                }
            }
            Err(last)
        }
        Address::Unix { socket } => {
            let s = UnixStream::connect(socket)?;
            s.set_read_timeout(Some(opts.timeout))?;
            s.set_write_timeout(Some(opts.timeout))?;
            Ok(Socket::Unix(s))
        }
    }
}

fn read_option_reply<S: Read>(s: &mut S) -> Result<(OptionReplyHeader, Vec<u8>), HandshakeError> {
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

/// Reads the greeting and sends our flags; true when the server omits the
/// 124 zero bytes after NBD_OPT_EXPORT_NAME.
fn greet<S: Read + Write>(s: &mut S) -> Result<bool, HandshakeError> {
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
    Ok(no_zeroes)
}

/// NBD_OPT_STARTTLS; Ok once the server has acked it (the TLS handshake
/// comes next).
fn starttls<S: Read + Write>(s: &mut S) -> Result<(), HandshakeError> {
    let mut out = Vec::new();
    encode_option(&mut out, OPT_STARTTLS, &[]);
    s.write_all(&out)?;
    let (h, data) = read_option_reply(s)?;
    if h.option != OPT_STARTTLS {
        return Err(HandshakeError::Protocol(format!(
            "reply to option {} while waiting for STARTTLS",
            h.option
        )));
    }
    let name = match h.reply {
        REP_ACK if data.is_empty() => return Ok(()),
        REP_ACK => return Err(HandshakeError::Protocol("STARTTLS ack with data".into())),
        REP_ERR_UNSUP => "NBD_REP_ERR_UNSUP",
        REP_ERR_POLICY => "NBD_REP_ERR_POLICY",
        REP_ERR_INVALID => "NBD_REP_ERR_INVALID",
        r if h.is_error() => return Err(HandshakeError::TlsUnsupported(format!("error {r:#x}"))),
        r => {
            return Err(HandshakeError::Protocol(format!(
                "unexpected reply type {r} to STARTTLS"
            )))
        }
    };
    let msg = String::from_utf8_lossy(&data);
    Err(HandshakeError::TlsUnsupported(if msg.is_empty() {
        name.to_owned()
    } else {
        format!("{name}: {msg}")
    }))
}

/// NBD_OPT_GO for `export`, asking for its block sizes.
fn negotiate<S: Read + Write>(
    s: &mut S,
    export: &str,
    no_zeroes: bool,
) -> Result<ExportInfo, HandshakeError> {
    let mut out = Vec::new();
    encode_option(
        &mut out,
        OPT_GO,
        &encode_info_request(export, &[INFO_BLOCK_SIZE]),
    );
    s.write_all(&out)?;
    s.flush()?;
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
            REP_ERR_TLS_REQD => return Err(HandshakeError::TlsRequired),
            r if h.is_error() => return Err(refusal(r, &data)),
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

/// The error reply `reply` (with its message) to GO.
fn refusal(reply: u32, data: &[u8]) -> HandshakeError {
    let msg = String::from_utf8_lossy(data).into_owned();
    let kind = match reply {
        REP_ERR_UNKNOWN => "no such export",
        REP_ERR_POLICY => "refused by policy",
        REP_ERR_BLOCK_SIZE_REQD => "the server requires block size negotiation",
        REP_ERR_SHUTDOWN => "the server is shutting down",
        _ => "error",
    };
    HandshakeError::Refused(if msg.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}: {msg}")
    })
}

/// For servers without NBD_OPT_GO.
fn export_name_fallback<S: Read + Write>(
    s: &mut S,
    export: &str,
    no_zeroes: bool,
) -> Result<ExportInfo, HandshakeError> {
    let mut out = Vec::new();
    encode_option(&mut out, OPT_EXPORT_NAME, export.as_bytes());
    s.write_all(&out)?;
    s.flush()?;
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
