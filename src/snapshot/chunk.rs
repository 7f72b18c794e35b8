//! Cutting a drive into chunks and naming each chunk by its contents (pure:
//! no I/O).
//!
//! A drive of `size` bytes is cut into `ceil(size / chunk_size)` chunks at
//! fixed, aligned offsets: chunk `i` covers `[i * chunk_size, min((i + 1) *
//! chunk_size, size))`. Fixed alignment (not content-defined chunking)
//! because a block device is overwritten in place: a write never shifts the
//! bytes after it, so the chunks it does not touch keep their addresses.
//!
//! Each chunk's address is the SHA-256 of its plaintext, or, when snapshots
//! are encrypted, HMAC-SHA256 under a key derived from the encryption key:
//! an unkeyed hash of encrypted data would let anyone who can list the
//! bucket test whether a drive holds a known block (a confirmation attack).
//! Either way the address is computed over the bytes the restore will
//! produce, so a restore checks every chunk against its address.
//!
//! A chunk of only zero bytes has no address and no object: the manifest
//! marks it [`Entry::Zero`](super::manifest::Entry::Zero). Never-written
//! space of a RAM drive reads as zeroes, so it costs nothing remotely.

use std::fmt;

use ring::{digest, hmac};

/// Default chunk size: 256 KiB, chosen by measurement (bench/RESULTS.md,
/// 512 MiB of mixed data against Garage, 64 KiB scattered writes for the
/// incremental push). Against 1 MiB it sends 2.7x instead of 9x the
/// changed bytes after scattered 64 KiB writes, restores as fast, and
/// pushes in full about 25% slower (four times the requests), still
/// faster than rclone moving the raw image; 128 KiB sends 1.7x but its
/// full push falls to rclone's speed. A 1 TiB drive is four million
/// objects and a 132 MiB (uncompressed) manifest. Per remote:
/// `chunk_size`.
pub const DEFAULT_CHUNK_BYTES: u64 = 256 << 10;
/// Most chunks one snapshot may have: its manifest (33 bytes per chunk)
/// then stays near 550 MiB, well inside the 1 GiB a restore reads. At 256
/// KiB that is a 4 TiB drive; larger drives get larger chunks
/// ([`chunk_bytes_for`]).
pub const MAX_CHUNKS: u64 = 1 << 24;

/// The chunk size a drive of `size_bytes` is pushed with when `wanted`
/// is asked for: `wanted`, doubled until the drive fits in
/// [`MAX_CHUNKS`] chunks (up to `MAX_CHUNK_BYTES`).
pub fn chunk_bytes_for(size_bytes: u64, wanted: u64) -> u64 {
    let mut c = wanted;
    while size_bytes.div_ceil(c.max(1)) > MAX_CHUNKS && c < MAX_CHUNK_BYTES {
        c *= 2;
    }
    c
}

/// Bytes of chunks in flight at once by default (see [`in_flight`]).
pub const IN_FLIGHT_BYTES: u64 = 8 << 20;

/// How many chunks a push or restore keeps in flight by default: 8 MiB
/// worth, at least 8 and at most 64. Requests to an object store cost a
/// round trip each, so smaller chunks need more of them at once to keep
/// the same bytes moving (measured against Garage: 256 KiB chunks at 8 in
/// flight restored at half the speed of 1 MiB ones); the memory held is
/// the same 8 MiB either way.
pub fn in_flight(chunk_bytes: u64) -> usize {
    (IN_FLIGHT_BYTES / chunk_bytes.max(1)).clamp(8, 64) as usize
}

/// Smallest chunk size accepted (64 KiB, the store's own chunk).
pub const MIN_CHUNK_BYTES: u64 = 64 << 10;
/// Largest chunk size accepted (64 MiB): one chunk is held in memory per
/// upload in flight.
pub const MAX_CHUNK_BYTES: u64 = 64 << 20;

/// A chunk's content address: 32 bytes of SHA-256 or HMAC-SHA256.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address(pub [u8; 32]);

impl Address {
    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// Parses 64 hex characters (either case).
    pub fn from_hex(s: &str) -> Option<Address> {
        if s.len() != 64 || !s.is_ascii() {
            return None;
        }
        let mut a = [0u8; 32];
        for (i, out) in a.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Address(a))
    }

    /// The object name under the remote's prefix: `chunks/ab/cdef...`
    /// (the first byte as a directory, so no listing level is huge).
    pub fn object_name(&self) -> String {
        let h = self.to_hex();
        format!("chunks/{}/{}", &h[..2], &h[2..])
    }

    /// The address named by an object name made by [`Address::object_name`].
    pub fn from_object_name(name: &str) -> Option<Address> {
        let rest = name.strip_prefix("chunks/")?;
        let (dir, file) = rest.split_once('/')?;
        if dir.len() != 2 {
            return None;
        }
        Address::from_hex(&format!("{dir}{file}"))
    }
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Address({})", self.to_hex())
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// How addresses are computed: plain SHA-256, or keyed.
#[derive(Clone)]
pub enum Addresser {
    /// SHA-256 of the plaintext (unencrypted snapshots).
    Sha256,
    /// HMAC-SHA256 of the plaintext under a key derived from the
    /// encryption key (encrypted snapshots).
    Keyed(hmac::Key),
}

impl Addresser {
    /// The address of `data`.
    pub fn address(&self, data: &[u8]) -> Address {
        let mut a = [0u8; 32];
        match self {
            Addresser::Sha256 => a.copy_from_slice(digest::digest(&digest::SHA256, data).as_ref()),
            Addresser::Keyed(k) => a.copy_from_slice(hmac::sign(k, data).as_ref()),
        }
        Address(a)
    }
}

impl fmt::Debug for Addresser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.write_str(match self {
            Addresser::Sha256 => "Addresser::Sha256",
            Addresser::Keyed(_) => "Addresser::Keyed",
        })
    }
}

/// A chunk size the format rejects.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("chunk size {0} bytes is not a power of two between 64 KiB and 64 MiB")]
pub struct BadChunkSize(pub u64);

/// Checks a chunk size: a power of two from `MIN_CHUNK_BYTES` to
/// `MAX_CHUNK_BYTES`.
pub fn check_chunk_bytes(chunk_bytes: u64) -> Result<u64, BadChunkSize> {
    if !chunk_bytes.is_power_of_two() || !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&chunk_bytes)
    {
        return Err(BadChunkSize(chunk_bytes));
    }
    Ok(chunk_bytes)
}

/// The chunk grid of one drive size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Drive size in bytes.
    pub size_bytes: u64,
    /// Chunk size in bytes (a power of two, see `MIN/MAX_CHUNK_BYTES`).
    pub chunk_bytes: u64,
}

impl Geometry {
    /// The grid, checking the chunk size.
    pub fn new(size_bytes: u64, chunk_bytes: u64) -> Result<Geometry, BadChunkSize> {
        check_chunk_bytes(chunk_bytes)?;
        Ok(Geometry {
            size_bytes,
            chunk_bytes,
        })
    }

    /// Number of chunks (the last may be short).
    pub fn count(&self) -> u64 {
        self.size_bytes.div_ceil(self.chunk_bytes)
    }

    /// Byte offset of chunk `i`.
    pub fn offset(&self, i: u64) -> u64 {
        i * self.chunk_bytes
    }

    /// Length of chunk `i` in bytes.
    pub fn len(&self, i: u64) -> u64 {
        debug_assert!(i < self.count());
        self.chunk_bytes.min(self.size_bytes - self.offset(i))
    }
}

/// True when every byte of `data` is zero.
pub fn is_zero(data: &[u8]) -> bool {
    // Eight bytes at a time; the compiler vectorises the loop.
    let words = data.chunks_exact(8);
    let tail = words.remainder();
    words
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
        .all(|w| w == 0)
        && tail.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_drives_get_larger_chunks_and_in_flight_follows_the_size() {
        const TIB: u64 = 1 << 40;
        assert_eq!(chunk_bytes_for(TIB, 256 << 10), 256 << 10);
        assert_eq!(chunk_bytes_for(4 * TIB, 256 << 10), 256 << 10);
        assert_eq!(chunk_bytes_for(4 * TIB + 1, 256 << 10), 512 << 10);
        assert_eq!(chunk_bytes_for(256 * TIB, 256 << 10), 16 << 20);
        assert_eq!(chunk_bytes_for(TIB, 4 << 20), 4 << 20);
        assert_eq!(in_flight(1 << 20), 8);
        assert_eq!(in_flight(256 << 10), 32);
        assert_eq!(in_flight(64 << 10), 64);
        assert_eq!(in_flight(64 << 20), 8);
    }

    #[test]
    fn geometry_cuts_the_last_chunk_short() {
        let g = Geometry::new(3 * MIN_CHUNK_BYTES + 5, MIN_CHUNK_BYTES).unwrap();
        assert_eq!(g.count(), 4);
        assert_eq!(g.len(3), 5);
        assert_eq!(g.offset(3), 3 * MIN_CHUNK_BYTES);
        assert_eq!(Geometry::new(0, MIN_CHUNK_BYTES).unwrap().count(), 0);
    }

    #[test]
    fn geometry_rejects_odd_chunk_sizes() {
        for bad in [0, 1000, MIN_CHUNK_BYTES / 2, MAX_CHUNK_BYTES * 2, 3 << 20] {
            assert_eq!(Geometry::new(1 << 30, bad), Err(BadChunkSize(bad)));
        }
        assert!(Geometry::new(1 << 30, DEFAULT_CHUNK_BYTES).is_ok());
    }

    #[test]
    fn address_names_round_trip() {
        let a = Addresser::Sha256.address(b"hello");
        assert_eq!(
            a.to_hex(),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        let name = a.object_name();
        assert_eq!(name, format!("chunks/2c/{}", &a.to_hex()[2..]));
        assert_eq!(Address::from_object_name(&name), Some(a));
        assert_eq!(Address::from_object_name("chunks/2c"), None);
        assert_eq!(Address::from_object_name("chunks/2cf/24"), None);
        assert_eq!(Address::from_hex("zz"), None);
        assert_eq!(Address::from_hex(&"g".repeat(64)), None);
    }

    #[test]
    fn keyed_addresses_differ_from_plain_and_by_key() {
        let k1 = Addresser::Keyed(hmac::Key::new(hmac::HMAC_SHA256, &[1; 32]));
        let k2 = Addresser::Keyed(hmac::Key::new(hmac::HMAC_SHA256, &[2; 32]));
        let plain = Addresser::Sha256.address(b"x");
        assert_ne!(k1.address(b"x"), plain);
        assert_ne!(k1.address(b"x"), k2.address(b"x"));
        assert_eq!(k1.address(b"x"), k1.address(b"x"));
        assert_eq!(format!("{k1:?}"), "Addresser::Keyed");
    }

    #[test]
    fn zero_detection() {
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 4097]));
        for at in [0, 7, 8, 4095, 4096] {
            let mut v = vec![0u8; 4097];
            v[at] = 1;
            assert!(!is_zero(&v), "byte {at}");
        }
    }
}
