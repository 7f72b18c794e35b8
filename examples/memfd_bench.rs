//! Issue 31, step 1: what memfd-backed drives cost against anonymous ones,
//! in one process, without NBD (the only thing that differs is the
//! store's memory), and what adopting a kept memfd costs.
//!
//! ```text
//! cargo run --release --example memfd_bench [GIB_LIST] [ROUNDS]
//! ```
//!
//! 1. Random 4 KiB I/O over a full 1 GiB drive, anon and memfd
//!    alternating, `ROUNDS` rounds (default 3), medians printed:
//!    one thread (QD1 latency p50/p99 of write+read pairs) and two
//!    threads (ops/s), as in the peers table's QD1 and QD32 rows; and
//!    the first fill of the drive (4 KiB sequential writes into fresh
//!    pages, the prefaulter on), as in the prefill row.
//! 2. Adoption (`RamStore::adopt`: check, map, SEEK_DATA/SEEK_HOLE walk,
//!    bitmaps) of drives of each size in GIB_LIST (default "1,8"), fully
//!    written (one data run) and every other page written (the most runs).

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ramd::block::backend::Backend;
use ramd::store::{KeptMemory, MemoryBudget, RamStore, SegmentKeeper, StoreOptions};

const GIB: u64 = 1 << 30;

#[derive(Default)]
struct Holder(Mutex<Option<(u64, KeptMemory)>>);

impl SegmentKeeper for Holder {
    fn keep(&self, size_bytes: u64, fds: &[BorrowedFd<'_>]) {
        let kept = KeptMemory {
            memfd: fds[0].try_clone_to_owned().unwrap(),
            ledger: Some(fds[1].try_clone_to_owned().unwrap()),
        };
        *self.0.lock().unwrap() = Some((size_bytes, kept));
    }
}

fn budget() -> Arc<MemoryBudget> {
    Arc::new(MemoryBudget::new(u64::MAX))
}

fn store(size: u64, shared: bool) -> RamStore {
    let opts = StoreOptions {
        shared_memory: shared,
        ..StoreOptions::default()
    };
    RamStore::with_options(size, opts, budget()).unwrap()
}

/// A small xorshift: the same offsets for every run.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

fn fill(s: &RamStore, step_pages: u64) {
    let page = vec![0xa5u8; 4096];
    let mut off = 0;
    while off < s.size() {
        s.write(off, &page, false).unwrap();
        off += 4096 * step_pages;
    }
}

/// (p50 us, p99 us) of a 4 KiB random write followed by a read, one thread.
fn qd1(s: &RamStore, ops: usize) -> (f64, f64) {
    let (mut next, pages) = (rng(7), s.size() / 4096);
    let (wbuf, mut rbuf) = (vec![1u8; 4096], vec![0u8; 4096]);
    let mut lat: Vec<f64> = (0..ops)
        .map(|_| {
            let off = next() % pages * 4096;
            let t = Instant::now();
            s.write(off, &wbuf, false).unwrap();
            s.read(off, &mut rbuf).unwrap();
            t.elapsed().as_nanos() as f64 / 1000.0
        })
        .collect();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (lat[ops / 2], lat[ops * 99 / 100])
}

/// Operations per second of 4 KiB random reads and writes (half each),
/// two threads.
fn throughput(s: &RamStore, ops_per_thread: usize) -> f64 {
    let t = Instant::now();
    std::thread::scope(|sc| {
        for th in 0..2u64 {
            sc.spawn(move || {
                let (mut next, pages) = (rng(11 + th), s.size() / 4096);
                let (wbuf, mut rbuf) = (vec![2u8; 4096], vec![0u8; 4096]);
                for i in 0..ops_per_thread {
                    let off = next() % pages * 4096;
                    if i % 2 == 0 {
                        s.write(off, &wbuf, false).unwrap();
                    } else {
                        s.read(off, &mut rbuf).unwrap();
                    }
                }
            });
        }
    });
    (2 * ops_per_thread) as f64 / t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Per memory kind: its name, then each round's QD1 p50, p99, ops/s and
/// first-touch fill rate (MiB/s).
type Row = (&'static str, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

fn io_rounds(rounds: usize) {
    let mut rows: Vec<Row> = vec![
        ("anon", vec![], vec![], vec![], vec![]),
        ("memfd", vec![], vec![], vec![], vec![]),
    ];
    for round in 0..rounds {
        for (i, row) in rows.iter_mut().enumerate() {
            let s = store(GIB, i == 1);
            let t = Instant::now();
            fill(&s, 1);
            let fill_mib_s = 1024.0 / t.elapsed().as_secs_f64();
            // Let the background thread collapse full ranges, as a daemon would.
            std::thread::sleep(std::time::Duration::from_secs(3));
            let (p50, p99) = qd1(&s, 400_000);
            let ops = throughput(&s, 2_000_000);
            println!(
                "round {round} {:5}: first fill {fill_mib_s:.0} MiB/s; qd1 p50 {p50:.2} us p99 {p99:.2} us; 2 threads {:.0} ops/s",
                row.0, ops
            );
            row.4.push(fill_mib_s);
            row.1.push(p50);
            row.2.push(p99);
            row.3.push(ops);
        }
    }
    for (name, p50, p99, ops, fills) in rows {
        println!(
            "median {name:5}: first fill (4 KiB sequential writes) {:.0} MiB/s; qd1 write+read p50 {:.2} us, p99 {:.2} us; 2 threads {:.0} ops/s",
            median(fills),
            median(p50),
            median(p99),
            median(ops)
        );
    }
}

fn adoption(gib: u64, step_pages: u64) {
    let s = store(gib * GIB, true);
    let holder = Arc::new(Holder::default());
    s.set_keeper(holder.clone());
    fill(&s, step_pages);
    let held = s.allocated_bytes();
    drop(s);
    let (size, fd) = holder.0.lock().unwrap().take().unwrap();
    let opts = StoreOptions {
        prefault: false,
        shared_memory: true,
        ..StoreOptions::default()
    };
    let t = Instant::now();
    let a = RamStore::adopt(size, fd, opts, budget()).unwrap();
    let took = t.elapsed();
    assert_eq!(a.allocated_bytes(), held);
    println!(
        "adopt {gib} GiB drive, {} GiB of data in {} run(s): {:.1} ms",
        held as f64 / GIB as f64,
        if step_pages == 1 { 1 } else { held / 4096 },
        took.as_secs_f64() * 1000.0
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sizes: Vec<u64> = args
        .get(1)
        .map_or("1,8", |s| s.as_str())
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let rounds = args.get(2).map_or(3, |s| s.parse().unwrap());
    for &g in &sizes {
        adoption(g, 1);
        adoption(g, 2);
    }
    io_rounds(rounds);
}
