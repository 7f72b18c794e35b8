//! One shard of a compressed drive: the page table of the page groups it
//! owns and the slabs that hold their bytes, under one lock (the caller's).
//!
//! ```text
//!  groups[local group] ──▶ Box<[Entry; 16]>   (None: all 16 pages are holes)
//!  Entry = Hole | Same(word) | Stored(Handle ─▶ slab slot)
//!  local page = local group * 16 + page % 16  (the slab's back-pointer)
//! ```
//!
//! A table of 16 entries (256 bytes) exists only for groups with a page
//! that is not a hole, so a sparse drive costs 8 bytes per 64 KiB.
//!
//! Invariants: an entry is `Stored(h)` iff the slab's owner of `h` is that
//! entry's local page, and `h.len` is the object's length; a page is raw
//! iff its length is a whole page (then it is in the raw class; a
//! compressed object may sit in a larger class than its own after an
//! in-place reuse under a full budget). `same_pages`, `huge_pages` and
//! `compressed_pages` count the `Same`, raw and other `Stored` entries.

use super::page::{Packed, PAGE_BYTES};
use super::slab::{class_of, slot_bytes, Charge, CompactCounts, Handle, Slab, SlabFull, RAW_CLASS};

/// Pages per group: the unit of sharding (64 KiB, the raw store's chunk).
pub const GROUP_PAGES: usize = 16;

/// What one page holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Entry {
    /// Never written, or trimmed: reads as zero, reported as a hole.
    #[default]
    Hole,
    /// Every 8-byte word is this one; no bytes stored.
    Same(u64),
    /// Compressed (or raw) bytes in the slab.
    Stored(Handle),
}

type Group = Box<[Entry; GROUP_PAGES]>;

/// Page counts of a shard, summed into the drive's stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardCounts {
    /// Same-filled pages (zero pages included).
    pub same_pages: u64,
    /// Pages stored raw.
    pub huge_pages: u64,
    /// Pages stored compressed (not raw).
    pub compressed_pages: u64,
    /// Group tables allocated.
    pub groups: u64,
}

/// A shard: its groups' tables and slabs.
#[derive(Default)]
pub struct Shard {
    groups: Vec<Option<Group>>,
    slab: Slab,
    counts: ShardCounts,
}

/// A page ready to place: its classification and, when stored, its bytes.
#[derive(Debug, Clone, Copy)]
pub enum Placing<'a> {
    Same(u64),
    Bytes(&'a [u8]),
}

impl<'a> Placing<'a> {
    /// From `pack`'s result: `packed` bytes in `buf`, or the page itself.
    pub fn new(packed: Packed, buf: &'a [u8], page: &'a [u8]) -> Placing<'a> {
        match packed {
            Packed::Same(w) => Placing::Same(w),
            Packed::Compressed(n) => Placing::Bytes(&buf[..n]),
            Packed::Raw => Placing::Bytes(page),
        }
    }
}

impl Shard {
    /// A shard of a locked drive (its slabs use locked 32 KiB blocks).
    pub fn locked() -> Shard {
        Shard {
            slab: Slab::locked(),
            ..Shard::default()
        }
    }

    /// The entry of a local page.
    #[inline]
    pub fn entry(&self, local: u32) -> Entry {
        let (g, i) = (local as usize / GROUP_PAGES, local as usize % GROUP_PAGES);
        match self.groups.get(g) {
            Some(Some(t)) => t[i],
            _ => Entry::Hole,
        }
    }

    /// The stored bytes behind a handle.
    #[inline]
    pub fn bytes(&self, h: Handle) -> &[u8] {
        self.slab.bytes(h)
    }

    fn entry_mut(&mut self, local: u32) -> &mut Entry {
        let (g, i) = (local as usize / GROUP_PAGES, local as usize % GROUP_PAGES);
        if self.groups.len() <= g {
            self.groups.resize_with(g + 1, || None);
        }
        let t = self.groups[g].get_or_insert_with(|| {
            self.counts.groups += 1;
            Box::new([Entry::Hole; GROUP_PAGES])
        });
        &mut t[i]
    }

    fn count(&mut self, e: Entry, add: bool) {
        let c = match e {
            Entry::Hole => return,
            Entry::Same(_) => &mut self.counts.same_pages,
            Entry::Stored(h) if h.len as usize == PAGE_BYTES => &mut self.counts.huge_pages,
            Entry::Stored(_) => &mut self.counts.compressed_pages,
        };
        if add {
            *c += 1;
        } else {
            *c -= 1;
        }
    }

    /// Makes `local` hold `new`; returns the bytes of blocks released. On
    /// `SlabFull` the page keeps its old contents.
    pub fn place(
        &mut self,
        local: u32,
        new: Placing<'_>,
        mem: &impl Charge,
    ) -> Result<u64, SlabFull> {
        let entry = match (self.entry(local), new) {
            (_, Placing::Same(w)) => Entry::Same(w),
            // Same class: rewrite the slot in place, no allocation.
            (Entry::Stored(h), Placing::Bytes(d)) if class_of(d.len()) == h.class as usize => {
                self.overwrite(local, h, d);
                return Ok(0);
            }
            (_, Placing::Bytes(d)) => match self.slab.alloc(d, local, mem) {
                Ok(h) => Entry::Stored(h),
                Err(full) => {
                    // Compaction may give a block back; else the page's own
                    // slot may be big enough.
                    self.compact_all(mem);
                    match (self.slab.alloc(d, local, mem), self.entry(local)) {
                        (Ok(h), _) => Entry::Stored(h),
                        (Err(_), Entry::Stored(h)) if d.len() <= slot_bytes(h.class as usize) => {
                            self.overwrite(local, h, d);
                            return Ok(0);
                        }
                        (Err(_), _) => return Err(full),
                    }
                }
            },
        };
        // Compaction above may have moved the old object: look again.
        let old = self.entry(local);
        self.count(old, false);
        self.count(entry, true);
        *self.entry_mut(local) = entry;
        Ok(self.forget(old, mem))
    }

    /// Stores `d` in the slot `h` that `local` already holds.
    fn overwrite(&mut self, local: u32, h: Handle, d: &[u8]) {
        let nh = self.slab.overwrite(h, d);
        self.count(Entry::Stored(h), false);
        self.count(Entry::Stored(nh), true);
        *self.entry_mut(local) = Entry::Stored(nh);
    }

    /// Makes `local` a hole; returns the bytes released.
    pub fn trim(&mut self, local: u32, mem: &impl Charge) -> u64 {
        let old = self.entry(local);
        if old == Entry::Hole {
            return 0;
        }
        self.count(old, false);
        *self.entry_mut(local) = Entry::Hole;
        let g = local as usize / GROUP_PAGES;
        if let Some(Some(t)) = self.groups.get(g) {
            if t.iter().all(|e| *e == Entry::Hole) {
                self.groups[g] = None;
                self.counts.groups -= 1;
            }
        }
        self.forget(old, mem)
    }

    /// Frees the slot an old entry held, compacting its class when due.
    fn forget(&mut self, old: Entry, mem: &impl Charge) -> u64 {
        let Entry::Stored(h) = old else { return 0 };
        let before = self.slab.held_bytes();
        if self.slab.free(h, mem) {
            let groups = &mut self.groups;
            self.slab.compact(h.class as usize, mem, |owner, nh| {
                repoint(groups, owner, nh)
            });
        }
        before - self.slab.held_bytes()
    }

    /// Compacts every class that is worth it; returns the bytes released.
    pub fn compact_all(&mut self, mem: &impl Charge) -> u64 {
        let groups = &mut self.groups;
        self.slab
            .compact_all(mem, |owner, nh| repoint(groups, owner, nh))
    }

    /// Drops every table from local group `g` on (after a shrink); the
    /// caller has made their pages holes first.
    pub fn truncate_groups(&mut self, g: usize) {
        if self.groups.len() > g {
            self.groups.truncate(g);
            self.groups.shrink_to_fit();
        }
    }

    /// Local groups with a table slot (allocated or not).
    pub fn group_slots(&self) -> usize {
        self.groups.len()
    }

    pub fn counts(&self) -> ShardCounts {
        self.counts
    }

    pub fn held_bytes(&self) -> u64 {
        self.slab.held_bytes()
    }

    pub fn live_bytes(&self) -> u64 {
        self.slab.live_bytes()
    }

    pub fn compact_counts(&self) -> CompactCounts {
        self.slab.compact_counts()
    }

    /// Bytes of the table and the slabs' bookkeeping.
    pub fn metadata_bytes(&self) -> u64 {
        (self.groups.capacity() * std::mem::size_of::<Option<Group>>()
            + self.counts.groups as usize * std::mem::size_of::<[Entry; GROUP_PAGES]>())
            as u64
            + self.slab.metadata_bytes()
    }

    /// Checks the module's and the slab's invariants.
    pub fn check(&self) -> Result<(), &'static str> {
        self.slab.check()?;
        let mut counts = ShardCounts::default();
        let mut live = 0u64;
        for (g, t) in self.groups.iter().enumerate() {
            let Some(t) = t else { continue };
            counts.groups += 1;
            for (i, e) in t.iter().enumerate() {
                let local = (g * GROUP_PAGES + i) as u32;
                match *e {
                    Entry::Hole => {}
                    Entry::Same(_) => counts.same_pages += 1,
                    Entry::Stored(h) => {
                        if self.slab.owner(h) != local {
                            return Err("a page's slot is owned by another page");
                        }
                        let raw = h.len as usize == PAGE_BYTES;
                        if (raw && h.class as usize != RAW_CLASS)
                            || h.len as usize > slot_bytes(h.class as usize)
                        {
                            return Err("a page's length does not fit its class");
                        }
                        live += h.len as u64;
                        if raw {
                            counts.huge_pages += 1;
                        } else {
                            counts.compressed_pages += 1;
                        }
                    }
                }
            }
        }
        if counts != self.counts {
            return Err("page counts differ from the table");
        }
        if live != self.slab.live_bytes() {
            return Err("stored lengths differ from the slab's live bytes");
        }
        Ok(())
    }
}

/// Points `owner`'s entry at the slot compaction moved its object to.
fn repoint(groups: &mut [Option<Group>], owner: u32, nh: Handle) {
    let (g, i) = (owner as usize / GROUP_PAGES, owner as usize % GROUP_PAGES);
    let e = &mut groups[g].as_mut().expect("a moved object's group")[i];
    let Entry::Stored(h) = *e else {
        unreachable!("a moved object's page is stored")
    };
    *e = Entry::Stored(Handle { len: h.len, ..nh });
}
