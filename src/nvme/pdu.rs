//! The NVMe/TCP PDU codec (NVMe/TCP Transport Specification 1.0, section
//! 3.6): pure, no I/O. A connection reads the 8-byte common header, asks
//! [`frame`] how many bytes the rest of the PDU takes, reads them, and
//! decodes the PDU-specific header with [`decode`]; data (in-capsule or
//! H2CData) follows at `pdo` and is the caller's to read.
//!
//! ```text
//!  0      1      2      3      4            8                hlen  +4     pdo          plen
//!  ┌──────┬──────┬──────┬──────┬────────────┬──────────────────┬──────┬─────┬──────┬──────┐
//!  │ type │flags │ hlen │ pdo  │ plen (LE)  │ PDU-specific hdr │HDGST │ pad │ data │DDGST │
//!  └──────┴──────┴──────┴──────┴────────────┴──────────────────┴──────┴─────┴──────┴──────┘
//!   HDGST: CRC32C of bytes 0..hlen, present when header digests were
//!   negotiated (never on ICReq/ICResp); DDGST: CRC32C of the data, present
//!   when data digests were negotiated and the PDU carries data.
//! ```
//!
//! Invariants:
//! - [`frame`] refuses every header whose lengths do not add up (`hlen`
//!   other than the type's, `pdo` inside the header, `plen` beyond the
//!   caller's limit): a connection never allocates more than that limit
//!   for one PDU, whatever the peer sends.
//! - Decoding never panics on any input (a proptest feeds random bytes).
//! - Digests are CRC32C (Castagnoli) stored little-endian, as the Linux
//!   host computes them; the `crc32c` crate (already a dependency, with
//!   SSE4.2/ARMv8 hardware paths) computes them.

use thiserror::Error;

/// The size of the common header every PDU starts with.
pub const CH_LEN: usize = 8;
/// The size of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// The one protocol version (PFV 1.0).
pub const PFV_1_0: u16 = 0;
/// The smallest MAXH2CDATA a controller may announce.
pub const MIN_MAXH2CDATA: u32 = 4096;
/// Longest TermReq: its 24-byte header plus the offending header (at most
/// 128 bytes of it).
pub const MAX_TERM_PLEN: usize = 152;

/// Flag bits of the common header.
pub mod flags {
    /// A header digest follows the PDU header.
    pub const HDGST: u8 = 1 << 0;
    /// A data digest follows the data.
    pub const DDGST: u8 = 1 << 1;
    /// Last data PDU of a transfer (H2CData, C2HData).
    pub const DATA_LAST: u8 = 1 << 2;
    /// C2HData: the command succeeded, no CapsuleResp follows.
    pub const DATA_SUCCESS: u8 = 1 << 3;
}

/// ICReq/ICResp digest field bits.
const DIGEST_HDR: u8 = 1 << 0;
const DIGEST_DATA: u8 = 1 << 1;

/// PDU types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PduType {
    ICReq = 0x00,
    ICResp = 0x01,
    H2CTermReq = 0x02,
    C2HTermReq = 0x03,
    CapsuleCmd = 0x04,
    CapsuleResp = 0x05,
    H2CData = 0x06,
    C2HData = 0x07,
    R2T = 0x09,
}

impl PduType {
    pub fn from_u8(v: u8) -> Option<PduType> {
        Some(match v {
            0x00 => PduType::ICReq,
            0x01 => PduType::ICResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            _ => return None,
        })
    }

    /// The fixed header length (`hlen`) of the type.
    pub fn hlen(self) -> usize {
        match self {
            PduType::ICReq | PduType::ICResp => 128,
            PduType::H2CTermReq | PduType::C2HTermReq => 24,
            PduType::CapsuleCmd => 72,
            PduType::CapsuleResp | PduType::H2CData | PduType::C2HData | PduType::R2T => 24,
        }
    }

    /// Connection set-up PDUs never carry digests.
    fn digestible(self) -> bool {
        !matches!(self, PduType::ICReq | PduType::ICResp)
    }

    /// Whether data may follow the header.
    fn carries_data(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd
                | PduType::H2CData
                | PduType::C2HData
                | PduType::H2CTermReq
                | PduType::C2HTermReq
        )
    }
}

/// Which digests the connection negotiated (ICReq/ICResp).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// The 8 bytes every PDU starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: PduType,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

/// Fatal transport errors, each reported to the host by a TermReq with
/// its Fatal Error Status (and, for a bad field, the field's offset).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PduError {
    /// unknown PDU type {0:#04x}
    #[error("unknown PDU type {0:#04x}")]
    UnknownType(u8),
    /// A header field is wrong; `offset` is its byte offset in the PDU.
    #[error("invalid PDU header field at byte {offset}: {what}")]
    BadField { offset: u32, what: &'static str },
    /// The PDU is longer than this side accepts.
    #[error("PDU of {plen} bytes exceeds the limit of {max} bytes")]
    TooLong { plen: u32, max: u32 },
    /// The header digest does not match.
    #[error("header digest mismatch")]
    HeaderDigest,
    /// The data digest does not match.
    #[error("data digest mismatch")]
    DataDigest,
    /// A PDU arrived that the connection's state does not allow.
    #[error("PDU sequence error: {0}")]
    Sequence(&'static str),
    /// Data outside the range the command or R2T allows.
    #[error("data transfer out of range: {0}")]
    OutOfRange(&'static str),
    /// An ICReq asked for something this side does not support.
    #[error("unsupported parameter: {0}")]
    Unsupported(&'static str),
}

/// Fatal Error Status values of a TermReq.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE: u16 = 0x02;
    pub const HEADER_DIGEST: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

impl PduError {
    /// The Fatal Error Status and Fatal Error Information a TermReq
    /// reports for the error (a data digest error is no transport error:
    /// the command fails instead, so it maps to a sequence error only if
    /// it ever reaches here).
    pub fn term_status(&self) -> (u16, u32) {
        match self {
            PduError::UnknownType(_) => (fes::INVALID_HEADER_FIELD, 0),
            PduError::BadField { offset, .. } => (fes::INVALID_HEADER_FIELD, *offset),
            PduError::TooLong { .. } => (fes::DATA_LIMIT_EXCEEDED, 4),
            PduError::HeaderDigest => (fes::HEADER_DIGEST, 0),
            PduError::DataDigest => (fes::PDU_SEQUENCE, 0),
            PduError::Sequence(_) => (fes::PDU_SEQUENCE, 0),
            PduError::OutOfRange(_) => (fes::DATA_OUT_OF_RANGE, 0),
            PduError::Unsupported(_) => (fes::UNSUPPORTED_PARAMETER, 0),
        }
    }
}

fn bad(offset: u32, what: &'static str) -> PduError {
    PduError::BadField { offset, what }
}

/// Decodes the common header.
pub fn decode_common(b: &[u8; CH_LEN]) -> Result<CommonHeader, PduError> {
    let pdu_type = PduType::from_u8(b[0]).ok_or(PduError::UnknownType(b[0]))?;
    Ok(CommonHeader {
        pdu_type,
        flags: b[1],
        hlen: b[2],
        pdo: b[3],
        plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
    })
}

/// Where the parts of one PDU lie, from its common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Bytes of header, common header and header digest included.
    pub header_len: usize,
    /// Bytes between the header (and its digest) and the data.
    pub pad: usize,
    /// Bytes of data.
    pub data_len: usize,
    /// Whether a data digest follows the data.
    pub data_digest: bool,
}

impl Frame {
    /// The whole PDU's length (`plen`).
    pub fn total(&self) -> usize {
        self.header_len + self.pad + self.data_len + if self.data_digest { DIGEST_LEN } else { 0 }
    }
}

/// Checks a received common header against the negotiated digests and
/// `max_plen`, and says where its parts lie.
pub fn frame(ch: &CommonHeader, digests: Digests, max_plen: u32) -> Result<Frame, PduError> {
    let t = ch.pdu_type;
    if ch.hlen as usize != t.hlen() {
        return Err(bad(2, "hlen is not the PDU type's"));
    }
    if ch.plen > max_plen {
        return Err(PduError::TooLong {
            plen: ch.plen,
            max: max_plen,
        });
    }
    let hdgst = t.digestible() && digests.header;
    if hdgst != (ch.flags & flags::HDGST != 0) {
        return Err(bad(
            1,
            "HDGST flag does not match the negotiated header digest",
        ));
    }
    let header_len = t.hlen() + if hdgst { DIGEST_LEN } else { 0 };
    let plen = ch.plen as usize;
    if plen < header_len {
        return Err(bad(4, "plen shorter than the header"));
    }
    if plen == header_len {
        if ch.flags & flags::DDGST != 0 {
            return Err(bad(1, "DDGST flag on a PDU without data"));
        }
        if ch.pdo != 0 && t.carries_data() && (ch.pdo as usize) < header_len {
            return Err(bad(3, "pdo inside the header"));
        }
        return Ok(Frame {
            header_len,
            pad: 0,
            data_len: 0,
            data_digest: false,
        });
    }
    if !t.carries_data() {
        return Err(bad(4, "plen longer than the header of a PDU without data"));
    }
    // TermReqs carry the offending header right after theirs, no pdo.
    let is_term = matches!(t, PduType::H2CTermReq | PduType::C2HTermReq);
    let pdo = if is_term { header_len } else { ch.pdo as usize };
    if pdo < header_len {
        return Err(bad(3, "pdo inside the header"));
    }
    let ddgst = !is_term && t.digestible() && digests.data;
    if ddgst != (ch.flags & flags::DDGST != 0) {
        return Err(bad(
            1,
            "DDGST flag does not match the negotiated data digest",
        ));
    }
    let tail = if ddgst { DIGEST_LEN } else { 0 };
    if plen < pdo + tail {
        return Err(bad(3, "pdo beyond the PDU"));
    }
    Ok(Frame {
        header_len,
        pad: pdo - header_len,
        data_len: plen - pdo - tail,
        data_digest: ddgst,
    })
}

/// The CRC32C of `bytes`, as a digest is computed.
pub fn crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Connection request (host to controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ICReq {
    pub pfv: u16,
    /// Host PDU data alignment, in dwords, 0's based.
    pub hpda: u8,
    pub digests: Digests,
    /// Outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

/// Connection response (controller to host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ICResp {
    pub pfv: u16,
    /// Controller PDU data alignment, in dwords, 0's based.
    pub cpda: u8,
    pub digests: Digests,
    /// Largest H2CData payload the controller accepts.
    pub maxh2cdata: u32,
}

/// A TermReq (either direction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermReq {
    pub fes: u16,
    pub fei: u32,
}

/// H2CData and C2HData headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHdr {
    pub command_id: u16,
    pub ttag: u16,
    pub offset: u32,
    pub length: u32,
    pub last: bool,
    pub success: bool,
}

/// Ready to Transfer: the controller asks for a range of a write's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    pub command_id: u16,
    pub ttag: u16,
    pub offset: u32,
    pub length: u32,
}

/// A PDU's header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdu {
    ICReq(ICReq),
    ICResp(ICResp),
    H2CTermReq(TermReq),
    C2HTermReq(TermReq),
    /// The 64-byte submission queue entry, undecoded (see `sqe`).
    CapsuleCmd([u8; 64]),
    /// The 16-byte completion queue entry, undecoded (see `sqe`).
    CapsuleResp([u8; 16]),
    H2CData(DataHdr),
    C2HData(DataHdr),
    R2T(R2t),
}

impl Pdu {
    pub fn pdu_type(&self) -> PduType {
        match self {
            Pdu::ICReq(_) => PduType::ICReq,
            Pdu::ICResp(_) => PduType::ICResp,
            Pdu::H2CTermReq(_) => PduType::H2CTermReq,
            Pdu::C2HTermReq(_) => PduType::C2HTermReq,
            Pdu::CapsuleCmd(_) => PduType::CapsuleCmd,
            Pdu::CapsuleResp(_) => PduType::CapsuleResp,
            Pdu::H2CData(_) => PduType::H2CData,
            Pdu::C2HData(_) => PduType::C2HData,
            Pdu::R2T(_) => PduType::R2T,
        }
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn digest_bits(d: u8) -> Digests {
    Digests {
        header: d & DIGEST_HDR != 0,
        data: d & DIGEST_DATA != 0,
    }
}

fn digest_byte(d: Digests) -> u8 {
    (if d.header { DIGEST_HDR } else { 0 }) | (if d.data { DIGEST_DATA } else { 0 })
}

/// Decodes a PDU's header: `header` is the first `frame.header_len` bytes
/// (common header, PDU-specific header, header digest if any).
pub fn decode(ch: &CommonHeader, header: &[u8], frame: &Frame) -> Result<Pdu, PduError> {
    let hlen = ch.pdu_type.hlen();
    if header.len() != frame.header_len || header.len() < hlen {
        return Err(bad(2, "header length does not match the frame"));
    }
    if header.len() > hlen {
        let want = le32(header, hlen);
        if crc(&header[..hlen]) != want {
            return Err(PduError::HeaderDigest);
        }
    }
    let h = &header[..hlen];
    let data = |last_ok: bool| DataHdr {
        command_id: le16(h, 8),
        ttag: le16(h, 10),
        offset: le32(h, 12),
        length: le32(h, 16),
        last: last_ok && ch.flags & flags::DATA_LAST != 0,
        success: ch.flags & flags::DATA_SUCCESS != 0,
    };
    Ok(match ch.pdu_type {
        PduType::ICReq => Pdu::ICReq(ICReq {
            pfv: le16(h, 8),
            hpda: h[10],
            digests: digest_bits(h[11]),
            maxr2t: le32(h, 12),
        }),
        PduType::ICResp => Pdu::ICResp(ICResp {
            pfv: le16(h, 8),
            cpda: h[10],
            digests: digest_bits(h[11]),
            maxh2cdata: le32(h, 12),
        }),
        PduType::H2CTermReq | PduType::C2HTermReq => {
            let t = TermReq {
                fes: le16(h, 8),
                fei: le32(h, 10),
            };
            if ch.pdu_type == PduType::H2CTermReq {
                Pdu::H2CTermReq(t)
            } else {
                Pdu::C2HTermReq(t)
            }
        }
        PduType::CapsuleCmd => {
            let mut sqe = [0u8; 64];
            sqe.copy_from_slice(&h[8..72]);
            Pdu::CapsuleCmd(sqe)
        }
        PduType::CapsuleResp => {
            let mut cqe = [0u8; 16];
            cqe.copy_from_slice(&h[8..24]);
            Pdu::CapsuleResp(cqe)
        }
        PduType::H2CData => {
            let d = data(true);
            if d.length as usize != frame.data_len {
                return Err(bad(16, "DATAL does not match the PDU's data"));
            }
            Pdu::H2CData(d)
        }
        PduType::C2HData => {
            let d = data(true);
            if d.length as usize != frame.data_len {
                return Err(bad(16, "DATAL does not match the PDU's data"));
            }
            Pdu::C2HData(d)
        }
        PduType::R2T => Pdu::R2T(R2t {
            command_id: le16(h, 8),
            ttag: le16(h, 10),
            offset: le32(h, 12),
            length: le32(h, 16),
        }),
    })
}

/// Checks a data digest.
pub fn check_data_digest(data: &[u8], digest: [u8; DIGEST_LEN]) -> Result<(), PduError> {
    if crc(data) == u32::from_le_bytes(digest) {
        Ok(())
    } else {
        Err(PduError::DataDigest)
    }
}

/// Encodes a PDU's header into `out` (cleared first): common header,
/// specific header, header digest, and the padding up to the data, for a
/// PDU whose data is `data_len` bytes. The caller appends the data and,
/// when [`Encoded::data_digest`] says so, its digest. `align` is the
/// receiver's data alignment in bytes (HPDA/CPDA + 1 dwords; 0 or 4 for
/// none).
pub fn encode_header(
    pdu: &Pdu,
    data_len: usize,
    digests: Digests,
    align: usize,
    out: &mut Vec<u8>,
) -> Encoded {
    let t = pdu.pdu_type();
    let hlen = t.hlen();
    out.clear();
    out.resize(hlen, 0);
    let hdgst = t.digestible() && digests.header;
    let has_data = data_len > 0 && t.carries_data();
    let is_term = matches!(t, PduType::H2CTermReq | PduType::C2HTermReq);
    let ddgst = has_data && !is_term && t.digestible() && digests.data;
    let mut fl = 0u8;
    if hdgst {
        fl |= flags::HDGST;
    }
    if ddgst {
        fl |= flags::DDGST;
    }
    let h = &mut out[..];
    match pdu {
        Pdu::ICReq(r) => {
            h[8..10].copy_from_slice(&r.pfv.to_le_bytes());
            h[10] = r.hpda;
            h[11] = digest_byte(r.digests);
            h[12..16].copy_from_slice(&r.maxr2t.to_le_bytes());
        }
        Pdu::ICResp(r) => {
            h[8..10].copy_from_slice(&r.pfv.to_le_bytes());
            h[10] = r.cpda;
            h[11] = digest_byte(r.digests);
            h[12..16].copy_from_slice(&r.maxh2cdata.to_le_bytes());
        }
        Pdu::H2CTermReq(t) | Pdu::C2HTermReq(t) => {
            h[8..10].copy_from_slice(&t.fes.to_le_bytes());
            h[10..14].copy_from_slice(&t.fei.to_le_bytes());
        }
        Pdu::CapsuleCmd(sqe) => h[8..72].copy_from_slice(sqe),
        Pdu::CapsuleResp(cqe) => h[8..24].copy_from_slice(cqe),
        Pdu::H2CData(d) | Pdu::C2HData(d) => {
            if d.last {
                fl |= flags::DATA_LAST;
            }
            if d.success {
                fl |= flags::DATA_SUCCESS;
            }
            h[8..10].copy_from_slice(&d.command_id.to_le_bytes());
            h[10..12].copy_from_slice(&d.ttag.to_le_bytes());
            h[12..16].copy_from_slice(&d.offset.to_le_bytes());
            h[16..20].copy_from_slice(&d.length.to_le_bytes());
        }
        Pdu::R2T(r) => {
            h[8..10].copy_from_slice(&r.command_id.to_le_bytes());
            h[10..12].copy_from_slice(&r.ttag.to_le_bytes());
            h[12..16].copy_from_slice(&r.offset.to_le_bytes());
            h[16..20].copy_from_slice(&r.length.to_le_bytes());
        }
    }
    let header_len = hlen + if hdgst { DIGEST_LEN } else { 0 };
    let pdo = if has_data && !is_term {
        let a = align.max(1);
        header_len.div_ceil(a) * a
    } else {
        0
    };
    let start = if pdo == 0 { header_len } else { pdo };
    let plen = start + if has_data { data_len } else { 0 } + if ddgst { DIGEST_LEN } else { 0 };
    out[0] = t as u8;
    out[1] = fl;
    out[2] = hlen as u8;
    // pdo is a byte: alignment beyond 255 is refused at ICReq time.
    out[3] = pdo.min(255) as u8;
    out[4..8].copy_from_slice(&(plen as u32).to_le_bytes());
    if hdgst {
        let d = crc(&out[..hlen]);
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.resize(start, 0);
    Encoded {
        plen,
        data_digest: ddgst,
    }
}

/// What [`encode_header`] left for the caller to append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    /// The PDU's total length once data and data digest follow.
    pub plen: usize,
    /// Whether a data digest must follow the data.
    pub data_digest: bool,
}

/// Encodes a whole PDU with its data into `out`.
pub fn encode(pdu: &Pdu, data: &[u8], digests: Digests, align: usize, out: &mut Vec<u8>) {
    let e = encode_header(pdu, data.len(), digests, align, out);
    out.extend_from_slice(data);
    if e.data_digest {
        out.extend_from_slice(&crc(data).to_le_bytes());
    }
    debug_assert_eq!(out.len(), e.plen);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(bytes: &[u8], d: Digests) -> Result<(Pdu, Frame), PduError> {
        let ch = decode_common(bytes[..CH_LEN].try_into().unwrap())?;
        let f = frame(&ch, d, 1 << 20)?;
        Ok((decode(&ch, &bytes[..f.header_len], &f)?, f))
    }

    #[test]
    fn icreq_layout_is_the_kernels() {
        // struct nvme_tcp_icreq_pdu: hdr, pfv (le16), hpda, digest,
        // maxr2t (le32), rsvd[112]; hlen = plen = 128, pdo 0.
        let mut b = vec![0u8; 128];
        b[0] = 0x00;
        b[2] = 128;
        b[4] = 128;
        b[10] = 0;
        b[11] = 0b11;
        b[12] = 3;
        let (pdu, f) = parse(&b, Digests::default()).unwrap();
        assert_eq!(f.total(), 128);
        assert_eq!(
            pdu,
            Pdu::ICReq(ICReq {
                pfv: 0,
                hpda: 0,
                digests: Digests {
                    header: true,
                    data: true
                },
                maxr2t: 3
            })
        );
        let mut out = Vec::new();
        encode(&pdu, &[], Digests::default(), 0, &mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn icresp_encodes_like_the_kernel_expects() {
        let mut out = Vec::new();
        let r = Pdu::ICResp(ICResp {
            pfv: PFV_1_0,
            cpda: 0,
            digests: Digests {
                header: true,
                data: false,
            },
            maxh2cdata: 0x40000,
        });
        // Digests never apply to the connection PDUs.
        encode(
            &r,
            &[],
            Digests {
                header: true,
                data: true,
            },
            0,
            &mut out,
        );
        assert_eq!(out.len(), 128);
        assert_eq!(&out[..8], &[1, 0, 128, 0, 128, 0, 0, 0]);
        assert_eq!(out[11], 1);
        assert_eq!(&out[12..16], &0x40000u32.to_le_bytes());
    }

    #[test]
    fn capsule_with_digests_and_data_round_trips() {
        let d = Digests {
            header: true,
            data: true,
        };
        let mut sqe = [0u8; 64];
        sqe[0] = 0x01;
        sqe[2] = 7;
        let data: Vec<u8> = (0..100u8).collect();
        let mut out = Vec::new();
        encode(&Pdu::CapsuleCmd(sqe), &data, d, 0, &mut out);
        // 72 header + 4 hdgst, data at pdo 76, 4 ddgst.
        assert_eq!(out[1], flags::HDGST | flags::DDGST);
        assert_eq!(out[3], 76);
        assert_eq!(out.len(), 76 + 100 + 4);
        assert_eq!(&out[72..76], &crc32c::crc32c(&out[..72]).to_le_bytes());
        let (pdu, f) = parse(&out, d).unwrap();
        assert_eq!(pdu, Pdu::CapsuleCmd(sqe));
        assert_eq!((f.header_len, f.pad, f.data_len), (76, 0, 100));
        let dd: [u8; 4] = out[176..180].try_into().unwrap();
        check_data_digest(&out[76..176], dd).unwrap();
        // A flipped header bit fails the header digest.
        let mut bad = out.clone();
        bad[20] ^= 1;
        assert_eq!(parse(&bad, d).unwrap_err(), PduError::HeaderDigest);
        let mut bad = out.clone();
        bad[100] ^= 1;
        assert_eq!(
            check_data_digest(&bad[76..176], dd),
            Err(PduError::DataDigest)
        );
    }

    #[test]
    fn crc32c_is_castagnoli() {
        // The check value of CRC-32C.
        assert_eq!(crc(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn c2h_data_honours_the_hosts_alignment() {
        let pdu = Pdu::C2HData(DataHdr {
            command_id: 5,
            ttag: 0,
            offset: 4096,
            length: 10,
            last: true,
            success: false,
        });
        let mut out = Vec::new();
        encode(&pdu, &[9; 10], Digests::default(), 32, &mut out);
        assert_eq!(out[3], 32);
        assert_eq!(out.len(), 42);
        assert_eq!(out[1], flags::DATA_LAST);
        let (back, f) = parse(&out, Digests::default()).unwrap();
        assert_eq!(back, pdu);
        assert_eq!(f.pad, 8);
    }

    #[test]
    fn r2t_and_term_layouts() {
        let mut out = Vec::new();
        let r = Pdu::R2T(R2t {
            command_id: 0x1234,
            ttag: 3,
            offset: 8192,
            length: 65536,
        });
        encode(&r, &[], Digests::default(), 0, &mut out);
        assert_eq!(&out[..8], &[9, 0, 24, 0, 24, 0, 0, 0]);
        assert_eq!(&out[8..12], &[0x34, 0x12, 3, 0]);
        assert_eq!(parse(&out, Digests::default()).unwrap().0, r);
        let t = Pdu::C2HTermReq(TermReq {
            fes: fes::INVALID_HEADER_FIELD,
            fei: 2,
        });
        let offending = [7u8; 24];
        encode(
            &t,
            &offending,
            Digests {
                header: true,
                data: true,
            },
            0,
            &mut out,
        );
        // Header digest yes, data digest never on a TermReq, pdo 0.
        assert_eq!(out[1], flags::HDGST);
        assert_eq!(out[3], 0);
        assert_eq!(out.len(), 24 + 4 + 24);
        let d = Digests {
            header: true,
            data: true,
        };
        let (back, f) = parse(&out, d).unwrap();
        assert_eq!(back, t);
        assert_eq!(f.data_len, 24);
    }

    #[test]
    fn bad_headers_are_refused_with_their_field() {
        let d = Digests::default();
        let mut b = [0u8; 24];
        b[0] = 0x05;
        b[2] = 23;
        b[4] = 24;
        let ch = decode_common(b[..8].try_into().unwrap()).unwrap();
        assert_eq!(frame(&ch, d, 4096).unwrap_err().term_status(), (1, 2));
        b[0] = 0x08;
        assert_eq!(
            decode_common(b[..8].try_into().unwrap()),
            Err(PduError::UnknownType(8))
        );
        // A capsule too long for the limit.
        let mut c = [0u8; 8];
        c[0] = 4;
        c[2] = 72;
        c[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
        let ch = decode_common(&c).unwrap();
        assert!(matches!(
            frame(&ch, d, 1 << 20),
            Err(PduError::TooLong { .. })
        ));
        // pdo inside the header.
        c[3] = 10;
        c[4..8].copy_from_slice(&100u32.to_le_bytes());
        let ch = decode_common(&c).unwrap();
        assert_eq!(frame(&ch, d, 1 << 20).unwrap_err().term_status().1, 3);
        // Header digest flag without negotiation.
        c[1] = flags::HDGST;
        c[3] = 72;
        let ch = decode_common(&c).unwrap();
        assert_eq!(frame(&ch, d, 1 << 20).unwrap_err().term_status().1, 1);
        // H2CData whose DATAL disagrees with plen.
        let mut out = Vec::new();
        let h2c = Pdu::H2CData(DataHdr {
            command_id: 1,
            ttag: 1,
            offset: 0,
            length: 8,
            last: true,
            success: false,
        });
        encode(&h2c, &[0; 8], d, 0, &mut out);
        out[16] = 9;
        assert_eq!(parse(&out, d).unwrap_err().term_status(), (1, 16));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300),
                                    hd in any::<bool>(), dd in any::<bool>()) {
            let d = Digests { header: hd, data: dd };
            if bytes.len() >= CH_LEN {
                if let Ok(ch) = decode_common(bytes[..CH_LEN].try_into().unwrap()) {
                    if let Ok(f) = frame(&ch, d, 4096) {
                        prop_assert!(f.total() == ch.plen as usize);
                        if bytes.len() >= f.header_len {
                            let _ = decode(&ch, &bytes[..f.header_len], &f);
                        }
                    }
                }
            }
        }

        #[test]
        fn data_pdus_round_trip(cid in any::<u16>(), ttag in any::<u16>(), off in any::<u32>(),
                                len in 0usize..200, last in any::<bool>(),
                                hd in any::<bool>(), dd in any::<bool>(), align in 0usize..4) {
            let d = Digests { header: hd, data: dd };
            let pdu = Pdu::H2CData(DataHdr {
                command_id: cid, ttag, offset: off, length: len as u32, last, success: false,
            });
            let mut out = Vec::new();
            encode(&pdu, &vec![0xAB; len], d, align * 4, &mut out);
            let (back, f) = parse(&out, d).unwrap();
            prop_assert_eq!(back, pdu);
            prop_assert_eq!(f.data_len, len);
            prop_assert_eq!(f.total(), out.len());
        }
    }
}
