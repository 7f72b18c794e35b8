//! In-process cost of the cache's hit path next to a plain RAM drive:
//! THREADS threads read random 4 KiB blocks of a working set that fits the
//! cache, for SECONDS each, twice, alternating. Prints reads per second and
//! the ratio.
//! (The NBD-level comparison with fio is bench/cache.sh; this isolates the
//! data structures from the protocol.)
//!
//!     cargo run --release --example cache-hitpath [SECONDS] [THREADS] [POLICY]
//!
//! Instructions per request, counted by callgrind (reliable on a busy
//! machine, unlike time): `count WHAT N` runs N 4 KiB requests of one kind
//! inside `requests` (setup excluded by the toggle), WHAT being
//! `plain-read`, `cache-read` (hits), `plain-write` or `cache-write`
//! (write-back hits):
//!
//!     valgrind --tool=callgrind --collect-atstart=no \
//!         --toggle-collect='*requests*' target/release/examples/cache-hitpath count cache-read 100000
//!
//! then divide the "Collected" Ir by N (bench/cache-hitpath.sh does it for all four).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ramd::block::backend::Backend;
use ramd::cache::{Cache, CacheConfig, Mode, PolicyKind};
use ramd::store::{MemoryBudget, RamStore};

const WORKING_SET: u64 = 256 << 20;

fn bench(name: &str, b: Arc<dyn Backend>, secs: u64, threads: u64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (b, stop, ops) = (b.clone(), stop.clone(), ops.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 4096];
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let off = (x % (WORKING_SET / 4096)) * 4096;
                        b.read(off, &mut buf).unwrap();
                    }
                    n += 256;
                }
                ops.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let rate = ops.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    println!("{name:>28}: {:>12.0} reads/s", rate);
    rate
}

/// The counted requests (the only function callgrind counts in `count`
/// mode; the warm-up calls `issue_io` directly).
#[inline(never)]
fn requests(b: &dyn Backend, n: u64, write: bool) {
    issue_io(b, n, write)
}

/// N 4 KiB requests at pseudo-random block offsets of the working set.
#[inline(always)]
fn issue_io(b: &dyn Backend, n: u64, write: bool) {
    let mut buf = vec![0x5au8; 4096];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % (WORKING_SET / 4096)) * 4096;
        if write {
            b.write(off, &buf, false).unwrap();
        } else {
            b.read(off, &mut buf).unwrap();
        }
    }
    std::hint::black_box(&buf);
}

/// `count WHAT N`: see the module docs.
fn count(what: &str, n: u64) {
    let budget = Arc::new(MemoryBudget::new(u64::MAX));
    let chunk = vec![0x5au8; 1 << 20];
    let ram = || -> Arc<dyn Backend> {
        let r: Arc<dyn Backend> =
            Arc::new(RamStore::new(WORKING_SET, None, budget.clone()).unwrap());
        for i in 0..WORKING_SET >> 20 {
            r.write(i << 20, &chunk, false).unwrap();
        }
        r
    };
    let (b, write): (Arc<dyn Backend>, bool) = match what {
        "plain-read" => (ram(), false),
        "plain-write" => (ram(), true),
        "cache-read" | "cache-write" => {
            let mode = if what == "cache-read" {
                Mode::WriteThrough
            } else {
                Mode::WriteBack
            };
            let mut cfg = CacheConfig::new(mode, WORKING_SET);
            // Nothing written back while counting.
            cfg.dirty_high_percent = 100;
            cfg.dirty_low_percent = 99;
            cfg.max_dirty_age_ms = 3_600_000;
            let cache = Arc::new(Cache::new(ram(), cfg, None).unwrap());
            cache.cache(0, WORKING_SET).unwrap();
            (cache, what == "cache-write")
        }
        _ => panic!("count what? plain-read, cache-read, plain-write or cache-write"),
    };
    // Warm: every page touched once (and, for writes, every block dirty).
    issue_io(&*b, n.min(WORKING_SET / 4096), write);
    let t = Instant::now();
    requests(&*b, n, write);
    // (Under callgrind this time means nothing; natively, the minimum of
    // several runs is a fair per-request cost on a busy machine.)
    println!(
        "{what}: {n} requests, {:.1} ns each",
        t.elapsed().as_nanos() as f64 / n as f64
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    if std::env::args().nth(1).as_deref() == Some("count") {
        let what = std::env::args().nth(2).unwrap_or_default();
        let n = std::env::args()
            .nth(3)
            .map_or(100_000, |a| a.parse().unwrap());
        return count(&what, n);
    }
    let secs: u64 = args.next().map_or(5, |a| a.parse().unwrap());
    let threads: u64 = args.next().map_or(2, |a| a.parse().unwrap());
    let policy: PolicyKind = args
        .next()
        .map_or(PolicyKind::S3Fifo, |a| a.parse().unwrap());
    let budget = Arc::new(MemoryBudget::new(u64::MAX));
    let fill = |b: &dyn Backend| {
        let chunk = vec![0x5au8; 1 << 20];
        for i in 0..WORKING_SET >> 20 {
            b.write(i << 20, &chunk, false).unwrap();
        }
    };
    // The cache's backing: another RAM drive (only misses would touch it).
    let backing: Arc<dyn Backend> =
        Arc::new(RamStore::new(WORKING_SET, None, budget.clone()).unwrap());
    fill(&*backing);
    let mut cfg = CacheConfig::new(Mode::WriteThrough, WORKING_SET);
    cfg.policy = policy;
    let cache = Arc::new(Cache::new(backing, cfg, None).unwrap());
    // Warm: every block cached.
    cache.cache(0, WORKING_SET).unwrap();
    let ram: Arc<dyn Backend> = Arc::new(RamStore::new(WORKING_SET, None, budget).unwrap());
    fill(&*ram);
    // Alternate, so drift in the machine's load hits both alike.
    let (mut plain, mut cached) = (0.0, 0.0);
    for _ in 0..2 {
        plain += bench("plain RAM drive", ram.clone(), secs, threads);
        cached += bench(
            &format!("cache hits ({policy})"),
            cache.clone(),
            secs,
            threads,
        );
    }
    let s = cache.stats();
    println!(
        "cache/plain = {:.2}  (hit ratio {:.4}, {} misses)",
        cached / plain,
        s.read_hit_ratio(),
        s.read_misses
    );
}
