//! Where compressed pages live: size classes 16 bytes apart, one pool per
//! drive, each class a dense array of slots laid over 4 KiB arena pages.
//!
//! ```text
//!  class c: slots of (c+1)*16 bytes, 16..=4032   (252 classes, one lock each)
//!
//!  space   │ slot 0 │ slot 1 │ slot 2 │ ... │ slot n-1 │ (free tail) │
//!  pages   [ page 0      ][ page 1      ][ page 2 ]      slots straddle pages
//!  rev     [ id  , id  , id  , ...  , id ]   slot -> object id
//!  loc     [ slot, FREE, slot, ...       ]   object id -> slot
//! ```
//!
//! A page table entry names an object by (class, id); the class maps the
//! id to its slot. Objects are kept dense: freeing the slot of object a
//! moves the class's last object into it (one copy of at most 4032 bytes)
//! and repoints that object's id, so slots `0..n` are always in use and a
//! class holds exactly `ceil(n * slot / 4096)` pages. A page emptied at the
//! end goes back to the arena at once (`arena.rs`).
//!
//! # Why this layout (measured on bench/compressed-corpus.sh's 1 GiB corpus)
//!
//! The first design gave each of 16 shards its own slabs of 25 classes
//! 128 bytes apart in 4-32 KiB blocks: 1.49x with lz4 where zram made
//! 1.53x. Its costs beside the compressed bytes were rounding to a class
//! (~64 bytes a page), part-filled blocks of 16 x 25 classes, raw pages
//! from 3 KiB up, and 27 bytes of tables per page. What decides it is
//! (classes x sets of slabs x unit of growth): finer classes cut rounding
//! but multiply the part-filled units. So here: one pool per drive (not
//! per shard), 4 KiB pages as the unit (objects may straddle two pages of
//! their class, as in zsmalloc's zspages), 16-byte classes (~8 bytes of
//! rounding a page), and compaction that is never behind (the moves
//! above). A page-by-page model of the corpus gave 1.536x with tables
//! counted; see bench/RESULTS.md for the measured figure.
//!
//! # Locks
//!
//! One `RwLock` per class: readers decompress from a slot under the shared
//! lock; alloc, free (with its move) and in-place overwrites take it
//! exclusively. The ids are what make the pool shareable: a move changes
//! only the class's own `loc`, never the page table entry of the object
//! it moved (which lives in another shard, under a lock the mover does not
//! hold). Lock order: a shard's lock, then one class lock, then the arena.
//!
//! # Invariants (per class)
//!
//! - `rev.len() == n`; `loc[rev[s]] == s` for every slot `s < n`; an id is
//!   in `free_ids` iff `loc[id] == FREE`.
//! - `pages.len() == ceil(n * slot_bytes / 4096)`.
//! - `live_bytes` is the sum of the stored objects' lengths (the entries
//!   that name them hold the lengths).

use parking_lot::{RwLock, RwLockWriteGuard};

use super::arena::{Charge, NoPage, Page, PageArena, PAGE_BYTES};
use super::keep::{self, Owner, ID_BYTES};
use super::page::HUGE_MIN_BYTES;
use crate::store::ntcopy::copy_streaming;

/// Distance between size classes.
pub const CLASS_STEP_BYTES: usize = 16;
/// The largest compressed object; larger pages are stored raw.
pub const MAX_OBJECT_BYTES: usize = HUGE_MIN_BYTES;
/// Size classes.
pub const CLASSES: usize = MAX_OBJECT_BYTES / CLASS_STEP_BYTES;
/// An id with no object (in `loc`).
const FREE: u32 = u32::MAX;

const _: () = assert!(MAX_OBJECT_BYTES % CLASS_STEP_BYTES == 0 && CLASSES <= 256);

/// Bytes of one slot of `class`.
#[inline]
pub const fn slot_bytes(class: usize) -> usize {
    (class + 1) * CLASS_STEP_BYTES
}

/// The class for an object of `len` bytes (`1..=MAX_OBJECT_BYTES`).
#[inline]
pub fn class_of(len: usize) -> usize {
    debug_assert!(len > 0 && len <= MAX_OBJECT_BYTES);
    (len - 1) / CLASS_STEP_BYTES
}

/// The class for an object of `len` bytes in an arena that is `kept`
/// (its slots end with the object's id: `keep.rs`); None when it does not
/// fit the largest class (it is stored raw).
#[inline]
pub fn class_for(len: usize, kept: bool) -> Option<usize> {
    let need = len + if kept { ID_BYTES } else { 0 };
    (need <= MAX_OBJECT_BYTES).then(|| class_of(need))
}

/// Counters of the pool's compaction, for the stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactCounts {
    /// Pages given back by classes that shrank (each a compaction "run").
    pub runs: u64,
    /// Objects moved to keep the classes dense.
    pub moved_objects: u64,
}

/// One size class (see the module docs).
#[derive(Default)]
struct Class {
    pages: Vec<Page>,
    rev: Vec<u32>,
    loc: Vec<u32>,
    free_ids: Vec<u32>,
    live_bytes: u64,
    compact: CompactCounts,
}

/// A class on its own cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Padded(RwLock<Class>);

/// The size classes of one drive.
pub struct Pool {
    classes: Box<[Padded]>,
}

impl Default for Pool {
    fn default() -> Pool {
        Pool {
            classes: (0..CLASSES).map(|_| Padded::default()).collect(),
        }
    }
}

/// Grows a vector by an eighth (at least 16) instead of doubling it, so
/// the bookkeeping of a large class wastes at most ~12% of itself.
fn reserve_some<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        v.reserve_exact((v.len() / 8).max(16));
    }
}

impl Class {
    /// Copies `data` into the space at byte `at` (it may straddle pages).
    fn write_at(&mut self, mut at: usize, mut data: &[u8]) {
        while !data.is_empty() {
            let (p, off) = (at / PAGE_BYTES, at % PAGE_BYTES);
            let n = (PAGE_BYTES - off).min(data.len());
            // SAFETY: the class owns its pages and the caller holds its
            // lock exclusively (`&mut self` behind the class's RwLock);
            // `off + n <= PAGE_BYTES`. Streaming stores: the slot is cold
            // (`store::ntcopy`), and the class lock's release orders them.
            unsafe {
                let dst = self.pages[p].bytes_mut().as_mut_ptr().add(off);
                copy_streaming(data.as_ptr(), dst, n);
            }
            data = &data[n..];
            at += n;
        }
    }

    /// Copies `len` bytes of the space from byte `from` to byte `to` (two
    /// different slots: the ranges never overlap).
    fn copy_within(&mut self, mut from: usize, mut to: usize, mut len: usize) {
        while len > 0 {
            let n = (PAGE_BYTES - from % PAGE_BYTES)
                .min(PAGE_BYTES - to % PAGE_BYTES)
                .min(len);
            let (src, dst) = (self.pages[from / PAGE_BYTES], self.pages[to / PAGE_BYTES]);
            // SAFETY: as in `write_at`; source and destination are disjoint
            // byte ranges (different slots), maybe of one page.
            unsafe {
                let s = src.bytes().as_ptr().add(from % PAGE_BYTES);
                let d = dst.bytes_mut().as_mut_ptr().add(to % PAGE_BYTES);
                std::ptr::copy_nonoverlapping(s, d, n);
            }
            from += n;
            to += n;
            len -= n;
        }
    }

    /// Calls `f` with the `len` bytes at `at` (copied into `tmp` when they
    /// straddle two pages).
    fn read_at<R>(&self, at: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let (p, off) = (at / PAGE_BYTES, at % PAGE_BYTES);
        // SAFETY: the class owns its pages; the caller holds its lock
        // (shared at least), so nobody changes them.
        let first = unsafe { self.pages[p].bytes() };
        if off + len <= PAGE_BYTES {
            return f(&first[off..off + len]);
        }
        let mut tmp = [0u8; MAX_OBJECT_BYTES];
        let head = PAGE_BYTES - off;
        tmp[..head].copy_from_slice(&first[off..]);
        // SAFETY: as above.
        let second = unsafe { self.pages[p + 1].bytes() };
        tmp[head..len].copy_from_slice(&second[..len - head]);
        f(&tmp[..len])
    }

    /// Writes `id` at the end of the slot ending at byte `end` (kept
    /// drives: `keep.rs`).
    fn write_id(&mut self, end: usize, id: u32) {
        let at = end - ID_BYTES;
        // SAFETY: as in `write_at`; the id's 4 bytes are 4-aligned (slots
        // are multiples of 16) so they lie in one page.
        unsafe {
            keep::write_id(
                self.pages[at / PAGE_BYTES].bytes_mut().as_mut_ptr(),
                at % PAGE_BYTES,
                id,
            )
        }
    }

    /// The id at the end of the slot ending at byte `end`.
    fn read_id(&self, end: usize) -> u32 {
        let at = end - ID_BYTES;
        // SAFETY: as in `read_at`, and as in `write_id`.
        unsafe {
            keep::read_id(
                self.pages[at / PAGE_BYTES].bytes().as_ptr(),
                at % PAGE_BYTES,
            )
        }
    }

    fn metadata_bytes(&self) -> u64 {
        ((self.pages.capacity() * std::mem::size_of::<Page>())
            + (self.rev.capacity() + self.loc.capacity() + self.free_ids.capacity()) * 4)
            as u64
    }
}

impl Pool {
    fn class(&self, class: usize) -> RwLockWriteGuard<'_, Class> {
        self.classes[class].0.write()
    }

    /// Stores `data` as a new object of its class; returns its id. Takes a
    /// page from `arena` when the class's last page is full; on `NoPage`
    /// nothing changed.
    ///
    /// In a kept arena the object's id goes at the end of its slot and the
    /// class's count is raised after (`keep.rs`); `data` must then fit a
    /// class with its id ([`class_for`]).
    pub fn alloc(&self, data: &[u8], arena: &PageArena, mem: &impl Charge) -> Result<u32, NoPage> {
        let keep = arena.keep();
        let class = class_for(data.len(), keep.is_some()).expect("an object that fits a class");
        let slot = slot_bytes(class);
        let mut c = self.class(class);
        let n = c.rev.len();
        if (n + 1) * slot > c.pages.len() * PAGE_BYTES {
            let page = arena.take(mem)?;
            let index = c.pages.len() as u64;
            arena.note_owner(page, Some(Owner { class, index }));
            reserve_some(&mut c.pages);
            c.pages.push(page);
        }
        let id = match c.free_ids.pop() {
            Some(id) => id,
            None => {
                reserve_some(&mut c.loc);
                c.loc.push(FREE);
                (c.loc.len() - 1) as u32
            }
        };
        c.loc[id as usize] = n as u32;
        reserve_some(&mut c.rev);
        c.rev.push(id);
        c.write_at(n * slot, data);
        if let Some(k) = keep {
            c.write_id((n + 1) * slot, id);
            k.set_class_count(class, n as u64 + 1);
        }
        c.live_bytes += data.len() as u64;
        Ok(id)
    }

    /// Replaces the bytes of object `id` of `class` (`old_len` long) with
    /// `data`, which fits its slot. Never in a kept arena (`keep.rs`).
    pub fn overwrite(&self, class: usize, id: u32, old_len: usize, data: &[u8]) {
        assert!(
            data.len() <= slot_bytes(class),
            "object larger than its slot"
        );
        let mut c = self.class(class);
        let at = c.loc[id as usize] as usize * slot_bytes(class);
        c.write_at(at, data);
        c.live_bytes = c.live_bytes - old_len as u64 + data.len() as u64;
    }

    /// Calls `f` with the `len` stored bytes of object `id` of `class`,
    /// under the class's shared lock.
    pub fn read<R>(&self, class: usize, id: u32, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let c = self.classes[class].0.read();
        let at = c.loc[id as usize] as usize * slot_bytes(class);
        c.read_at(at, len, f)
    }

    /// Frees object `id` of `class` (`len` bytes): the class's last object
    /// moves into its slot, and a page emptied at the end goes back to the
    /// arena. Returns the bytes of pages given back.
    pub fn free(
        &self,
        class: usize,
        id: u32,
        len: usize,
        arena: &PageArena,
        mem: &impl Charge,
    ) -> u64 {
        let slot = slot_bytes(class);
        let keep = arena.keep();
        let mut c = self.class(class);
        let at = c.loc[id as usize] as usize;
        let last = c.rev.len() - 1;
        if at != last {
            let moved = c.rev[last];
            match keep {
                None => c.copy_within(last * slot, at * slot, slot),
                Some(_) => {
                    c.copy_within(last * slot, at * slot, slot - ID_BYTES);
                    c.write_id((at + 1) * slot, moved);
                }
            }
            c.loc[moved as usize] = at as u32;
            c.rev[at] = moved;
            c.compact.moved_objects += 1;
        }
        c.rev.pop();
        c.loc[id as usize] = FREE;
        c.free_ids.push(id);
        c.live_bytes -= len as u64;
        if let Some(k) = keep {
            k.set_class_count(class, c.rev.len() as u64);
        }
        let mut freed = 0;
        while c.pages.len() * PAGE_BYTES >= c.rev.len() * slot + PAGE_BYTES {
            let page = c.pages.pop().expect("a page beyond the objects");
            arena.note_owner(page, None);
            arena.give(page, mem);
            c.compact.runs += 1;
            freed += PAGE_BYTES as u64;
        }
        if c.rev.is_empty() {
            // Every id is free: start the numbering afresh.
            *c = Class {
                compact: c.compact,
                ..Class::default()
            };
        }
        freed
    }

    /// Rebuilds class `class` of a kept drive (`keep.rs`) from its `pages`
    /// (in order) holding `n` objects, and `refs`: by id, the length of
    /// every object the page tables name (0: none). Each slot's id is read; an id
    /// in two slots is the object a free was moving when the process died:
    /// the higher slot (the whole original) wins. Returns the ids given to
    /// the slots nobody names (the loser, and objects written but never
    /// named): the caller frees them.
    pub fn adopt_class(
        &self,
        class: usize,
        pages: Vec<Page>,
        n: usize,
        refs: &[u16],
    ) -> Result<Vec<u32>, &'static str> {
        let slot = slot_bytes(class);
        if pages.len() != (n * slot).div_ceil(PAGE_BYTES) {
            return Err("a class's pages differ from what its objects need");
        }
        let mut c = self.class(class);
        c.pages = pages;
        let ids = refs.len();
        let (mut loc, mut rev) = (vec![FREE; ids], vec![FREE; n]);
        let mut unnamed = Vec::new();
        for s in (0..n).rev() {
            let id = c.read_id((s + 1) * slot);
            match loc.get_mut(id as usize) {
                Some(l) if *l == FREE && refs[id as usize] != 0 => {
                    *l = s as u32;
                    rev[s] = id;
                }
                _ => unnamed.push(s),
            }
        }
        if refs
            .iter()
            .zip(&loc)
            .any(|(&len, &l)| len != 0 && l == FREE)
        {
            return Err("a page names an object no slot holds");
        }
        let mut garbage = Vec::with_capacity(unnamed.len());
        for s in unnamed {
            garbage.push(loc.len() as u32);
            rev[s] = loc.len() as u32;
            loc.push(s as u32);
        }
        c.free_ids = (0..ids as u32)
            .filter(|&i| loc[i as usize] == FREE)
            .collect();
        c.loc = loc;
        c.rev = rev;
        c.live_bytes = refs.iter().map(|&l| l as u64).sum();
        Ok(garbage)
    }

    /// Sum of the stored objects' lengths.
    pub fn live_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.0.read().live_bytes).sum()
    }

    /// Pages held by the classes.
    pub fn pages(&self) -> u64 {
        self.classes
            .iter()
            .map(|c| c.0.read().pages.len() as u64)
            .sum()
    }

    /// Compaction counters summed over the classes.
    pub fn compact_counts(&self) -> CompactCounts {
        let mut k = CompactCounts::default();
        for c in self.classes.iter() {
            let c = c.0.read();
            k.runs += c.compact.runs;
            k.moved_objects += c.compact.moved_objects;
        }
        k
    }

    /// Bytes of the classes' bookkeeping.
    pub fn metadata_bytes(&self) -> u64 {
        let own = (CLASSES * std::mem::size_of::<Padded>()) as u64;
        own + self
            .classes
            .iter()
            .map(|c| c.0.read().metadata_bytes())
            .sum::<u64>()
    }

    /// Checks the module's invariants against `refs`: per class, the
    /// (id, len) of every entry that names an object of it. Returns the
    /// first broken one.
    pub fn check(&self, refs: &[Vec<(u32, u16)>]) -> Result<(), &'static str> {
        for (class, c) in self.classes.iter().enumerate() {
            let c = c.0.read();
            let n = c.rev.len();
            if c.pages.len() != (n * slot_bytes(class)).div_ceil(PAGE_BYTES) {
                return Err("a class holds more or fewer pages than its objects need");
            }
            for (s, &id) in c.rev.iter().enumerate() {
                if c.loc.get(id as usize) != Some(&(s as u32)) {
                    return Err("a slot's id does not point back at it");
                }
            }
            let free = c.loc.iter().filter(|&&l| l == FREE).count();
            if free != c.free_ids.len() || c.free_ids.iter().any(|&id| c.loc[id as usize] != FREE) {
                return Err("the free ids differ from the ids without a slot");
            }
            let mut seen = vec![false; c.loc.len()];
            let mut live = 0u64;
            for &(id, len) in &refs[class] {
                match seen.get_mut(id as usize) {
                    Some(s) if !*s && c.loc[id as usize] != FREE => *s = true,
                    _ => return Err("an entry names a free or twice-named object"),
                }
                if len as usize > slot_bytes(class) || len == 0 {
                    return Err("an object's length does not fit its class");
                }
                live += len as u64;
            }
            if refs[class].len() != n {
                return Err("a class holds objects no entry names");
            }
            if live != c.live_bytes {
                return Err("stored lengths differ from a class's live bytes");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[derive(Default)]
    struct Counter(Cell<u64>, u64);
    impl Charge for Counter {
        fn reserve(&self, bytes: u64) -> bool {
            if self.0.get() + bytes > self.1 {
                return false;
            }
            self.0.set(self.0.get() + bytes);
            true
        }
        fn release(&self, bytes: u64) {
            self.0.set(self.0.get() - bytes);
        }
    }

    fn object(i: u32, len: usize) -> Vec<u8> {
        (0..len)
            .map(|b| (b as u32 ^ i.wrapping_mul(2654435761)) as u8)
            .collect()
    }

    #[test]
    fn classes() {
        assert_eq!(CLASSES, 252);
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(16), 0);
        assert_eq!(class_of(17), 1);
        assert_eq!(class_of(MAX_OBJECT_BYTES), CLASSES - 1);
        assert_eq!(slot_bytes(CLASSES - 1), MAX_OBJECT_BYTES);
    }

    #[test]
    fn objects_stay_dense_and_pages_follow() {
        let mem = Counter(Cell::new(0), u64::MAX);
        let arena = PageArena::new(2 << 20, false);
        let pool = Pool::default();
        let len = 1000; // class 62: 1008-byte slots, straddling pages
        let ids: Vec<u32> = (0..40)
            .map(|i| pool.alloc(&object(i, len), &arena, &mem).unwrap())
            .collect();
        let class = class_of(len);
        assert_eq!(pool.pages(), (40 * 1008usize).div_ceil(4096) as u64);
        assert_eq!(mem.0.get(), pool.pages() * 4096);
        // Free every other object: the last ones move into the holes.
        for (i, &id) in ids.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            let _ = i;
            pool.free(class, id, len, &arena, &mem);
        }
        assert_eq!(pool.pages(), (20 * 1008usize).div_ceil(4096) as u64);
        let k = pool.compact_counts();
        assert!(k.moved_objects > 0 && k.runs > 0, "{k:?}");
        for (i, &id) in ids.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
            pool.read(class, id, len, |b| {
                assert_eq!(b, &object(i as u32, len)[..])
            });
        }
        let refs: Vec<Vec<(u32, u16)>> = (0..CLASSES)
            .map(|c| match c == class {
                true => ids
                    .iter()
                    .skip(1)
                    .step_by(2)
                    .map(|&id| (id, len as u16))
                    .collect(),
                false => Vec::new(),
            })
            .collect();
        pool.check(&refs).unwrap();
        assert_eq!(pool.live_bytes(), 20 * len as u64);
        // Every page is charged: the classes' and the arena's cache.
        assert_eq!(mem.0.get(), arena.charged_pages() * 4096);
        for &id in ids.iter().skip(1).step_by(2) {
            pool.free(class, id, len, &arena, &mem);
        }
        assert_eq!(pool.pages(), 0);
        arena.release_cache(&mem);
        assert_eq!(mem.0.get(), 0);
    }

    #[test]
    fn a_full_budget_changes_nothing() {
        let mem = Counter(Cell::new(0), 4096);
        let arena = PageArena::new(2 << 20, false);
        let pool = Pool::default();
        for i in 0..4 {
            pool.alloc(&object(i, 1000), &arena, &mem).unwrap();
        }
        assert_eq!(
            pool.alloc(&object(9, 1000), &arena, &mem),
            Err(NoPage::Budget)
        );
        // Another class needs its own page.
        assert!(pool.alloc(&object(9, 100), &arena, &mem).is_err());
        assert_eq!(pool.live_bytes(), 4000);
    }
}
