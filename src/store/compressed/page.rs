//! One 4 KiB page on its own: is it same-filled, what are its compressed
//! bytes, and back. Pure (no locks, no placement); `shard.rs` decides where
//! the bytes go.
//!
//! A page is *same-filled* when every aligned 8-byte word of it is equal
//! (zram's rule, which catches zero pages and repeated patterns such as
//! `0xffff..` or a 32-bit fill): it is kept as that word, no bytes stored.
//! Otherwise it is compressed; when the result is larger than
//! [`HUGE_MIN_BYTES`] (4032 bytes, 64 short of a page) the page is kept raw
//! instead: the pool's classes are 16 bytes apart and dense (`pool.rs`),
//! so every byte a page compresses by is memory saved, down to the last
//! class, but a page that saves fewer than 64 bytes (1.5%) is not worth a
//! decompression on every read. zram's threshold is ~3.6 KiB because
//! zsmalloc stores larger objects one per page anyway; measured on the
//! 1 GiB corpus of bench/compressed-corpus.sh, pages compressing to
//! 3.6-4.0 KiB (lz4: ~16000 of 262144) hold 3 MiB of savings.
//!
//! zstd runs with compression contexts kept per thread and level and one
//! decompression context per thread (creating one per call costs more than
//! compressing a page; the profile of 4 KiB writes then shows zstd's own
//! block work: match finding, literal histograms and Huffman tables, which
//! a 4 KiB block rebuilds every time whatever the context), without the
//! frame's content size, checksum or dictionary id: the page size is
//! fixed and the store verifies the decompressed length.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

/// Bytes per page: the unit a client sees and the unit of compression.
pub const PAGE_BYTES: usize = 4096;
/// Compressed pages larger than this are stored raw ("huge" pages).
pub const HUGE_MIN_BYTES: usize = PAGE_BYTES - 64;
/// Room for any compressor's output of one page (lz4's worst case is
/// 16 + 4 + 110% of the input; zstd's bound is smaller).
pub const PACK_BUF_BYTES: usize = 4608;
/// zstd's level when `zstd` is given without one (zstd's own default).
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

const _: () = assert!(PACK_BUF_BYTES >= lz4_flex::block::get_maximum_output_size(PAGE_BYTES));

/// The compression of a drive (`--compress lz4|zstd[:LEVEL]|lz4+zstd[:LEVEL]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// LZ4 block format (`lz4_flex`): fastest, ~2x on text-like data.
    Lz4,
    /// Zstandard at `level` (1..=22, negative for faster modes).
    Zstd { level: i32 },
    /// Writes compressed with LZ4; pages left idle recompressed with
    /// Zstandard at `level` in the background (`recompress.rs`).
    Lz4Zstd { level: i32 },
}

/// One compressor: what a stored page was compressed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Lz4,
    Zstd(i32),
}

impl Algorithm {
    /// The codec that writes use (an object's codec 0).
    pub fn primary(self) -> Codec {
        match self {
            Algorithm::Lz4 | Algorithm::Lz4Zstd { .. } => Codec::Lz4,
            Algorithm::Zstd { level } => Codec::Zstd(level),
        }
    }

    /// The codec idle pages are recompressed with (an object's codec 1).
    pub fn secondary(self) -> Option<Codec> {
        match self {
            Algorithm::Lz4Zstd { level } => Some(Codec::Zstd(level)),
            Algorithm::Lz4 | Algorithm::Zstd { .. } => None,
        }
    }

    /// The codec an object's `codec` field names.
    pub fn codec(self, codec: u8) -> Codec {
        match (codec, self.secondary()) {
            (1, Some(c)) => c,
            _ => self.primary(),
        }
    }
}

/// A `--compress` value that names no known algorithm or a bad level.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseAlgorithmError {
    /// Not `lz4`, `zstd`, `zstd:LEVEL`, `lz4+zstd` or `lz4+zstd:LEVEL`.
    #[error(
        "unknown compression {0:?}: expected lz4, zstd, zstd:LEVEL, lz4+zstd or lz4+zstd:LEVEL"
    )]
    Unknown(String),
    /// The zstd level is not a number in zstd's range.
    #[error("bad zstd level {0:?}: expected an integer from -7 to 22")]
    Level(String),
}

fn zstd_level(l: Option<&str>) -> Result<i32, ParseAlgorithmError> {
    match l.map(|l| (l, l.parse::<i32>())) {
        None => Ok(ZSTD_DEFAULT_LEVEL),
        Some((_, Ok(level))) if (-7..=22).contains(&level) => Ok(level),
        Some((l, _)) => Err(ParseAlgorithmError::Level(l.to_string())),
    }
}

impl FromStr for Algorithm {
    type Err = ParseAlgorithmError;
    fn from_str(s: &str) -> Result<Algorithm, ParseAlgorithmError> {
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (n, Some(l)),
            None => (s, None),
        };
        match name {
            "lz4" if level.is_none() => Ok(Algorithm::Lz4),
            "zstd" => Ok(Algorithm::Zstd {
                level: zstd_level(level)?,
            }),
            "lz4+zstd" => Ok(Algorithm::Lz4Zstd {
                level: zstd_level(level)?,
            }),
            _ => Err(ParseAlgorithmError::Unknown(s.to_string())),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Algorithm::Lz4 => write!(f, "lz4"),
            Algorithm::Zstd { level } => write!(f, "zstd:{level}"),
            Algorithm::Lz4Zstd { level } => write!(f, "lz4+zstd:{level}"),
        }
    }
}

/// A compressor or decompressor failed: for our own pages that means a
/// bug or corrupted memory, never bad input from a client.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// lz4 could not compress a page into a buffer of the documented bound.
    #[error("lz4 compression failed: {0}")]
    Lz4Compress(#[from] lz4_flex::block::CompressError),
    /// lz4 rejected a stored page.
    #[error("lz4 decompression failed: {0}")]
    Lz4Decompress(#[from] lz4_flex::block::DecompressError),
    /// zstd failed (context creation, compression or decompression).
    #[error("zstd failed: {0}")]
    Zstd(#[from] std::io::Error),
    /// A stored page decompressed to the wrong length.
    #[error("a stored page decompressed to {0} bytes, not {PAGE_BYTES}")]
    Length(usize),
}

/// What a page becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packed {
    /// Every 8-byte word equals this one (native byte order).
    Same(u64),
    /// The first `n` bytes of the pack buffer hold the compressed page.
    Compressed(usize),
    /// Did not compress below [`HUGE_MIN_BYTES`]: store the page as is.
    Raw,
}

/// The word a same-filled page repeats, or None. A page repeats its first
/// word iff it equals itself shifted by one word (one `memcmp`).
#[inline]
pub fn same_fill(page: &[u8]) -> Option<u64> {
    debug_assert_eq!(page.len(), PAGE_BYTES);
    let word = u64::from_ne_bytes(page[..8].try_into().expect("8 bytes"));
    (page[8..] == page[..PAGE_BYTES - 8]).then_some(word)
}

/// Fills `out` (any length, starting at a page offset `at`) with the bytes
/// of a page that repeats `word`.
#[inline]
pub fn fill_same(word: u64, at: usize, out: &mut [u8]) {
    if word == 0 {
        out.fill(0);
        return;
    }
    let bytes = word.to_ne_bytes();
    for (i, b) in out.iter_mut().enumerate() {
        *b = bytes[(at + i) % 8];
    }
}

/// Classifies and compresses `page` into `buf`.
pub fn pack(
    codec: Codec,
    page: &[u8],
    buf: &mut [u8; PACK_BUF_BYTES],
) -> Result<Packed, PageError> {
    debug_assert_eq!(page.len(), PAGE_BYTES);
    if let Some(word) = same_fill(page) {
        return Ok(Packed::Same(word));
    }
    compress(codec, page, buf)
}

/// Compresses `page` (not same-filled) into `buf`.
pub fn compress(
    codec: Codec,
    page: &[u8],
    buf: &mut [u8; PACK_BUF_BYTES],
) -> Result<Packed, PageError> {
    let n = match codec {
        Codec::Lz4 => lz4_flex::block::compress_into(page, buf)?,
        Codec::Zstd(level) => zstd_compress(level, page, buf)?,
    };
    Ok(if n > HUGE_MIN_BYTES {
        Packed::Raw
    } else {
        Packed::Compressed(n)
    })
}

/// Decompresses a page that `pack` compressed into `out` (a whole page).
pub fn unpack(codec: Codec, src: &[u8], out: &mut [u8]) -> Result<(), PageError> {
    debug_assert_eq!(out.len(), PAGE_BYTES);
    let n = match codec {
        Codec::Lz4 => lz4_flex::block::decompress_into(src, out)?,
        Codec::Zstd(_) => zstd_decompress(src, out)?,
    };
    if n != PAGE_BYTES {
        return Err(PageError::Length(n));
    }
    Ok(())
}

/// zstd compression contexts a thread keeps (one per level it used last).
const ZSTD_CONTEXTS: usize = 4;

thread_local! {
    /// This thread's zstd compression contexts by level, the last used
    /// first (a context is set up once per level: creating one costs more
    /// than compressing a page).
    static ZSTD_C: RefCell<Vec<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(Vec::new()) };
    /// This thread's zstd decompression context.
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

fn zstd_compress(level: i32, page: &[u8], buf: &mut [u8]) -> Result<usize, PageError> {
    use zstd::zstd_safe::CParameter;
    ZSTD_C.with(|cell| {
        let mut ctxs = cell.borrow_mut();
        match ctxs.iter().position(|(l, _)| *l == level) {
            Some(0) => {}
            Some(i) => {
                let c = ctxs.remove(i);
                ctxs.insert(0, c);
            }
            None => {
                let mut c = zstd::bulk::Compressor::new(level)?;
                c.set_parameter(CParameter::ContentSizeFlag(false))?;
                c.set_parameter(CParameter::ChecksumFlag(false))?;
                c.set_parameter(CParameter::DictIdFlag(false))?;
                ctxs.truncate(ZSTD_CONTEXTS - 1);
                ctxs.insert(0, (level, c));
            }
        }
        Ok(ctxs[0].1.compress_to_buffer(page, buf)?)
    })
}

fn zstd_decompress(src: &[u8], out: &mut [u8]) -> Result<usize, PageError> {
    ZSTD_D.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new()?);
        }
        let d = slot.as_mut().expect("set above");
        Ok(d.decompress_to_buffer(src, out)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_page() -> Vec<u8> {
        let words = [
            "block ", "device ", "memory ", "page ", "the ", "of ", "ramd ",
        ];
        let mut v = Vec::new();
        let mut i = 7usize;
        while v.len() < PAGE_BYTES {
            i = i.wrapping_mul(2654435761) % 1_000_003;
            v.extend_from_slice(words[i % words.len()].as_bytes());
        }
        v.truncate(PAGE_BYTES);
        v
    }

    #[test]
    fn parses_algorithms() {
        assert_eq!("lz4".parse(), Ok(Algorithm::Lz4));
        assert_eq!("zstd".parse(), Ok(Algorithm::Zstd { level: 3 }));
        assert_eq!("zstd:19".parse(), Ok(Algorithm::Zstd { level: 19 }));
        assert!(matches!(
            "zstd:99".parse::<Algorithm>(),
            Err(ParseAlgorithmError::Level(_))
        ));
        assert!(matches!(
            "gzip".parse::<Algorithm>(),
            Err(ParseAlgorithmError::Unknown(_))
        ));
        assert!("lz4:1".parse::<Algorithm>().is_err());
        assert_eq!(Algorithm::Zstd { level: 5 }.to_string(), "zstd:5");
        let two = Algorithm::Lz4Zstd { level: 3 };
        assert_eq!("lz4+zstd".parse(), Ok(two));
        assert_eq!("lz4+zstd:9".parse(), Ok(Algorithm::Lz4Zstd { level: 9 }));
        assert!("lz4+zstd:23".parse::<Algorithm>().is_err());
        assert!("zstd+lz4".parse::<Algorithm>().is_err());
        assert_eq!(two.to_string().parse(), Ok(two));
        assert_eq!((two.codec(0), two.codec(1)), (Codec::Lz4, Codec::Zstd(3)));
        assert_eq!(Algorithm::Zstd { level: 1 }.codec(1), Codec::Zstd(1));
    }

    #[test]
    fn same_filled_pages_are_words() {
        let mut page = vec![0u8; PAGE_BYTES];
        assert_eq!(same_fill(&page), Some(0));
        let w = 0x0102_0304_0506_0708u64;
        for c in page.chunks_mut(8) {
            c.copy_from_slice(&w.to_ne_bytes());
        }
        assert_eq!(same_fill(&page), Some(w));
        let mut back = vec![0u8; 100];
        fill_same(w, 3, &mut back);
        assert_eq!(back, page[3..103]);
        page[4095] ^= 1;
        assert_eq!(same_fill(&page), None);
    }

    #[test]
    fn round_trips_and_raw_fallback() {
        let text = text_page();
        let mut noise = vec![0u8; PAGE_BYTES];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for b in noise.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        for algo in [Codec::Lz4, Codec::Zstd(1), Codec::Zstd(3)] {
            let mut buf = [0u8; PACK_BUF_BYTES];
            let Packed::Compressed(n) = pack(algo, &text, &mut buf).unwrap() else {
                panic!("text must compress with {algo:?}");
            };
            assert!(n < HUGE_MIN_BYTES);
            let mut out = vec![0u8; PAGE_BYTES];
            unpack(algo, &buf[..n], &mut out).unwrap();
            assert_eq!(out, text);
            assert_eq!(pack(algo, &noise, &mut buf).unwrap(), Packed::Raw);
            assert!(unpack(algo, &buf[..n / 2], &mut out).is_err());
        }
    }
}
