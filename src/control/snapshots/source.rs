//! The seams between a drive and the snapshot engine: a push reads a
//! point-in-time [`Cut`] of the drive ([`CutSource`]); a restore writes a
//! drive's backend ([`BackendSink`]).
//!
//! The push reads chunk-aligned ranges of its chunk size, in order, and
//! asks `is_unwritten` for each before reading it (snapshot::push), so the
//! cut is opened with the same chunk size and each call maps to exactly
//! one of the cut's chunks. A range that is not one whole chunk would be
//! a bug in that contract: it is refused with an error, not guessed.

use std::sync::Arc;

use crate::block::backend::Backend;
use crate::block::cut::Cut;
use crate::snapshot::{ChunkSink, ChunkSource};

/// A push's view of a drive: the drive as it was when the cut was made.
pub struct CutSource {
    pub cut: Cut,
}

impl CutSource {
    /// The chunk index of `[offset, offset+len)`, when it is one whole chunk.
    fn chunk_of(&self, offset: u64, len: u64) -> Option<u64> {
        let cb = self.cut.chunk_bytes();
        let ci = offset / cb;
        let whole = offset % cb == 0 && len == cb.min(self.cut.size_bytes() - offset);
        whole.then_some(ci)
    }
}

impl ChunkSource for CutSource {
    fn size_bytes(&self) -> u64 {
        self.cut.size_bytes()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let ci = self.chunk_of(offset, buf.len() as u64).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "read of {} bytes at {offset} is not one chunk of the cut",
                    buf.len()
                ),
            )
        })?;
        self.cut.read_chunk(ci, buf).map_err(std::io::Error::other)
    }

    fn is_unwritten(&self, offset: u64, len: u64) -> bool {
        self.chunk_of(offset, len)
            .is_some_and(|ci| self.cut.chunk_is_unwritten(ci))
    }
}

/// A restore's target: a drive's backend, fresh (zero chunks skipped).
pub struct BackendSink {
    pub backend: Arc<dyn Backend>,
}

impl ChunkSink for BackendSink {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.backend
            .write(offset, data, false)
            .map_err(std::io::Error::other)
    }
}
