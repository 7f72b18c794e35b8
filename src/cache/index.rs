//! The block index: which cache slot holds which backing block.
//!
//! A hash map split into shards, each behind its own mutex, so lookups of
//! unrelated blocks never contend. A shard lock is a leaf: it is held only
//! for the map operation itself, never while taking another lock or doing
//! I/O. Keys are block numbers, hashed with one multiplication (they are
//! not attacker-chosen in a way that matters: a collision only costs a
//! longer probe within one shard).

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

/// Shards (a power of two); enough that two connections rarely meet.
const SHARDS: usize = 256;

/// Block number → slot.
pub struct Index {
    shards: Box<[Mutex<Map>]>,
}

#[inline]
fn shard_of(block: u64) -> usize {
    // Neighbouring blocks land in different shards.
    (block.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % SHARDS
}

impl Index {
    pub fn new(slots: usize) -> Self {
        let per = slots / SHARDS + 1;
        Index {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Map::with_capacity_and_hasher(per, Default::default())))
                .collect(),
        }
    }

    #[inline]
    pub fn get(&self, block: u64) -> Option<u32> {
        self.shards[shard_of(block)].lock().get(&block).copied()
    }

    /// Maps `block` to `slot` unless it is mapped already (then returns the
    /// slot it maps to).
    pub fn insert_if_absent(&self, block: u64, slot: u32) -> Result<(), u32> {
        let mut m = self.shards[shard_of(block)].lock();
        match m.get(&block) {
            Some(&s) => Err(s),
            None => {
                m.insert(block, slot);
                Ok(())
            }
        }
    }

    /// Unmaps `block` if it maps to `slot`.
    pub fn remove_if(&self, block: u64, slot: u32) -> bool {
        let mut m = self.shards[shard_of(block)].lock();
        if m.get(&block) == Some(&slot) {
            m.remove(&block);
            true
        } else {
            false
        }
    }

    /// Number of mapped blocks.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove() {
        let i = Index::new(100);
        assert_eq!(i.get(5), None);
        i.insert_if_absent(5, 1).unwrap();
        assert_eq!(i.insert_if_absent(5, 2), Err(1));
        assert_eq!(i.get(5), Some(1));
        assert!(!i.remove_if(5, 2));
        assert!(i.remove_if(5, 1));
        assert!(i.is_empty());
    }
}
