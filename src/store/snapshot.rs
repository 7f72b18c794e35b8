//! Point-in-time snapshots of the dirty set, taken without stalling writers.
//!
//! A sync must save *one* moment of the drive: the pages changed since the
//! previous sync, each with the contents it had at the cut, even though
//! writers keep running while the sync copies pages out and writes them to
//! disk. We do this with copy-on-write at chunk granularity:
//!
//! ```text
//!  sync thread                                  writer (chunk c, exclusive lock)
//!  ───────────                                  ─────────────────────────────────
//!  begin: epoch E := last + 1                   e := active epoch (one atomic load)
//!         active := E   ◄── the cut T           if e != 0 and chunk_epoch[c] < e:
//!  walk chunks with dirty bits or a                 copy c's dirty pages aside (side table)
//!  side-table entry, ascending:                     clear their dirty bits
//!    lock c shared                                  chunk_epoch[c] := e
//!    chunk_epoch[c] < E ? take c's dirty         write; set dirty bits (for the next sync)
//!       pages from memory, epoch := E
//!    else take c's side-table entry
//!  finish: active := 0   (abort: re-mark every captured page dirty)
//! ```
//!
//! # Why the cut is linearizable
//!
//! Every change to a chunk happens under that chunk's exclusive lock, and the
//! decision "is this change in snapshot E?" is taken under the same lock: a
//! change is *in* iff it happened before the chunk was *captured* for E
//! (its dirty pages taken, `chunk_epoch[c] := E`), either by the sync thread
//! or by the first writer that saw `active == E`. Captures happen after T.
//!
//! - A change that observes `active == E` captures the chunk first, so it is
//!   *out*; every change that starts after it completes (in real time, so
//!   after it in happens-before) also observes `active == E` (or a later
//!   snapshot) and is out too.
//! - A change that is *in* happened before its chunk's capture and is the
//!   whole of that change within the chunk (dirty bits are set under the
//!   same lock hold as the bytes). Everything it depends on completed before
//!   it started, and so also is in: those changes set their dirty bits
//!   before T or captured nothing.
//!
//! So the set of included changes is closed under "happened before": it is a
//! consistent cut, a state the drive really had in a linearization of its
//! chunk-level operations. A request that spans several chunks and runs
//! concurrently with the cut may land on either side per chunk, exactly as a
//! disk with a volatile cache may persist part of an unacknowledged write;
//! requests completed before `begin` are wholly in, requests started after
//! it are wholly out.
//!
//! The walk never misses a chunk: a writer that captures a chunk inserts its
//! side-table entry *before* clearing the chunk's dirty bits, and the walk
//! reads the bitmap before it looks at the side table, so a chunk's pre-cut
//! pages are always visible in one or the other.
//!
//! # Costs and bounds
//!
//! - No sync running: one relaxed-cost atomic load per chunk a change
//!   touches. No drive-wide lock, ever.
//! - During a sync: the first change to a chunk whose pre-cut dirty pages are
//!   still unsaved copies those pages (at most 64 KiB) aside. The copies are
//!   charged to the daemon's memory budget but never take its last
//!   `COPY_MARGIN_BYTES` (kept for writes that need new pages, so a running
//!   sync never makes a write fail with ENOSPC); without that room the writer
//!   instead asks the sync thread to capture that chunk next and waits for it
//!   (it holds no lock while it waits).
//! - The sync thread holds one chunk lock at a time, shared (readers go on),
//!   for one copy of at most 64 KiB.
//! - One snapshot at a time: a snapshot holds the store's resize lock, so a
//!   resize waits for a running sync to end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::MutexGuard;

pub use super::cut::COPY_MARGIN_BYTES;
use super::cut::{CutState, SideCopy};
use super::{Segment, StoreState, CHUNKS_PER_SEGMENT, CHUNK_BYTES, PAGE_BYTES, SEGMENT_BYTES};

/// Pages per chunk (16): a chunk's dirty bits fit a `u16`.
pub const PAGES_PER_CHUNK: usize = (CHUNK_BYTES / PAGE_BYTES) as usize;

/// Pre-cut pages of one chunk, copied out of the drive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapturedChunk {
    /// Global index of the chunk (drive offset / 64 KiB).
    pub chunk: u64,
    /// Pages of the chunk that changed before the cut (bit i = page i).
    pub mask: u16,
    /// Of those, the pages holding non-zero bytes; the others read as zero.
    pub data_mask: u16,
    /// The `data_mask` pages, 4 KiB each, in ascending order.
    pub data: Vec<u8>,
}

impl CapturedChunk {
    /// First page (global index) of the chunk.
    pub fn first_page(&self) -> u64 {
        self.chunk * PAGES_PER_CHUNK as u64
    }

    /// Bytes of page data held.
    pub fn data_bytes(&self) -> u64 {
        self.data.len() as u64
    }

    /// The saved pages in order: (global page index, Some(bytes) or None for
    /// a zero page).
    pub fn pages(&self) -> impl Iterator<Item = (u64, Option<&[u8]>)> + '_ {
        let page = PAGE_BYTES as usize;
        let mut at = 0;
        (0..PAGES_PER_CHUNK).filter_map(move |i| {
            if self.mask & (1 << i) == 0 {
                return None;
            }
            let p = self.first_page() + i as u64;
            if self.data_mask & (1 << i) != 0 {
                let d = &self.data[at..at + page];
                at += page;
                Some((p, Some(d)))
            } else {
                Some((p, None))
            }
        })
    }
}

impl SideCopy for CapturedChunk {
    fn charged_bytes(&self) -> u64 {
        self.data_bytes()
    }
}

/// The store's snapshot state: the shared cut bookkeeping (`cut.rs`) over
/// copies of whole chunks.
pub(super) type SnapState = CutState<CapturedChunk>;

/// What a writer must do before changing a chunk.
pub(super) enum CowOutcome {
    /// Go ahead: nothing to save, or the pre-cut pages were copied aside.
    Proceed,
    /// No memory for a copy: release the chunk lock, call
    /// [`StoreState::wait_captured`], and take the lock again.
    Wait,
}

/// Copies the pages of `mask` in chunk `ci` of `seg` out of memory.
/// Caller holds the chunk's lock (shared or exclusive).
fn copy_pages(seg: &Segment, ci: usize, chunk: u64, mask: u16) -> CapturedChunk {
    let page = PAGE_BYTES as usize;
    let first = ci * PAGES_PER_CHUNK;
    let mut out = CapturedChunk {
        chunk,
        mask,
        data_mask: 0,
        data: Vec::with_capacity(mask.count_ones() as usize * page),
    };
    for i in 0..PAGES_PER_CHUNK {
        let p = first + i;
        if mask & (1 << i) == 0 || seg.is_hole(p) {
            continue;
        }
        let at = out.data.len();
        out.data.resize(at + page, 0);
        // SAFETY: page `p` lies inside the segment; the caller holds the
        // chunk's lock, so no writer changes it while we copy; the
        // destination is our own buffer of exactly one page.
        unsafe {
            std::ptr::copy_nonoverlapping(
                seg.region.ptr(p * page),
                out.data[at..].as_mut_ptr(),
                page,
            )
        };
        if out.data[at..].iter().all(|&b| b == 0) {
            out.data.truncate(at);
        } else {
            out.data_mask |= 1 << i;
        }
    }
    out
}

impl StoreState {
    /// Called by a writer holding chunk `ci`'s exclusive lock (global index
    /// `chunk`) when `active == e != 0`: saves the chunk's pre-cut pages for
    /// snapshot `e` unless that already happened.
    pub(super) fn cow_chunk(&self, seg: &Segment, ci: usize, chunk: u64, e: u32) -> CowOutcome {
        if seg.epochs[ci].load(Ordering::Acquire) >= e {
            return CowOutcome::Proceed;
        }
        let start = ci * PAGES_PER_CHUNK;
        let mask = seg.dirty.bits16(start);
        if mask == 0 {
            seg.epochs[ci].store(e, Ordering::Release);
            return CowOutcome::Proceed;
        }
        let captured = copy_pages(seg, ci, chunk, mask);
        // Copies never take the budget's last COPY_MARGIN_BYTES: that room
        // stays for writes that need new pages, which must not fail with
        // ENOSPC just because a sync runs.
        if !self.snap.charge(&self.global_mem, captured.data_bytes()) {
            return CowOutcome::Wait;
        }
        // Inserted before the bits are cleared: the walk reads bits, then
        // the side table, so it always sees the chunk in one of them.
        let clear = || seg.take_dirty_bits16(start, mask);
        if !self
            .snap
            .insert(&self.global_mem, e, chunk, captured, clear)
        {
            // The snapshot ended meanwhile: the pages stay dirty for the
            // next one.
            return CowOutcome::Proceed;
        }
        seg.epochs[ci].store(e, Ordering::Release);
        CowOutcome::Proceed
    }

    /// `cow_chunk` for every chunk of segment `seg_index` that `[so, so+n)`
    /// touches (their exclusive locks held). Returns the first chunk whose
    /// pages could not be copied: the caller releases its locks and waits
    /// for it with `wait_captured`, then tries again.
    pub(super) fn cow_span(
        &self,
        seg: &Segment,
        so: usize,
        n: usize,
        seg_index: u64,
    ) -> Option<(usize, u64, u32)> {
        let chunk = CHUNK_BYTES as usize;
        for ci in so / chunk..(so + n).div_ceil(chunk) {
            let e = self.snap.active();
            if e == 0 {
                return None;
            }
            let global = seg_index * CHUNKS_PER_SEGMENT as u64 + ci as u64;
            if let CowOutcome::Wait = self.cow_chunk(seg, ci, global, e) {
                return Some((ci, global, e));
            }
        }
        None
    }

    /// Asks the sync thread to capture `chunk` next and waits until it has
    /// (or the snapshot `e` ended). Called with no chunk lock held.
    pub(super) fn wait_captured(&self, seg: &Segment, ci: usize, chunk: u64, e: u32) {
        self.snap
            .wait_captured(chunk, e, || seg.epochs[ci].load(Ordering::Acquire) >= e);
    }

    /// Bytes of pre-cut pages copied aside for the running sync (0 when none).
    pub fn snapshot_copy_bytes(&self) -> u64 {
        self.snap.copy_bytes()
    }

    /// Starts a point-in-time snapshot of the pages changed since the last
    /// finished snapshot (or since the drive was created / `take_dirty`).
    /// Blocks while another snapshot or a resize runs. See the module docs.
    pub fn snapshot(&self) -> Snapshot<'_> {
        let resize_guard = self.resize_lock.lock();
        let segs = self.segments.load_full();
        let size = self.size();
        let min_size = self.min_size.swap(size, Ordering::AcqRel).min(size);
        // The cut.
        let epoch = self.snap.begin();
        Snapshot {
            state: self,
            _resize_guard: resize_guard,
            segs,
            epoch,
            size_bytes: size,
            min_size_bytes: min_size,
            next_chunk: 0,
            captured: Vec::new(),
            finished: false,
        }
    }
}

/// A running snapshot: yields the pre-cut contents of every page changed
/// since the previous snapshot, chunk by chunk. Dropping it without
/// [`Snapshot::finish`] aborts: every page it handed out is marked dirty
/// again so the next snapshot saves it.
pub struct Snapshot<'a> {
    state: &'a StoreState,
    /// Holds resizes (and other snapshots) off while this one runs.
    _resize_guard: MutexGuard<'a, ()>,
    /// The segment table at the cut (stable: resizes are held off).
    segs: Arc<Vec<Arc<Segment>>>,
    /// This snapshot's epoch.
    epoch: u32,
    /// Drive size at the cut.
    size_bytes: u64,
    /// Smallest size since the previous snapshot (<= `size_bytes`).
    min_size_bytes: u64,
    /// The walk's position (global chunk index).
    next_chunk: u64,
    /// (chunk, mask) of everything handed out, to re-mark dirty on abort.
    captured: Vec<(u64, u16)>,
    /// Set by `finish`.
    finished: bool,
}

impl Snapshot<'_> {
    /// The drive size at the cut.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The smallest the drive was since the previous snapshot: bytes from
    /// here to `size_bytes` read as zero unless a saved page says otherwise.
    pub fn min_size_bytes(&self) -> u64 {
        self.min_size_bytes
    }

    /// This snapshot's epoch (1, 2, ...; unique per store).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    fn seg_of(&self, chunk: u64) -> (&Segment, usize) {
        let seg = &self.segs[(chunk / CHUNKS_PER_SEGMENT as u64) as usize];
        (seg, (chunk % CHUNKS_PER_SEGMENT as u64) as usize)
    }

    fn n_chunks(&self) -> u64 {
        self.segs.len() as u64 * CHUNKS_PER_SEGMENT as u64
    }

    /// Captures `chunk` from memory if no writer did; else takes the
    /// writer's copy. Returns None when the chunk holds nothing to save.
    fn take_chunk(&self, chunk: u64) -> Option<CapturedChunk> {
        let (seg, ci) = self.seg_of(chunk);
        let _lock = seg.locks[ci].read();
        if seg.epochs[ci].load(Ordering::Acquire) < self.epoch {
            let start = ci * PAGES_PER_CHUNK;
            let mask = seg.dirty.bits16(start);
            seg.take_dirty_bits16(start, mask);
            seg.epochs[ci].store(self.epoch, Ordering::Release);
            return (mask != 0).then(|| copy_pages(seg, ci, chunk, mask));
        }
        self.state.snap.take(&self.state.global_mem, chunk)
    }

    /// First chunk at or after `from` that has dirty bits or a side-table
    /// entry. Bits are read before the side table (see module docs).
    fn next_candidate(&self, from: u64) -> Option<u64> {
        let n = self.n_chunks();
        let mut from_bits = None;
        let mut c = from;
        while c < n {
            let (seg, ci) = self.seg_of(c);
            let p0 = ci * PAGES_PER_CHUNK;
            let p = seg.dirty.find(p0, seg.dirty.len(), true);
            if p < seg.dirty.len() {
                let seg_first = c - ci as u64;
                from_bits = Some(seg_first + (p / PAGES_PER_CHUNK) as u64);
                break;
            }
            c = c - ci as u64 + CHUNKS_PER_SEGMENT as u64;
        }
        let from_side = self.state.snap.first_copy_from(from);
        match (from_bits, from_side) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next chunk of pre-cut pages, or None when the snapshot is
    /// complete. Chunks come in ascending order, except chunks a writer
    /// asked for urgently (it had no memory for a copy), which come first.
    pub fn next_chunk(&mut self) -> Option<CapturedChunk> {
        loop {
            while let Some(chunk) = self.state.snap.pop_urgent() {
                let got = if chunk < self.n_chunks() {
                    self.take_chunk(chunk)
                } else {
                    None
                };
                self.state.snap.notify_captured();
                if let Some(c) = got {
                    self.captured.push((c.chunk, c.mask));
                    return Some(c);
                }
            }
            let chunk = self.next_candidate(self.next_chunk)?;
            self.next_chunk = chunk + 1;
            if let Some(c) = self.take_chunk(chunk) {
                self.captured.push((c.chunk, c.mask));
                return Some(c);
            }
        }
    }

    /// Ends the snapshot successfully: everything handed out is saved.
    /// Call only after `next_chunk` returned None.
    pub fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for Snapshot<'_> {
    fn drop(&mut self) {
        // End the snapshot under the shared lock: a writer inserts its copy
        // only while the snapshot it saw is still active (see `cow_chunk`).
        let side = self.state.snap.end(&self.state.global_mem);
        // Copies still in the side table were never handed out. Even after
        // a complete walk there can be some: a change that began before the
        // cut may set its dirty bits only after the walk passed its chunk
        // (so it is out of this snapshot), and a later writer may then
        // capture those bits. Their pages go to the next snapshot, like
        // the change's bits would have had no writer captured them.
        let mut unsaved: Vec<(u64, u16)> = side.iter().map(|c| (c.chunk, c.mask)).collect();
        if !self.finished {
            self.state
                .min_size
                .fetch_min(self.min_size_bytes, Ordering::AcqRel);
            // Abort: everything this snapshot handed out is saved by the
            // next one instead.
            unsaved.append(&mut self.captured);
        }
        for (chunk, mask) in unsaved {
            let (seg, ci) = self.seg_of(chunk);
            seg.dirty.set_bits16(ci * PAGES_PER_CHUNK, mask);
        }
        if self.finished {
            // Saved: what this cut took is on disk, what it did not is
            // dirty again (above), so a shared store's ledger forgets its
            // pending pages and the smaller sizes before this cut.
            for seg in self.segs.iter() {
                seg.clear_pending();
            }
            if let Some(s) = &self.state.shared {
                s.ledger.note_saved(self.size_bytes);
            }
        }
    }
}

/// Size of a segment's worth of chunk epochs, for metadata accounting.
pub(super) const EPOCH_BYTES_PER_SEGMENT: u64 =
    (CHUNKS_PER_SEGMENT * std::mem::size_of::<AtomicU32>()) as u64;

const _: () = assert!(SEGMENT_BYTES % CHUNK_BYTES == 0 && PAGES_PER_CHUNK == 16);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryBudget, RamStore, StoreOptions};

    fn store_with(size: u64, global: Arc<MemoryBudget>) -> RamStore {
        let opts = StoreOptions {
            mem_limit_bytes: None,
            prefault: false,
            ..StoreOptions::default()
        };
        RamStore::with_options(size, opts, global).unwrap()
    }

    fn store(size: u64) -> RamStore {
        store_with(size, Arc::new(MemoryBudget::new(u64::MAX)))
    }

    /// Every (page, contents) the snapshot yields, zero pages as None.
    fn collect(snap: &mut Snapshot<'_>) -> Vec<(u64, Option<Vec<u8>>)> {
        let mut out = Vec::new();
        while let Some(c) = snap.next_chunk() {
            for (p, d) in c.pages() {
                out.push((p, d.map(|d| d.to_vec())));
            }
        }
        out.sort_by_key(|(p, _)| *p);
        out
    }

    use crate::block::backend::Backend;

    #[test]
    fn snapshot_yields_pre_cut_contents_despite_overwrites() {
        let s = store(1 << 20);
        s.write(0, &[1; 4096], false).unwrap();
        s.write(20 * 4096, &[2; 4096], false).unwrap();
        s.write_zeroes(40 * 4096, 4096, false).unwrap();
        let mut snap = s.snapshot();
        // Overwrite both pages after the cut, one before the walk reaches
        // it (copy-on-write), and write a new page.
        s.write(20 * 4096, &[9; 4096], false).unwrap();
        s.write(30 * 4096, &[7; 10], false).unwrap();
        let got = collect(&mut snap);
        snap.finish();
        assert_eq!(
            got,
            vec![
                (0, Some(vec![1; 4096])),
                (20, Some(vec![2; 4096])),
                (40, None)
            ]
        );
        assert_eq!(s.snapshot_copy_bytes(), 0);
        // The next snapshot holds exactly the post-cut changes.
        let mut snap = s.snapshot();
        let got = collect(&mut snap);
        snap.finish();
        let mut p30 = vec![0; 4096];
        p30[..10].fill(7);
        assert_eq!(got, vec![(20, Some(vec![9; 4096])), (30, Some(p30))]);
    }

    #[test]
    fn aborted_snapshot_hands_everything_to_the_next() {
        let s = store(1 << 20);
        for p in [0u64, 17, 33, 100] {
            s.write(p * 4096, &[p as u8 + 1; 4096], false).unwrap();
        }
        let mut snap = s.snapshot();
        let first = snap.next_chunk().unwrap();
        assert_eq!(first.chunk, 0);
        s.write(100 * 4096, &[0xEE; 4096], false).unwrap(); // copied aside
        drop(snap); // abort
        let mut snap = s.snapshot();
        let got = collect(&mut snap);
        snap.finish();
        let pages: Vec<u64> = got.iter().map(|(p, _)| *p).collect();
        assert_eq!(pages, vec![0, 17, 33, 100]);
        assert_eq!(got[3].1.as_deref(), Some(&[0xEE; 4096][..]));
        assert_eq!(s.snapshot_copy_bytes(), 0);
    }

    /// A change that began before the cut but set its dirty bits after the
    /// walk passed its chunk, captured by a later writer: the complete
    /// snapshot does not hold it, so the next one must (its bits were
    /// cleared by the capture and must come back).
    #[test]
    fn late_pre_cut_change_captured_behind_the_walk_goes_to_the_next_snapshot() {
        let s = store(1 << 20);
        s.write(0, &[1; 4096], false).unwrap();
        s.write(3 * CHUNK_BYTES, &[2; 4096], false).unwrap();
        let mut snap = s.snapshot();
        assert_eq!(snap.next_chunk().unwrap().chunk, 0);
        assert_eq!(snap.next_chunk().unwrap().chunk, 3);
        // The late change: bytes and bits land in chunk 1, behind the walk,
        // as a write that loaded `active == 0` before the cut would.
        {
            let seg = &snap.segs[0];
            let _lock = seg.locks[1].write();
            let page = (CHUNK_BYTES / PAGE_BYTES) as usize;
            // SAFETY: page 16 lies in the segment and its chunk lock is held.
            unsafe { std::ptr::write_bytes(seg.region.ptr(page * 4096), 5, 4096) };
            seg.allocated.set(page);
            seg.dirty.set(page);
        }
        // A post-cut writer to another page of chunk 1 captures it.
        s.write(CHUNK_BYTES + 4096, &[6; 4096], false).unwrap();
        assert!(snap.next_chunk().is_none());
        snap.finish();
        assert_eq!(s.snapshot_copy_bytes(), 0);
        let mut snap = s.snapshot();
        let got = collect(&mut snap);
        snap.finish();
        assert_eq!(
            got,
            vec![(16, Some(vec![5; 4096])), (17, Some(vec![6; 4096]))]
        );
    }

    #[test]
    fn trims_after_the_cut_do_not_reach_the_snapshot() {
        let s = store(1 << 20);
        s.write(5 * 4096, &[3; 8192], false).unwrap();
        let mut snap = s.snapshot();
        s.trim(5 * 4096, 8192).unwrap();
        let got = collect(&mut snap);
        snap.finish();
        assert_eq!(
            got,
            vec![(5, Some(vec![3; 4096])), (6, Some(vec![3; 4096]))]
        );
        let mut snap = s.snapshot();
        assert_eq!(collect(&mut snap), vec![(5, None), (6, None)]);
    }

    #[test]
    fn writer_without_memory_for_a_copy_waits_for_the_sync() {
        // A budget with room for the data but not for a copy.
        let global = Arc::new(MemoryBudget::new(4 * 4096));
        let s = Arc::new(store_with(1 << 20, global.clone()));
        s.write(0, &[1; 4096], false).unwrap();
        s.write(48 * 4096, &[2; 4096], false).unwrap();
        s.write(49 * 4096, &[3; 4096], false).unwrap();
        let mut snap = s.snapshot();
        std::thread::scope(|sc| {
            let s2 = s.clone();
            let w = sc.spawn(move || s2.write(48 * 4096, &[9; 8192], false).unwrap());
            // The writer cannot copy (no budget): the sync captures its
            // chunk on request; the pre-cut contents come out either way.
            let got = collect(&mut snap);
            w.join().unwrap();
            assert_eq!(
                got,
                vec![
                    (0, Some(vec![1; 4096])),
                    (48, Some(vec![2; 4096])),
                    (49, Some(vec![3; 4096]))
                ]
            );
        });
        snap.finish();
        assert_eq!(global.used_bytes(), 3 * 4096);
        let mut back = vec![0; 8192];
        s.read(48 * 4096, &mut back).unwrap();
        assert_eq!(back, vec![9; 8192]);
    }
}
