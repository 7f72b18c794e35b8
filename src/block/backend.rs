//! The data-path interface every storage engine implements.
//!
//! A [`Backend`] is a byte-addressed block of storage with a fixed (but
//! resizable by its owner) size. The NBD layer knows only this trait; the RAM
//! store, and later the cache and persistence layers, implement it. Layers wrap
//! a backend and are backends themselves, in the spirit of nbdkit's plugins and
//! filters.
//!
//! Preconditions the caller guarantees (the NBD layer's `validate()` checks
//! them once, before any backend runs): `offset + len` does not overflow.
//! Backends still check ranges against their *current* size, because a resize
//! may race with a request that was validated against the old size.

use std::fmt;

/// One run of bytes with the same allocation state, as `extents()` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Length of the run in bytes.
    pub len: u64,
    /// True when the run was never written or was trimmed: no memory backs it.
    pub hole: bool,
    /// True when the run reads as zeroes (every hole does).
    pub zero: bool,
}

/// What a backend can do; the NBD layer turns this into transmission flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// TRIM frees storage.
    pub can_trim: bool,
    /// WRITE_ZEROES is native (no data crosses the call).
    pub can_zero: bool,
    /// A zero request can be done fast (no slower than a write), so
    /// NBD_CMD_FLAG_FAST_ZERO may be honoured.
    pub can_fast_zero: bool,
    /// FUA writes are meaningful (the backend persists them).
    pub can_fua: bool,
    /// FLUSH is meaningful.
    pub can_flush: bool,
    /// Every connection sees every other connection's completed writes, and a
    /// flush on one connection covers writes completed on all of them.
    pub can_multi_conn: bool,
    /// `extents()` returns real information.
    pub can_extents: bool,
    /// CACHE (prefetch) is supported (a no-op for RAM, already resident).
    pub can_cache: bool,
    /// The backend keeps its data in its own RAM: `read_with` works in
    /// place (worth a frontend's zero-copy READ path) and writes cost no
    /// I/O, so frontends store large WRITEs burst by burst as they arrive.
    /// False for backends behind slower storage.
    pub direct_io: bool,
    /// The unit the backend locks (a RAM store's chunk) or caches (a cache
    /// block) by. A frontend that splits a large WRITE into pieces for a
    /// backend that is not `direct_io` ends them on multiples of it, so no
    /// piece writes part of a unit it could have written whole.
    pub piece_bytes: u32,
}

impl Caps {
    /// Nothing but reads, in 64 KiB pieces: a backend that serves nothing
    /// yet (an offline drive).
    pub const NONE: Caps = Caps {
        can_trim: false,
        can_zero: false,
        can_fast_zero: false,
        can_fua: false,
        can_flush: false,
        can_multi_conn: false,
        can_extents: false,
        can_cache: false,
        direct_io: false,
        piece_bytes: 64 * 1024,
    };
}

/// Errors a backend returns; the NBD layer maps each to one NBD errno in one
/// place (`nbd::proto::errno_for`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request reaches past the end of the drive.
    #[error("request {offset}+{len} is beyond the end of the drive ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// New pages were needed but a memory limit would be exceeded.
    #[error("out of memory for this drive: {0}")]
    NoSpace(String),
    /// New pages were refused because the host is short of memory (the
    /// memory-pressure watcher's cap): unlike [`Error::NoSpace`], this
    /// passes when the host recovers.
    #[error("out of memory for this drive: the host's memory is down to the reserve ramd leaves it or short (see `ramd info`: memory pressure), so ramd refuses new pages until memory is freed; free memory elsewhere, trim or delete drives, or change the thresholds (docs/memory.md, \"Memory pressure\")")]
    HostShort,
    /// The drive is read-only.
    #[error("the drive is read-only")]
    ReadOnly,
    /// The request is not valid for this backend.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The operation is not supported by this backend.
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    /// An I/O error from a lower layer.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// The data-path interface. All methods take `&self`: implementations are
/// internally synchronised and must let independent requests run in parallel.
pub trait Backend: Send + Sync {
    /// Current size in bytes.
    fn size(&self) -> u64;
    /// Fill `buf` with the bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Store `data` at `offset`; with `fua`, make it durable before returning.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()>;
    /// Make `len` bytes at `offset` read as zeroes. With `may_trim`, storage
    /// behind whole pages may be released; without it (NBD_CMD_FLAG_NO_HOLE)
    /// the range stays allocated so later writes cannot fail for space.
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()>;
    /// Discard `len` bytes at `offset`. The range reads as zeroes afterwards.
    fn trim(&self, offset: u64, len: u64) -> Result<()>;
    /// Make every completed write durable.
    fn flush(&self) -> Result<()>;
    /// Stores several `(offset, data)` writes (no FUA), as if by `write` in
    /// turn; on an error some of them may have been stored. A backend with
    /// per-request latency (an NBD client) keeps them all in flight at once
    /// instead of waiting for each: the default just loops.
    fn write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        for &(offset, data) in writes {
            self.write(offset, data, false)?;
        }
        Ok(())
    }
    /// Allocation map of `[offset, offset+len)`: consecutive extents that
    /// cover a prefix of the range (at least one extent when `len > 0`).
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>>;
    /// What this backend supports.
    fn capabilities(&self) -> Caps;
    /// Prefetch a range (NBD_CMD_CACHE). RAM is always resident.
    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.size())
    }

    /// Offers the bytes of a prefix of `[offset, offset+len)` to `sink` as
    /// slices; `sink` takes a prefix of them without waiting on anyone and
    /// returns how many bytes, which this returns too (0 when it took
    /// none). The default reads into a buffer first.
    fn read_with(
        &self,
        offset: u64,
        len: usize,
        sink: &mut dyn FnMut(&[std::io::IoSlice<'_>]) -> std::io::Result<usize>,
    ) -> Result<usize> {
        let mut buf = vec![0u8; len.min(BOUNCE_BYTES)];
        self.read(offset, &mut buf)?;
        Ok(sink(&[std::io::IoSlice::new(&buf)])?)
    }
}

/// Piece size of the default `read_with`.
const BOUNCE_BYTES: usize = 1 << 20;

/// Checks that `[offset, offset+len)` lies within `size`.
#[inline]
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfRange { offset, len, size }),
    }
}

impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match (self.hole, self.zero) {
            (true, _) => "hole",
            (false, true) => "zero",
            (false, false) => "data",
        };
        write!(f, "{} bytes {}", self.len, kind)
    }
}
