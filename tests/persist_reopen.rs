//! Reopen tests: close and reopen persistent drives many times (simulated
//! and real disks), checking each time against a `Vec<u8>` oracle; restore
//! options; corruption detection; encryption; error injection.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use ramd::block::backend::{self, Backend};
use ramd::persist::{
    DirStorage, Durability, Key, PersistConfig, PersistentDrive, RestoreOptions, RestoreProgress,
    Storage,
};
use ramd::sim::{Faults, Rng, SimDisk};
use ramd::store::compressed::{Algorithm, CompressedStore};
use ramd::store::{KeptMemory, MemoryBudget, RamStore, SegmentKeeper, StoreOptions, SyncStore};

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

/// Random writes, trims and resizes; close (clean shutdown) and reopen
/// `rounds` times, comparing with the oracle each time.
fn reopen_many<S: Storage>(
    storage: S,
    reopen: impl Fn(S) -> S,
    key: Option<&Key>,
    rounds: u32,
    seed: u64,
) {
    let raw = |size| RamStore::with_options(size, store_opts(), budget());
    reopen_many_with(storage, reopen, key, rounds, seed, raw);
}

/// [`reopen_many`] over the stores `make` makes.
fn reopen_many_with<S: Storage, M: SyncStore>(
    mut storage: S,
    reopen: impl Fn(S) -> S,
    key: Option<&Key>,
    rounds: u32,
    seed: u64,
    make: impl Fn(u64) -> backend::Result<M>,
) {
    let mut rng = Rng::seed(seed);
    let mut mem = vec![0u8; (64 * PAGE + 123) as usize];
    let mut d = PersistentDrive::create_with(
        storage,
        make(mem.len() as u64).unwrap(),
        key,
        PersistConfig::default(),
    )
    .unwrap();
    for round in 0..rounds {
        for _ in 0..1 + rng.below(20) {
            let size = mem.len() as u64;
            let off = rng.below(size);
            let len = 1 + rng.below((40 * PAGE).min(size - off));
            let (o, l) = (off as usize, len as usize);
            match rng.below(8) {
                0 => {
                    d.trim(off, len).unwrap();
                    mem[o..o + l].fill(0);
                }
                1 if rng.below(4) == 0 => {
                    let new = 1 + rng.below(96 * PAGE);
                    d.resize(new).unwrap();
                    mem.resize(new as usize, 0);
                }
                _ => {
                    let data: Vec<u8> =
                        (0..len).map(|i| (i as u8) ^ (round as u8) ^ 0x5A).collect();
                    d.write(off, &data, false).unwrap();
                    mem[o..o + l].copy_from_slice(&data);
                }
            }
            if rng.below(5) == 0 {
                d.sync().unwrap();
            }
        }
        d.close().unwrap();
        storage = reopen(d.into_storage());
        let (nd, report) = PersistentDrive::open_with(
            storage,
            key,
            RestoreOptions::default(),
            &RestoreProgress::new(),
            PersistConfig::default(),
            &make,
        )
        .unwrap();
        assert!(report.torn_tail.is_none(), "round {round}: {report:?}");
        assert!(
            contents(&nd) == mem,
            "round {round}: contents differ after reopen"
        );
        d = nd;
    }
}

#[test]
fn reopen_many_times_on_the_simulated_disk() {
    for seed in 0..8 {
        let key = Key::from_bytes([seed as u8; 32]);
        let k = (seed % 2 == 0).then_some(&key);
        // Each reopen is a crash that loses everything unsynced: a clean
        // close must have made it all durable.
        reopen_many(
            SimDisk::new(seed),
            |d: SimDisk| d.after_crash(seed, 0.0),
            k,
            25,
            seed,
        );
    }
}

/// Compressed drives (lz4, zstd) saved and restored through the same
/// engine: the image is raw, so a drive may even come back with another
/// algorithm, or none.
#[test]
fn compressed_drives_reopen_many_times() {
    let zstd = |size| CompressedStore::new(size, Algorithm::Zstd { level: 3 }, None, budget());
    let lz4 = |size| CompressedStore::new(size, Algorithm::Lz4, None, budget());
    let key = Key::from_bytes([9; 32]);
    for seed in 0..6 {
        let k = (seed % 2 == 1).then_some(&key);
        let disk = SimDisk::new(seed);
        let reopen = |d: SimDisk| d.after_crash(seed, 0.0);
        if seed % 3 == 0 {
            reopen_many_with(disk, reopen, k, 20, seed, zstd);
        } else {
            reopen_many_with(disk, reopen, k, 20, seed, lz4);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let s = DirStorage::create_dir(dir.path().join("z")).unwrap();
    let reopen = |s: DirStorage| DirStorage::open_dir(s.path()).unwrap();
    reopen_many_with(s, reopen, None, 10, 99, lz4);
}

/// A drive saved compressed comes back raw and the other way round: the
/// state directory holds raw pages either way.
#[test]
fn a_drive_changes_store_across_a_restart() {
    let disk = SimDisk::new(5);
    let lz4 = |size| CompressedStore::new(size, Algorithm::Lz4, None, budget());
    let d = PersistentDrive::create_with(
        disk.clone(),
        lz4(64 * PAGE).unwrap(),
        None,
        PersistConfig::default(),
    )
    .unwrap();
    let text: Vec<u8> = b"persistent compressed pages "
        .iter()
        .cycle()
        .take(20 * PAGE as usize + 77)
        .copied()
        .collect();
    d.write(3 * PAGE + 5, &text, false).unwrap();
    d.write(40 * PAGE, &[0xAB; 4096], false).unwrap();
    d.close().unwrap();
    let want = contents(&d);
    let raw = open(disk.after_crash(1, 0.0), None);
    assert!(contents(&raw) == want);
    raw.write(50 * PAGE, &[7; 100], false).unwrap();
    raw.close().unwrap();
    let want = contents(&raw);
    let storage = raw.into_storage();
    let (z, _) = PersistentDrive::open_with(
        storage.after_crash(2, 0.0),
        None,
        RestoreOptions::default(),
        &RestoreProgress::new(),
        PersistConfig::default(),
        lz4,
    )
    .unwrap();
    assert!(contents(&z) == want);
    let stats = z.store().stats();
    assert_eq!(stats.same_pages, 1, "{stats:?}");
    assert!(stats.compressed_pages >= 20, "{stats:?}");
    z.store().check().unwrap();
}

#[test]
fn reopen_many_times_on_real_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("drive");
    let key = Key::generate().unwrap();
    for (i, k) in [None, Some(&key)].into_iter().enumerate() {
        let p = path.join(i.to_string());
        let s = DirStorage::create_dir(&p).unwrap();
        reopen_many(
            s,
            |s: DirStorage| DirStorage::open_dir(s.path()).unwrap(),
            k,
            15,
            77 + i as u64,
        );
    }
}

/// A synced plain drive with data in pages 0..3 and 10, plus one more
/// committed (not checkpointed) generation in the journal.
fn drive_with_journal(key: Option<&Key>) -> (SimDisk, Vec<u8>) {
    let disk = SimDisk::new(42);
    let cfg = PersistConfig {
        durability: Durability::Flush,
        journal_max_bytes: u64::MAX,
        ..PersistConfig::default()
    };
    let d =
        PersistentDrive::create(disk.clone(), 16 * PAGE, key, cfg, store_opts(), budget()).unwrap();
    d.write(0, &[1; 3 * PAGE as usize], false).unwrap();
    d.write(10 * PAGE, &[2; PAGE as usize], false).unwrap();
    d.sync().unwrap(); // checkpointed into the image
    d.write(PAGE, &[3; 100], false).unwrap();
    d.flush().unwrap(); // only in the journal
    d.write(12 * PAGE, &[4; 100], false).unwrap();
    d.flush().unwrap(); // a second journal generation
    let want = contents(&d);
    (disk.after_crash(1, 0.0), want)
}

fn flip(disk: &SimDisk, file: &str, at: usize) {
    let mut b = disk.contents(file).unwrap();
    b[at] ^= 0x20;
    disk.set_contents(file, b);
}

#[test]
fn flipped_bytes_in_the_image_are_refused_precisely_and_force_loads() {
    let (disk, want) = drive_with_journal(None);
    assert!(contents(&open(disk.clone(), None)) == want);
    let (disk, _) = drive_with_journal(None);
    let before: Vec<_> = ["meta", "image", "pages", "journal"]
        .iter()
        .map(|f| disk.contents(f))
        .collect();
    flip(&disk, "image", 10 * PAGE as usize + 7);
    let flipped: Vec<_> = ["meta", "image", "pages", "journal"]
        .iter()
        .map(|f| disk.contents(f))
        .collect();
    let e = open_with(disk.clone(), None, RestoreOptions::default())
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("page 10") && msg.contains("byte offset 40960") && msg.contains("CRC-32C"),
        "{msg}"
    );
    // Refusal changed nothing on disk.
    let after: Vec<_> = ["meta", "image", "pages", "journal"]
        .iter()
        .map(|f| disk.contents(f))
        .collect();
    assert!(after == flipped && after != before);
    // --force loads it, lists the page, and the next sync repairs it.
    let opts = RestoreOptions {
        force: true,
        ..RestoreOptions::default()
    };
    let (d, report) = open_with(disk.clone(), None, opts).unwrap();
    assert_eq!(report.forced_bad_pages, vec![10]);
    d.sync().unwrap();
    drop(d);
    open(disk.after_crash(3, 0.0), None);
}

#[test]
fn flipped_bytes_in_a_page_covered_by_the_journal_are_repaired_by_replay() {
    // Page 1 is rewritten by a journal generation: its image copy need not verify.
    let (disk, want) = drive_with_journal(None);
    flip(&disk, "image", PAGE as usize + 9);
    assert!(contents(&open(disk, None)) == want);
}

#[test]
fn flipped_bytes_in_meta_are_refused() {
    for at in [0usize, 9, 17, 50, 300, 509] {
        let (disk, _) = drive_with_journal(None);
        flip(&disk, "meta", at);
        let msg = open_with(disk, None, RestoreOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            msg.contains("metadata") && msg.contains("unusable"),
            "{msg}"
        );
    }
    let (disk, _) = drive_with_journal(None);
    disk.set_contents("meta", vec![0; 100]);
    let msg = open_with(disk, None, RestoreOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn journal_damage_tail_is_cut_middle_is_refused_with_options() {
    // Damage in the last generation: a torn tail, cut and reported.
    let (disk, _) = drive_with_journal(None);
    let j = disk.contents("journal").unwrap();
    flip(&disk, "journal", j.len() - 600);
    let (d, report) = open_with(disk.clone(), None, RestoreOptions::default()).unwrap();
    let tail = report.torn_tail.clone().expect("torn tail reported");
    assert!(tail.bytes > 0);
    let mut p12 = vec![0u8; 100];
    d.read(12 * PAGE, &mut p12).unwrap();
    assert_eq!(p12, vec![0; 100], "the torn generation is not loaded");
    let mut p1 = vec![0u8; 100];
    d.read(PAGE, &mut p1).unwrap();
    assert_eq!(p1, vec![3; 100], "the generation before it is");

    // Damage in the first generation with an intact one after it: refused.
    let (disk, want) = drive_with_journal(None);
    let before = disk.contents("journal");
    flip(&disk, "journal", 700);
    let e = open_with(disk.clone(), None, RestoreOptions::default())
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("journal") && msg.contains("corrupt at byte 0") && msg.contains("generation"),
        "{msg}"
    );
    assert!(disk.contents("journal") != before);
    // --discard-journal loads the image only.
    let opts = RestoreOptions {
        discard_journal: true,
        ..RestoreOptions::default()
    };
    let (d, report) = open_with(disk.clone(), None, opts).unwrap();
    assert!(report.journal_discarded);
    let mut p1 = vec![0u8; 100];
    d.read(PAGE, &mut p1).unwrap();
    assert_eq!(p1, vec![1; 100]);
    assert!(contents(&d) != want);
    drop(d);
    // --force keeps what precedes the damage (here: nothing of the journal).
    let (disk, _) = drive_with_journal(None);
    flip(&disk, "journal", 700);
    let opts = RestoreOptions {
        force: true,
        ..RestoreOptions::default()
    };
    let (_d, report) = open_with(disk, None, opts).unwrap();
    assert!(report.forced_journal_damage.is_some());
}

#[test]
fn encryption_round_trip_wrong_key_and_tampering() {
    let key = Key::from_bytes([9; 32]);
    let (disk, want) = drive_with_journal(Some(&key));
    // Not a raw image: the plaintext is nowhere in the files.
    let img = disk.contents("image").unwrap();
    assert!(!img.windows(64).any(|w| w == [1u8; 64]));
    let j = disk.contents("journal").unwrap();
    assert!(!j.windows(64).any(|w| w == [3u8; 64] || w == [4u8; 64]));
    assert!(contents(&open(disk.clone(), Some(&key))) == want);
    let (disk, _) = drive_with_journal(Some(&key));
    let wrong = Key::from_bytes([8; 32]);
    let msg = open_with(disk.clone(), Some(&wrong), RestoreOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("wrong key"), "{msg}");
    let msg = open_with(disk.clone(), None, RestoreOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("encrypted") && msg.contains("key"), "{msg}");
    // Tampered ciphertext in the image: refused by authentication.
    flip(&disk, "image", 10 * PAGE as usize + 100);
    let msg = open_with(disk.clone(), Some(&key), RestoreOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("page 10") && msg.contains("AES-GCM"), "{msg}");
    // A plain drive refuses a key rather than guessing.
    let (plain, _) = drive_with_journal(None);
    let msg = open_with(plain, Some(&key), RestoreOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("not encrypted"), "{msg}");
}

#[test]
fn disk_full_fails_flush_with_eio_and_keeps_serving() {
    let disk = SimDisk::new(5);
    let cfg = PersistConfig {
        durability: Durability::Flush,
        ..PersistConfig::default()
    };
    let d =
        PersistentDrive::create(disk.clone(), 8 * PAGE, None, cfg, store_opts(), budget()).unwrap();
    d.write(0, &[1; 4096], false).unwrap();
    d.flush().unwrap();
    disk.set_faults(Faults {
        write_error: 1.0,
        sync_error: 0.0,
        enospc: true,
    });
    d.write(PAGE, &[2; 4096], false).unwrap();
    let e = d.flush().unwrap_err();
    // EIO on the wire (not ENOSPC: the drive itself is not full).
    assert_eq!(ramd::nbd::proto::errno_for(&e), 5, "{e}");
    assert!(
        d.write(2 * PAGE, &[3; 10], true).is_err(),
        "FUA must fail too"
    );
    let st = d.status();
    assert!(
        st.last_error
            .as_deref()
            .unwrap_or("")
            .contains("No space left"),
        "{st:?}"
    );
    assert!(st.dirty_bytes >= 2 * PAGE);
    assert_eq!(st.consecutive_failures, 2);
    // Reads and writes keep working from RAM.
    let mut b = [0u8; 10];
    d.read(PAGE, &mut b).unwrap();
    assert_eq!(b, [2; 10]);
    // The disk comes back: the next flush saves everything.
    disk.set_faults(Faults::default());
    d.flush().unwrap();
    assert_eq!(d.status().consecutive_failures, 0);
    let want = contents(&d);
    drop(d);
    assert!(contents(&open(disk.after_crash(1, 0.0), None)) == want);
}

#[test]
fn fsync_errors_fail_the_sync_and_nothing_is_acknowledged() {
    let disk = SimDisk::new(6);
    let d = create(disk.clone(), 8 * PAGE, None);
    d.write(0, &[1; 4096], false).unwrap();
    d.sync().unwrap();
    disk.set_faults(Faults {
        write_error: 0.0,
        sync_error: 1.0,
        enospc: false,
    });
    d.write(0, &[2; 4096], false).unwrap();
    assert!(d.sync().is_err());
    // Lose everything unsynced: the acknowledged state survives.
    let after = disk.after_crash(2, 1.0);
    let r = open(after, None);
    let mut b = [0u8; 4];
    r.read(0, &mut b).unwrap();
    assert_eq!(b, [1; 4]);
    // The live drive still has the newer data and saves it later.
    disk.set_faults(Faults::default());
    d.sync().unwrap();
    let want = contents(&d);
    drop(d);
    assert!(contents(&open(disk.after_crash(3, 0.0), None)) == want);
}

#[test]
fn restore_reports_progress() {
    let (disk, _) = drive_with_journal(None);
    let progress = RestoreProgress::new();
    let (_d, report) = PersistentDrive::open(
        disk,
        None,
        RestoreOptions::default(),
        &progress,
        PersistConfig::default(),
        store_opts(),
        budget(),
    )
    .unwrap();
    assert_eq!(progress.phase(), ramd::persist::restore::RestorePhase::Done);
    assert!(progress.total_bytes() > 0);
    assert_eq!(progress.done_bytes(), progress.total_bytes());
    assert_eq!(report.journal_gens, 2);
}

#[test]
fn creating_over_an_existing_drive_is_refused() {
    let (disk, _) = drive_with_journal(None);
    let e = PersistentDrive::create(
        disk,
        PAGE,
        None,
        PersistConfig::default(),
        store_opts(),
        budget(),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("already exists"), "{e}");
    let empty = SimDisk::new(1);
    let e = open_with(empty, None, RestoreOptions::default())
        .err()
        .unwrap();
    assert!(matches!(e, ramd::persist::Error::NotFound(_)), "{e}");
}

/// A sync writes what changed, not the drive: after a full first sync, a
/// few scattered pages cost about their own size (journal records, a commit,
/// at most a second copy when a checkpoint folds them into the image), and
/// a sync with nothing changed costs a few KiB at most.
#[test]
fn sync_cost_is_proportional_to_changed_bytes() {
    let size = 64 << 20;
    let disk = SimDisk::new(11);
    let d = create(disk.clone(), size, None);
    d.write(0, &vec![0x5a; size as usize], false).unwrap();
    d.sync().unwrap();
    let full = d.status().bytes_written;
    assert!(full >= size, "the first sync wrote {full} bytes of {size}");

    let changed = [3 * PAGE, 5000 * PAGE + 17, (size - PAGE)];
    for &at in &changed {
        d.write(at, &[0xa5; 100], false).unwrap();
    }
    d.sync().unwrap();
    let small = d.status().bytes_written - full;
    // 4 pages dirty at most (one write straddles two), each written at most
    // twice (journal, then checkpoint), plus record headers and commits.
    assert!(small > 0, "a sync of changed pages wrote nothing");
    assert!(
        small <= 2 * 4 * PAGE + (64 << 10),
        "a sync of 4 changed pages wrote {small} bytes"
    );

    let before = d.status().bytes_written;
    d.sync().unwrap();
    let idle = d.status().bytes_written - before;
    assert!(
        idle <= 64 << 10,
        "a sync with nothing changed wrote {idle} bytes"
    );

    // And what was written is what a restore sees.
    let want = contents(&d);
    drop(d);
    let d = open(disk.after_crash(1, 0.0), None);
    assert!(contents(&d) == want, "the restored drive differs");
}

/// Keeps duplicates of a shared store's descriptors, as the supervisor of
/// `ramd daemon --supervise` does.
#[derive(Default)]
struct Holder(std::sync::Mutex<Option<(u64, OwnedFd, OwnedFd)>>);

impl SegmentKeeper for Holder {
    fn keep(&self, size: u64, fds: &[BorrowedFd<'_>]) {
        let dup = |fd: BorrowedFd<'_>| fd.try_clone_to_owned().unwrap();
        *self.0.lock().unwrap() = Some((size, dup(fds[0]), dup(fds[1])));
    }
}

impl Holder {
    /// The kept memory, as an adoption after a kill takes it.
    fn adopt(&self) -> RamStore {
        let g = self.0.lock().unwrap();
        let (size, memfd, ledger) = g.as_ref().unwrap();
        let kept = KeptMemory {
            memfd: memfd.try_clone().unwrap(),
            ledger: Some(ledger.try_clone().unwrap()),
        };
        RamStore::adopt(*size, kept, shared_opts(), budget()).unwrap()
    }
}

fn shared_opts() -> StoreOptions {
    StoreOptions {
        shared_memory: true,
        ..store_opts()
    }
}

/// Memory kept across a kill of the serving process (issue 31): adopted
/// over its state directory it serves every write, its first sync saves
/// what the directory lacked, and the directory alone then has it all;
/// adopted over a directory another process wrote since, it is refused
/// as stale instead of serving old data.
#[test]
fn kept_memory_is_adopted_by_its_directory_and_refused_by_a_newer_one() {
    let disk = SimDisk::new(3);
    let store = RamStore::with_options(64 * PAGE, shared_opts(), budget()).unwrap();
    let holder = Arc::new(Holder::default());
    store.set_keeper(holder.clone());
    let d =
        PersistentDrive::create_with(disk.clone(), store, None, PersistConfig::default()).unwrap();
    d.write(0, &[1; 8192], false).unwrap();
    d.sync().unwrap();
    d.write(4 * PAGE, &[2; 4096], false).unwrap(); // acknowledged, not saved
    let want = contents(&d);
    drop(d); // killed: nothing more reaches the disk
    let disk = disk.after_crash(1, 0.0);
    let (d, r) =
        PersistentDrive::adopt_with(disk.clone(), None, PersistConfig::default(), holder.adopt())
            .unwrap();
    assert_eq!(r.kept_dirty_pages, Some(1));
    assert!(contents(&d) == want);
    d.sync().unwrap();
    drop(d);
    let disk = disk.after_crash(2, 0.0);
    let d = open(disk.clone(), None);
    assert!(
        contents(&d) == want,
        "the directory lacks what the adopted memory held"
    );
    // Another process writes the directory on; the kept memory is older.
    d.write(8 * PAGE, &[3; 4096], false).unwrap();
    d.sync().unwrap();
    drop(d);
    let disk = disk.after_crash(3, 0.0);
    let stale = PersistentDrive::adopt_with(disk, None, PersistConfig::default(), holder.adopt());
    let e = stale.err().expect("stale memory was adopted");
    assert!(
        matches!(e, ramd::persist::Error::StaleKeptMemory { .. }),
        "{e}"
    );
}
