//! A shared store's dirty ledger: the dirty set in memory that outlives the
//! process, so a persistent drive kept across a kill -9 of the serving
//! process (issue 31) knows which of its pages its state directory lacks.
//!
//! A drive's memory survives in its memfd (`memfd.rs`); what was saved of
//! it is on disk. Without the dirty set an adopted persistent drive could
//! only save *everything* again (its whole size through the journal). So
//! a store with shared memory keeps its dirty bits in a second memfd, the
//! ledger, next to the data:
//!
//! ```text
//!  ledger page 0        magic, unsaved_min (the smallest size since the last saved cut),
//!                       the journal generation this memory is committing, and the
//!                       last one it committed (`SyncStore::note_committing`), and
//!                       the state directory's id (its meta's uuid) they count in
//!  ledger page 1 + i    segment i: dirty bits (2 KiB) | pending bits (2 KiB)
//! ```
//!
//! **Pending** bits hold pages a cut took out of the dirty set but whose
//! journal generation is not durable yet: a writer or the walk sets a
//! page's pending bit *before* it clears its dirty bit, and a cut clears
//! the pending bits only after its generation is committed (and after it
//! gave back what it did not save). So at every instant, whatever kills
//! the process, every page whose contents differ from the state directory
//! is dirty or pending, and an adoption takes `dirty | pending` as its
//! dirty set. Extra bits only cost a page written again.
//!
//! Writes set a page's dirty bit *before* they change it, too (under the
//! chunk's exclusive lock, so no cut sees the early bit before the change
//! ends; the bit is set again after it as always): a process killed in
//! the middle of a write leaves the page dirty, so bytes an adopted drive
//! serves are the bytes it saves.
//!
//! `unsaved_min` does for sizes what pending bits do for pages: a shrink
//! lowers it, and only a saved cut raises it again (to the size it saved).
//!
//! Invariants: the ledger is sealed like a drive memfd (it never shrinks
//! under a mapping); a segment's ledger page is mapped before the segment
//! is published and unmapped after it is dropped (the bitmaps hold the
//! mapping); the words are only touched with atomic operations.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::memfd;

/// Bytes of one ledger page.
const PAGE: usize = 4096;
/// 64-bit words per ledger page.
pub const PAGE_WORDS: usize = PAGE / 8;
/// "ramd_lg1": a ledger of this layout.
const MAGIC: u64 = u64::from_le_bytes(*b"ramd_lg1");

/// One mapped ledger page, unmapped on drop.
pub type LedgerPage = memfd::SharedWords;

/// Maps ledger page `index` of `fd`, growing the file to hold it.
fn map_page(fd: BorrowedFd<'_>, index: usize) -> io::Result<LedgerPage> {
    memfd::grow_to(fd, (index + 1) * PAGE).map_err(io::Error::from)?;
    memfd::SharedWords::map(fd, index * PAGE, PAGE_WORDS)
}

/// A store's ledger (see the module docs).
pub struct Ledger {
    fd: OwnedFd,
    header: LedgerPage,
}

impl Ledger {
    /// A new ledger for a drive of `size_bytes`.
    pub fn create(size_bytes: u64) -> io::Result<Ledger> {
        let fd = memfd::create_named(c"ramd-ledger").map_err(io::Error::from)?;
        let header = map_page(fd.as_fd(), 0)?;
        header.words()[1].store(size_bytes, Ordering::Release);
        header.words()[0].store(MAGIC, Ordering::Release);
        Ok(Ledger { fd, header })
    }

    /// The ledger another process kept; refused when it is not one.
    pub fn adopt(fd: OwnedFd) -> io::Result<Ledger> {
        memfd::check(fd.as_fd(), PAGE).map_err(io::Error::from)?;
        let header = map_page(fd.as_fd(), 0)?;
        if header.words()[0].load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a drive's dirty ledger (wrong magic)",
            ));
        }
        Ok(Ledger { fd, header })
    }

    /// The descriptor, for the keeper.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Segment `index`'s page: dirty words first, then pending words.
    pub fn segment(&self, index: usize) -> io::Result<Arc<LedgerPage>> {
        map_page(self.fd.as_fd(), 1 + index).map(Arc::new)
    }

    /// The smallest size since the last saved cut.
    pub fn unsaved_min(&self) -> u64 {
        self.header.words()[1].load(Ordering::Acquire)
    }

    /// A shrink to `size`.
    pub fn note_shrink(&self, size: u64) {
        self.header.words()[1].fetch_min(size, Ordering::AcqRel);
    }

    /// The generations noted: (last committed, being committed).
    pub fn generations(&self) -> (u64, u64) {
        let w = self.header.words();
        (w[3].load(Ordering::Acquire), w[2].load(Ordering::Acquire))
    }

    /// Notes that generation `gen` is being committed.
    pub fn set_committing(&self, gen: u64) {
        self.header.words()[2].store(gen, Ordering::Release);
    }

    /// The state directory's id noted (zeroes: none).
    pub fn directory(&self) -> [u8; 16] {
        let w = self.header.words();
        let (a, b) = (w[4].load(Ordering::Acquire), w[5].load(Ordering::Acquire));
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&a.to_le_bytes());
        id[8..].copy_from_slice(&b.to_le_bytes());
        id
    }

    /// Notes the state directory's id.
    pub fn set_directory(&self, id: [u8; 16]) {
        let w = self.header.words();
        w[4].store(
            u64::from_le_bytes(id[..8].try_into().unwrap()),
            Ordering::Release,
        );
        w[5].store(
            u64::from_le_bytes(id[8..].try_into().unwrap()),
            Ordering::Release,
        );
    }

    /// Notes that generation `gen` is committed.
    pub fn set_committed(&self, gen: u64) {
        self.header.words()[3].store(gen, Ordering::Release);
    }

    /// A cut of `size` is saved (or the store is known saved at `size`).
    pub fn note_saved(&self, size: u64) {
        self.header.words()[1].store(size, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_is_shared_by_whoever_maps_it() {
        let l = Ledger::create(1 << 30).unwrap();
        let a = l.segment(3).unwrap();
        a.words()[7].store(0xdead, Ordering::Release);
        l.note_shrink(4096);
        let copy = Ledger::adopt(l.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(
            copy.segment(3).unwrap().words()[7].load(Ordering::Acquire),
            0xdead
        );
        assert_eq!(copy.unsaved_min(), 4096);
        copy.note_saved(1 << 20);
        assert_eq!(l.unsaved_min(), 1 << 20);
        let other = memfd::create().unwrap();
        memfd::grow_to(other.as_fd(), PAGE).unwrap();
        let e = Ledger::adopt(other).err().unwrap();
        assert!(e.to_string().contains("magic"), "{e}");
    }
}
