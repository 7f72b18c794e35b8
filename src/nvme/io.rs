//! The NVM command set on I/O queues: Read, Write (FUA), Flush, Write
//! Zeroes (deallocating when asked), Dataset Management deallocate. Each
//! becomes a `block::Request`, passes `block::validate` against the
//! drive's limits read just before, and runs on the drive's backend;
//! refusals and backend errors become NVMe statuses through the one errno
//! table (`block::Errno::nvme`), except a range past the end, which NVMe
//! reports as LBA Out of Range whatever the command.
//!
//! Reads go straight from the backend into the output buffer behind their
//! C2HData headers: no intermediate copy.

use super::conn::{ConnError, Queue};
use super::pdu;
use super::sqe::{io, DataPtr, DsmRange, Rw, Sqe, Status, DSM_MAX_RANGES};
use super::state::LBA_SHIFT;
use super::target::Serves;
use crate::block::{validate, Command, Errno, Limits, Refusal, Request};
use crate::metrics::Op;

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

    pub(super) fn io_command(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), ConnError> {
        let cid = sqe.cid();
        if sqe.nsid() != 1 {
            return self.reply(cid, Status::INVALID_NS, 0);
        }
        let live = self.export.as_ref().is_some_and(|e| !e.is_closed());
        let Some(limits) = self.limits().filter(|_| live) else {
            return self.reply(cid, Status::INVALID_NS, 0);
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
