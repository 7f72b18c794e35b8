//! The redo journal: appending a generation, committing it, scanning the
//! committed generations back. Record layout: see `format.rs`.
//!
//! # Writing
//!
//! A generation's records are built in a buffer and written with large
//! `pwrite`s from the end of the last committed generation; the commit
//! record goes last and one `fdatasync` makes the whole generation durable.
//! The commit holds the record count and a chain checksum over the records'
//! header checksums, so if the disk kept the commit but lost a record
//! (unsynced writes land in any order), the generation does not verify and
//! counts as never committed. After a failed attempt the file is cut back
//! to the committed end before the next one.
//!
//! # Scanning: torn tail or corruption?
//!
//! A crash can only damage the generation that was being written: everything
//! before the last successful `fdatasync` is durable, and a generation starts
//! only after the previous one's `fdatasync` returned. So when the scan hits a
//! damaged record at offset D, it searches past D for a generation newer
//! than the last good one that verifies *completely* (first record to
//! commit):
//!
//! - none: the damage is a torn tail; it is cut (reported, not an error);
//! - found: the damage hit acknowledged, durable data: corruption, and
//!   restoring refuses (unless forced).
//!
//! The journal always holds a run of consecutive generations `a..=b` and the
//! image holds generation `a-1` or later (up to `b`: a checkpoint whose
//! journal truncate failed or was lost in a crash). Replaying all of
//! `a..=b` in order onto the image is correct in every case, including an
//! image caught in the middle of a checkpoint (half rewritten), so the scan
//! returns every committed generation and restore replays them all.
//! Records with a generation at or below the last one parsed, where a new
//! generation should start, are leftovers of an older journal: the log ends
//! there.

use std::io;

use super::crc;
use super::format::{
    pages_payload_len, FormatError, RecordHeader, RecordKind, PAGE_BYTES, RECORD_HEADER_BYTES,
};
use super::storage::StorageFile;

/// Most pages in one pages record (1 MiB of data).
pub const MAX_RECORD_PAGES: u32 = 256;
/// Records are buffered up to this many bytes before a write.
const WRITE_BUFFER_BYTES: usize = 8 << 20;
/// A payload at least this big is written straight from the caller's
/// buffers (one gathered write with the buffered headers before it)
/// instead of being copied into the write buffer first.
const DIRECT_PAYLOAD_BYTES: usize = 64 << 10;
/// Written bytes are handed to the disk (`start_writeback`) in steps of
/// this size, so the disk writes while the next records are prepared and
/// the commit's `fdatasync` has little left to do.
const WRITEBACK_STEP_BYTES: u64 = 8 << 20;
/// Bytes read at a time while scanning.
const SCAN_READ_BYTES: usize = 4 << 20;

/// Where a verified record lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLoc {
    /// Pages or Zero.
    pub kind: RecordKind,
    /// First page covered.
    pub first_page: u64,
    /// Pages covered.
    pub n_pages: u32,
    /// File offset of the payload.
    pub payload_offset: u64,
    /// Payload bytes.
    pub payload_len: u64,
    /// CRC-32C of the payload (checked again when it is read back).
    pub payload_crc: u32,
}

/// A committed generation in the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenInfo {
    /// Its number.
    pub gen: u64,
    /// Drive size at its cut.
    pub drive_size: u64,
    /// Smallest drive size since the previous generation.
    pub min_size: u64,
    /// Its records, in file order.
    pub records: Vec<RecordLoc>,
    /// Pages with data.
    pub data_pages: u64,
    /// File offset where it starts.
    pub start: u64,
    /// File offset just past its commit record.
    pub end: u64,
}

/// How the scan ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanEnd {
    /// The journal ends right after the last committed generation.
    Clean,
    /// A torn or unfinished generation follows; cut it.
    TornTail {
        /// Where the damage was found.
        damage_offset: u64,
        /// Bytes after the last committed generation.
        bytes: u64,
        /// What was wrong.
        detail: String,
    },
    /// Records of generations already checkpointed follow (a journal reset
    /// that did not reach the disk); cut them.
    Stale {
        /// Bytes after the last committed generation.
        bytes: u64,
    },
    /// Damage followed by an intact newer generation: acknowledged data
    /// is damaged.
    Corrupt {
        /// Where the damage was found.
        damage_offset: u64,
        /// What was wrong.
        detail: String,
        /// The intact generation found after it.
        later_gen: u64,
    },
}

/// What a scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    /// Committed generations, in order.
    pub gens: Vec<GenInfo>,
    /// End of the last committed generation (where appends go).
    pub committed_end: u64,
    /// The file's length.
    pub file_len: u64,
    /// How it ended.
    pub end: ScanEnd,
}

/// A sequential reader over a journal file with a large buffer.
struct Reader<'a, F: StorageFile> {
    file: &'a F,
    len: u64,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    buf_off: u64,
}

impl<'a, F: StorageFile> Reader<'a, F> {
    fn new(file: &'a F, len: u64) -> Self {
        Reader {
            file,
            len,
            buf: Vec::new(),
            buf_off: 0,
        }
    }

    /// Bytes `[off, off+n)`; None when the file is shorter.
    fn get(&mut self, off: u64, n: usize) -> io::Result<Option<&[u8]>> {
        if off + n as u64 > self.len {
            return Ok(None);
        }
        let have = off >= self.buf_off && off + n as u64 <= self.buf_off + self.buf.len() as u64;
        if !have {
            let want = n.max(SCAN_READ_BYTES).min((self.len - off) as usize);
            self.buf.resize(want, 0);
            self.file.read_exact_at(&mut self.buf, off)?;
            self.buf_off = off;
        }
        let s = (off - self.buf_off) as usize;
        Ok(Some(&self.buf[s..s + n]))
    }
}

/// Outcome of parsing one generation at an offset.
enum Parsed {
    Gen(GenInfo),
    /// Nothing at all at this offset (end of file).
    End,
    /// A valid header of an old generation where a new one should start.
    Stale,
    /// Damage at this offset.
    Damage(u64, String),
}

fn damage(off: u64, what: impl Into<String>) -> Parsed {
    Parsed::Damage(off, what.into())
}

/// Parses the generation starting at `start`, which must be newer than
/// `min_gen - 1`.
fn parse_gen<F: StorageFile>(
    r: &mut Reader<'_, F>,
    start: u64,
    drive_id: u64,
    entry_bytes: usize,
    min_gen: u64,
) -> io::Result<Parsed> {
    let mut pos = start;
    let mut gen = None;
    let mut records = Vec::new();
    let mut chain = 0u32;
    let mut data_pages = 0u64;
    loop {
        if pos == r.len && gen.is_none() {
            return Ok(Parsed::End);
        }
        let Some(hb) = r.get(pos, RECORD_HEADER_BYTES)? else {
            return Ok(damage(pos, "the file ends inside a record header"));
        };
        let (h, hcrc) = match RecordHeader::decode(hb) {
            Ok(x) => x,
            Err(FormatError::BadMagic) if hb.iter().all(|&b| b == 0) => {
                return Ok(damage(pos, "zeroes where a record should be"))
            }
            Err(e) => return Ok(damage(pos, format!("record header: {e}"))),
        };
        if h.drive_id != drive_id {
            return Ok(damage(
                pos,
                format!("record of another drive (id {:#x})", h.drive_id),
            ));
        }
        match gen {
            None if h.gen < min_gen => return Ok(Parsed::Stale),
            None => gen = Some(h.gen),
            Some(g) if g != h.gen => {
                return Ok(damage(
                    pos,
                    format!("record of generation {} inside generation {g}", h.gen),
                ))
            }
            Some(_) => {}
        }
        let seq = records.len() as u32;
        let next = pos + RECORD_HEADER_BYTES as u64 + h.payload_len;
        match h.kind {
            RecordKind::Commit => {
                if h.seq != seq || h.chain_crc != chain || h.payload_len != 0 {
                    return Ok(damage(
                        pos,
                        format!(
                            "commit of generation {} does not match its records (count {} vs {seq})",
                            h.gen, h.seq
                        ),
                    ));
                }
                if h.data_pages != data_pages {
                    return Ok(damage(pos, "commit page count mismatch"));
                }
                return Ok(Parsed::Gen(GenInfo {
                    gen: h.gen,
                    drive_size: h.drive_size,
                    min_size: h.min_size,
                    records,
                    data_pages,
                    start,
                    end: next,
                }));
            }
            RecordKind::Pages | RecordKind::Zero => {
                if h.seq != seq {
                    return Ok(damage(pos, format!("record {} where {seq} was due", h.seq)));
                }
                if h.n_pages == 0 || h.n_pages > MAX_RECORD_PAGES && h.kind == RecordKind::Pages {
                    return Ok(damage(pos, format!("record of {} pages", h.n_pages)));
                }
                let want = if h.kind == RecordKind::Pages {
                    pages_payload_len(h.n_pages as usize, entry_bytes)
                } else {
                    0
                };
                if h.payload_len != want {
                    return Ok(damage(pos, "payload length does not match the page count"));
                }
                if h.payload_len > 0 {
                    let payload_off = pos + RECORD_HEADER_BYTES as u64;
                    let Some(p) = r.get(payload_off, h.payload_len as usize)? else {
                        return Ok(damage(pos, "the file ends inside a record"));
                    };
                    if crc(p) != h.payload_crc {
                        return Ok(damage(pos, "record payload checksum mismatch"));
                    }
                    data_pages += h.n_pages as u64;
                }
                chain = crc32c::crc32c_append(chain, &hcrc.to_le_bytes());
                records.push(RecordLoc {
                    kind: h.kind,
                    first_page: h.first_page,
                    n_pages: h.n_pages,
                    payload_offset: pos + RECORD_HEADER_BYTES as u64,
                    payload_len: h.payload_len,
                    payload_crc: h.payload_crc,
                });
            }
        }
        pos = next;
    }
}

/// Scans a journal: every committed generation, and how the journal ends.
/// Reads the whole file once.
pub fn scan<F: StorageFile>(file: &F, drive_id: u64, entry_bytes: usize) -> io::Result<Scan> {
    let len = file.len()?;
    file.advise_sequential();
    let mut r = Reader::new(file, len);
    let mut gens: Vec<GenInfo> = Vec::new();
    let mut pos = 0;
    // The highest generation parsed so far.
    let mut last = 0;
    loop {
        match parse_gen(&mut r, pos, drive_id, entry_bytes, last + 1)? {
            Parsed::Gen(g) => {
                pos = g.end;
                last = g.gen;
                gens.push(g);
            }
            Parsed::End => {
                return Ok(Scan {
                    gens,
                    committed_end: pos,
                    file_len: len,
                    end: ScanEnd::Clean,
                })
            }
            Parsed::Stale => {
                return Ok(Scan {
                    gens,
                    committed_end: pos,
                    file_len: len,
                    end: ScanEnd::Stale { bytes: len - pos },
                })
            }
            Parsed::Damage(at, detail) => {
                // Is an intact newer generation hiding past the damage?
                let mut probe = (at / RECORD_HEADER_BYTES as u64 + 1) * RECORD_HEADER_BYTES as u64;
                while probe + RECORD_HEADER_BYTES as u64 <= len {
                    let is_start = match r.get(probe, RECORD_HEADER_BYTES)? {
                        Some(hb) => matches!(
                            RecordHeader::decode(hb),
                            Ok((h, _)) if h.drive_id == drive_id && h.gen > last && (h.seq == 0 || h.kind == RecordKind::Commit)
                        ),
                        None => false,
                    };
                    if is_start {
                        if let Parsed::Gen(g) =
                            parse_gen(&mut r, probe, drive_id, entry_bytes, last + 1)?
                        {
                            return Ok(Scan {
                                gens,
                                committed_end: pos,
                                file_len: len,
                                end: ScanEnd::Corrupt {
                                    damage_offset: at,
                                    detail,
                                    later_gen: g.gen,
                                },
                            });
                        }
                    }
                    probe += RECORD_HEADER_BYTES as u64;
                }
                return Ok(Scan {
                    gens,
                    committed_end: pos,
                    file_len: len,
                    end: ScanEnd::TornTail {
                        damage_offset: at,
                        bytes: len - pos,
                        detail,
                    },
                });
            }
        }
    }
}

/// Reads a record's payload back, checking its checksum.
pub fn read_payload<F: StorageFile>(
    file: &F,
    rec: &RecordLoc,
    buf: &mut Vec<u8>,
) -> io::Result<()> {
    buf.resize(rec.payload_len as usize, 0);
    file.read_exact_at(buf, rec.payload_offset)?;
    if crc(buf) != rec.payload_crc {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "journal record at byte {} changed since it was verified (checksum mismatch)",
                rec.payload_offset - RECORD_HEADER_BYTES as u64
            ),
        ));
    }
    Ok(())
}

/// Appends generations to a journal file.
pub struct JournalWriter<F: StorageFile> {
    file: F,
    /// Identifies the drive in every record.
    drive_id: u64,
    /// Bytes per page entry (plain or encrypted).
    entry_bytes: usize,
    /// End of the last committed generation: the next one starts here.
    committed_end: u64,
    /// The file may hold bytes past `committed_end` (a failed attempt).
    dirty_tail: bool,
    /// The generation being written, if any.
    open: Option<OpenGen>,
    /// The write buffer between generations: reused, so a sync does not
    /// map and unmap megabytes (which stalls other threads' page faults).
    spare: Vec<u8>,
    /// File offset up to which writeback was started.
    writeback_from: u64,
}

struct OpenGen {
    gen: u64,
    /// Where the next buffered byte goes in the file.
    pos: u64,
    /// Encoded records not yet written.
    buf: Vec<u8>,
    chain: u32,
    records: Vec<RecordLoc>,
    data_pages: u64,
}

impl<F: StorageFile> JournalWriter<F> {
    /// A writer appending after `committed_end` (from a scan, or 0 for a
    /// new journal). `file_len` beyond it is cut before the next append.
    pub fn new(
        file: F,
        drive_id: u64,
        entry_bytes: usize,
        committed_end: u64,
        file_len: u64,
    ) -> Self {
        JournalWriter {
            file,
            drive_id,
            entry_bytes,
            committed_end,
            dirty_tail: file_len > committed_end,
            open: None,
            spare: Vec::new(),
            writeback_from: committed_end,
        }
    }

    /// The journal file.
    pub fn file(&self) -> &F {
        &self.file
    }

    /// Bytes of committed generations.
    pub fn committed_bytes(&self) -> u64 {
        self.committed_end
    }

    /// Starts generation `gen`, cutting any leftover of a failed attempt.
    pub fn begin(&mut self, gen: u64) -> io::Result<()> {
        if self.dirty_tail {
            self.file.set_len(self.committed_end)?;
            self.file.sync_data()?;
            self.dirty_tail = false;
        }
        let mut buf = std::mem::take(&mut self.spare);
        buf.clear();
        buf.reserve(WRITE_BUFFER_BYTES + (2 << 20));
        self.writeback_from = self.committed_end;
        self.open = Some(OpenGen {
            gen,
            pos: self.committed_end,
            buf,
            chain: 0,
            records: Vec::new(),
            data_pages: 0,
        });
        Ok(())
    }

    fn open_gen(&mut self) -> &mut OpenGen {
        self.open
            .as_mut()
            .expect("journal: begin() before adding records")
    }

    fn push(&mut self, mut h: RecordHeader, payload: &[&[u8]]) -> io::Result<()> {
        let og = self.open_gen();
        h.seq = og.records.len() as u32;
        if h.kind != RecordKind::Commit {
            let mut c = 0u32;
            for p in payload {
                c = crc32c::crc32c_append(c, p);
            }
            h.payload_crc = c;
        } else {
            h.chain_crc = og.chain;
            h.data_pages = og.data_pages;
        }
        let (hb, hcrc) = h.encode();
        let header_at = og.pos + og.buf.len() as u64;
        og.buf.extend_from_slice(&hb);
        let payload_len: usize = payload.iter().map(|p| p.len()).sum();
        let direct = payload_len >= DIRECT_PAYLOAD_BYTES;
        if !direct {
            for p in payload {
                og.buf.extend_from_slice(p);
            }
        }
        if h.kind != RecordKind::Commit {
            og.chain = crc32c::crc32c_append(og.chain, &hcrc.to_le_bytes());
            og.records.push(RecordLoc {
                kind: h.kind,
                first_page: h.first_page,
                n_pages: h.n_pages,
                payload_offset: header_at + RECORD_HEADER_BYTES as u64,
                payload_len: h.payload_len,
                payload_crc: h.payload_crc,
            });
        }
        if direct {
            // Buffered headers, then the payload from where it lies.
            self.dirty_tail = true;
            let og = self.open.as_mut().expect("open generation");
            let mut parts: Vec<&[u8]> = Vec::with_capacity(payload.len() + 1);
            parts.push(&og.buf);
            parts.extend_from_slice(payload);
            self.file.write_parts_at(&parts, og.pos)?;
            og.pos += (og.buf.len() + payload_len) as u64;
            og.buf.clear();
            self.start_writeback();
        } else if og.buf.len() >= WRITE_BUFFER_BYTES {
            self.write_out()?;
        }
        Ok(())
    }

    fn write_out(&mut self) -> io::Result<()> {
        self.dirty_tail = true;
        let og = self.open.as_mut().expect("open generation");
        if og.buf.is_empty() {
            return Ok(());
        }
        self.file.write_at(&og.buf, og.pos)?;
        og.pos += og.buf.len() as u64;
        og.buf.clear();
        self.start_writeback();
        Ok(())
    }

    /// Hands what was written since the last call to the disk, in steps of
    /// `WRITEBACK_STEP_BYTES`.
    fn start_writeback(&mut self) {
        let Some(og) = self.open.as_ref() else { return };
        if og.pos >= self.writeback_from + WRITEBACK_STEP_BYTES {
            self.file
                .start_writeback(self.writeback_from, og.pos - self.writeback_from);
            self.writeback_from = og.pos;
        }
    }

    /// Adds a run of `entries.len() / entry_bytes` data pages starting at
    /// `first_page`: `data` holds their bytes (plain or ciphertext).
    pub fn add_pages(&mut self, first_page: u64, data: &[u8], entries: &[u8]) -> io::Result<()> {
        let n = data.len() / PAGE_BYTES;
        debug_assert!(n > 0 && n <= MAX_RECORD_PAGES as usize);
        debug_assert_eq!(entries.len(), n * self.entry_bytes);
        let mut h = RecordHeader::new(RecordKind::Pages, self.drive_id, self.open_gen().gen);
        h.first_page = first_page;
        h.n_pages = n as u32;
        h.payload_len = pages_payload_len(n, self.entry_bytes);
        let pad = h.payload_len as usize - data.len() - entries.len();
        let zeroes = [0u8; RECORD_HEADER_BYTES];
        self.open_gen().data_pages += n as u64;
        self.push(h, &[data, entries, &zeroes[..pad]])
    }

    /// Adds a run of `n` pages that read as zeroes.
    pub fn add_zero(&mut self, first_page: u64, n: u32) -> io::Result<()> {
        let mut h = RecordHeader::new(RecordKind::Zero, self.drive_id, self.open_gen().gen);
        h.first_page = first_page;
        h.n_pages = n;
        self.push(h, &[])
    }

    /// Writes the commit record and makes the generation durable. On
    /// success returns it; on failure the attempt is abandoned (call
    /// `abort`).
    pub fn commit(&mut self, drive_size: u64, min_size: u64) -> io::Result<GenInfo> {
        let gen = self.open_gen().gen;
        let mut h = RecordHeader::new(RecordKind::Commit, self.drive_id, gen);
        h.drive_size = drive_size;
        h.min_size = min_size;
        self.push(h, &[])?;
        self.write_out()?;
        self.file.sync_data()?;
        let mut og = self.open.take().expect("open generation");
        self.spare = std::mem::take(&mut og.buf);
        let info = GenInfo {
            gen,
            drive_size,
            min_size,
            records: og.records,
            data_pages: og.data_pages,
            start: self.committed_end,
            end: og.pos,
        };
        self.committed_end = og.pos;
        self.dirty_tail = false;
        Ok(info)
    }

    /// Abandons the generation being written (its bytes are cut before the
    /// next one starts).
    pub fn abort(&mut self) {
        if let Some(og) = self.open.take() {
            self.spare = og.buf;
            self.dirty_tail = true;
        }
    }

    /// Empties the journal durably (after a checkpoint made everything in
    /// it redundant). If this fails, the next `begin` empties it first.
    pub fn reset(&mut self) -> io::Result<()> {
        debug_assert!(self.open.is_none());
        self.committed_end = 0;
        self.dirty_tail = true;
        self.file.set_len(0)?;
        self.file.sync_data()?;
        self.dirty_tail = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::format::{plain_entry, PLAIN_ENTRY_BYTES};
    use crate::persist::storage::Storage;
    use crate::sim::SimDisk;

    const ID: u64 = 0xD1;

    fn page(b: u8) -> Vec<u8> {
        vec![b; PAGE_BYTES]
    }

    /// A journal with generations 1 (pages 0..2 + zero run) and 2 (page 9).
    fn two_gens() -> (SimDisk, u64, u64) {
        let d = SimDisk::new(1);
        let f = d.open("journal", true).unwrap();
        let mut w = JournalWriter::new(f, ID, PLAIN_ENTRY_BYTES, 0, 0);
        w.begin(1).unwrap();
        let data = [page(1), page(2)].concat();
        let entries = [plain_entry(&page(1)), plain_entry(&page(2))].concat();
        w.add_pages(0, &data, &entries).unwrap();
        w.add_zero(5, 3).unwrap();
        let g1 = w.commit(1 << 20, 1 << 20).unwrap();
        w.begin(2).unwrap();
        w.add_pages(9, &page(9), &plain_entry(&page(9))).unwrap();
        let g2 = w.commit(1 << 20, 1 << 20).unwrap();
        assert_eq!(g1.end, g2.start);
        (d, g1.end, g2.end)
    }

    fn scan_sim(d: &SimDisk) -> Scan {
        let f = d.open("journal", false).unwrap();
        scan(&f, ID, PLAIN_ENTRY_BYTES).unwrap()
    }

    #[test]
    fn committed_generations_scan_back() {
        let (d, _, end) = two_gens();
        let s = scan_sim(&d);
        assert_eq!(s.end, ScanEnd::Clean);
        assert_eq!(s.gens.len(), 2);
        assert_eq!(s.committed_end, end);
        assert_eq!(s.gens[0].records.len(), 2);
        assert_eq!(s.gens[0].data_pages, 2);
        assert_eq!(s.gens[1].records[0].first_page, 9);
        let f = d.open("journal", false).unwrap();
        let mut buf = Vec::new();
        read_payload(&f, &s.gens[1].records[0], &mut buf).unwrap();
        assert_eq!(&buf[..PAGE_BYTES], &page(9)[..]);
    }

    #[test]
    fn damage_in_the_last_generation_is_a_torn_tail() {
        let (d, g1_end, end) = two_gens();
        // Every cut point inside generation 2 and every flipped byte in it.
        let full = d.contents("journal").unwrap();
        for cut in (g1_end + 1..end).step_by(97) {
            d.set_contents("journal", full[..cut as usize].to_vec());
            let s = scan_sim(&d);
            assert_eq!(s.gens.len(), 1, "cut at {cut}");
            assert_eq!(s.committed_end, g1_end);
            assert!(
                matches!(s.end, ScanEnd::TornTail { .. }),
                "cut at {cut}: {:?}",
                s.end
            );
        }
        for at in (g1_end..end).step_by(61) {
            let mut b = full.clone();
            b[at as usize] ^= 0x40;
            d.set_contents("journal", b);
            let s = scan_sim(&d);
            assert_eq!(s.gens.len(), 1, "flip at {at}");
            assert!(matches!(s.end, ScanEnd::TornTail { .. }));
        }
    }

    #[test]
    fn damage_before_an_intact_generation_is_corruption() {
        let (d, g1_end, _) = two_gens();
        let full = d.contents("journal").unwrap();
        for at in (0..g1_end).step_by(71) {
            let mut b = full.clone();
            b[at as usize] ^= 0x01;
            d.set_contents("journal", b);
            let s = scan_sim(&d);
            assert!(s.gens.is_empty());
            match s.end {
                ScanEnd::Corrupt { later_gen, .. } => assert_eq!(later_gen, 2),
                other => panic!("flip at {at}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_commit_without_its_records_does_not_count() {
        let (d, g1_end, end) = two_gens();
        let mut b = d.contents("journal").unwrap();
        // Lose generation 2's pages record, keep its commit.
        let rec_end = end as usize - RECORD_HEADER_BYTES;
        b[g1_end as usize..rec_end].fill(0);
        d.set_contents("journal", b);
        let s = scan_sim(&d);
        assert_eq!(s.gens.len(), 1);
        assert!(matches!(s.end, ScanEnd::TornTail { .. }));
    }

    #[test]
    fn a_failed_attempt_is_cut_before_the_next() {
        let d = SimDisk::new(2);
        let f = d.open("journal", true).unwrap();
        let mut w = JournalWriter::new(f, ID, PLAIN_ENTRY_BYTES, 0, 0);
        w.begin(1).unwrap();
        for i in 0..12 {
            w.add_pages(
                i * 300,
                &page(1).repeat(200),
                &plain_entry(&page(1)).repeat(200),
            )
            .unwrap();
        }
        w.abort();
        w.begin(2).unwrap();
        w.add_zero(0, 1).unwrap();
        w.commit(4096, 4096).unwrap();
        let s = scan_sim(&d);
        assert_eq!(s.end, ScanEnd::Clean);
        assert_eq!(s.gens.iter().map(|g| g.gen).collect::<Vec<_>>(), vec![2]);
    }
}
