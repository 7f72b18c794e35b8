//! Where compressed pages live: per-size-class slabs with compaction, one
//! set per shard (zsmalloc's design, without its cross-page objects).
//!
//! ```text
//!  class  slot bytes  block bytes  slots          owner (back-pointer)
//!    0        128        4 KiB      32      block ┌──────┬──────┬──────┬─
//!    1        256        4 KiB      16  ───────▶  │ obj  │ free │ obj  │ ...
//!   ...                                          └──────┴──────┴──────┴─
//!   23       3072       12 KiB       4      owners [ p17 , FREE , p3 , ...]
//!   24       4096       32 KiB       8   (raw "huge" pages)
//! ```
//!
//! An object of `len` bytes takes one slot of the smallest class that
//! holds it; classes are 128 bytes apart (at most 127 bytes of rounding,
//! ~64 on average, against ~1-2 KiB per compressed page). A block is one
//! to eight 4 KiB pages, the fewest that waste at most 1/32 of the block
//! on the tail no slot fits. Blocks are plain heap allocations of at most
//! 32 KiB: one per page would cost an allocation header and a pointer per
//! page; one mapping per block would run into the kernel's map count.
//!
//! # Invariants
//!
//! - `owners[slot]` is the shard-local page index whose table entry points
//!   at that slot, or [`FREE`]; `used` counts the non-free slots.
//! - A block is in its class's `nonfull` list iff `used < slots`
//!   (`nonfull_at` is its position there).
//! - `held_bytes` is the sum of the live blocks' sizes and is exactly what
//!   was charged through [`Charge`]; `live_bytes` is the sum of the stored
//!   objects' lengths.
//!
//! # Compaction
//!
//! Freed slots are reused by the next object of their class at once. A
//! class whose free slots add up to two blocks or more is compacted right
//! after the free that crossed the line (incrementally, under the shard
//! lock the caller already holds): the least-used block's objects move
//! into free slots of other blocks of the class, and the emptied block is
//! released. Moving into existing slots needs no new memory, so it works
//! with the budget full.
//!
//! # Locked drives
//!
//! A drive whose memory is locked in RAM (`--lock-memory`) takes its blocks
//! from a locked arena (`arena.rs`) through [`Charge::new_block`], and every
//! class uses 32 KiB blocks there ([`Slab::locked`]), for the reasons that
//! module gives. Each pass frees one block and stops below the
//! threshold again, so at least a block's worth of frees separates two
//! passes: at most one move per free, amortised.

use super::arena::{LockedBlock, LOCKED_BLOCK_BYTES};
use super::page::{HUGE_MIN_BYTES, PAGE_BYTES};

/// Distance between size classes.
pub const CLASS_STEP_BYTES: usize = 128;
/// Classes for compressed objects (128..=3072 bytes), then one for raw pages.
pub const CLASSES: usize = HUGE_MIN_BYTES / CLASS_STEP_BYTES + 1;
/// The class of raw (incompressible) pages.
pub const RAW_CLASS: usize = CLASSES - 1;
/// A slot nobody owns.
pub const FREE: u32 = u32::MAX;
/// Most pages in a block.
const MAX_BLOCK_PAGES: usize = 8;

const _: () = assert!(HUGE_MIN_BYTES % CLASS_STEP_BYTES == 0);

/// Bytes of one slot of `class`.
#[inline]
pub const fn slot_bytes(class: usize) -> usize {
    if class == RAW_CLASS {
        PAGE_BYTES
    } else {
        (class + 1) * CLASS_STEP_BYTES
    }
}

/// Bytes of one block of `class`: the fewest pages whose unusable tail is
/// at most 1/32 of the block.
pub const fn block_bytes(class: usize) -> usize {
    let slot = slot_bytes(class);
    if class == RAW_CLASS {
        return MAX_BLOCK_PAGES * PAGE_BYTES;
    }
    let mut pages = 1;
    while pages < MAX_BLOCK_PAGES {
        let bytes = pages * PAGE_BYTES;
        if bytes % slot <= bytes / 32 {
            break;
        }
        pages += 1;
    }
    pages * PAGE_BYTES
}

/// The class for an object of `len` bytes (`1..=PAGE_BYTES`).
#[inline]
pub fn class_of(len: usize) -> usize {
    debug_assert!(len > 0 && len <= PAGE_BYTES);
    if len > HUGE_MIN_BYTES {
        RAW_CLASS
    } else {
        (len - 1) / CLASS_STEP_BYTES
    }
}

/// Where one object lives: 12 bytes, kept in the page table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    /// Block index within the class.
    pub block: u32,
    /// Slot within the block.
    pub slot: u16,
    /// The object's length in bytes (`PAGE_BYTES` for raw pages).
    pub len: u16,
    /// Size class.
    pub class: u8,
}

/// Charges and releases the memory of blocks (the drive's limit and the
/// daemon's budget), and provides it.
pub trait Charge {
    /// Reserves `bytes`; false when a limit would be passed.
    fn reserve(&self, bytes: u64) -> bool;
    /// Gives back `bytes` reserved earlier.
    fn release(&self, bytes: u64);
    /// Memory for a new block of `bytes` (reserved already), all zero: a
    /// heap allocation unless the drive is locked.
    fn new_block(&self, bytes: usize) -> std::io::Result<BlockMem> {
        Ok(BlockMem::Heap(vec![0u8; bytes].into_boxed_slice()))
    }
    /// Takes back the memory of a released block.
    fn drop_block(&self, block: BlockMem) {
        drop(block)
    }
}

/// The memory of one block.
pub enum BlockMem {
    /// A heap allocation.
    Heap(Box<[u8]>),
    /// A block of a locked arena (`arena.rs`).
    Locked(LockedBlock),
}

impl BlockMem {
    fn bytes(&self) -> &[u8] {
        match self {
            BlockMem::Heap(b) => b,
            BlockMem::Locked(b) => b.bytes(),
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            BlockMem::Heap(b) => b,
            BlockMem::Locked(b) => b.bytes_mut(),
        }
    }
}

/// No class has a free slot for the object and no new block can be charged
/// (or, on a locked drive, locked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no memory for a new {block_bytes}-byte slab block")]
pub struct SlabFull {
    /// The block that could not be charged.
    pub block_bytes: u64,
    /// The block was charged but its memory could not be locked
    /// (`RLIMIT_MEMLOCK`).
    pub lock_failed: bool,
}

struct Block {
    data: BlockMem,
    /// Per slot: the shard-local page that owns it, or FREE.
    owners: Box<[u32]>,
    used: u16,
    /// Position in the class's `nonfull` list, or u32::MAX.
    nonfull_at: u32,
}

#[derive(Default)]
struct Class {
    /// Blocks by index; None for released ones (their index is reused).
    blocks: Vec<Option<Block>>,
    /// Indices of released blocks, for reuse.
    spare: Vec<u32>,
    /// Blocks with a free slot.
    nonfull: Vec<u32>,
    /// Objects stored in this class.
    objects: u64,
}

/// Counters of compaction work, for the stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactCounts {
    /// Compaction passes run (each frees one block).
    pub runs: u64,
    /// Objects moved.
    pub moved_objects: u64,
    /// Bytes of blocks released by compaction.
    pub freed_bytes: u64,
}

/// One shard's slabs.
#[derive(Default)]
pub struct Slab {
    classes: [Class; CLASSES],
    held_bytes: u64,
    live_bytes: u64,
    blocks: u64,
    compact: CompactCounts,
    /// Every class uses `LOCKED_BLOCK_BYTES` blocks (a locked drive's).
    locked: bool,
}

impl Class {
    fn free_slots(&self, slots: usize) -> u64 {
        let live_blocks = (self.blocks.len() - self.spare.len()) as u64;
        live_blocks * slots as u64 - self.objects
    }

    fn block(&mut self, b: u32) -> &mut Block {
        self.blocks[b as usize].as_mut().expect("live block")
    }

    fn push_nonfull(&mut self, b: u32) {
        let at = self.nonfull.len() as u32;
        self.block(b).nonfull_at = at;
        self.nonfull.push(b);
    }

    fn remove_nonfull(&mut self, b: u32) {
        let at = self.block(b).nonfull_at;
        self.nonfull.swap_remove(at as usize);
        if let Some(&moved) = self.nonfull.get(at as usize) {
            self.block(moved).nonfull_at = at;
        }
        self.block(b).nonfull_at = u32::MAX;
    }

    /// Takes a free slot in block `b` (which must have one, of `slots`) for
    /// `owner`.
    fn take_slot(&mut self, slots: usize, b: u32, owner: u32) -> u16 {
        let blk = self.block(b);
        let slot = blk
            .owners
            .iter()
            .position(|&o| o == FREE)
            .expect("nonfull block has a free slot");
        blk.owners[slot] = owner;
        blk.used += 1;
        self.objects += 1;
        if self.block(b).used as usize == slots {
            self.remove_nonfull(b);
        }
        slot as u16
    }
}

impl Slab {
    /// The slabs of a locked drive: 32 KiB blocks in every class.
    pub fn locked() -> Slab {
        Slab {
            locked: true,
            ..Slab::default()
        }
    }

    /// Bytes of a block of `class`.
    fn block_bytes(&self, class: usize) -> usize {
        if self.locked {
            LOCKED_BLOCK_BYTES
        } else {
            block_bytes(class)
        }
    }

    /// Slots in a block of `class`.
    fn slots(&self, class: usize) -> usize {
        self.block_bytes(class) / slot_bytes(class)
    }

    /// Bytes of blocks held (what was charged).
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Sum of the stored objects' lengths.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Compaction counters.
    pub fn compact_counts(&self) -> CompactCounts {
        self.compact
    }

    /// Bytes of bookkeeping beside the blocks' data: block headers, owner
    /// arrays and the lists.
    pub fn metadata_bytes(&self) -> u64 {
        let mut bytes = std::mem::size_of::<Slab>() as u64;
        for (c, class) in self.classes.iter().enumerate() {
            let live = (class.blocks.len() - class.spare.len()) as u64;
            bytes += (class.blocks.capacity() * std::mem::size_of::<Option<Block>>()) as u64
                + ((class.spare.capacity() + class.nonfull.capacity()) * 4) as u64
                + live * (self.slots(c) * 4) as u64;
        }
        bytes
    }

    /// Stores `data` for `owner`; a new block is charged to `mem` when no
    /// block of the class has a free slot.
    pub fn alloc(
        &mut self,
        data: &[u8],
        owner: u32,
        mem: &impl Charge,
    ) -> Result<Handle, SlabFull> {
        let class = class_of(data.len());
        if self.classes[class].nonfull.is_empty() {
            self.grow(class, mem)?;
        }
        let slots = self.slots(class);
        let cls = &mut self.classes[class];
        let b = *cls.nonfull.last().expect("a nonfull block");
        let slot = cls.take_slot(slots, b, owner);
        let h = Handle {
            block: b,
            slot,
            len: data.len() as u16,
            class: class as u8,
        };
        self.live_bytes += data.len() as u64;
        self.bytes_mut(h).copy_from_slice(data);
        Ok(h)
    }

    /// Replaces the bytes of `h` with `data` (which fits its slot) in
    /// place. Returns the new handle.
    pub fn overwrite(&mut self, h: Handle, data: &[u8]) -> Handle {
        assert!(
            data.len() <= slot_bytes(h.class as usize),
            "object larger than its slot"
        );
        self.live_bytes = self.live_bytes - h.len as u64 + data.len() as u64;
        let h = Handle {
            len: data.len() as u16,
            ..h
        };
        self.bytes_mut(h).copy_from_slice(data);
        h
    }

    fn grow(&mut self, class: usize, mem: &impl Charge) -> Result<(), SlabFull> {
        let bytes = self.block_bytes(class);
        let full = |lock_failed| SlabFull {
            block_bytes: bytes as u64,
            lock_failed,
        };
        if !mem.reserve(bytes as u64) {
            return Err(full(false));
        }
        let data = match mem.new_block(bytes) {
            Ok(d) => d,
            Err(_) => {
                mem.release(bytes as u64);
                return Err(full(true));
            }
        };
        let block = Block {
            data,
            owners: vec![FREE; self.slots(class)].into_boxed_slice(),
            used: 0,
            nonfull_at: u32::MAX,
        };
        let cls = &mut self.classes[class];
        let b = match cls.spare.pop() {
            Some(b) => {
                cls.blocks[b as usize] = Some(block);
                b
            }
            None => {
                cls.blocks.push(Some(block));
                (cls.blocks.len() - 1) as u32
            }
        };
        cls.push_nonfull(b);
        self.held_bytes += bytes as u64;
        self.blocks += 1;
        Ok(())
    }

    /// The stored bytes of `h`.
    #[inline]
    pub fn bytes(&self, h: Handle) -> &[u8] {
        let blk = self.classes[h.class as usize].blocks[h.block as usize]
            .as_ref()
            .expect("handle to a live block");
        let at = h.slot as usize * slot_bytes(h.class as usize);
        &blk.data.bytes()[at..at + h.len as usize]
    }

    fn bytes_mut(&mut self, h: Handle) -> &mut [u8] {
        let blk = self.classes[h.class as usize].block(h.block);
        let at = h.slot as usize * slot_bytes(h.class as usize);
        &mut blk.data.bytes_mut()[at..at + h.len as usize]
    }

    /// The owner recorded for `h`'s slot (FREE when none).
    pub fn owner(&self, h: Handle) -> u32 {
        self.classes[h.class as usize]
            .blocks
            .get(h.block as usize)
            .and_then(|b| b.as_ref())
            .and_then(|b| b.owners.get(h.slot as usize).copied())
            .unwrap_or(FREE)
    }

    /// Frees `h`'s slot, releasing its block to `mem` when it empties.
    /// Returns whether the class is now worth compacting.
    pub fn free(&mut self, h: Handle, mem: &impl Charge) -> bool {
        let class = h.class as usize;
        self.live_bytes -= h.len as u64;
        let cls = &mut self.classes[class];
        let blk = cls.block(h.block);
        debug_assert_ne!(blk.owners[h.slot as usize], FREE, "double free");
        blk.owners[h.slot as usize] = FREE;
        blk.used -= 1;
        let (used, was_full) = (blk.used, blk.nonfull_at == u32::MAX);
        cls.objects -= 1;
        if was_full {
            cls.push_nonfull(h.block);
        }
        if used == 0 {
            self.release_block(class, h.block, mem);
            return false;
        }
        self.needs_compaction(class)
    }

    fn needs_compaction(&self, class: usize) -> bool {
        let slots = self.slots(class);
        self.classes[class].free_slots(slots) >= 2 * slots as u64
    }

    fn release_block(&mut self, class: usize, b: u32, mem: &impl Charge) {
        let bytes = self.block_bytes(class) as u64;
        let cls = &mut self.classes[class];
        cls.remove_nonfull(b);
        let blk = cls.blocks[b as usize].take().expect("live block");
        mem.drop_block(blk.data);
        cls.spare.push(b);
        self.held_bytes -= bytes;
        self.blocks -= 1;
        mem.release(bytes);
        // Trailing released blocks: shrink the index.
        while matches!(cls.blocks.last(), Some(None)) {
            let last = (cls.blocks.len() - 1) as u32;
            cls.blocks.pop();
            cls.spare.retain(|&s| s != last);
        }
    }

    /// Compacts `class` while it is worth it (see module docs), calling
    /// `moved(owner, new handle)` for each object moved so the caller
    /// repoints its table. Returns the bytes released.
    pub fn compact(
        &mut self,
        class: usize,
        mem: &impl Charge,
        mut moved: impl FnMut(u32, Handle),
    ) -> u64 {
        let mut freed = 0;
        while self.needs_compaction(class) {
            freed += self.compact_one(class, mem, &mut moved);
        }
        freed
    }

    /// Compacts every class while worth it; returns the bytes released.
    pub fn compact_all(&mut self, mem: &impl Charge, mut moved: impl FnMut(u32, Handle)) -> u64 {
        (0..CLASSES).map(|c| self.compact(c, mem, &mut moved)).sum()
    }

    /// Empties the least-used nonfull block of `class` into the others and
    /// releases it.
    fn compact_one(
        &mut self,
        class: usize,
        mem: &impl Charge,
        moved: &mut impl FnMut(u32, Handle),
    ) -> u64 {
        let slots = self.slots(class);
        let cls = &mut self.classes[class];
        let src = *cls
            .nonfull
            .iter()
            .min_by_key(|&&b| cls.blocks[b as usize].as_ref().map_or(0, |blk| blk.used))
            .expect("a class worth compacting has nonfull blocks");
        // Out of the list while it empties, so no object moves into it.
        cls.remove_nonfull(src);
        let slot = slot_bytes(class);
        let src_blk = cls.blocks[src as usize].take().expect("live block");
        for (s, &owner) in src_blk.owners.iter().enumerate() {
            if owner == FREE {
                continue;
            }
            let dst = *cls.nonfull.last().expect("the other blocks have room");
            let new_slot = cls.take_slot(slots, dst, owner);
            cls.objects -= 1; // take_slot counted it again
            let at = new_slot as usize * slot;
            cls.block(dst).data.bytes_mut()[at..at + slot]
                .copy_from_slice(&src_blk.data.bytes()[s * slot..(s + 1) * slot]);
            moved(
                owner,
                Handle {
                    block: dst,
                    slot: new_slot,
                    len: 0, // the caller keeps its own length
                    class: class as u8,
                },
            );
            self.compact.moved_objects += 1;
        }
        // Put an empty shell back so release_block's bookkeeping holds.
        let mut shell = src_blk;
        shell.owners.fill(FREE);
        shell.used = 0;
        let cls = &mut self.classes[class];
        cls.blocks[src as usize] = Some(shell);
        cls.push_nonfull(src);
        self.release_block(class, src, mem);
        let bytes = self.block_bytes(class) as u64;
        self.compact.runs += 1;
        self.compact.freed_bytes += bytes;
        bytes
    }

    /// Checks the invariants of the module docs; returns a description of
    /// the first one broken.
    pub fn check(&self) -> Result<(), &'static str> {
        let (mut held, mut blocks) = (0u64, 0u64);
        for (c, cls) in self.classes.iter().enumerate() {
            let mut objects = 0u64;
            for (b, blk) in cls.blocks.iter().enumerate() {
                let Some(blk) = blk else {
                    if !cls.spare.contains(&(b as u32)) {
                        return Err("a released block index is not spare");
                    }
                    continue;
                };
                let used = blk.owners.iter().filter(|&&o| o != FREE).count();
                if used != blk.used as usize {
                    return Err("a block's used count differs from its owners");
                }
                let nonfull = blk.nonfull_at != u32::MAX;
                if nonfull != (used < self.slots(c))
                    || (nonfull && cls.nonfull.get(blk.nonfull_at as usize) != Some(&(b as u32)))
                {
                    return Err("the nonfull list is out of step with a block");
                }
                objects += used as u64;
                held += blk.data.bytes().len() as u64;
                blocks += 1;
            }
            if objects != cls.objects {
                return Err("a class's object count differs from its blocks");
            }
        }
        if held != self.held_bytes || blocks != self.blocks {
            return Err("held bytes differ from the blocks held");
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

    #[test]
    fn classes_and_blocks() {
        assert_eq!(CLASSES, 25);
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(128), 0);
        assert_eq!(class_of(129), 1);
        assert_eq!(class_of(3072), 23);
        assert_eq!(class_of(3073), RAW_CLASS);
        for c in 0..CLASSES {
            let (b, s) = (block_bytes(c), slot_bytes(c));
            assert!(b % PAGE_BYTES == 0 && b <= MAX_BLOCK_PAGES * PAGE_BYTES && b >= s);
            assert!(b % s <= b / 32, "class {c}: {b} % {s}");
        }
    }

    #[test]
    fn alloc_free_and_compaction_release_memory() {
        let mem = Counter(Cell::new(0), u64::MAX);
        let mut slab = Slab::default();
        let data = [7u8; 1000]; // class 7: 1024-byte slots, 4 per 4 KiB block
        let mut hs: Vec<Handle> = (0..40)
            .map(|i| slab.alloc(&data, i, &mem).unwrap())
            .collect();
        assert_eq!(slab.held_bytes(), 10 * 4096);
        assert_eq!(mem.0.get(), slab.held_bytes());
        // Free every other object: 20 free slots spread over 10 blocks.
        let mut want = false;
        for (i, h) in hs.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            assert_eq!(slab.owner(*h), i as u32);
            want |= slab.free(*h, &mem);
        }
        assert!(want);
        let mut moves = Vec::new();
        let freed = slab.compact(7, &mem, |owner, h| moves.push((owner, h)));
        assert!(freed >= 4 * 4096);
        for (owner, h) in moves {
            hs[owner as usize] = Handle { len: 1000, ..h };
        }
        for (i, h) in hs.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
            assert_eq!(slab.owner(*h), i as u32);
            assert_eq!(slab.bytes(*h), &data[..]);
        }
        slab.check().unwrap();
        assert_eq!(mem.0.get(), slab.held_bytes());
        assert_eq!(slab.live_bytes(), 20 * 1000);
    }

    #[test]
    fn full_budget_is_reported() {
        let mem = Counter(Cell::new(0), 4096);
        let mut slab = Slab::default();
        for i in 0..4 {
            slab.alloc(&[1u8; 900], i, &mem).unwrap();
        }
        assert!(slab.alloc(&[1u8; 900], 9, &mem).is_err());
        // Another class needs its own block.
        assert!(slab.alloc(&[1u8; 100], 9, &mem).is_err());
    }
}
