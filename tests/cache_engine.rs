//! Behaviour of the cache engine over the in-memory backing: watermarks,
//! age-triggered write-back, sequential bypass, hit accounting, the memory
//! budget, FUA, and a full cache of dirty data over a dead backing.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{wait_until, WAIT_TIMEOUT};
use ramd::block::backend::Backend;
use ramd::cache::{Cache, CacheConfig, Mode, PolicyKind};
use ramd::sim::MemBacking;
use ramd::store::MemoryBudget;

const BS: u64 = 4096;

fn cfg(mode: Mode, slots: u64) -> CacheConfig {
    let mut c = CacheConfig::new(mode, slots * BS);
    c.retry_initial_ms = 10;
    c.retry_max_ms = 50;
    c
}

#[test]
fn flusher_drains_from_the_high_to_the_low_watermark() {
    let backing = Arc::new(MemBacking::new(4 << 20));
    let mut c = cfg(Mode::WriteBack, 100);
    c.dirty_high_percent = 50;
    c.dirty_low_percent = 20;
    c.max_dirty_age_ms = 3_600_000;
    let cache = Cache::new(backing.clone(), c, None).unwrap();
    // A flusher scan that began after the last of these writes saw them
    // all (and, below the high watermark, must leave them dirty).
    for b in 0..40 {
        cache
            .write(b * BS, &[b as u8 + 1; BS as usize], false)
            .unwrap();
    }
    let scans = cache.stats().flusher_scans;
    wait_until("a flusher scan after the writes", WAIT_TIMEOUT, || {
        cache.stats().flusher_scans >= scans + 2
    });
    // Below the high watermark nothing is written back (the age limit is
    // an hour away).
    assert_eq!(cache.dirty_bytes(), 40 * BS);
    assert_eq!(backing.writes.load(Ordering::Relaxed), 0);
    for b in 40..55 {
        cache
            .write(b * BS, &[b as u8 + 1; BS as usize], false)
            .unwrap();
    }
    wait_until(
        "the flusher to drain to the low watermark",
        WAIT_TIMEOUT,
        || cache.dirty_bytes() <= 20 * BS,
    );
    // It stops at the low watermark: 20 blocks stay dirty, through the
    // scans after the drain too.
    assert_eq!(cache.dirty_bytes(), 20 * BS);
    let scans = cache.stats().flusher_scans;
    wait_until("flusher scans after the drain", WAIT_TIMEOUT, || {
        cache.stats().flusher_scans >= scans + 2
    });
    assert_eq!(cache.dirty_bytes(), 20 * BS);
    let s = cache.stats();
    assert_eq!(s.writeback_bytes, 35 * BS);
    cache.close(false).unwrap();
    let d = backing.durable();
    for b in 0..55u64 {
        assert_eq!(d[(b * BS) as usize], b as u8 + 1);
    }
}

#[test]
fn old_dirty_data_is_written_back_by_age() {
    let backing = Arc::new(MemBacking::new(1 << 20));
    let mut c = cfg(Mode::WriteBack, 64);
    c.max_dirty_age_ms = 30;
    let cache = Cache::new(backing.clone(), c, None).unwrap();
    // Dirty, then written back by the flusher (not asserted dirty in
    // between: 30 ms is a moment a busy machine can take between two
    // lines; `fua_write_back_is_durable_before_the_reply` shows a write
    // stays dirty while the age limit is far).
    cache.write(12_345, &[7; 10_000], false).unwrap();
    wait_until("age-triggered write-back", WAIT_TIMEOUT, || {
        cache.dirty_bytes() == 0
    });
    assert!(backing.contents()[12_345..22_345].iter().all(|&x| x == 7));
    let s = cache.stats();
    assert!(s.writeback_bytes >= 10_000, "{s:?}");
    assert_eq!(s.writeback_lag_ms, 0);
}

#[test]
fn hits_never_touch_the_backing_and_ratios_add_up() {
    let backing = Arc::new(MemBacking::new(1 << 20));
    let cache = Cache::new(backing.clone(), cfg(Mode::WriteThrough, 64), None).unwrap();
    let mut buf = vec![0u8; 6000];
    cache.read(1000, &mut buf).unwrap(); // blocks 0 and 1: 2 misses
    let reads = backing.reads.load(Ordering::Relaxed);
    for _ in 0..3 {
        cache.read(1000, &mut buf).unwrap(); // 2 hits each
    }
    assert_eq!(backing.reads.load(Ordering::Relaxed), reads);
    // Write-through: a partial write of a cached block updates it in place.
    cache.write(1500, &[9; 100], false).unwrap();
    cache.read(1000, &mut buf).unwrap();
    assert_eq!(&buf[500..600], &[9; 100][..]);
    assert_eq!(backing.reads.load(Ordering::Relaxed), reads);
    let s = cache.stats();
    assert_eq!((s.read_hits, s.read_misses), (8, 2));
    assert_eq!((s.write_hits, s.write_misses), (1, 0));
    assert!((s.read_hit_ratio() - 0.8).abs() < 1e-9);
    assert!((s.write_hit_ratio() - 1.0).abs() < 1e-9);
    assert_eq!(s.resident_bytes, 2 * BS);
}

#[test]
fn a_sequential_scan_bypasses_and_the_working_set_survives() {
    for policy in [PolicyKind::S3Fifo, PolicyKind::Lru] {
        let backing = Arc::new(MemBacking::new(16 << 20));
        let mut c = cfg(Mode::WriteBack, 64);
        c.policy = policy;
        c.sequential_cutoff_bytes = 128 << 10;
        let cache = Cache::new(backing.clone(), c, None).unwrap();
        let mut buf = vec![0u8; BS as usize];
        // A working set of 32 scattered blocks, read twice.
        let ws: Vec<u64> = (0..32).map(|i| (i * 37 % 1000) * BS).collect();
        for _ in 0..2 {
            for &o in &ws {
                cache.read(o, &mut buf).unwrap();
            }
        }
        let before = cache.stats();
        // An 8 MiB sequential stream in 64 KiB reads and writes.
        let mut big = vec![0u8; 64 << 10];
        for i in 0..64u64 {
            cache.read((4 << 20) + i * (64 << 10), &mut big).unwrap();
        }
        for i in 0..64u64 {
            cache
                .write((12 << 20) + i * (64 << 10), &big, false)
                .unwrap();
        }
        let mid = cache.stats();
        assert!(mid.bypassed_requests >= 120, "{policy}: {mid:?}");
        // The stream did not push the working set out.
        for &o in &ws {
            cache.read(o, &mut buf).unwrap();
        }
        let after = cache.stats();
        assert_eq!(after.read_hits - mid.read_hits, 32, "{policy}");
        // Only each stream's first request (below the cutoff) was cached,
        // which fits beside the working set: nothing was evicted.
        assert_eq!(after.evictions, before.evictions, "{policy}: {after:?}");
        assert_eq!(after.dirty_bytes, 16 * BS, "{policy}: {after:?}");
        assert_eq!(
            after.bypassed_bytes,
            126 * (64 << 10),
            "{policy}: {after:?}"
        );
        cache.close(false).unwrap();
    }
}

/// Without bypass, the policy itself must resist the scan: S3-FIFO keeps
/// a working set that was used twice, LRU loses it.
#[test]
fn s3fifo_keeps_the_working_set_through_a_scan_lru_does_not() {
    let mut hits = Vec::new();
    for policy in [PolicyKind::S3Fifo, PolicyKind::Lru] {
        let backing = Arc::new(MemBacking::new(16 << 20));
        let mut c = cfg(Mode::WriteThrough, 64);
        c.policy = policy;
        c.sequential_cutoff_bytes = 0;
        let cache = Cache::new(backing, c, None).unwrap();
        let mut buf = vec![0u8; BS as usize];
        let ws: Vec<u64> = (0..32).map(|i| (i * 37 % 1000) * BS).collect();
        for _ in 0..2 {
            for &o in &ws {
                cache.read(o, &mut buf).unwrap();
            }
        }
        let mut big = vec![0u8; 64 << 10];
        for i in 0..64u64 {
            cache.read((4 << 20) + i * (64 << 10), &mut big).unwrap();
        }
        let mid = cache.stats();
        for &o in &ws {
            cache.read(o, &mut buf).unwrap();
        }
        hits.push(cache.stats().read_hits - mid.read_hits);
    }
    assert_eq!(
        hits,
        vec![32, 0],
        "working-set hits after the scan: s3fifo, lru"
    );
}

#[test]
fn memory_budget_bounds_the_cache_and_is_given_back() {
    let budget = Arc::new(MemoryBudget::new(10 * BS));
    let backing = Arc::new(MemBacking::with_contents(
        (0..(1u32 << 20)).map(|i| (i / 4096) as u8).collect(),
    ));
    let cache = Cache::new(backing, cfg(Mode::WriteBack, 64), Some(budget.clone())).unwrap();
    let mut buf = vec![0u8; BS as usize];
    for round in 0..3 {
        for b in 0..40u64 {
            cache.read(b * BS, &mut buf).unwrap();
            assert!(buf.iter().all(|&x| x == b as u8), "round {round} block {b}");
        }
    }
    assert_eq!(budget.used_bytes(), 10 * BS);
    assert_eq!(cache.stats().resident_bytes, 10 * BS);
    drop(cache);
    assert_eq!(budget.used_bytes(), 0);
}

#[test]
fn fua_write_back_is_durable_before_the_reply() {
    let backing = Arc::new(MemBacking::new(1 << 20));
    let mut c = cfg(Mode::WriteBack, 64);
    c.max_dirty_age_ms = 3_600_000;
    let cache = Cache::new(backing.clone(), c, None).unwrap();
    cache.write(0, &[1; 8192], false).unwrap();
    cache.write(100_000, &[2; 3000], true).unwrap();
    let d = backing.durable();
    assert!(d[100_000..103_000].iter().all(|&x| x == 2));
    // The FUA covered only its own blocks.
    assert_eq!(cache.dirty_bytes(), 8192);
    cache.flush().unwrap();
    assert!(backing.durable()[..8192].iter().all(|&x| x == 1));
    assert_eq!(cache.dirty_bytes(), 0);
}

#[test]
fn full_of_dirty_data_over_a_dead_backing_fails_cleanly_and_loses_nothing() {
    let backing = Arc::new(MemBacking::new(4 << 20));
    let mut c = cfg(Mode::WriteBack, 32);
    c.max_dirty_age_ms = 3_600_000;
    c.dirty_high_percent = 100;
    c.dirty_low_percent = 90;
    let cache = Cache::new(backing.clone(), c, None).unwrap();
    backing.faults.set_all(true);
    for b in 0..32u64 {
        cache
            .write(b * BS, &[b as u8 + 1; BS as usize], false)
            .unwrap();
    }
    // No room left and nowhere to write: the new write fails with EIO...
    let e = cache
        .write(100 * BS, &[0xee; BS as usize], false)
        .unwrap_err();
    assert_eq!(ramd::nbd::proto::errno_for(&e), ramd::nbd::proto::EIO);
    // ...while every dirty block is still served.
    let mut buf = vec![0u8; BS as usize];
    for b in 0..32u64 {
        cache.read(b * BS, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == b as u8 + 1));
    }
    assert_eq!(cache.dirty_bytes(), 32 * BS);
    backing.faults.set_all(false);
    // With the backing back, the write finds room (written back on demand).
    cache.write(100 * BS, &[0xee; BS as usize], false).unwrap();
    cache.close(false).unwrap();
    let d = backing.durable();
    for b in 0..32u64 {
        assert_eq!(d[(b * BS) as usize], b as u8 + 1);
    }
    assert_eq!(d[(100 * BS) as usize], 0xee);
}

#[test]
fn write_through_caches_whole_blocks_and_write_around_does_not() {
    for (mode, cached) in [(Mode::WriteThrough, true), (Mode::WriteAround, false)] {
        let backing = Arc::new(MemBacking::new(1 << 20));
        let cache = Cache::new(backing.clone(), cfg(mode, 64), None).unwrap();
        cache.write(0, &[5; 3 * BS as usize], false).unwrap();
        assert!(backing.contents()[..3 * BS as usize]
            .iter()
            .all(|&x| x == 5));
        let reads = backing.reads.load(Ordering::Relaxed);
        let mut buf = vec![0u8; 3 * BS as usize];
        cache.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 5));
        assert_eq!(
            backing.reads.load(Ordering::Relaxed) == reads,
            cached,
            "{mode}"
        );
        // Write-around drops a cached copy that a write makes stale.
        cache.write(10, &[6; 10], false).unwrap();
        cache.read(0, &mut buf).unwrap();
        assert_eq!(&buf[10..20], &[6; 10]);
    }
}

#[test]
fn requests_past_the_end_and_after_close_are_refused() {
    let backing = Arc::new(MemBacking::new(100_000));
    let cache = Cache::new(backing, cfg(Mode::WriteBack, 16), None).unwrap();
    assert_eq!(cache.size(), 100_000);
    let mut buf = [0u8; 10];
    assert!(cache.read(99_995, &mut buf).is_err());
    assert!(cache.write(u64::MAX - 3, &buf, false).is_err());
    cache.read(99_990, &mut buf).unwrap();
    cache.write(99_990, &[3; 10], false).unwrap();
    cache.close(false).unwrap();
    let e = cache.write(0, &buf, false).unwrap_err().to_string();
    assert!(e.contains("closed"), "{e}");
}

/// Closing while writers are still running: every write acknowledged before
/// the close took effect is on the backing afterwards, and every later one
/// is refused (never acknowledged and then lost).
#[test]
fn close_during_writes_keeps_every_acknowledged_write() {
    let backing = Arc::new(MemBacking::new(4 << 20));
    let mut c = cfg(Mode::WriteBack, 256);
    c.max_dirty_age_ms = 3_600_000;
    let cache = Arc::new(Cache::new(backing.clone(), c, None).unwrap());
    let acks = Arc::new([0, 1, 2].map(|_| AtomicU64::new(0)));
    let writers: Vec<_> = (0..3u64)
        .map(|t| {
            let (cache, acks) = (cache.clone(), acks.clone());
            std::thread::spawn(move || {
                // Each thread owns a 1 MiB region and counts up in it.
                let mut acked = Vec::new();
                for i in 0u64.. {
                    let off = (t << 20) + (i % 256) * BS;
                    let v = ((i / 256) as u8).wrapping_add(1);
                    match cache.write(off, &[v; BS as usize], false) {
                        Ok(()) => {
                            acked.push((off, v));
                            acks[t as usize].fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            assert!(e.to_string().contains("closed"), "{e}");
                            return acked;
                        }
                    }
                }
                unreachable!()
            })
        })
        .collect();
    // Every writer under way (not a fixed sleep: on a busy machine a
    // thread may not have written anything yet).
    wait_until("a write acknowledged to every writer", WAIT_TIMEOUT, || {
        acks.iter().all(|a| a.load(Ordering::Relaxed) > 0)
    });
    cache.close(false).unwrap();
    let d = backing.durable();
    for w in writers {
        let acked = w.join().unwrap();
        assert!(!acked.is_empty());
        // The last acknowledged value of each block is on the backing.
        let mut last = std::collections::HashMap::new();
        for (off, v) in acked {
            last.insert(off, v);
        }
        for (off, v) in last {
            assert_eq!(d[off as usize], v, "block at {off}");
        }
    }
}

/// A 512-byte-aligned write to a block that is not cached needs nothing
/// from the backing: it works (and is fast) even while the backing is
/// down. The units it did not write are fetched when read, and never
/// written back over the backing's bytes.
#[test]
fn sector_writes_to_uncached_blocks_need_no_backing() {
    let init: Vec<u8> = (0..(1u32 << 20)).map(|i| (i / 512) as u8 | 0x80).collect();
    let backing = Arc::new(MemBacking::with_contents(init.clone()));
    let mut c = cfg(Mode::WriteBack, 64);
    c.max_dirty_age_ms = 3_600_000;
    c.block_bytes = 16 << 10; // 512-byte units
    c.cache_bytes = 64 * c.block_bytes;
    let cache = Cache::new(backing.clone(), c, None).unwrap();
    backing.faults.set_all(true);
    let reads = backing.reads.load(Ordering::Relaxed);
    cache.write(16384 + 1024, &[1; 512], false).unwrap();
    cache.write(5 * 16384, &[2; 3 * 512], false).unwrap();
    assert_eq!(
        backing.reads.load(Ordering::Relaxed),
        reads,
        "no backing read was needed"
    );
    let mut buf = vec![0u8; 512];
    cache.read(16384 + 1024, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 1));
    // A unit nobody wrote needs the (dead) backing.
    assert!(cache.read(16384, &mut buf).is_err());
    // An unaligned write still fetches its edge units: EIO while down.
    assert!(cache.write(40_000, &[3; 100], false).is_err());
    backing.faults.set_all(false);
    // The same block read whole: written units from RAM, the rest fetched.
    let mut block = vec![0u8; 16384];
    cache.read(16384, &mut block).unwrap();
    assert_eq!(&block[..1024], &init[16384..16384 + 1024]);
    assert!(block[1024..1536].iter().all(|&x| x == 1));
    assert_eq!(&block[1536..], &init[16384 + 1536..32768]);
    cache.flush().unwrap();
    let mut want = init;
    want[16384 + 1024..16384 + 1536].fill(1);
    want[5 * 16384..5 * 16384 + 1536].fill(2);
    assert!(
        backing.durable() == want,
        "write-back must not touch units it never held"
    );
}

/// The write-back lag keeps growing while the flusher waits on a dead
/// backing (it was the age seen at the last scan, frozen between retries).
#[test]
fn the_writeback_lag_grows_while_the_backing_is_down() {
    let backing = Arc::new(MemBacking::new(4 << 20));
    let mut c = cfg(Mode::WriteBack, 32);
    c.max_dirty_age_ms = 1;
    // After its first failure the flusher waits an hour before it scans
    // again.
    c.retry_initial_ms = 3_600_000;
    c.retry_max_ms = 3_600_000;
    let cache = Cache::new(backing.clone(), c, None).unwrap();
    backing.faults.set_all(true);
    cache.write(0, &[7u8; BS as usize], false).unwrap();
    wait_until("the flusher to find the backing down", WAIT_TIMEOUT, || {
        cache.stats().backing.failing
    });
    let first = cache.stats().writeback_lag_ms;
    wait_until("the lag to grow past the last scan", WAIT_TIMEOUT, || {
        cache.stats().writeback_lag_ms >= first + 200
    });
    assert_eq!(cache.dirty_bytes(), BS);
    backing.faults.set_all(false);
    cache.close(false).unwrap();
    assert_eq!(backing.durable()[0], 7);
}
