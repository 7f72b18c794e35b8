//! Syncs run while writers keep going: the writers are never blocked by a
//! sync, and what the sync saves is one consistent point in time. Plus the
//! background scheduler (interval, retries, recovery). No timing asserts:
//! progress is proven by gates and bounded waits. The sync tests run over
//! the raw store and over a compressed one (lz4).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{wait_until, WAIT_TIMEOUT};
use ramd::block::backend::{self, Backend};
use ramd::persist::{
    Durability, PersistConfig, PersistentDrive, RestoreOptions, RestoreProgress, Storage,
    StorageFile, SyncScheduler, SyncState,
};
use ramd::sim::{Faults, SimDisk, SimFileHandle};
use ramd::store::compressed::{Algorithm, CompressedStore};
use ramd::store::{MemoryBudget, RamStore, StoreOptions, SyncCut, SyncStore, PAGES_PER_CHUNK};

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

fn raw(size: u64) -> backend::Result<RamStore> {
    RamStore::with_options(size, store_opts(), budget())
}

fn lz4(size: u64) -> backend::Result<CompressedStore> {
    CompressedStore::new(size, Algorithm::Lz4, None, budget())
}

/// A simulated disk whose first journal write waits at a gate: the sync is
/// then stuck in the middle (its snapshot taken, nothing saved yet) until
/// the test opens the gate.
#[derive(Clone)]
struct GatedDisk {
    inner: SimDisk,
    /// Told when the sync reaches the gate.
    reached: Arc<Mutex<Option<Sender<()>>>>,
    /// Opens the gate.
    open: Arc<Mutex<Option<Receiver<()>>>>,
}

struct GatedFile {
    inner: SimFileHandle,
    journal: bool,
    disk: GatedDisk,
}

impl Storage for GatedDisk {
    type File = GatedFile;
    fn open(&self, name: &str, create: bool) -> std::io::Result<GatedFile> {
        Ok(GatedFile {
            inner: self.inner.open(name, create)?,
            journal: name == "journal",
            disk: self.clone(),
        })
    }
    fn exists(&self, name: &str) -> std::io::Result<bool> {
        self.inner.exists(name)
    }
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.inner.remove(name)
    }
    fn sync_dir(&self) -> std::io::Result<()> {
        self.inner.sync_dir()
    }
    fn describe(&self, name: &str) -> String {
        self.inner.describe(name)
    }
}

impl StorageFile for GatedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        if self.journal {
            if let Some(tx) = self.disk.reached.lock().unwrap().take() {
                tx.send(()).unwrap();
                let rx = self.disk.open.lock().unwrap().take().unwrap();
                rx.recv_timeout(Duration::from_secs(120))
                    .expect("the gate was never opened: writers were blocked by the sync");
            }
        }
        self.inner.write_at(data, offset)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.punch_hole(offset, len)
    }
}

#[test]
fn writers_keep_completing_while_a_large_sync_runs() {
    writers_keep_completing(raw);
}

#[test]
fn writers_keep_completing_while_a_large_sync_of_a_compressed_drive_runs() {
    writers_keep_completing(lz4);
}

fn writers_keep_completing<M: SyncStore>(make: impl Fn(u64) -> backend::Result<M>) {
    let sim = SimDisk::new(1);
    let (reached_tx, reached_rx) = channel();
    let (open_tx, open_rx) = channel();
    let disk = GatedDisk {
        inner: sim.clone(),
        reached: Arc::new(Mutex::new(None)),
        open: Arc::new(Mutex::new(Some(open_rx))),
    };
    let size = 64 << 20;
    let d = Arc::new(
        PersistentDrive::create_with(
            disk.clone(),
            make(size).unwrap(),
            None,
            PersistConfig::default(),
        )
        .unwrap(),
    );
    // 32 MiB of dirty data, the state the sync must save (each page
    // distinct, so a compressed store keeps objects, not words).
    for i in 0..(32 << 20) / (1 << 20) {
        let mut mib = vec![(i as u8) | 1; 1 << 20];
        for (p, page) in mib.chunks_mut(PAGE as usize).enumerate() {
            page[..8].copy_from_slice(&(i * 256 + p as u64).to_le_bytes());
        }
        d.write(i * (1 << 20), &mib, false).unwrap();
    }
    let at_cut = {
        let mut v = vec![0u8; size as usize];
        d.read(0, &mut v).unwrap();
        v
    };
    *disk.reached.lock().unwrap() = Some(reached_tx);
    std::thread::scope(|sc| {
        let ds = d.clone();
        let syncer = sc.spawn(move || ds.sync().unwrap());
        // The sync holds its snapshot and is stuck in the journal write.
        reached_rx.recv_timeout(Duration::from_secs(120)).unwrap();
        assert_eq!(d.status().state, SyncState::Syncing);
        // A writer completes thousands of writes meanwhile, over pages the
        // sync has not saved yet (copy-on-write) and fresh ones.
        let mut done = 0u64;
        for k in 0..4000u64 {
            let off = (k * 7919 * PAGE) % size;
            d.write(off, &[0xEE; 4096], false).unwrap();
            let mut b = [0u8; 16];
            d.read(off, &mut b).unwrap();
            assert_eq!(b, [0xEE; 16]);
            done += 1;
        }
        assert_eq!(done, 4000);
        assert!(
            d.status().snapshot_copy_bytes > 0,
            "overwrites were copied aside"
        );
        open_tx.send(()).unwrap();
        syncer.join().unwrap();
    });
    // What the sync saved is the state at its cut, not a mix.
    drop(d);
    let r = PersistentDrive::open_with(
        sim.after_crash(1, 0.0),
        None,
        RestoreOptions::default(),
        &RestoreProgress::new(),
        PersistConfig::default(),
        make,
    )
    .unwrap()
    .0;
    let mut got = vec![0u8; size as usize];
    r.read(0, &mut got).unwrap();
    assert!(
        got == at_cut,
        "the synced image is not the state at the cut"
    );
}

/// Writers each own some pages and write increasing counters to them in
/// program order; a snapshot must show, for every writer, a prefix of its
/// writes: if it shows counter k, it shows every write before k too.
#[test]
fn snapshots_are_consistent_cuts_under_concurrent_writers() {
    consistent_cuts(raw);
}

#[test]
fn cuts_of_a_compressed_drive_are_consistent_under_concurrent_writers() {
    consistent_cuts(lz4);
}

fn consistent_cuts<M: SyncStore>(make: impl Fn(u64) -> backend::Result<M>) {
    const WRITERS: u64 = 3;
    const PAGES_EACH: u64 = 40; // spread over several chunks
    let pages = WRITERS * PAGES_EACH;
    let store = Arc::new(make(pages * PAGE).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let written: Vec<Arc<AtomicU64>> = (0..WRITERS).map(|_| Arc::new(AtomicU64::new(0))).collect();
    // The image the snapshots build up, page -> contents.
    let mut image: HashMap<u64, Vec<u8>> = HashMap::new();
    std::thread::scope(|sc| {
        for t in 0..WRITERS {
            let (store, stop, written) = (store.clone(), stop.clone(), written[t as usize].clone());
            sc.spawn(move || {
                let mut k = 1u64;
                while !stop.load(Ordering::Relaxed) || k < 2000 {
                    // Interleave pages so consecutive writes hit different chunks.
                    let j = (k * 17) % PAGES_EACH;
                    let page = j * WRITERS + t;
                    let mut data = vec![0u8; PAGE as usize];
                    data[..8].copy_from_slice(&k.to_le_bytes());
                    data[8] = t as u8 + 1;
                    store.write(page * PAGE, &data, false).unwrap();
                    written.store(k, Ordering::Relaxed);
                    k += 1;
                    if k > 200_000 {
                        break;
                    }
                }
            });
        }
        for round in 0..40 {
            let mut snap = store.cut();
            while let Some(c) = snap.next_chunk().unwrap() {
                for (p, data) in c.pages() {
                    image.insert(p, data.map(|d| d.to_vec()).unwrap_or_default());
                }
            }
            snap.finish();
            // Check the prefix property per writer.
            for t in 0..WRITERS {
                let counter = |j: u64| -> u64 {
                    let p = j * WRITERS + t;
                    image
                        .get(&p)
                        .filter(|d| d.len() >= 8)
                        .map(|d| u64::from_le_bytes(d[..8].try_into().unwrap()))
                        .unwrap_or(0)
                };
                let top = (0..PAGES_EACH).map(counter).max().unwrap();
                for j in 0..PAGES_EACH {
                    // The last write <= top that went to page j.
                    let expect = (1..=top)
                        .rev()
                        .find(|k| (k * 17) % PAGES_EACH == j)
                        .unwrap_or(0);
                    assert_eq!(
                        counter(j), expect,
                        "round {round}, writer {t}, page slot {j}: snapshot shows writes up to {top} but not a prefix"
                    );
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(written.iter().all(|w| w.load(Ordering::Relaxed) >= 1999));
    let _ = PAGES_PER_CHUNK;
}

#[test]
fn scheduler_syncs_periodically_retries_with_backoff_and_recovers() {
    let sim = SimDisk::new(3);
    let cfg = PersistConfig {
        durability: Durability::Periodic,
        sync_interval_ms: 20,
        retry: ramd::persist::RetryPolicy {
            max_quick_retries: 2,
            backoff_initial_ms: 5,
            backoff_max_ms: 10,
        },
        ..PersistConfig::default()
    };
    let d = Arc::new(
        PersistentDrive::create(sim.clone(), 16 * PAGE, None, cfg, store_opts(), budget()).unwrap(),
    );
    let sched = SyncScheduler::spawn(d.clone(), "t").unwrap();
    d.write(0, &[7; 4096], false).unwrap();
    wait_until("a periodic sync saves the write", WAIT_TIMEOUT, || {
        d.status().dirty_bytes == 0 && d.status().durable_gen >= 1
    });
    // The disk fails: quick retries, then `failing`, error visible.
    sim.set_faults(Faults {
        write_error: 1.0,
        sync_error: 1.0,
        enospc: false,
    });
    d.write(PAGE, &[8; 4096], false).unwrap();
    wait_until("sync failures are reported", WAIT_TIMEOUT, || {
        let s = d.status();
        s.consecutive_failures > 2 && s.state == SyncState::Failing && s.last_error.is_some()
    });
    // Still serving from RAM.
    let mut b = [0u8; 4];
    d.read(PAGE, &mut b).unwrap();
    assert_eq!(b, [8; 4]);
    // The disk comes back: the next attempt succeeds.
    sim.set_faults(Faults::default());
    wait_until("recovery", WAIT_TIMEOUT, || {
        let s = d.status();
        s.state == SyncState::Idle && s.consecutive_failures == 0 && s.dirty_bytes == 0
    });
    sched.stop();
    d.close().unwrap();
}
