//! Model-based tests of `CompressedStore`: random operations (read, write
//! of mixed data, trim, write_zeroes with and without holes, resize,
//! compaction) run against the store and a plain-bytes oracle, compared
//! after every step; then concurrent writers and readers on interleaved
//! pages; then the memory accounting on a known corpus, ENOSPC at the
//! limit, and trims giving memory back.
//!
//! Invariants checked after each operation:
//! - every read equals the oracle (trimmed bytes read as zeroes);
//! - `extents()` covers exactly the range asked for, and its holes and
//!   zero runs read as zeroes;
//! - `check()`: the page table and the slabs agree, and the drive's budget
//!   is charged exactly the slab bytes held; the daemon budget too.
//!
//! The oracle's structure (a sparse page map, unaligned spans biased to
//! page and 64 KiB boundaries) follows `tests/store_model.rs`; its
//! generators are not shared because that file's operations (dirty sets,
//! in-place fills) are the raw store's own. Written data mixes what a
//! compressed drive sees: zero pages, same-filled pages, text-like pages
//! and random (incompressible) pages, cut at any offset.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use ramd::block::backend::{Backend, Error};
use ramd::store::compressed::{Algorithm, CompressedStore, GROUP_BYTES};
use ramd::store::MemoryBudget;

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;

fn config(cases: u32) -> Config {
    let base = Config::default();
    let rng_seed = match base.rng_seed {
        RngSeed::Random => RngSeed::Fixed(0x00c0_4b12_e55e),
        fixed => fixed,
    };
    Config {
        cases,
        rng_seed,
        failure_persistence: None,
        max_shrink_iters: 1024,
        ..base
    }
}

// ------------------------------------------------------------------ oracle

/// The expected contents: pages ever written (absent pages are zero).
struct Oracle {
    size: u64,
    pages: BTreeMap<u64, Box<[u8]>>,
}

fn for_each_page(offset: u64, len: u64, mut f: impl FnMut(u64, Range<usize>, Range<usize>)) {
    let end = offset + len;
    let mut pos = offset;
    while pos < end {
        let in_page = (pos % PAGE) as usize;
        let n = (PAGE - pos % PAGE).min(end - pos) as usize;
        let at = (pos - offset) as usize;
        f(pos / PAGE, in_page..in_page + n, at..at + n);
        pos += n as u64;
    }
}

impl Oracle {
    fn read(&self, offset: u64, out: &mut [u8]) {
        for_each_page(offset, out.len() as u64, |p, in_page, at| {
            match self.pages.get(&p) {
                Some(bytes) => out[at].copy_from_slice(&bytes[in_page]),
                None => out[at].fill(0),
            }
        });
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        for_each_page(offset, data.len() as u64, |p, in_page, at| {
            let page = self
                .pages
                .entry(p)
                .or_insert_with(|| vec![0u8; PAGE as usize].into_boxed_slice());
            page[in_page].copy_from_slice(&data[at]);
        });
    }

    fn zero(&mut self, offset: u64, len: u64) {
        for_each_page(offset, len, |p, in_page, _| {
            if let Some(page) = self.pages.get_mut(&p) {
                page[in_page].fill(0);
            }
        });
    }

    fn resize(&mut self, new_size: u64) {
        if new_size < self.size {
            self.pages.split_off(&new_size.div_ceil(PAGE));
            if let Some(last) = self.pages.get_mut(&(new_size / PAGE)) {
                last[(new_size % PAGE) as usize..].fill(0);
            }
        }
        self.size = new_size;
    }
}

// -------------------------------------------------------------------- data

/// What one page of written data looks like.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Zero,
    /// Every byte this value.
    Byte(u8),
    /// An 8-byte word repeated (same-filled by word, not by byte).
    Word(u64),
    /// Words from a small vocabulary: compresses 2-4x.
    Text,
    /// xorshift noise: does not compress, stored raw.
    Random,
    /// Text in the first half, zeroes in the second.
    HalfText,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        2 => Just(Kind::Zero),
        1 => any::<u8>().prop_map(Kind::Byte),
        1 => any::<u64>().prop_map(Kind::Word),
        3 => Just(Kind::Text),
        2 => Just(Kind::Random),
        1 => Just(Kind::HalfText),
    ]
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// One page of `kind`, varied by `seed`.
fn page_of(kind: Kind, seed: u64) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "the ",
        "block ",
        "device ",
        "serves ",
        "pages ",
        "from ",
        "memory ",
        "and ",
        "ramd ",
        "compresses ",
        "them ",
        "\n",
    ];
    let mut x = seed | 1;
    match kind {
        Kind::Zero => vec![0; PAGE as usize],
        Kind::Byte(b) => vec![b; PAGE as usize],
        Kind::Word(w) => w.to_ne_bytes().repeat(PAGE as usize / 8),
        Kind::Random => (0..PAGE).map(|_| xorshift(&mut x) as u8).collect(),
        Kind::Text | Kind::HalfText => {
            let mut v = Vec::with_capacity(PAGE as usize + 16);
            while v.len() < PAGE as usize {
                v.extend_from_slice(WORDS[(xorshift(&mut x) % 12) as usize].as_bytes());
            }
            v.truncate(PAGE as usize);
            if matches!(kind, Kind::HalfText) {
                v[PAGE as usize / 2..].fill(0);
            }
            v
        }
    }
}

/// `len` bytes made of pages of the given kinds (cycled), starting
/// `skew` bytes into the first: so page kinds straddle the drive's pages.
fn data(len: usize, kinds: &[Kind], skew: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 2 * PAGE as usize);
    let mut i = 0;
    while v.len() < len + skew {
        v.extend(page_of(
            kinds[i % kinds.len()],
            seed.wrapping_add(i as u64 * 7919),
        ));
        i += 1;
    }
    v.drain(..skew);
    v.truncate(len);
    v
}

// -------------------------------------------------------------- operations

#[derive(Debug, Clone, Copy)]
struct Span {
    /// Start: page-or-group boundary plus a delta, or anywhere.
    start: u64,
    near_boundary: bool,
    delta: i64,
    len: u64,
}

impl Span {
    fn resolve(&self, size: u64) -> (u64, u64) {
        let offset = if self.near_boundary {
            let unit = if self.start % 2 == 0 {
                PAGE
            } else {
                GROUP_BYTES
            };
            let base = (self.start / 2) % (size / unit + 1) * unit;
            base.saturating_add_signed(self.delta).min(size)
        } else {
            self.start % (size + 1)
        };
        (offset, self.len.min(size - offset))
    }
}

#[derive(Debug, Clone)]
enum Op {
    Read(Span),
    Write(Span, Vec<Kind>, usize),
    Trim(Span),
    WriteZeroes(Span, bool),
    Resize(i64),
    Compact,
    /// Every page of an `lz4+zstd` drive recompressed with zstd now (what
    /// the background worker does to idle pages); nothing on other drives.
    Recompress,
    /// A span that runs past the end: refused, nothing changes.
    PastEnd(u64),
}

fn span() -> impl Strategy<Value = Span> {
    let len = prop_oneof![
        2 => 0u64..=20,
        3 => (1u64..=4, -9i64..=9).prop_map(|(n, d)| (n * PAGE).saturating_add_signed(d)),
        1 => (-9i64..=9).prop_map(|d| GROUP_BYTES.saturating_add_signed(d)),
        2 => 0u64..=300_000,
    ];
    (any::<u64>(), any::<bool>(), -9i64..=9, len).prop_map(|(start, near_boundary, delta, len)| {
        Span {
            start,
            near_boundary,
            delta,
            len,
        }
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => span().prop_map(Op::Read),
        6 => (span(), prop::collection::vec(kind(), 1..5), 0usize..4096)
            .prop_map(|(s, k, skew)| Op::Write(s, k, skew)),
        2 => span().prop_map(Op::Trim),
        2 => (span(), any::<bool>()).prop_map(|(s, t)| Op::WriteZeroes(s, t)),
        1 => (-70_000i64..=70_000).prop_map(Op::Resize),
        1 => Just(Op::Compact),
        1 => Just(Op::Recompress),
        1 => (1u64..=5000).prop_map(Op::PastEnd),
    ]
}

fn algo() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::Lz4),
        Just(Algorithm::Zstd { level: 1 }),
        Just(Algorithm::Zstd { level: 3 }),
        Just(Algorithm::Lz4Zstd { level: 1 }),
    ]
}

// ------------------------------------------------------------------- model

struct Model {
    store: CompressedStore,
    global: Arc<MemoryBudget>,
    oracle: Oracle,
}

impl Model {
    fn new(size: u64, algo: Algorithm) -> Model {
        let global = Arc::new(MemoryBudget::new(u64::MAX));
        Model {
            store: CompressedStore::new(size, algo, None, global.clone()).unwrap(),
            global,
            oracle: Oracle {
                size,
                pages: BTreeMap::new(),
            },
        }
    }

    fn apply(&mut self, op: &Op, step: u64) {
        // The worker of an lz4+zstd drive changes the figures (not the
        // data) at any time; Op::Recompress does its work in step.
        let _paused = self.store.pause_recompression();
        let size = self.store.size();
        let (offset, len) = match op {
            Op::Read(s) | Op::Write(s, ..) | Op::Trim(s) | Op::WriteZeroes(s, _) => s.resolve(size),
            Op::Resize(d) => {
                let new = size.saturating_add_signed(*d).min(4 * MIB);
                self.store.resize(new).unwrap();
                self.oracle.resize(new);
                return self.check_all();
            }
            Op::Compact => {
                self.store.compact();
                return self.check_all();
            }
            Op::Recompress => {
                let before = self.store.stats();
                let saved = self.store.recompress_all();
                let after = self.store.stats();
                assert_eq!(
                    saved.is_some(),
                    self.store.algorithm().secondary().is_some()
                );
                assert_eq!(after.orig_data_bytes, before.orig_data_bytes);
                assert!(after.compr_data_bytes <= before.compr_data_bytes);
                return self.check_all();
            }
            Op::PastEnd(back) => {
                let before = self.store.stats();
                let offset = size.saturating_sub(*back);
                let r = self
                    .store
                    .write(offset, &vec![1; (size - offset + 1) as usize], false);
                assert!(matches!(r, Err(Error::OutOfRange { .. })), "{r:?}");
                assert!(matches!(
                    self.store.trim(offset, size - offset + 1),
                    Err(Error::OutOfRange { .. })
                ));
                assert_eq!(
                    self.store.stats(),
                    before,
                    "a refused request changed the store"
                );
                return;
            }
        };
        match op {
            Op::Read(_) => {
                let mut buf = vec![0xeeu8; len as usize];
                self.store.read(offset, &mut buf).unwrap();
                self.assert_matches_oracle(offset, &buf);
            }
            Op::Write(_, kinds, skew) => {
                let d = data(len as usize, kinds, *skew, step);
                self.store.write(offset, &d, false).unwrap();
                self.oracle.write(offset, &d);
            }
            Op::Trim(_) => {
                self.store.trim(offset, len).unwrap();
                self.oracle.zero(offset, len);
            }
            Op::WriteZeroes(_, may_trim) => {
                self.store.write_zeroes(offset, len, *may_trim).unwrap();
                self.oracle.zero(offset, len);
            }
            _ => unreachable!(),
        }
        self.check_window(offset, len);
        self.check_accounting();
    }

    fn assert_matches_oracle(&self, offset: u64, got: &[u8]) {
        let mut want = vec![0u8; got.len()];
        self.oracle.read(offset, &mut want);
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "byte {} differs: store {:#x}, oracle {:#x}",
                offset + i as u64,
                got[i],
                want[i]
            );
        }
    }

    /// Reads a window around a change and checks its extents.
    fn check_window(&self, offset: u64, len: u64) {
        let size = self.store.size();
        let from = offset.saturating_sub(PAGE + 3);
        let to = (offset + len + PAGE + 3).min(size);
        let mut buf = vec![0u8; (to - from) as usize];
        self.store.read(from, &mut buf).unwrap();
        self.assert_matches_oracle(from, &buf);
        let ext = self.store.extents(from, to - from).unwrap();
        let covered: u64 = ext.iter().map(|e| e.len).sum();
        assert!(to == from || !ext.is_empty());
        assert_eq!(covered, to - from, "extents must cover the range: {ext:?}");
        let mut pos = from;
        for e in &ext {
            assert!(!e.hole || e.zero, "a hole must read as zero");
            if e.zero {
                let at = (pos - from) as usize;
                assert!(
                    buf[at..at + e.len as usize].iter().all(|&b| b == 0),
                    "extent at {pos} claims zeroes"
                );
            }
            pos += e.len;
        }
    }

    fn check_accounting(&self) {
        self.store.check().unwrap();
        let st = self.store.stats();
        assert_eq!(st.slab_bytes, self.store.allocated_bytes());
        assert_eq!(st.slab_bytes, self.global.used_bytes());
        assert!(st.compr_data_bytes <= st.slab_bytes);
        assert_eq!(
            st.orig_data_bytes,
            (st.same_pages + st.huge_pages + st.compressed_pages) * PAGE
        );
        assert!(st.orig_data_bytes <= self.store.size().next_multiple_of(PAGE));
    }

    fn check_all(&self) {
        let size = self.store.size();
        self.check_window(0, size);
        self.check_accounting();
    }

    /// After a case: trimming everything frees everything, dropping gives
    /// the budget back.
    fn finish(self) {
        let size = self.store.size();
        self.check_all();
        self.store.trim(0, size).unwrap();
        let st = self.store.stats();
        assert_eq!(
            (st.slab_bytes, st.orig_data_bytes, st.compr_data_bytes),
            (0, 0, 0),
            "{st:?}"
        );
        assert_eq!(self.global.used_bytes(), 0);
        let global = self.global.clone();
        self.store
            .write(0, &vec![9; size.min(100_000) as usize], false)
            .unwrap();
        drop(self.store);
        assert_eq!(global.used_bytes(), 0);
    }
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn matches_the_oracle(
        algo in algo(),
        size in prop_oneof![3 => 0u64..=2 * MIB, 1 => 2 * MIB..=4 * MIB],
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let mut m = Model::new(size, algo);
        for (step, op) in ops.iter().enumerate() {
            m.apply(op, step as u64);
        }
        m.finish();
    }
}

// -------------------------------------------------------------- concurrent

/// Threads write, zero, trim and read their own pages (interleaved, so
/// they share groups and shards), while a reader scans the whole drive and
/// asks for extents; at the end every thread's pages match its oracle.
#[test]
fn concurrent_writers_and_readers_match_their_oracles() {
    const THREADS: u64 = 4;
    const PAGES: u64 = 512;
    for algo in [Algorithm::Lz4, Algorithm::Zstd { level: 1 }] {
        let global = Arc::new(MemoryBudget::new(u64::MAX));
        let store =
            Arc::new(CompressedStore::new(PAGES * PAGE, algo, None, global.clone()).unwrap());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 * 1024];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for at in (0..PAGES * PAGE).step_by(buf.len()) {
                        store.read(at, &mut buf).unwrap();
                    }
                    store.extents(0, PAGES * PAGE).unwrap();
                }
            })
        };
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || run_writer(&store, t, THREADS, PAGES))
            })
            .collect();
        let oracles: Vec<Oracle> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        reader.join().unwrap();
        for (t, o) in oracles.iter().enumerate() {
            for p in (t as u64..PAGES).step_by(THREADS as usize) {
                let mut got = vec![0u8; PAGE as usize];
                let mut want = vec![0u8; PAGE as usize];
                store.read(p * PAGE, &mut got).unwrap();
                o.read(p * PAGE, &mut want);
                assert!(got == want, "{algo}: page {p} of thread {t} differs");
            }
        }
        store.check().unwrap();
        assert_eq!(store.stats().slab_bytes, global.used_bytes());
        store.trim(0, PAGES * PAGE).unwrap();
        assert_eq!(global.used_bytes(), 0);
    }
}

/// One thread's work: random changes to the pages `p % threads == t`.
fn run_writer(store: &CompressedStore, t: u64, threads: u64, pages: u64) -> Oracle {
    let mut o = Oracle {
        size: pages * PAGE,
        pages: BTreeMap::new(),
    };
    let mut x = 0x1234_5678 + t;
    let kinds = [
        Kind::Text,
        Kind::Random,
        Kind::Zero,
        Kind::Byte(7),
        Kind::HalfText,
    ];
    for step in 0..3000u64 {
        let p = (xorshift(&mut x) % (pages / threads)) * threads + t;
        let r = xorshift(&mut x);
        let (at, n) = match r % 3 {
            0 => (0, PAGE),
            _ => {
                let at = r / 3 % PAGE;
                (at, (r / 3 / PAGE % (PAGE - at)).max(1))
            }
        };
        let off = p * PAGE + at;
        match r / 7 % 10 {
            0 => {
                store.trim(off, n).unwrap();
                o.zero(off, n);
            }
            1 => {
                store.write_zeroes(off, n, r % 2 == 0).unwrap();
                o.zero(off, n);
            }
            2 | 3 => {
                let mut got = vec![0u8; n as usize];
                store.read(off, &mut got).unwrap();
                let mut want = vec![0u8; n as usize];
                o.read(off, &mut want);
                assert!(got == want, "thread {t}: read of page {p} differs");
            }
            _ => {
                let d = data(n as usize, &[kinds[(r % 5) as usize]], at as usize, step);
                store.write(off, &d, false).unwrap();
                o.write(off, &d);
            }
        }
    }
    o
}

// -------------------------------------------------------------- accounting

/// Writes a corpus of known page kinds and checks the stats against what
/// the pages are: counts by kind, the compressed bytes against the
/// compressor run directly, and the slab bytes against both budgets.
#[test]
fn accounting_matches_a_known_corpus() {
    let global = Arc::new(MemoryBudget::new(u64::MAX));
    let store =
        CompressedStore::new(64 * MIB, Algorithm::Lz4, Some(32 * MIB), global.clone()).unwrap();
    let (zero, same, text, random) = (100u64, 50u64, 300u64, 40u64);
    let mut p = 0u64;
    let mut expect_compr = 0u64;
    let mut write = |kind: Kind, n: u64, expect_compr: &mut u64| {
        for i in 0..n {
            let page = page_of(kind, p * 31 + i);
            if matches!(kind, Kind::Text) {
                *expect_compr += lz4_flex::block::compress(&page).len() as u64;
            }
            store.write(p * PAGE, &page, false).unwrap();
            p += 1;
        }
    };
    write(Kind::Zero, zero, &mut expect_compr);
    write(Kind::Word(0x0102_0304_0506_0708), same, &mut expect_compr);
    write(Kind::Text, text, &mut expect_compr);
    write(Kind::Random, random, &mut expect_compr);
    let st = store.stats();
    assert_eq!(st.same_pages, zero + same);
    assert_eq!(st.compressed_pages, text);
    assert_eq!(st.huge_pages, random);
    assert_eq!(st.orig_data_bytes, (zero + same + text + random) * PAGE);
    assert_eq!(st.compr_data_bytes, expect_compr + random * PAGE);
    assert_eq!(st.slab_bytes, store.allocated_bytes());
    assert_eq!(st.slab_bytes, global.used_bytes());
    store.check().unwrap();
    // Text compresses: the drive holds far less than it stores.
    assert!(st.slab_bytes < (text + random) * PAGE * 3 / 4, "{st:?}");
    assert!(st.ratio() > 1.5, "{st:?}");
    // Extents: zero pages are a zero run, not a hole; the rest is data.
    let e = store.extents(0, 64 * MIB).unwrap();
    assert_eq!((e[0].len, e[0].hole, e[0].zero), (zero * PAGE, false, true));
    assert_eq!(
        (e[1].len, e[1].hole, e[1].zero),
        ((same + text + random) * PAGE, false, false)
    );
    assert!(e[2].hole);
}

/// With the limit full of compressed data, a write that needs memory gets
/// ENOSPC (leaving its page as it was); same-filled data and trims still
/// work, and a trim makes room again.
#[test]
fn enospc_at_the_limit_and_trim_frees() {
    let global = Arc::new(MemoryBudget::new(u64::MAX));
    // Big enough that the partly filled blocks of each shard's size classes
    // (see slab.rs) are small beside the data.
    let limit = 16 * MIB;
    let store =
        CompressedStore::new(64 * MIB, Algorithm::Lz4, Some(limit), global.clone()).unwrap();
    let mut p = 0;
    let err = loop {
        let page = page_of(Kind::Text, p);
        match store.write(p * PAGE, &page, false) {
            Ok(()) => p += 1,
            Err(e) => break e,
        }
        assert!(p < 16 * 1024, "the limit never bit");
    };
    assert!(matches!(err, Error::NoSpace(_)), "{err}");
    let st = store.stats();
    assert!(
        st.slab_bytes <= limit && st.slab_bytes + 32 * 1024 > limit,
        "{st:?}"
    );
    // More logical data than the limit: the point of compression.
    assert!(p * PAGE > limit * 3 / 2, "only {p} pages fit");
    // The failed page reads as before (a hole).
    let mut buf = vec![1u8; PAGE as usize];
    store.read(p * PAGE, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    // Same-filled pages cost nothing, so they still fit.
    store
        .write(p * PAGE, &[0xab; PAGE as usize], false)
        .unwrap();
    store
        .write_zeroes((p + 1) * PAGE, 100 * PAGE, false)
        .unwrap();
    // Trim two pages in three; compaction gives blocks back.
    for q in (0..p).filter(|q| q % 3 != 0) {
        store.trim(q * PAGE, PAGE).unwrap();
    }
    store.compact();
    let after = store.stats();
    assert!(after.slab_bytes < st.slab_bytes * 6 / 10, "{after:?}");
    assert!(
        after.compact_runs > 0 && after.compact_freed_bytes > 0,
        "{after:?}"
    );
    assert_eq!(after.slab_bytes, global.used_bytes());
    store.check().unwrap();
    for q in (0..p).filter(|q| q % 3 == 0) {
        store.read(q * PAGE, &mut buf).unwrap();
        assert!(buf == page_of(Kind::Text, q), "page {q} lost by compaction");
    }
    store
        .write(p * PAGE, &page_of(Kind::Random, 1), false)
        .unwrap();
    // A daemon budget smaller than the drive's limit bites the same way.
    let small = Arc::new(MemoryBudget::new(64 * 1024));
    let other =
        CompressedStore::new(MIB, Algorithm::Zstd { level: 1 }, None, small.clone()).unwrap();
    let r = (0..256).try_for_each(|q| other.write(q * PAGE, &page_of(Kind::Random, q), false));
    assert!(matches!(r, Err(Error::NoSpace(_))), "{r:?}");
    assert_eq!(small.used_bytes(), other.stats().slab_bytes);
}

/// Writes and trims race with shrinks and growths: requests beyond the
/// current size fail with `OutOfRange`, nothing else fails, and the table,
/// the slabs and the budget stay consistent; shrinking to zero frees all.
#[test]
fn resizes_race_with_writes() {
    const PAGES: u64 = 1024;
    let global = Arc::new(MemoryBudget::new(u64::MAX));
    let store =
        Arc::new(CompressedStore::new(PAGES * PAGE, Algorithm::Lz4, None, global.clone()).unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut x = 0xabcd + t;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = xorshift(&mut x);
                    let off = r % (PAGES * PAGE);
                    let n = (r >> 40) % (3 * PAGE) + 1;
                    let res = match r % 4 {
                        0 => store.trim(off, n),
                        _ => store.write(off, &data(n as usize, &[Kind::Text], 0, r), false),
                    };
                    match res {
                        Ok(()) | Err(Error::OutOfRange { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    let mut x = 99u64;
    for _ in 0..300 {
        let new = xorshift(&mut x) % (PAGES * PAGE + 1);
        // (check() sums shards one by one: only meaningful when quiet.)
        store.resize(new).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    // Past the end of a shrink, nothing survives into a growth.
    let cut = 5 * PAGE + 123;
    store.resize(cut).unwrap();
    store.resize(PAGES * PAGE).unwrap();
    let mut buf = vec![1u8; (PAGES * PAGE - cut) as usize];
    store.read(cut, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    store.check().unwrap();
    assert_eq!(store.stats().slab_bytes, global.used_bytes());
    store.resize(0).unwrap();
    assert_eq!(global.used_bytes(), 0);
    assert_eq!(store.stats().orig_data_bytes, 0);
}
