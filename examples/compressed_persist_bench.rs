//! Sync and restore of persistent compressed drives against a raw one,
//! on one mixed corpus (issue 19: "sync and restore move compressed or
//! raw pages, your choice, measured").
//!
//! ```text
//! cargo run --release --example compressed_persist_bench -- DIR
//!     [--corpus FILE] [--size 1G] [--stores raw,lz4,zstd:3]
//! ```
//!
//! For each store: creates a persistent drive in DIR (emptied first),
//! writes the corpus into it, times the sync (journal commit) and the
//! checkpoint into the image, closes it, drops the page cache (root), and
//! times the restore into a new store of the same kind, then checks every
//! byte against the corpus. `dd` reads the image and writes the same
//! amount with fdatasync on the same file system, for the disk's speed.
//! It also times decompressing and compressing the corpus on one core,
//! the CPU a sync and a restore of raw pages spend on a compressed drive.
//!
//! The corpus: FILE (e.g. the one bench/compressed-corpus.sh builds in
//! /tmp/ramd-corpus), else `--size` bytes of /usr/lib and /usr/share/doc
//! files with one page in eight zero and 20% random pages.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ramd::block::backend::{self, Backend};
use ramd::persist::{
    DirStorage, PersistConfig, PersistentDrive, RestoreOptions, RestoreProgress, SyncCause,
};
use ramd::size::parse as parse_size;
use ramd::store::compressed::{Algorithm, CompressedStore};
use ramd::store::{MemoryBudget, RamStore, StoreOptions, SyncStore};

const PAGE: usize = 4096;

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

fn budget() -> Arc<MemoryBudget> {
    Arc::new(MemoryBudget::new(u64::MAX))
}

fn mbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / t.as_secs_f64()
}

fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Files under `dirs`, cut into pages, up to `max` bytes; one page in
/// eight zero; the last fifth random.
fn build_corpus(dirs: &[&Path], max: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(max);
    let files_max = max / 5 * 4;
    let mut stack: Vec<PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    'walk: while let Some(d) = stack.pop() {
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
                    if (out.len() / PAGE) % 8 == 7 {
                        out.resize(out.len() + PAGE, 0);
                    }
                    out.extend_from_slice(c);
                    out.resize(out.len().next_multiple_of(PAGE), 0);
                    if out.len() >= files_max {
                        break 'walk;
                    }
                }
            }
        }
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while out.len() < max {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(max);
    out
}

/// One store kind under test.
#[derive(Clone, Copy)]
enum Kind {
    Raw,
    Compressed(Algorithm),
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kind::Raw => write!(f, "raw"),
            Kind::Compressed(a) => write!(f, "{a}"),
        }
    }
}

/// What one store's run measured.
struct Row {
    kind: String,
    memory: u64,
    compr_bytes: u64,
    commit: Duration,
    checkpoint: Duration,
    restore: Duration,
}

fn run<M: SyncStore>(
    dir: &Path,
    corpus: &[u8],
    kind: Kind,
    make: impl Fn(u64) -> backend::Result<M>,
    held: impl Fn(&M) -> (u64, u64),
) -> Row {
    let state = dir.join(format!("drive-{kind}").replace(':', "-"));
    let _ = std::fs::remove_dir_all(&state);
    let cfg = PersistConfig {
        journal_max_bytes: u64::MAX,
        ..PersistConfig::default()
    };
    let size = corpus.len() as u64;
    let d = PersistentDrive::create_with(
        DirStorage::create_dir(&state).unwrap(),
        make(size).unwrap(),
        None,
        cfg,
    )
    .unwrap();
    for (i, c) in corpus.chunks(4 << 20).enumerate() {
        d.write(i as u64 * (4 << 20), c, false).unwrap();
    }
    let (memory, compr_bytes) = held(d.store());
    drop_caches();
    let t = Instant::now();
    d.sync_with(SyncCause::Flush).unwrap();
    let commit = t.elapsed();
    let t = Instant::now();
    d.sync().unwrap();
    let checkpoint = t.elapsed();
    d.close().unwrap();
    drop(d);
    drop_caches();
    let t = Instant::now();
    let (r, _) = PersistentDrive::open_with(
        DirStorage::open_dir(&state).unwrap(),
        None,
        RestoreOptions::default(),
        &RestoreProgress::new(),
        cfg,
        make,
    )
    .unwrap();
    let restore = t.elapsed();
    let mut buf = vec![0u8; 4 << 20];
    for (i, c) in corpus.chunks(4 << 20).enumerate() {
        r.read(i as u64 * (4 << 20), &mut buf[..c.len()]).unwrap();
        assert!(&buf[..c.len()] == c, "{kind}: restored bytes differ");
    }
    drop(r);
    let _ = std::fs::remove_dir_all(&state);
    Row {
        kind: kind.to_string(),
        memory,
        compr_bytes,
        commit,
        checkpoint,
        restore,
    }
}

/// `dd` reading `bytes` of a file written there, and writing them with
/// fdatasync.
fn dd(dir: &Path, bytes: u64) -> (Duration, Duration) {
    let f = dir.join("dd-test");
    let count = bytes.div_ceil(4 << 20).to_string();
    let t = Instant::now();
    let st = Command::new("dd")
        .args(["if=/dev/zero", "bs=4M", "conv=fdatasync", "status=none"])
        .arg(format!("of={}", f.display()))
        .arg(format!("count={count}"))
        .status()
        .expect("run dd");
    assert!(st.success());
    let write = t.elapsed();
    drop_caches();
    let t = Instant::now();
    let st = Command::new("dd")
        .arg(format!("if={}", f.display()))
        .args(["of=/dev/null", "bs=4M", "status=none"])
        .status()
        .expect("run dd");
    assert!(st.success());
    let read = t.elapsed();
    let _ = std::fs::remove_file(&f);
    (read, write)
}

/// One core's time to compress and to decompress every page of `corpus`.
fn codec_times(corpus: &[u8], algo: Algorithm) -> (Duration, Duration) {
    let s = CompressedStore::new(corpus.len() as u64, algo, None, budget()).unwrap();
    let t = Instant::now();
    for (i, c) in corpus.chunks(1 << 20).enumerate() {
        s.write(i as u64 * (1 << 20), c, false).unwrap();
    }
    let compress = t.elapsed();
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    for (i, c) in corpus.chunks(1 << 20).enumerate() {
        s.read(i as u64 * (1 << 20), &mut buf[..c.len()]).unwrap();
    }
    (compress, t.elapsed())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1).filter(|a| !a.starts_with("--")) else {
        eprintln!("usage: compressed_persist_bench DIR [--corpus FILE] [--size 1G] [--stores raw,lz4,zstd:3]");
        std::process::exit(2);
    };
    let dir = Path::new(dir);
    std::fs::create_dir_all(dir).unwrap();
    let corpus = match args.iter().position(|a| a == "--corpus") {
        Some(i) => std::fs::read(&args[i + 1]).expect("read the corpus"),
        None => {
            let size = parse_size(&arg(&args, "--size", "1G")).unwrap() as usize;
            build_corpus(&[Path::new("/usr/lib"), Path::new("/usr/share/doc")], size)
        }
    };
    let size = corpus.len() as u64;
    let cached = !drop_caches();
    if cached {
        println!("warning: cannot drop the page cache (not root): reads may be cached");
    }
    let (dd_read, dd_write) = dd(dir, size);
    println!(
        "corpus {} MiB; dd on {}: read {:.0} MiB/s, write+fdatasync {:.0} MiB/s",
        size >> 20,
        dir.display(),
        mbps(size, dd_read),
        mbps(size, dd_write)
    );
    let mut rows = Vec::new();
    for s in arg(&args, "--stores", "raw,lz4,zstd:3").split(',') {
        let row = match s {
            "raw" => run(
                dir,
                &corpus,
                Kind::Raw,
                |n| RamStore::with_options(n, StoreOptions::default(), budget()),
                |s: &RamStore| (s.allocated_bytes(), s.allocated_bytes()),
            ),
            a => {
                let algo: Algorithm = a.parse().expect("a store: raw, lz4, zstd[:LEVEL]");
                let (c, dc) = codec_times(&corpus, algo);
                println!(
                    "{algo}: one core compresses the corpus at {:.0} MiB/s, decompresses at {:.0} MiB/s",
                    mbps(size, c),
                    mbps(size, dc)
                );
                run(
                    dir,
                    &corpus,
                    Kind::Compressed(algo),
                    |n| CompressedStore::new(n, algo, None, budget()),
                    |s: &CompressedStore| {
                        let st = s.stats();
                        (st.mem_used_bytes(), st.compr_data_bytes)
                    },
                )
            }
        };
        rows.push(row);
    }
    println!(
        "{:<8} {:>10} {:>10} {:>16} {:>16} {:>16}",
        "store", "memory", "stored", "sync commit", "checkpoint", "restore"
    );
    for r in &rows {
        println!(
            "{:<8} {:>6} MiB {:>6} MiB {:>6.2?} {:>4.0} MiB/s {:>6.2?} {:>4.0} MiB/s {:>6.2?} {:>4.0} MiB/s",
            r.kind,
            r.memory >> 20,
            r.compr_bytes >> 20,
            r.commit,
            mbps(size, r.commit),
            r.checkpoint,
            mbps(size, r.checkpoint),
            r.restore,
            mbps(size, r.restore)
        );
    }
    println!("(MiB/s of logical data. A compressed image would move the 'stored' bytes instead;");
    for r in rows.iter().filter(|r| r.kind != "raw") {
        let f = r.compr_bytes as f64 / size as f64;
        println!(
            " {}: at dd's speed, writing them takes {:.2?}, reading them {:.2?})",
            r.kind,
            dd_write.mul_f64(f),
            dd_read.mul_f64(f)
        );
    }
}
