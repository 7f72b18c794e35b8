//! In-process throughput of compressed drives against the raw store.
//!
//! ```text
//! cargo run --release --example compressed_bench -- [--size-mib 256] [--secs 3]
//!     [--threads 2] [--corpus DIR]
//! ```
//!
//! Fills a drive of each kind (raw, lz4, zstd:1, zstd:3) with a corpus of
//! real files (default `/usr/bin` and `/usr/share/doc`, cut into 4 KiB pages
//! and cycled; one page in eight left zero, as on a real file system), then
//! runs 4 KiB random writes (of corpus pages) and 4 KiB random reads from
//! `--threads` threads for `--secs` each, and prints IOPS, the memory held
//! and the stats. Then measures what grouping pages would gain: the same
//! corpus compressed page by page against groups of 4 and 16 pages.
//! Compare figures within one run: the machine is shared and noisy.
//!
//! ```text
//! compressed_bench --serve SOCKET [--size-mib 256]
//! ```
//!
//! Serves drives `raw`, `lz4`, `zstd1` and `zstd3` over NBD on the unix
//! socket until killed, for `fio --ioengine=nbd` against them and against
//! `nbdkit memory allocator=zstd` (the daemon does not create compressed
//! drives yet).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ramd::block::backend::Backend;
use ramd::nbd::{Export, ExportTable, Server, ServerConfig};
use ramd::store::compressed::{Algorithm, CompressedStore};
use ramd::store::{MemoryBudget, RamStore};

const PAGE: usize = 4096;

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// Up to `max` bytes of the regular files under `dirs`, in page-sized
/// pieces (the last piece of a file zero-padded).
fn corpus(dirs: &[&Path], max: usize) -> Vec<Vec<u8>> {
    let mut pages = Vec::new();
    let mut stack: Vec<std::path::PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                let Ok(bytes) = std::fs::read(e.path()) else {
                    continue;
                };
                for c in bytes.chunks(PAGE) {
                    let mut p = c.to_vec();
                    p.resize(PAGE, 0);
                    pages.push(p);
                    if pages.len() * PAGE >= max {
                        return pages;
                    }
                }
            }
        }
    }
    pages
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// The corpus page written at drive page `p` when filling.
fn fill_page(corpus: &[Vec<u8>], p: usize) -> Option<&[u8]> {
    (p % 8 != 7).then(|| corpus[p % corpus.len()].as_slice())
}

/// Runs `op(thread rng)` from `threads` threads for `secs`; returns IOPS.
fn run(threads: usize, secs: f64, op: &(dyn Fn(&mut u64) + Sync)) -> f64 {
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, done) = (&stop, &done);
            s.spawn(move || {
                let mut x = 0x9e37_79b9 + t as u64 * 7919;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        op(&mut x);
                    }
                    n += 64;
                }
                done.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn bench(name: &str, drive: &dyn Backend, held: &dyn Fn() -> u64, corpus: &[Vec<u8>], a: &Args) {
    let pages = (a.size_bytes / PAGE as u64) as usize;
    let t = Instant::now();
    for p in 0..pages {
        if let Some(d) = fill_page(corpus, p) {
            drive.write((p * PAGE) as u64, d, false).expect("fill");
        }
    }
    let fill_mib_s = a.size_bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64();
    let held_fill = held();
    let write = run(a.threads, a.secs, &|x| {
        let p = (xorshift(x) % pages as u64) as usize;
        let d = &corpus[(xorshift(x) % corpus.len() as u64) as usize];
        drive.write((p * PAGE) as u64, d, false).expect("write");
    });
    let read = run(a.threads, a.secs, &|x| {
        let mut buf = [0u8; PAGE];
        let p = xorshift(x) % pages as u64;
        drive.read(p * PAGE as u64, &mut buf).expect("read");
    });
    println!(
        "{name:<8} fill {fill_mib_s:>7.0} MiB/s  randwrite {write:>9.0} IOPS  randread {read:>9.0} IOPS  held after fill {:>6.1} MiB ({:.2}x)",
        held_fill as f64 / (1 << 20) as f64,
        a.size_bytes as f64 / held_fill.max(1) as f64
    );
}

struct Args {
    size_bytes: u64,
    secs: f64,
    threads: usize,
}

/// Compressed bytes of the corpus in groups of `group` pages.
fn grouped_bytes(algo: Algorithm, corpus: &[Vec<u8>], group: usize) -> usize {
    corpus
        .chunks(group)
        .map(|g| {
            let buf = g.concat();
            match algo {
                Algorithm::Lz4 => lz4_flex::block::compress(&buf).len().min(buf.len()),
                Algorithm::Zstd { level } | Algorithm::Lz4Zstd { level } => {
                    zstd::bulk::compress(&buf, level)
                        .map_or(buf.len(), |c| c.len())
                        .min(buf.len())
                }
            }
        })
        .sum()
}

/// Serves the four kinds of drive over NBD on `socket` until killed.
fn serve(socket: &str, size_bytes: u64) {
    let global = Arc::new(MemoryBudget::new(u64::MAX));
    let exports = Arc::new(ExportTable::new());
    let raw = RamStore::new(size_bytes, None, global.clone()).expect("raw store");
    exports.insert(Arc::new(Export::new("raw", "raw", Arc::new(raw), false)));
    for (name, algo) in [
        ("lz4", Algorithm::Lz4),
        ("zstd1", Algorithm::Zstd { level: 1 }),
        ("zstd3", Algorithm::Zstd { level: 3 }),
    ] {
        let d = CompressedStore::new(size_bytes, algo, None, global.clone()).expect("store");
        exports.insert(Arc::new(Export::new(name, name, Arc::new(d), false)));
    }
    let server = Server::bind(ServerConfig::new(socket), exports).expect("bind");
    println!("serving raw, lz4, zstd1, zstd3 on {socket}");
    server.run().expect("serve");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let a = Args {
        size_bytes: arg(&args, "--size-mib", "256")
            .parse::<u64>()
            .expect("--size-mib")
            << 20,
        secs: arg(&args, "--secs", "3").parse().expect("--secs"),
        threads: arg(&args, "--threads", "2").parse().expect("--threads"),
    };
    let socket = arg(&args, "--serve", "");
    if !socket.is_empty() {
        return serve(&socket, a.size_bytes);
    }
    let dirs = arg(&args, "--corpus", "/usr/bin:/usr/share/doc");
    let dirs: Vec<&Path> = dirs.split(':').map(Path::new).collect();
    let corpus = corpus(&dirs, 64 << 20);
    assert!(!corpus.is_empty(), "no corpus files under {dirs:?}");
    println!(
        "corpus: {} pages from {dirs:?}; drive {} MiB, {} threads, {} s per phase",
        corpus.len(),
        a.size_bytes >> 20,
        a.threads,
        a.secs
    );
    let global = Arc::new(MemoryBudget::new(u64::MAX));
    {
        let raw = RamStore::new(a.size_bytes, None, global.clone()).expect("raw store");
        bench("raw", &raw, &|| raw.allocated_bytes(), &corpus, &a);
    }
    for algo in [
        Algorithm::Lz4,
        Algorithm::Zstd { level: 1 },
        Algorithm::Zstd { level: 3 },
    ] {
        let d = CompressedStore::new(a.size_bytes, algo, None, global.clone()).expect("store");
        bench(&algo.to_string(), &d, &|| d.allocated_bytes(), &corpus, &a);
        let st = d.stats();
        let stored = st.compressed_pages + st.huge_pages;
        println!(
            "         stats: orig {} MiB, compr {} MiB, slab {} MiB, meta {} KiB, same {}, huge {}, compressed {}, compaction runs {} moved {}, ratio {:.2}; overhead {:.0} B/stored page (slab slack + metadata)",
            st.orig_data_bytes >> 20,
            st.compr_data_bytes >> 20,
            st.slab_bytes >> 20,
            st.metadata_bytes >> 10,
            st.same_pages,
            st.huge_pages,
            st.compressed_pages,
            st.compact_runs,
            st.compact_moved_objects,
            st.ratio(),
            (st.slack_bytes() + st.metadata_bytes) as f64 / stored.max(1) as f64,
        );
    }
    println!("grouping (corpus compressed in groups of N pages; bytes relative to N = 1):");
    for algo in [
        Algorithm::Lz4,
        Algorithm::Zstd { level: 1 },
        Algorithm::Zstd { level: 3 },
    ] {
        let one = grouped_bytes(algo, &corpus, 1);
        let line: Vec<String> = [4, 16]
            .iter()
            .map(|&g| {
                format!(
                    "N={g}: {:.3}",
                    grouped_bytes(algo, &corpus, g) as f64 / one as f64
                )
            })
            .collect();
        println!(
            "  {algo:<8} N=1: ratio {:.2}  {}",
            (corpus.len() * PAGE) as f64 / one as f64,
            line.join("  ")
        );
    }
}
