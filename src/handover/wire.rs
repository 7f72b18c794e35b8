//! Hand-over records: what the serving process sends its keeper (and gets
//! back after a restart), one record per `SOCK_SEQPACKET` message with its
//! descriptors attached (`SCM_RIGHTS`). Pure encoding and decoding.
//!
//! ```text
//!  offset 0      6         8      9         11         15          15+k        19+k
//!         ┌──────┬─────────┬──────┬─────────┬──────────┬───────────┬───────────┬────────┐
//!         │RAMDHO│ version │ kind │ key len │ fd count │ key UTF-8 │ blob len  │ blob   │
//!         │      │ u16 LE  │  u8  │ u16 LE  │ u32 LE   │ k bytes   │ u32 LE    │ opaque │
//!         └──────┴─────────┴──────┴─────────┴──────────┴───────────┴───────────┴────────┘
//! ```
//!
//! - `kind`: [`Kind`]. `key` names the entry (`drive/NAME`,
//!   `nbd-unix:/run/ramd/nbd.sock`, `nbd-tcp:127.0.0.1:10809`, ...);
//!   `PUT` replaces the key's entry, `FORGET` drops it.
//! - `fd count`: how many descriptors the message carries, so a receiver
//!   that got fewer (its `SCM_RIGHTS` buffer too small, `MSG_CTRUNC`)
//!   refuses the record instead of pairing the wrong files with a key.
//! - `blob`: the sender's metadata, opaque to the keeper (a drive's is
//!   JSON with its own version).
//!
//! Invariants: a record decodes only if it is exactly as long as its
//! lengths say, its magic and version are ours, its kind is known and its
//! key is UTF-8 of at most [`MAX_KEY_BYTES`]; blobs are at most
//! [`MAX_BLOB_BYTES`] and descriptors at most [`MAX_FDS`] per record (the
//! kernel's `SCM_MAX_FD` is 253). A record of another version is refused
//! with the version found ([`WireError::Version`]): a process never
//! guesses at a layout it does not know.

/// The first bytes of every record.
pub const MAGIC: &[u8; 6] = b"RAMDHO";
/// The layout this build writes and reads.
pub const VERSION: u16 = 1;
/// Longest key.
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest blob (a drive's metadata is a few hundred bytes).
pub const MAX_BLOB_BYTES: usize = 64 * 1024;
/// Most descriptors one record carries.
pub const MAX_FDS: u32 = 200;
/// Bytes before the key.
const HEAD_BYTES: usize = 15;

/// What a record asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Keep these descriptors and blob under the key (replacing any).
    Put = 1,
    /// Drop the key's entry (a deleted drive).
    Forget = 2,
    /// The serving process serves (sent once, after start-up).
    Ready = 3,
    /// The end of a hand-back: every kept entry has been sent.
    End = 4,
    /// The serving process is about to exit for an upgrade: start the
    /// binary at the path in the blob next (`ramd upgrade`).
    Upgrade = 5,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Put,
            2 => Kind::Forget,
            3 => Kind::Ready,
            4 => Kind::End,
            5 => Kind::Upgrade,
            _ => return None,
        })
    }
}

/// One record, without its descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    pub key: String,
    pub blob: Vec<u8>,
    /// Descriptors sent with it.
    pub fd_count: u32,
}

/// Why bytes are not a record (or a record cannot be written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than its lengths say.
    #[error("a hand-over record of {len} bytes is cut short")]
    Truncated { len: usize },
    /// Bytes after the blob.
    #[error("a hand-over record has {extra} bytes after its end")]
    Trailing { extra: usize },
    /// Not a hand-over record at all.
    #[error("not a ramd hand-over record (bad magic)")]
    Magic,
    /// A layout this build does not know.
    #[error(
        "hand-over format version {found}, this ramd reads version {VERSION}: refusing to guess"
    )]
    Version { found: u16 },
    /// An unknown kind.
    #[error("unknown hand-over record kind {0}")]
    Kind(u8),
    /// A key that is not UTF-8 or too long.
    #[error("a hand-over key that is not UTF-8 of at most {MAX_KEY_BYTES} bytes")]
    Key,
    /// A blob over the limit.
    #[error("a hand-over blob of {len} bytes, more than {MAX_BLOB_BYTES}")]
    Blob { len: usize },
    /// Too many descriptors for one record.
    #[error("{count} descriptors in one hand-over record, more than {MAX_FDS}")]
    Fds { count: u32 },
}

impl Record {
    /// The record's bytes.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        if self.key.len() > MAX_KEY_BYTES {
            return Err(WireError::Key);
        }
        if self.blob.len() > MAX_BLOB_BYTES {
            return Err(WireError::Blob {
                len: self.blob.len(),
            });
        }
        if self.fd_count > MAX_FDS {
            return Err(WireError::Fds {
                count: self.fd_count,
            });
        }
        let mut out = Vec::with_capacity(HEAD_BYTES + self.key.len() + 4 + self.blob.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&(self.key.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.fd_count.to_le_bytes());
        out.extend_from_slice(self.key.as_bytes());
        out.extend_from_slice(&(self.blob.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.blob);
        Ok(out)
    }

    /// The record in `bytes` (one whole message; see the module docs for
    /// what is refused).
    pub fn decode(bytes: &[u8]) -> Result<Record, WireError> {
        let short = WireError::Truncated { len: bytes.len() };
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(if bytes.len() < MAGIC.len() {
                short
            } else {
                WireError::Magic
            });
        }
        let head = bytes.get(..HEAD_BYTES).ok_or(short.clone())?;
        let version = u16::from_le_bytes([head[6], head[7]]);
        if version != VERSION {
            return Err(WireError::Version { found: version });
        }
        let kind = Kind::from_u8(head[8]).ok_or(WireError::Kind(head[8]))?;
        let key_len = u16::from_le_bytes([head[9], head[10]]) as usize;
        let fd_count = u32::from_le_bytes([head[11], head[12], head[13], head[14]]);
        if key_len > MAX_KEY_BYTES {
            return Err(WireError::Key);
        }
        if fd_count > MAX_FDS {
            return Err(WireError::Fds { count: fd_count });
        }
        let key_end = HEAD_BYTES + key_len;
        let key = bytes.get(HEAD_BYTES..key_end).ok_or(short.clone())?;
        let key = std::str::from_utf8(key).map_err(|_| WireError::Key)?;
        let len = bytes.get(key_end..key_end + 4).ok_or(short.clone())?;
        let blob_len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if blob_len > MAX_BLOB_BYTES {
            return Err(WireError::Blob { len: blob_len });
        }
        let blob_end = key_end + 4 + blob_len;
        let blob = bytes.get(key_end + 4..blob_end).ok_or(short)?;
        if bytes.len() > blob_end {
            return Err(WireError::Trailing {
                extra: bytes.len() - blob_end,
            });
        }
        Ok(Record {
            kind,
            key: key.to_owned(),
            blob: blob.to_vec(),
            fd_count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put() -> Record {
        Record {
            kind: Kind::Put,
            key: "drive/db".into(),
            blob: br#"{"version":1,"name":"db","size_bytes":4096}"#.to_vec(),
            fd_count: 1,
        }
    }

    #[test]
    fn records_round_trip() {
        for r in [
            put(),
            Record {
                kind: Kind::End,
                key: String::new(),
                blob: vec![],
                fd_count: 0,
            },
            Record {
                kind: Kind::Put,
                key: "k".repeat(MAX_KEY_BYTES),
                blob: vec![7; MAX_BLOB_BYTES],
                fd_count: MAX_FDS,
            },
        ] {
            assert_eq!(Record::decode(&r.encode().unwrap()).unwrap(), r);
        }
    }

    /// Every prefix of a record is cut short, never misread; a byte more
    /// is trailing garbage.
    #[test]
    fn cut_and_padded_records_are_refused() {
        let bytes = put().encode().unwrap();
        for n in 0..bytes.len() {
            let e = Record::decode(&bytes[..n]).unwrap_err();
            assert_eq!(e, WireError::Truncated { len: n }, "prefix of {n}");
        }
        let mut more = bytes.clone();
        more.push(0);
        assert_eq!(Record::decode(&more), Err(WireError::Trailing { extra: 1 }));
    }

    /// Another version is refused with the version found; so are a bad
    /// magic, an unknown kind, a key that is not UTF-8 and lengths over
    /// the limits, whether encoding or decoding.
    #[test]
    fn foreign_and_oversized_records_are_refused() {
        let bytes = put().encode().unwrap();
        let mut v2 = bytes.clone();
        v2[6] = 2;
        assert_eq!(Record::decode(&v2), Err(WireError::Version { found: 2 }));
        let mut magic = bytes.clone();
        magic[0] = b'X';
        assert_eq!(Record::decode(&magic), Err(WireError::Magic));
        let mut kind = bytes.clone();
        kind[8] = 9;
        assert_eq!(Record::decode(&kind), Err(WireError::Kind(9)));
        let mut key = bytes.clone();
        key[HEAD_BYTES] = 0xff;
        assert_eq!(Record::decode(&key), Err(WireError::Key));
        let mut fds = bytes.clone();
        fds[11..15].copy_from_slice(&(MAX_FDS + 1).to_le_bytes());
        assert_eq!(
            Record::decode(&fds),
            Err(WireError::Fds { count: MAX_FDS + 1 })
        );
        let mut blob = bytes;
        let at = HEAD_BYTES + "drive/db".len();
        blob[at..at + 4].copy_from_slice(&(MAX_BLOB_BYTES as u32 + 1).to_le_bytes());
        assert!(matches!(Record::decode(&blob), Err(WireError::Blob { .. })));
        let big = Record {
            blob: vec![0; MAX_BLOB_BYTES + 1],
            ..put()
        };
        assert!(matches!(big.encode(), Err(WireError::Blob { .. })));
        let long = Record {
            key: "k".repeat(MAX_KEY_BYTES + 1),
            ..put()
        };
        assert_eq!(long.encode(), Err(WireError::Key));
    }
}
