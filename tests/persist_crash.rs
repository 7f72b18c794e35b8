//! The seeded crash-recovery fuzzer of the persistence layer.
//!
//! Each case runs a random workload (writes, trims, zeroes, syncs, FLUSH,
//! FUA writes, resizes) against a `PersistentDrive` on the simulated disk,
//! with random I/O errors and disk-full, and crashes it at a random step
//! (the write in flight is torn; unsynced writes are kept or lost at
//! random). Then it restores the drive from what the disk kept and checks:
//!
//! - recovery succeeds whenever the drive was ever created durably;
//! - the drive equals *exactly* one state that was durable: the last
//!   acknowledged durability point (sync / FLUSH / FUA in flush mode /
//!   creation) or one of the sync cuts attempted after it (a failed sync may
//!   still have reached the disk). Never older than the last acknowledged
//!   point, never a mix of two moments;
//! - the recovered drive keeps working: one more write and sync, a second
//!   crash losing everything unsynced, and the drive equals that sync.
//!
//! The same cases run over the raw store and over compressed stores (lz4
//! and zstd, with data that mixes same-filled, text-like and random
//! pages): one engine, one set of invariants.
//!
//! `RAMD_CRASH_CASES=N` sets the number of cases per store (default
//! 10,000); `RAMD_CRASH_SEED=S` replays one case (`RAMD_CRASH_STORE=raw|
//! lz4|zstd` picks the store, raw by default). A failure prints its seed.

use std::sync::Arc;

use ramd::block::backend::{self, Backend};
use ramd::persist::{
    Durability, Key, PersistConfig, PersistentDrive, RestoreOptions, RestoreProgress,
};
use ramd::sim::{Faults, Rng, SimDisk};
use ramd::store::compressed::{Algorithm, CompressedStore};
use ramd::store::{MemoryBudget, RamStore, StoreOptions, SyncStore};

const PAGE: u64 = 4096;

fn store_opts() -> StoreOptions {
    StoreOptions {
        mem_limit_bytes: None,
        prefault: false,
        ..StoreOptions::default()
    }
}

fn budget() -> Arc<MemoryBudget> {
    Arc::new(MemoryBudget::new(u64::MAX))
}

/// The whole drive's contents.
fn contents(d: &dyn Backend) -> Vec<u8> {
    let mut v = vec![0u8; d.size() as usize];
    d.read(0, &mut v).expect("read whole drive");
    v
}

/// Describes how two states differ (first differing byte), for messages.
fn diff(a: &[u8], b: &[u8]) -> String {
    if a.len() != b.len() {
        return format!("size {} vs {}", a.len(), b.len());
    }
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("first difference at byte {i} (page {})", i as u64 / PAGE),
        None => "equal".into(),
    }
}

/// Which store a case runs over.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Raw,
    Compressed(Algorithm),
}

impl Kind {
    fn parse(s: &str) -> Kind {
        match s {
            "raw" => Kind::Raw,
            a => Kind::Compressed(a.parse().expect("RAMD_CRASH_STORE: raw, lz4 or zstd")),
        }
    }
}

/// Makes a store of a size (a `PersistentDrive` creates or restores into it).
trait Make: SyncStore + Sized {
    fn make(kind: Kind, size: u64) -> backend::Result<Self>;
}

impl Make for RamStore {
    fn make(_: Kind, size: u64) -> backend::Result<Self> {
        RamStore::with_options(size, store_opts(), budget())
    }
}

impl Make for CompressedStore {
    fn make(kind: Kind, size: u64) -> backend::Result<Self> {
        let Kind::Compressed(algo) = kind else {
            unreachable!("a compressed kind")
        };
        CompressedStore::new(size, algo, None, budget())
    }
}

fn open<M: Make>(
    kind: Kind,
    disk: SimDisk,
    key: Option<&Key>,
    cfg: PersistConfig,
) -> ramd::persist::Result<PersistentDrive<SimDisk, M>> {
    PersistentDrive::open_with(
        disk,
        key,
        RestoreOptions::default(),
        &RestoreProgress::new(),
        cfg,
        |size| M::make(kind, size),
    )
    .map(|(d, report)| {
        if std::env::var("RAMD_CRASH_SEED").is_ok() {
            eprintln!("restored: {report:?}");
        }
        d
    })
}

/// Bytes for a write of `len`: for the raw store one byte value (the
/// first byte differs, to catch misplaced pages); for compressed stores a
/// mix of same-filled, text-like and random bytes, so pages are stored
/// as words, compressed objects and raw (huge) pages.
fn data(rng: &mut Rng, kind: Kind, len: usize) -> Vec<u8> {
    let byte = 1 + rng.below(255) as u8;
    let mut data = vec![byte; len];
    match (kind, rng.below(3)) {
        (Kind::Raw, _) | (_, 0) => {}
        (_, 1) => {
            let words = [&b"ramd "[..], b"page ", b"sync ", b"crash ", b"journal "];
            let mut at = 0;
            while at < len {
                let w = words[rng.below(words.len() as u64) as usize];
                let n = w.len().min(len - at);
                data[at..at + n].copy_from_slice(&w[..n]);
                at += n;
            }
        }
        _ => data.iter_mut().for_each(|b| *b = rng.below(256) as u8),
    }
    data[0] = byte.wrapping_add(1) | 1;
    data
}

/// One random change to both the drive and the oracle.
fn random_change<M: SyncStore>(
    rng: &mut Rng,
    kind: Kind,
    d: &PersistentDrive<SimDisk, M>,
    mem: &mut [u8],
) {
    let size = mem.len() as u64;
    if size == 0 {
        return;
    }
    let off = rng.below(size);
    let len = 1 + rng.below((3 * PAGE).min(size - off));
    let (o, l) = (off as usize, len as usize);
    let op = rng.below(10);
    if std::env::var("RAMD_CRASH_SEED").is_ok() {
        eprintln!("change op {op} at {off}+{len} (size {size})");
    }
    match op {
        0..=6 => {
            let data = data(rng, kind, l);
            d.write(off, &data, false).expect("write to RAM");
            mem[o..o + l].copy_from_slice(&data);
        }
        7 | 8 => {
            d.trim(off, len).expect("trim");
            mem[o..o + l].fill(0);
        }
        _ => {
            d.write_zeroes(off, len, false).expect("zero");
            mem[o..o + l].fill(0);
        }
    }
}

/// Runs case `seed` over a store of `kind`; Err describes the failure.
fn case<M: Make>(kind: Kind, seed: u64) -> Result<(), String> {
    let mut rng = Rng::seed(seed);
    let flush_mode = rng.below(2) == 0;
    let encrypted = rng.below(4) == 0;
    let key = encrypted.then(|| Key::from_bytes([seed as u8; 32]));
    let size = rng.below(40) * PAGE + 1 + rng.below(2 * PAGE);
    let cfg = PersistConfig {
        durability: if flush_mode {
            Durability::Flush
        } else {
            Durability::Periodic
        },
        // Sometimes checkpoint after every flush, sometimes rarely.
        journal_max_bytes: if rng.below(2) == 0 { 0 } else { 1 << 20 },
        ..PersistConfig::default()
    };
    let disk = SimDisk::new(seed);
    let crash_step = 1 + rng.below(320);
    disk.crash_at(crash_step);
    if rng.below(3) == 0 {
        disk.set_faults(Faults {
            write_error: 0.04,
            sync_error: 0.04,
            enospc: rng.below(2) == 0,
        });
    }
    let mut created = false;
    // The state at the last acknowledged durability point, and states of
    // sync cuts attempted after it.
    let mut acked: Vec<u8> = vec![0; size as usize];
    let mut candidates: Vec<Vec<u8>> = Vec::new();
    let mut mem = vec![0u8; size as usize];
    let mut clean_close = false;

    let made = M::make(kind, size).map_err(|e| format!("store: {e}"))?;
    if let Ok(d) = PersistentDrive::create_with(disk.clone(), made, key.as_ref(), cfg) {
        {
            created = true;
            let ops = 5 + rng.below(40);
            for _ in 0..ops {
                if disk.has_crashed() {
                    break;
                }
                let verbose = std::env::var("RAMD_CRASH_SEED").is_ok();
                if verbose {
                    eprintln!("step {} status {:?}", disk.steps(), d.status().last_error);
                }
                let op = rng.below(12);
                if verbose && op > 8 {
                    eprintln!("op kind {op}");
                }
                match op {
                    0..=6 => random_change(&mut rng, kind, &d, &mut mem),
                    7 | 8 => {
                        candidates.push(mem.clone());
                        let r = d.sync();
                        if verbose {
                            eprintln!("sync -> {r:?}");
                        }
                        if r.is_ok() {
                            acked = mem.clone();
                            candidates.clear();
                        }
                    }
                    9 => {
                        // FLUSH: durable in flush mode, a no-op otherwise.
                        if flush_mode {
                            candidates.push(mem.clone());
                        }
                        if d.flush().is_ok() && flush_mode {
                            acked = mem.clone();
                            candidates.clear();
                        }
                    }
                    10 => {
                        // A FUA write.
                        let size = mem.len() as u64;
                        let off = rng.below(size);
                        let len = (1 + rng.below(PAGE)).min(size - off);
                        let data = vec![0xF0 | rng.below(16) as u8; len as usize];
                        mem[off as usize..(off + len) as usize].copy_from_slice(&data);
                        if flush_mode {
                            candidates.push(mem.clone());
                        }
                        let r = d.write(off, &data, true);
                        if r.is_ok() && flush_mode {
                            acked = mem.clone();
                            candidates.clear();
                        }
                    }
                    _ => {
                        // Resize (waits for syncs; recorded by the next one).
                        let new = 1 + rng.below(40) * PAGE + rng.below(PAGE);
                        d.resize(new).map_err(|e| format!("resize: {e}"))?;
                        if verbose {
                            eprintln!("resize to {new}");
                        }
                        mem.resize(new as usize, 0);
                    }
                }
            }
            if !disk.has_crashed() && rng.below(4) == 0 {
                disk.set_faults(Faults::default());
                candidates.push(mem.clone());
                if d.close().is_ok() {
                    acked = mem.clone();
                    candidates.clear();
                    clean_close = true;
                }
            }
        }
    }
    disk.crash_now();
    let keep = [0.0, 0.5, 1.0][rng.below(3) as usize];
    let after = disk.after_crash(seed.wrapping_mul(31), keep);
    let restored = match open::<M>(kind, after.clone(), key.as_ref(), cfg) {
        Ok(d) => d,
        Err(ramd::persist::Error::NotFound(_)) if !created => return Ok(()),
        Err(e) => {
            return Err(format!(
                "restore failed (created={created}, crash step {crash_step}): {e}"
            ))
        }
    };
    let got = contents(&restored);
    let ok = got == acked || candidates.contains(&got);
    if !ok {
        return Err(format!(
            "recovered state is not a durable one (flush_mode={flush_mode}, encrypted={encrypted}, \
             crash step {crash_step}, clean close {clean_close}, {} later candidates): vs last acked: {}",
            candidates.len(),
            diff(&got, &acked)
        ));
    }
    // The recovered drive keeps working across another crash.
    let mut mem = got;
    random_change(&mut rng, kind, &restored, &mut mem);
    restored
        .sync()
        .map_err(|e| format!("sync after recovery: {e}"))?;
    after.crash_now();
    let again = after.after_crash(seed ^ 0x55, 0.0);
    let d2 =
        open::<M>(kind, again, key.as_ref(), cfg).map_err(|e| format!("second restore: {e}"))?;
    let got2 = contents(&d2);
    if got2 != mem {
        return Err(format!(
            "after recovery, a synced write did not survive a crash: {}",
            diff(&got2, &mem)
        ));
    }
    Ok(())
}

/// Runs case `seed` over the store `kind` names.
fn run(kind: Kind, seed: u64) -> Result<(), String> {
    match kind {
        Kind::Raw => case::<RamStore>(kind, seed),
        Kind::Compressed(_) => case::<CompressedStore>(kind, seed),
    }
}

/// Runs `RAMD_CRASH_CASES` cases (or the one `RAMD_CRASH_SEED` names) on
/// two threads; `kind(seed)` picks each case's store.
fn fuzz(name: &str, kind: impl Fn(u64) -> Kind + Sync) {
    if let Ok(s) = std::env::var("RAMD_CRASH_SEED") {
        let seed: u64 = s.parse().expect("RAMD_CRASH_SEED is a number");
        let k = Kind::parse(&std::env::var("RAMD_CRASH_STORE").unwrap_or("raw".into()));
        run(k, seed).unwrap_or_else(|e| panic!("seed {seed} ({k:?}): {e}"));
        return;
    }
    let cases: u64 = std::env::var("RAMD_CRASH_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let threads = 2u64;
    let kind = &kind;
    let failures: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                sc.spawn(move || {
                    let mut fails = Vec::new();
                    let mut seed = t;
                    while seed < cases {
                        let k = kind(seed);
                        let r = std::panic::catch_unwind(|| run(k, seed));
                        match r {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => fails.push(format!("seed {seed} ({k:?}): {e}")),
                            Err(_) => fails.push(format!("seed {seed} ({k:?}): panicked")),
                        }
                        if fails.len() >= 5 {
                            break;
                        }
                        seed += threads;
                    }
                    fails
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("fuzzer thread"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} failing case(s); replay one with RAMD_CRASH_SEED=<seed> RAMD_CRASH_STORE=<store> cargo test --test persist_crash {name}:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!("{cases} crash cases passed");
}

#[test]
fn crash_recovery_matches_a_durable_state() {
    fuzz("crash_recovery_matches_a_durable_state", |_| Kind::Raw);
}

/// The same over compressed drives, lz4, zstd (level 1 or 3) and lz4+zstd
/// (its worker recompressing while the fuzzer writes, syncs and crashes)
/// by turns.
#[test]
fn compressed_crash_recovery_matches_a_durable_state() {
    fuzz("compressed_crash_recovery", |seed| match seed % 4 {
        0 => Kind::Compressed(Algorithm::Lz4),
        1 => Kind::Compressed(Algorithm::Zstd { level: 1 }),
        2 => Kind::Compressed(Algorithm::Zstd { level: 3 }),
        _ => Kind::Compressed(Algorithm::Lz4Zstd { level: 1 }),
    });
}
