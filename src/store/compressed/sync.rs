//! Persistence of a compressed drive: its dirty set and point-in-time
//! cuts, so the one persistence engine (`persist`, over
//! [`SyncStore`](crate::store::SyncStore)) saves and restores it.
//!
//! # The cut
//!
//! The raw store's protocol (`store/snapshot.rs`, bookkeeping in
//! `store/cut.rs`) with the 64 KiB page group as the unit instead of the
//! chunk: a group's pages live in one shard, so the shard lock plays the
//! chunk lock's part. A change (write, zero, trim) takes its shard's
//! exclusive lock; while a cut E runs and its group was not captured for E
//! yet, it first copies the group's dirty pre-cut pages into the side
//! table. The walk captures groups in ascending order under the shard's
//! shared lock (readers go on). Pages are copied *as stored*: a
//! compressed object (~1-2 KiB, its class's shared lock taken for the
//! copy), a raw page, a same-filled word or a hole, so a copy aside costs
//! what the page costs in memory, not 4 KiB, and the locks are held for a
//! memcpy, never a decompression. The walk decompresses outside
//! any lock into the raw pages the engine writes ([`CapturedChunk`]).
//! Dirty bits and epochs live in `marks.rs`, outside the shard locks.
//!
//! # What goes to disk, and why raw pages
//!
//! The state directory is the same as a raw drive's: a raw sparse image,
//! a CRC-32C (or AES-GCM) entry per page, the redo journal. So the image
//! of a compressed drive is readable by qemu-img or losetup like any
//! other, encryption and every restore check work unchanged, the crash
//! fuzzer covers both stores with one engine and one format, and a drive
//! may come back with another algorithm or none. The price is CPU: a sync
//! decompresses each dirty page and writes 4 KiB for it; a restore
//! compresses every loaded page again. Measured on the 1 GiB mixed corpus
//! of bench/compressed-corpus.sh (`examples/compressed_persist_bench.rs`,
//! 2 shared vCPUs, three runs; docs/persistence.md has the table): a sync
//! commit took 0.57-0.85 s raw, 0.77-0.90 s lz4, 1.7-1.8 s zstd:3 (one core
//! decompresses the corpus at 2-3 GB/s with lz4, 1.0 GB/s with zstd); a
//! restore 0.9-2.6 s raw, 1.8-3.2 s lz4, 4.4-7.0 s zstd:3 (compressing at
//! 0.3-0.7 / 0.2-0.3 GB/s per core; one load thread per core, here two).
//! A compressed image would move the 689 / 609 MiB the drive holds instead
//! of 1 GiB and skip the restore's compression (a zstd restore near the
//! disk's 0.4-1.1 s read of 588 MiB), but it needs its own format, journal
//! records and verification path, and ties the files to one algorithm and
//! to ramd: the raw image was kept, and a slower restore of a compressed
//! drive (2-8x a raw one's on two cores) is its price.
//!
//! # Restore
//!
//! [`SyncStore::load_with`] fills a buffer (up to 1 MiB, one per thread)
//! that the restore verifies in place, then stores it through the normal
//! write path (so pages are classified and compressed as on any write).

use std::cell::RefCell;
use std::io;
use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use super::page::{self, PageError, PAGE_BYTES};
use super::shard::{Shard, GROUP_PAGES};
use super::table::Entry;
use super::{corrupt, locate, CompressedStore, Inner};
use crate::block::backend::{Backend, Result};
use crate::store::cut::SideCopy;
use crate::store::{CapturedChunk, SyncCut, SyncStore};

/// Most bytes one `load_with` call stores.
const LOAD_MAX_BYTES: usize = 1 << 20;

/// One page of a group as a cut saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// A hole (reads as zero).
    Hole,
    /// Every 8-byte word is this one.
    Same(u64),
    /// The raw page: bytes `[at, at+4096)` of the copy.
    Raw { at: u32 },
    /// Compressed bytes `[at, at+len)` of the copy, by `codec`.
    Stored { at: u32, len: u16, codec: u8 },
}

/// Pre-cut pages of one page group, copied as they are stored.
#[derive(Debug)]
pub(super) struct CapturedGroup {
    /// Global group index (drive offset / 64 KiB).
    group: u64,
    /// Pages of the group that changed before the cut (bit i = page i).
    mask: u16,
    /// Per page of `mask`, what it held.
    kept: [Kept; GROUP_PAGES],
    /// The stored objects, back to back.
    bytes: Vec<u8>,
}

impl SideCopy for CapturedGroup {
    fn charged_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }
}

/// Shard `si` and the shard-local page of page `i` of group `g`.
fn local_page(g: u64, i: usize) -> (usize, u32) {
    locate(g * GROUP_PAGES as u64 + i as u64)
}

impl CapturedGroup {
    /// Copies the `mask` pages of group `g` out of `shard` (its lock held).
    fn copy(store: &Inner, shard: &Shard, g: u64, mask: u16) -> CapturedGroup {
        let mut c = CapturedGroup {
            group: g,
            mask,
            kept: [Kept::Hole; GROUP_PAGES],
            bytes: Vec::new(),
        };
        for i in (0..GROUP_PAGES).filter(|i| mask & (1 << i) != 0) {
            let at = c.bytes.len() as u32;
            c.kept[i] = match shard.entry(local_page(g, i).1) {
                Entry::Hole => Kept::Hole,
                Entry::Same(w) => Kept::Same(w),
                Entry::Raw(p) => {
                    // SAFETY: a raw page belongs to its entry alone, and
                    // the caller holds the shard's lock.
                    c.bytes.extend_from_slice(unsafe { p.bytes() });
                    Kept::Raw { at }
                }
                Entry::Stored(o) => {
                    store
                        .pool
                        .read(o.class as usize, o.id, o.len as usize, |b| {
                            c.bytes.extend_from_slice(b)
                        });
                    Kept::Stored {
                        at,
                        len: o.len,
                        codec: o.codec,
                    }
                }
            };
        }
        c
    }

    /// The raw pages the engine saves (zero pages as zero).
    fn unpack(&self, store: &Inner) -> std::result::Result<CapturedChunk, PageError> {
        let mut out = CapturedChunk {
            chunk: self.group,
            mask: self.mask,
            data_mask: 0,
            data: Vec::with_capacity(self.mask.count_ones() as usize * PAGE_BYTES),
        };
        for (i, k) in self.kept.iter().enumerate() {
            if self.mask & (1 << i) == 0 {
                continue;
            }
            let at = out.data.len();
            match *k {
                Kept::Hole | Kept::Same(0) => continue,
                Kept::Same(w) => {
                    out.data.resize(at + PAGE_BYTES, 0);
                    page::fill_same(w, 0, &mut out.data[at..]);
                }
                Kept::Raw { at: from } => {
                    let from = from as usize;
                    out.data
                        .extend_from_slice(&self.bytes[from..from + PAGE_BYTES]);
                }
                Kept::Stored {
                    at: from,
                    len,
                    codec,
                } => {
                    let src = &self.bytes[from as usize..from as usize + len as usize];
                    out.data.resize(at + PAGE_BYTES, 0);
                    page::unpack(store.codec(codec), src, &mut out.data[at..])?;
                }
            }
            out.data_mask |= 1 << i;
        }
        Ok(out)
    }
}

impl Inner {
    /// Called by a change holding the exclusive lock of group `g`'s shard
    /// while cut `e` runs: saves the group's pre-cut dirty pages unless
    /// that already happened. False: no memory for the copy, so the caller
    /// releases the lock and waits for the walk to capture the group.
    pub(super) fn cow_group(&self, shard: &Shard, g: u64, e: u32) -> bool {
        if self.marks.epoch(g) >= e {
            return true;
        }
        let mask = self.marks.dirty_mask(g);
        if mask != 0 {
            let copy = CapturedGroup::copy(self, shard, g, mask);
            if !self.cut.charge(&self.mem.global, copy.charged_bytes()) {
                return false;
            }
            // Inserted before the bits are cleared: the walk reads bits,
            // then the side table, so it sees the group in one of them.
            let clear = || self.marks.take_mask(g, mask);
            if !self.cut.insert(&self.mem.global, e, g, copy, clear) {
                // The cut ended meanwhile: the pages stay dirty.
                return true;
            }
        }
        self.marks.set_epoch(g, e);
        true
    }
}

/// A running cut of a compressed drive (see the module docs). Dropping it
/// without [`SyncCut::finish`] aborts: every page it handed out is marked
/// dirty again.
pub struct CompressedCut<'a> {
    store: &'a Inner,
    /// Holds resizes (and other cuts) off while this one runs.
    _resize_guard: MutexGuard<'a, ()>,
    epoch: u32,
    size_bytes: u64,
    min_size_bytes: u64,
    /// Groups covering the drive at the cut.
    groups: u64,
    /// The walk's position.
    next_group: u64,
    /// (group, mask) of everything handed out, to re-mark dirty on abort.
    captured: Vec<(u64, u16)>,
    finished: bool,
}

impl CompressedCut<'_> {
    /// Captures group `g` from memory if no writer did; else takes the
    /// writer's copy. None when the group holds nothing to save.
    fn take_group(&self, g: u64) -> Option<CapturedGroup> {
        let s = self.store;
        let shard = s.shard(local_page(g, 0).0).read();
        if s.marks.epoch(g) < self.epoch {
            let mask = s.marks.dirty_mask(g);
            s.marks.take_mask(g, mask);
            s.marks.set_epoch(g, self.epoch);
            return (mask != 0).then(|| CapturedGroup::copy(s, &shard, g, mask));
        }
        drop(shard);
        s.cut.take(&s.mem.global, g)
    }

    /// The first group at or after `from` with dirty bits or a copy aside
    /// (bits read first, see the module docs).
    fn next_candidate(&self, from: u64) -> Option<u64> {
        let bits = self
            .store
            .marks
            .next_dirty(from)
            .filter(|&g| g < self.groups);
        let side = self.store.cut.first_copy_from(from);
        match (bits, side) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn hand_out(&mut self, c: CapturedGroup) -> Result<Option<CapturedChunk>> {
        self.captured.push((c.group, c.mask));
        c.unpack(self.store).map(Some).map_err(corrupt)
    }
}

impl SyncCut for CompressedCut<'_> {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn min_size_bytes(&self) -> u64 {
        self.min_size_bytes
    }

    fn next_chunk(&mut self) -> Result<Option<CapturedChunk>> {
        let cut = &self.store.cut;
        loop {
            while let Some(g) = cut.pop_urgent() {
                let got = (g < self.groups).then(|| self.take_group(g)).flatten();
                cut.notify_captured();
                if let Some(c) = got {
                    return self.hand_out(c);
                }
            }
            let Some(g) = self.next_candidate(self.next_group) else {
                return Ok(None);
            };
            self.next_group = g + 1;
            if let Some(c) = self.take_group(g) {
                return self.hand_out(c);
            }
        }
    }

    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for CompressedCut<'_> {
    fn drop(&mut self) {
        let s = self.store;
        // Copies never handed out (a change that began before the cut and
        // marked its page only after the walk passed, then captured by a
        // later writer) go to the next cut, as in the raw store.
        let mut unsaved: Vec<(u64, u16)> = s
            .cut
            .end(&s.mem.global)
            .iter()
            .map(|c| (c.group, c.mask))
            .collect();
        if !self.finished {
            s.min_size.fetch_min(self.min_size_bytes, Ordering::AcqRel);
            unsaved.append(&mut self.captured);
        }
        for (g, mask) in unsaved {
            s.marks.set_mask(g, mask);
        }
        if self.finished {
            // Saved: what this cut took is on disk, what it did not is
            // dirty again (above), so a kept drive's ledger forgets its
            // pending pages and the smaller sizes before this cut.
            s.marks.saved(self.size_bytes);
        }
    }
}

impl SyncStore for CompressedStore {
    type Cut<'a> = CompressedCut<'a>;

    fn cut(&self) -> CompressedCut<'_> {
        self.inner.cut()
    }
    fn dirty_pages(&self) -> u64 {
        self.inner.dirty_pages()
    }
    fn clear_dirty(&self) {
        self.inner.clear_dirty()
    }
    fn cut_copy_bytes(&self) -> u64 {
        self.inner.cut_copy_bytes()
    }
    fn note_committing(&self, gen: u64) {
        self.inner.note_committing(gen)
    }
    fn note_committed(&self, gen: u64) {
        self.inner.note_committed(gen)
    }
    fn note_directory(&self, id: [u8; 16]) {
        self.inner.note_directory(id)
    }
    fn kept_directory(&self) -> Option<[u8; 16]> {
        self.inner.kept_directory()
    }
    fn kept_generations(&self) -> Option<(u64, u64)> {
        self.inner.kept_generations()
    }
    fn load_threads(&self) -> usize {
        self.inner.load_threads()
    }
    fn resize(&self, size_bytes: u64) -> Result<()> {
        self.inner.resize(size_bytes)
    }
    fn load_with(
        &self,
        offset: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> Result<usize> {
        self.inner.load_with(offset, len, fill)
    }
}

thread_local! {
    /// This thread's restore buffer (the load threads reuse theirs).
    static LOAD_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl SyncStore for Inner {
    type Cut<'a> = CompressedCut<'a>;

    fn cut(&self) -> CompressedCut<'_> {
        let resize_guard = self.resize_lock.lock();
        let size = self.size();
        let min_size = self.min_size.swap(size, Ordering::AcqRel).min(size);
        let groups = size.div_ceil(super::GROUP_BYTES);
        // The cut.
        let epoch = self.cut.begin();
        CompressedCut {
            store: self,
            _resize_guard: resize_guard,
            epoch,
            size_bytes: size,
            min_size_bytes: min_size,
            groups,
            next_group: 0,
            captured: Vec::new(),
            finished: false,
        }
    }

    fn dirty_pages(&self) -> u64 {
        self.marks.count()
    }

    fn clear_dirty(&self) {
        self.min_size.store(self.size(), Ordering::Release);
        self.marks.clear_all(self.size());
    }

    fn cut_copy_bytes(&self) -> u64 {
        self.cut.copy_bytes()
    }

    fn note_committing(&self, gen: u64) {
        if let Some(l) = self.marks.ledger() {
            l.set_committing(gen);
        }
    }

    fn note_committed(&self, gen: u64) {
        if let Some(l) = self.marks.ledger() {
            l.set_committed(gen);
        }
    }

    fn note_directory(&self, id: [u8; 16]) {
        if let Some(l) = self.marks.ledger() {
            l.set_directory(id);
        }
    }

    fn kept_directory(&self) -> Option<[u8; 16]> {
        self.marks.ledger().map(|l| l.directory())
    }

    fn kept_generations(&self) -> Option<(u64, u64)> {
        self.marks.ledger().map(|l| l.generations())
    }

    /// A restore is bound by compressing the pages again: one load thread
    /// per core (at least two, at most eight).
    fn load_threads(&self) -> usize {
        std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8))
    }

    fn resize(&self, size_bytes: u64) -> Result<()> {
        Inner::resize(self, size_bytes)
    }

    fn load_with(
        &self,
        offset: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> Result<usize> {
        let n = len.min(LOAD_MAX_BYTES);
        LOAD_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            buf.resize(n, 0);
            fill(&mut buf[..n])?;
            self.write(offset, &buf[..n], false)?;
            Ok(n)
        })
    }
}

// A group is a raw store's chunk: the engine's units are the same.
const _: () = assert!(GROUP_PAGES == crate::store::PAGES_PER_CHUNK);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::compressed::Algorithm;
    use crate::store::MemoryBudget;
    use std::sync::Arc;

    fn store_with(size: u64, global: Arc<MemoryBudget>) -> CompressedStore {
        CompressedStore::new(size, Algorithm::Lz4, None, global).unwrap()
    }

    /// A compressible page that differs by `tag`.
    fn page(tag: u8) -> Vec<u8> {
        let mut v: Vec<u8> = b"a compressed page for the sync cut "
            .iter()
            .cycle()
            .take(PAGE_BYTES)
            .copied()
            .collect();
        v[0] = tag;
        v
    }

    /// Every (page, contents) the cut yields, zero pages as None.
    fn collect(cut: &mut CompressedCut<'_>) -> Vec<(u64, Option<Vec<u8>>)> {
        let mut out = Vec::new();
        while let Some(c) = cut.next_chunk().unwrap() {
            for (p, d) in c.pages() {
                out.push((p, d.map(|d| d.to_vec())));
            }
        }
        out.sort_by_key(|(p, _)| *p);
        out
    }

    #[test]
    fn a_cut_yields_pre_cut_contents_despite_overwrites() {
        let s = store_with(1 << 20, Arc::new(MemoryBudget::new(u64::MAX)));
        s.write(0, &page(1), false).unwrap();
        s.write(20 * 4096, &page(2), false).unwrap();
        s.write(21 * 4096, &[3; 4096], false).unwrap();
        s.write_zeroes(40 * 4096, 4096, false).unwrap();
        assert_eq!(s.dirty_pages(), 4);
        let mut cut = s.cut();
        // After the cut: an overwrite of an unsaved page (copied aside,
        // compressed), a trim, a new page.
        s.write(20 * 4096, &page(9), false).unwrap();
        s.trim(21 * 4096, 4096).unwrap();
        s.write(30 * 4096, &[7; 10], false).unwrap();
        assert!(s.cut_copy_bytes() > 0 && s.cut_copy_bytes() < 4096);
        let got = collect(&mut cut);
        cut.finish();
        assert_eq!(
            got,
            vec![
                (0, Some(page(1))),
                (20, Some(page(2))),
                (21, Some(vec![3; 4096])),
                (40, None)
            ]
        );
        assert_eq!(s.cut_copy_bytes(), 0);
        let mut cut = s.cut();
        let got = collect(&mut cut);
        cut.finish();
        let mut p30 = vec![0; 4096];
        p30[..10].fill(7);
        assert_eq!(got, vec![(20, Some(page(9))), (21, None), (30, Some(p30))]);
        s.check().unwrap();
    }

    #[test]
    fn an_aborted_cut_hands_everything_to_the_next() {
        let s = store_with(1 << 20, Arc::new(MemoryBudget::new(u64::MAX)));
        for p in [0u64, 17, 33, 100] {
            s.write(p * 4096, &page(p as u8), false).unwrap();
        }
        let mut cut = s.cut();
        assert_eq!(cut.next_chunk().unwrap().unwrap().chunk, 0);
        s.write(100 * 4096, &page(0xEE), false).unwrap(); // copied aside
        drop(cut);
        let mut cut = s.cut();
        let got = collect(&mut cut);
        cut.finish();
        let pages: Vec<u64> = got.iter().map(|(p, _)| *p).collect();
        assert_eq!(pages, vec![0, 17, 33, 100]);
        assert_eq!(got[3].1.as_deref(), Some(&page(0xEE)[..]));
        assert_eq!(s.cut_copy_bytes(), 0);
    }

    #[test]
    fn a_writer_without_memory_for_a_copy_waits_for_the_cut() {
        // No room for a copy above the margin: every writer must wait.
        let global = Arc::new(MemoryBudget::new(1 << 20));
        let s = Arc::new(store_with(1 << 20, global.clone()));
        s.write(0, &page(1), false).unwrap();
        s.write(48 * 4096, &page(2), false).unwrap();
        s.write(49 * 4096, &page(3), false).unwrap();
        let mut cut = s.cut();
        std::thread::scope(|sc| {
            let s2 = s.clone();
            let w = sc.spawn(move || {
                let mut two = page(9);
                two.extend_from_slice(&page(9));
                s2.write(48 * 4096, &two, false).unwrap()
            });
            let got = collect(&mut cut);
            w.join().unwrap();
            assert_eq!(
                got,
                vec![(0, Some(page(1))), (48, Some(page(2))), (49, Some(page(3)))]
            );
        });
        cut.finish();
        let mut back = vec![0; 4096];
        s.read(49 * 4096, &mut back).unwrap();
        assert_eq!(back, page(9));
        assert_eq!(s.cut_copy_bytes(), 0);
        s.check().unwrap();
    }

    #[test]
    fn shrinks_are_remembered_until_the_next_cut() {
        let s = store_with(1 << 20, Arc::new(MemoryBudget::new(u64::MAX)));
        s.write(0, &page(1), false).unwrap();
        s.write(200 * 4096, &page(2), false).unwrap();
        s.clear_dirty();
        SyncStore::resize(&s, 10 * 4096 + 100).unwrap();
        SyncStore::resize(&s, 1 << 20).unwrap();
        let mut cut = s.cut();
        assert_eq!(cut.size_bytes(), 1 << 20);
        assert_eq!(cut.min_size_bytes(), 10 * 4096 + 100);
        // Only the page holding the old end changed; page 200 is gone.
        assert!(collect(&mut cut).is_empty());
        cut.finish();
        assert_eq!(s.cut().min_size_bytes(), 1 << 20);
    }
}
