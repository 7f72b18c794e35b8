//! The manifest: what one snapshot is (pure: format, encode, decode,
//! verify; names of snapshot objects).
//!
//! A manifest lists, for each chunk of the drive in order, either "zero"
//! or the address of the object holding it. It is the last object a push
//! writes, so a snapshot exists exactly when its manifest does: a push cut
//! short leaves only chunks, which the next push reuses and which garbage
//! collection may reclaim (see `gc.rs`).
//!
//! Plaintext layout (all integers little-endian), wrapped in the codec's
//! envelope (zstd, and AEAD with a key) before upload:
//!
//! ```text
//!  magic        8 B   "RAMDSNAP"
//!  version      u32   1
//!  flags        u32   bit 0: addresses are keyed (encrypted snapshot)
//!  size_bytes   u64   drive size at the cut
//!  chunk_bytes  u64   power of two, 64 KiB ..= 64 MiB
//!  created_ms   u64   Unix time of the cut, milliseconds
//!  drive        u16 length + UTF-8    the drive's name
//!  label        u16 length + UTF-8    free text ("" when none)
//!  count        u64   = ceil(size_bytes / chunk_bytes)
//!  entries      count x (u8 kind: 0 zero, 1 data; data: 32 B address)
//!  checksum     32 B  SHA-256 of every byte above
//! ```
//!
//! Object names: `snapshots/<drive>/<created_ms, 16 digits>-<8 hex>`, so a
//! listing sorts by time and retention needs no manifest download; the
//! random suffix keeps two pushes in the same millisecond apart.

use ring::digest;

use super::chunk::{Address, Geometry};

const MAGIC: &[u8; 8] = b"RAMDSNAP";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
const FLAG_KEYED: u32 = 1;
const CHECKSUM_BYTES: usize = 32;
/// Longest drive name or label stored.
pub const MAX_TEXT_BYTES: usize = 1024;

/// One chunk of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Entry {
    /// All zero bytes: no object.
    Zero,
    /// The object `chunks/..` named by this address.
    Data(Address),
}

/// A snapshot's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The drive's name.
    pub drive: String,
    /// Free-form label given at push time.
    pub label: String,
    /// Unix time of the cut, in milliseconds.
    pub created_ms: u64,
    /// Whether addresses are keyed (the snapshot is encrypted).
    pub keyed: bool,
    /// The chunk grid.
    pub geometry: Geometry,
    /// One entry per chunk, in drive order.
    pub entries: Vec<Entry>,
}

/// Why manifest bytes were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    /// Ends before its fields do.
    #[error("truncated")]
    Truncated,
    /// Not a manifest.
    #[error("not a ramd snapshot manifest (bad magic)")]
    BadMagic,
    /// Written by a newer format.
    #[error("format version {0} is not supported (this ramd reads version 1): upgrade ramd")]
    Version(u32),
    /// The SHA-256 trailer does not match.
    #[error("checksum mismatch: the manifest is corrupt")]
    Checksum,
    /// A field holds an impossible value.
    #[error("invalid: {0}")]
    Invalid(&'static str),
}

impl Manifest {
    /// Number of data (non-zero) chunks.
    pub fn data_chunks(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e, Entry::Data(_)))
            .count()
    }

    /// The distinct addresses the snapshot needs.
    pub fn addresses(&self) -> impl Iterator<Item = Address> + '_ {
        self.entries.iter().filter_map(|e| match e {
            Entry::Data(a) => Some(*a),
            Entry::Zero => None,
        })
    }

    /// The plaintext encoding (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        assert_eq!(
            self.entries.len() as u64,
            self.geometry.count(),
            "one entry per chunk"
        );
        let mut out = Vec::with_capacity(96 + self.entries.len() * 33);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        let flags = if self.keyed { FLAG_KEYED } else { 0 };
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&self.geometry.size_bytes.to_le_bytes());
        out.extend_from_slice(&self.geometry.chunk_bytes.to_le_bytes());
        out.extend_from_slice(&self.created_ms.to_le_bytes());
        for text in [&self.drive, &self.label] {
            assert!(text.len() <= MAX_TEXT_BYTES, "checked by the caller");
            out.extend_from_slice(&(text.len() as u16).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            match e {
                Entry::Zero => out.push(0),
                Entry::Data(a) => {
                    out.push(1);
                    out.extend_from_slice(&a.0);
                }
            }
        }
        let sum = digest::digest(&digest::SHA256, &out);
        out.extend_from_slice(sum.as_ref());
        out
    }

    /// Decodes and verifies plaintext manifest bytes.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() < MAGIC.len() + 4 + CHECKSUM_BYTES {
            return Err(ManifestError::Truncated);
        }
        if &bytes[..8] != MAGIC {
            return Err(ManifestError::BadMagic);
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(ManifestError::Version(version));
        }
        let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
        if digest::digest(&digest::SHA256, body).as_ref() != sum {
            return Err(ManifestError::Checksum);
        }
        let mut r = Reader { rest: &body[12..] };
        let flags = r.u32()?;
        if flags & !FLAG_KEYED != 0 {
            return Err(ManifestError::Invalid("unknown flags"));
        }
        let size_bytes = r.u64()?;
        let chunk_bytes = r.u64()?;
        let geometry = Geometry::new(size_bytes, chunk_bytes)
            .map_err(|_| ManifestError::Invalid("chunk size"))?;
        let created_ms = r.u64()?;
        let drive = r.text()?;
        let label = r.text()?;
        let count = r.u64()?;
        if count != geometry.count() {
            return Err(ManifestError::Invalid(
                "chunk count does not match the size",
            ));
        }
        // Each entry is at least one byte: bounds the allocation.
        if count > r.rest.len() as u64 {
            return Err(ManifestError::Truncated);
        }
        let mut entries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            entries.push(match r.take(1)?[0] {
                0 => Entry::Zero,
                1 => Entry::Data(Address(r.take(32)?.try_into().expect("32 bytes"))),
                _ => return Err(ManifestError::Invalid("entry kind")),
            });
        }
        if !r.rest.is_empty() {
            return Err(ManifestError::Invalid("trailing bytes"));
        }
        Ok(Manifest {
            drive,
            label,
            created_ms,
            keyed: flags & FLAG_KEYED != 0,
            geometry,
            entries,
        })
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ManifestError> {
        if self.rest.len() < n {
            return Err(ManifestError::Truncated);
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, ManifestError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, ManifestError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn text(&mut self) -> Result<String, ManifestError> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")) as usize;
        if n > MAX_TEXT_BYTES {
            return Err(ManifestError::Invalid("text too long"));
        }
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| ManifestError::Invalid("text is not UTF-8"))
    }
}

/// A snapshot's identity: its drive, time and random suffix. Displays as
/// `<drive>/<created_ms>-<suffix>`, the object name below `snapshots/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotId {
    /// The drive's name.
    pub drive: String,
    /// Unix time of the cut, in milliseconds.
    pub created_ms: u64,
    /// Random, to keep pushes in the same millisecond apart.
    pub suffix: u32,
}

impl SnapshotId {
    /// The manifest's object name.
    pub fn object_name(&self) -> String {
        format!("snapshots/{self}")
    }

    /// Parses an object name made by [`SnapshotId::object_name`].
    pub fn from_object_name(name: &str) -> Option<SnapshotId> {
        name.strip_prefix("snapshots/")?.parse().ok()
    }
}

impl std::fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{:016}-{:08x}",
            self.drive, self.created_ms, self.suffix
        )
    }
}

/// A snapshot id that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a snapshot id (expected DRIVE/MILLISECONDS-SUFFIX, as `snapshots list` prints)")]
pub struct BadSnapshotId;

impl std::str::FromStr for SnapshotId {
    type Err = BadSnapshotId;
    fn from_str(s: &str) -> Result<SnapshotId, BadSnapshotId> {
        let (drive, rest) = s.rsplit_once('/').ok_or(BadSnapshotId)?;
        let (ms, suffix) = rest.split_once('-').ok_or(BadSnapshotId)?;
        if !valid_drive_name(drive) || ms.len() != 16 || suffix.len() != 8 {
            return Err(BadSnapshotId);
        }
        Ok(SnapshotId {
            drive: drive.to_owned(),
            created_ms: ms.parse().map_err(|_| BadSnapshotId)?,
            suffix: u32::from_str_radix(suffix, 16).map_err(|_| BadSnapshotId)?,
        })
    }
}

/// Drive names usable in object names: 1..=128 of `[A-Za-z0-9._-]`, not
/// starting with a dot.
pub fn valid_drive_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::chunk::MIN_CHUNK_BYTES;

    fn sample() -> Manifest {
        let g = Geometry::new(3 * MIN_CHUNK_BYTES + 1, MIN_CHUNK_BYTES).unwrap();
        Manifest {
            drive: "db".into(),
            label: "before upgrade".into(),
            created_ms: 1_764_000_000_123,
            keyed: true,
            geometry: g,
            entries: vec![
                Entry::Data(Address([1; 32])),
                Entry::Zero,
                Entry::Data(Address([1; 32])),
                Entry::Data(Address([2; 32])),
            ],
        }
    }

    #[test]
    fn round_trips() {
        let m = sample();
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        assert_eq!(m.data_chunks(), 3);
        assert_eq!(m.addresses().count(), 3);
    }

    #[test]
    fn any_flipped_or_cut_byte_is_refused() {
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(Manifest::decode(&bad).is_err(), "flip at {i}");
        }
        for n in 0..bytes.len() {
            assert!(Manifest::decode(&bytes[..n]).is_err(), "cut at {n}");
        }
    }

    /// Re-seals a body with a valid checksum, to reach the field checks.
    fn resealed(mut body: Vec<u8>) -> Vec<u8> {
        let sum = digest::digest(&digest::SHA256, &body);
        body.extend_from_slice(sum.as_ref());
        body
    }

    #[test]
    fn field_checks_behind_a_valid_checksum() {
        let good = sample().encode();
        let body = good[..good.len() - 32].to_vec();
        let mut v2 = body.clone();
        v2[8] = 2;
        assert_eq!(
            Manifest::decode(&resealed(v2)),
            Err(ManifestError::Version(2))
        );
        let mut bad_chunk = body.clone();
        bad_chunk[24..32].copy_from_slice(&1000u64.to_le_bytes());
        assert_eq!(
            Manifest::decode(&resealed(bad_chunk)),
            Err(ManifestError::Invalid("chunk size"))
        );
        let mut extra = body.clone();
        extra.push(0);
        assert_eq!(
            Manifest::decode(&resealed(extra)),
            Err(ManifestError::Invalid("trailing bytes"))
        );
        let mut kind = body.clone();
        let n = kind.len();
        kind[n - 33] = 7; // the last entry's kind byte
        assert_eq!(
            Manifest::decode(&resealed(kind)),
            Err(ManifestError::Invalid("entry kind"))
        );
    }

    #[test]
    fn snapshot_ids_round_trip_and_sort_by_time() {
        let a = SnapshotId {
            drive: "db-1".into(),
            created_ms: 5,
            suffix: 0xab,
        };
        assert_eq!(a.object_name(), "snapshots/db-1/0000000000000005-000000ab");
        assert_eq!(
            SnapshotId::from_object_name(&a.object_name()),
            Some(a.clone())
        );
        let b = SnapshotId {
            created_ms: 40,
            ..a.clone()
        };
        assert!(a.object_name() < b.object_name());
        for bad in [
            "db",
            "db/5-ab",
            "/0000000000000005-000000ab",
            "a/b/0000000000000005-0000zzab",
            ".x/0000000000000005-000000ab",
        ] {
            assert_eq!(bad.parse::<SnapshotId>(), Err(BadSnapshotId), "{bad}");
        }
    }
}
