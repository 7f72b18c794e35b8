//! One NVMe/TCP connection: one queue (admin or I/O), one thread, blocking
//! socket I/O. The receive path is a small state machine over an input
//! buffer:
//!
//! ```text
//!  ICReq ──► ICResp ──► Connect ──► loop {
//!     common header (8) ─► frame(): lengths checked against the limit
//!        ─► whole PDU buffered? ─► CapsuleCmd ─► execute, or R2T (write data
//!                                                 through the transport)
//!                                   H2CData    ─► into the drive (a plain
//!                                                 Write), else into the
//!                                                 pending write's buffer;
//!                                                 complete? reply / execute
//!                                   TermReq    ─► close
//!     nothing complete buffered ─► flush replies, read more }
//! ```
//!
//! A command moves through named states: new → (needs data: waiting for a
//! buffer → R2T sent → data complete) → executing → completed (its CQE in
//! the output buffer). Replies of every command parsed from one read go
//! out in one write.
//!
//! Bounds (so a host cannot make a connection hold unbounded memory): the
//! input buffer holds one PDU of at most `max_h2c_data` or in-capsule
//! bytes plus headers; write data awaiting H2CData (R2Ts outstanding,
//! counted whether it is buffered or goes into the drive in place) is at most
//! `write_buffer_bytes` (later writes wait, as SQEs, for their R2T; at
//! most a queue's worth of them); finished transfers' buffers kept for
//! reuse are at most half of `write_buffer_bytes`; one command moves at
//! most MDTS bytes. A malformed PDU gets a C2HTermReq and the connection closes; a host
//! that stops reading is cut off after `reply_timeout`.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::log::ErrorEntry;
use super::pdu::{self, CommonHeader, Digests, Frame, Pdu, PduError, CH_LEN};
use super::sqe::{admin, fctype, io as io_op, Cqe, DataPtr, Sqe, Status};
use super::state::AdminState;
use super::target::{Controller, Target};
use crate::block::Export;
use crate::metrics::ConnRecorder;
use crate::nbd::access::Source;

/// How often an admin queue wakes without input (keep-alive, events).
pub const ADMIN_TICK: Duration = Duration::from_millis(250);

/// Write buffers a queue keeps for reuse (each at most MDTS, 1 MiB; all
/// of them at most half of `write_buffer_bytes`).
const SPARE_BUFFERS: usize = 4;

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// socket error
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The host broke the protocol (a TermReq was sent).
    #[error("protocol error: {0}")]
    Pdu(#[from] PduError),
    /// The host sent a TermReq.
    #[error("host terminated the connection (FES {0:#x})")]
    HostTerminated(u16),
    /// No ICReq or Connect in time.
    #[error("no connect within the deadline")]
    ConnectTimeout,
    /// The controller went away (admin queue closed, keep-alive expired).
    #[error("controller gone")]
    ControllerGone,
    /// The keep-alive timer expired.
    #[error("keep-alive timeout")]
    KeepAliveExpired,
}

/// The input buffer (see the module docs for its bound).
struct InBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl InBuf {
    fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Reads more; Ok(false) at end of file.
    fn fill(&mut self, s: &mut TcpStream) -> io::Result<bool> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let n = s.read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n > 0)
    }

    /// The next whole PDU's header and frame, or None when more bytes are
    /// needed.
    fn next(
        &self,
        digests: Digests,
        max_plen: u32,
    ) -> Result<Option<(CommonHeader, Frame)>, PduError> {
        let b = self.buffered();
        let Some(ch) = b.get(..CH_LEN) else {
            return Ok(None);
        };
        let ch = pdu::decode_common(ch.try_into().expect("8 bytes"))?;
        let f = pdu::frame(&ch, digests, max_plen)?;
        Ok((b.len() >= f.total()).then_some((ch, f)))
    }
}

/// A write whose data comes through R2T/H2CData.
struct PendingWrite {
    sqe: Sqe,
    /// The data received so far, for a buffered write: a buffer from
    /// `spare` with room for `want`; for an in-place one, the start of a
    /// block split between two PDUs (at most one block).
    buf: Vec<u8>,
    /// Bytes received so far (H2CData comes in order: the next offset).
    got: usize,
    /// The command's whole length.
    want: usize,
    /// An in-place write (`Queue::write_in_place`): where its data goes
    /// in the drive, and the first chunk's failure (or success).
    in_place: Option<(u64, Status)>,
}

/// Per-queue state: everything but the input buffer (so handlers can
/// borrow a PDU's bytes while they write replies).
pub(super) struct Queue {
    pub(super) target: Arc<Target>,
    pub(super) stream: TcpStream,
    pub(super) source: Source,
    pub(super) local: SocketAddr,
    pub(super) out: Vec<u8>,
    hdr: Vec<u8>,
    pub(super) digests: Digests,
    /// The host's data alignment in bytes (HPDA).
    align: usize,
    pub(super) qid: u16,
    pub(super) entries: u16,
    sq_head: u16,
    pub(super) ctrl: Option<Arc<Controller>>,
    pub(super) admin: Option<AdminState>,
    /// The drive of an I/O queue, and its metrics recorder.
    pub(super) export: Option<Arc<Export>>,
    pub(super) recorder: Option<ConnRecorder>,
    pending: HashMap<u16, PendingWrite>,
    waiting: VecDeque<Sqe>,
    pending_bytes: usize,
    /// Set by a Fabrics Disconnect: close once replies are out.
    pub(super) closing: bool,
    /// The command being executed, for its error log entry should it fail.
    current: Option<Sqe>,
    /// Write buffers of finished R2T transfers, kept for the next ones (a
    /// 1 MiB write then costs no allocation and no zero-fill).
    spare: Vec<Vec<u8>>,
}

/// Serves one accepted connection until it ends.
pub fn serve(target: Arc<Target>, stream: TcpStream) -> Result<(), ConnError> {
    let source = Source::Ip(stream.peer_addr()?.ip());
    let local = stream.local_addr()?;
    let _ = stream.set_nodelay(true);
    stream.set_write_timeout(Some(target.config.reply_timeout))?;
    let cap = target
        .config
        .max_h2c_data
        .max(target.config.in_capsule_bytes) as usize
        + 256;
    let mut inb = InBuf {
        buf: vec![0; cap.max(8192 + 256)],
        start: 0,
        end: 0,
    };
    let mut q = Queue {
        target,
        stream,
        source,
        local,
        out: Vec::with_capacity(64 * 1024),
        hdr: Vec::with_capacity(160),
        digests: Digests::default(),
        align: 0,
        qid: 0,
        entries: 0,
        sq_head: 0,
        ctrl: None,
        admin: None,
        export: None,
        recorder: None,
        pending: HashMap::new(),
        waiting: VecDeque::new(),
        pending_bytes: 0,
        closing: false,
        current: None,
        spare: Vec::new(),
    };
    let r = q.run(&mut inb);
    if let Err(ConnError::Pdu(e)) = &r {
        q.terminate(e, inb.buffered());
    }
    q.finish();
    r
}

impl Queue {
    fn max_plen(&self) -> u32 {
        let c = &self.target.config;
        let data = c.max_h2c_data.max(c.in_capsule_bytes).max(8192);
        data + 72 + 2 * pdu::DIGEST_LEN as u32 + 128
    }

    fn run(&mut self, inb: &mut InBuf) -> Result<(), ConnError> {
        let deadline = Instant::now() + self.target.config.connect_timeout;
        self.handshake(inb, deadline)?;
        loop {
            while let Some((ch, f)) = inb.next(self.digests, self.max_plen())? {
                let total = f.total();
                let bytes = &inb.buf[inb.start..inb.start + total];
                self.on_pdu(&ch, &f, bytes)?;
                inb.start += total;
                if self.out.len() >= 1 << 20 {
                    self.flush()?;
                }
            }
            self.flush()?;
            if self.closing {
                return Ok(());
            }
            self.set_timeout(deadline)?;
            match inb.fill(&mut self.stream) {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(e) if is_timeout(&e) => {
                    if self.ctrl.is_none() {
                        return Err(ConnError::ConnectTimeout);
                    }
                    self.tick()?;
                }
                Err(e) => return Err(e.into()),
            }
            if self
                .ctrl
                .as_ref()
                .is_some_and(|c| c.dead.load(std::sync::atomic::Ordering::SeqCst))
            {
                return Err(ConnError::ControllerGone);
            }
        }
    }

    /// Before Connect: the remaining connect time; an admin queue: its
    /// tick; an I/O queue: none.
    fn set_timeout(&self, deadline: Instant) -> io::Result<()> {
        let t = if self.ctrl.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            Some(left.max(Duration::from_millis(1)))
        } else if self.admin.is_some() {
            Some(ADMIN_TICK)
        } else {
            None
        };
        self.stream.set_read_timeout(t)
    }

    /// ICReq → ICResp, within the connect deadline.
    fn handshake(&mut self, inb: &mut InBuf, deadline: Instant) -> Result<(), ConnError> {
        let (ch, f) = loop {
            if let Some(p) = inb.next(Digests::default(), 128)? {
                break p;
            }
            self.set_timeout(deadline)?;
            match inb.fill(&mut self.stream) {
                Ok(true) => {}
                Ok(false) => return Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into())),
                Err(e) if is_timeout(&e) => return Err(ConnError::ConnectTimeout),
                Err(e) => return Err(e.into()),
            }
        };
        let bytes = &inb.buf[inb.start..inb.start + f.total()];
        let req = match pdu::decode(&ch, &bytes[..f.header_len], &f)? {
            Pdu::ICReq(r) => r,
            _ => return Err(PduError::Sequence("the first PDU must be an ICReq").into()),
        };
        inb.start += f.total();
        if req.pfv != pdu::PFV_1_0 {
            return Err(PduError::BadField {
                offset: 8,
                what: "unsupported PDU format version",
            }
            .into());
        }
        if req.hpda > 31 {
            return Err(PduError::BadField {
                offset: 10,
                what: "HPDA above 31",
            }
            .into());
        }
        self.align = (usize::from(req.hpda) + 1) * 4;
        self.digests = req.digests;
        let resp = Pdu::ICResp(pdu::ICResp {
            pfv: pdu::PFV_1_0,
            cpda: 0,
            digests: req.digests,
            maxh2cdata: self.target.config.max_h2c_data,
        });
        pdu::encode(&resp, &[], Digests::default(), 0, &mut self.out);
        self.flush()?;
        Ok(())
    }

    fn on_pdu(&mut self, ch: &CommonHeader, f: &Frame, bytes: &[u8]) -> Result<(), ConnError> {
        let pdu = pdu::decode(ch, &bytes[..f.header_len], f)?;
        let data_at = f.header_len + f.pad;
        let data = &bytes[data_at..data_at + f.data_len];
        if f.data_digest {
            let d: [u8; 4] = bytes[data_at + f.data_len..][..4]
                .try_into()
                .expect("4 bytes");
            pdu::check_data_digest(data, d)?;
        }
        match pdu {
            Pdu::CapsuleCmd(sqe) => self.on_command(Sqe(sqe), data),
            Pdu::H2CData(d) => self.on_h2c(&d, data),
            Pdu::H2CTermReq(t) => Err(ConnError::HostTerminated(t.fes)),
            Pdu::ICReq(_) => Err(PduError::Sequence("a second ICReq").into()),
            _ => Err(PduError::Sequence("a controller-to-host PDU from the host").into()),
        }
    }

    fn on_command(&mut self, sqe: Sqe, data: &[u8]) -> Result<(), ConnError> {
        self.sq_head = if self.entries == 0 {
            0
        } else {
            (self.sq_head + 1) % self.entries
        };
        let Some(dp) = sqe.data_ptr() else {
            return self.reply(sqe.cid(), Status::SGL_INVALID_TYPE, 0);
        };
        let to_controller = sqe.opcode() & 1 != 0;
        match dp {
            DataPtr::InCapsule { offset, len } => {
                if offset != 0 {
                    return self.reply(sqe.cid(), Status::SGL_INVALID_OFFSET, 0);
                }
                if len as usize != data.len() || !to_controller {
                    return self.reply(sqe.cid(), Status::SGL_INVALID_DATA, 0);
                }
                self.execute(&sqe, data)
            }
            DataPtr::Transport { len } if to_controller && sqe.opcode() != admin::FABRICS => {
                if !data.is_empty() {
                    return self.reply(sqe.cid(), Status::SGL_INVALID_DATA, 0);
                }
                if u64::from(len) > self.target.config.max_transfer() || self.ctrl.is_none() {
                    return self.reply(sqe.cid(), Status::INVALID_FIELD, 0);
                }
                self.want_data(sqe)
            }
            _ if !data.is_empty() => self.reply(sqe.cid(), Status::SGL_INVALID_DATA, 0),
            _ => self.execute(&sqe, &[]),
        }
    }

    /// A write whose data comes by R2T: ask now if the buffer allows, else
    /// queue it.
    fn want_data(&mut self, sqe: Sqe) -> Result<(), ConnError> {
        if self.pending.contains_key(&sqe.cid())
            || self.waiting.iter().any(|w| w.cid() == sqe.cid())
        {
            return self.reply(sqe.cid(), Status::CID_CONFLICT, 0);
        }
        if self.waiting.len() > usize::from(self.entries) {
            return Err(PduError::Sequence("more commands than the queue holds").into());
        }
        self.waiting.push_back(sqe);
        self.start_transfers()
    }

    /// Sends R2Ts for waiting writes while the write buffer has room (the
    /// first always goes, so one large write never stalls).
    fn start_transfers(&mut self) -> Result<(), ConnError> {
        while let Some(sqe) = self.waiting.front() {
            let len = transport_len(sqe);
            let room = self.pending_bytes + len <= self.target.config.write_buffer_bytes;
            if !room && !self.pending.is_empty() {
                break;
            }
            let sqe = self.waiting.pop_front().expect("front exists");
            let in_place = match self.write_in_place(&sqe, len) {
                Ok(at) => at.map(|at| (at, Status::SUCCESS)),
                Err(status) => {
                    self.current = Some(sqe);
                    self.reply(sqe.cid(), status, 0)?;
                    continue;
                }
            };
            self.pending_bytes += len;
            let mut buf = Vec::new();
            if in_place.is_none() {
                buf = self.spare.pop().unwrap_or_default();
                buf.clear();
                buf.reserve_exact(len);
            }
            self.pending.insert(
                sqe.cid(),
                PendingWrite {
                    sqe,
                    buf,
                    got: 0,
                    want: len,
                    in_place,
                },
            );
            let r2t = Pdu::R2T(pdu::R2t {
                command_id: sqe.cid(),
                ttag: sqe.cid(),
                offset: 0,
                length: len as u32,
            });
            pdu::encode(&r2t, &[], self.digests, 0, &mut self.hdr);
            self.out.extend_from_slice(&self.hdr);
        }
        Ok(())
    }

    fn on_h2c(&mut self, d: &pdu::DataHdr, data: &[u8]) -> Result<(), ConnError> {
        let Some(p) = self.pending.get_mut(&d.ttag) else {
            return Err(PduError::BadField {
                offset: 10,
                what: "H2CData for no outstanding R2T",
            }
            .into());
        };
        if d.command_id != p.sqe.cid() {
            return Err(PduError::BadField {
                offset: 8,
                what: "H2CData command id does not match its R2T",
            }
            .into());
        }
        if d.offset as usize != p.got || p.got + data.len() > p.want {
            return Err(PduError::OutOfRange("H2CData outside its R2T").into());
        }
        if data.len() > self.target.config.max_h2c_data as usize {
            return Err(PduError::TooLong {
                plen: data.len() as u32,
                max: self.target.config.max_h2c_data,
            }
            .into());
        }
        let at = p.got;
        p.got += data.len();
        let done = p.got == p.want;
        match p.in_place {
            None => p.buf.extend_from_slice(data),
            Some((offset, status)) if status.is_success() => {
                let mut carry = std::mem::take(&mut p.buf);
                let s = self.place(offset, at, data, &mut carry);
                let p = self.pending.get_mut(&d.ttag).expect("present");
                (p.buf, p.in_place) = (carry, Some((offset, s)));
            }
            // Failed already: the rest of the data is taken and dropped.
            Some(_) => {}
        }
        if !done {
            return Ok(());
        }
        let p = self.pending.remove(&d.ttag).expect("present");
        self.pending_bytes -= p.want;
        match p.in_place {
            Some((_, status)) => {
                self.current = Some(p.sqe);
                self.in_place_written(&p.sqe, status)?
            }
            None => self.execute(&p.sqe, &p.buf)?,
        }
        let kept: usize = self.spare.iter().map(Vec::capacity).sum();
        if p.in_place.is_none()
            && self.spare.len() < SPARE_BUFFERS
            && kept + p.buf.capacity() <= self.target.config.write_buffer_bytes / 2
        {
            self.spare.push(p.buf);
        }
        self.start_transfers()
    }

    fn execute(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), ConnError> {
        self.current = Some(*sqe);
        if sqe.opcode() == admin::FABRICS {
            return self.fabrics(sqe, data);
        }
        if self.ctrl.is_none() {
            return self.reply(sqe.cid(), Status::CMD_SEQ_ERROR, 0);
        }
        if self.qid == 0 {
            self.admin_command(sqe, data)
        } else {
            self.io_command(sqe, data)
        }
    }

    fn fabrics(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), ConnError> {
        match sqe.fctype() {
            fctype::CONNECT => self.connect(sqe, data),
            _ if self.ctrl.is_none() => self.reply(sqe.cid(), Status::CMD_SEQ_ERROR, 0),
            fctype::PROPERTY_GET | fctype::PROPERTY_SET if self.qid == 0 => self.property(sqe),
            fctype::DISCONNECT => {
                self.closing = true;
                self.reply(sqe.cid(), Status::SUCCESS, 0)
            }
            _ => self.reply(sqe.cid(), Status::INVALID_OPCODE, 0),
        }
    }

    /// Appends a CapsuleResp.
    pub(super) fn reply(&mut self, cid: u16, status: Status, result: u64) -> Result<(), ConnError> {
        if !status.is_success() {
            self.log_error(cid, status);
        }
        let cqe = Cqe {
            result,
            sq_head: self.sq_head,
            sq_id: self.qid,
            cid,
            status,
        };
        pdu::encode(
            &Pdu::CapsuleResp(cqe.encode()),
            &[],
            self.digests,
            0,
            &mut self.hdr,
        );
        self.out.extend_from_slice(&self.hdr);
        Ok(())
    }

    /// Puts a failed command in its controller's error log (none before
    /// Connect: there is no controller to read it from).
    fn log_error(&self, cid: u16, status: Status) {
        let Some(ctrl) = &self.ctrl else { return };
        let cmd = self.current.filter(|s| s.cid() == cid);
        let lba = match cmd {
            Some(s) if self.qid != 0 && io_has_lba(s.opcode()) => {
                u64::from(s.cdw(10)) | u64::from(s.cdw(11)) << 32
            }
            _ => 0,
        };
        ctrl.errors.lock().push(ErrorEntry {
            sqid: self.qid,
            cid,
            status,
            nsid: cmd.map_or(u32::MAX, |s| s.nsid()),
            lba,
        });
    }

    /// Appends C2HData PDUs carrying `data` (at most `max` bytes of it,
    /// what the command's SGL allows), then the CapsuleResp.
    pub(super) fn send_data(&mut self, cid: u16, data: &[u8], max: usize) -> Result<(), ConnError> {
        let data = &data[..data.len().min(max)];
        let chunk = self.target.config.max_h2c_data as usize;
        let mut off = 0;
        while off < data.len() {
            let n = chunk.min(data.len() - off);
            self.c2h_header(cid, off, n, off + n == data.len());
            self.out.extend_from_slice(&data[off..off + n]);
            if self.digests.data {
                self.out
                    .extend_from_slice(&pdu::crc(&data[off..off + n]).to_le_bytes());
            }
            off += n;
        }
        self.reply(cid, Status::SUCCESS, 0)
    }

    /// Appends one C2HData header for `len` bytes at `offset`.
    pub(super) fn c2h_header(&mut self, cid: u16, offset: usize, len: usize, last: bool) {
        let h = Pdu::C2HData(pdu::DataHdr {
            command_id: cid,
            ttag: 0,
            offset: offset as u32,
            length: len as u32,
            last,
            success: false,
        });
        pdu::encode_header(&h, len, self.digests, self.align, &mut self.hdr);
        self.out.extend_from_slice(&self.hdr);
    }

    pub(super) fn flush(&mut self) -> Result<(), ConnError> {
        if !self.out.is_empty() {
            let r = self.stream.write_all(&self.out);
            self.out.clear();
            r?;
        }
        Ok(())
    }

    /// Reports a protocol error to the host (C2HTermReq with the
    /// offending header) before the connection closes.
    fn terminate(&mut self, e: &PduError, buffered: &[u8]) {
        tracing::debug!(peer = ?self.source, "NVMe/TCP: {e}; sending C2HTermReq");
        let (fes, fei) = e.term_status();
        let t = Pdu::C2HTermReq(pdu::TermReq { fes, fei });
        let offending = &buffered[..buffered.len().min(pdu::MAX_TERM_PLEN - 24)];
        self.out.clear();
        pdu::encode(&t, offending, self.digests, 0, &mut self.out);
        let _ = self.flush();
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
    }

    fn finish(&mut self) {
        match &self.ctrl {
            Some(c) if self.qid == 0 => self.target.remove_controller(c),
            Some(c) => c.remove_queue(&self.stream),
            None => {}
        }
    }
}

fn transport_len(sqe: &Sqe) -> usize {
    match sqe.data_ptr() {
        Some(DataPtr::Transport { len }) => len as usize,
        _ => 0,
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Whether an I/O opcode's CDW10-11 hold a starting LBA.
fn io_has_lba(opcode: u8) -> bool {
    matches!(opcode, io_op::READ | io_op::WRITE | io_op::WRITE_ZEROES)
}
