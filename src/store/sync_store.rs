//! What the persistence engine needs of a RAM store, so one engine
//! (`persist`: journal, checkpoint, restore, crash tests) saves and
//! restores every kind of store: the raw [`RamStore`] and the compressed
//! store (`compressed::CompressedStore`).
//!
//! The seam is the store's own sync machinery, nothing of the disk:
//!
//! - a dirty set: the pages changed since the last finished cut (or since
//!   [`SyncStore::clear_dirty`]);
//! - a point-in-time cut of it ([`SyncStore::cut`]) that hands out the
//!   pre-cut contents of every dirty page, 64 KiB unit by unit, as raw
//!   pages ([`CapturedChunk`]), while writers go on; finishing it forgets
//!   those pages, dropping it unfinished gives them back to the dirty set;
//! - loading: bytes a restore reads from disk put straight into the store
//!   ([`SyncStore::load_with`]), then the ordinary data path (`Backend`)
//!   for the journal's replay.
//!
//! Why raw pages cross the seam whatever the store keeps: the state
//! directory's image stays a raw sparse image of the drive (qemu-img,
//! losetup, `dd` read it), every page keeps its CRC-32C or AES-GCM entry,
//! and one verified restore path serves every store. What that costs a
//! compressed drive, measured, is in `compressed/sync.rs`.
//!
//! Implementations are generic parameters of the engine (no `dyn` on the
//! data path): the raw store's code is the same as before the seam.

use std::io;

use super::snapshot::{CapturedChunk, Snapshot};
use super::{RamStore, StoreState};
use crate::block::backend::{Backend, Result};

/// A running point-in-time cut of a store's dirty pages.
pub trait SyncCut {
    /// The drive size at the cut.
    fn size_bytes(&self) -> u64;
    /// The smallest the drive was since the previous cut: bytes from here
    /// to `size_bytes` read as zero unless a saved page says otherwise.
    fn min_size_bytes(&self) -> u64;
    /// The next unit of pre-cut pages, None when the cut is complete. An
    /// error (a stored page that does not decode: a bug or damaged memory)
    /// ends the sync; the cut is then dropped, unfinished.
    fn next_chunk(&mut self) -> Result<Option<CapturedChunk>>;
    /// Ends the cut successfully: everything handed out is saved.
    fn finish(self);
}

/// A store the persistence engine can sync and restore (see the module
/// docs).
pub trait SyncStore: Backend + 'static {
    /// The store's cut.
    type Cut<'a>: SyncCut
    where
        Self: 'a;

    /// Starts a point-in-time cut of the pages changed since the last
    /// finished one. Blocks while another cut or a resize runs.
    fn cut(&self) -> Self::Cut<'_>;
    /// Pages marked dirty now.
    fn dirty_pages(&self) -> u64;
    /// Forgets the dirty set: everything the store holds is on disk.
    fn clear_dirty(&self);
    /// Bytes of pre-cut pages writers copied aside for the running cut.
    fn cut_copy_bytes(&self) -> u64;
    /// Grows or shrinks the drive (waits for a running cut).
    fn resize(&self, size_bytes: u64) -> Result<()>;
    /// The engine is about to commit generation `gen`: a store whose
    /// memory can outlive the process remembers it, and the last one
    /// committed (`note_committed`), so that the memory is adopted only by
    /// a directory at one of the two (`persist::restore::adopt`). Nothing
    /// by default.
    fn note_committing(&self, _gen: u64) {}
    /// Generation `gen` is committed (or the directory was opened at it).
    fn note_committed(&self, _gen: u64) {}
    /// The store saves to the state directory `id` (its meta's uuid).
    fn note_directory(&self, _id: [u8; 16]) {}
    /// What `note_directory` noted (None: the store does not keep it).
    fn kept_directory(&self) -> Option<[u8; 16]> {
        None
    }
    /// What was noted: (last committed, being committed); None: the store
    /// does not keep it.
    fn kept_generations(&self) -> Option<(u64, u64)> {
        None
    }
    /// Threads a restore loads the image with: two (one reads from the
    /// disk while the other verifies and copies) unless the store spends
    /// more CPU per page than that.
    fn load_threads(&self) -> usize {
        2
    }
    /// Stores the bytes `fill` produces at `offset`: a prefix of `len`
    /// bytes (at least one page, or `len` when smaller), whose length is
    /// returned. `fill` fills the whole slice it is given without waiting
    /// on anyone; its error comes back as `Error::Io`.
    fn load_with(
        &self,
        offset: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> Result<usize>;
}

impl SyncCut for Snapshot<'_> {
    fn size_bytes(&self) -> u64 {
        Snapshot::size_bytes(self)
    }
    fn min_size_bytes(&self) -> u64 {
        Snapshot::min_size_bytes(self)
    }
    fn next_chunk(&mut self) -> Result<Option<CapturedChunk>> {
        Ok(Snapshot::next_chunk(self))
    }
    fn finish(self) {
        Snapshot::finish(self)
    }
}

impl SyncStore for RamStore {
    type Cut<'a> = Snapshot<'a>;

    fn cut(&self) -> Snapshot<'_> {
        self.snapshot()
    }
    fn dirty_pages(&self) -> u64 {
        StoreState::dirty_pages(self)
    }
    fn clear_dirty(&self) {
        self.take_dirty();
    }
    fn note_committing(&self, gen: u64) {
        StoreState::note_committing(self, gen)
    }
    fn note_committed(&self, gen: u64) {
        StoreState::note_committed(self, gen)
    }
    fn kept_generations(&self) -> Option<(u64, u64)> {
        StoreState::kept_generations(self)
    }
    fn note_directory(&self, id: [u8; 16]) {
        StoreState::note_directory(self, id)
    }
    fn kept_directory(&self) -> Option<[u8; 16]> {
        StoreState::kept_directory(self)
    }
    fn cut_copy_bytes(&self) -> u64 {
        self.snapshot_copy_bytes()
    }
    fn resize(&self, size_bytes: u64) -> Result<()> {
        StoreState::resize(self, size_bytes)
    }
    fn load_with(
        &self,
        offset: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> Result<usize> {
        self.write_with(offset, len, fill)
    }
}
