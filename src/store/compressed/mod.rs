//! The compressed RAM store (`--compress lz4|zstd[:LEVEL]`): a drive whose
//! 4 KiB pages are kept compressed, so it may hold more than its memory.
//!
//! # Layout
//!
//! ```text
//!  page p ─▶ group g = p / 16 (64 KiB) ─▶ shard g % 16, local page (g / 16) * 16 + p % 16
//!
//!  shard (one RwLock, 128-byte aligned)     table.rs, shard.rs
//!   └ page table: 8 bytes per page, Hole | Same(word) | Raw(page) | Stored(class, id, len)
//!  pool (one per drive)                     pool.rs
//!   └ 252 size classes 16 bytes apart (16..=4032), one RwLock each,
//!     objects dense over 4 KiB pages, ids -> slots
//!  arena (one per drive)                    arena.rs
//!   └ 4 KiB pages from 2-64 MiB mappings, a small cache of free pages
//! ```
//!
//! # Design, and why
//!
//! - **Each page alone** (zram's choice), compressed with lz4 or zstd. A
//!   client's unit is 4 KiB and the target load is 4 KiB random I/O:
//!   compressing pages in groups would turn every 4 KiB write into a
//!   read-decompress-recompress of the group and every 4 KiB read into a
//!   group decompression. What grouping would gain, measured by
//!   `examples/compressed_bench.rs` on 64 MiB of `/usr/bin` and
//!   `/usr/share/doc`: groups of 4 pages take 6-7% fewer bytes than single
//!   pages (lz4 0.931, zstd:1 0.942, zstd:3 0.940), groups of 16 9-11%
//!   (0.891, 0.916, 0.910): not worth 4-16x the work per random access.
//! - **Same-filled pages** (every 8-byte word equal, zero pages included)
//!   keep only the word, in the entry. **Huge pages** (compressed to more
//!   than 4032 bytes, `page.rs`) are kept raw, each in an arena page its
//!   entry points at: no class, no copy beyond the page itself.
//! - **Placement: one pool of dense size classes per drive** (`pool.rs`,
//!   which has the measurements behind it): 16-byte classes round a page
//!   up by ~8 bytes, a class grows and shrinks by one 4 KiB page, and a
//!   free moves the class's last object into the hole, so there is no
//!   fragmentation to compact later and nothing to wait for when the
//!   budget is full. Entries name objects by id, so moving one never
//!   touches another shard's table.
//! - **16 shards** of page tables, each page group (64 KiB, the raw store's
//!   lock unit) in one of them: no global lock on the data path. Pages are
//!   compressed before any lock is taken; a change holds its shard's lock
//!   exclusively and one class lock at a time; reads decompress under the
//!   shard's and the class's shared locks.
//!
//! # Memory accounting
//!
//! The drive's limit and the daemon's budget are charged the arena pages
//! the drive holds, its classes' pages and raw pages, plus the few free
//! pages the arena keeps resident for reuse (`CompressedStats::slab_bytes`):
//! charged when a page is taken, released when it goes back to the OS. Holes
//! and same-filled pages cost nothing. The drive's size is independent of
//! its limit. A write that needs a page when a budget is full tries an
//! in-place reuse of its page's old memory (its old slot when the new
//! object fits it, or its raw page), then fails with `NoSpace` (ENOSPC),
//! leaving the page as it was: so, unlike the raw store, an overwrite can
//! fail for space when its data compresses worse than before. Tables and
//! bookkeeping (`metadata_bytes`, ~16 bytes per stored page) are reported
//! and counted in `mem_used_bytes`, but not charged, as with the raw store.
//!
//! # Invariants
//!
//! - A page's bytes are read or changed only under its shard's lock (shared
//!   to read, exclusive to change), and every operation re-checks the drive
//!   size under it, so a request validated before a shrink fails with
//!   `OutOfRange` instead of touching what the shrink released.
//! - A shrink zeroes the tail of the page holding the new end and stores the
//!   new size under that page's shard lock, then makes every page beyond a
//!   hole, shard by shard: nothing of the old contents reappears on growth.
//! - Partial-page writes, zeroes and trims read-modify-write the page.
//!   Whole pages trimmed (or zeroed with `may_trim`) become holes; whole
//!   pages zeroed without it become `Same(0)`: reported as allocated
//!   zeroes, but costing nothing, so unlike the raw store NO_HOLE reserves
//!   no memory for later writes to the range (their size is unknown).
//! - Every arena page is held by exactly one class or one `Raw` entry, or
//!   is free in the arena; `check` verifies it and the charge.
//!
//! # Dependencies
//!
//! `lz4_flex`: LZ4 in pure Rust, its fastest (non-`safe`) paths with
//! bounds-checked decoding. `zstd`: the same crate and version the
//! snapshots use.

mod adopt;
mod arena;
mod heap;
mod keep;
mod marks;
mod page;
mod pool;
mod recompress;
mod shard;
mod stats;
mod sync;
mod table;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock, RwLockWriteGuard};

use super::budget::MemoryBudget;
use super::cut::CutState;
use super::SegmentKeeper;
use crate::block::backend::{check_range, Backend, Caps, Error, Extent, Result};
use crate::store::ledger::Ledger;
pub use arena::region_bytes_for as locked_region_bytes_for;
use arena::{Charge, NoPage, PageArena};
pub use heap::return_freed_memory;
use keep::Keep;
pub use keep::{KeepError, KeptFiles};
use marks::Marks;
pub use page::{Algorithm, ParseAlgorithmError, HUGE_MIN_BYTES, PAGE_BYTES, ZSTD_DEFAULT_LEVEL};
use page::{Codec, Packed, PageError, PACK_BUF_BYTES};
use pool::Pool;
pub use shard::SHARDS;
use shard::{global_page, locals_before, locate, Placing, Shard, Space, GROUP_PAGES};
pub use stats::CompressedStats;
use sync::CapturedGroup;
pub use sync::CompressedCut;
use table::{Entry, Obj, ACCESSED};

/// Bytes per page group: the unit of sharding.
pub const GROUP_BYTES: u64 = (GROUP_PAGES * PAGE_BYTES) as u64;
/// The largest compressed drive: 64 TiB (a shard-local page index is a u32).
pub const MAX_COMPRESSED_DRIVE_BYTES: u64 = 64 << 40;
/// Cap on extents per `extents()` call (the reply covers a prefix).
const MAX_EXTENTS: usize = 16 * 1024;

const PAGE: u64 = PAGE_BYTES as u64;
const _: () = assert!(MAX_COMPRESSED_DRIVE_BYTES / PAGE / SHARDS as u64 <= u32::MAX as u64);

thread_local! {
    /// This thread's buffer for a page's compressed bytes.
    static PACK_BUF: std::cell::RefCell<[u8; PACK_BUF_BYTES]> =
        const { std::cell::RefCell::new([0; PACK_BUF_BYTES]) };
}

/// A shard on its own cache lines, so two cores locking neighbours do not
/// share one.
#[repr(align(128))]
struct Padded(RwLock<Shard>);

/// The two budgets a page is charged to.
struct DriveMem {
    /// This drive's memory: `used` = arena pages charged, `limit` = mem-limit.
    drive: MemoryBudget,
    /// The daemon-wide budget shared by all drives.
    global: Arc<MemoryBudget>,
}

/// [`DriveMem`] for recompression: may pass the budgets by
/// `recompress::OVERDRAFT_BYTES` (see `recompress.rs`).
struct Overdraft<'a>(&'a DriveMem);

impl Charge for Overdraft<'_> {
    fn reserve(&self, bytes: u64) -> bool {
        let over = recompress::OVERDRAFT_BYTES;
        self.0
            .reserve_with(bytes, |b| b.try_reserve_over(bytes, over))
    }
    fn release(&self, bytes: u64) {
        self.0.release(bytes);
    }
}

impl DriveMem {
    fn new(limit: Option<u64>, global: Arc<MemoryBudget>) -> DriveMem {
        DriveMem {
            drive: MemoryBudget::new(limit.unwrap_or(u64::MAX)),
            global,
        }
    }

    /// Takes `bytes` from the drive's budget, then the daemon's, with
    /// `take`; from neither when either refuses.
    fn reserve_with(&self, bytes: u64, take: impl Fn(&MemoryBudget) -> bool) -> bool {
        if !take(&self.drive) {
            return false;
        }
        if !take(&self.global) {
            self.drive.release(bytes);
            return false;
        }
        true
    }
}

impl Charge for DriveMem {
    fn reserve(&self, bytes: u64) -> bool {
        self.reserve_with(bytes, |b| b.try_reserve(bytes))
    }
    fn release(&self, bytes: u64) {
        self.drive.release(bytes);
        self.global.release(bytes);
    }
}

/// What a change does to the pages of its range.
#[derive(Clone, Copy)]
enum Source<'a> {
    Data(&'a [u8]),
    /// Zeroes that stay allocated (`Same(0)` for whole pages).
    Zeroes,
    /// Zeroes, whole pages becoming holes.
    Trim,
}

/// A compressed RAM drive: its store, and the worker that recompresses
/// idle pages when the drive has a second codec (`recompress.rs`).
pub struct CompressedStore {
    /// Stopped (and joined) when the drive is dropped, before `inner`.
    worker: Option<recompress::Worker>,
    inner: Arc<Inner>,
}

/// The store itself (shared with the recompression worker).
struct Inner {
    algo: Algorithm,
    /// Current size in bytes.
    size: AtomicU64,
    shards: Box<[Padded]>,
    /// The size classes of compressed pages.
    pool: Pool,
    /// The pages of the classes and of raw pages.
    arena: PageArena,
    mem: DriveMem,
    /// Serialises resizes and sync cuts (never taken on the data path).
    resize_lock: Mutex<()>,
    /// Pages changed since the last sync cut, and the groups' epochs
    /// (`marks.rs`, `sync.rs`).
    marks: Marks,
    /// The running sync cut, if any (`store::cut`).
    cut: CutState<CapturedGroup>,
    /// Smallest size since the last cut began (a sync must record a
    /// shrink even when the drive grew back before it). Changed under
    /// `resize_lock`.
    min_size: AtomicU64,
    /// What recompression did (`recompress.rs`).
    recomp: recompress::Counters,
    /// Who else holds a kept drive's memfds (`keep.rs`), told its size.
    keeper: OnceLock<Arc<dyn SegmentKeeper>>,
}

/// Empty shards for a new drive.
fn fresh_shards() -> Box<[Padded]> {
    (0..SHARDS)
        .map(|si| Padded(RwLock::new(Shard::new(si))))
        .collect()
}

fn kept_error(e: KeepError) -> Error {
    match e {
        KeepError::Io(e) => Error::Io(e),
        e => Error::Invalid(format!("kept compressed memory: {e}")),
    }
}

fn corrupt(e: PageError) -> Error {
    Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Calls `f(page, offset in page, length, offset in request)` for each
/// page piece of `[offset, offset+len)`.
fn for_each_page(
    offset: u64,
    len: u64,
    mut f: impl FnMut(u64, usize, usize, usize) -> Result<()>,
) -> Result<()> {
    let end = offset + len;
    let mut pos = offset;
    while pos < end {
        let n = (PAGE - pos % PAGE).min(end - pos);
        f(
            pos / PAGE,
            (pos % PAGE) as usize,
            n as usize,
            (pos - offset) as usize,
        )?;
        pos += n;
    }
    Ok(())
}

impl CompressedStore {
    /// A drive of `size_bytes` compressed with `algo`, charging its pages
    /// to `global_mem` and to its own `mem_limit_bytes` (None: no limit of
    /// its own).
    pub fn new(
        size_bytes: u64,
        algo: Algorithm,
        mem_limit_bytes: Option<u64>,
        global_mem: Arc<MemoryBudget>,
    ) -> Result<CompressedStore> {
        CompressedStore::with_lock(size_bytes, algo, mem_limit_bytes, global_mem, false)
    }

    /// [`CompressedStore::new`], its memory locked in RAM with
    /// `lock_memory` (`--lock-memory`: `arena.rs`).
    pub fn with_lock(
        size_bytes: u64,
        algo: Algorithm,
        mem_limit_bytes: Option<u64>,
        global_mem: Arc<MemoryBudget>,
        lock_memory: bool,
    ) -> Result<CompressedStore> {
        let promise = size_bytes.min(mem_limit_bytes.unwrap_or(u64::MAX));
        let arena = PageArena::new(arena::region_bytes_for(promise), lock_memory);
        let mem = DriveMem::new(mem_limit_bytes, global_mem);
        let s = Inner::of(
            algo,
            arena,
            Pool::default(),
            fresh_shards(),
            mem,
            Marks::default(),
        );
        s.resize(size_bytes)?;
        CompressedStore::start(s, size_bytes)
    }

    /// [`CompressedStore::with_lock`] in memfds that can outlive the
    /// process (`keep.rs`): a supervisor holds them ([`Self::set_keeper`])
    /// and the next process adopts them ([`Self::adopt`]). With `ledger`
    /// (a persistent drive) its dirty set is kept too (`marks.rs`).
    pub fn kept(
        size_bytes: u64,
        algo: Algorithm,
        mem_limit_bytes: Option<u64>,
        global_mem: Arc<MemoryBudget>,
        lock_memory: bool,
        ledger: bool,
    ) -> Result<CompressedStore> {
        let promise = size_bytes.min(mem_limit_bytes.unwrap_or(u64::MAX));
        let rb = arena::region_bytes_for(promise);
        let keep = Arc::new(Keep::create(rb).map_err(kept_error)?);
        let arena = PageArena::with_keep(rb, lock_memory, Some(keep));
        let mem = DriveMem::new(mem_limit_bytes, global_mem);
        let marks = match ledger {
            true => Marks::kept(Ledger::create(size_bytes)?),
            false => Marks::default(),
        };
        let s = Inner::of(algo, arena, Pool::default(), fresh_shards(), mem, marks);
        s.resize(size_bytes)?;
        CompressedStore::start(s, size_bytes)
    }

    /// A drive of `size_bytes` over the memfds a killed (or upgraded)
    /// process kept (`keep.rs`, `adopt.rs`): every page it acknowledged.
    /// Its pages are charged to both budgets, past their limits if need
    /// be (the memory is there already). With a ledger, the dirty set is
    /// its dirty and pending pages and the next cut records the smallest
    /// size it saw since its last saved one (`marks.rs`). Refused when the
    /// files are not a kept compressed drive or contradict themselves.
    pub fn adopt(
        size_bytes: u64,
        files: KeptFiles,
        algo: Algorithm,
        mem_limit_bytes: Option<u64>,
        global_mem: Arc<MemoryBudget>,
        lock_memory: bool,
    ) -> Result<CompressedStore> {
        if size_bytes == 0 || size_bytes > MAX_COMPRESSED_DRIVE_BYTES {
            return Err(Error::Invalid(format!(
                "cannot adopt a compressed drive of {size_bytes} bytes"
            )));
        }
        let keep = Arc::new(Keep::open(files.arena, files.meta).map_err(kept_error)?);
        let groups = size_bytes.div_ceil(GROUP_BYTES);
        let (marks, min_size) = match files.ledger {
            Some(fd) => {
                let ledger = Ledger::adopt(fd)?;
                let min = ledger.unsaved_min().min(size_bytes);
                (Marks::adopt(ledger, groups)?, min)
            }
            None => (Marks::default(), size_bytes),
        };
        let mem = DriveMem::new(mem_limit_bytes, global_mem);
        let over = |b| {
            mem.drive.try_reserve_over(b, u64::MAX);
            mem.global.try_reserve_over(b, u64::MAX);
        };
        let (arena, pool, shards) =
            adopt::rebuild(keep, size_bytes, lock_memory, &mem, over).map_err(kept_error)?;
        let shards = shards.into_iter().map(|s| Padded(RwLock::new(s))).collect();
        let s = Inner::of(algo, arena, pool, shards, mem, marks);
        s.marks.grow(groups)?;
        // Zeroes the end page's tail (a shrink the kill interrupted) and
        // publishes the size. Refusing the drive for want of space would
        // lose it: the tail stays then (beyond the size, unread), logged.
        if let Err(e) = s.cut_end_page(size_bytes) {
            tracing::warn!("an adopted compressed drive's end page keeps bytes beyond its size ({e}); they would reappear if it grew");
            s.size.store(size_bytes, Ordering::Release);
        }
        CompressedStore::start(s, min_size)
    }

    /// Starts the drive; `min_size` is the smallest size its next cut
    /// records.
    fn start(s: Inner, min_size: u64) -> Result<CompressedStore> {
        s.min_size.store(min_size, Ordering::Release);
        let inner = Arc::new(s);
        let worker = inner
            .algo
            .secondary()
            .map(|_| recompress::Worker::start(inner.clone()))
            .transpose()
            .map_err(Error::Io)?;
        Ok(CompressedStore { worker, inner })
    }

    /// Gives a kept drive's memfds to `keeper` (at once, then with every
    /// size: before a grow is published, before a shrink changes
    /// anything); a second keeper, or one for an unkept drive, is ignored.
    pub fn set_keeper(&self, keeper: Arc<dyn SegmentKeeper>) {
        let Some(k) = self.inner.arena.keep() else {
            return;
        };
        let _guard = self.inner.resize_lock.lock();
        if self.inner.keeper.set(keeper.clone()).is_ok() {
            keeper.keep(self.inner.size(), &self.inner.kept_fds(k));
        }
    }

    /// True when the drive's memory is kept in memfds (`keep.rs`).
    pub fn is_kept(&self) -> bool {
        self.inner.arena.keep().is_some()
    }

    /// The drive's compression.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algo
    }

    /// True when the drive's memory is locked in RAM.
    pub fn is_locked(&self) -> bool {
        self.inner.arena.is_locked()
    }

    /// Bytes the kernel counts against `RLIMIT_MEMLOCK` for this drive:
    /// its locked mappings (0 when not locked).
    pub fn locked_map_bytes(&self) -> u64 {
        match self.inner.arena.is_locked() {
            true => self.inner.arena.mapped_bytes(),
            false => 0,
        }
    }

    /// Bytes charged to the budgets (arena pages held).
    pub fn allocated_bytes(&self) -> u64 {
        self.inner.mem.drive.used_bytes()
    }

    /// The drive's memory limit (`u64::MAX` when unlimited).
    pub fn mem_limit_bytes(&self) -> u64 {
        self.inner.mem.drive.limit_bytes()
    }

    /// Changes the drive's memory limit (None: unlimited).
    pub fn set_mem_limit_bytes(&self, limit: Option<u64>) {
        self.inner
            .mem
            .drive
            .set_limit_bytes(limit.unwrap_or(u64::MAX));
    }

    /// The drive's memory figures (zram's `mm_stat`).
    pub fn stats(&self) -> CompressedStats {
        self.inner.stats()
    }

    /// Gives the free pages the arena keeps for reuse back to the OS (the
    /// size classes are always compact: `pool.rs`). For the daemon's tick
    /// or an operator. Returns the bytes released.
    pub fn compact(&self) -> u64 {
        self.inner.arena.release_cache(&self.inner.mem)
    }

    /// Recompresses every page that is not yet held by the drive's second
    /// codec, idle or not, now, in this thread (None when the drive has no
    /// second codec). Returns the bytes of objects it saved. For tests and
    /// benchmarks: the worker does this for idle pages in the background.
    pub fn recompress_all(&self) -> Option<u64> {
        self.inner.algo.secondary()?;
        Some(self.inner.recompress_sweep(true))
    }

    /// Checks every shard's invariants, the pool's, and that the arena's
    /// pages are the classes' and the raw entries' and are exactly what
    /// the drive's budget is charged. Returns the first broken one. The
    /// shards are read one after another, so this is only exact when no
    /// change runs meanwhile (tests, or a quiesced drive).
    pub fn check(&self) -> std::result::Result<(), Inconsistency> {
        self.inner.check()
    }

    /// Host memory is short: an `lz4+zstd` drive's worker sweeps now and
    /// recompresses every page lz4 holds, in use or not (at its usual CPU
    /// budget). False for a drive without a second codec.
    pub fn hurry_recompression(&self) -> bool {
        match &self.worker {
            Some(w) => {
                w.hurry(&self.inner);
                true
            }
            None => false,
        }
    }

    /// Keeps the background recompression worker from changing anything
    /// while the guard lives (an explicit `recompress_all` still runs):
    /// for tests that compare figures before and after an operation.
    pub fn pause_recompression(&self) -> recompress::Paused<'_> {
        recompress::Paused::new(&self.inner.recomp)
    }

    /// Grows or shrinks the drive. Shrinking releases the memory beyond the
    /// new end; growing adds zero-filled space. Fails with `NoSpace`,
    /// changing nothing, when the page holding the new end cannot be
    /// stored with its tail zeroed.
    pub fn resize(&self, new_size: u64) -> Result<()> {
        self.inner.resize(new_size)
    }
}

impl Inner {
    /// A drive of size 0 over these pieces.
    fn of(
        algo: Algorithm,
        arena: PageArena,
        pool: Pool,
        shards: Box<[Padded]>,
        mem: DriveMem,
        marks: Marks,
    ) -> Inner {
        Inner {
            algo,
            size: AtomicU64::new(0),
            shards,
            pool,
            arena,
            mem,
            resize_lock: Mutex::new(()),
            marks,
            cut: CutState::default(),
            min_size: AtomicU64::new(0),
            recomp: recompress::Counters::default(),
            keeper: OnceLock::new(),
        }
    }

    /// A kept drive's size is about to be `size`: noted in its memfds and
    /// told its keeper (under the resize lock).
    fn note_kept_size(&self, size: u64) {
        let Some(k) = self.arena.keep() else { return };
        k.note_size(size);
        if let Some(keeper) = self.keeper.get() {
            keeper.keep(size, &self.kept_fds(k));
        }
    }

    /// A kept drive's descriptors, as its keeper holds them (`KeptFiles`).
    fn kept_fds<'a>(&'a self, k: &'a Keep) -> Vec<std::os::fd::BorrowedFd<'a>> {
        let mut fds = vec![k.arena_fd(), k.meta_fd()];
        fds.extend(self.marks.ledger().map(|l| l.fd()));
        fds
    }

    /// Where a shard's pages go.
    fn space(&self) -> Space<'_, DriveMem> {
        Space {
            pool: &self.pool,
            arena: &self.arena,
            charge: &self.mem,
        }
    }

    /// The drive's memory figures (zram's `mm_stat`).
    fn stats(&self) -> CompressedStats {
        let mut total = CompressedStats::default();
        for sh in self.shards.iter() {
            let s = sh.0.read();
            let c = s.counts();
            total.add(&CompressedStats {
                orig_data_bytes: (c.same_pages + c.huge_pages + c.compressed_pages) * PAGE,
                compr_data_bytes: c.huge_pages * PAGE,
                metadata_bytes: s.metadata_bytes(),
                same_pages: c.same_pages,
                huge_pages: c.huge_pages,
                compressed_pages: c.compressed_pages,
                recompressed_pages: c.recompressed_pages,
                ..CompressedStats::default()
            });
        }
        let k = self.pool.compact_counts();
        total.recompress_attempts = self.recomp.attempts.load(Ordering::Relaxed);
        total.recompress_saved_bytes = self.recomp.saved_bytes.load(Ordering::Relaxed);
        total.recompress_cpu_ms = self.recomp.cpu_ns.load(Ordering::Relaxed) / 1_000_000;
        total.urgent_sweeps = self.recomp.urgent_sweeps.load(Ordering::Relaxed);
        total.compr_data_bytes += self.pool.live_bytes();
        total.slab_bytes = self.arena.charged_pages() * PAGE;
        total.compact_runs = k.runs;
        total.compact_moved_objects = k.moved_objects;
        total.compact_freed_bytes = k.runs * PAGE;
        total.metadata_bytes += (std::mem::size_of::<Inner>()
            + SHARDS * std::mem::size_of::<Padded>()) as u64
            + self.pool.metadata_bytes()
            + self.arena.metadata_bytes()
            + self.arena.keep().map_or(0, |k| k.metadata_bytes())
            + self.marks.metadata_bytes();
        total
    }

    fn check(&self) -> std::result::Result<(), Inconsistency> {
        let _no_recompression = self.recomp.busy.lock();
        let mut refs = vec![Vec::new(); pool::CLASSES];
        let mut raw = 0;
        for (i, sh) in self.shards.iter().enumerate() {
            let s = sh.0.read();
            raw += s
                .check(&mut refs)
                .map_err(|what| Inconsistency { shard: i, what })?;
        }
        let whole = |what| Inconsistency {
            shard: SHARDS,
            what,
        };
        self.pool.check(&refs).map_err(whole)?;
        if self.arena.out_pages() != self.pool.pages() + raw {
            return Err(whole(
                "the arena's pages out differ from the classes' and raw pages",
            ));
        }
        if self.arena.charged_pages() * PAGE != self.mem.drive.used_bytes() {
            return Err(whole("the drive budget differs from the pages held"));
        }
        Ok(())
    }

    fn shard(&self, i: usize) -> &RwLock<Shard> {
        &self.shards[i].0
    }

    /// The exclusive lock of shard `si` for a change to group `g`. While a
    /// sync cut runs, the group's pre-cut pages are saved first (waiting,
    /// lock released, for the cut to capture them when there is no memory
    /// for a copy): one atomic load when no cut runs.
    fn lock_change(&self, si: usize, g: u64) -> RwLockWriteGuard<'_, Shard> {
        loop {
            let shard = self.shard(si).write();
            let e = self.cut.active();
            if e == 0 || self.cow_group(&shard, g, e) {
                return shard;
            }
            drop(shard);
            self.cut.wait_captured(g, e, || self.marks.epoch(g) >= e);
        }
    }

    fn out_of_range(&self, offset: u64, len: u64) -> Error {
        Error::OutOfRange {
            offset,
            len,
            size: self.size(),
        }
    }

    fn no_space(&self, full: NoPage) -> Error {
        let (d, g) = (&self.mem.drive, &self.mem.global);
        match full {
            NoPage::Map(errno) if self.arena.is_locked() => super::lock_error(
                std::io::Error::from_raw_os_error(errno),
                self.arena.region_bytes() as u64,
            ),
            NoPage::Map(errno) => Error::Io(std::io::Error::from_raw_os_error(errno)),
            NoPage::Budget if d.used_bytes() + PAGE > d.limit_bytes() => Error::NoSpace(format!(
                "drive memory limit of {} bytes reached ({} in use)",
                d.limit_bytes(),
                d.used_bytes()
            )),
            NoPage::Budget if g.is_host_capped(PAGE) => Error::HostShort,
            NoPage::Budget => Error::NoSpace(format!(
                "daemon memory budget of {} bytes reached ({} in use)",
                g.limit_bytes(),
                g.used_bytes()
            )),
        }
    }

    /// The compressor of an object's codec.
    fn codec(&self, codec: u8) -> Codec {
        self.algo.codec(codec)
    }

    /// Copies bytes `[at, at+out.len())` of a page into `out`. On a drive
    /// that recompresses, marks the page accessed (not idle).
    fn load(&self, shard: &Shard, local: u32, at: usize, out: &mut [u8]) -> Result<()> {
        if self.algo.secondary().is_some() {
            shard.touch(local);
        }
        match shard.entry(local) {
            Entry::Hole => out.fill(0),
            Entry::Same(w) => page::fill_same(w, at, out),
            // SAFETY: a raw page belongs to its entry alone, and the caller
            // holds the shard's lock (shared at least).
            Entry::Raw(p) => out.copy_from_slice(&unsafe { p.bytes() }[at..at + out.len()]),
            Entry::Stored(o) => self.load_obj(o, at, out)?,
        }
        Ok(())
    }

    /// Decompresses an object into `out` (bytes `at..` of its page).
    fn load_obj(&self, o: Obj, at: usize, out: &mut [u8]) -> Result<()> {
        let algo = self.codec(o.codec);
        let (class, len) = (o.class as usize, o.len as usize);
        if out.len() == PAGE_BYTES {
            return self
                .pool
                .read(class, o.id, len, |b| page::unpack(algo, b, out))
                .map_err(corrupt);
        }
        let mut tmp = [0u8; PAGE_BYTES];
        self.pool
            .read(class, o.id, len, |b| page::unpack(algo, b, &mut tmp))
            .map_err(corrupt)?;
        out.copy_from_slice(&tmp[at..at + out.len()]);
        Ok(())
    }

    /// Applies `src` to `[at, at+n)` of page `p`; `to_end` when the piece
    /// runs to the end of the drive (the rest of the page is zero).
    fn change_page(
        &self,
        p: u64,
        at: usize,
        n: usize,
        to_end: bool,
        src: Source<'_>,
    ) -> Result<()> {
        // This thread's pack buffer: not zeroed for every page.
        PACK_BUF.with(|b| self.change_page_with(p, (at, n), to_end, src, &mut b.borrow_mut()))
    }

    fn change_page_with(
        &self,
        p: u64,
        (at, n): (usize, usize),
        to_end: bool,
        src: Source<'_>,
        buf: &mut [u8; PACK_BUF_BYTES],
    ) -> Result<()> {
        let whole = at == 0 && (n == PAGE_BYTES || (to_end && !matches!(src, Source::Data(_))));
        let packed = match src {
            Source::Data(d) if whole => {
                Some(page::pack(self.algo.primary(), d, buf).map_err(corrupt)?)
            }
            _ => None,
        };
        let (si, local) = locate(p);
        let mut shard = self.lock_change(si, p / GROUP_PAGES as u64);
        if p * PAGE + (at + n) as u64 > self.size() {
            return Err(self.out_of_range(p * PAGE + at as u64, n as u64));
        }
        self.marks.mark_before_change(p);
        match (src, packed) {
            (Source::Trim, _) if whole => shard.trim(local, &self.space()),
            (Source::Zeroes, _) if whole => shard
                .place(local, Placing::Same(0), 0, &self.space())
                .map_err(|f| self.no_space(f))?,
            (Source::Data(d), Some(pk)) => self.place_page(&mut shard, local, pk, d, buf)?,
            _ => {
                let mut pg = [0u8; PAGE_BYTES];
                self.load(&shard, local, 0, &mut pg)?;
                match src {
                    Source::Data(d) => pg[at..at + n].copy_from_slice(d),
                    Source::Zeroes | Source::Trim => pg[at..at + n].fill(0),
                }
                let pk = page::pack(self.algo.primary(), &pg, buf).map_err(corrupt)?;
                self.place_page(&mut shard, local, pk, &pg, buf)?;
            }
        }
        // Under the lock, after the change: a cut either captured the
        // group before (this change is after the cut) or sees the bit.
        self.marks.set_dirty(p);
        Ok(())
    }

    /// Stores a whole written page, `pk` (in `buf`) as the drive's first
    /// codec packed it.
    fn place_page(
        &self,
        shard: &mut Shard,
        local: u32,
        pk: Packed,
        page: &[u8],
        buf: &[u8; PACK_BUF_BYTES],
    ) -> Result<()> {
        shard
            .place(
                local,
                Placing::new(pk, &buf[..], page, 0),
                ACCESSED,
                &self.space(),
            )
            .map_err(|f| self.no_space(f))
    }

    /// Applies `src` to `[offset, offset+len)` page by page.
    fn change(&self, offset: u64, len: u64, src: Source<'_>) -> Result<()> {
        let size = self.size();
        check_range(offset, len, size)?;
        for_each_page(offset, len, |p, at, n, req_at| {
            let to_end = p * PAGE + (at + n) as u64 == size;
            let piece = match src {
                Source::Data(d) => Source::Data(&d[req_at..req_at + n]),
                other => other,
            };
            self.change_page(p, at, n, to_end, piece)
        })
    }

    fn resize(&self, new_size: u64) -> Result<()> {
        if new_size > MAX_COMPRESSED_DRIVE_BYTES {
            return Err(Error::Invalid(format!(
                "compressed drive size {new_size} exceeds the maximum of {MAX_COMPRESSED_DRIVE_BYTES} bytes"
            )));
        }
        let _guard = self.resize_lock.lock();
        let old_size = self.size();
        if new_size != old_size {
            self.note_kept_size(new_size);
        }
        // A resize that fails changes nothing: the keeper hears the old
        // size again.
        let undo = |e: Error| {
            self.note_kept_size(old_size);
            e
        };
        if new_size >= old_size {
            self.marks
                .grow(new_size.div_ceil(GROUP_BYTES))
                .map_err(|e| undo(e.into()))?;
            self.size.store(new_size, Ordering::Release);
            return Ok(());
        }
        self.cut_end_page(new_size).map_err(undo)?;
        if let Some(l) = self.marks.ledger() {
            l.note_shrink(new_size);
        }
        self.min_size.fetch_min(new_size, Ordering::AcqRel);
        let first = new_size.div_ceil(PAGE);
        let sp = self.space();
        for (si, sh) in self.shards.iter().enumerate() {
            let mut s = sh.0.write();
            let keep = locals_before(si, first);
            for local in keep..s.table_len() {
                debug_assert!(global_page(si, local) >= first);
                s.trim(local, &sp);
            }
            s.truncate(keep);
        }
        // Beyond the end nothing is dirty: those pages no longer exist.
        self.marks.shrink(first);
        if let Some(k) = self.arena.keep() {
            k.release_shadow(first, old_size.div_ceil(PAGE));
        }
        Ok(())
    }

    /// Zeroes the tail of the page that holds `new_size` and publishes the
    /// new size, both under that page's shard lock (so no write lands in
    /// the tail in between).
    fn cut_end_page(&self, new_size: u64) -> Result<()> {
        let (p, at) = (new_size / PAGE, (new_size % PAGE) as usize);
        let (si, local) = locate(p);
        let mut shard = self.shard(si).write();
        if at != 0 && shard.entry(local) != Entry::Hole {
            let mut pg = [0u8; PAGE_BYTES];
            self.load(&shard, local, 0, &mut pg)?;
            if pg[at..].iter().all(|&b| b == 0) {
                // Nothing to zero (an adoption's usual case): no rewrite,
                // which could fail for space.
                self.size.store(new_size, Ordering::Release);
                return Ok(());
            }
            pg[at..].fill(0);
            let mut buf = [0u8; PACK_BUF_BYTES];
            let pk = page::pack(self.algo.primary(), &pg, &mut buf).map_err(corrupt)?;
            self.marks.mark_before_change(p);
            self.place_page(&mut shard, local, pk, &pg, &buf)?;
            // Its tail became zero: changed.
            self.marks.set_dirty(p);
        }
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }
}

/// A broken invariant found by [`CompressedStore::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("compressed store inconsistent in shard {shard}: {what}")]
pub struct Inconsistency {
    /// The shard (`SHARDS` for the drive as a whole).
    pub shard: usize,
    /// What does not hold.
    pub what: &'static str,
}

/// The store's handle forwards everything to the store itself through
/// `Layer` (no method can be missed, as a hand-written forwarding could).
impl crate::block::layer::Layer for CompressedStore {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
}

impl Backend for Inner {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        check_range(offset, len, self.size())?;
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            // One lock per group piece.
            let gend = ((pos / GROUP_BYTES + 1) * GROUP_BYTES).min(end);
            let (si, _) = locate(pos / PAGE);
            let shard = self.shard(si).read();
            if gend > self.size() {
                return Err(self.out_of_range(offset, len));
            }
            for_each_page(pos, gend - pos, |p, at, n, _| {
                let o = (p * PAGE + at as u64 - offset) as usize;
                self.load(&shard, locate(p).1, at, &mut buf[o..o + n])
            })?;
            pos = gend;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<()> {
        self.change(offset, data.len() as u64, Source::Data(data))
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()> {
        let src = if may_trim {
            Source::Trim
        } else {
            Source::Zeroes
        };
        self.change(offset, len, src)
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.change(offset, len, Source::Trim)
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range(offset, len, self.size())?;
        let mut out: Vec<Extent> = Vec::new();
        let end = offset + len;
        let mut pos = offset;
        while pos < end && out.len() < MAX_EXTENTS {
            let gend = ((pos / GROUP_BYTES + 1) * GROUP_BYTES).min(end);
            let (si, _) = locate(pos / PAGE);
            let shard = self.shard(si).read();
            while pos < gend {
                let run_end = ((pos / PAGE + 1) * PAGE).min(gend);
                let (hole, zero) = match shard.entry(locate(pos / PAGE).1) {
                    Entry::Hole => (true, true),
                    Entry::Same(0) => (false, true),
                    _ => (false, false),
                };
                match out.last_mut() {
                    Some(e) if e.hole == hole && e.zero == zero => e.len += run_end - pos,
                    _ => out.push(Extent {
                        len: run_end - pos,
                        hole,
                        zero,
                    }),
                }
                pos = run_end;
            }
        }
        Ok(out)
    }

    fn capabilities(&self) -> Caps {
        Caps {
            can_trim: true,
            can_zero: true,
            can_fast_zero: true,
            can_fua: true,
            can_flush: true,
            can_multi_conn: true,
            can_extents: true,
            can_cache: true,
            // Reads decompress into a buffer; nothing to send in place.
            direct_io: false,
            piece_bytes: GROUP_BYTES as u32,
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The arena unmaps its regions; give their bytes back to the daemon.
        self.mem.global.release(self.mem.drive.used_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(algo: Algorithm) -> CompressedStore {
        CompressedStore::new(1 << 20, algo, None, Arc::new(MemoryBudget::new(u64::MAX))).unwrap()
    }

    #[test]
    fn locate_spreads_groups_over_shards() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(15), (0, 15));
        assert_eq!(locate(16), (1, 0));
        assert_eq!(locate(16 * SHARDS as u64 + 3), (0, 19));
    }

    #[test]
    fn unaligned_write_read_trim() {
        for algo in [Algorithm::Lz4, Algorithm::Zstd { level: 1 }] {
            let s = store(algo);
            let data: Vec<u8> = (0..10_000u32).map(|i| (i % 7) as u8 + 1).collect();
            s.write(4000, &data, false).unwrap();
            let mut back = vec![0u8; data.len()];
            s.read(4000, &mut back).unwrap();
            assert_eq!(back, data);
            s.trim(4096, 8192).unwrap();
            s.read(4000, &mut back).unwrap();
            assert!(back[96..96 + 8192].iter().all(|&b| b == 0));
            assert_eq!(back[..96], data[..96]);
            s.check().unwrap();
            s.trim(0, 1 << 20).unwrap();
            assert_eq!(s.allocated_bytes(), 0);
            // (Freeing kept the classes dense: the compaction counters ran.)
            let st = s.stats();
            assert_eq!(
                st,
                CompressedStats {
                    metadata_bytes: st.metadata_bytes,
                    compact_runs: st.compact_runs,
                    compact_moved_objects: st.compact_moved_objects,
                    compact_freed_bytes: st.compact_freed_bytes,
                    ..Default::default()
                }
            );
        }
    }

    fn text(seed: u32, words: usize) -> Vec<u8> {
        let vocab = ["the ", "page ", "drive ", "of ", "memory ", "ramd ", "lz4 "];
        let mut v = Vec::new();
        let mut x = seed | 1;
        while v.len() < PAGE_BYTES {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            v.extend_from_slice(vocab[x as usize % words.min(vocab.len())].as_bytes());
        }
        v.truncate(PAGE_BYTES);
        v
    }

    fn noise(seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..PAGE_BYTES)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn same_filled_words_narrow_and_wide() {
        let s = store(Algorithm::Lz4);
        let words = [0u64, u64::MAX, 0xabab_abab_abab_abab, 0x0102_0304_0506_0708];
        for (i, w) in words.iter().enumerate() {
            s.write(i as u64 * PAGE, &w.to_ne_bytes().repeat(512), false)
                .unwrap();
        }
        let mut back = vec![0u8; PAGE_BYTES];
        for (i, w) in words.iter().enumerate() {
            s.read(i as u64 * PAGE, &mut back).unwrap();
            assert_eq!(back, w.to_ne_bytes().repeat(512), "word {w:#x}");
        }
        let st = s.stats();
        assert_eq!((st.same_pages, st.slab_bytes), (4, 0));
        s.check().unwrap();
        // A wide word overwritten, then trimmed: nothing of it stays.
        s.write(3 * PAGE, &text(1, 7), false).unwrap();
        s.trim(0, 4 * PAGE).unwrap();
        assert_eq!(s.stats().orig_data_bytes, 0);
        s.check().unwrap();
    }

    #[test]
    fn a_full_budget_reuses_the_page_s_own_memory() {
        let global = Arc::new(MemoryBudget::new(u64::MAX));
        let s = CompressedStore::new(1 << 20, Algorithm::Lz4, Some(8 * PAGE), global).unwrap();
        // Fill the limit with raw pages, then one compressible page.
        let mut p = 0;
        while s.write(p * PAGE, &noise(p), false).is_ok() {
            p += 1;
        }
        assert_eq!(p, 8);
        assert!(matches!(
            s.write(20 * PAGE, &text(3, 7), false),
            Err(Error::NoSpace(_))
        ));
        // A raw page overwritten with compressible data: its class has no
        // page and none can be had, so the page's own memory holds it raw.
        let t = text(5, 7);
        s.write(2 * PAGE, &t, false).unwrap();
        let mut back = vec![0u8; PAGE_BYTES];
        s.read(2 * PAGE, &mut back).unwrap();
        assert_eq!(back, t);
        assert_eq!(s.stats().huge_pages, 8);
        s.check().unwrap();
        // Trim a raw page: its memory takes a compressed page, which then
        // shrinks into a smaller object in place when no page is free.
        s.trim(0, PAGE).unwrap();
        s.write(30 * PAGE, &text(9, 7), false).unwrap();
        let st = s.stats();
        assert_eq!((st.huge_pages, st.compressed_pages), (7, 1));
        let smaller = text(11, 2);
        s.write(30 * PAGE, &smaller, false).unwrap();
        s.read(30 * PAGE, &mut back).unwrap();
        assert_eq!(back, smaller);
        s.check().unwrap();
        assert_eq!(s.allocated_bytes(), 8 * PAGE);
    }

    #[test]
    fn extents_report_holes_and_zero_runs() {
        let s = store(Algorithm::Lz4);
        s.write(8192, &[1; 4096], false).unwrap();
        s.write(12288, &[0; 4096], false).unwrap();
        let e = s.extents(0, 5 * 4096).unwrap();
        let kinds: Vec<_> = e.iter().map(|e| (e.len, e.hole, e.zero)).collect();
        assert_eq!(
            kinds,
            vec![
                (8192, true, true),
                (4096, false, false),
                (4096, false, true),
                (4096, true, true)
            ]
        );
    }

    #[test]
    fn shrink_zeroes_the_tail_and_frees() {
        let s = store(Algorithm::Lz4);
        let data: Vec<u8> = (0..9000u32).map(|i| (i * 31 % 251) as u8).collect();
        s.write(1000, &data, false).unwrap();
        s.resize(5000).unwrap();
        s.resize(1 << 20).unwrap();
        let mut back = vec![1u8; 9000];
        s.read(1000, &mut back).unwrap();
        assert_eq!(back[..4000], data[..4000]);
        assert!(back[4000..].iter().all(|&b| b == 0));
        s.check().unwrap();
    }
}
