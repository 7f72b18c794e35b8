//! Identify data structures (NVMe Base 2.0, 5.17.2): controller,
//! namespace, active namespace list, namespace identification descriptors.
//! Pure builders of 4096-byte pages from plain parameters; offsets are the
//! kernel's `struct nvme_id_ctrl` / `struct nvme_id_ns` (checked in tests).
//!
//! Invariant: every page is exactly [`PAGE`] bytes and every string field
//! is space padded (SN, MN, FR) or NUL padded (SUBNQN), never overrun.

/// The size of every Identify page.
pub const PAGE: usize = 4096;

/// CNS values this target answers.
pub mod cns {
    pub const NS: u8 = 0x00;
    pub const CTRL: u8 = 0x01;
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    pub const NS_DESC_LIST: u8 = 0x03;
}

/// Controller types (CNTRLTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtrlType {
    Io = 1,
    Discovery = 2,
}

/// What the Identify Controller page says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlInfo {
    pub kind: CtrlType,
    pub cntlid: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    pub subnqn: String,
    /// Version (VS property format).
    pub version: u32,
    /// Maximum data transfer as a power of two of 4 KiB pages (0: none).
    pub mdts: u8,
    /// Commands a queue may hold (MAXCMD).
    pub maxcmd: u16,
    /// Namespaces (highest NSID).
    pub nn: u32,
    /// Bytes of in-capsule data an I/O command may carry.
    pub in_capsule_bytes: u32,
    /// Async event requests outstanding at once (1-based here).
    pub aer_limit: u8,
    /// Keep-alive granularity in units of 100 ms (KAS; nonzero).
    pub kas: u16,
    /// A volatile write cache is present: hosts send Flush for fsync.
    pub volatile_write_cache: bool,
}

fn put_str(page: &mut [u8], at: usize, len: usize, s: &str, pad: u8) {
    let f = &mut page[at..at + len];
    f.fill(pad);
    let n = s.len().min(len);
    f[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn put16(p: &mut [u8], at: usize, v: u16) {
    p[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(p: &mut [u8], at: usize, v: u32) {
    p[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(p: &mut [u8], at: usize, v: u64) {
    p[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// OAES bits.
const OAES_NS_ATTR: u32 = 1 << 8;
const OAES_DISC_CHANGE: u32 = 1 << 31;
/// ONCS: Dataset Management and Write Zeroes.
const ONCS_DSM: u16 = 1 << 2;
const ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// SGLS: SGLs supported (byte aligned), keyed SGL data block, offsets.
const SGLS: u32 = 1 | (1 << 2) | (1 << 20);
/// CMIC: more than one controller may connect to the subsystem.
const CMIC_MULTI_CTRL: u8 = 1 << 1;
/// CTRATT: 128-bit host identifier.
const CTRATT_HID_128: u32 = 1;
/// LPA: extended data for Get Log Page.
const LPA_EXTENDED: u8 = 1 << 2;

/// The Identify Controller page.
pub fn controller(c: &CtrlInfo) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    put16(&mut p, 0, 0); // vid: none
    put_str(&mut p, 4, 20, &c.serial, b' ');
    put_str(&mut p, 24, 40, &c.model, b' ');
    put_str(&mut p, 64, 8, &c.firmware, b' ');
    p[72] = 6; // rab
    p[77] = c.mdts;
    put16(&mut p, 78, c.cntlid);
    put32(&mut p, 80, c.version);
    p[111] = c.kind as u8;
    p[259] = c.aer_limit.saturating_sub(1); // aerl, 0's based
    p[261] = LPA_EXTENDED;
    p[262] = (super::log::ERROR_LOG_ENTRIES - 1) as u8; // elpe, 0's based
    put16(&mut p, 320, c.kas);
    p[512] = 0x66; // sqes: 64 bytes
    p[513] = 0x44; // cqes: 16 bytes
    put16(&mut p, 514, c.maxcmd);
    put32(&mut p, 516, c.nn);
    put32(&mut p, 536, SGLS);
    put_str(&mut p, 768, 256, &c.subnqn, 0);
    match c.kind {
        CtrlType::Io => {
            p[76] = CMIC_MULTI_CTRL;
            put32(&mut p, 92, OAES_NS_ATTR);
            put32(&mut p, 96, CTRATT_HID_128);
            put16(&mut p, 520, ONCS_DSM | ONCS_WRITE_ZEROES);
            p[525] = u8::from(c.volatile_write_cache);
            // ioccsz in 16-byte units: the SQE plus in-capsule data.
            put32(&mut p, 1792, (64 + c.in_capsule_bytes) / 16);
            put32(&mut p, 1796, 1); // iorcsz: a bare CQE
        }
        CtrlType::Discovery => {
            put32(&mut p, 92, OAES_DISC_CHANGE);
            put32(&mut p, 1792, 4);
            put32(&mut p, 1796, 1);
        }
    }
    // icdoff 0, msdbd 1 (one SGL descriptor).
    p[1803] = 1;
    p
}

/// What the Identify Namespace page says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsInfo {
    /// Size in logical blocks.
    pub blocks: u64,
    /// log2 of the logical block size.
    pub lba_shift: u8,
    pub read_only: bool,
    pub nguid: [u8; 16],
}

/// DLFEAT: deallocated blocks read as zeroes, Write Zeroes may deallocate.
const DLFEAT: u8 = 0x01 | (1 << 3);

/// The Identify Namespace page (NVM command set).
pub fn namespace(n: &NsInfo) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    put64(&mut p, 0, n.blocks); // nsze
    put64(&mut p, 8, n.blocks); // ncap
    put64(&mut p, 16, n.blocks); // nuse
    p[25] = 0; // nlbaf: one format (0's based)
    p[26] = 0; // flbas: format 0
    p[30] = 1; // nmic: shared (several controllers may attach)
    p[33] = DLFEAT;
    p[99] = u8::from(n.read_only); // nsattr: write protected
    p[104..120].copy_from_slice(&n.nguid);
    // lbaf[0]: no metadata, data size 2^lba_shift, best performance.
    p[128 + 2] = n.lba_shift;
    p
}

/// The active namespace list: NSIDs above `after`, ascending, zero-ended.
pub fn active_ns_list(nsids: &[u32], after: u32) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    let mut ids: Vec<u32> = nsids.iter().copied().filter(|&n| n > after).collect();
    ids.sort_unstable();
    for (i, id) in ids.iter().take(PAGE / 4).enumerate() {
        put32(&mut p, i * 4, *id);
    }
    p
}

/// The namespace identification descriptor list: NGUID, UUID and CSI.
pub fn ns_descriptors(nguid: &[u8; 16], uuid: &[u8; 16]) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    let mut at = 0;
    for (nidt, id) in [(2u8, &nguid[..]), (3, &uuid[..]), (4, &[0u8][..])] {
        p[at] = nidt;
        p[at + 1] = id.len() as u8;
        p[at + 4..at + 4 + id.len()].copy_from_slice(id);
        at += 4 + id.len();
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(kind: CtrlType) -> CtrlInfo {
        CtrlInfo {
            kind,
            cntlid: 0x12,
            serial: "abc".into(),
            model: "ramd".into(),
            firmware: "0.1.0".into(),
            subnqn: "nqn.2026-11.io.ramd:d".into(),
            version: 0x0001_0300,
            mdts: 8,
            maxcmd: 128,
            nn: 1,
            in_capsule_bytes: 8192,
            aer_limit: 4,
            kas: 10,
            volatile_write_cache: true,
        }
    }

    #[test]
    fn controller_offsets_are_nvme_id_ctrl() {
        let p = controller(&info(CtrlType::Io));
        assert_eq!(p.len(), PAGE);
        assert_eq!(&p[4..8], b"abc ");
        assert_eq!(&p[24..29], b"ramd ");
        assert_eq!(&p[78..80], &[0x12, 0]);
        assert_eq!(&p[80..84], &0x0001_0300u32.to_le_bytes());
        assert_eq!(p[111], 1);
        assert_eq!(p[259], 3);
        assert_eq!(&p[320..322], &[10, 0]);
        assert_eq!((p[512], p[513]), (0x66, 0x44));
        assert_eq!(&p[514..516], &[128, 0]);
        assert_eq!(&p[516..520], &[1, 0, 0, 0]);
        assert_eq!(&p[520..522], &[0x0C, 0]);
        assert_eq!(p[525], 1);
        assert_eq!(&p[768..789], b"nqn.2026-11.io.ramd:d");
        assert_eq!(p[789], 0);
        assert_eq!(&p[1792..1796], &516u32.to_le_bytes());
        assert_eq!(p[1803], 1);
        let d = controller(&info(CtrlType::Discovery));
        assert_eq!(d[111], 2);
        assert_eq!(&d[92..96], &(1u32 << 31).to_le_bytes());
    }

    #[test]
    fn long_strings_are_cut_not_overrun() {
        let mut i = info(CtrlType::Io);
        i.serial = "x".repeat(50);
        let p = controller(&i);
        assert_eq!(&p[4..24], "x".repeat(20).as_bytes());
        assert_eq!(p[24], b'r');
    }

    #[test]
    fn namespace_offsets_are_nvme_id_ns() {
        let p = namespace(&NsInfo {
            blocks: 2048,
            lba_shift: 9,
            read_only: true,
            nguid: [5; 16],
        });
        assert_eq!(&p[0..8], &2048u64.to_le_bytes());
        assert_eq!(p[99], 1);
        assert_eq!(&p[104..120], &[5; 16]);
        assert_eq!(p[130], 9);
        assert_eq!(p[33], 0x09);
    }

    #[test]
    fn ns_list_and_descriptors() {
        let p = active_ns_list(&[3, 1, 2], 1);
        assert_eq!(&p[..12], &[2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        let d = ns_descriptors(&[1; 16], &[2; 16]);
        assert_eq!(&d[..4], &[2, 16, 0, 0]);
        assert_eq!(&d[20..24], &[3, 16, 0, 0]);
        assert_eq!(&d[40..45], &[4, 1, 0, 0, 0]);
    }
}
