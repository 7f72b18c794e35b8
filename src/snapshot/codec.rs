//! What an object's bytes are: zstd compression and, with a key, AEAD
//! encryption (pure: no I/O besides reading a key file).
//!
//! Every object the engine writes (chunks and manifests alike) is one
//! envelope:
//!
//! ```text
//!  0      4      5           13              29        41
//!  ┌──────┬──────┬───────────┬───────────────┬─────────┬──────────────────┐
//!  │magic │flags │ plain_len │ key_id        │ nonce   │ body             │
//!  │"RSC1"│ u8   │ u64 LE    │ 16 B          │ 12 B    │ zstd? (sealed?)  │
//!  └──────┴──────┴───────────┴───────────────┴─────────┴──────────────────┘
//!                             └── only when flags & ENCRYPTED ──┘
//! ```
//!
//! - `flags`: bit 0 = body is zstd-compressed (left raw when compression
//!   does not save anything, e.g. random or already-compressed data),
//!   bit 1 = encrypted. Other bits set: refused (a newer format).
//! - `plain_len`: length of the plaintext; decompression is bounded by it
//!   (and by the caller's limit), so a hostile object cannot make us
//!   allocate more than the chunk size.
//! - Encrypted bodies are ChaCha20-Poly1305 (ring) with a random 96-bit
//!   nonce per object and the header plus the object's name as associated
//!   data: an object copied to another name, or with a changed header,
//!   fails its tag. Random nonces are safe here because a key seals at
//!   most one object per distinct chunk (chunks are deduplicated), far
//!   below the 2^32 messages where 96-bit random nonces start to risk a
//!   collision.
//! - `key_id`: 16 bytes derived from the key (HKDF, its own label), so a
//!   wrong key is reported as such instead of as a corrupt object; it
//!   reveals nothing about the key beyond "same key or not".
//!
//! From the one 32-byte snapshot key, HKDF-SHA256 derives three
//! independent keys: the AEAD key, the HMAC key for chunk addresses (see
//! `chunk.rs`) and the key id. The key is read from a file that must be
//! readable by its owner only (mode 0600 or stricter), holding 32 raw bytes
//! or 64 hex characters.

use std::fmt;
use std::path::{Path, PathBuf};

use ring::aead::{self, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use ring::{hkdf, hmac};

use super::chunk::Addresser;

const MAGIC: &[u8; 4] = b"RSC1";
const FLAG_ZSTD: u8 = 1;
const FLAG_ENCRYPTED: u8 = 2;
const PLAIN_HEADER_BYTES: usize = 13;
const KEY_ID_BYTES: usize = 16;
const SEALED_HEADER_BYTES: usize = PLAIN_HEADER_BYTES + KEY_ID_BYTES + NONCE_LEN;
/// zstd level: 3 is zstd's default, ~300 MB/s per core, most of the ratio.
const ZSTD_LEVEL: i32 = 3;

/// Why an object's bytes were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// Shorter than its header.
    #[error("truncated ({0} bytes)")]
    Truncated(usize),
    /// Not an object this engine wrote.
    #[error("not a ramd snapshot object (bad magic)")]
    BadMagic,
    /// Flags this version does not know.
    #[error("unknown flags {0:#04x} (written by a newer ramd?)")]
    UnknownFlags(u8),
    /// Encrypted, and no key was given.
    #[error("encrypted: give the snapshot key (--key-file)")]
    KeyRequired,
    /// A key was given but the object is not encrypted.
    #[error("not encrypted, but a key was given: refusing an object that may have replaced an encrypted one")]
    NotEncrypted,
    /// Encrypted under another key.
    #[error("encrypted with a different key than the one given")]
    WrongKey,
    /// The AEAD tag does not match: the object was altered.
    #[error("authentication failed: the object was altered or is corrupt")]
    TagMismatch,
    /// Larger than the caller allows.
    #[error("claims {len} bytes of data, more than the {limit} allowed")]
    TooLarge {
        /// Claimed plaintext length.
        len: u64,
        /// The caller's limit.
        limit: u64,
    },
    /// zstd refused the body, or it did not decompress to `plain_len`.
    #[error("does not decompress (corrupt)")]
    Decompress,
}

/// Why a key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read.
    #[error("cannot read key file {path}: {source}")]
    Read {
        /// The key file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Group or others may read it (the message names the `chmod` to
    /// run, never the mode: it may reach a caller over TCP).
    #[error(transparent)]
    Permissions(#[from] crate::paths::NotPrivate),
    /// Neither 32 bytes nor 64 hex characters.
    #[error("key file {path} must hold 32 raw bytes or 64 hex characters (a new one: `(umask 077; set -C; head -c 32 /dev/urandom > NEW_FILE)`)")]
    Format {
        /// The key file.
        path: PathBuf,
    },
}

/// The keys derived from one snapshot key. Debug never shows them.
pub struct Keys {
    aead: LessSafeKey,
    hmac: hmac::Key,
    key_id: [u8; KEY_ID_BYTES],
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Keys(..)")
    }
}

struct Len(usize);
impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn derive(prk: &hkdf::Prk, label: &[u8], out: &mut [u8]) {
    let info = [label];
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .expect("HKDF output of at most 32 bytes");
}

impl Keys {
    /// Derives the keys from a 32-byte snapshot key.
    pub fn from_secret(secret: &[u8; 32]) -> Keys {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"ramd snapshot v1").extract(secret);
        let mut k = [0u8; 32];
        derive(&prk, b"chunk aead", &mut k);
        let aead = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &k).expect("32-byte key"));
        derive(&prk, b"chunk address", &mut k);
        let hmac = hmac::Key::new(hmac::HMAC_SHA256, &k);
        let mut key_id = [0u8; KEY_ID_BYTES];
        derive(&prk, b"key id", &mut key_id);
        Keys { aead, hmac, key_id }
    }

    /// Loads a key file (owner-only permissions; 32 bytes or 64 hex).
    pub fn load(path: &Path) -> Result<Keys, KeyError> {
        let read_err = |source| KeyError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        crate::paths::check_secret_file("key file", path, &meta)?;
        let bytes = std::fs::read(path).map_err(read_err)?;
        let secret = parse_secret(&bytes).ok_or_else(|| KeyError::Format {
            path: path.to_owned(),
        })?;
        Ok(Keys::from_secret(&secret))
    }

    /// The address function these keys imply.
    pub fn addresser(&self) -> Addresser {
        Addresser::Keyed(self.hmac.clone())
    }
}

/// 32 raw bytes, or 64 hex characters with optional surrounding whitespace.
fn parse_secret(bytes: &[u8]) -> Option<[u8; 32]> {
    if bytes.len() == 32 {
        return bytes.try_into().ok();
    }
    let text = std::str::from_utf8(bytes).ok()?.trim();
    super::chunk::Address::from_hex(text).map(|a| a.0)
}

/// The address function for an optional key.
pub fn addresser(keys: Option<&Keys>) -> Addresser {
    keys.map_or(Addresser::Sha256, Keys::addresser)
}

fn aad(header: &[u8], name: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(header.len() + name.len());
    v.extend_from_slice(header);
    v.extend_from_slice(name.as_bytes());
    v
}

/// Encodes `plain` as the object `name`: compressed when that helps,
/// sealed when `keys` is given.
pub fn encode(name: &str, plain: &[u8], keys: Option<&Keys>) -> Vec<u8> {
    let compressed = zstd::bulk::compress(plain, ZSTD_LEVEL).ok();
    let (mut flags, body) = match compressed {
        Some(c) if c.len() < plain.len() => (FLAG_ZSTD, c),
        _ => (0, plain.to_vec()),
    };
    let mut out = Vec::with_capacity(SEALED_HEADER_BYTES + body.len() + 16);
    out.extend_from_slice(MAGIC);
    if keys.is_some() {
        flags |= FLAG_ENCRYPTED;
    }
    out.push(flags);
    out.extend_from_slice(&(plain.len() as u64).to_le_bytes());
    let Some(keys) = keys else {
        out.extend_from_slice(&body);
        return out;
    };
    out.extend_from_slice(&keys.key_id);
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .expect("the system random generator works");
    out.extend_from_slice(&nonce);
    let aad = aad(&out[..SEALED_HEADER_BYTES], name);
    let mut sealed = body;
    keys.aead
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(&aad),
            &mut sealed,
        )
        .expect("ChaCha20-Poly1305 seals any length we produce");
    out.extend_from_slice(&sealed);
    out
}

/// Decodes the object `name`: checks header, key and tag, decompresses.
/// `limit_bytes` bounds the plaintext.
pub fn decode(
    name: &str,
    bytes: &[u8],
    keys: Option<&Keys>,
    limit_bytes: u64,
) -> Result<Vec<u8>, CodecError> {
    if bytes.len() < PLAIN_HEADER_BYTES {
        return Err(CodecError::Truncated(bytes.len()));
    }
    if &bytes[..4] != MAGIC {
        return Err(CodecError::BadMagic);
    }
    let flags = bytes[4];
    if flags & !(FLAG_ZSTD | FLAG_ENCRYPTED) != 0 {
        return Err(CodecError::UnknownFlags(flags));
    }
    let len = u64::from_le_bytes(bytes[5..13].try_into().expect("8 bytes"));
    if len > limit_bytes {
        return Err(CodecError::TooLarge {
            len,
            limit: limit_bytes,
        });
    }
    let body = match (flags & FLAG_ENCRYPTED != 0, keys) {
        (false, None) => bytes[PLAIN_HEADER_BYTES..].to_vec(),
        (false, Some(_)) => return Err(CodecError::NotEncrypted),
        (true, None) => return Err(CodecError::KeyRequired),
        (true, Some(keys)) => open(name, bytes, keys)?,
    };
    let plain = if flags & FLAG_ZSTD != 0 {
        zstd::bulk::decompress(&body, len as usize).map_err(|_| CodecError::Decompress)?
    } else {
        body
    };
    if plain.len() as u64 != len {
        return Err(CodecError::Decompress);
    }
    Ok(plain)
}

fn open(name: &str, bytes: &[u8], keys: &Keys) -> Result<Vec<u8>, CodecError> {
    if bytes.len() < SEALED_HEADER_BYTES + CHACHA20_POLY1305.tag_len() {
        return Err(CodecError::Truncated(bytes.len()));
    }
    if bytes[PLAIN_HEADER_BYTES..PLAIN_HEADER_BYTES + KEY_ID_BYTES] != keys.key_id {
        return Err(CodecError::WrongKey);
    }
    let nonce: [u8; NONCE_LEN] = bytes[PLAIN_HEADER_BYTES + KEY_ID_BYTES..SEALED_HEADER_BYTES]
        .try_into()
        .expect("12 bytes");
    let aad = aad(&bytes[..SEALED_HEADER_BYTES], name);
    let mut body = bytes[SEALED_HEADER_BYTES..].to_vec();
    let n = keys
        .aead
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(&aad),
            &mut body,
        )
        .map_err(|_| CodecError::TagMismatch)?
        .len();
    body.truncate(n);
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn keys(b: u8) -> Keys {
        Keys::from_secret(&[b; 32])
    }

    #[test]
    fn round_trips_plain_and_sealed_compressible_or_not() {
        let random: Vec<u8> = (0..100_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for data in [vec![], vec![7u8; 70_000], random] {
            for k in [None, Some(keys(1))] {
                let enc = encode("chunks/ab/cd", &data, k.as_ref());
                assert_eq!(
                    decode("chunks/ab/cd", &enc, k.as_ref(), 1 << 20).unwrap(),
                    data
                );
            }
        }
        // Compressible data is stored smaller.
        assert!(encode("x", &[7u8; 70_000], None).len() < 1000);
    }

    #[test]
    fn refuses_wrong_key_missing_key_renamed_and_altered_objects() {
        let k = keys(1);
        let enc = encode("chunks/ab/cd", b"secret data", Some(&k));
        assert_eq!(
            decode("chunks/ab/cd", &enc, Some(&keys(2)), 100),
            Err(CodecError::WrongKey)
        );
        assert_eq!(
            decode("chunks/ab/cd", &enc, None, 100),
            Err(CodecError::KeyRequired)
        );
        assert_eq!(
            decode("chunks/ab/ce", &enc, Some(&k), 100),
            Err(CodecError::TagMismatch)
        );
        for i in PLAIN_HEADER_BYTES + KEY_ID_BYTES..enc.len() {
            let mut bad = enc.clone();
            bad[i] ^= 0x40;
            assert_eq!(
                decode("chunks/ab/cd", &bad, Some(&k), 100),
                Err(CodecError::TagMismatch),
                "byte {i}"
            );
        }
        let plain = encode("chunks/ab/cd", b"data", None);
        assert_eq!(
            decode("chunks/ab/cd", &plain, Some(&k), 100),
            Err(CodecError::NotEncrypted)
        );
    }

    #[test]
    fn refuses_malformed_headers() {
        let enc = encode("n", &[5u8; 1000], None);
        assert_eq!(
            decode("n", &enc[..3], None, 1 << 20),
            Err(CodecError::Truncated(3))
        );
        let mut bad = enc.clone();
        bad[0] = b'X';
        assert_eq!(decode("n", &bad, None, 1 << 20), Err(CodecError::BadMagic));
        let mut bad = enc.clone();
        bad[4] |= 0x80;
        assert_eq!(
            decode("n", &bad, None, 1 << 20),
            Err(CodecError::UnknownFlags(0x81))
        );
        assert_eq!(
            decode("n", &enc, None, 999),
            Err(CodecError::TooLarge {
                len: 1000,
                limit: 999
            })
        );
        let mut bad = enc.clone();
        bad[5] = 0xe7; // plain_len 999: zstd output does not match
        assert_eq!(
            decode("n", &bad, None, 1 << 20),
            Err(CodecError::Decompress)
        );
        let mut bad = enc.clone();
        let n = bad.len();
        bad[n - 3] ^= 0xff;
        assert!(decode("n", &bad, None, 1 << 20).is_err());
    }

    #[test]
    fn key_files_need_owner_only_mode_and_a_valid_format() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, "ab".repeat(32) + "\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Keys::load(&p).unwrap_err();
        assert!(matches!(e, KeyError::Permissions(_)), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("`chmod 600 {}`", p.display())),
            "{msg}"
        );
        assert!(!msg.contains("644"), "no mode in messages: {msg}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let from_hex = Keys::load(&p).unwrap();
        assert_eq!(from_hex.key_id, keys(0xab).key_id);
        std::fs::write(&p, [0xab; 32]).unwrap();
        assert_eq!(Keys::load(&p).unwrap().key_id, from_hex.key_id);
        std::fs::write(&p, "short").unwrap();
        assert!(matches!(Keys::load(&p), Err(KeyError::Format { .. })));
        assert!(matches!(
            Keys::load(&dir.path().join("none")),
            Err(KeyError::Read { .. })
        ));
        assert_eq!(format!("{from_hex:?}"), "Keys(..)");
    }
}
