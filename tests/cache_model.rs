//! Model tests of the cache, one per mode, against an oracle of the
//! backing: random sequences of aligned and unaligned reads, writes (some
//! FUA), zeroes, trims, prefetches and flushes run through a small cache
//! (so blocks are evicted all the time) over the in-memory backing, with
//! the flusher writing back concurrently (tiny age limit).
//!
//! Invariants, in words:
//! - every read returns the oracle's bytes;
//! - write-through / write-around: after each write, the backing already
//!   holds the oracle's bytes;
//! - after a FLUSH, the backing holds the oracle's bytes, durably;
//! - after a simulated crash (the cache dies with whatever was dirty, the
//!   backing loses or tears every unflushed write), each byte of the
//!   backing is either the value it had at the last FLUSH (or the last FUA
//!   write covering it) or a value written to it since: every flushed write
//!   survives;
//! - a clean close leaves the backing equal to the oracle, durably;
//! - a kept cache (`cache::keep`, issue 31): at any quiet moment, the
//!   backing with the dirty runs its shadow records applied (what a
//!   restart after a kill -9 writes back) equals the oracle.
//!
//! A failing case prints its seed; set PROPTEST_RNG_SEED to replay others.

mod common;

use std::sync::Arc;

use common::pattern_at;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use ramd::block::backend::Backend;
use ramd::cache::{Cache, CacheConfig, Mode, PolicyKind};
use ramd::sim::MemBacking;

fn config(cases: u32) -> Config {
    let base = Config::default();
    let rng_seed = match base.rng_seed {
        RngSeed::Random => RngSeed::Fixed(0xcac4_e5ee_d001),
        fixed => fixed,
    };
    Config {
        cases,
        rng_seed,
        failure_persistence: None,
        max_shrink_iters: 1024,
        ..base
    }
}

/// Not a multiple of any block size: the last block is short.
const SIZE: u64 = 200_000;

#[derive(Debug, Clone)]
enum Op {
    Read(u64, u64),
    Write {
        offset: u64,
        len: u64,
        seed: u8,
        fua: bool,
    },
    Zero(u64, u64, bool),
    Trim(u64, u64),
    Prefetch(u64, u64),
    Flush,
}

fn offset_strategy() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        (0..SIZE / 4096).prop_map(|b| b * 4096),
        (0..SIZE / 512).prop_map(|s| s * 512),
        0..SIZE,
    ]
}

fn len_strategy() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        Just(4096u64),
        (1u64..64).prop_map(|n| n * 512),
        1u64..40_000,
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let range = (offset_strategy(), len_strategy()).prop_map(|(o, l)| (o, l.min(SIZE - o)));
    prop_oneof![
        6 => range.clone().prop_map(|(o, l)| Op::Read(o, l)),
        6 => (range.clone(), any::<u8>(), prop::bool::weighted(0.1))
            .prop_map(|((offset, len), seed, fua)| Op::Write { offset, len, seed, fua }),
        1 => (range.clone(), any::<bool>()).prop_map(|((o, l), t)| Op::Zero(o, l, t)),
        1 => range.clone().prop_map(|(o, l)| Op::Trim(o, l)),
        1 => range.prop_map(|(o, l)| Op::Prefetch(o, l)),
        1 => Just(Op::Flush),
    ]
}

/// What a crash may leave: per byte, the value it must at least have
/// (`base`, from the last flush or FUA) and the values written since.
struct CrashModel {
    base: Vec<u8>,
    since: Vec<Vec<u8>>,
}

impl CrashModel {
    fn new(initial: &[u8]) -> Self {
        CrashModel {
            base: initial.to_vec(),
            since: vec![Vec::new(); initial.len()],
        }
    }
    fn wrote(&mut self, offset: u64, data: &[u8]) {
        for (i, &v) in data.iter().enumerate() {
            let c = &mut self.since[offset as usize + i];
            if !c.contains(&v) {
                c.push(v);
            }
        }
    }
    fn durable(&mut self, offset: u64, data: &[u8]) {
        for (i, &v) in data.iter().enumerate() {
            self.base[offset as usize + i] = v;
            self.since[offset as usize + i].clear();
        }
    }
    fn flushed(&mut self, oracle: &[u8]) {
        self.base.copy_from_slice(oracle);
        for c in &mut self.since {
            c.clear();
        }
    }
    fn check(&self, image: &[u8]) -> Result<(), TestCaseError> {
        for (i, &v) in image.iter().enumerate() {
            prop_assert!(
                v == self.base[i] || self.since[i].contains(&v),
                "byte {i} after the crash is {v}: neither its flushed value {} nor one written since ({:?})",
                self.base[i],
                self.since[i]
            );
        }
        Ok(())
    }
}

fn initial_contents() -> Vec<u8> {
    // Non-zero, so reads of never-written blocks are checked too.
    (0..SIZE).map(|i| (i / 512) as u8 ^ 0x5a).collect()
}

fn run_case(
    mode: Mode,
    block_bytes: u64,
    policy: PolicyKind,
    cutoff: u64,
    ops: &[Op],
    crash_seed: Option<u64>,
    kept: bool,
) -> Result<(), TestCaseError> {
    let init = initial_contents();
    let backing = Arc::new(MemBacking::with_contents(init.clone()));
    let mut cfg = CacheConfig::new(mode, 16 * block_bytes);
    cfg.block_bytes = block_bytes;
    cfg.policy = policy;
    cfg.sequential_cutoff_bytes = cutoff;
    cfg.max_dirty_age_ms = 2;
    cfg.dirty_high_percent = 60;
    cfg.dirty_low_percent = 30;
    cfg.writeback_max_io_bytes = 4 * block_bytes;
    let cache = Cache::with_keep(backing.clone(), cfg, None, kept).unwrap();
    let mut oracle = init.clone();
    let mut crash = CrashModel::new(&init);
    for op in ops {
        match *op {
            Op::Read(o, l) => {
                let mut buf = vec![0u8; l as usize];
                cache.read(o, &mut buf).unwrap();
                prop_assert!(
                    buf == oracle[o as usize..(o + l) as usize],
                    "read {o}+{l} differs from the oracle"
                );
            }
            Op::Write {
                offset,
                len,
                seed,
                fua,
            } => {
                let data = pattern_at(offset, len as usize, seed.into());
                cache.write(offset, &data, fua).unwrap();
                oracle[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                if fua {
                    crash.durable(offset, &data);
                } else {
                    crash.wrote(offset, &data);
                }
                if mode != Mode::WriteBack {
                    let now = backing.contents();
                    prop_assert!(
                        now[offset as usize..(offset + len) as usize] == data[..],
                        "{mode}: the backing lacks an acknowledged write"
                    );
                }
            }
            Op::Zero(o, l, may_trim) => {
                cache.write_zeroes(o, l, may_trim).unwrap();
                oracle[o as usize..(o + l) as usize].fill(0);
                crash.wrote(o, &vec![0; l as usize]);
            }
            Op::Trim(o, l) => {
                cache.trim(o, l).unwrap();
                oracle[o as usize..(o + l) as usize].fill(0);
                crash.wrote(o, &vec![0; l as usize]);
            }
            Op::Prefetch(o, l) => cache.cache(o, l).unwrap(),
            Op::Flush => {
                cache.flush().unwrap();
                prop_assert!(
                    backing.durable() == oracle,
                    "{mode}: after FLUSH the backing differs"
                );
                crash.flushed(&oracle);
            }
        }
    }
    if kept {
        prop_assert!(
            kept_image(&cache, &backing) == oracle,
            "the backing with the kept dirty runs differs from the oracle"
        );
    }
    let s = cache.stats();
    prop_assert!(s.resident_bytes <= s.capacity_bytes);
    prop_assert!(s.dirty_bytes <= s.resident_bytes);
    if mode != Mode::WriteBack {
        prop_assert_eq!(s.dirty_bytes, 0);
    }
    match crash_seed {
        Some(seed) => {
            cache.simulate_crash();
            drop(cache);
            let image = backing.crash(seed);
            crash.check(&image)?;
        }
        None => {
            let r = cache.close(false).unwrap();
            prop_assert_eq!(r.dropped_dirty_bytes, 0);
            prop_assert!(
                backing.durable() == oracle,
                "{mode}: after close the backing differs"
            );
            let mut buf = [0u8; 1];
            prop_assert!(
                cache.read(0, &mut buf).is_err(),
                "a closed cache serves nothing"
            );
        }
    }
    Ok(())
}

/// What a restart after a kill -9 would leave: the dirty runs the kept
/// shadow records (read first: the flusher may write some back meanwhile,
/// which the backing then holds too), applied to the backing.
fn kept_image(cache: &Cache, backing: &MemBacking) -> Vec<u8> {
    let [data, shadow] = cache.kept_fds().expect("a kept cache");
    let keep = ramd::cache::keep::CacheKeep::open(
        data.try_clone_to_owned().unwrap(),
        shadow.try_clone_to_owned().unwrap(),
    )
    .unwrap();
    let mut runs = Vec::new();
    keep.for_each_dirty(&mut |off, bytes| {
        runs.push((off, bytes.to_vec()));
        Ok(())
    })
    .unwrap();
    let mut image = backing.contents();
    for (off, bytes) in runs {
        image[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
    }
    image
}

fn case_strategy() -> impl Strategy<Value = (u64, PolicyKind, u64, Vec<Op>, Option<u64>)> {
    (
        prop_oneof![Just(4096u64), Just(8192), Just(16384)],
        prop_oneof![
            3 => Just(PolicyKind::S3Fifo),
            1 => Just(PolicyKind::Lru),
            1 => Just(PolicyKind::Fifo)
        ],
        prop_oneof![Just(0u64), Just(32 << 10)],
        prop::collection::vec(op_strategy(), 1..60),
        prop::option::of(any::<u64>()),
    )
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn writeback_matches_the_oracle_and_survives_crashes(
        (bs, policy, cutoff, ops, crash) in case_strategy()
    ) {
        run_case(Mode::WriteBack, bs, policy, cutoff, &ops, crash, false)?;
    }

    #[test]
    fn a_kept_writeback_caches_shadow_holds_every_dirty_byte(
        (bs, policy, cutoff, ops, crash) in case_strategy()
    ) {
        run_case(Mode::WriteBack, bs, policy, cutoff, &ops, crash, true)?;
    }

    #[test]
    fn writethrough_matches_the_oracle(
        (bs, policy, cutoff, ops, crash) in case_strategy()
    ) {
        run_case(Mode::WriteThrough, bs, policy, cutoff, &ops, crash, false)?;
    }

    #[test]
    fn writearound_matches_the_oracle(
        (bs, policy, cutoff, ops, crash) in case_strategy()
    ) {
        run_case(Mode::WriteAround, bs, policy, cutoff, &ops, crash, false)?;
    }
}

/// Many threads on one write-back cache, each on its own region (so the
/// expected contents are known), with a tiny cache forcing evictions and
/// write-backs to race with hits and misses.
#[test]
fn concurrent_writers_and_readers_on_disjoint_regions() {
    for mode in Mode::ALL {
        let backing = Arc::new(MemBacking::new(4 << 20));
        let mut cfg = CacheConfig::new(mode, 64 * 4096);
        cfg.max_dirty_age_ms = 1;
        cfg.sequential_cutoff_bytes = 256 << 10;
        let cache = Arc::new(Cache::new(backing.clone(), cfg, None).unwrap());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let cache = cache.clone();
                std::thread::spawn(move || {
                    let base = t << 20;
                    let mut expect = vec![0u8; 1 << 20];
                    let mut rng = ramd::sim::Rng::seed(t + 1);
                    for i in 0..3000u64 {
                        let x = rng.next_u64();
                        let off = x % ((1 << 20) - 9000);
                        let len = 1 + (x >> 40) % 9000;
                        if i % 3 == 0 {
                            let mut buf = vec![0u8; len as usize];
                            cache.read(base + off, &mut buf).unwrap();
                            assert_eq!(
                                buf,
                                expect[off as usize..(off + len) as usize],
                                "{mode} t{t} i{i}"
                            );
                        } else {
                            let data = pattern_at(off, len as usize, i);
                            cache.write(base + off, &data, i % 97 == 0).unwrap();
                            expect[off as usize..(off + len) as usize].copy_from_slice(&data);
                        }
                        if i % 500 == 0 {
                            cache.flush().unwrap();
                        }
                    }
                    expect
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in threads {
            all.extend(t.join().unwrap());
        }
        cache.close(false).unwrap();
        assert!(
            backing.durable() == all,
            "{mode}: backing differs after close"
        );
    }
}

/// Threads share every block but own interleaved 512-byte sectors, so each
/// block sees concurrent partial writes from several threads: a lost update
/// in any read-modify-write, patch or write-back path shows up as a sector
/// that does not hold its owner's last write.
#[test]
fn concurrent_partial_writes_to_shared_blocks_lose_nothing() {
    const THREADS: u64 = 4;
    const SIZE: u64 = 1 << 20;
    for mode in Mode::ALL {
        for block in [4096u64, 16384] {
            let backing = Arc::new(MemBacking::new(SIZE));
            let mut cfg = CacheConfig::new(mode, 16 * block);
            cfg.block_bytes = block;
            cfg.max_dirty_age_ms = 1;
            let cache = Arc::new(Cache::new(backing.clone(), cfg, None).unwrap());
            let threads: Vec<_> = (0..THREADS)
                .map(|t| {
                    let cache = cache.clone();
                    std::thread::spawn(move || {
                        let sectors = SIZE / 512;
                        let mut mine = vec![0u8; sectors as usize];
                        let mut rng = ramd::sim::Rng::seed(0x1234_5678 ^ ((t + 1) * 0x9e37_79b9));
                        for i in 0..4000u32 {
                            let x = rng.next_u64();
                            // A sector this thread owns.
                            let s = (x % (sectors / THREADS)) * THREADS + t;
                            if i % 4 == 0 {
                                let mut buf = [0u8; 512];
                                cache.read(s * 512, &mut buf).unwrap();
                                assert!(
                                    buf.iter().all(|&b| b == mine[s as usize]),
                                    "{mode} bs {block} thread {t}: sector {s} lost its write"
                                );
                            } else {
                                let v = (x >> 32) as u8 | 1;
                                cache.write(s * 512, &[v; 512], i % 101 == 0).unwrap();
                                mine[s as usize] = v;
                            }
                            if i % 997 == 0 {
                                cache.flush().unwrap();
                            }
                        }
                        mine
                    })
                })
                .collect();
            let owned: Vec<Vec<u8>> = threads.into_iter().map(|h| h.join().unwrap()).collect();
            cache.close(false).unwrap();
            let d = backing.durable();
            for s in 0..(SIZE / 512) as usize {
                let want = owned[s % THREADS as usize][s];
                assert!(
                    d[s * 512..(s + 1) * 512].iter().all(|&b| b == want),
                    "{mode} bs {block}: sector {s} on the backing is not its owner's last write"
                );
            }
        }
    }
}
