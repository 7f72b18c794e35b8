//! Encryption at rest: AES-256-GCM (ring) per 4 KiB page.
//!
//! - Each page is sealed on its own with a fresh random 96-bit nonce from
//!   the OS generator; nonce and tag live in the page's `pages` entry (and in
//!   journal records). Random nonces stay safe for 2^32 seals per key (NIST
//!   SP 800-38D), i.e. 16 TiB of page writes: rotate the key before that.
//! - The associated data binds a ciphertext to its drive and its page:
//!   `"ramd-page" | uuid | page index (u64 LE)`, so pages cannot be moved
//!   between places or drives without the tag failing. (A stale ciphertext
//!   of the same page can be replayed by someone who can write the disk;
//!   GCM per page cannot prevent that.)
//! - The key comes from a key file: 32 raw bytes, or 64 hex digits (an
//!   optional trailing newline is allowed). `(umask 077; head -c 32 /dev/urandom > key)`
//!   makes one. Key bytes are never logged or shown: `Debug` prints
//!   `Key(..)`.
//! - Wrong key: meta holds a *key check* (16 zero bytes sealed under the key
//!   with the drive's uuid as associated data); opening it with another key
//!   fails, and the drive refuses to load before reading any page.

use std::path::Path;

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use ring::rand::{SecureRandom, SystemRandom};

use super::format::KEY_CHECK_BYTES;

/// Bytes of a key.
pub const KEY_BYTES: usize = 32;

/// Why a key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    /// The key file could not be read.
    #[error("cannot read key file {path}: {source}")]
    KeyFile {
        path: String,
        source: std::io::Error,
    },
    /// The key file holds neither 32 raw bytes nor 64 hex digits. (Its
    /// size is not said: the path may come from a caller over TCP, and
    /// the file may be any file.)
    #[error("key file {path} must hold 32 raw bytes or 64 hex digits")]
    KeyFormat { path: String },
    /// Group or others may read the key file.
    #[error(transparent)]
    NotPrivate(#[from] crate::paths::NotPrivate),
    /// The OS random generator failed.
    #[error("the system random number generator failed")]
    Random,
    /// A ciphertext did not authenticate (wrong key or tampered data).
    #[error("authentication failed")]
    Auth,
}

/// An AES-256 key. Its bytes are never printed.
pub struct Key {
    bytes: [u8; KEY_BYTES],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        // Best effort: do not leave the key in freed memory.
        for b in self.bytes.iter_mut() {
            // SAFETY: a volatile write to a byte we own; prevents the
            // compiler from eliding the wipe of memory about to be freed.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl Key {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Key {
        Key { bytes }
    }

    /// A fresh random key.
    pub fn generate() -> Result<Key, CryptoError> {
        let mut bytes = [0u8; KEY_BYTES];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| CryptoError::Random)?;
        Ok(Key { bytes })
    }

    /// Reads a key file: 32 raw bytes, or 64 hex digits and an optional
    /// trailing newline; readable by its owner only.
    pub fn from_file(path: &Path) -> Result<Key, CryptoError> {
        let shown = path.display().to_string();
        let read_err = |source| CryptoError::KeyFile {
            path: shown.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        crate::paths::check_secret_file("key file", path, &meta)?;
        let raw = std::fs::read(path).map_err(read_err)?;
        Key::parse(&raw).ok_or(CryptoError::KeyFormat { path: shown })
    }

    /// Parses key file contents.
    pub fn parse(raw: &[u8]) -> Option<Key> {
        if raw.len() == KEY_BYTES {
            return Some(Key::from_bytes(raw.try_into().ok()?));
        }
        let text = raw.strip_suffix(b"\n").unwrap_or(raw);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.len() != 2 * KEY_BYTES {
            return None;
        }
        let mut bytes = [0u8; KEY_BYTES];
        for (i, pair) in text.chunks(2).enumerate() {
            let hex = std::str::from_utf8(pair).ok()?;
            bytes[i] = u8::from_str_radix(hex, 16).ok()?;
        }
        Some(Key { bytes })
    }
}

/// Seals and opens pages of one drive.
pub struct Cipher {
    key: LessSafeKey,
    rng: SystemRandom,
    /// The drive's uuid, bound into every page's associated data.
    uuid: [u8; 16],
}

fn page_aad(uuid: &[u8; 16], page: u64) -> [u8; 33] {
    let mut a = [0u8; 33];
    a[..9].copy_from_slice(b"ramd-page");
    a[9..25].copy_from_slice(uuid);
    a[25..33].copy_from_slice(&page.to_le_bytes());
    a
}

fn check_aad(uuid: &[u8; 16]) -> [u8; 25] {
    let mut a = [0u8; 25];
    a[..9].copy_from_slice(b"ramd-keyc");
    a[9..25].copy_from_slice(uuid);
    a
}

impl Cipher {
    /// A cipher for the drive `uuid` under `key`.
    pub fn new(key: &Key, uuid: [u8; 16]) -> Cipher {
        let unbound = UnboundKey::new(&AES_256_GCM, &key.bytes).expect("32-byte AES-256 key");
        Cipher {
            key: LessSafeKey::new(unbound),
            rng: SystemRandom::new(),
            uuid,
        }
    }

    fn nonce(&self) -> Result<[u8; 12], CryptoError> {
        let mut n = [0u8; 12];
        self.rng.fill(&mut n).map_err(|_| CryptoError::Random)?;
        Ok(n)
    }

    /// Encrypts `buf` (one page) in place; returns its nonce and tag.
    pub fn seal_page(
        &self,
        page: u64,
        buf: &mut [u8],
    ) -> Result<([u8; 12], [u8; 16]), CryptoError> {
        let nonce = self.nonce()?;
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(page_aad(&self.uuid, page)),
                buf,
            )
            .map_err(|_| CryptoError::Random)?;
        Ok((nonce, tag.as_ref().try_into().expect("16-byte tag")))
    }

    /// Decrypts `buf` (one page) in place; fails when the key is wrong or
    /// the ciphertext, nonce, tag or page index were changed.
    pub fn open_page(
        &self,
        page: u64,
        nonce: &[u8; 12],
        tag: &[u8; 16],
        buf: &mut [u8],
    ) -> Result<(), CryptoError> {
        self.key
            .open_in_place_separate_tag(
                Nonce::assume_unique_for_key(*nonce),
                Aad::from(page_aad(&self.uuid, page)),
                Tag::from(*tag),
                buf,
                0..,
            )
            .map(drop)
            .map_err(|_| CryptoError::Auth)
    }

    /// A fresh key check for meta.
    pub fn key_check(&self) -> Result<[u8; KEY_CHECK_BYTES], CryptoError> {
        let nonce = self.nonce()?;
        let mut body = [0u8; 16];
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(check_aad(&self.uuid)),
                &mut body,
            )
            .map_err(|_| CryptoError::Random)?;
        let mut out = [0u8; KEY_CHECK_BYTES];
        out[..12].copy_from_slice(&nonce);
        out[12..28].copy_from_slice(&body);
        out[28..44].copy_from_slice(tag.as_ref());
        Ok(out)
    }

    /// True when `check` was made under this key for this drive.
    pub fn verify_key_check(&self, check: &[u8; KEY_CHECK_BYTES]) -> bool {
        let nonce: [u8; 12] = check[..12].try_into().expect("12 bytes");
        let tag: [u8; 16] = check[28..44].try_into().expect("16 bytes");
        let mut body: [u8; 16] = check[12..28].try_into().expect("16 bytes");
        self.key
            .open_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(check_aad(&self.uuid)),
                Tag::from(tag),
                &mut body,
                0..,
            )
            .is_ok()
            && body == [0u8; 16]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_trip_and_refuse_tampering() {
        let key = Key::generate().unwrap();
        let c = Cipher::new(&key, [1; 16]);
        let plain: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let mut buf = plain.clone();
        let (nonce, tag) = c.seal_page(5, &mut buf).unwrap();
        assert_ne!(buf, plain);
        let mut again = plain.clone();
        let (nonce2, _) = c.seal_page(5, &mut again).unwrap();
        assert_ne!(nonce, nonce2, "nonces must be unique");
        let mut open = buf.clone();
        c.open_page(5, &nonce, &tag, &mut open).unwrap();
        assert_eq!(open, plain);
        // Another page index, a flipped ciphertext bit, another key: refused.
        let mut t = buf.clone();
        assert!(c.open_page(6, &nonce, &tag, &mut t).is_err());
        let mut t = buf.clone();
        t[100] ^= 1;
        assert!(c.open_page(5, &nonce, &tag, &mut t).is_err());
        let other = Cipher::new(&Key::generate().unwrap(), [1; 16]);
        let mut t = buf.clone();
        assert!(other.open_page(5, &nonce, &tag, &mut t).is_err());
    }

    #[test]
    fn key_check_tells_keys_apart() {
        let key = Key::generate().unwrap();
        let c = Cipher::new(&key, [2; 16]);
        let check = c.key_check().unwrap();
        assert!(c.verify_key_check(&check));
        assert!(!Cipher::new(&Key::generate().unwrap(), [2; 16]).verify_key_check(&check));
        assert!(!Cipher::new(&key, [3; 16]).verify_key_check(&check));
    }

    #[test]
    fn key_files_parse_raw_and_hex_and_never_print() {
        let raw = [0xABu8; 32];
        assert!(Key::parse(&raw).is_some());
        let hex = "ab".repeat(32) + "\n";
        let k = Key::parse(hex.as_bytes()).unwrap();
        assert_eq!(k.bytes, raw);
        assert!(Key::parse(b"short").is_none());
        assert!(Key::parse("zz".repeat(32).as_bytes()).is_none());
        assert_eq!(format!("{k:?}"), "Key(..)");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, b"1234").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Key::from_file(&p).unwrap_err();
        assert!(matches!(e, CryptoError::NotPrivate(_)), "{e}");
        let e = e.to_string();
        assert!(e.contains(&format!("`chmod 600 {}`", p.display())), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = Key::from_file(&p).unwrap_err().to_string();
        assert!(e.contains("32 raw bytes or 64 hex digits"), "{e}");
        assert!(!e.contains("4 bytes"), "never the size of the file: {e}");
    }
}
