//! Model-based test of the store's point-in-time snapshots (the sync's
//! copy-on-write): random writes, trims and zeroes run *between the steps*
//! of a snapshot's walk; the pages the snapshot yields, applied to the image
//! of the previous snapshot, must equal the drive exactly as it was when the
//! snapshot began. Aborted snapshots give everything to the next one. A
//! small memory budget makes some writers unable to afford a copy, which
//! sends them down the "capture my chunk now" path (run on a helper thread,
//! since that path waits for the walk).

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use ramd::block::backend::Backend;
use ramd::store::{MemoryBudget, RamStore, StoreOptions, CHUNK_BYTES, PAGE_BYTES};

#[derive(Debug, Clone)]
enum Change {
    Write {
        offset: u64,
        len: u64,
        byte: u8,
    },
    /// The NBD layer's zero-copy path (several chunks locked at once).
    WriteWith {
        offset: u64,
        len: u64,
        byte: u8,
    },
    Trim {
        offset: u64,
        len: u64,
    },
    Zero {
        offset: u64,
        len: u64,
    },
}

#[derive(Debug, Clone)]
enum Op {
    Change(Change),
    /// A snapshot whose walk is interleaved with these changes (one after
    /// each chunk taken); abort it instead of finishing when `abort`.
    Snapshot {
        during: Vec<Change>,
        abort: bool,
    },
}

const SIZE: u64 = 5 * CHUNK_BYTES + 3000;

fn change() -> impl Strategy<Value = Change> {
    let span = (0..SIZE).prop_flat_map(|off| (Just(off), 1..=(SIZE - off).min(3 * CHUNK_BYTES)));
    prop_oneof![
        3 => (span.clone(), 1u8..=255).prop_map(|((offset, len), byte)| Change::Write { offset, len, byte }),
        2 => (span.clone(), 1u8..=255).prop_map(|((offset, len), byte)| Change::WriteWith { offset, len, byte }),
        1 => span.clone().prop_map(|(offset, len)| Change::Trim { offset, len }),
        1 => span.prop_map(|(offset, len)| Change::Zero { offset, len }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => change().prop_map(Op::Change),
        1 => (prop::collection::vec(change(), 0..12), prop::bool::weighted(0.2))
            .prop_map(|(during, abort)| Op::Snapshot { during, abort }),
    ]
}

fn apply(store: &RamStore, mem: &mut [u8], c: &Change) {
    match *c {
        Change::Write { offset, len, byte } => {
            let data: Vec<u8> = (0..len).map(|i| byte ^ (i as u8 & 0x0f)).collect();
            store.write(offset, &data, false).unwrap();
            mem[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        }
        Change::WriteWith { offset, len, byte } => {
            let data: Vec<u8> = (0..len).map(|i| byte ^ (i as u8 & 0x0f)).collect();
            let mut done = 0usize;
            while done < data.len() {
                let n = store
                    .write_with(offset + done as u64, data.len() - done, &mut |dst| {
                        dst.copy_from_slice(&data[done..done + dst.len()]);
                        Ok(())
                    })
                    .unwrap();
                done += n;
            }
            mem[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        }
        Change::Trim { offset, len } => {
            store.trim(offset, len).unwrap();
            mem[offset as usize..(offset + len) as usize].fill(0);
        }
        Change::Zero { offset, len } => {
            store.write_zeroes(offset, len, false).unwrap();
            mem[offset as usize..(offset + len) as usize].fill(0);
        }
    }
}

fn run(ops: &[Op], budget_bytes: u64) {
    let global = Arc::new(MemoryBudget::new(budget_bytes));
    let opts = StoreOptions {
        mem_limit_bytes: None,
        prefault: false,
        ..StoreOptions::default()
    };
    let store = RamStore::with_options(SIZE, opts, global.clone()).unwrap();
    let mut mem = vec![0u8; SIZE as usize];
    // What the snapshots saved so far: the "disk".
    let mut image = vec![0u8; SIZE as usize];
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Change(c) => apply(&store, &mut mem, c),
            Op::Snapshot { during, abort } => {
                let cut = mem.clone();
                let mut next = image.clone();
                let mut snap = store.snapshot();
                let mut pending = during.iter();
                std::thread::scope(|sc| {
                    while let Some(chunk) = snap.next_chunk() {
                        for (p, data) in chunk.pages() {
                            let at = (p * PAGE_BYTES) as usize;
                            let end = (at + PAGE_BYTES as usize).min(SIZE as usize);
                            match data {
                                Some(d) => next[at..end].copy_from_slice(&d[..end - at]),
                                None => next[at..end].fill(0),
                            }
                        }
                        if let Some(c) = pending.next() {
                            // On another thread: a writer without budget for
                            // a copy waits until the walk captures its chunk.
                            let (st, c) = (&store, c.clone());
                            let mut m = mem.clone();
                            let h = sc.spawn(move || {
                                apply(st, &mut m, &c);
                                m
                            });
                            // Keep walking until the change is done.
                            while !h.is_finished() {
                                let Some(chunk) = snap.next_chunk() else {
                                    std::thread::yield_now();
                                    continue;
                                };
                                for (p, data) in chunk.pages() {
                                    let at = (p * PAGE_BYTES) as usize;
                                    let end = (at + PAGE_BYTES as usize).min(SIZE as usize);
                                    match data {
                                        Some(d) => next[at..end].copy_from_slice(&d[..end - at]),
                                        None => next[at..end].fill(0),
                                    }
                                }
                            }
                            mem = h.join().unwrap();
                        }
                    }
                });
                for c in pending {
                    apply(&store, &mut mem, c);
                }
                if *abort {
                    drop(snap);
                } else {
                    snap.finish();
                    assert!(
                        next == cut,
                        "op {i}: the snapshot is not the drive at its cut"
                    );
                    image = next;
                }
                assert_eq!(store.snapshot_copy_bytes(), 0);
            }
        }
        let mut now = vec![0u8; SIZE as usize];
        store.read(0, &mut now).unwrap();
        assert!(now == mem, "op {i}: the drive differs from the oracle");
    }
    // A last snapshot brings the image up to date.
    let mut snap = store.snapshot();
    while let Some(chunk) = snap.next_chunk() {
        for (p, data) in chunk.pages() {
            let at = (p * PAGE_BYTES) as usize;
            let end = (at + PAGE_BYTES as usize).min(SIZE as usize);
            match data {
                Some(d) => image[at..end].copy_from_slice(&d[..end - at]),
                None => image[at..end].fill(0),
            }
        }
    }
    snap.finish();
    assert!(
        image == mem,
        "the final snapshot does not bring the image up to date"
    );
    assert_eq!(
        global.used_bytes(),
        store.allocated_bytes(),
        "copies were given back"
    );
}

fn config() -> Config {
    let base = Config::default();
    let rng_seed = match base.rng_seed {
        RngSeed::Random => RngSeed::Fixed(0x05a9_5407),
        fixed => fixed,
    };
    Config {
        cases: 300,
        rng_seed,
        failure_persistence: None,
        ..base
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn snapshots_equal_the_drive_at_their_cut(ops in prop::collection::vec(op(), 1..30)) {
        run(&ops, u64::MAX);
    }

    #[test]
    fn snapshots_hold_when_writers_cannot_afford_copies(ops in prop::collection::vec(op(), 1..30)) {
        // Room for the data (the drive is < 400 KiB) but not for copies.
        run(&ops, SIZE.next_multiple_of(PAGE_BYTES));
    }
}
