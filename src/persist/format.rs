//! On-disk formats of a drive's state directory: pure encode/decode, no I/O.
//!
//! ```text
//!  STATE_DIR/
//!    meta      512 bytes: what the drive is, which generation the image holds
//!    image     the drive's bytes at offset = drive offset (raw, sparse; holes
//!              read as zero). Plain drives: usable by qemu-img / losetup.
//!              Encrypted drives: AES-256-GCM ciphertext, page by page.
//!    pages     one entry per 4 KiB page of the image (checksum or nonce+tag)
//!    journal   redo log of generations not yet checkpointed into the image
//! ```
//!
//! All integers are little-endian. Every structure carries a CRC-32C
//! (Castagnoli) so a flipped bit is detected, never loaded.
//!
//! # meta (512 bytes, replaced atomically: write `meta.tmp`, fsync, rename, fsync dir)
//!
//! ```text
//!  off size field
//!    0    8 magic "RAMDMETA"
//!    8    4 version (1)
//!   12    4 flags: bit 0 = encrypted
//!   16    8 drive_size (bytes)
//!   24    4 page_bytes (4096)
//!   28    4 entry_bytes (8 plain, 32 encrypted): size of a `pages` entry
//!   32   16 uuid (random, identifies the drive; its first 8 bytes are the
//!           journal's drive_id)
//!   48    8 image_gen: the last generation checkpointed into image+pages
//!   56    8 created_unix_ms
//!   64    8 updated_unix_ms
//!   72   44 key_check (encrypted only): nonce(12) | AES-GCM(16 zero bytes)
//!           (16) | tag(16); opens only under the right key
//!  116  392 reserved, zero
//!  508    4 crc32c of bytes 0..508
//! ```
//!
//! # pages (entry_bytes per page, page i at offset i * entry_bytes)
//!
//! ```text
//!  plain (8):      flags u32 (bit 0 = data) | crc32c of the 4 KiB page u32
//!  encrypted (32): flags u32 (bit 0 = data) | nonce [12] | tag [16]
//!  all zero = hole: the page reads as zeroes (the image has a hole there)
//! ```
//!
//! The last page of a drive whose size is not a multiple of 4 KiB is checked
//! (and encrypted) as a whole page padded with zeroes.
//!
//! # journal (a sequence of 512-byte-aligned records; no file header)
//!
//! ```text
//!  record = header (512) | payload (payload_len, a multiple of 512)
//!
//!  header:
//!  off size field
//!    0    4 magic "RJNL"
//!    4    2 version (1)
//!    6    1 kind: 1 = pages, 2 = zero run, 3 = commit
//!    7    1 reserved
//!    8    8 drive_id (first 8 bytes of the meta uuid)
//!   16    8 gen: the sync generation this record belongs to
//!   24    4 seq: index of the record within its generation (commit: count)
//!   28    4 n_pages
//!   32    8 first_page
//!   40    8 payload_len
//!   48    4 payload_crc: crc32c of the payload
//!   52    4 chain_crc (commit): crc32c over the header_crc of every record
//!           of the generation, in order (proves none is missing)
//!   56    8 drive_size (commit): drive size at the sync's cut
//!   64    8 data_pages (commit): pages with data in the generation
//!   72    8 min_size (commit): the smallest drive size since the previous
//!           generation (a shrink and regrow zeroes the bytes beyond it)
//!   80  428 reserved, zero
//!  508    4 header_crc: crc32c of bytes 0..508
//!
//!  pages payload:  n_pages x 4096 page bytes (plain or ciphertext)
//!                | n_pages x entry_bytes entries (as in `pages`) | zero pad
//!  zero run:       no payload: pages first_page.. read as zeroes
//!  commit:         no payload
//! ```
//!
//! A generation is *committed* when its commit record is present, valid, and
//! its count and chain checksum match the records before it.

use crate::persist::crc;

/// Bytes per page.
pub const PAGE_BYTES: usize = 4096;
/// Bytes of the meta file.
pub const META_BYTES: usize = 512;
/// Bytes of a journal record header; records are aligned to this.
pub const RECORD_HEADER_BYTES: usize = 512;
/// Bytes of a `pages` entry for a plain drive.
pub const PLAIN_ENTRY_BYTES: usize = 8;
/// Bytes of a `pages` entry for an encrypted drive.
pub const ENCRYPTED_ENTRY_BYTES: usize = 32;
/// Bytes of the key check in meta.
pub const KEY_CHECK_BYTES: usize = 44;

const META_MAGIC: &[u8; 8] = b"RAMDMETA";
const META_VERSION: u32 = 1;
const RECORD_MAGIC: &[u8; 4] = b"RJNL";
const RECORD_VERSION: u16 = 1;
const FLAG_ENCRYPTED: u32 = 1;
/// Entry flag: the page holds data.
pub const ENTRY_DATA: u32 = 1;

/// Why bytes did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Too few bytes for the structure.
    #[error("truncated: {found} bytes, need {need}")]
    Truncated { found: usize, need: usize },
    /// The magic number is wrong: not this kind of file, or overwritten.
    #[error("bad magic number")]
    BadMagic,
    /// Written by a newer (or unknown) format version.
    #[error("unsupported format version {found} (this ramd reads version {supported})")]
    UnsupportedVersion { found: u32, supported: u32 },
    /// The stored checksum does not match the contents.
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    /// Fields are self-contradictory.
    #[error("invalid field: {0}")]
    Invalid(String),
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Checks the trailing CRC of a 512-byte block.
fn check_block_crc(b: &[u8]) -> Result<(), FormatError> {
    let stored = le_u32(b, 508);
    let computed = crc(&b[..508]);
    if stored != computed {
        return Err(FormatError::Checksum { stored, computed });
    }
    Ok(())
}

/// The drive's metadata (the `meta` file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// Drive size in bytes.
    pub drive_size: u64,
    /// Pages are AES-256-GCM encrypted.
    pub encrypted: bool,
    /// Identifies the drive; journal records carry its first 8 bytes.
    pub uuid: [u8; 16],
    /// The last generation checkpointed into the image (0: none yet).
    pub image_gen: u64,
    /// When the drive was created (ms since the Unix epoch).
    pub created_unix_ms: u64,
    /// When this meta was written.
    pub updated_unix_ms: u64,
    /// Proof of the key (encrypted drives), zero otherwise.
    pub key_check: [u8; KEY_CHECK_BYTES],
}

impl Meta {
    /// The drive id journal records carry.
    pub fn drive_id(&self) -> u64 {
        u64::from_le_bytes(self.uuid[..8].try_into().expect("8 bytes"))
    }

    /// Bytes per `pages` entry.
    pub fn entry_bytes(&self) -> usize {
        entry_bytes(self.encrypted)
    }

    /// Pages in the drive (the last one may be partial).
    pub fn pages(&self) -> u64 {
        (self.drive_size).div_ceil(PAGE_BYTES as u64)
    }

    /// Encodes to the 512 bytes of the meta file.
    pub fn encode(&self) -> [u8; META_BYTES] {
        let mut b = [0u8; META_BYTES];
        b[0..8].copy_from_slice(META_MAGIC);
        b[8..12].copy_from_slice(&META_VERSION.to_le_bytes());
        let flags = if self.encrypted { FLAG_ENCRYPTED } else { 0 };
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.drive_size.to_le_bytes());
        b[24..28].copy_from_slice(&(PAGE_BYTES as u32).to_le_bytes());
        b[28..32].copy_from_slice(&(self.entry_bytes() as u32).to_le_bytes());
        b[32..48].copy_from_slice(&self.uuid);
        b[48..56].copy_from_slice(&self.image_gen.to_le_bytes());
        b[56..64].copy_from_slice(&self.created_unix_ms.to_le_bytes());
        b[64..72].copy_from_slice(&self.updated_unix_ms.to_le_bytes());
        b[72..72 + KEY_CHECK_BYTES].copy_from_slice(&self.key_check);
        let c = crc(&b[..508]);
        b[508..512].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decodes the meta file's bytes, checking magic, version and checksum.
    pub fn decode(b: &[u8]) -> Result<Meta, FormatError> {
        if b.len() < META_BYTES {
            return Err(FormatError::Truncated {
                found: b.len(),
                need: META_BYTES,
            });
        }
        let b = &b[..META_BYTES];
        if &b[0..8] != META_MAGIC {
            return Err(FormatError::BadMagic);
        }
        check_block_crc(b)?;
        let version = le_u32(b, 8);
        if version != META_VERSION {
            return Err(FormatError::UnsupportedVersion {
                found: version,
                supported: META_VERSION,
            });
        }
        let flags = le_u32(b, 12);
        if flags & !FLAG_ENCRYPTED != 0 {
            return Err(FormatError::Invalid(format!("unknown flags {flags:#x}")));
        }
        let encrypted = flags & FLAG_ENCRYPTED != 0;
        let page = le_u32(b, 24) as usize;
        if page != PAGE_BYTES {
            return Err(FormatError::Invalid(format!(
                "page size {page} (only {PAGE_BYTES} is supported)"
            )));
        }
        let entry = le_u32(b, 28) as usize;
        if entry != entry_bytes(encrypted) {
            return Err(FormatError::Invalid(format!(
                "page entry size {entry} does not match the encryption flag"
            )));
        }
        Ok(Meta {
            drive_size: le_u64(b, 16),
            encrypted,
            uuid: b[32..48].try_into().expect("16 bytes"),
            image_gen: le_u64(b, 48),
            created_unix_ms: le_u64(b, 56),
            updated_unix_ms: le_u64(b, 64),
            key_check: b[72..72 + KEY_CHECK_BYTES].try_into().expect("44 bytes"),
        })
    }
}

/// Bytes per `pages` entry.
pub fn entry_bytes(encrypted: bool) -> usize {
    if encrypted {
        ENCRYPTED_ENTRY_BYTES
    } else {
        PLAIN_ENTRY_BYTES
    }
}

/// The `pages` entry of a plain data page.
pub fn plain_entry(page: &[u8]) -> [u8; PLAIN_ENTRY_BYTES] {
    let mut e = [0u8; PLAIN_ENTRY_BYTES];
    e[0..4].copy_from_slice(&ENTRY_DATA.to_le_bytes());
    e[4..8].copy_from_slice(&crc(page).to_le_bytes());
    e
}

/// The `pages` entry of an encrypted data page.
pub fn encrypted_entry(nonce: &[u8; 12], tag: &[u8; 16]) -> [u8; ENCRYPTED_ENTRY_BYTES] {
    let mut e = [0u8; ENCRYPTED_ENTRY_BYTES];
    e[0..4].copy_from_slice(&ENTRY_DATA.to_le_bytes());
    e[4..16].copy_from_slice(nonce);
    e[16..32].copy_from_slice(tag);
    e
}

/// What a `pages` entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// The page reads as zeroes.
    Hole,
    /// Plain data with this CRC-32C.
    Plain { crc: u32 },
    /// Encrypted data with this nonce and tag.
    Encrypted { nonce: [u8; 12], tag: [u8; 16] },
}

/// Decodes one `pages` entry (`e.len()` is the entry size).
pub fn decode_entry(e: &[u8]) -> Result<Entry, FormatError> {
    let flags = le_u32(e, 0);
    if flags == 0 {
        return if e.iter().all(|&b| b == 0) {
            Ok(Entry::Hole)
        } else {
            Err(FormatError::Invalid(
                "hole entry with non-zero fields".into(),
            ))
        };
    }
    if flags != ENTRY_DATA {
        return Err(FormatError::Invalid(format!("entry flags {flags:#x}")));
    }
    match e.len() {
        PLAIN_ENTRY_BYTES => Ok(Entry::Plain { crc: le_u32(e, 4) }),
        ENCRYPTED_ENTRY_BYTES => Ok(Entry::Encrypted {
            nonce: e[4..16].try_into().expect("12 bytes"),
            tag: e[16..32].try_into().expect("16 bytes"),
        }),
        n => Err(FormatError::Invalid(format!("entry size {n}"))),
    }
}

/// The kind of a journal record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A run of pages with data.
    Pages = 1,
    /// A run of pages that read as zeroes.
    Zero = 2,
    /// Ends a generation.
    Commit = 3,
}

/// A journal record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    /// What follows.
    pub kind: RecordKind,
    /// The drive this journal belongs to.
    pub drive_id: u64,
    /// The sync generation.
    pub gen: u64,
    /// Index within the generation; for a commit, the number of records.
    pub seq: u32,
    /// Pages covered (pages, zero).
    pub n_pages: u32,
    /// First page covered (pages, zero).
    pub first_page: u64,
    /// Bytes of payload after the header (a multiple of 512).
    pub payload_len: u64,
    /// CRC-32C of the payload.
    pub payload_crc: u32,
    /// Commit: CRC-32C over the header CRCs of the generation's records.
    pub chain_crc: u32,
    /// Commit: drive size at the cut.
    pub drive_size: u64,
    /// Commit: pages with data in the generation.
    pub data_pages: u64,
    /// Commit: smallest drive size since the previous generation.
    pub min_size: u64,
}

impl RecordHeader {
    /// A header of `kind` with every other field zero.
    pub fn new(kind: RecordKind, drive_id: u64, gen: u64) -> RecordHeader {
        RecordHeader {
            kind,
            drive_id,
            gen,
            seq: 0,
            n_pages: 0,
            first_page: 0,
            payload_len: 0,
            payload_crc: 0,
            chain_crc: 0,
            drive_size: 0,
            data_pages: 0,
            min_size: 0,
        }
    }

    /// Encodes to 512 bytes; also returns the header CRC (for chains).
    pub fn encode(&self) -> ([u8; RECORD_HEADER_BYTES], u32) {
        let mut b = [0u8; RECORD_HEADER_BYTES];
        b[0..4].copy_from_slice(RECORD_MAGIC);
        b[4..6].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        b[6] = self.kind as u8;
        b[8..16].copy_from_slice(&self.drive_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.gen.to_le_bytes());
        b[24..28].copy_from_slice(&self.seq.to_le_bytes());
        b[28..32].copy_from_slice(&self.n_pages.to_le_bytes());
        b[32..40].copy_from_slice(&self.first_page.to_le_bytes());
        b[40..48].copy_from_slice(&self.payload_len.to_le_bytes());
        b[48..52].copy_from_slice(&self.payload_crc.to_le_bytes());
        b[52..56].copy_from_slice(&self.chain_crc.to_le_bytes());
        b[56..64].copy_from_slice(&self.drive_size.to_le_bytes());
        b[64..72].copy_from_slice(&self.data_pages.to_le_bytes());
        b[72..80].copy_from_slice(&self.min_size.to_le_bytes());
        let c = crc(&b[..508]);
        b[508..512].copy_from_slice(&c.to_le_bytes());
        (b, c)
    }

    /// Decodes a header; also returns its CRC.
    pub fn decode(b: &[u8]) -> Result<(RecordHeader, u32), FormatError> {
        if b.len() < RECORD_HEADER_BYTES {
            return Err(FormatError::Truncated {
                found: b.len(),
                need: RECORD_HEADER_BYTES,
            });
        }
        let b = &b[..RECORD_HEADER_BYTES];
        if &b[0..4] != RECORD_MAGIC {
            return Err(FormatError::BadMagic);
        }
        check_block_crc(b)?;
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != RECORD_VERSION {
            return Err(FormatError::UnsupportedVersion {
                found: version as u32,
                supported: RECORD_VERSION as u32,
            });
        }
        let kind = match b[6] {
            1 => RecordKind::Pages,
            2 => RecordKind::Zero,
            3 => RecordKind::Commit,
            k => return Err(FormatError::Invalid(format!("record kind {k}"))),
        };
        let h = RecordHeader {
            kind,
            drive_id: le_u64(b, 8),
            gen: le_u64(b, 16),
            seq: le_u32(b, 24),
            n_pages: le_u32(b, 28),
            first_page: le_u64(b, 32),
            payload_len: le_u64(b, 40),
            payload_crc: le_u32(b, 48),
            chain_crc: le_u32(b, 52),
            drive_size: le_u64(b, 56),
            data_pages: le_u64(b, 64),
            min_size: le_u64(b, 72),
        };
        if h.min_size > h.drive_size {
            return Err(FormatError::Invalid("min size above drive size".into()));
        }
        if h.payload_len % RECORD_HEADER_BYTES as u64 != 0 {
            return Err(FormatError::Invalid(format!(
                "payload length {} is not a multiple of 512",
                h.payload_len
            )));
        }
        if h.first_page.checked_add(h.n_pages as u64).is_none() {
            return Err(FormatError::Invalid("page range overflows".into()));
        }
        let c = le_u32(b, 508);
        Ok((h, c))
    }
}

/// Payload bytes of a pages record of `n` pages.
pub fn pages_payload_len(n: usize, entry_bytes: usize) -> u64 {
    ((n * (PAGE_BYTES + entry_bytes)) as u64).next_multiple_of(RECORD_HEADER_BYTES as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            drive_size: 10 * 4096 + 100,
            encrypted: false,
            uuid: [7; 16],
            image_gen: 42,
            created_unix_ms: 1,
            updated_unix_ms: 2,
            key_check: [0; KEY_CHECK_BYTES],
        }
    }

    #[test]
    fn meta_round_trips_and_reports_damage_precisely() {
        let m = meta();
        let b = m.encode();
        assert_eq!(Meta::decode(&b).unwrap(), m);
        assert_eq!(m.pages(), 11);
        // Every single flipped bit is caught.
        for i in 0..META_BYTES {
            let mut d = b;
            d[i] ^= 0x10;
            assert!(Meta::decode(&d).is_err(), "flip at byte {i} not detected");
        }
        assert_eq!(
            Meta::decode(&b[..100]),
            Err(FormatError::Truncated {
                found: 100,
                need: 512
            })
        );
        let mut d = b;
        d[0] = b'X';
        assert_eq!(Meta::decode(&d), Err(FormatError::BadMagic));
        // A newer version with a valid checksum is refused by version.
        let mut d = b;
        d[8] = 2;
        let c = crc(&d[..508]);
        d[508..].copy_from_slice(&c.to_le_bytes());
        assert_eq!(
            Meta::decode(&d),
            Err(FormatError::UnsupportedVersion {
                found: 2,
                supported: 1
            })
        );
        assert!(matches!(
            Meta::decode(&[0u8; 512]),
            Err(FormatError::BadMagic)
        ));
    }

    #[test]
    fn record_headers_round_trip_and_catch_flips() {
        let mut h = RecordHeader::new(RecordKind::Commit, 99, 5);
        h.seq = 3;
        h.chain_crc = 0xDEAD_BEEF;
        h.drive_size = 1 << 30;
        h.data_pages = 12;
        h.min_size = 1 << 20;
        let (b, c) = h.encode();
        let (back, c2) = RecordHeader::decode(&b).unwrap();
        assert_eq!((back, c2), (h, c));
        for i in 0..RECORD_HEADER_BYTES {
            let mut d = b;
            d[i] ^= 1;
            assert!(RecordHeader::decode(&d).is_err(), "flip at {i}");
        }
        assert!(matches!(
            RecordHeader::decode(&b[..511]),
            Err(FormatError::Truncated { .. })
        ));
    }

    #[test]
    fn entries_round_trip() {
        let page = [3u8; PAGE_BYTES];
        let e = plain_entry(&page);
        assert_eq!(decode_entry(&e).unwrap(), Entry::Plain { crc: crc(&page) });
        assert_eq!(decode_entry(&[0u8; 8]).unwrap(), Entry::Hole);
        let e = encrypted_entry(&[1; 12], &[2; 16]);
        assert_eq!(
            decode_entry(&e).unwrap(),
            Entry::Encrypted {
                nonce: [1; 12],
                tag: [2; 16]
            }
        );
        let mut bad = [0u8; 8];
        bad[5] = 1;
        assert!(decode_entry(&bad).is_err());
        bad = [9, 0, 0, 0, 0, 0, 0, 0];
        assert!(decode_entry(&bad).is_err());
        assert_eq!(pages_payload_len(1, 8), 4608);
        assert_eq!(pages_payload_len(2, 32), 8704);
    }
}
