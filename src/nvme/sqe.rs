//! Submission and completion queue entries (NVMe Base 2.0, 4.2 and 4.6),
//! the Fabrics commands (NVMe over Fabrics 1.1, 3.3), the NVM command set's
//! I/O commands and status codes. Pure: bytes in, typed values out.
//!
//! ```text
//!  SQE (64 bytes)                          CQE (16 bytes)
//!  0  opcode  1 flags (PSDT 7:6)  2 CID    0  DW0 (result)   4 DW1
//!  4  NSID    8 CDW2  12 CDW3             8  SQHD  10 SQID  12 CID
//!  16 MPTR   24 DPTR (SGL descriptor)     14 status (P bit 0, SC 8:1,
//!  40..64 CDW10..CDW15                        SCT 11:9, DNR 15)
//!  Fabrics: opcode 0x7F, fctype at byte 4.
//! ```
//!
//! Invariants: decoding never panics and never allocates; a [`Status`]
//! always encodes to the 15 bits above the phase bit.

/// Admin opcodes this target knows.
pub mod admin {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0A;
    pub const ASYNC_EVENT: u8 = 0x0C;
    pub const KEEP_ALIVE: u8 = 0x18;
    pub const FABRICS: u8 = 0x7F;
}

/// NVM command set I/O opcodes this target knows.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
}

/// Fabrics command types (byte 4 of a Fabrics SQE).
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const DISCONNECT: u8 = 0x08;
}

/// A submission queue entry, as bytes with typed accessors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; 64]);

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Sqe {{ opcode: {:#04x}, cid: {}, nsid: {}, cdw10: {:#x} }}",
            self.opcode(),
            self.cid(),
            self.nsid(),
            self.cdw(10)
        )
    }
}

/// The data pointer of an SQE, as an NVMe/TCP controller reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPtr {
    /// No data.
    None,
    /// Data in the capsule, `len` bytes at `offset` after the SQE.
    InCapsule { offset: u64, len: u32 },
    /// Data through the transport: R2T/H2CData for writes, C2HData for
    /// reads (Transport SGL Data Block descriptor, subtype 0xA).
    Transport { len: u32 },
}

/// SGL descriptor identifiers.
const SGL_DATA_OFFSET: u8 = 0x01; // data block (0x0) << 4 | offset (0x1)
const SGL_TRANSPORT: u8 = 0x5A; // transport data block (0x5) << 4 | transport A

impl Sqe {
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    /// PSDT (bits 7:6 of byte 1): 0 means PRPs, which fabrics refuse.
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }
    pub fn cid(&self) -> u16 {
        u16::from_le_bytes([self.0[2], self.0[3]])
    }
    pub fn nsid(&self) -> u32 {
        self.dw_at(4)
    }
    /// Command dword `n` (2..=15; 10..15 are the command specific ones).
    pub fn cdw(&self, n: usize) -> u32 {
        debug_assert!((2..=15).contains(&n) && !(4..=9).contains(&n));
        self.dw_at(n * 4)
    }
    fn dw_at(&self, at: usize) -> u32 {
        u32::from_le_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }
    /// The Fabrics command type (byte 4; only for opcode 0x7F).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// The SGL in DPTR, or None when it is no descriptor this transport
    /// allows (a Fabrics host must use SGLs; in-capsule or transport only).
    pub fn data_ptr(&self) -> Option<DataPtr> {
        let addr = u64::from_le_bytes(self.0[24..32].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(self.0[32..36].try_into().expect("4 bytes"));
        let id = self.0[39];
        if self.opcode() != admin::FABRICS && self.psdt() == 0 && len != 0 {
            return None;
        }
        match id {
            _ if len == 0 => Some(DataPtr::None),
            SGL_DATA_OFFSET => Some(DataPtr::InCapsule { offset: addr, len }),
            SGL_TRANSPORT => Some(DataPtr::Transport { len }),
            _ => None,
        }
    }

    /// Builds an SQE (for clients and tests).
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Sqe {
        let mut b = [0u8; 64];
        b[0] = opcode;
        b[1] = 1 << 6; // PSDT: SGL, metadata buffer
        b[2..4].copy_from_slice(&cid.to_le_bytes());
        b[4..8].copy_from_slice(&nsid.to_le_bytes());
        Sqe(b)
    }
    pub fn set_cdw(&mut self, n: usize, v: u32) -> &mut Sqe {
        self.0[n * 4..n * 4 + 4].copy_from_slice(&v.to_le_bytes());
        self
    }
    pub fn set_data_ptr(&mut self, p: DataPtr) -> &mut Sqe {
        let (addr, len, id) = match p {
            DataPtr::None => (0, 0, SGL_TRANSPORT),
            DataPtr::InCapsule { offset, len } => (offset, len, SGL_DATA_OFFSET),
            DataPtr::Transport { len } => (0, len, SGL_TRANSPORT),
        };
        self.0[24..32].copy_from_slice(&addr.to_le_bytes());
        self.0[32..36].copy_from_slice(&len.to_le_bytes());
        self.0[36..39].fill(0);
        self.0[39] = id;
        self
    }
}

/// A Fabrics Connect command's SQE fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connect {
    pub recfmt: u16,
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    pub cattr: u8,
    /// Keep-alive timeout in ms (admin queue only).
    pub kato_ms: u32,
}

impl Connect {
    pub fn parse(sqe: &Sqe) -> Connect {
        let b = &sqe.0;
        Connect {
            recfmt: u16::from_le_bytes([b[40], b[41]]),
            qid: u16::from_le_bytes([b[42], b[43]]),
            sqsize: u16::from_le_bytes([b[44], b[45]]),
            cattr: b[46],
            kato_ms: u32::from_le_bytes([b[48], b[49], b[50], b[51]]),
        }
    }

    pub fn encode(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin::FABRICS, cid, 0);
        s.0[1] = 0x40;
        s.0[4] = fctype::CONNECT;
        s.0[40..42].copy_from_slice(&self.recfmt.to_le_bytes());
        s.0[42..44].copy_from_slice(&self.qid.to_le_bytes());
        s.0[44..46].copy_from_slice(&self.sqsize.to_le_bytes());
        s.0[46] = self.cattr;
        s.0[48..52].copy_from_slice(&self.kato_ms.to_le_bytes());
        s.set_data_ptr(DataPtr::InCapsule {
            offset: 0,
            len: CONNECT_DATA_LEN as u32,
        });
        s
    }
}

/// The length of Connect's data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// Byte offsets in Connect data (what a refusal names in its result).
pub mod connect_data {
    pub const HOSTID: u32 = 0;
    pub const CNTLID: u32 = 16;
    pub const SUBNQN: u32 = 256;
    pub const HOSTNQN: u32 = 512;
}

/// Connect's 1024-byte data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    /// 0xFFFF on an admin queue: any (dynamic) controller.
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

/// An NQN field of Connect data that is not a NUL-terminated UTF-8 string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("connect data field at byte {offset} is not a NUL-terminated UTF-8 NQN")]
pub struct BadConnectData {
    pub offset: u32,
}

impl ConnectData {
    pub fn parse(b: &[u8]) -> Result<ConnectData, BadConnectData> {
        if b.len() < CONNECT_DATA_LEN {
            return Err(BadConnectData { offset: 0 });
        }
        let nqn = |at: usize| -> Result<String, BadConnectData> {
            let f = &b[at..at + 256];
            let end = f
                .iter()
                .position(|&c| c == 0)
                .ok_or(BadConnectData { offset: at as u32 })?;
            std::str::from_utf8(&f[..end])
                .map(str::to_owned)
                .map_err(|_| BadConnectData { offset: at as u32 })
        };
        Ok(ConnectData {
            hostid: b[0..16].try_into().expect("16 bytes"),
            cntlid: u16::from_le_bytes([b[16], b[17]]),
            subnqn: nqn(256)?,
            hostnqn: nqn(512)?,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONNECT_DATA_LEN];
        b[0..16].copy_from_slice(&self.hostid);
        b[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        let n = self.subnqn.len().min(255);
        b[256..256 + n].copy_from_slice(&self.subnqn.as_bytes()[..n]);
        let n = self.hostnqn.len().min(255);
        b[512..512 + n].copy_from_slice(&self.hostnqn.as_bytes()[..n]);
        b
    }
}

/// Property Get/Set fields: size (4 or 8 bytes), offset, value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Property {
    pub eight_bytes: bool,
    pub offset: u32,
    pub value: u64,
}

impl Property {
    pub fn parse(sqe: &Sqe) -> Property {
        let b = &sqe.0;
        Property {
            eight_bytes: b[40] & 0x7 == 1,
            offset: u32::from_le_bytes([b[44], b[45], b[46], b[47]]),
            value: u64::from_le_bytes(b[48..56].try_into().expect("8 bytes")),
        }
    }

    pub fn encode(&self, fctype: u8, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin::FABRICS, cid, 0);
        s.0[1] = 0x40;
        s.0[4] = fctype;
        s.0[40] = u8::from(self.eight_bytes);
        s.0[44..48].copy_from_slice(&self.offset.to_le_bytes());
        s.0[48..56].copy_from_slice(&self.value.to_le_bytes());
        s.set_data_ptr(DataPtr::None);
        s
    }
}

/// Controller property offsets.
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1C;
}

/// A Read, Write or Write Zeroes command's range and flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rw {
    pub slba: u64,
    /// Number of logical blocks (not 0's based: the field plus one).
    pub nlb: u32,
    pub fua: bool,
    /// Write Zeroes: deallocate the blocks if the controller can.
    pub deallocate: bool,
}

impl Rw {
    pub fn parse(sqe: &Sqe) -> Rw {
        let c12 = sqe.cdw(12);
        Rw {
            slba: u64::from(sqe.cdw(10)) | (u64::from(sqe.cdw(11)) << 32),
            nlb: (c12 & 0xFFFF) + 1,
            fua: c12 & (1 << 30) != 0,
            deallocate: c12 & (1 << 25) != 0,
        }
    }

    pub fn encode(&self, opcode: u8, cid: u16, nsid: u32) -> Sqe {
        let mut s = Sqe::new(opcode, cid, nsid);
        let c12 = (self.nlb - 1) & 0xFFFF
            | if self.fua { 1 << 30 } else { 0 }
            | if self.deallocate { 1 << 25 } else { 0 };
        s.set_cdw(10, self.slba as u32)
            .set_cdw(11, (self.slba >> 32) as u32)
            .set_cdw(12, c12);
        s
    }
}

/// One Dataset Management range (16 bytes of the command's data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmRange {
    pub slba: u64,
    pub nlb: u32,
}

/// The most ranges one DSM command carries (NR is a 0's based byte).
pub const DSM_MAX_RANGES: usize = 256;

impl DsmRange {
    /// Ranges in DSM data; `count` is NR + 1.
    pub fn parse_all(data: &[u8], count: usize) -> impl Iterator<Item = DsmRange> + '_ {
        data.chunks_exact(16).take(count).map(|r| DsmRange {
            nlb: u32::from_le_bytes(r[4..8].try_into().expect("4 bytes")),
            slba: u64::from_le_bytes(r[8..16].try_into().expect("8 bytes")),
        })
    }
}

/// A completion's status (without the phase bit): code, type, do-not-retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    pub dnr: bool,
}

impl Status {
    pub const SUCCESS: Status = Status::generic(0x00);
    pub const INVALID_OPCODE: Status = Status::generic(0x01).no_retry();
    pub const INVALID_FIELD: Status = Status::generic(0x02).no_retry();
    pub const CID_CONFLICT: Status = Status::generic(0x03).no_retry();
    pub const DATA_XFER_ERROR: Status = Status::generic(0x04);
    pub const INTERNAL: Status = Status::generic(0x06);
    pub const ABORT_REQ: Status = Status::generic(0x07);
    pub const INVALID_NS: Status = Status::generic(0x0B).no_retry();
    pub const CMD_SEQ_ERROR: Status = Status::generic(0x0C).no_retry();
    pub const SGL_INVALID_DATA: Status = Status::generic(0x11).no_retry();
    pub const SGL_INVALID_TYPE: Status = Status::generic(0x13).no_retry();
    pub const SGL_INVALID_OFFSET: Status = Status::generic(0x16).no_retry();
    pub const NS_WRITE_PROTECTED: Status = Status::generic(0x20).no_retry();
    pub const LBA_RANGE: Status = Status::generic(0x80).no_retry();
    pub const CAP_EXCEEDED: Status = Status::generic(0x81).no_retry();
    pub const NS_NOT_READY: Status = Status::generic(0x82);
    pub const INVALID_QID: Status = Status::specific(0x01).no_retry();
    pub const QUEUE_SIZE: Status = Status::specific(0x02).no_retry();
    pub const ASYNC_LIMIT: Status = Status::specific(0x05).no_retry();
    pub const INVALID_LOG_PAGE: Status = Status::specific(0x09).no_retry();
    pub const FEATURE_NOT_SAVEABLE: Status = Status::specific(0x0D).no_retry();
    pub const CONNECT_FORMAT: Status = Status::specific(0x80).no_retry();
    pub const CONNECT_CTRL_BUSY: Status = Status::specific(0x81);
    pub const CONNECT_INVALID_PARAM: Status = Status::specific(0x82).no_retry();
    pub const CONNECT_INVALID_HOST: Status = Status::specific(0x84).no_retry();
    /// Media error: write fault (an I/O error while storing).
    pub const WRITE_FAULT: Status = Status::media(0x80);
    /// Media error: unrecovered read error.
    pub const READ_ERROR: Status = Status::media(0x81);

    pub const fn generic(sc: u8) -> Status {
        Status {
            sct: 0,
            sc,
            dnr: false,
        }
    }
    pub const fn specific(sc: u8) -> Status {
        Status {
            sct: 1,
            sc,
            dnr: false,
        }
    }
    pub const fn media(sc: u8) -> Status {
        Status {
            sct: 2,
            sc,
            dnr: false,
        }
    }
    pub const fn no_retry(self) -> Status {
        Status { dnr: true, ..self }
    }
    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }
    /// The CQE's status field (phase bit 0 left clear: fabrics have none).
    pub fn to_field(self) -> u16 {
        (u16::from(self.sc) << 1) | (u16::from(self.sct & 7) << 9) | (u16::from(self.dnr) << 15)
    }
    /// From the kernel's `NVME_SC_*` form (what `block::Errno::nvme`
    /// returns): SC in bits 7:0, SCT in 10:8, DNR 0x4000.
    pub fn from_code(c: u16) -> Status {
        Status {
            sc: c as u8,
            sct: ((c >> 8) & 7) as u8,
            dnr: c & 0x4000 != 0,
        }
    }
    pub fn from_field(f: u16) -> Status {
        Status {
            sc: (f >> 1) as u8,
            sct: ((f >> 9) & 7) as u8,
            dnr: f & (1 << 15) != 0,
        }
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    /// DW0 and DW1 (command specific result).
    pub result: u64,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.result.to_le_bytes());
        b[8..10].copy_from_slice(&self.sq_head.to_le_bytes());
        b[10..12].copy_from_slice(&self.sq_id.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&self.status.to_field().to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 16]) -> Cqe {
        Cqe {
            result: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            sq_head: u16::from_le_bytes([b[8], b[9]]),
            sq_id: u16::from_le_bytes([b[10], b[11]]),
            cid: u16::from_le_bytes([b[12], b[13]]),
            status: Status::from_field(u16::from_le_bytes([b[14], b[15]])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_match_the_kernels_values() {
        // Linux compares `le16_to_cpu(cqe->status) >> 1` with NVME_SC_*,
        // where the type sits at bits 10:8 and DNR is 0x4000.
        assert_eq!(Status::INVALID_FIELD.to_field() >> 1, 0x4002);
        assert_eq!(Status::CONNECT_INVALID_HOST.to_field() >> 1, 0x4184);
        assert_eq!(Status::CONNECT_INVALID_PARAM.to_field() >> 1, 0x4182);
        assert_eq!(Status::INVALID_LOG_PAGE.to_field() >> 1, 0x4109);
        assert_eq!(Status::WRITE_FAULT.to_field() >> 1, 0x280);
        assert_eq!(Status::NS_NOT_READY.to_field() >> 1, 0x82);
        for s in [Status::SUCCESS, Status::LBA_RANGE, Status::READ_ERROR] {
            assert_eq!(Status::from_field(s.to_field()), s);
            assert_eq!(Status::from_code(s.to_field() >> 1), s);
        }
        use crate::block::Errno;
        assert_eq!(
            Status::from_code(Errno::ReadOnly.nvme()),
            Status::NS_WRITE_PROTECTED
        );
        assert_eq!(
            Status::from_code(Errno::NoSpace.nvme()),
            Status::CAP_EXCEEDED
        );
        assert_eq!(
            Status::from_code(Errno::Shutdown.nvme()),
            Status::NS_NOT_READY
        );
    }

    #[test]
    fn cqe_layout() {
        let c = Cqe {
            result: 0x0102,
            sq_head: 3,
            sq_id: 4,
            cid: 0xBEEF,
            status: Status::INVALID_OPCODE,
        };
        let b = c.encode();
        assert_eq!(&b[0..2], &[2, 1]);
        assert_eq!(&b[8..14], &[3, 0, 4, 0, 0xEF, 0xBE]);
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), (1 << 1) | (1 << 15));
        assert_eq!(Cqe::decode(&b), c);
    }

    #[test]
    fn connect_layout_is_nvmf_connect_command() {
        let c = Connect {
            recfmt: 0,
            qid: 2,
            sqsize: 127,
            cattr: 0,
            kato_ms: 0,
        };
        let s = c.encode(9);
        assert_eq!(s.opcode(), 0x7F);
        assert_eq!(s.fctype(), fctype::CONNECT);
        assert_eq!(&s.0[42..46], &[2, 0, 127, 0]);
        assert_eq!(
            s.data_ptr(),
            Some(DataPtr::InCapsule {
                offset: 0,
                len: 1024
            })
        );
        assert_eq!(Connect::parse(&s), c);
        let d = ConnectData {
            hostid: [7; 16],
            cntlid: 0xFFFF,
            subnqn: "nqn.2014-08.org.nvmexpress.discovery".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:x".into(),
        };
        let b = d.encode();
        assert_eq!(&b[16..18], &[0xFF, 0xFF]);
        assert_eq!(&b[256..260], b"nqn.");
        assert_eq!(ConnectData::parse(&b).unwrap(), d);
        let mut unterminated = b.clone();
        unterminated[512..768].fill(b'a');
        assert_eq!(
            ConnectData::parse(&unterminated),
            Err(BadConnectData { offset: 512 })
        );
        assert!(ConnectData::parse(&b[..100]).is_err());
    }

    #[test]
    fn read_write_fields() {
        let rw = Rw {
            slba: 0x1_0000_0002,
            nlb: 8,
            fua: true,
            deallocate: false,
        };
        let s = rw.encode(io::WRITE, 1, 1);
        assert_eq!(s.cdw(10), 2);
        assert_eq!(s.cdw(11), 1);
        assert_eq!(s.cdw(12), 7 | (1 << 30));
        assert_eq!(Rw::parse(&s), rw);
    }

    #[test]
    fn sgl_descriptors() {
        let mut s = Sqe::new(io::READ, 1, 1);
        s.set_data_ptr(DataPtr::Transport { len: 4096 });
        assert_eq!(s.0[39], 0x5A);
        assert_eq!(s.data_ptr(), Some(DataPtr::Transport { len: 4096 }));
        s.0[39] = 0x00; // address data block: not for TCP
        assert_eq!(s.data_ptr(), None);
        s.0[1] = 0; // PRPs
        s.0[39] = 0x5A;
        assert_eq!(s.data_ptr(), None);
    }

    #[test]
    fn dsm_ranges() {
        let mut d = vec![0u8; 32];
        d[4..8].copy_from_slice(&16u32.to_le_bytes());
        d[8..16].copy_from_slice(&100u64.to_le_bytes());
        d[20..24].copy_from_slice(&1u32.to_le_bytes());
        let r: Vec<_> = DsmRange::parse_all(&d, 2).collect();
        assert_eq!(
            r,
            vec![
                DsmRange { slba: 100, nlb: 16 },
                DsmRange { slba: 0, nlb: 1 }
            ]
        );
        // A count beyond the data takes what is there.
        assert_eq!(DsmRange::parse_all(&d, 256).count(), 2);
    }
}
