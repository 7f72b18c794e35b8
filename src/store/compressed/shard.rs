//! One shard of a compressed drive: the page table of the page groups it
//! owns (`table.rs`) and its page counts, under one lock (the caller's).
//! The bytes live outside it, in the drive's pool (`pool.rs`, compressed
//! objects) and arena (`arena.rs`, raw pages).
//!
//! ```text
//!  local page = local group * 16 + page % 16
//!  entry: Hole | Same(word) | Raw(arena page) | Stored(class, id, len, codec)
//! ```
//!
//! Invariants: `counts` counts the `Same`, `Raw` and `Stored` entries; a
//! `Raw` entry's page belongs to that entry alone (so it is read and written
//! under the shard's lock and needs no other), a `Stored` entry names an
//! object no other entry names.

use super::arena::{Charge, NoPage, Page, PageArena, PAGE_BYTES};
use super::page::Packed;
use super::pool::{class_for, slot_bytes, Pool};
use super::table::{self, Entry, Obj, Table};
use crate::store::ntcopy::copy_streaming;

/// Pages per group: the unit of sharding (64 KiB, the raw store's chunk).
pub const GROUP_PAGES: usize = 16;
/// Shards per drive (see the module docs).
pub const SHARDS: usize = 16;

/// Where page `p` lives: its shard and shard-local page index.
#[inline]
pub fn locate(p: u64) -> (usize, u32) {
    let g = p / GROUP_PAGES as u64;
    let local = (g / SHARDS as u64) * GROUP_PAGES as u64 + p % GROUP_PAGES as u64;
    ((g % SHARDS as u64) as usize, local as u32)
}

/// The page a shard-local page of shard `si` is.
#[inline]
pub fn global_page(si: usize, local: u32) -> u64 {
    let (lg, i) = (
        local as u64 / GROUP_PAGES as u64,
        local as u64 % GROUP_PAGES as u64,
    );
    (lg * SHARDS as u64 + si as u64) * GROUP_PAGES as u64 + i
}

/// How many of shard `si`'s local pages lie before page `first`.
pub fn locals_before(si: usize, first: u64) -> u32 {
    let (g_first, part) = (first / GROUP_PAGES as u64, first % GROUP_PAGES as u64);
    let full = g_first.saturating_sub(si as u64).div_ceil(SHARDS as u64);
    let partial = if g_first % SHARDS as u64 == si as u64 {
        part
    } else {
        0
    };
    (full * GROUP_PAGES as u64 + partial) as u32
}

/// Page counts of a shard, summed into the drive's stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardCounts {
    /// Same-filled pages (zero pages included).
    pub same_pages: u64,
    /// Pages stored raw.
    pub huge_pages: u64,
    /// Pages stored compressed.
    pub compressed_pages: u64,
    /// Of those, pages the drive's second codec compressed.
    pub recompressed_pages: u64,
}

/// The drive-wide places a shard's pages go, and the budgets they charge.
pub struct Space<'a, C: Charge> {
    pub pool: &'a Pool,
    pub arena: &'a PageArena,
    pub charge: &'a C,
}

/// A shard: its table and counts.
pub struct Shard {
    /// Its index in the drive (for a kept drive's shadow: `keep.rs`).
    index: usize,
    table: Table,
    counts: ShardCounts,
}

/// A page ready to place.
#[derive(Debug, Clone, Copy)]
pub enum Placing<'a> {
    Same(u64),
    /// Compressed `bytes` (by the drive's codec `codec`) of `page`.
    Compressed {
        bytes: &'a [u8],
        page: &'a [u8],
        codec: u8,
    },
    /// The page itself (it did not compress below the raw threshold).
    Raw(&'a [u8]),
}

impl<'a> Placing<'a> {
    /// From `pack`'s result: `packed` bytes in `buf`, or the page itself.
    pub fn new(packed: Packed, buf: &'a [u8], page: &'a [u8], codec: u8) -> Placing<'a> {
        match packed {
            Packed::Same(w) => Placing::Same(w),
            Packed::Compressed(n) => Placing::Compressed {
                bytes: &buf[..n],
                page,
                codec,
            },
            Packed::Raw => Placing::Raw(page),
        }
    }
}

/// Copies a whole page into a raw page the caller owns under the shard's
/// exclusive lock.
fn fill_raw(p: Page, d: &[u8]) {
    debug_assert_eq!(d.len(), PAGE_BYTES);
    // SAFETY: `p` is an arena page owned by one entry of this shard (or
    // just taken for it), and the caller holds the shard's lock
    // exclusively; both are PAGE_BYTES long. Streaming stores, as in the
    // raw store (`store::ntcopy`).
    unsafe { copy_streaming(d.as_ptr(), p.bytes_mut().as_mut_ptr(), PAGE_BYTES) };
}

impl Shard {
    /// Shard `index` of a drive, empty.
    pub fn new(index: usize) -> Shard {
        Shard {
            index,
            table: Table::default(),
            counts: ShardCounts::default(),
        }
    }

    /// Sets a local page's entry; in a kept drive its shadow too, after
    /// what the entry names is written and before what it replaced is
    /// freed (`keep.rs`).
    fn set<C: Charge>(&mut self, local: u32, e: Entry, flags: u8, sp: &Space<'_, C>) {
        self.table.set(local, e, flags);
        if let Some(k) = sp.arena.keep() {
            let (bits, wide) = table::kept_bits(e, |p| sp.arena.index_of(p));
            k.set_entry(global_page(self.index, local), bits, wide);
        }
    }

    /// Takes a local page's entry from a kept drive's shadow (adoption:
    /// `adopt.rs`).
    pub fn adopt_entry(&mut self, local: u32, e: Entry) {
        self.table.set(local, e, 0);
        self.count(e, true);
    }

    /// The entry of a local page.
    #[inline]
    pub fn entry(&self, local: u32) -> Entry {
        self.table.get(local)
    }

    /// The encoded entry of a local page, flags included (`table.rs`).
    pub fn bits(&self, local: u32) -> u64 {
        self.table.bits(local)
    }

    /// The entry `bits` of `local` encode.
    pub fn decode(&self, local: u32, bits: u64) -> Entry {
        self.table.decode(local, bits)
    }

    /// Marks a page accessed (a read, under the shared lock).
    #[inline]
    pub fn touch(&self, local: u32) {
        self.table.touch(local)
    }

    /// Replaces the flags of an entry still `bits` (under the shared lock);
    /// false when it changed.
    pub fn swap_flags(&self, local: u32, bits: u64, flags: u8) -> bool {
        self.table.swap_flags(local, bits, flags)
    }

    fn count(&mut self, e: Entry, add: bool) {
        let bump = |c: &mut u64| match add {
            true => *c += 1,
            false => *c -= 1,
        };
        match e {
            Entry::Hole => {}
            Entry::Same(_) => bump(&mut self.counts.same_pages),
            Entry::Raw(_) => bump(&mut self.counts.huge_pages),
            Entry::Stored(o) => {
                bump(&mut self.counts.compressed_pages);
                if o.codec == 1 {
                    bump(&mut self.counts.recompressed_pages);
                }
            }
        }
    }

    /// Makes `local` hold `new`, its entry with `flags` (`table.rs`). On
    /// `NoPage` the page keeps its old contents.
    pub fn place<C: Charge>(
        &mut self,
        local: u32,
        new: Placing<'_>,
        flags: u8,
        sp: &Space<'_, C>,
    ) -> Result<(), NoPage> {
        let old = self.table.get(local);
        let entry = match new {
            Placing::Same(w) => Entry::Same(w),
            Placing::Raw(d) => match old {
                Entry::Raw(p) => {
                    fill_raw(p, d);
                    self.table.set(local, old, flags);
                    return Ok(());
                }
                _ => {
                    let p = sp.arena.take(sp.charge)?;
                    fill_raw(p, d);
                    Entry::Raw(p)
                }
            },
            Placing::Compressed { bytes, page, codec } => {
                // A kept drive's objects end with their id and are never
                // rewritten in place (`keep.rs`).
                let kept = sp.arena.keep().is_some();
                let Some(class) = class_for(bytes.len(), kept) else {
                    return self.place(local, Placing::Raw(page), flags, sp);
                };
                let obj = |class: usize, id| Obj {
                    class: class as u8,
                    id,
                    len: bytes.len() as u16,
                    codec,
                };
                match old {
                    // Same class: rewrite the slot in place.
                    Entry::Stored(o) if o.class as usize == class && !kept => {
                        sp.pool.overwrite(class, o.id, o.len as usize, bytes);
                        self.recount(old, Entry::Stored(obj(class, o.id)));
                        self.table
                            .set(local, Entry::Stored(obj(class, o.id)), flags);
                        return Ok(());
                    }
                    _ => match sp.pool.alloc(bytes, sp.arena, sp.charge) {
                        Ok(id) => Entry::Stored(obj(class, id)),
                        // A recompression (codec 1) that finds no memory
                        // leaves the page as it is, to try again later.
                        Err(e) if codec != 0 => return Err(e),
                        // No memory for it in its class: the page's own
                        // memory may hold it.
                        Err(e) => match old {
                            Entry::Stored(o)
                                if !kept && bytes.len() <= slot_bytes(o.class as usize) =>
                            {
                                let c = o.class as usize;
                                sp.pool.overwrite(c, o.id, o.len as usize, bytes);
                                self.recount(old, Entry::Stored(obj(c, o.id)));
                                self.table.set(local, Entry::Stored(obj(c, o.id)), flags);
                                return Ok(());
                            }
                            Entry::Raw(p) => {
                                fill_raw(p, page);
                                self.table.set(local, old, flags);
                                return Ok(());
                            }
                            _ => return Err(e),
                        },
                    },
                }
            }
        };
        self.count(old, false);
        self.count(entry, true);
        self.set(local, entry, flags, sp);
        self.forget(old, sp);
        Ok(())
    }

    fn recount(&mut self, old: Entry, new: Entry) {
        self.count(old, false);
        self.count(new, true);
    }

    /// Makes `local` a hole.
    pub fn trim<C: Charge>(&mut self, local: u32, sp: &Space<'_, C>) {
        let old = self.table.get(local);
        if old == Entry::Hole {
            return;
        }
        self.count(old, false);
        self.set(local, Entry::Hole, 0, sp);
        self.forget(old, sp);
    }

    /// Frees what an old entry held.
    fn forget<C: Charge>(&mut self, old: Entry, sp: &Space<'_, C>) {
        match old {
            Entry::Stored(o) => {
                sp.pool
                    .free(o.class as usize, o.id, o.len as usize, sp.arena, sp.charge);
            }
            Entry::Raw(p) => sp.arena.give(p, sp.charge),
            Entry::Hole | Entry::Same(_) => {}
        }
    }

    /// Drops the table beyond local page `local` (its pages are holes).
    pub fn truncate(&mut self, local: u32) {
        self.table.truncate(local);
    }

    /// Local pages the table has room for (the rest are holes).
    pub fn table_len(&self) -> u32 {
        self.table.len()
    }

    pub fn counts(&self) -> ShardCounts {
        self.counts
    }

    /// Bytes of the table.
    pub fn metadata_bytes(&self) -> u64 {
        self.table.metadata_bytes()
    }

    /// Checks the table and the counts; adds each `Stored` entry's (id,
    /// len) to `refs[class]` and returns the raw pages, for the drive's
    /// check of the pool and the arena.
    pub fn check(&self, refs: &mut [Vec<(u32, u16)>]) -> Result<u64, &'static str> {
        self.table.check()?;
        let mut counts = ShardCounts::default();
        let mut bad = false;
        self.table.for_each(|_, e| match e {
            Entry::Hole => bad = true,
            Entry::Same(_) => counts.same_pages += 1,
            Entry::Raw(p) => {
                counts.huge_pages += 1;
                bad |= p.addr() % PAGE_BYTES != 0;
            }
            Entry::Stored(o) => {
                counts.compressed_pages += 1;
                counts.recompressed_pages += (o.codec == 1) as u64;
                bad |= o.codec > 1;
                refs[o.class as usize].push((o.id, o.len));
            }
        });
        if bad {
            return Err("the table holds a malformed entry");
        }
        if counts != self.counts {
            return Err("page counts differ from the table");
        }
        Ok(counts.huge_pages)
    }
}
