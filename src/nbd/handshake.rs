//! The fixed-newstyle handshake: greeting, then options until the client
//! picks an export (NBD_OPT_GO / NBD_OPT_EXPORT_NAME), asks for TLS
//! (NBD_OPT_STARTTLS: the caller runs the TLS handshake and calls
//! `options` again over TLS, with what was negotiated before forgotten),
//! or leaves. What STARTTLS gets is the listener's [`TlsOffer`]; with
//! `Required` every other option but ABORT is answered NBD_REP_ERR_TLS_REQD
//! (no export name in it) and NBD_OPT_EXPORT_NAME ends the connection.
//!
//! Per-export access rules (`access.rs`) decide what this client sees: an
//! export it may not see is not listed, INFO/GO/meta contexts answer
//! NBD_REP_ERR_UNKNOWN exactly as for a missing export (the message names
//! only exports it may see), and NBD_OPT_EXPORT_NAME ends the connection.
//! A read-only grant sets NBD_FLAG_READ_ONLY for this connection.
//!
//! A connection the server refuses once it knows more about the client
//! (over the per-identity connection limit, known after the TLS
//! handshake: [`Handshake::refuse`]) answers every option but ABORT with
//! NBD_REP_ERR_POLICY and the reason, so the client's error names it, and
//! NBD_OPT_EXPORT_NAME ends the connection.
//!
//! Blocking I/O on one connection; all parsing is in `proto`. Malformed option
//! data is answered with NBD_REP_ERR_INVALID and the handshake continues;
//! unknown options get NBD_REP_ERR_UNSUP; a bad magic or an unsupported
//! client ends the connection. Options longer than `MAX_OPTION_BYTES` are
//! drained without being stored and answered with NBD_REP_ERR_TOO_BIG.

use std::io::{self, Read, Write};
use std::sync::Arc;

use super::access::{AccessTable, Grant, Reason, Refusals, Source};
use super::proto::*;
use crate::block::{Export, ExportTable};
use crate::ratelog::RateLimit;

/// The block sizes advertised: any alignment works, 4 KiB is best.
pub const MIN_BLOCK_BYTES: u32 = 1;
pub const PREFERRED_BLOCK_BYTES: u32 = 4096;

/// What the handshake agreed on.
pub struct Negotiated {
    pub export: Arc<Export>,
    /// NBD_OPT_STRUCTURED_REPLY was acknowledged.
    pub structured: bool,
    /// base:allocation was selected for this export.
    pub base_allocation: bool,
    /// The access rules grant this client read-only access (the export
    /// itself may be read-write).
    pub read_only: bool,
}

/// Who the client is, as the access rules see it, and where refusals are
/// counted.
pub struct Client<'a> {
    pub access: &'a AccessTable,
    pub refusals: &'a Refusals,
    pub source: Source,
    /// The peer address for log lines.
    pub peer: String,
}

static NO_RULES: AccessTable = AccessTable::new();
static UNCOUNTED: Refusals = Refusals::new();

impl Client<'static> {
    /// A client of a server without access rules.
    pub fn open(source: Source, peer: String) -> Self {
        Client {
            access: &NO_RULES,
            refusals: &UNCOUNTED,
            source,
            peer,
        }
    }
}

/// Where option haggling stopped.
pub enum Step {
    /// An export was chosen: the transmission phase starts once the
    /// caller has sent [`Handshake::take_final_reply`] (held back so the
    /// server can count the connection as established before the client
    /// can know it is, and open another).
    Go(Negotiated),
    /// NBD_OPT_STARTTLS was acknowledged: the caller runs the TLS
    /// handshake now and continues with [`Handshake::options`] over TLS.
    StartTls,
}

/// What NBD_OPT_STARTTLS gets on this connection (decided per listener,
/// fixed for the life of the connection as the spec asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsOffer {
    /// No certificates: NBD_REP_ERR_UNSUP.
    Unsupported,
    /// Certificates, but TLS is off on this listener: NBD_REP_ERR_POLICY.
    Refused,
    /// TLS when the client asks (SELECTIVETLS, every export open).
    Optional,
    /// TLS before anything else (FORCEDTLS): other options get
    /// NBD_REP_ERR_TLS_REQD, NBD_OPT_EXPORT_NAME ends the connection.
    Required,
    /// The session is already over TLS: a second STARTTLS is invalid.
    Active,
}

/// Why a handshake ended without a transmission phase.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("client aborted the handshake")]
    Aborted,
    #[error("client asked for unknown export '{0}' with NBD_OPT_EXPORT_NAME")]
    UnknownExport(String),
    /// NBD_OPT_EXPORT_NAME cannot be refused with an error, so a client
    /// that sends it before TLS in `require` mode is disconnected.
    #[error("client chose an export with NBD_OPT_EXPORT_NAME before starting the TLS this server requires")]
    TlsRequired,
    /// The server refused the connection ([`Handshake::refuse`]) and the
    /// client chose an export with NBD_OPT_EXPORT_NAME, which cannot be
    /// answered with an error.
    #[error("refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Proto(#[from] ProtoError),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// State kept across options.
struct Session<'a> {
    exports: &'a ExportTable,
    client: Client<'a>,
    /// The client certificate's identity once TLS started.
    identity: Option<String>,
    tls: TlsOffer,
    /// Set by [`Handshake::refuse`]: why every option is refused.
    refused: Option<String>,
    structured: bool,
    /// Export for which base:allocation was set (contexts are per export).
    meta_export: Option<String>,
    no_zeroes: bool,
    out: Vec<u8>,
}

/// Runs the whole handshake on `stream` with TLS unsupported.
pub fn negotiate<S: Read + Write>(
    stream: &mut S,
    exports: &ExportTable,
) -> Result<Negotiated, HandshakeError> {
    let client = Client::open(Source::Unix, "unix".into());
    let mut h = Handshake::new(exports, client, TlsOffer::Unsupported);
    h.greet(stream)?;
    match h.options(stream)? {
        Step::Go(n) => {
            stream.write_all(&h.take_final_reply())?;
            Ok(n)
        }
        Step::StartTls => unreachable!("STARTTLS is refused when TLS is unsupported"),
    }
}

/// The handshake of one connection, which may change streams half-way
/// (plaintext, then TLS after NBD_OPT_STARTTLS).
pub struct Handshake<'a> {
    s: Session<'a>,
}

impl<'a> Handshake<'a> {
    pub fn new(exports: &'a ExportTable, client: Client<'a>, tls: TlsOffer) -> Self {
        Handshake {
            s: Session {
                exports,
                client,
                identity: None,
                tls,
                refused: None,
                structured: false,
                meta_export: None,
                no_zeroes: false,
                out: Vec::with_capacity(256),
            },
        }
    }

    /// Sends the greeting and reads the client's flags.
    pub fn greet<S: Read + Write>(&mut self, stream: &mut S) -> Result<(), HandshakeError> {
        let s = &mut self.s;
        encode_greeting(&mut s.out);
        stream.write_all(&s.out)?;
        s.out.clear();
        let mut flags = [0u8; 4];
        stream.read_exact(&mut flags)?;
        s.no_zeroes = check_client_flags(u32::from_be_bytes(flags))?;
        Ok(())
    }

    /// The session is over TLS from now on. What was negotiated before is
    /// forgotten (structured replies, meta contexts): the spec lets a
    /// client trust only what it negotiated over TLS, and a man in the
    /// middle could have injected it (nbdkit's CVE-2021-3716).
    /// `identity` is the client certificate's, for the access rules.
    pub fn tls_started(&mut self, identity: Option<String>) {
        self.s.identity = identity;
        self.s.tls = TlsOffer::Active;
        self.s.structured = false;
        self.s.meta_export = None;
    }

    /// Refuses the rest of this handshake: every option but ABORT gets
    /// NBD_REP_ERR_POLICY with `why` (the caller logged and counted it).
    pub fn refuse(&mut self, why: String) {
        self.s.refused = Some(why);
    }

    /// The replies to the option that ended the handshake with
    /// [`Step::Go`], for the caller to send.
    pub fn take_final_reply(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.s.out)
    }

    /// Answers options until the client picks an export, asks for TLS, or
    /// leaves. Reads exactly each option's bytes, never ahead: after
    /// STARTTLS the next byte on the socket belongs to the TLS handshake
    /// (plaintext injected after the option must not be taken as options).
    pub fn options<S: Read + Write>(&mut self, stream: &mut S) -> Result<Step, HandshakeError> {
        let s = &mut self.s;
        let mut header = [0u8; OPTION_HEADER_BYTES];
        loop {
            stream.read_exact(&mut header)?;
            let Parse::Done(h, _) = parse_option_header(&header)? else {
                unreachable!("a full header was read");
            };
            if h.len > MAX_OPTION_BYTES {
                io::copy(&mut (&mut *stream).take(h.len as u64), &mut io::sink())?;
                if h.option == OPT_EXPORT_NAME {
                    return Err(match s.tls {
                        TlsOffer::Required => {
                            s.client.refusals.count(Reason::TlsRequired);
                            HandshakeError::TlsRequired
                        }
                        _ => HandshakeError::UnknownExport("<oversized name>".into()),
                    });
                }
                if s.tls == TlsOffer::Required && h.option != OPT_ABORT {
                    s.tls_required(h.option);
                } else {
                    let msg = format!(
                        "option data of {} bytes exceeds the {MAX_OPTION_BYTES}-byte limit",
                        h.len
                    );
                    s.error(h.option, REP_ERR_TOO_BIG, &msg);
                }
            } else {
                let mut data = vec![0u8; h.len as usize];
                stream.read_exact(&mut data)?;
                match s.option(h.option, &data)? {
                    Some(step @ Step::Go(_)) => return Ok(step),
                    Some(step) => {
                        stream.write_all(&s.out)?;
                        s.out.clear();
                        return Ok(step);
                    }
                    None if h.option == OPT_ABORT => {
                        // Best effort: the client may already have gone.
                        let _ = stream.write_all(&s.out);
                        return Err(HandshakeError::Aborted);
                    }
                    None => {}
                }
            }
            stream.write_all(&s.out)?;
            s.out.clear();
        }
    }
}

impl Session<'_> {
    fn reply(&mut self, option: u32, kind: u32, data: &[u8]) {
        encode_option_reply(&mut self.out, option, kind, data);
    }

    fn error(&mut self, option: u32, kind: u32, message: &str) {
        tracing::debug!(option, kind, message, "option refused");
        self.reply(option, kind, message.as_bytes());
    }

    fn unknown_export(&mut self, option: u32, name: &str) {
        let visible: Vec<String> = self
            .exports
            .list()
            .iter()
            .filter(|e| self.grant(e) != Grant::Denied)
            .map(|e| e.name.clone())
            .collect();
        let msg = format!(
            "no export named '{name}'; available: {}",
            visible.join(", ")
        );
        self.error(option, REP_ERR_UNKNOWN, &msg);
    }

    /// What the access rules give this client for `export`.
    fn grant(&self, export: &Export) -> Grant {
        let c = &self.client;
        c.access
            .grant(&export.name, self.identity.as_deref(), &c.source)
    }

    /// The export is open to this client: Some(read_only). None: it is
    /// hidden, and the refusal is logged and counted.
    fn admit(&self, export: &Export) -> Option<bool> {
        match self.grant(export) {
            Grant::ReadWrite => Some(false),
            Grant::ReadOnly => Some(true),
            Grant::Denied => {
                self.client.refusals.count(Reason::NotAllowed);
                static REFUSED: RateLimit = RateLimit::per_10s();
                if let Some(more) = REFUSED.admit() {
                    tracing::warn!(
                        peer = %self.client.peer,
                        identity = self.identity.as_deref().unwrap_or("anonymous"),
                        export = %export.name,
                        "NBD client refused: the access rules do not allow it this export{more}"
                    );
                }
                None
            }
        }
    }

    fn tls_required(&mut self, option: u32) {
        self.client.refusals.count(Reason::TlsRequired);
        self.error(
            option,
            REP_ERR_TLS_REQD,
            "this server requires TLS: start it with NBD_OPT_STARTTLS",
        );
    }

    /// Handles one option; `Some` when the handshake stops here (an export
    /// was chosen or TLS starts).
    fn option(&mut self, option: u32, data: &[u8]) -> Result<Option<Step>, HandshakeError> {
        if let Some(why) = &self.refused {
            match option {
                OPT_ABORT => {}
                OPT_EXPORT_NAME => return Err(HandshakeError::Refused(why.clone())),
                _ => {
                    let why = why.clone();
                    self.error(option, REP_ERR_POLICY, &why);
                    return Ok(None);
                }
            }
        }
        if self.tls == TlsOffer::Required {
            match option {
                OPT_STARTTLS | OPT_ABORT => {}
                OPT_EXPORT_NAME => {
                    self.client.refusals.count(Reason::TlsRequired);
                    return Err(HandshakeError::TlsRequired);
                }
                _ => {
                    self.tls_required(option);
                    return Ok(None);
                }
            }
        }
        match option {
            OPT_EXPORT_NAME => {
                let name =
                    parse_export_name(data).map_err(|e| HandshakeError::UnknownExport(e.0))?;
                let Some(export) = self.exports.get(&name) else {
                    return Err(HandshakeError::UnknownExport(name));
                };
                if let Some(why) = export.unavailable() {
                    static REFUSED: crate::ratelog::RateLimit =
                        crate::ratelog::RateLimit::per_10s();
                    if let Some(more) = REFUSED.admit() {
                        tracing::info!("NBD client refused: {why}{more}");
                    }
                    return Err(HandshakeError::UnknownExport(name));
                }
                let Some(read_only) = self.admit(&export) else {
                    return Err(HandshakeError::UnknownExport(name));
                };
                let mut flags = export.transmission_flags(self.structured);
                if read_only {
                    flags |= TFLAG_READ_ONLY;
                }
                encode_export_name_reply(
                    &mut self.out,
                    export.backend.size(),
                    flags,
                    self.no_zeroes,
                );
                return Ok(Some(Step::Go(self.finish(export, read_only))));
            }
            OPT_ABORT => self.reply(option, REP_ACK, &[]),
            OPT_LIST => {
                if !data.is_empty() {
                    self.error(option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
                } else {
                    for e in self.exports.list() {
                        if self.grant(&e) == Grant::Denied {
                            continue; // not listed: hidden names do not leak
                        }
                        let d = encode_rep_server(&e.name, &e.description);
                        self.reply(option, REP_SERVER, &d);
                    }
                    self.reply(option, REP_ACK, &[]);
                }
            }
            OPT_STARTTLS => return Ok(self.start_tls(data)),
            OPT_INFO | OPT_GO => return Ok(self.info_go(option, data)),
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.error(
                        option,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    );
                } else {
                    self.structured = true;
                    self.reply(option, REP_ACK, &[]);
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta(option, data),
            other => {
                let msg = format!("option {other} is not supported by this server");
                self.error(other, REP_ERR_UNSUP, &msg);
            }
        }
        Ok(None)
    }

    /// NBD_OPT_INFO and NBD_OPT_GO: `Some(Go)` when GO picked an export.
    fn info_go(&mut self, option: u32, data: &[u8]) -> Option<Step> {
        match parse_info_request(data) {
            Err(e) => self.error(option, REP_ERR_INVALID, &e.0),
            Ok(req) => match self.exports.get(&req.name) {
                None => self.unknown_export(option, &req.name),
                Some(export) if self.grant(&export) == Grant::Denied => {
                    self.admit(&export);
                    self.unknown_export(option, &req.name);
                }
                Some(export) if export.unavailable().is_some() => {
                    let why = export.unavailable().unwrap_or_default();
                    self.error(option, REP_ERR_UNKNOWN, &why);
                }
                Some(export) => {
                    let read_only = self.grant(&export) == Grant::ReadOnly;
                    let mut flags = export.transmission_flags(self.structured);
                    if read_only {
                        flags |= TFLAG_READ_ONLY;
                    }
                    let size = export.backend.size();
                    self.reply(option, REP_INFO, &encode_info_export(size, flags));
                    for r in req.requests {
                        match r {
                            INFO_NAME => {
                                let d = encode_info_string(INFO_NAME, &export.name);
                                self.reply(option, REP_INFO, &d);
                            }
                            INFO_DESCRIPTION => {
                                let d = encode_info_string(INFO_DESCRIPTION, &export.description);
                                self.reply(option, REP_INFO, &d);
                            }
                            _ => {} // unknown or already sent: ignored per spec
                        }
                    }
                    let bs = encode_info_block_size(
                        MIN_BLOCK_BYTES,
                        PREFERRED_BLOCK_BYTES,
                        MAX_PAYLOAD_BYTES,
                    );
                    self.reply(option, REP_INFO, &bs);
                    self.reply(option, REP_ACK, &[]);
                    if option == OPT_GO {
                        // Contexts were chosen for one export name; a
                        // different one (or the default alias) voids them.
                        if self.meta_export.as_deref() != Some(req.name.as_str()) {
                            self.meta_export = None;
                        }
                        return Some(Step::Go(self.finish(export, read_only)));
                    }
                }
            },
        }
        None
    }

    /// NBD_OPT_STARTTLS: `Some(StartTls)` once acknowledged.
    fn start_tls(&mut self, data: &[u8]) -> Option<Step> {
        let option = OPT_STARTTLS;
        if !data.is_empty() {
            self.error(option, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data");
            return None;
        }
        match self.tls {
            TlsOffer::Unsupported => {
                let msg = "TLS is not configured on this server (no certificates)";
                self.error(option, REP_ERR_UNSUP, msg);
            }
            TlsOffer::Refused => {
                let msg = "TLS is turned off on this listener";
                self.error(option, REP_ERR_POLICY, msg);
            }
            TlsOffer::Active => {
                self.error(option, REP_ERR_INVALID, "TLS is already active");
            }
            TlsOffer::Optional | TlsOffer::Required => {
                self.reply(option, REP_ACK, &[]);
                return Some(Step::StartTls);
            }
        }
        None
    }

    fn meta(&mut self, option: u32, data: &[u8]) {
        let set = option == OPT_SET_META_CONTEXT;
        if set {
            // The spec: SET replaces the selection even when it fails.
            self.meta_export = None;
        }
        if set && !self.structured {
            let msg = "negotiate NBD_OPT_STRUCTURED_REPLY before NBD_OPT_SET_META_CONTEXT";
            return self.error(option, REP_ERR_INVALID, msg);
        }
        let req = match parse_meta_request(data) {
            Ok(r) => r,
            Err(e) => return self.error(option, REP_ERR_INVALID, &e.0),
        };
        match self.exports.get(&req.export) {
            None => return self.unknown_export(option, &req.export),
            Some(e) if self.admit(&e).is_none() => {
                return self.unknown_export(option, &req.export);
            }
            Some(_) => {}
        }
        let wanted = if set {
            req.queries.iter().any(|q| meta_query_matches(q, false))
        } else {
            req.queries.is_empty() || req.queries.iter().any(|q| meta_query_matches(q, true))
        };
        if wanted {
            let d = encode_rep_meta_context(META_BASE_ALLOCATION_ID, META_BASE_ALLOCATION);
            self.reply(option, REP_META_CONTEXT, &d);
        }
        if set {
            self.meta_export = wanted.then_some(req.export);
        }
        self.reply(option, REP_ACK, &[]);
    }

    fn finish(&mut self, export: Arc<Export>, read_only: bool) -> Negotiated {
        Negotiated {
            read_only,
            base_allocation: self.structured && self.meta_export.is_some(),
            structured: self.structured,
            export,
        }
    }
}
