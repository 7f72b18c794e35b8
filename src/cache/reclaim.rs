//! Giving memory back to the host under memory pressure
//! (`control::pressure` asks each cache once a second while memory is
//! short): empty slots first, then clean blocks in the order the policy
//! would evict them next. Dirty blocks are never dropped here: they are
//! the only copy of their data until the flusher writes them back, after
//! which a later round can take them.
//!
//! A slot given back is `madvise(DONTNEED)`ed under its write lock, its
//! charge returns to the daemon's budget, and it waits on
//! `Alloc::released` until a miss charges it again, so the cache grows
//! back once memory is available (the budget refuses that while memory is
//! short, and a refused cache asks again only once a second).

use std::sync::atomic::Ordering;

use super::engine::Inner;
use super::stats::Ctr;

impl Inner {
    /// Gives back up to `want_bytes` (rounded up to whole blocks) of slot
    /// memory; returns the bytes given back.
    pub(crate) fn give_back(&self, want_bytes: u64) -> u64 {
        let mut a = self.alloc.lock();
        let mut given = 0;
        // Empty slots first: giving them costs no cached data.
        let mut busy = Vec::new();
        while given < want_bytes {
            let Some(s) = a.free.pop() else { break };
            // A stale lookup may hold it a moment: skip rather than wait
            // (the policy mutex holder never blocks on a slot lock).
            match self.slots[s as usize].meta.try_write() {
                Some(_g) => {
                    self.release_slot(s);
                    a.released.push(s);
                    given += self.bs;
                }
                None => busy.push(s),
            }
        }
        a.free.extend(busy);
        while given < want_bytes {
            let Some((s, mut g)) = self.evict_clean(&mut a) else {
                break;
            };
            self.unmap_locked(s, &mut g);
            self.stats.add(Ctr::Evictions, 1);
            self.release_slot(s);
            drop(g);
            a.released.push(s);
            given += self.bs;
        }
        self.stats.add(Ctr::GivenBackBytes, given);
        given
    }

    /// Returns slot `s`'s memory to the OS and its charge to the budget.
    /// The caller holds the slot's write lock and takes it off every list
    /// but `released`.
    fn release_slot(&self, s: u32) {
        self.data
            .release((s as u64 * self.bs) as usize, self.bs as usize);
        if let Some(b) = &self.budget {
            b.release(self.bs);
            self.charged.fetch_sub(self.bs, Ordering::Relaxed);
        }
    }

    /// Bytes of slot memory committed now (resident or empty slots that
    /// were used and not given back).
    pub(crate) fn memory_bytes(&self) -> u64 {
        let a = self.alloc.lock();
        (a.fresh_next as u64 - a.released.len() as u64) * self.bs
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::block::backend::Backend;
    use crate::cache::{Cache, CacheConfig, Mode};
    use crate::sim::MemBacking;
    use crate::store::MemoryBudget;

    const BS: u64 = 4096;

    #[test]
    fn gives_back_clean_and_empty_slots_never_dirty_ones_and_regrows() {
        let init: Vec<u8> = (0..(1u64 << 20)).map(|i| (i * 7 % 251) as u8).collect();
        let backing = Arc::new(MemBacking::with_contents(init.clone()));
        let mut cfg = CacheConfig::new(Mode::WriteBack, 64 * BS);
        cfg.block_bytes = BS;
        cfg.sequential_cutoff_bytes = 0;
        cfg.max_dirty_age_ms = 3_600_000;
        cfg.dirty_high_percent = 100;
        cfg.dirty_low_percent = 90;
        let budget = Arc::new(MemoryBudget::new(1 << 30));
        let cache = Cache::new(backing.clone(), cfg, Some(budget.clone())).unwrap();
        let mut oracle = init.clone();
        // 48 clean blocks, 16 dirty ones: every slot in use.
        let mut buf = vec![0u8; (48 * BS) as usize];
        cache.read(0, &mut buf).unwrap();
        let dirty = vec![0xabu8; (16 * BS) as usize];
        cache.write(512 << 10, &dirty, false).unwrap();
        oracle[512 << 10..(512 << 10) + dirty.len()].copy_from_slice(&dirty);
        assert_eq!(budget.used_bytes(), 64 * BS);

        let given = cache.give_back(1 << 30);
        assert_eq!(given, 48 * BS, "every clean block, no dirty one");
        let s = cache.stats();
        assert_eq!(s.given_back_bytes, 48 * BS);
        assert_eq!((s.memory_bytes, s.resident_bytes), (16 * BS, 16 * BS));
        assert_eq!(s.dirty_bytes, 16 * BS);
        assert_eq!(budget.used_bytes(), 16 * BS);
        assert_eq!(cache.give_back(1 << 30), 0, "only dirty blocks are left");

        // Nothing is lost; reads fill the cache again, charged again.
        let mut all = vec![0u8; init.len()];
        cache.read(0, &mut all).unwrap();
        assert!(all == oracle);
        assert_eq!(cache.stats().memory_bytes, 64 * BS);
        assert_eq!(budget.used_bytes(), 64 * BS);
        // Written back, the dirty blocks can go too.
        cache.sync().unwrap();
        assert!(backing.contents() == oracle);
        assert_eq!(cache.give_back(20 * BS), 20 * BS);
        assert_eq!(budget.used_bytes(), 44 * BS);
    }

    #[test]
    fn a_refused_cache_asks_the_budget_again_later() {
        let backing = Arc::new(MemBacking::new(1 << 20));
        let mut cfg = CacheConfig::new(Mode::WriteThrough, 64 * BS);
        cfg.block_bytes = BS;
        cfg.sequential_cutoff_bytes = 0;
        let budget = Arc::new(MemoryBudget::new(8 * BS));
        let cache = Cache::new(backing, cfg, Some(budget.clone())).unwrap();
        let mut buf = vec![0u8; (32 * BS) as usize];
        cache.read(0, &mut buf).unwrap();
        assert_eq!(cache.stats().memory_bytes, 8 * BS, "held to its budget");
        assert_eq!(cache.give_back(4 * BS), 4 * BS);
        // Another user takes the room: the cache reuses its 4 slots.
        assert!(budget.try_reserve(4 * BS));
        cache.read(0, &mut buf).unwrap();
        assert_eq!(cache.stats().memory_bytes, 4 * BS);
        // The room comes back; after the retry interval the cache grows.
        budget.release(4 * BS);
        std::thread::sleep(std::time::Duration::from_millis(
            super::super::engine::BUDGET_RETRY_MS + 100,
        ));
        cache.read(0, &mut buf).unwrap();
        assert_eq!(cache.stats().memory_bytes, 8 * BS);
    }
}
