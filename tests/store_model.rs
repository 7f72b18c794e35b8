//! Model-based tests of `RamStore`: random sequences of operations (read,
//! write, and write in chunk-aligned pieces — also failing part-way —, trim, write_zeroes with
//! and without holes, resize, take_dirty) run against the store and against
//! an oracle of plain bytes, compared after every step.
//!
//! Invariants checked after each operation:
//! - every read equals the oracle (after TRIM the store reads zeroes, its
//!   documented behaviour, so the oracle zeroes trimmed bytes too);
//! - `extents()` covers exactly the range asked for, and its holes read as
//!   zeroes;
//! - memory accounting: `allocated_bytes()` is whole pages, never more than
//!   the size rounded up to a page, equals the daemon budget's `used_bytes()`
//!   and the pages `extents()` reports as allocated;
//! - `take_dirty()` returns exactly the pages changed since the last take.
//!
//! After each case: trimming everything leaves no memory charged (see
//! `trim_of_a_whole_unaligned_drive_frees_every_page` for the last page of
//! an unaligned drive), and dropping the store gives the budget back.
//!
//! Offsets and lengths are deliberately unaligned and biased towards page,
//! 64 KiB chunk and 64 MiB segment boundaries. Drives go up to ~130 MiB: the
//! store only reserves address space for that, and the oracle keeps its bytes
//! by page (a byte vector stored sparsely) so that a 130 MiB drive costs no
//! more than the pages a case actually writes.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

use common::pattern;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use ramd::block::backend::{check_range, Backend, Error, Extent};
use ramd::store::{
    MemoryBudget, RamStore, StoreOptions, CHUNK_BYTES, MAX_DRIVE_BYTES, PAGE_BYTES, SEGMENT_BYTES,
};

const MIB: u64 = 1 << 20;

/// Proptest configuration: a fixed seed so runs are reproducible (set
/// PROPTEST_RNG_SEED to explore others), and no regression files written
/// into the source tree.
fn config(cases: u32) -> Config {
    let base = Config::default();
    let rng_seed = match base.rng_seed {
        RngSeed::Random => RngSeed::Fixed(0x005e_ed0f_4a4d),
        fixed => fixed,
    };
    Config {
        cases,
        rng_seed,
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..base
    }
}

// ------------------------------------------------------------------ oracle

/// The expected contents of the drive: a byte vector of `size` bytes, kept
/// as a map of the pages that were ever written (absent pages are zero).
struct Oracle {
    size: u64,
    pages: BTreeMap<u64, Box<[u8]>>,
}

/// Calls `f(page, bytes of that page, bytes of the range)` for each page
/// piece of `[offset, offset+len)`.
fn for_each_page(offset: u64, len: u64, mut f: impl FnMut(u64, Range<usize>, Range<usize>)) {
    let end = offset + len;
    let mut pos = offset;
    while pos < end {
        let page = pos / PAGE_BYTES;
        let in_page = (pos % PAGE_BYTES) as usize;
        let n = (PAGE_BYTES - pos % PAGE_BYTES).min(end - pos) as usize;
        let at = (pos - offset) as usize;
        f(page, in_page..in_page + n, at..at + n);
        pos += n as u64;
    }
}

impl Oracle {
    fn new(size: u64) -> Oracle {
        Oracle {
            size,
            pages: BTreeMap::new(),
        }
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        assert!(offset + out.len() as u64 <= self.size);
        for_each_page(offset, out.len() as u64, |p, in_page, at| {
            match self.pages.get(&p) {
                Some(bytes) => out[at].copy_from_slice(&bytes[in_page]),
                None => out[at].fill(0),
            }
        });
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        assert!(offset + data.len() as u64 <= self.size);
        for_each_page(offset, data.len() as u64, |p, in_page, at| {
            let page = self
                .pages
                .entry(p)
                .or_insert_with(|| vec![0u8; PAGE_BYTES as usize].into_boxed_slice());
            page[in_page].copy_from_slice(&data[at]);
        });
    }

    fn zero(&mut self, offset: u64, len: u64) {
        assert!(offset + len <= self.size);
        for_each_page(offset, len, |p, in_page, _| {
            if let Some(page) = self.pages.get_mut(&p) {
                page[in_page].fill(0);
            }
        });
    }

    /// Shrinking forgets the bytes past the end; growing adds zeroes.
    fn resize(&mut self, new_size: u64) {
        if new_size < self.size {
            self.pages.split_off(&new_size.div_ceil(PAGE_BYTES));
            if let Some(last) = self.pages.get_mut(&(new_size / PAGE_BYTES)) {
                last[(new_size % PAGE_BYTES) as usize..].fill(0);
            }
        }
        self.size = new_size;
    }
}

/// Pages `[offset, offset+len)` touches: what a change marks dirty.
fn pages_of(offset: u64, len: u64) -> Range<u64> {
    if len == 0 {
        return 0..0;
    }
    offset / PAGE_BYTES..(offset + len).div_ceil(PAGE_BYTES)
}

// -------------------------------------------------------------- operations

/// Where an operation starts, resolved against the drive size when it runs
/// (the size changes during a case).
#[derive(Debug, Clone, Copy)]
enum Pos {
    /// Uniform over `[0, size]`.
    Anywhere(u64),
    /// `delta` bytes from the `nth` multiple of `unit` (page, chunk or
    /// segment) inside the drive: where off-by-one bugs live.
    Boundary { unit: u64, nth: u64, delta: i64 },
    /// `back` bytes before the end.
    FromEnd(u64),
}

/// A range to operate on; `bad` makes it invalid on purpose.
#[derive(Debug, Clone, Copy)]
struct Span {
    pos: Pos,
    len: u64,
    bad: Option<Bad>,
}

/// Ranges the store must refuse with `OutOfRange`, changing nothing.
#[derive(Debug, Clone, Copy)]
enum Bad {
    /// Starts `back` bytes before the end and runs `extra + 1` bytes past it.
    PastEnd { back: u64, extra: u64 },
    /// `offset + len` overflows u64.
    Overflow { back: u64 },
}

impl Span {
    /// The concrete `(offset, len)` on a drive of `size` bytes. Valid spans
    /// are clipped into the drive.
    fn resolve(&self, size: u64) -> (u64, u64) {
        match self.bad {
            Some(Bad::PastEnd { back, extra }) => {
                let back = back.min(size);
                (size - back, back + 1 + extra)
            }
            Some(Bad::Overflow { back }) => (u64::MAX - back, back + 1 + self.len),
            None => {
                let offset = match self.pos {
                    Pos::Anywhere(r) => r % (size + 1),
                    Pos::Boundary { unit, nth, delta } => {
                        let base = nth % (size / unit + 1) * unit;
                        base.saturating_add_signed(delta).min(size)
                    }
                    Pos::FromEnd(back) => size.saturating_sub(back),
                };
                (offset, self.len.min(size - offset))
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum NewSize {
    /// Grow or shrink by a little (cheap, and often unaligned).
    Delta(i64),
    /// Jump to another drive size.
    Absolute(u64),
}

/// How a write hands its bytes to the store.
#[derive(Debug, Clone, Copy)]
enum Via {
    /// `Backend::write` with a slice.
    Slice,
    /// In 64 KiB-chunk-aligned pieces, as the NBD server streams a large
    /// WRITE; with `fail_at: Some(k)` the k-th piece is written, then the
    /// write stops with an error (a client vanishing mid-payload).
    Fill { fail_at: Option<u32> },
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Read(Span),
    /// With FUA or not, and how the bytes are handed over.
    Write(Span, bool, Via),
    Trim(Span),
    WriteZeroes(Span, bool),
    Resize(NewSize),
    TakeDirty,
}

/// Drive sizes: mostly small, some around one segment, a few around two
/// (the whole drive crosses the 64 MiB segment boundary).
fn drive_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0..=2 * MIB,
        1 => SEGMENT_BYTES - 200_000..=SEGMENT_BYTES + 200_000,
        1 => 2 * SEGMENT_BYTES..=2 * SEGMENT_BYTES + 2 * MIB,
    ]
}

fn pos() -> impl Strategy<Value = Pos> {
    let unit = prop_oneof![Just(PAGE_BYTES), Just(CHUNK_BYTES), Just(SEGMENT_BYTES)];
    prop_oneof![
        3 => any::<u64>().prop_map(Pos::Anywhere),
        4 => (unit, any::<u64>(), -9i64..=9)
            .prop_map(|(unit, nth, delta)| Pos::Boundary { unit, nth, delta }),
        1 => (0u64..=5000).prop_map(Pos::FromEnd),
    ]
}

fn len() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..=20,
        2 => (1u64..=3, -9i64..=9).prop_map(|(n, d)| (n * PAGE_BYTES).saturating_add_signed(d)),
        2 => (-9i64..=9).prop_map(|d| CHUNK_BYTES.saturating_add_signed(d)),
        3 => 0u64..=300_000,
    ]
}

fn bad() -> impl Strategy<Value = Option<Bad>> {
    prop_oneof![
        14 => Just(None),
        1 => (0u64..=5000, 0u64..=5000).prop_map(|(back, extra)| Some(Bad::PastEnd { back, extra })),
        1 => (0u64..=100).prop_map(|back| Some(Bad::Overflow { back })),
    ]
}

fn span() -> impl Strategy<Value = Span> {
    (pos(), len(), bad()).prop_map(|(pos, len, bad)| Span { pos, len, bad })
}

fn via() -> impl Strategy<Value = Via> {
    prop_oneof![
        3 => Just(Via::Slice),
        1 => Just(Via::Fill { fail_at: None }),
        1 => (1u32..=4).prop_map(|k| Via::Fill { fail_at: Some(k) }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let new_size = prop_oneof![
        4 => (-70_000i64..=70_000).prop_map(NewSize::Delta),
        1 => drive_size().prop_map(NewSize::Absolute),
    ];
    prop_oneof![
        3 => span().prop_map(Op::Read),
        5 => (span(), any::<bool>(), via()).prop_map(|(s, fua, via)| Op::Write(s, fua, via)),
        2 => span().prop_map(Op::Trim),
        2 => (span(), any::<bool>()).prop_map(|(s, t)| Op::WriteZeroes(s, t)),
        1 => new_size.prop_map(Op::Resize),
        1 => Just(Op::TakeDirty),
    ]
}

// ------------------------------------------------------------------- model

/// The store under test, its budget, and what it should contain.
struct Model {
    store: RamStore,
    global: Arc<MemoryBudget>,
    oracle: Oracle,
    /// Pages changed since the last `take_dirty`.
    dirty: BTreeSet<u64>,
}

impl Model {
    fn new(size: u64) -> Model {
        let global = Arc::new(MemoryBudget::new(u64::MAX));
        Model {
            store: exact_store(size, &global),
            global,
            oracle: Oracle::new(size),
            dirty: BTreeSet::new(),
        }
    }

    fn size(&self) -> u64 {
        self.store.size()
    }

    /// Runs one operation on both sides, then checks the invariants.
    fn apply(&mut self, op: Op, step: usize) {
        let size = self.size();
        let span = match op {
            Op::Read(s) | Op::Write(s, ..) | Op::Trim(s) | Op::WriteZeroes(s, _) => s,
            Op::Resize(n) => return self.resize(n),
            Op::TakeDirty => return self.check_take_dirty(),
        };
        let (offset, len) = span.resolve(size);
        let allocated_before = self.store.allocated_bytes();
        // Bytes at the start of the range the operation changed: all of them,
        // unless a write failed part-way on purpose.
        let mut changed = len;
        let result = match op {
            Op::Read(_) => {
                if span.bad.is_none() {
                    let mut buf = vec![0xeeu8; len as usize];
                    let r = self.store.read(offset, &mut buf);
                    if r.is_ok() {
                        self.assert_matches_oracle(offset, &buf);
                    }
                    r
                } else {
                    self.store.read(offset, &mut vec![0u8; len as usize])
                }
            }
            Op::Write(_, fua, via) => {
                let data = pattern(len as usize, step as u64);
                let (r, given, injected) = self.write_via(offset, &data, fua, via);
                if span.bad.is_none() {
                    self.oracle.write(offset, &data[..given]);
                }
                if injected {
                    // What was handed over is stored (the store wrote it in
                    // place), nothing after it; the failure is reported.
                    assert!(
                        matches!(r, Err(Error::Io(_))),
                        "injected failure lost: {r:?}"
                    );
                    changed = given as u64;
                    Ok(())
                } else {
                    r
                }
            }
            Op::Trim(_) => {
                let r = self.store.trim(offset, len);
                if span.bad.is_none() {
                    self.oracle.zero(offset, len);
                }
                r
            }
            Op::WriteZeroes(_, may_trim) => {
                let r = self.store.write_zeroes(offset, len, may_trim);
                if span.bad.is_none() {
                    self.oracle.zero(offset, len);
                }
                r
            }
            Op::Resize(_) | Op::TakeDirty => unreachable!(),
        };
        if span.bad.is_some() {
            assert!(
                matches!(result, Err(Error::OutOfRange { .. })),
                "{op:?} at {offset}+{len} on a {size}-byte drive: {result:?}"
            );
            assert_eq!(
                self.store.allocated_bytes(),
                allocated_before,
                "a refused request changed the allocation"
            );
        } else {
            result
                .unwrap_or_else(|e| panic!("{op:?} at {offset}+{len} on a {size}-byte drive: {e}"));
            if !matches!(op, Op::Read(_)) {
                self.dirty.extend(pages_of(offset, changed));
            }
            self.check_window(offset, len);
        }
        self.check_accounting();
    }

    /// Stores `data` with `write`, or with `write_from` handing it over in
    /// the pieces the store asks for. Returns the result, how many bytes
    /// were handed over, and whether a failure was injected.
    fn write_via(
        &self,
        offset: u64,
        data: &[u8],
        fua: bool,
        via: Via,
    ) -> (Result<(), Error>, usize, bool) {
        let Via::Fill { fail_at } = via else {
            return (self.store.write(offset, data, fua), data.len(), false);
        };
        if let Err(e) = check_range(offset, data.len() as u64, self.store.size()) {
            return (Err(e), 0, false);
        }
        let (mut given, mut fired) = (0usize, false);
        let r = write_in_pieces(&self.store, offset, data, fua, |pieces, done| {
            given = done;
            fired = Some(pieces) == fail_at;
            fired
        });
        (r, given, fired)
    }

    fn resize(&mut self, n: NewSize) {
        let new_size = match n {
            NewSize::Delta(d) => self.size().saturating_add_signed(d),
            NewSize::Absolute(s) => s,
        };
        let old_size = self.size();
        self.store.resize(new_size).expect("resize");
        self.oracle.resize(new_size);
        // Pages past the new end no longer exist, so nothing there is dirty.
        self.dirty.retain(|&p| p * PAGE_BYTES < new_size);
        // A shrink to mid-page zeroes that page's tail: it changed.
        if new_size < old_size && new_size % PAGE_BYTES != 0 {
            self.dirty.insert(new_size / PAGE_BYTES);
        }
        assert_eq!(self.size(), new_size);
        // The bytes around the old and new ends are where resize bugs show.
        for at in [old_size.min(new_size), new_size] {
            self.check_window(at.saturating_sub(CHUNK_BYTES), 2 * CHUNK_BYTES);
        }
        self.check_accounting();
    }

    fn assert_matches_oracle(&self, offset: u64, got: &[u8]) {
        let mut want = vec![0u8; got.len()];
        self.oracle.read(offset, &mut want);
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            panic!(
                "byte {} (of a {}-byte read at {offset}, drive {} bytes) is {} but should be {}",
                offset + i as u64,
                got.len(),
                self.size(),
                got[i],
                want[i]
            );
        }
    }

    /// Reads `[offset, offset+len)` widened by a page each side (clipped to
    /// the drive) and checks it against the oracle, and its extents.
    fn check_window(&self, offset: u64, len: u64) {
        let size = self.size();
        let start = (offset.saturating_sub(PAGE_BYTES) / PAGE_BYTES * PAGE_BYTES).min(size);
        let end = (offset + len + PAGE_BYTES)
            .next_multiple_of(PAGE_BYTES)
            .min(size);
        self.check_range(start, end);
    }

    /// Store contents equal the oracle on `[start, end)`; extents cover the
    /// range exactly and their holes read as zero.
    fn check_range(&self, start: u64, end: u64) {
        let mut buf = vec![0xeeu8; (end - start) as usize];
        self.store.read(start, &mut buf).expect("read window");
        self.assert_matches_oracle(start, &buf);
        let extents = self.store.extents(start, end - start).expect("extents");
        assert_eq!(
            extents.iter().map(|e| e.len).sum::<u64>(),
            end - start,
            "extents of {start}..{end} do not cover it: {extents:?}"
        );
        let mut at = 0usize;
        for e in &extents {
            assert!(e.len > 0, "empty extent in {extents:?}");
            assert!(!e.hole || e.zero, "a hole must read as zero: {e:?}");
            let bytes = &buf[at..at + e.len as usize];
            if e.zero {
                assert!(
                    bytes.iter().all(|&b| b == 0),
                    "extent at {} ({e}) is reported zero but holds data",
                    start + at as u64
                );
            }
            at += e.len as usize;
        }
    }

    /// The page counter, the daemon budget and the allocation map agree.
    fn check_accounting(&self) {
        let allocated = self.store.allocated_bytes();
        let size = self.size();
        assert_eq!(allocated % PAGE_BYTES, 0, "allocated bytes not whole pages");
        assert!(
            allocated <= size.next_multiple_of(PAGE_BYTES),
            "{allocated} bytes allocated on a {size}-byte drive"
        );
        assert_eq!(
            self.global.used_bytes(),
            allocated,
            "daemon budget and drive disagree"
        );
        assert_eq!(
            allocated_pages(&self.store.extents(0, size).expect("extents")),
            allocated / PAGE_BYTES
        );
    }

    fn check_take_dirty(&mut self) {
        assert_eq!(
            self.store.dirty_pages(),
            self.dirty.len() as u64,
            "dirty page count"
        );
        let got: BTreeSet<u64> = self.store.take_dirty().iter().collect();
        let missing: Vec<_> = self.dirty.difference(&got).take(10).collect();
        assert!(
            missing.is_empty(),
            "changed pages missing from take_dirty: {missing:?}"
        );
        let spurious: Vec<_> = got.difference(&self.dirty).take(10).collect();
        assert!(
            spurious.is_empty(),
            "take_dirty returned unchanged pages: {spurious:?}"
        );
        self.dirty.clear();
        assert!(
            self.store.take_dirty().is_empty(),
            "a second take must be empty"
        );
    }

    /// Whole-drive comparison, 1 MiB at a time.
    fn check_everything(&self) {
        let size = self.size();
        let mut start = 0;
        while start < size {
            let end = (start + MIB).min(size);
            self.check_range(start, end);
            start = end;
        }
    }
}

/// Pages covered by the non-hole extents of a whole-drive map. Allocated
/// runs start on page boundaries and end on one or at the drive's end.
fn allocated_pages(extents: &[Extent]) -> u64 {
    let mut pos = 0;
    let mut pages = 0;
    for e in extents {
        if !e.hole {
            assert_eq!(
                pos % PAGE_BYTES,
                0,
                "allocated run starts mid-page at {pos}"
            );
            pages += (pos + e.len).div_ceil(PAGE_BYTES) - pos / PAGE_BYTES;
        }
        pos += e.len;
    }
    pages
}

proptest! {
    #![proptest_config(config(256))]

    /// Random operations against the oracle, then everything released.
    #[test]
    fn store_matches_byte_oracle(
        size in drive_size(),
        ops in prop::collection::vec(op(), 1..40),
        trim_before_drop in any::<bool>(),
    ) {
        let mut m = Model::new(size);
        for (step, &op) in ops.iter().enumerate() {
            m.apply(op, step);
        }
        m.check_everything();
        m.check_take_dirty();
        if trim_before_drop {
            let size = m.size();
            m.store.trim(0, size).expect("trim everything");
            // The page holding the end of an unaligned drive is only half in
            // range; `trim_of_a_whole_unaligned_drive_frees_every_page` pins
            // that it must be freed too. Here it may remain, so that this
            // model keeps checking everything else while that bug stands.
            let tail = if size % PAGE_BYTES == 0 { 0 } else { PAGE_BYTES };
            prop_assert!(m.store.allocated_bytes() <= tail);
            prop_assert_eq!(m.global.used_bytes(), m.store.allocated_bytes());
            let whole_pages = size / PAGE_BYTES * PAGE_BYTES;
            prop_assert!(m.store.extents(0, whole_pages).unwrap().iter().all(|e| e.hole));
        }
        let Model { store, global, .. } = m;
        drop(store);
        prop_assert_eq!(global.used_bytes(), 0, "dropping the store must return its memory");
    }
}

// -------------------------------------------------------------- concurrency

const THREADS: usize = 4;

/// One thread's random operation inside its own range.
#[derive(Debug, Clone, Copy)]
struct ThreadOp {
    /// 0 write, 1 write in pieces, 2 trim, 3 write_zeroes, 4 read and check.
    kind: u8,
    /// Offset in the thread's range (modulo its length).
    at: u64,
    len: u64,
    /// FUA for writes, may_trim for write_zeroes.
    flag: bool,
}

fn thread_op() -> impl Strategy<Value = ThreadOp> {
    let len = prop_oneof![
        0u64..=10,
        0u64..=3 * PAGE_BYTES + 7,
        0u64..=2 * CHUNK_BYTES + 3
    ];
    (0u8..5, any::<u64>(), len, any::<bool>()).prop_map(|(kind, at, len, flag)| ThreadOp {
        kind,
        at,
        len,
        flag,
    })
}

/// Runs `ops` inside `range` (exclusively this thread's), checking its own
/// reads as it goes; returns the pages it changed.
fn run_thread(
    store: &RamStore,
    oracle: &mut Oracle,
    range: Range<u64>,
    ops: &[ThreadOp],
    id: usize,
) -> BTreeSet<u64> {
    let mut changed = BTreeSet::new();
    for (step, op) in ops.iter().enumerate() {
        let offset = range.start + op.at % (range.end - range.start + 1);
        let len = op.len.min(range.end - offset);
        match op.kind {
            0 => {
                let data = pattern(len as usize, (step * THREADS + id) as u64);
                store.write(offset, &data, op.flag).expect("write");
                oracle.write(offset, &data);
            }
            1 => {
                // The same in chunk-aligned pieces, as the server streams.
                let data = pattern(len as usize, (step * THREADS + id) as u64);
                write_in_pieces(store, offset, &data, op.flag, |_, _| false)
                    .expect("write in pieces");
                oracle.write(offset, &data);
            }
            2 => {
                store.trim(offset, len).expect("trim");
                oracle.zero(offset, len);
            }
            3 => {
                store
                    .write_zeroes(offset, len, op.flag)
                    .expect("write_zeroes");
                oracle.zero(offset, len);
            }
            _ => {
                let mut got = vec![0xeeu8; len as usize];
                store.read(offset, &mut got).expect("read");
                let mut want = vec![0u8; len as usize];
                oracle.read(offset, &mut want);
                assert!(
                    got == want,
                    "thread {id}: read at {offset}+{len} differs from its oracle"
                );
                continue;
            }
        }
        changed.extend(pages_of(offset, len));
    }
    changed
}

proptest! {
    #![proptest_config(config(48))]

    /// Writers on disjoint, unaligned ranges (sharing pages, chunk locks and
    /// bitmap words at their edges) never disturb each other's bytes or the
    /// accounting.
    #[test]
    fn concurrent_writers_on_disjoint_ranges(
        cross_segment in any::<bool>(),
        cuts in prop::collection::vec(0u64..=600_000, THREADS - 1),
        ops in prop::collection::vec(prop::collection::vec(thread_op(), 1..80), THREADS),
    ) {
        // Either the start of a small drive, or 600 KB straddling the 64 MiB
        // segment boundary of a 65 MiB drive.
        let (size, base) = if cross_segment {
            (SEGMENT_BYTES + MIB, SEGMENT_BYTES - 300_000)
        } else {
            (MIB, 0)
        };
        let mut bounds: Vec<u64> = cuts.iter().map(|c| base + c).collect();
        bounds.push(base);
        bounds.push(base + 600_000);
        bounds.sort_unstable();
        let global = Arc::new(MemoryBudget::new(u64::MAX));
        let store = exact_store(size, &global);
        let mut oracles: Vec<Oracle> = (0..THREADS).map(|_| Oracle::new(size)).collect();
        // All threads start together, so their operations overlap.
        let start = std::sync::Barrier::new(THREADS);
        let changed: Vec<BTreeSet<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = oracles
                .iter_mut()
                .zip(&ops)
                .enumerate()
                .map(|(id, (oracle, ops))| {
                    let (store, start, range) = (&store, &start, bounds[id]..bounds[id + 1]);
                    s.spawn(move || {
                        start.wait();
                        run_thread(store, oracle, range, ops, id)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("writer thread")).collect()
        });

        // Each thread's range holds what that thread's oracle says.
        for (id, oracle) in oracles.iter().enumerate() {
            let (start, end) = (bounds[id], bounds[id + 1]);
            let mut got = vec![0xeeu8; (end - start) as usize];
            store.read(start, &mut got).unwrap();
            let mut want = vec![0u8; got.len()];
            oracle.read(start, &mut want);
            prop_assert!(got == want, "range of thread {} ({}..{}) differs", id, start, end);
        }
        // Nothing outside the pages of the shared range was allocated.
        let extents = store.extents(0, size).unwrap();
        let pages = base / PAGE_BYTES * PAGE_BYTES..(base + 600_000).next_multiple_of(PAGE_BYTES);
        let mut pos = 0;
        for e in &extents {
            if !e.hole {
                prop_assert!(pages.start <= pos && pos + e.len <= pages.end,
                    "allocation outside the written range: {}+{}", pos, e.len);
            }
            pos += e.len;
        }
        prop_assert_eq!(allocated_pages(&extents) * PAGE_BYTES, store.allocated_bytes());
        prop_assert_eq!(global.used_bytes(), store.allocated_bytes());
        // Every page any thread changed is in the dirty set.
        let dirty: BTreeSet<u64> = store.take_dirty().iter().collect();
        for set in &changed {
            prop_assert!(set.is_subset(&dirty), "changed pages missing from take_dirty");
        }
        store.trim(0, size).unwrap();
        prop_assert_eq!(store.allocated_bytes(), 0);
        prop_assert_eq!(global.used_bytes(), 0);
    }
}

// ---------------------------------------------------------------- edge cases

/// Trimming a whole drive frees all of its memory, also when its size is not
/// a multiple of the page: the bytes of the last page past the end are not
/// data, so nothing in that page needs keeping.
#[test]
fn trim_of_a_whole_unaligned_drive_frees_every_page() {
    for size in [1, 5000, CHUNK_BYTES + 1, SEGMENT_BYTES + 123] {
        let global = Arc::new(MemoryBudget::new(u64::MAX));
        let store = exact_store(size, &global);
        store.write(size - 1, &[7], false).unwrap();
        store.write(0, &[7], false).unwrap();
        store.trim(0, size).unwrap();
        assert_eq!(store.allocated_bytes(), 0, "drive of {size} bytes");
        assert_eq!(global.used_bytes(), 0, "drive of {size} bytes");
        // The same through WRITE_ZEROES that may punch holes.
        store.write(size - 1, &[7], false).unwrap();
        store.write_zeroes(0, size, true).unwrap();
        assert_eq!(store.allocated_bytes(), 0, "drive of {size} bytes");
    }
}

/// A resize beyond the largest drive is refused and changes nothing.
#[test]
fn resize_beyond_maximum_is_refused() {
    let global = Arc::new(MemoryBudget::new(u64::MAX));
    let store = RamStore::new(MIB, None, global).unwrap();
    store.write(10, b"abc", false).unwrap();
    assert!(matches!(
        store.resize(MAX_DRIVE_BYTES + 1),
        Err(Error::Invalid(_))
    ));
    assert_eq!(store.size(), MIB);
    let mut buf = [0u8; 3];
    store.read(10, &mut buf).unwrap();
    assert_eq!(&buf, b"abc");
    assert!(RamStore::new(
        MAX_DRIVE_BYTES + 1,
        None,
        Arc::new(MemoryBudget::new(u64::MAX))
    )
    .is_err());
}

/// Two drives on one daemon budget: each one's pages are charged once and
/// given back when it goes, whatever the other does.
#[test]
fn drives_share_the_daemon_budget() {
    let global = Arc::new(MemoryBudget::new(u64::MAX));
    let a = RamStore::new(SEGMENT_BYTES + MIB, None, global.clone()).unwrap();
    let b = RamStore::new(MIB, None, global.clone()).unwrap();
    // Across the segment boundary: two pages on each side.
    a.write(
        SEGMENT_BYTES - 2 * PAGE_BYTES,
        &pattern(4 * PAGE_BYTES as usize, 1),
        false,
    )
    .unwrap();
    b.write(1, &pattern(PAGE_BYTES as usize, 2), false).unwrap();
    assert_eq!(a.allocated_bytes(), 4 * PAGE_BYTES);
    assert_eq!(b.allocated_bytes(), 2 * PAGE_BYTES);
    assert_eq!(global.used_bytes(), 6 * PAGE_BYTES);
    a.resize(SEGMENT_BYTES - PAGE_BYTES).unwrap();
    assert_eq!(a.allocated_bytes(), PAGE_BYTES);
    assert_eq!(global.used_bytes(), 3 * PAGE_BYTES);
    drop(a);
    assert_eq!(global.used_bytes(), 2 * PAGE_BYTES);
    drop(b);
    assert_eq!(global.used_bytes(), 0);
}

/// Writes `data` in pieces aligned to the store's 64 KiB lock chunks, the
/// way the NBD server streams a large WRITE. After each piece, `stop(pieces
/// written, bytes written)` may end the write with an injected error.
fn write_in_pieces(
    store: &RamStore,
    offset: u64,
    data: &[u8],
    fua: bool,
    mut stop: impl FnMut(u32, usize) -> bool,
) -> Result<(), Error> {
    let (mut done, mut pieces) = (0usize, 0u32);
    while done < data.len() {
        let at = offset + done as u64;
        let n = ((CHUNK_BYTES - at % CHUNK_BYTES) as usize).min(data.len() - done);
        store.write(at, &data[done..done + n], fua)?;
        done += n;
        pieces += 1;
        if stop(pieces, done) {
            return Err(Error::Io(std::io::Error::other("injected failure")));
        }
    }
    Ok(())
}

/// A store that commits pages only when written (no prefaulter), so the
/// model's accounting is exact: allocated pages are exactly the written ones.
fn exact_store(size: u64, global: &Arc<MemoryBudget>) -> RamStore {
    let opts = StoreOptions {
        mem_limit_bytes: None,
        prefault: false,
        ..StoreOptions::default()
    };
    RamStore::with_options(size, opts, global.clone()).expect("create store")
}
