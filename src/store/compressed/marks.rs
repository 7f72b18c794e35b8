//! The sync marks of a compressed drive: which pages changed since the
//! last finished sync cut (one dirty bit per page) and, per 64 KiB page
//! group, the last cut that captured it (see `sync.rs` and `store::cut`).
//!
//! ```text
//!  table (ArcSwap) ──▶ [seg 0, seg 1, ...]   one per 64 MiB of drive
//!  seg = dirty: 1 bit / page (16384 bits) + epochs: 1 u32 / group (1024)
//! ```
//!
//! Outside the shard locks, in segments shared between table versions
//! (as the raw store's segments), so the sync walk scans dirty bits and a
//! waiting writer reads its group's epoch without taking any shard lock.
//! Bits and epochs are still *changed* only under the lock of the shard
//! that owns the group (or by the one sync walk under its shared lock).
//! A grow publishes segments before the drive's new size; a shrink clears
//! the bits beyond the new end and drops whole segments after it.
//!
//! Cost: 4 KiB per 64 MiB of drive (0.006%), and on the data path one
//! table load and one atomic OR per changed page.
//!
//! A persistent drive kept across restarts (`keep.rs`) keeps its dirty
//! bits in a dirty ledger (`store::ledger`, the raw store's, the same
//! 64 MiB segments), with the same protocol: a change marks its page
//! dirty before it changes it as well as after; a cut marks the pages it
//! takes pending before it clears their dirty bits, and pending bits are
//! cleared only when the cut is saved. So at any instant of a kill every
//! page the state directory lacks is dirty or pending, and an adoption
//! takes `dirty | pending` as its dirty set.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::shard::GROUP_PAGES;
use crate::store::bitmap::AtomicBitmap;
use crate::store::ledger::{self, Ledger, LedgerPage};

/// Page groups per segment (64 MiB of drive).
const SEG_GROUPS: usize = 1024;
const SEG_PAGES: usize = SEG_GROUPS * GROUP_PAGES;

struct Seg {
    dirty: AtomicBitmap,
    /// Kept drives: pages a cut took that are not saved yet (module docs).
    pending: Option<AtomicBitmap>,
    epochs: Box<[AtomicU32]>,
}

impl Seg {
    /// A segment's marks, in `page` of a ledger (as they are there) or
    /// its own.
    fn new(page: Option<Arc<LedgerPage>>) -> Seg {
        const HALF: usize = ledger::PAGE_WORDS / 2;
        let (dirty, pending) = match page {
            None => (AtomicBitmap::new(SEG_PAGES), None),
            Some(page) => (
                AtomicBitmap::shared(page.clone(), 0, SEG_PAGES),
                Some(AtomicBitmap::shared(page, HALF, SEG_PAGES)),
            ),
        };
        Seg {
            dirty,
            pending,
            epochs: (0..SEG_GROUPS).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

const _: () = assert!(SEG_PAGES == ledger::PAGE_WORDS / 2 * 64);

/// The marks of one drive.
pub struct Marks {
    table: ArcSwap<Vec<Arc<Seg>>>,
    ledger: Option<Ledger>,
}

impl Default for Marks {
    fn default() -> Self {
        Marks {
            table: ArcSwap::from_pointee(Vec::new()),
            ledger: None,
        }
    }
}

impl Marks {
    /// Marks in `ledger` (a new one: every bit clear).
    pub fn kept(ledger: Ledger) -> Marks {
        Marks {
            table: ArcSwap::from_pointee(Vec::new()),
            ledger: Some(ledger),
        }
    }

    /// The marks a killed process left in `ledger` for `groups` page
    /// groups: the dirty set is its dirty and pending pages.
    pub fn adopt(ledger: Ledger, groups: u64) -> io::Result<Marks> {
        let n = (groups as usize).div_ceil(SEG_GROUPS);
        let segs = (0..n)
            .map(|i| {
                let seg = Seg::new(Some(ledger.segment(i)?));
                if let Some(p) = &seg.pending {
                    seg.dirty.or_from(p);
                }
                Ok(Arc::new(seg))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Marks {
            table: ArcSwap::from_pointee(segs),
            ledger: Some(ledger),
        })
    }

    /// The ledger of a kept drive.
    pub fn ledger(&self) -> Option<&Ledger> {
        self.ledger.as_ref()
    }

    /// Covers at least `groups` page groups (grow only; the caller holds
    /// the drive's resize lock). New segments of a ledger start clear (a
    /// page there from before a shrink is stale).
    pub fn grow(&self, groups: u64) -> io::Result<()> {
        let want = (groups as usize).div_ceil(SEG_GROUPS);
        let old = self.table.load_full();
        if want > old.len() {
            let mut segs = old.as_ref().clone();
            for i in old.len()..want {
                let page = self.ledger.as_ref().map(|l| l.segment(i)).transpose()?;
                let seg = Seg::new(page);
                if let Some(p) = &seg.pending {
                    seg.dirty.clear_all();
                    p.clear_all();
                }
                segs.push(Arc::new(seg));
            }
            self.table.store(Arc::new(segs));
        }
        Ok(())
    }

    /// After a shrink to `pages` pages: clears every bit from page `pages`
    /// on and drops the segments beyond (resize lock held).
    pub fn shrink(&self, pages: u64) {
        let segs = self.table.load_full();
        let keep = (pages as usize).div_ceil(SEG_PAGES);
        if let Some(seg) = segs.get(pages as usize / SEG_PAGES) {
            for p in pages as usize % SEG_PAGES..SEG_PAGES {
                seg.dirty.clear(p);
                if let Some(pending) = &seg.pending {
                    pending.clear(p);
                }
            }
        }
        if segs.len() > keep {
            self.table.store(Arc::new(segs[..keep].to_vec()));
        }
    }

    /// Marks page `p` changed. Caller holds its shard's exclusive lock.
    #[inline]
    pub fn set_dirty(&self, p: u64) {
        let segs = self.table.load();
        if let Some(seg) = segs.get(p as usize / SEG_PAGES) {
            seg.dirty.set(p as usize % SEG_PAGES);
        }
    }

    /// The dirty mask of group `g` (bit i = page i of the group).
    pub fn dirty_mask(&self, g: u64) -> u16 {
        let (s, at) = Self::place(g);
        self.table
            .load()
            .get(s)
            .map_or(0, |seg| seg.dirty.bits16(at * GROUP_PAGES))
    }

    /// Before page `p` changes (its shard locked exclusively): a kept
    /// drive's page is dirty already, so a kill in the middle of the
    /// change leaves it dirty (module docs).
    #[inline]
    pub fn mark_before_change(&self, p: u64) {
        if self.ledger.is_some() {
            self.set_dirty(p);
        }
    }

    /// A cut takes the bits of `mask` in group `g`: pending first in a
    /// kept drive (module docs), then cleared.
    pub fn take_mask(&self, g: u64, mask: u16) {
        let (s, at) = Self::place(g);
        if let Some(seg) = self.table.load().get(s) {
            if let Some(p) = &seg.pending {
                p.set_bits16(at * GROUP_PAGES, mask);
            }
            seg.dirty.clear_bits16(at * GROUP_PAGES, mask);
        }
    }

    /// A cut of a drive `size_bytes` long is saved: nothing is pending
    /// any more, and the ledger's smallest unsaved size is that size.
    pub fn saved(&self, size_bytes: u64) {
        for seg in self.table.load().iter() {
            if let Some(p) = &seg.pending {
                p.clear_all();
            }
        }
        if let Some(l) = &self.ledger {
            l.note_saved(size_bytes);
        }
    }

    /// Sets the bits of `mask` in group `g` (an aborted cut gives its
    /// pages back).
    pub fn set_mask(&self, g: u64, mask: u16) {
        let (s, at) = Self::place(g);
        if let Some(seg) = self.table.load().get(s) {
            seg.dirty.set_bits16(at * GROUP_PAGES, mask);
        }
    }

    /// The epoch of the last cut that captured group `g` (0: none).
    pub fn epoch(&self, g: u64) -> u32 {
        let (s, at) = Self::place(g);
        self.table
            .load()
            .get(s)
            .map_or(0, |seg| seg.epochs[at].load(Ordering::Acquire))
    }

    /// Records that cut `e` captured group `g`.
    pub fn set_epoch(&self, g: u64, e: u32) {
        let (s, at) = Self::place(g);
        if let Some(seg) = self.table.load().get(s) {
            seg.epochs[at].store(e, Ordering::Release);
        }
    }

    /// The first group at or after `from` with a dirty page.
    pub fn next_dirty(&self, from: u64) -> Option<u64> {
        let segs = self.table.load();
        let mut g = from as usize;
        while let Some(seg) = segs.get(g / SEG_GROUPS) {
            let base = g / SEG_GROUPS * SEG_GROUPS;
            let p = seg.dirty.find((g - base) * GROUP_PAGES, SEG_PAGES, true);
            if p < SEG_PAGES {
                return Some((base + p / GROUP_PAGES) as u64);
            }
            g = base + SEG_GROUPS;
        }
        None
    }

    /// Pages marked dirty.
    pub fn count(&self) -> u64 {
        self.table
            .load()
            .iter()
            .map(|s| s.dirty.count() as u64)
            .sum()
    }

    /// Clears every dirty bit (each word swapped with zero atomically):
    /// everything is saved at `size_bytes`.
    pub fn clear_all(&self, size_bytes: u64) {
        for seg in self.table.load().iter() {
            seg.dirty.take();
        }
        self.saved(size_bytes);
    }

    /// Bytes of the marks.
    pub fn metadata_bytes(&self) -> u64 {
        let per_seg = SEG_PAGES / 8 + SEG_GROUPS * 4 + std::mem::size_of::<Seg>();
        (self.table.load().len() * (per_seg + std::mem::size_of::<Arc<Seg>>())) as u64
    }

    fn place(g: u64) -> (usize, usize) {
        (g as usize / SEG_GROUPS, g as usize % SEG_GROUPS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_bits_epochs_and_resizes() {
        let m = Marks::default();
        m.grow(3000).unwrap();
        m.set_dirty(5);
        m.set_dirty(17 * GROUP_PAGES as u64 + 3);
        m.set_dirty(2500 * GROUP_PAGES as u64);
        assert_eq!(m.count(), 3);
        assert_eq!(m.dirty_mask(0), 1 << 5);
        assert_eq!(m.next_dirty(0), Some(0));
        assert_eq!(m.next_dirty(1), Some(17));
        assert_eq!(m.next_dirty(18), Some(2500));
        assert_eq!(m.next_dirty(2501), None);
        m.take_mask(17, 1 << 3);
        assert_eq!(m.next_dirty(1), Some(2500));
        m.set_epoch(2500, 7);
        assert_eq!(m.epoch(2500), 7);
        // Shrink into group 2000: its later pages and segment 2 are gone.
        m.shrink(2000 * GROUP_PAGES as u64 + 1);
        assert_eq!(m.count(), 1);
        assert_eq!(m.next_dirty(1), None);
        m.grow(3000).unwrap();
        assert_eq!((m.epoch(2500), m.dirty_mask(2500)), (0, 0));
        m.clear_all(0);
        assert_eq!(m.count(), 0);
    }
}
