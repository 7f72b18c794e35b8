//! A shard's page table: one 8-byte entry per shard-local page, in chunks
//! of 128 entries allocated when one of their pages is not a hole.
//!
//! ```text
//!  chunks[local / 128] ──▶ Box<Chunk { entries: [u64; 128], used }>  (None: all holes)
//!
//!  entry (u64), tag in the low 2 bits:
//!   0  Hole                              (the whole entry is 0)
//!   1  Stored  | codec:2 | class:8 | len:13 | flags:2 | . | id:32   an object in the pool
//!   2  Raw     | flags:2 | . | page address (4 KiB aligned)         a whole arena page
//!   3  Same    | wide:1 | . | pattern:32                            a same-filled page
//!  flags of stored and raw pages: ACCESSED (read or written since the
//!  recompressor's last visit), KEPT (recompression tried, did not pay)
//! ```
//!
//! Entries are atomics: the shard's lock still guards them, but holding it
//! shared, a read may set the accessed flag (`touch`) and the recompressor
//! may swap the flags of an entry it saw (`swap_flags`): one atomic
//! operation on one entry's flags; nothing else changes that way.
//!
//! A same-filled page whose 8-byte word repeats a 32-bit pattern (zero,
//! byte fills, 16- and 32-bit patterns: nearly all of them) keeps the
//! pattern in its entry; any other word goes to a small side map by local
//! page (`wide`). A chunk covers 8 page groups, so a sparse drive pays at
//! most 1 KiB per 512 KiB of its address space it writes to, and a full
//! one 8 bytes per page (the first design: 16-byte entries in 16-entry
//! boxes, ~27 bytes a page with its slab bookkeeping).
//!
//! Invariants: `used` is the number of non-hole entries of its chunk (a
//! chunk with none is freed); `wide` has a key iff that page's entry is a
//! wide `Same`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::arena::Page;

/// Entries per chunk.
pub const CHUNK_ENTRIES: usize = 128;

const TAG_STORED: u64 = 1;
const TAG_RAW: u64 = 2;
const TAG_SAME: u64 = 3;
const SAME_WIDE: u64 = 1 << 2;
/// Entry flag: read or written since the recompressor last visited it.
pub const ACCESSED: u8 = 1;
/// Entry flag: recompression was tried and did not pay; it is not tried
/// again until the page is written.
pub const KEPT: u8 = 2;

/// What one page holds, decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Entry {
    /// Never written, or trimmed: reads as zero, reported as a hole.
    #[default]
    Hole,
    /// Every 8-byte word is this one; no bytes stored.
    Same(u64),
    /// The page as is, in its own arena page.
    Raw(Page),
    /// A compressed object in the pool.
    Stored(Obj),
}

/// Where a compressed page is: its class, id and length, and which of the
/// drive's codecs compressed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Obj {
    pub class: u8,
    pub id: u32,
    pub len: u16,
    /// 0: the drive's algorithm; 1: its recompression algorithm.
    pub codec: u8,
}

fn encode(e: Entry) -> u64 {
    match e {
        Entry::Hole => 0,
        Entry::Raw(p) => p.addr() as u64 | TAG_RAW,
        Entry::Stored(o) => {
            debug_assert!(o.len < 1 << 13 && o.codec < 4);
            TAG_STORED
                | (o.codec as u64) << 2
                | (o.class as u64) << 4
                | (o.len as u64) << 12
                | (o.id as u64) << 32
        }
        Entry::Same(w) => match narrow(w) {
            Some(p) => TAG_SAME | (p as u64) << 32,
            None => TAG_SAME | SAME_WIDE,
        },
    }
}

/// The entry `bits` encode; `wide` gives a wide same-filled word.
#[inline]
fn decode(bits: u64, wide: impl FnOnce() -> u64) -> Entry {
    match bits & 3 {
        0 => Entry::Hole,
        TAG_STORED => Entry::Stored(Obj {
            codec: (bits >> 2 & 3) as u8,
            class: (bits >> 4) as u8,
            len: (bits >> 12 & 0x1fff) as u16,
            id: (bits >> 32) as u32,
        }),
        TAG_RAW => Entry::Raw(Page::from_addr((bits & !0xfff) as usize)),
        _ if bits & SAME_WIDE != 0 => Entry::Same(wide()),
        _ => Entry::Same((bits >> 32) * 0x1_0000_0001),
    }
}

/// An entry as a kept drive's shadow holds it (`keep.rs`): no flags, a
/// raw page by its arena index (`index_of`) instead of its address; and
/// the wide same-filled word (0: none).
pub fn kept_bits(e: Entry, index_of: impl FnOnce(Page) -> u64) -> (u64, u64) {
    match e {
        Entry::Raw(p) => (index_of(p) << 12 | TAG_RAW, 0),
        Entry::Same(w) if narrow(w).is_none() => (TAG_SAME | SAME_WIDE, w),
        e => (encode(e), 0),
    }
}

/// The entry kept bits encode (see [`kept_bits`]), a raw page found by
/// its index with `page_at`; None when that page does not exist.
pub fn from_kept(bits: u64, wide: u64, page_at: impl FnOnce(u64) -> Option<Page>) -> Option<Entry> {
    match bits & 3 {
        TAG_RAW => page_at(bits >> 12).map(Entry::Raw),
        _ => Some(decode(bits, || wide)),
    }
}

/// The arena index of a raw page's kept bits (None: not a raw page).
pub fn kept_raw_index(bits: u64) -> Option<u64> {
    (bits & 3 == TAG_RAW).then_some(bits >> 12)
}

/// The 32-bit pattern a word repeats, if it does.
fn narrow(w: u64) -> Option<u32> {
    (w >> 32 == w & 0xffff_ffff).then_some(w as u32)
}

/// Where the flags of an entry with these bits are (None: it has none).
fn flag_shift(bits: u64) -> Option<u32> {
    match bits & 3 {
        TAG_STORED => Some(25),
        TAG_RAW => Some(2),
        _ => None,
    }
}

/// `bits` without their flags: equal for two entries of the same contents
/// in the same place.
pub fn without_flags(bits: u64) -> u64 {
    flag_shift(bits).map_or(bits, |s| bits & !(3 << s))
}

/// The flags in an entry's `bits`.
pub fn flags_of(bits: u64) -> u8 {
    flag_shift(bits).map_or(0, |s| (bits >> s & 3) as u8)
}

struct Chunk {
    entries: [AtomicU64; CHUNK_ENTRIES],
    used: u32,
}

/// A shard's page table (see the module docs).
#[derive(Default)]
pub struct Table {
    chunks: Vec<Option<Box<Chunk>>>,
    /// Same-filled pages whose word is not a repeated 32-bit pattern.
    wide: HashMap<u32, u64>,
    /// Chunks allocated.
    allocated: u64,
}

impl Table {
    /// The atomic entry of a local page (None: a hole without a chunk).
    #[inline]
    fn slot(&self, local: u32) -> Option<&AtomicU64> {
        let (c, i) = (
            local as usize / CHUNK_ENTRIES,
            local as usize % CHUNK_ENTRIES,
        );
        match self.chunks.get(c) {
            Some(Some(ch)) => Some(&ch.entries[i]),
            _ => None,
        }
    }

    /// The encoded entry of a local page, flags included.
    #[inline]
    pub fn bits(&self, local: u32) -> u64 {
        self.slot(local).map_or(0, |e| e.load(Relaxed))
    }

    /// The entry of a local page.
    #[inline]
    pub fn get(&self, local: u32) -> Entry {
        self.decode(local, self.bits(local))
    }

    /// The entry `bits` of `local` encode.
    #[inline]
    pub fn decode(&self, local: u32, bits: u64) -> Entry {
        decode(bits, || self.wide[&local])
    }

    /// Sets the accessed flag of a stored or raw page if it is clear (a
    /// read, under the shard's shared lock).
    #[inline]
    pub fn touch(&self, local: u32) {
        let Some(e) = self.slot(local) else { return };
        let bits = e.load(Relaxed);
        if let Some(s) = flag_shift(bits) {
            if bits >> s & ACCESSED as u64 == 0 {
                e.fetch_or((ACCESSED as u64) << s, Relaxed);
            }
        }
    }

    /// Replaces the flags of a page whose entry is still `bits` with
    /// `flags`; false when the entry changed meanwhile.
    pub fn swap_flags(&self, local: u32, bits: u64, flags: u8) -> bool {
        let (Some(e), Some(s)) = (self.slot(local), flag_shift(bits)) else {
            return false;
        };
        let new = without_flags(bits) | ((flags & 3) as u64) << s;
        e.compare_exchange(bits, new, Relaxed, Relaxed).is_ok()
    }

    /// Makes `local` hold `e` with `flags` (ignored for holes and
    /// same-filled pages).
    pub fn set(&mut self, local: u32, e: Entry, flags: u8) {
        let mut bits = encode(e);
        if let Some(s) = flag_shift(bits) {
            bits |= ((flags & 3) as u64) << s;
        }
        if bits & (3 | SAME_WIDE) == TAG_SAME | SAME_WIDE {
            let Entry::Same(w) = e else { unreachable!() };
            self.wide.insert(local, w);
        } else if self.wide.contains_key(&local) {
            self.wide.remove(&local);
        }
        let (c, i) = (
            local as usize / CHUNK_ENTRIES,
            local as usize % CHUNK_ENTRIES,
        );
        if self.chunks.len() <= c {
            if bits == 0 {
                return;
            }
            self.chunks.resize_with(c + 1, || None);
        }
        let slot = &mut self.chunks[c];
        let ch = match slot {
            Some(ch) => ch,
            None if bits == 0 => return,
            None => {
                self.allocated += 1;
                slot.insert(Box::new(Chunk {
                    entries: [const { AtomicU64::new(0) }; CHUNK_ENTRIES],
                    used: 0,
                }))
            }
        };
        match (ch.entries[i].load(Relaxed) != 0, bits != 0) {
            (false, true) => ch.used += 1,
            (true, false) => ch.used -= 1,
            _ => {}
        }
        ch.entries[i].store(bits, Relaxed);
        if ch.used == 0 {
            *slot = None;
            self.allocated -= 1;
            super::heap::note_freed(std::mem::size_of::<Chunk>() as u64);
        }
    }

    /// Drops every chunk from local page `local` on (after a shrink made
    /// those pages holes).
    pub fn truncate(&mut self, local: u32) {
        let keep = (local as usize).div_ceil(CHUNK_ENTRIES);
        if self.chunks.len() > keep {
            debug_assert!(self.chunks[keep..].iter().all(|c| c.is_none()));
            self.chunks.truncate(keep);
            self.chunks.shrink_to_fit();
        }
    }

    /// Local pages the table has room for (entries beyond are holes).
    pub fn len(&self) -> u32 {
        (self.chunks.len() * CHUNK_ENTRIES) as u32
    }

    /// Calls `f(local, entry)` for every page that is not a hole.
    pub fn for_each(&self, mut f: impl FnMut(u32, Entry)) {
        for (c, ch) in self.chunks.iter().enumerate() {
            let Some(ch) = ch else { continue };
            for (i, bits) in ch.entries.iter().enumerate() {
                let bits = bits.load(Relaxed);
                if bits != 0 {
                    let local = (c * CHUNK_ENTRIES + i) as u32;
                    f(local, self.decode(local, bits));
                }
            }
        }
    }

    /// Bytes of the table.
    pub fn metadata_bytes(&self) -> u64 {
        (self.chunks.capacity() * std::mem::size_of::<Option<Box<Chunk>>>()) as u64
            + self.allocated * std::mem::size_of::<Chunk>() as u64
            + (self.wide.capacity() * (std::mem::size_of::<(u32, u64)>() + 1)) as u64
    }

    /// Checks the module's invariants.
    pub fn check(&self) -> Result<(), &'static str> {
        let mut allocated = 0;
        let mut wide = 0;
        for ch in self.chunks.iter().flatten() {
            allocated += 1;
            let bits: Vec<u64> = ch.entries.iter().map(|e| e.load(Relaxed)).collect();
            if ch.used as usize != bits.iter().filter(|&&b| b != 0).count() || ch.used == 0 {
                return Err("a table chunk's count differs from its entries");
            }
            wide += bits
                .iter()
                .filter(|&&b| b & (3 | SAME_WIDE) == TAG_SAME | SAME_WIDE)
                .count();
        }
        if allocated != self.allocated {
            return Err("the table's chunk count is off");
        }
        if wide != self.wide.len() {
            return Err("the wide same-filled words differ from their entries");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let mut t = Table::default();
        let obj = Obj {
            class: 251,
            id: u32::MAX - 1,
            len: 4032,
            codec: 1,
        };
        let page = Page::from_addr(0x7fff_ffff_f000);
        let cases = [
            Entry::Same(0),
            Entry::Same(u64::MAX),
            Entry::Same(0x0102_0304_0506_0708),
            Entry::Same(0xabab_abab_abab_abab),
            Entry::Raw(page),
            Entry::Stored(obj),
            Entry::Stored(Obj {
                len: 1,
                id: 0,
                class: 0,
                codec: 0,
            }),
        ];
        for (i, e) in cases.iter().enumerate() {
            let local = (i * 300) as u32;
            t.set(local, *e, ACCESSED);
            assert_eq!(t.get(local), *e);
            let bits = t.bits(local);
            if matches!(e, Entry::Raw(_) | Entry::Stored(_)) {
                assert_eq!(flags_of(bits), ACCESSED);
                assert!(t.swap_flags(local, bits, KEPT));
                assert!(!t.swap_flags(local, bits, 0), "the entry changed");
                assert_eq!(flags_of(t.bits(local)), KEPT);
                assert_eq!(without_flags(t.bits(local)), without_flags(bits));
                t.touch(local);
                assert_eq!(flags_of(t.bits(local)), KEPT | ACCESSED);
            }
            assert_eq!(t.get(local), *e);
        }
        assert_eq!(t.get(1), Entry::Hole);
        assert_eq!(t.get(1 << 30), Entry::Hole);
        assert_eq!(t.wide.len(), 1);
        t.check().unwrap();
        for i in 0..cases.len() {
            t.set((i * 300) as u32, Entry::Hole, 0);
        }
        assert!(t.wide.is_empty());
        assert_eq!(t.allocated, 0);
        t.check().unwrap();
        t.truncate(0);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn kept_entries_round_trip_with_raw_pages_by_index() {
        let page = Page::from_addr(0x7f00_0000_5000);
        let obj = Obj {
            class: 9,
            id: 77,
            len: 150,
            codec: 1,
        };
        for e in [
            Entry::Hole,
            Entry::Same(0),
            Entry::Same(0x0102_0304_0506_0708),
            Entry::Raw(page),
            Entry::Stored(obj),
        ] {
            let (bits, wide) = kept_bits(e, |p| {
                assert_eq!(p, page);
                123_456
            });
            let back = from_kept(bits, wide, |i| {
                assert_eq!(i, 123_456);
                Some(page)
            });
            assert_eq!(back, Some(e));
        }
        let (bits, _) = kept_bits(Entry::Raw(page), |_| 5);
        assert_eq!(from_kept(bits, 0, |_| None), None);
    }
}
