//! Benchmarks of the persistence layer (run by bench/persist.sh; see there).
//!
//! ```text
//! persist_bench latency DIR [--size 2G] [--dirty 1G] [--idle-writes 200000]
//!                           [--explain] [--same-priority]
//!     4 KiB random write latency (QD1) while idle vs while a sync of DIRTY
//!     bytes runs. Targets: p99 during sync <= 2x idle p99, max <= 10 ms.
//!     The sync runs at the daemon's background-sync priority (nice 10)
//!     unless --same-priority. --explain attributes every write over 1 ms
//!     during the sync: per-thread page faults, voluntary context switches
//!     (it blocked: a lock or a wait for the sync), involuntary ones (it was
//!     preempted: the CPU went to another thread), and whether it copied a
//!     chunk aside (copy-on-write).
//! persist_bench restore DIR [--data 1G]
//!     restore throughput vs `dd` of the same image file (page cache dropped
//!     before each when running as root). Target: >= 90% of dd.
//! persist_bench sync DIR [--dirty 1G]
//!     sync throughput (journal commit, checkpoint) vs `dd` writing the same
//!     amount with fdatasync on the same file system.
//! ```
//!
//! DIR is a scratch directory on the disk to measure; it is emptied first.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ramd::block::backend::Backend;
use ramd::persist::{DirStorage, PersistConfig, PersistentDrive, RestoreOptions, RestoreProgress};
use ramd::size::parse as parse_size;
use ramd::store::{MemoryBudget, StoreOptions};

const PAGE: u64 = 4096;

fn arg(args: &[String], name: &str, default: &str) -> u64 {
    let v = args
        .iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
        .unwrap_or(default);
    parse_size(v).unwrap_or_else(|e| panic!("{name} {v}: {e}"))
}

fn budget() -> Arc<MemoryBudget> {
    Arc::new(MemoryBudget::new(u64::MAX))
}

fn fresh_dir(dir: &Path) -> PathBuf {
    let state = dir.join("bench-drive");
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).expect("create the bench directory");
    state
}

fn create(state: &Path, size: u64) -> PersistentDrive<DirStorage> {
    let cfg = PersistConfig {
        // Checkpoints only when asked, so each phase is timed on its own.
        journal_max_bytes: u64::MAX,
        ..PersistConfig::default()
    };
    PersistentDrive::create(
        DirStorage::create_dir(state).unwrap(),
        size,
        None,
        cfg,
        StoreOptions::default(),
        budget(),
    )
    .expect("create drive")
}

/// Fills `bytes` from offset 0 with non-zero, non-repeating data.
fn fill(d: &PersistentDrive<DirStorage>, bytes: u64) {
    let chunk = 4 << 20;
    let mut buf = vec![0u8; chunk as usize];
    let mut off = 0;
    while off < bytes {
        let n = chunk.min(bytes - off);
        for (i, w) in buf.chunks_mut(8).enumerate() {
            w.copy_from_slice(&((off / 8 + i as u64) | 1).to_le_bytes());
        }
        d.write(off, &buf[..n as usize], false).unwrap();
        off += n;
    }
}

fn drop_caches() -> bool {
    // Needs root; without it the figures include the page cache.
    // RAMD_BENCH_CACHED=1 keeps the cache (measures the CPU side alone).
    if std::env::var_os("RAMD_BENCH_CACHED").is_some() {
        return false;
    }
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

struct Stats {
    n: usize,
    p50: Duration,
    p99: Duration,
    p999: Duration,
    max: Duration,
    over_10ms: usize,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    Stats {
        n: v.len(),
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
        max: *v.last().unwrap(),
        over_10ms: v.iter().filter(|d| **d > Duration::from_millis(10)).count(),
    }
}

fn print_stats(label: &str, s: &Stats) {
    println!(
        "{label:<12} writes {:>9}  p50 {:>8.1?}  p99 {:>8.1?}  p99.9 {:>8.1?}  max {:>8.1?}  >10ms {}",
        s.n, s.p50, s.p99, s.p999, s.max, s.over_10ms
    );
}

/// A cheap PRNG for offsets.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// This thread's resource usage (faults, context switches).
fn thread_usage() -> libc::rusage {
    // SAFETY: getrusage fills the struct we pass; RUSAGE_THREAD is valid
    // on Linux and the struct is plain data.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u
    }
}

/// A write over 1 ms during the sync, and what happened in it.
struct Slow {
    took: Duration,
    minflt: i64,
    majflt: i64,
    nvcsw: i64,
    nivcsw: i64,
    cow: bool,
}

fn explain(slow: &[Slow], total: usize) {
    let count = |f: &dyn Fn(&Slow) -> bool| slow.iter().filter(|s| f(s)).count();
    println!(
        "explain: {} of {total} writes during the sync took > 1 ms ({} > 10 ms)",
        slow.len(),
        count(&|s| s.took > Duration::from_millis(10))
    );
    println!(
        "  preempted (involuntary switch): {}  blocked (voluntary switch): {}  page fault: {} (major {})  copy-on-write: {}  none of these: {}",
        count(&|s| s.nivcsw > 0),
        count(&|s| s.nvcsw > 0),
        count(&|s| s.minflt + s.majflt > 0),
        count(&|s| s.majflt > 0),
        count(&|s| s.cow),
        count(&|s| s.nivcsw == 0 && s.nvcsw == 0 && s.minflt + s.majflt == 0 && !s.cow),
    );
    let mut worst: Vec<&Slow> = slow.iter().collect();
    worst.sort_by_key(|s| std::cmp::Reverse(s.took));
    for s in worst.iter().take(10) {
        println!(
            "  {:>8.2?}: faults {}+{}  switches vol {} invol {}  cow {}",
            s.took, s.minflt, s.majflt, s.nvcsw, s.nivcsw, s.cow
        );
    }
}

fn latency(dir: &Path, args: &[String]) {
    let explain_slow = args.iter().any(|a| a == "--explain");
    let same_priority = args.iter().any(|a| a == "--same-priority");
    let size = arg(args, "--size", "2G");
    let dirty = arg(args, "--dirty", "1G");
    let idle_writes = arg(args, "--idle-writes", "200000") as usize;
    let state = fresh_dir(dir);
    let d = Arc::new(create(&state, size));
    println!("filling {dirty} bytes (the dirty set the sync will save)...");
    fill(&d, dirty);
    let pages = size / PAGE;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let block = vec![0xABu8; PAGE as usize];
    let mut idle = Vec::with_capacity(idle_writes);
    for _ in 0..idle_writes {
        let off = next(&mut x) % pages * PAGE;
        let t = Instant::now();
        d.write(off, &block, false).unwrap();
        idle.push(t.elapsed());
    }
    let syncing = Arc::new(AtomicBool::new(true));
    let (ds, flag) = (d.clone(), syncing.clone());
    let t0 = Instant::now();
    let syncer = std::thread::spawn(move || {
        if !same_priority {
            // As the daemon's background sync thread does.
            ramd::persist::priority::lower_thread_priority();
        }
        let r = ds.sync().expect("sync");
        flag.store(false, Ordering::Release);
        r
    });
    let mut during = Vec::new();
    let mut slow = Vec::new();
    while syncing.load(Ordering::Acquire) {
        let off = next(&mut x) % pages * PAGE;
        if explain_slow {
            let (u0, c0) = (thread_usage(), d.store().snapshot_copy_bytes());
            let t = Instant::now();
            d.write(off, &block, false).unwrap();
            let took = t.elapsed();
            let (u1, c1) = (thread_usage(), d.store().snapshot_copy_bytes());
            if took > Duration::from_millis(1) {
                slow.push(Slow {
                    took,
                    minflt: u1.ru_minflt - u0.ru_minflt,
                    majflt: u1.ru_majflt - u0.ru_majflt,
                    nvcsw: u1.ru_nvcsw - u0.ru_nvcsw,
                    nivcsw: u1.ru_nivcsw - u0.ru_nivcsw,
                    cow: c1 > c0,
                });
            }
            during.push(took);
            continue;
        }
        let t = Instant::now();
        d.write(off, &block, false).unwrap();
        during.push(t.elapsed());
    }
    let during_n = during.len();
    let report = syncer.join().unwrap();
    let sync_time = t0.elapsed();
    let (si, sd) = (stats(idle), stats(during));
    print_stats("idle", &si);
    print_stats("during sync", &sd);
    if explain_slow {
        explain(&slow, during_n);
    }
    println!(
        "sync: {} MiB in {:.2?} (peak copy-on-write memory is freed when it ends)",
        (report.data_pages * PAGE) >> 20,
        sync_time
    );
    let ok1 = sd.p99 <= si.p99 * 2;
    let ok2 = sd.max <= Duration::from_millis(10);
    println!(
        "target p99 during sync <= 2x idle: {} ({:.2}x); target max <= 10 ms: {}",
        if ok1 { "PASS" } else { "FAIL" },
        sd.p99.as_secs_f64() / si.p99.as_secs_f64().max(1e-9),
        if ok2 { "PASS" } else { "FAIL" }
    );
    drop(d);
    let _ = std::fs::remove_dir_all(&state);
}

fn mbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / t.as_secs_f64()
}

/// Time for `dd` to read `file` with a cold page cache.
fn dd_read(file: &Path) -> std::time::Duration {
    drop_caches();
    let t = Instant::now();
    let st = Command::new("dd")
        .arg(format!("if={}", file.display()))
        .args(["of=/dev/null", "bs=4M", "status=none"])
        .status()
        .expect("run dd");
    assert!(st.success());
    t.elapsed()
}

fn restore(dir: &Path, args: &[String]) {
    let data = arg(args, "--data", "1G");
    let state = dir.join("bench-drive");
    // --reuse: restore the drive a previous run left (for profiling).
    let reuse = args.iter().any(|a| a == "--reuse") && state.join("meta").exists();
    if !reuse {
        let state = fresh_dir(dir);
        let d = create(&state, data);
        println!("writing {data} bytes and closing...");
        fill(&d, data);
        d.close().unwrap();
    }
    let image = state.join("image");
    // The disk's speed drifts from second to second on shared hosts: dd
    // reads the same image right before and right after the restore, and
    // the restore is compared with their mean.
    let dd_before = dd_read(&image);
    let dropped = drop_caches();
    if !dropped {
        println!("warning: cannot drop the page cache (not root): figures include cached reads");
    }
    let progress = RestoreProgress::new();
    let t = Instant::now();
    let (r, report) = PersistentDrive::open(
        DirStorage::open_dir(&state).unwrap(),
        None,
        RestoreOptions::default(),
        &progress,
        PersistConfig::default(),
        StoreOptions::default(),
        budget(),
    )
    .expect("restore");
    let restore_time = t.elapsed();
    assert_eq!(report.image_data_bytes, data);
    drop(r);
    let dd_after = dd_read(&image);
    let dd_time = (dd_before + dd_after) / 2;
    println!(
        "dd before: {:.0} MiB/s, after: {:.0} MiB/s",
        mbps(data, dd_before),
        mbps(data, dd_after)
    );
    let (ours, dd) = (mbps(data, restore_time), mbps(data, dd_time));
    println!(
        "restore {data} bytes: {restore_time:.2?} = {ours:.0} MiB/s (verified, loaded into RAM)"
    );
    println!("dd of the same image (mean of before and after):  {dd_time:.2?} = {dd:.0} MiB/s");
    let ratio = ours / dd;
    println!(
        "target restore >= 90% of dd: {} ({:.0}%)",
        if ratio >= 0.9 { "PASS" } else { "FAIL" },
        ratio * 100.0
    );
    if !args.iter().any(|a| a == "--reuse") {
        let _ = std::fs::remove_dir_all(&state);
    }
}

fn sync(dir: &Path, args: &[String]) {
    let dirty = arg(args, "--dirty", "1G");
    let state = fresh_dir(dir);
    let d = create(&state, dirty);
    fill(&d, dirty);
    let t = Instant::now();
    let report = d.sync_with(ramd::persist::SyncCause::Flush).expect("sync");
    let commit = t.elapsed();
    let t = Instant::now();
    d.sync().expect("checkpoint");
    let checkpoint = t.elapsed();
    assert_eq!(report.data_pages * PAGE, dirty);
    drop(d);
    let target = state.join("dd-test");
    let t = Instant::now();
    let st = Command::new("dd")
        .args(["if=/dev/zero", "bs=4M", "conv=fdatasync", "status=none"])
        .arg(format!("of={}", target.display()))
        .arg(format!("count={}", dirty.div_ceil(4 << 20)))
        .status()
        .expect("run dd");
    assert!(st.success());
    let dd = t.elapsed();
    println!(
        "sync (journal commit) {dirty} bytes: {commit:.2?} = {:.0} MiB/s",
        mbps(dirty, commit)
    );
    println!(
        "checkpoint into the image:  {checkpoint:.2?} = {:.0} MiB/s",
        mbps(dirty, checkpoint)
    );
    println!(
        "dd write+fdatasync of the same amount: {dd:.2?} = {:.0} MiB/s",
        mbps(dirty, dd)
    );
    println!(
        "commit at {:.0}% of the disk's write speed (the checkpoint writes the data a second time)",
        100.0 * mbps(dirty, commit) / mbps(dirty, dd)
    );
    let _ = std::fs::remove_dir_all(&state);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: persist_bench latency|restore|sync DIR [options] (see the source header)";
    let (Some(mode), Some(dir)) = (args.get(1), args.get(2)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let dir = Path::new(dir);
    match mode.as_str() {
        "latency" => latency(dir, &args),
        "restore" => restore(dir, &args),
        "sync" => sync(dir, &args),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}
