//! A compressed drive's memory in memfds, so that it outlives the serving
//! process (`ramd daemon --supervise`, issue 31, docs/restart.md), and the
//! order of changes that lets the next process rebuild everything else
//! from it after a kill -9 at any instant.
//!
//! ```text
//!  arena memfd   the arena's regions one after another (region i at i * region_bytes)
//!  meta memfd    word 0 magic | 1 region bytes | 2 regions carved | 3 most pages ever
//!                word 8 + c   objects in class c (n)
//!                page map     one word per arena page: 0, or 1 | class << 8 | k << 16
//!                             (the page is page k of class c)
//!                shadow       two words per drive page: its entry (`table::kept_bits`:
//!                             raw pages by arena page index) and a wide same-filled word
//!  object        in its slot: the compressed bytes, ..., its id in the slot's last 4 bytes
//! ```
//!
//! What is *not* kept is rebuilt at adoption (`adopt.rs`): the page
//! tables from the shadow, each class's pages from the page map, its
//! slot-to-id and id-to-slot maps from the ids in the slots, the arena's
//! free lists from the pages nobody holds.
//!
//! # The order that makes any instant consistent
//!
//! A kill leaves in shared memory every store the process executed, in
//! program order (it stops threads between instructions; stores already
//! executed still reach memory). So each change is ordered so that the
//! state after any prefix of its stores rebuilds to the state before it
//! or after it:
//! - a class's new page is noted in the page map before an object uses
//!   it; a page given back is taken off the page map first; pages of a
//!   class beyond what its `n` objects need are free at adoption;
//! - an object is written (bytes, then its id with one atomic 4-byte
//!   store) before the class's `n` counts it, and a page's shadow entry
//!   names the object only after that; the entry it replaced is freed
//!   after. An object no entry names is garbage at adoption: freed;
//! - a free moves the class's last object into the hole (bytes, then
//!   id), *then* lowers `n`. Killed in between, the moved object's id is
//!   in two slots; the higher one (the original, whole) wins and the
//!   lower one is freed;
//! - an object is never rewritten in place (unkept drives do, when the
//!   new bytes fit the old slot): a torn compressed object would lose the
//!   whole page, acknowledged bytes included. A raw page is, as the raw
//!   store's pages are: a torn write mixes old and new bytes of its own
//!   range only.
//!
//! The meta memfd is reserved for the largest drive (16 bytes a page of
//! 64 TiB, 8 per arena page: 384 GiB of address space, one shared
//! mapping, nothing committed but what is touched), so it never moves or
//! grows under the locks that write it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::store::memfd;

/// "ramd_cz1": a kept compressed drive of this layout.
const MAGIC: u64 = u64::from_le_bytes(*b"ramd_cz1");
const W_MAGIC: usize = 0;
const W_REGION_BYTES: usize = 1;
const W_REGIONS: usize = 2;
const W_MAX_PAGES: usize = 3;
const W_CLASSES: usize = 8;
/// Words of the header (one 4 KiB page).
const HEADER_WORDS: usize = 512;
/// The largest compressed drive (`MAX_COMPRESSED_DRIVE_BYTES`, which is
/// this: a child does not import its parent).
pub const MAX_DRIVE_BYTES: u64 = 64 << 40;
/// Drive pages of the largest compressed drive.
const MAX_PAGES: usize = (MAX_DRIVE_BYTES / 4096) as usize;
/// Arena pages the page map has room for: a page per drive page at most
/// (each entry holds one object or one raw page, and the classes are
/// dense), plus every class's partial page, the arena's cache and a
/// region of slack.
pub const MAX_ARENA_PAGES: usize = MAX_PAGES + (1 << 20);
const PAGE_MAP_AT: usize = HEADER_WORDS;
const SHADOW_AT: usize = PAGE_MAP_AT + MAX_ARENA_PAGES;
const META_WORDS: usize = SHADOW_AT + 2 * MAX_PAGES;
/// Bytes of an object's id at the end of its slot.
pub const ID_BYTES: usize = 4;

/// Room for 256 class counts (`pool.rs` has at most 256 classes).
const _: () = assert!(W_CLASSES + 256 <= HEADER_WORDS);

/// The memfds of a kept compressed drive, as a keeper holds them: its
/// arena, its meta and, for a persistent drive, its dirty ledger
/// (`marks.rs`).
pub struct KeptFiles {
    pub arena: OwnedFd,
    pub meta: OwnedFd,
    pub ledger: Option<OwnedFd>,
}

/// Why kept memory cannot be adopted.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not a kept compressed drive (wrong magic)")]
    Magic,
    #[error("not a kept compressed drive: {0}")]
    NotKept(memfd::MemfdError),
    #[error("the kept memory is inconsistent: {0}")]
    Inconsistent(&'static str),
}

impl From<memfd::MemfdError> for KeepError {
    fn from(e: memfd::MemfdError) -> KeepError {
        KeepError::Io(e.into())
    }
}

/// A class page's place in the page map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub class: usize,
    pub index: u64,
}

/// A kept drive's memfds and the meta mapping (module docs).
pub struct Keep {
    arena: OwnedFd,
    meta_fd: OwnedFd,
    meta: memfd::SharedWords,
}

impl Keep {
    /// Fresh, empty memfds for a drive whose arena maps regions of
    /// `region_bytes`.
    pub fn create(region_bytes: usize) -> Result<Keep, KeepError> {
        let arena = memfd::create_named(c"ramd-compressed")?;
        let meta = memfd::create_named(c"ramd-compressed-meta")?;
        memfd::grow_to(meta.as_fd(), META_WORDS * 8)?;
        let k = Keep::map(arena, meta)?;
        k.word(W_REGION_BYTES)
            .store(region_bytes as u64, Ordering::Relaxed);
        k.word(W_MAGIC).store(MAGIC, Ordering::Release);
        Ok(k)
    }

    /// The memfds another process kept; refused when they are not those
    /// of a kept compressed drive.
    pub fn open(arena: OwnedFd, meta: OwnedFd) -> Result<Keep, KeepError> {
        memfd::check(meta.as_fd(), META_WORDS * 8).map_err(KeepError::NotKept)?;
        memfd::check(arena.as_fd(), 0).map_err(KeepError::NotKept)?;
        let k = Keep::map(arena, meta)?;
        if k.word(W_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(KeepError::Magic);
        }
        let rb = k.region_bytes();
        if rb == 0 || rb % (2 << 20) != 0 || k.regions() * rb / 4096 > MAX_ARENA_PAGES {
            return Err(KeepError::Inconsistent("a bad region size or count"));
        }
        Ok(k)
    }

    fn map(arena: OwnedFd, meta_fd: OwnedFd) -> Result<Keep, KeepError> {
        let meta = memfd::SharedWords::map(meta_fd.as_fd(), 0, META_WORDS)?;
        Ok(Keep {
            arena,
            meta_fd,
            meta,
        })
    }

    #[inline]
    fn word(&self, i: usize) -> &AtomicU64 {
        &self.meta.words()[i]
    }

    /// The arena's memfd.
    pub fn arena_fd(&self) -> BorrowedFd<'_> {
        self.arena.as_fd()
    }

    /// The meta memfd.
    pub fn meta_fd(&self) -> BorrowedFd<'_> {
        self.meta_fd.as_fd()
    }

    /// Bytes of each arena region.
    pub fn region_bytes(&self) -> usize {
        self.word(W_REGION_BYTES).load(Ordering::Relaxed) as usize
    }

    /// Regions the arena carved pages from.
    pub fn regions(&self) -> usize {
        self.word(W_REGIONS).load(Ordering::Acquire) as usize
    }

    /// Notes that region `n - 1` is mapped (before a page of it is used).
    pub fn set_regions(&self, n: usize) {
        self.word(W_REGIONS).store(n as u64, Ordering::Release);
    }

    /// The most drive pages any size of the drive had (how far the
    /// shadow may hold entries).
    pub fn max_pages(&self) -> u64 {
        self.word(W_MAX_PAGES).load(Ordering::Acquire)
    }

    /// Notes a size before it is published.
    pub fn note_size(&self, size_bytes: u64) {
        self.word(W_MAX_PAGES)
            .fetch_max(size_bytes.div_ceil(4096), Ordering::AcqRel);
    }

    /// Objects in class `c`.
    pub fn class_count(&self, c: usize) -> u64 {
        self.word(W_CLASSES + c).load(Ordering::Acquire)
    }

    /// Sets the objects of class `c`, after the objects' bytes and ids.
    pub fn set_class_count(&self, c: usize, n: u64) {
        self.word(W_CLASSES + c).store(n, Ordering::Release);
    }

    /// The class page arena page `index` is, if any.
    pub fn owner(&self, index: u64) -> Option<Owner> {
        let w = self
            .word(PAGE_MAP_AT + index as usize)
            .load(Ordering::Acquire);
        (w & 1 == 1).then_some(Owner {
            class: (w >> 8 & 0xff) as usize,
            index: w >> 16,
        })
    }

    /// Notes arena page `index` as a class page, or as none.
    pub fn set_owner(&self, index: u64, owner: Option<Owner>) {
        let w = owner.map_or(0, |o| 1 | (o.class as u64) << 8 | o.index << 16);
        self.word(PAGE_MAP_AT + index as usize)
            .store(w, Ordering::Release);
    }

    /// The kept entry of drive page `page` and its wide word.
    pub fn entry(&self, page: u64) -> (u64, u64) {
        let at = SHADOW_AT + 2 * page as usize;
        let wide = self.word(at + 1).load(Ordering::Acquire);
        (self.word(at).load(Ordering::Acquire), wide)
    }

    /// Sets the kept entry of drive page `page` (the wide word first).
    pub fn set_entry(&self, page: u64, bits: u64, wide: u64) {
        let at = SHADOW_AT + 2 * page as usize;
        if wide != 0 {
            self.word(at + 1).store(wide, Ordering::Release);
        }
        self.word(at).store(bits, Ordering::Release);
    }

    /// Frees the shadow of drive pages `[from, to)` (cleared: a shrink
    /// made them holes), whole 4 KiB pages of it only.
    pub fn release_shadow(&self, from: u64, to: u64) {
        let (a, b) = (
            (SHADOW_AT + 2 * from as usize) * 8,
            (SHADOW_AT + 2 * to as usize) * 8,
        );
        let (a, b) = (a.next_multiple_of(4096), b / 4096 * 4096);
        if a < b {
            let flags =
                rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
            if let Err(e) = rustix::fs::fallocate(&self.meta_fd, flags, a as u64, (b - a) as u64) {
                tracing::warn!("cannot free a shrunk compressed drive's table shadow: {e}");
            }
        }
    }

    /// Bytes of the meta memfd that may be resident: the header, the
    /// page map of the carved arena and the shadow of the largest size.
    pub fn metadata_bytes(&self) -> u64 {
        let carved = self.regions() * self.region_bytes() / 4096;
        (HEADER_WORDS * 8 + carved * 8) as u64 + self.max_pages() * 16
    }

    /// Copies of both descriptors, as a keeper would hand them back.
    #[cfg(test)]
    pub fn files(&self) -> io::Result<KeptFiles> {
        Ok(KeptFiles {
            arena: self.arena.try_clone()?,
            meta: self.meta_fd.try_clone()?,
            ledger: None,
        })
    }
}

/// Writes an object's id at the end of its slot, `at` bytes into the
/// page holding that end (one atomic store: a kill never leaves half an id).
///
/// # Safety
/// `page` is a live, writable page the caller owns under its class's
/// exclusive lock, and `at + ID_BYTES <= 4096`, `at % 4 == 0`.
pub unsafe fn write_id(page: *mut u8, at: usize, id: u32) {
    debug_assert!(at % 4 == 0 && at + ID_BYTES <= 4096);
    // SAFETY: the caller's contract: aligned, inside the page, ours.
    unsafe { (*page.add(at).cast::<AtomicU32>()).store(id, Ordering::Release) };
}

/// Reads an object's id (see [`write_id`]).
///
/// # Safety
/// As [`write_id`], the lock held shared at least.
pub unsafe fn read_id(page: *const u8, at: usize) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { (*page.add(at).cast::<AtomicU32>()).load(Ordering::Acquire) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_meta_is_shared_and_checked() {
        let k = Keep::create(2 << 20).unwrap();
        k.set_class_count(7, 42);
        k.set_owner(5, Some(Owner { class: 7, index: 3 }));
        k.set_entry(MAX_PAGES as u64 - 1, 0xabc, 0);
        k.note_size(1 << 30);
        let f = k.files().unwrap();
        let b = Keep::open(f.arena, f.meta).unwrap();
        assert_eq!(b.class_count(7), 42);
        assert_eq!(b.owner(5), Some(Owner { class: 7, index: 3 }));
        assert_eq!(b.owner(6), None);
        assert_eq!(b.entry(MAX_PAGES as u64 - 1), (0xabc, 0));
        assert_eq!(b.max_pages(), (1 << 30) / 4096);
        let (arena, meta) = (memfd::create().unwrap(), memfd::create().unwrap());
        memfd::grow_to(meta.as_fd(), META_WORDS * 8).unwrap();
        assert!(matches!(Keep::open(arena, meta), Err(KeepError::Magic)));
    }
}
