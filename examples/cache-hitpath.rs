//! In-process cost of the cache's hit path next to a plain RAM drive:
//! THREADS threads read random 4 KiB blocks of a working set that fits the
//! cache, for SECONDS each, twice, alternating. Prints reads per second and
//! the ratio.
//! (The NBD-level comparison with fio is bench/cache.sh; this isolates the
//! data structures from the protocol.)
//!
//!     cargo run --release --example cache-hitpath [SECONDS] [THREADS] [POLICY]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ramd::backend::Backend;
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

fn main() {
    let mut args = std::env::args().skip(1);
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
