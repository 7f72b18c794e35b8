//! Log pages (NVMe Base 2.0, 5.16): error information, SMART/health,
//! changed namespace list, discovery (NVMe over Fabrics 1.1, 5.3). Pure
//! builders of whole pages; [`window`] cuts the part a Get Log Page asks
//! for (offset and length are the host's, checked here).
//!
//! Invariants: a page is built whole and then windowed, so a host reading
//! a log in pieces (as nvme-cli reads the discovery log) gets consistent
//! bytes as long as the generation counter did not move. The error log
//! ([`ErrorLog`]) keeps the last [`ERROR_LOG_ENTRIES`] failed commands of a
//! controller, newest first, each with its place in the controller's
//! lifetime count (never reused, so a host sees which entries are new).

use std::collections::VecDeque;

use super::sqe::{Sqe, Status};

/// Log identifiers.
pub mod lid {
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FW_SLOT: u8 = 0x03;
    pub const CHANGED_NS: u8 = 0x04;
    pub const DISCOVERY: u8 = 0x70;
}

/// A Get Log Page command's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRequest {
    pub lid: u8,
    /// Retain Asynchronous Event: reading does not clear the event.
    pub rae: bool,
    /// Bytes asked for.
    pub len: u64,
    /// Byte offset into the page.
    pub offset: u64,
}

impl LogRequest {
    pub fn parse(sqe: &Sqe) -> LogRequest {
        let c10 = sqe.cdw(10);
        let c11 = sqe.cdw(11);
        let numd = (u64::from(c11 & 0xFFFF) << 16 | u64::from(c10 >> 16)) + 1;
        LogRequest {
            lid: c10 as u8,
            rae: c10 & (1 << 15) != 0,
            len: numd * 4,
            offset: u64::from(sqe.cdw(12)) | u64::from(sqe.cdw(13)) << 32,
        }
    }

    pub fn encode(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(super::sqe::admin::GET_LOG_PAGE, cid, 0xFFFF_FFFF);
        let numd = (self.len / 4).saturating_sub(1);
        s.set_cdw(
            10,
            u32::from(self.lid) | if self.rae { 1 << 15 } else { 0 } | ((numd as u32) << 16),
        )
        .set_cdw(11, (numd >> 16) as u32 & 0xFFFF)
        .set_cdw(12, self.offset as u32)
        .set_cdw(13, (self.offset >> 32) as u32);
        s
    }
}

/// The part of `page` a request asks for, zero-filled past the page's end
/// (a host may ask for more than a log holds), or a status when the offset
/// is not dword aligned or lies beyond the page.
pub fn window(page: &[u8], req: &LogRequest, max_len: u64) -> Result<Vec<u8>, Status> {
    if req.offset % 4 != 0 || req.offset > page.len() as u64 || req.len > max_len {
        return Err(Status::INVALID_FIELD);
    }
    let mut out = vec![0u8; req.len as usize];
    let start = req.offset as usize;
    let n = (page.len() - start).min(out.len());
    out[..n].copy_from_slice(&page[start..start + n]);
    Ok(out)
}

/// Entries the error log keeps (Identify Controller's ELPE is this, 0's
/// based): a host reading 64 entries (nvme-cli's default) gets them all.
pub const ERROR_LOG_ENTRIES: usize = 64;

/// Bytes of one error information entry.
const ERROR_ENTRY: usize = 64;

/// NVMe/TCP's transport type in an error entry.
const TRTYPE_TCP: u8 = 3;

/// One failed command, as the error log reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorEntry {
    /// Submission queue (0: admin).
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
    /// 0xFFFFFFFF when the command named none.
    pub nsid: u32,
    /// The first LBA of a read, write or write zeroes; 0 otherwise.
    pub lba: u64,
}

/// A controller's error log: the lifetime count and the latest entries.
#[derive(Debug, Default)]
pub struct ErrorLog {
    count: u64,
    recent: VecDeque<(u64, ErrorEntry)>,
}

impl ErrorLog {
    /// Records a failed command (the oldest entry goes when full).
    pub fn push(&mut self, e: ErrorEntry) {
        self.count += 1;
        if self.recent.len() == ERROR_LOG_ENTRIES {
            self.recent.pop_back();
        }
        self.recent.push_front((self.count, e));
    }

    /// Failed commands over the controller's life (SMART's "Number of
    /// Error Information Log Entries").
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The page: one 64-byte entry per kept error, newest first, then
    /// zeroes (an entry with count 0 is empty) up to the whole log.
    pub fn page(&self) -> Vec<u8> {
        let mut p = vec![0u8; ERROR_LOG_ENTRIES * ERROR_ENTRY];
        for (i, (n, e)) in self.recent.iter().enumerate() {
            let b = &mut p[i * ERROR_ENTRY..][..ERROR_ENTRY];
            b[0..8].copy_from_slice(&n.to_le_bytes());
            b[8..10].copy_from_slice(&e.sqid.to_le_bytes());
            b[10..12].copy_from_slice(&e.cid.to_le_bytes());
            b[12..14].copy_from_slice(&e.status.to_field().to_le_bytes());
            // Parameter error location: not tracked (all ones).
            b[14..16].copy_from_slice(&u16::MAX.to_le_bytes());
            b[16..24].copy_from_slice(&e.lba.to_le_bytes());
            b[24..28].copy_from_slice(&e.nsid.to_le_bytes());
            b[29] = TRTYPE_TCP;
        }
        p
    }
}

/// Counters the SMART/health log reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub read_commands: u64,
    pub write_commands: u64,
    /// Error Information log entries over the controller's life.
    pub errors: u64,
    pub power_on_hours: u64,
    /// The drive is read-only (critical warning bit 3).
    pub read_only: bool,
}

fn put128(p: &mut [u8], at: usize, v: u64) {
    p[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The SMART / Health Information page (512 bytes).
pub fn smart(h: &Health) -> Vec<u8> {
    let mut p = vec![0u8; 512];
    p[0] = if h.read_only { 1 << 3 } else { 0 };
    // 0 degrees Celsius above absolute zero is useless; report 300 K, a
    // plausible room temperature: RAM has no sensor of its own here.
    p[1..3].copy_from_slice(&300u16.to_le_bytes());
    p[3] = 100; // available spare
    p[4] = 10; // spare threshold
               // Data units are thousands of 512-byte units, rounded up.
    put128(&mut p, 32, h.bytes_read.div_ceil(512_000));
    put128(&mut p, 48, h.bytes_written.div_ceil(512_000));
    put128(&mut p, 64, h.read_commands);
    put128(&mut p, 80, h.write_commands);
    put128(&mut p, 128, h.power_on_hours);
    put128(&mut p, 176, h.errors);
    p
}

/// The Changed Namespace List: the NSIDs that changed, or 0xFFFFFFFF
/// first when more than 1024 did.
pub fn changed_ns(nsids: &[u32]) -> Vec<u8> {
    let mut p = vec![0u8; 4096];
    if nsids.len() > 1024 {
        p[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        return p;
    }
    for (i, n) in nsids.iter().enumerate() {
        p[i * 4..i * 4 + 4].copy_from_slice(&n.to_le_bytes());
    }
    p
}

/// One discovery log entry: an NVM subsystem reachable over TCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    pub subnqn: String,
    /// The address hosts connect to (the one they reached discovery on).
    pub traddr: String,
    pub trsvcid: String,
    pub ipv6: bool,
    pub portid: u16,
}

const DISC_HEADER: usize = 1024;
const DISC_ENTRY: usize = 1024;

fn put_str(p: &mut [u8], at: usize, len: usize, s: &str) {
    let n = s.len().min(len - 1);
    p[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
}

/// The Discovery Log Page: a 1024-byte header (generation counter, record
/// count, format 0) and one 1024-byte entry per subsystem.
pub fn discovery(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut p = vec![0u8; DISC_HEADER + DISC_ENTRY * entries.len()];
    p[0..8].copy_from_slice(&genctr.to_le_bytes());
    p[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        let at = DISC_HEADER + i * DISC_ENTRY;
        let r = &mut p[at..at + DISC_ENTRY];
        r[0] = 3; // trtype: TCP
        r[1] = if e.ipv6 { 2 } else { 1 }; // adrfam
        r[2] = 2; // subtype: NVM subsystem
        r[3] = 2; // treq: secure channel not required
        r[4..6].copy_from_slice(&e.portid.to_le_bytes());
        r[6..8].copy_from_slice(&0xFFFFu16.to_le_bytes()); // dynamic controllers
        r[8..10].copy_from_slice(&32u16.to_le_bytes()); // asqsz
        put_str(r, 32, 32, &e.trsvcid);
        put_str(r, 256, 256, &e.subnqn);
        put_str(r, 512, 256, &e.traddr);
        r[768] = 0; // tsas: sectype none
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_request_fields() {
        let r = LogRequest {
            lid: lid::DISCOVERY,
            rae: true,
            len: 3 * 1024,
            offset: 1024,
        };
        let s = r.encode(4);
        assert_eq!(s.cdw(10), 0x70 | (1 << 15) | (767 << 16));
        assert_eq!(LogRequest::parse(&s), r);
        // NUMDU carries the upper 16 bits of the dword count.
        let big = LogRequest { len: 4 << 20, ..r };
        assert_eq!(LogRequest::parse(&big.encode(1)), big);
    }

    #[test]
    fn windows_zero_fill_and_refuse_bad_offsets() {
        let page = vec![1u8; 100];
        let req = |offset, len| LogRequest {
            lid: 2,
            rae: false,
            len,
            offset,
        };
        let w = window(&page, &req(96, 8), 4096).unwrap();
        assert_eq!(w, vec![1, 1, 1, 1, 0, 0, 0, 0]);
        assert_eq!(window(&page, &req(2, 4), 4096), Err(Status::INVALID_FIELD));
        assert_eq!(
            window(&page, &req(104, 4), 4096),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            window(&page, &req(0, 8192), 4096),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(window(&page, &req(100, 4), 4096).unwrap(), vec![0; 4]);
    }

    #[test]
    fn discovery_layout_is_nvmf_disc_rsp_page() {
        let e = DiscoveryEntry {
            subnqn: "nqn.2026-11.io.ramd:a".into(),
            traddr: "10.0.0.1".into(),
            trsvcid: "4420".into(),
            ipv6: false,
            portid: 1,
        };
        let p = discovery(7, &[e.clone(), e]);
        assert_eq!(p.len(), 3072);
        assert_eq!(&p[0..8], &7u64.to_le_bytes());
        assert_eq!(&p[8..16], &2u64.to_le_bytes());
        let r = &p[2048..];
        assert_eq!(&r[..4], &[3, 1, 2, 2]);
        assert_eq!(&r[6..8], &[0xFF, 0xFF]);
        assert_eq!(&r[32..37], b"4420\0");
        assert_eq!(&r[256..277], b"nqn.2026-11.io.ramd:a");
        assert_eq!(&r[512..521], b"10.0.0.1\0");
    }

    #[test]
    fn smart_counts_in_thousands_of_sectors() {
        let p = smart(&Health {
            bytes_read: 512_001,
            bytes_written: 0,
            read_commands: 5,
            write_commands: 6,
            errors: 1,
            power_on_hours: 2,
            read_only: true,
        });
        assert_eq!(p[0], 8);
        assert_eq!(&p[32..40], &2u64.to_le_bytes());
        assert_eq!(&p[64..72], &5u64.to_le_bytes());
        assert_eq!(&p[80..88], &6u64.to_le_bytes());
        assert_eq!(&p[176..184], &1u64.to_le_bytes());
    }

    #[test]
    fn error_log_keeps_the_newest_with_lifetime_counts() {
        let mut l = ErrorLog::default();
        assert_eq!(l.page(), vec![0u8; 4096], "empty: every count 0");
        for i in 0..(ERROR_LOG_ENTRIES as u16 + 3) {
            l.push(ErrorEntry {
                sqid: 1,
                cid: i,
                status: Status::LBA_RANGE,
                nsid: 1,
                lba: u64::from(i) * 8,
            });
        }
        assert_eq!(l.count(), ERROR_LOG_ENTRIES as u64 + 3);
        let p = l.page();
        assert_eq!(p.len(), ERROR_LOG_ENTRIES * 64);
        let entry = |i: usize| &p[i * 64..][..64];
        let count = |i: usize| u64::from_le_bytes(entry(i)[..8].try_into().unwrap());
        // Newest first; the three oldest are gone.
        assert_eq!(count(0), ERROR_LOG_ENTRIES as u64 + 3);
        assert_eq!(count(ERROR_LOG_ENTRIES - 1), 4);
        let e = entry(0);
        assert_eq!(u16::from_le_bytes([e[8], e[9]]), 1);
        assert_eq!(
            u16::from_le_bytes([e[10], e[11]]),
            ERROR_LOG_ENTRIES as u16 + 2
        );
        assert_eq!(
            Status::from_field(u16::from_le_bytes([e[12], e[13]])),
            Status::LBA_RANGE
        );
        assert_eq!(u64::from_le_bytes(e[16..24].try_into().unwrap()), 8 * 66);
        assert_eq!(u32::from_le_bytes(e[24..28].try_into().unwrap()), 1);
        assert_eq!(e[29], 3, "transport type: TCP");
    }

    #[test]
    fn changed_ns_overflows_to_all_ones() {
        assert_eq!(&changed_ns(&[1])[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
        let many: Vec<u32> = (1..=1025).collect();
        assert_eq!(
            &changed_ns(&many)[..8],
            &[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]
        );
    }
}
