//! Reopen tests: close and reopen persistent drives many times (simulated
//! and real disks), checking each time against a `Vec<u8>` oracle; restore
//! options; corruption detection; encryption; error injection.

use std::sync::Arc;

use ramd::backend::Backend;
use ramd::persist::sim::{Faults, SimDisk, SimRng};
use ramd::persist::{
    DirStorage, Durability, Key, PersistConfig, PersistentDrive, RestoreOptions, RestoreProgress,
    Storage,
};
use ramd::store::{MemoryBudget, StoreOptions};

const PAGE: u64 = 4096;

fn store_opts() -> StoreOptions {
    StoreOptions {
        mem_limit_bytes: None,
        prefault: false,
    }
}

fn budget() -> Arc<MemoryBudget> {
    Arc::new(MemoryBudget::new(u64::MAX))
}

fn contents(d: &dyn Backend) -> Vec<u8> {
    let mut v = vec![0u8; d.size() as usize];
    d.read(0, &mut v).unwrap();
    v
}

fn open_with<S: Storage>(
    s: S,
    key: Option<&Key>,
    opts: RestoreOptions,
) -> ramd::persist::Result<(PersistentDrive<S>, ramd::persist::RestoreReport)> {
    PersistentDrive::open(
        s,
        key,
        opts,
        &RestoreProgress::new(),
        PersistConfig::default(),
        store_opts(),
        budget(),
    )
}

fn open<S: Storage>(s: S, key: Option<&Key>) -> PersistentDrive<S> {
    open_with(s, key, RestoreOptions::default()).unwrap().0
}

fn create<S: Storage>(s: S, size: u64, key: Option<&Key>) -> PersistentDrive<S> {
    PersistentDrive::create(
        s,
        size,
        key,
        PersistConfig::default(),
        store_opts(),
        budget(),
    )
    .unwrap()
}

#[test]
fn encrypted_round_trip_simple() {
    let key = Key::from_bytes([7; 32]);
    let disk = SimDisk::new(1);
    let d = create(disk.clone(), 10 * PAGE + 100, Some(&key));
    d.write(2 * PAGE + 5, &[9; 5000], false).unwrap();
    d.sync().unwrap();
    let want = contents(&d);
    drop(d);
    let disk = disk.after_crash(1, 0.0);
    let d = open(disk.clone(), Some(&key));
    assert!(contents(&d) == want);
    d.write(100, &[1; 10], false).unwrap();
    d.sync().unwrap();
    let want = contents(&d);
    drop(d);
    let d = open(disk.after_crash(1, 0.0), Some(&key));
    assert!(contents(&d) == want);
}

#[test]
fn encrypted_partial_last_page_trim() {
    let key = Key::from_bytes([3; 32]);
    let disk = SimDisk::new(1);
    let d = create(disk.clone(), 11067, Some(&key));
    d.write(3208, &[5; 3138], false).unwrap();
    d.write(8000, &[6; 3067], false).unwrap();
    d.sync().unwrap();
    drop(d);
    let disk = disk.after_crash(1, 0.0);
    let d = open(disk.clone(), Some(&key));
    d.trim(8949, 548).unwrap();
    d.sync().unwrap();
    let want = contents(&d);
    drop(d);
    let d = open(disk.after_crash(2, 0.0), Some(&key));
    assert!(contents(&d) == want);
}
