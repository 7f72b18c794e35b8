//! The block index: which cache slot holds which backing block.
//!
//! Two forms, chosen by the backing's size:
//!
//! - **Flat** (backings of at most `FLAT_MAX_BLOCKS` blocks, e.g. 64 GiB
//!   at 4 KiB blocks): one `u32` per backing block, `slot + 1` or 0, in a
//!   lazily committed mapping (untouched regions of the backing cost no
//!   memory). Lookups are one atomic load and updates one compare-exchange:
//!   no lock on the hit path at all.
//! - **Sharded** (larger backings): a hash map split into shards, each
//!   behind its own mutex, sized by the cache rather than the backing. A
//!   shard lock is a leaf: held only for the map operation itself, never
//!   while taking another lock or doing I/O. Keys are block numbers,
//!   hashed with one multiplication.
//!
//! Either way the index is a hint that the caller confirms under the
//! slot's lock (see engine.rs).

use std::sync::atomic::{AtomicU32, Ordering};

use crate::store::region::Region;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use parking_lot::Mutex;

/// A multiplicative hasher for u64 keys.
#[derive(Default)]
pub struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Map = HashMap<u64, u32, BuildHasherDefault<BlockHasher>>;

/// Backings with at most this many blocks get the flat index (its
/// mapping is at most 64 MiB of address space, committed as touched).
pub const FLAT_MAX_BLOCKS: u64 = 16 << 20;

/// Block number → slot.
pub enum Index {
    Flat(Flat),
    Sharded(Sharded),
}

impl Index {
    /// An index for a cache of `slots` over a backing of `blocks` blocks.
    pub fn new(slots: usize, blocks: u64) -> std::io::Result<Self> {
        if blocks <= FLAT_MAX_BLOCKS {
            Ok(Index::Flat(Flat::new(blocks)?))
        } else {
            Ok(Index::Sharded(Sharded::new(slots)))
        }
    }

    #[inline]
    pub fn get(&self, block: u64) -> Option<u32> {
        match self {
            Index::Flat(f) => f.get(block),
            Index::Sharded(s) => s.get(block),
        }
    }

    /// Maps `block` to `slot` unless it is mapped already (then returns the
    /// slot it maps to).
    pub fn insert_if_absent(&self, block: u64, slot: u32) -> Result<(), u32> {
        match self {
            Index::Flat(f) => f.insert_if_absent(block, slot),
            Index::Sharded(s) => s.insert_if_absent(block, slot),
        }
    }

    /// Unmaps `block` if it maps to `slot`.
    pub fn remove_if(&self, block: u64, slot: u32) -> bool {
        match self {
            Index::Flat(f) => f.remove_if(block, slot),
            Index::Sharded(s) => s.remove_if(block, slot),
        }
    }
}

/// One `AtomicU32` per block in an anonymous mapping: `slot + 1`, 0 = none.
pub struct Flat {
    map: Region,
    blocks: u64,
}

impl Flat {
    fn new(blocks: u64) -> std::io::Result<Flat> {
        Ok(Flat {
            map: Region::new((blocks.max(1) * 4) as usize, false)?,
            blocks,
        })
    }

    #[inline]
    fn cell(&self, block: u64) -> &AtomicU32 {
        assert!(block < self.blocks, "block {block} beyond the index");
        // SAFETY: the mapping holds `blocks` u32 cells, page aligned (so
        // 4-byte aligned), zero-initialised by the kernel, and lives as long
        // as `self`; AtomicU32 has the size and alignment of u32, and every
        // access to the cells goes through this atomic view.
        unsafe { &*(self.map.ptr((block * 4) as usize) as *const AtomicU32) }
    }

    #[inline]
    fn get(&self, block: u64) -> Option<u32> {
        match self.cell(block).load(Ordering::Acquire) {
            0 => None,
            v => Some(v - 1),
        }
    }

    fn insert_if_absent(&self, block: u64, slot: u32) -> Result<(), u32> {
        self.cell(block)
            .compare_exchange(0, slot + 1, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
            .map_err(|v| v - 1)
    }

    fn remove_if(&self, block: u64, slot: u32) -> bool {
        self.cell(block)
            .compare_exchange(slot + 1, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Shards (a power of two); enough that two connections rarely meet.
const SHARDS: usize = 256;

/// A hash map in shards.
pub struct Sharded {
    shards: Box<[Mutex<Map>]>,
}

#[inline]
fn shard_of(block: u64) -> usize {
    // Neighbouring blocks land in different shards.
    (block.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % SHARDS
}

impl Sharded {
    fn new(slots: usize) -> Self {
        let per = slots / SHARDS + 1;
        Sharded {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Map::with_capacity_and_hasher(per, Default::default())))
                .collect(),
        }
    }

    #[inline]
    fn get(&self, block: u64) -> Option<u32> {
        self.shards[shard_of(block)].lock().get(&block).copied()
    }

    fn insert_if_absent(&self, block: u64, slot: u32) -> Result<(), u32> {
        let mut m = self.shards[shard_of(block)].lock();
        match m.get(&block) {
            Some(&s) => Err(s),
            None => {
                m.insert(block, slot);
                Ok(())
            }
        }
    }

    fn remove_if(&self, block: u64, slot: u32) -> bool {
        let mut m = self.shards[shard_of(block)].lock();
        if m.get(&block) == Some(&slot) {
            m.remove(&block);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_insert_get_remove() {
        for i in [
            Index::new(100, 1000).unwrap(),
            Index::new(100, FLAT_MAX_BLOCKS + 1).unwrap(),
        ] {
            assert_eq!(i.get(5), None);
            i.insert_if_absent(5, 0).unwrap();
            assert_eq!(i.insert_if_absent(5, 2), Err(0));
            assert_eq!(i.get(5), Some(0));
            assert!(!i.remove_if(5, 2));
            assert!(i.remove_if(5, 0));
            assert_eq!(i.get(5), None);
            i.insert_if_absent(999, u32::MAX - 1).unwrap();
            assert_eq!(i.get(999), Some(u32::MAX - 1));
        }
        assert!(matches!(Index::new(1, 1000).unwrap(), Index::Flat(_)));
    }
}
