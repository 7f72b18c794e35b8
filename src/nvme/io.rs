//! The NVM command set on I/O queues: Read, Write (FUA), Flush, Write
//! Zeroes (deallocating when asked), Dataset Management deallocate. Each
//! becomes a `block::Request`, passes `block::validate` against the
//! drive's limits read just before, and runs on the drive's backend;
//! refusals and backend errors become NVMe statuses through the one errno
//! table (`block::Errno::nvme`), except a range past the end, which NVMe
//! reports as LBA Out of Range whatever the command.
//!
//! Reads go straight from the backend into the output buffer behind their
//! C2HData headers: no intermediate copy. Reads of [`DIRECT_READ_BYTES`]
//! or more without data digests skip that buffer too: the drive's memory
//! goes to the socket in place (`direct_read`), one copy (the kernel's)
//! instead of two, and no zero-fill of a 1 MiB buffer first.

use std::io::IoSlice;
use std::os::fd::AsRawFd;

use super::conn::{ConnError, Queue};
use super::pdu;
use super::sqe::{io, DataPtr, DsmRange, Rw, Sqe, Status, DSM_MAX_RANGES};
use super::state::LBA_SHIFT;
use super::target::Serves;
use crate::block::backend::{Backend, Error as BackendError};
use crate::block::{validate, Command, Errno, Limits, Refusal, Request};
use crate::metrics::Op;
use crate::nbd::transport::{send_now_fd, wait_fd};

/// Reads of at least this many bytes (without data digests) are sent from
/// the drive's memory in place.
const DIRECT_READ_BYTES: u64 = 64 << 10;

/// How a direct send of one C2HData PDU failed.
enum SendFailure {
    /// The drive failed; `started`: some of the PDU had left already.
    Backend { started: bool, error: BackendError },
    /// The socket failed (or the host stopped reading).
    Io(std::io::Error),
}

fn refusal_status(r: &Refusal) -> Status {
    match r {
        Refusal::PastEnd { .. } => Status::LBA_RANGE,
        r => Status::from_code(r.errno().nvme()),
    }
}

impl Queue {
    fn limits(&self) -> Option<Limits> {
        let e = self.export.as_ref()?;
        let ro_host = matches!(
            self.ctrl.as_ref().map(|c| &c.serves),
            Some(Serves::Drive {
                read_only_host: true,
                ..
            })
        );
        Some(Limits {
            size: e.backend.size(),
            read_only: e.is_read_only() || ro_host,
            max_len: self.target.config.max_transfer(),
        })
    }

    /// The drive's limits for an I/O command on namespace `sqe.nsid()`,
    /// following a replaced export; the status when it cannot run.
    fn io_limits(&mut self, sqe: &Sqe) -> Result<Limits, Status> {
        if sqe.nsid() != 1 {
            return Err(Status::INVALID_NS);
        }
        if self.export.as_ref().is_some_and(|e| e.is_closed()) {
            self.refresh_export();
        }
        let live = self.export.as_ref().is_some_and(|e| !e.is_closed());
        if self.export.as_ref().is_some_and(|e| e.is_unavailable()) {
            // Restoring: the host retries (no DNR).
            return Err(Status::NS_NOT_READY);
        }
        self.limits().filter(|_| live).ok_or(Status::INVALID_NS)
    }

    pub(super) fn io_command(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), ConnError> {
        let cid = sqe.cid();
        let limits = match self.io_limits(sqe) {
            Ok(l) => l,
            Err(s) => return self.reply(cid, s, 0),
        };
        if let Some(r) = self.recorder.as_mut() {
            r.batch_started();
        }
        let (op, bytes, status) = match sqe.opcode() {
            io::READ => return self.read(sqe, &limits),
            io::WRITE => {
                let rw = Rw::parse(sqe);
                let len = u64::from(rw.nlb) << LBA_SHIFT;
                let s = if len != data.len() as u64 {
                    Status::SGL_INVALID_DATA
                } else {
                    self.run_request(Command::Write, rw.slba, len, &limits, |e, off, _| {
                        e.write(off, data, rw.fua)
                    })
                };
                (Op::Write, len, s)
            }
            io::FLUSH => {
                let s = self.run_request(Command::Flush, 0, 0, &limits, |e, _, _| e.flush());
                (Op::Flush, 0, s)
            }
            io::WRITE_ZEROES => {
                let rw = Rw::parse(sqe);
                let len = u64::from(rw.nlb) << LBA_SHIFT;
                let s = self.run_request(
                    Command::WriteZeroes,
                    rw.slba,
                    len,
                    &limits,
                    |e, off, len| e.write_zeroes(off, len, rw.deallocate),
                );
                (Op::WriteZeroes, len, s)
            }
            io::DSM => return self.dsm(sqe, data, &limits),
            _ => return self.reply(cid, Status::INVALID_OPCODE, 0),
        };
        self.record(op, bytes, status);
        self.reply(cid, status, 0)
    }

    /// Validates and runs one request; `f` gets the backend, byte offset
    /// and length.
    fn run_request(
        &self,
        command: Command,
        slba: u64,
        len: u64,
        limits: &Limits,
        f: impl FnOnce(
            &dyn crate::block::backend::Backend,
            u64,
            u64,
        ) -> crate::block::backend::Result<()>,
    ) -> Status {
        let Some(offset) = slba.checked_mul(1 << LBA_SHIFT) else {
            return Status::LBA_RANGE;
        };
        let req = Request {
            command,
            offset,
            len,
        };
        if let Err(r) = validate(req, limits) {
            return refusal_status(&r);
        }
        let e = self.export.as_ref().expect("io queue has a drive");
        match f(e.backend.as_ref(), offset, len) {
            Ok(()) => Status::SUCCESS,
            Err(e) => Status::from_code(Errno::of(&e).nvme()),
        }
    }

    fn record(&mut self, op: Op, bytes: u64, status: Status) {
        if let Some(r) = self.recorder.as_mut() {
            if status.is_success() {
                r.done(op, bytes);
            } else {
                r.failed(Some(op), Errno::Io.nbd());
            }
            r.replies_sent();
        }
    }

    fn read(&mut self, sqe: &Sqe, limits: &Limits) -> Result<(), ConnError> {
        let cid = sqe.cid();
        let rw = Rw::parse(sqe);
        let len = u64::from(rw.nlb) << LBA_SHIFT;
        let sgl = match sqe.data_ptr() {
            Some(DataPtr::Transport { len }) => u64::from(len),
            _ => 0,
        };
        if sgl != len {
            return self.reply(cid, Status::SGL_INVALID_DATA, 0);
        }
        let Some(offset) = rw.slba.checked_mul(1 << LBA_SHIFT) else {
            return self.reply(cid, Status::LBA_RANGE, 0);
        };
        let req = Request {
            command: Command::Read,
            offset,
            len,
        };
        if let Err(r) = validate(req, limits) {
            self.record(Op::Read, len, refusal_status(&r));
            return self.reply(cid, refusal_status(&r), 0);
        }
        if len >= DIRECT_READ_BYTES && !self.digests.data {
            return self.direct_read(cid, offset, len);
        }
        let mark = self.out.len();
        let chunk = self.target.config.max_h2c_data as u64;
        let backend = self
            .export
            .as_ref()
            .expect("io queue has a drive")
            .backend
            .clone();
        let mut done = 0u64;
        while done < len {
            let n = chunk.min(len - done) as usize;
            self.c2h_header(cid, done as usize, n, done + n as u64 == len);
            let at = self.out.len();
            self.out.resize(at + n, 0);
            if let Err(e) = backend.read(offset + done, &mut self.out[at..]) {
                // Nothing of this command goes out: only its error.
                self.out.truncate(mark);
                let s = Status::from_code(Errno::of(&e).nvme());
                self.record(Op::Read, len, s);
                return self.reply(cid, s, 0);
            }
            if self.digests.data {
                let d = pdu::crc(&self.out[at..]);
                self.out.extend_from_slice(&d.to_le_bytes());
            }
            done += n as u64;
        }
        self.record(Op::Read, len, Status::SUCCESS);
        self.reply(cid, Status::SUCCESS, 0)
    }

    /// The drive's export was replaced (a restore finished, a restore from
    /// a snapshot): the queue serves the new one under the same name.
    fn refresh_export(&mut self) {
        let Some(Serves::Drive { name, .. }) = self.ctrl.as_ref().map(|c| &c.serves) else {
            return;
        };
        let Some(e) = self.target.exports.get(name).filter(|e| !e.is_closed()) else {
            return;
        };
        self.recorder = e.metrics.as_ref().map(|m| m.connection());
        self.export = Some(e);
    }

    /// A large read sent from the drive's memory in place: each C2HData
    /// header and the drive's slices go out in one gathered send of what
    /// the socket takes without waiting (the drive's chunk locks are held
    /// only inside `read_with`); waits for room happen with no lock held
    /// and end at the reply timeout. A drive error before any byte of the
    /// command left is an error reply; after, the reply cannot be taken
    /// back, so the connection ends.
    fn direct_read(&mut self, cid: u16, offset: u64, len: u64) -> Result<(), ConnError> {
        // Earlier replies go first.
        self.flush()?;
        let backend = self.export.as_ref().expect("io queue").backend.clone();
        let chunk = self.target.config.max_h2c_data as u64;
        let mut done = 0u64;
        while done < len {
            let n = chunk.min(len - done);
            self.c2h_header(cid, done as usize, n as usize, done + n == len);
            let header = std::mem::take(&mut self.out);
            let sent = self.send_direct(backend.as_ref(), &header, offset + done, n as usize);
            self.out = header;
            self.out.clear();
            match sent {
                Ok(()) => done += n,
                Err(SendFailure::Backend { started, error }) if !started && done == 0 => {
                    let s = Status::from_code(Errno::of(&error).nvme());
                    self.record(Op::Read, len, s);
                    return self.reply(cid, s, 0);
                }
                Err(SendFailure::Backend { error, .. }) => {
                    self.record(Op::Read, len, Status::INTERNAL);
                    return Err(ConnError::Io(std::io::Error::other(format!(
                        "the drive failed in the middle of a read already being sent: {error}"
                    ))));
                }
                Err(SendFailure::Io(e)) => return Err(ConnError::Io(e)),
            }
        }
        self.record(Op::Read, len, Status::SUCCESS);
        self.reply(cid, Status::SUCCESS, 0)
    }

    /// Sends `header` then `n` bytes of the drive at `offset`, in place.
    fn send_direct(
        &self,
        backend: &dyn Backend,
        header: &[u8],
        offset: u64,
        n: usize,
    ) -> Result<(), SendFailure> {
        let fd = self.stream.as_raw_fd();
        let timeout = self.target.config.reply_timeout;
        // The header goes first in every send, so it is out once any of
        // the drive's bytes are (n is never 0: see DIRECT_READ_BYTES).
        let (mut header_sent, mut sent) = (0usize, 0usize);
        while sent < n {
            let mut socket_error = None;
            let took = backend.read_with(offset + sent as u64, n - sent, &mut |slices| {
                let mut iov = Vec::with_capacity(slices.len() + 1);
                if header_sent < header.len() {
                    iov.push(IoSlice::new(&header[header_sent..]));
                }
                iov.extend_from_slice(slices);
                let k = send_now_fd(fd, &iov).inspect_err(|e| {
                    socket_error = Some(std::io::Error::new(e.kind(), e.to_string()))
                })?;
                let h = k.min(header.len() - header_sent);
                header_sent += h;
                Ok(k - h)
            });
            if let Some(e) = socket_error {
                return Err(SendFailure::Io(e));
            }
            match took {
                Ok(0) => wait_fd(fd, libc::POLLOUT, Some(timeout)).map_err(SendFailure::Io)?,
                Ok(k) => sent += k,
                Err(error) => {
                    return Err(SendFailure::Backend {
                        started: header_sent > 0,
                        error,
                    })
                }
            }
        }
        Ok(())
    }

    /// Whether the data of `sqe`, a command whose data comes by R2T, goes
    /// into the drive as each H2CData PDU arrives (`Some(byte offset)`),
    /// saving the copy into a write buffer and the buffer itself: plain
    /// Writes on an I/O queue. Checked now, before the R2T, as at
    /// execution: a refused write is answered at once, with no transfer.
    /// FUA writes (durable as a whole at completion) and everything else
    /// are buffered and executed when their data is complete (`None`).
    pub(super) fn write_in_place(&mut self, sqe: &Sqe, len: usize) -> Result<Option<u64>, Status> {
        if self.qid == 0 || sqe.opcode() != io::WRITE {
            return Ok(None);
        }
        let rw = Rw::parse(sqe);
        if rw.fua {
            return Ok(None);
        }
        let limits = self.io_limits(sqe)?;
        let bytes = u64::from(rw.nlb) << LBA_SHIFT;
        if bytes != len as u64 {
            return Err(Status::SGL_INVALID_DATA);
        }
        let offset = rw.slba.checked_mul(1 << LBA_SHIFT);
        let req = Request {
            command: Command::Write,
            offset: offset.unwrap_or(u64::MAX),
            len: bytes,
        };
        match (offset, validate(req, &limits)) {
            (Some(offset), Ok(_)) => Ok(Some(offset)),
            (_, r) => {
                let s = r.err().map_or(Status::LBA_RANGE, |r| refusal_status(&r));
                self.record(Op::Write, bytes, s);
                Err(s)
            }
        }
    }

    /// Writes one H2CData PDU's `data`, bytes `at..` of an in-place write
    /// to byte `offset` of the drive, whole blocks at a time: a block
    /// split between two PDUs is put together in `carry` first, so each
    /// block goes into the drive in one write and a concurrent reader
    /// never sees half of one (the atomic write unit is one block). The
    /// command's length is whole blocks, so `carry` is empty at its end.
    pub(super) fn place(&self, offset: u64, at: usize, data: &[u8], carry: &mut Vec<u8>) -> Status {
        let block = 1usize << LBA_SHIFT;
        let (mut at, mut data) = (at, data);
        if !carry.is_empty() {
            let start = at - carry.len();
            let take = (block - carry.len()).min(data.len());
            carry.extend_from_slice(&data[..take]);
            (at, data) = (at + take, &data[take..]);
            if carry.len() < block {
                return Status::SUCCESS;
            }
            let s = self.write_chunk(offset + start as u64, carry);
            carry.clear();
            if !s.is_success() {
                return s;
            }
        }
        let whole = data.len() / block * block;
        carry.extend_from_slice(&data[whole..]);
        match whole {
            0 => Status::SUCCESS,
            n => self.write_chunk(offset + at as u64, &data[..n]),
        }
    }

    fn write_chunk(&self, offset: u64, data: &[u8]) -> Status {
        let Some(e) = self.export.as_ref() else {
            return Status::INVALID_NS;
        };
        if e.is_closed() {
            // Replaced (a restore) or deleted since the R2T: the host
            // retries the command (no DNR) against what serves now.
            return Status::NS_NOT_READY;
        }
        match e.backend.write(offset, data, false) {
            Ok(()) => Status::SUCCESS,
            Err(e) => Status::from_code(Errno::of(&e).nvme()),
        }
    }

    /// Completes an in-place write whose data all arrived: `status` is the
    /// first chunk's failure, or success. Every chunk went through the
    /// export's backend (its read-only layer included: a drive locked
    /// after the R2T refuses the rest) and was refused once the export
    /// closed (`write_chunk`).
    pub(super) fn in_place_written(&mut self, sqe: &Sqe, status: Status) -> Result<(), ConnError> {
        if let Some(r) = self.recorder.as_mut() {
            r.batch_started();
        }
        // The export closed after the last chunk landed (a restore replaced
        // it): the data may be in the store that went, so not a success.
        let closed = self.export.as_ref().map_or(true, |e| e.is_closed());
        let status = match (status.is_success(), closed) {
            (true, true) => Status::NS_NOT_READY,
            _ => status,
        };
        let len = u64::from(Rw::parse(sqe).nlb) << LBA_SHIFT;
        self.record(Op::Write, len, status);
        self.reply(sqe.cid(), status, 0)
    }

    fn dsm(&mut self, sqe: &Sqe, data: &[u8], limits: &Limits) -> Result<(), ConnError> {
        let count = (sqe.cdw(10) & 0xFF) as usize + 1;
        let deallocate = sqe.cdw(11) & (1 << 2) != 0;
        if data.len() < count * 16 || count > DSM_MAX_RANGES {
            return self.reply(sqe.cid(), Status::SGL_INVALID_DATA, 0);
        }
        let mut status = Status::SUCCESS;
        let mut bytes = 0;
        if deallocate {
            for r in DsmRange::parse_all(data, count) {
                let len = u64::from(r.nlb) << LBA_SHIFT;
                status = self.run_request(Command::Trim, r.slba, len, limits, |e, off, len| {
                    e.trim(off, len)
                });
                if !status.is_success() {
                    break;
                }
                bytes += len;
            }
        }
        self.record(Op::Trim, bytes, status);
        self.reply(sqe.cid(), status, 0)
    }
}
