//! The RAM store: a sparse, page-granular, lock-striped block of memory.
//!
//! # Layout
//!
//! ```text
//!  drive bytes  0 ──────────────── 64 MiB ─────────────── 128 MiB ──── size
//!               │    segment 0       │     segment 1        │  ...
//!  segment      ├ Region: 64 MiB of reserved address space (mmap NORESERVE)
//!               ├ allocated: 1 bit / 4 KiB page  (16384 bits = 2 KiB)
//!               ├ dirty:     1 bit / 4 KiB page  (2 KiB)
//!               └ locks:     1 RwLock / 64 KiB chunk (1024 x 8 B = 8 KiB)
//! ```
//!
//! Metadata is 12 KiB per 64 MiB segment: 0.018% of the drive size.
//!
//! With `StoreOptions::shared_memory` the segments map ranges of one
//! memfd per drive instead (`memfd.rs`: its seals, what shmem does
//! differently), so a keeper holding the descriptor keeps the bytes when
//! this process dies, and [`RamStore::adopt`] serves them again, its
//! allocation bitmaps rebuilt from the file's data runs. Off by default
//! (first fills cost twice as much on shmem, bench/RESULTS.md).
//!
//! # Invariants
//!
//! - A page's `allocated` bit is set iff the page may hold non-zero bytes and
//!   is charged to the drive and daemon budgets. Pages with a clear bit are
//!   never read from memory (reads fill zeroes, so no page fault maps them),
//!   and every page whose bit is cleared is handed back to the OS first.
//! - Bytes are only read or written under the lock of the chunk that holds
//!   them: shared for reads, exclusive for writes, zeroes, trims and shrinks.
//!   Locks are per 64 KiB chunk, so unrelated requests never contend and there
//!   is no drive-wide lock on the data path.
//! - Every operation re-checks the drive size *under* the chunk lock, so a
//!   request validated before a concurrent shrink fails with `OutOfRange`
//!   instead of touching memory the shrink released.
//! - The segment table is swapped atomically (`ArcSwap`) on resize. A grow
//!   publishes segments before the new size; a shrink publishes the new size,
//!   frees the memory beyond it chunk by chunk, then drops the segments.
//!
//! # Copies
//!
//! Written bytes go into the drive with streaming (non-temporal) stores
//! (`ntcopy.rs`): a drive is usually far bigger than the CPU caches, so an
//! ordinary copy would first fetch every destination line from memory.
//! Measured on 4 KiB random I/O at QD64x2: 8% less CPU per request, as fast
//! or faster on working sets from 4 MiB (QD1) to 1 GiB.
//!
//! # Huge pages
//!
//! Pages are committed 4 KiB at a time; a 2 MiB range whose pages are all
//! allocated is collapsed into one huge page in the background once no
//! drive is committing fresh pages (`huge.rs`), which changes no byte, bit
//! or budget.
//!
//! # The dirty set
//!
//! A write (or zero or trim) sets the dirty bits of the pages it changed
//! *after* changing them and before it returns, still under the chunk lock.
//! [`RamStore::take_dirty`] swaps each bitmap word with zero atomically. So:
//! every change that completed before `take_dirty` began is in the returned
//! set; a change racing with it is either in the returned set or still marked
//! for the next one, never lost. Reading the pages of the returned set (under
//! their chunk locks) yields their contents at least as new as the take.
//!
//! A sync needs more than that: the contents *at one instant*. For that,
//! [`StoreState::snapshot`] (see `snapshot.rs`) takes the dirty set chunk by
//! chunk with copy-on-write: a writer that is about to change a chunk whose
//! pre-snapshot pages are not saved yet copies them aside first. When no
//! snapshot runs this costs one atomic load per chunk a change touches.
//! A shrink marks the page holding the new end dirty (its tail became zero)
//! and is remembered until the next snapshot (`min_size`), so a shrink and
//! grow between two syncs is not lost.

pub mod bitmap;
pub mod budget;
pub mod compressed;
pub mod cut;
mod huge;
mod ledger;
pub mod memfd;
mod ntcopy;
mod prefault;
pub mod region;
pub mod snapshot;
pub mod sync_store;

use std::io::IoSlice;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};

use crate::block::backend::{check_range, Backend, Caps, Error, Extent, Result};
use bitmap::AtomicBitmap;
pub use budget::MemoryBudget;
use huge::HugeState;
pub use huge::IDLE_MS as HUGE_IDLE_MS;
use ledger::{Ledger, LedgerPage};
use prefault::Prefaulter;
pub use prefault::{AHEAD_BYTES as PREFAULT_AHEAD_BYTES, MARGIN_BYTES as PREFAULT_MARGIN_BYTES};
use region::Region;
pub use snapshot::{CapturedChunk, Snapshot, PAGES_PER_CHUNK};
use snapshot::{CowOutcome, SnapState};
pub use sync_store::{SyncCut, SyncStore};

/// Bytes per page: the unit of allocation, trim and the bitmaps.
pub const PAGE_BYTES: u64 = 4096;
/// Bytes per lock stripe.
pub const CHUNK_BYTES: u64 = 64 * 1024;
/// Bytes per segment (one mapping).
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// The largest drive: 256 TiB (bounded by address space, not memory).
pub const MAX_DRIVE_BYTES: u64 = 256 << 40;

const PAGES_PER_SEGMENT: usize = (SEGMENT_BYTES / PAGE_BYTES) as usize;
const CHUNKS_PER_SEGMENT: usize = (SEGMENT_BYTES / CHUNK_BYTES) as usize;
/// Runs of at least this many fresh pages are committed with one
/// `MADV_POPULATE_WRITE` instead of one page fault each.
const POPULATE_MIN_PAGES: usize = 4;
/// Cap on extents per `extents()` call (the reply covers a prefix).
const MAX_EXTENTS: usize = 16 * 1024;
/// Most bytes one in-place `write_with` / `read_with` call covers: the
/// chunk locks it holds at once (16).
pub const DIRECT_MAX_BYTES: usize = 1 << 20;
/// What holes read as in `read_with`.
static ZEROES: [u8; CHUNK_BYTES as usize] = [0; CHUNK_BYTES as usize];

/// One 64 MiB piece of the drive.
struct Segment {
    /// The memory; committed page by page on first write.
    region: Region,
    /// Pages that hold data and are charged to the budgets.
    allocated: AtomicBitmap,
    /// Pages changed since the last `take_dirty`.
    dirty: AtomicBitmap,
    /// Shared stores: pages a cut took from `dirty` that are not saved
    /// yet, in the ledger with `dirty` (`ledger.rs`).
    pending: Option<AtomicBitmap>,
    /// Allocated pages the prefaulter committed that nobody has written yet:
    /// they read as zero and are reported as holes.
    zeroed: AtomicBitmap,
    /// One lock per 64 KiB chunk: shared for reads, exclusive for changes.
    /// A parking_lot lock, not a std one: 8 bytes and no syscall uncontended.
    locks: Box<[RwLock<()>]>,
    /// Per chunk, the last snapshot epoch that captured it (see
    /// `snapshot.rs`): changed only under the chunk's lock.
    epochs: Box<[AtomicU32]>,
    /// One bit per 2 MiB range collapsed into a huge page (`huge.rs`);
    /// cleared before any page in the range is released.
    huge: AtomicU32,
}

const _: () = assert!(SEGMENT_BYTES / region::HUGE_BYTES as u64 <= 32);

impl Segment {
    /// A page reads as a hole when nothing backs it or the prefaulter
    /// committed it and nobody has written it since.
    fn is_hole(&self, p: usize) -> bool {
        !self.allocated.get(p) || self.zeroed.get(p)
    }

    /// A cut takes the dirty bits of `mask` from page `start` (a multiple
    /// of 16): in a shared store they are pending first (`ledger.rs`).
    #[inline]
    fn take_dirty_bits16(&self, start: usize, mask: u16) {
        if let Some(p) = &self.pending {
            p.set_bits16(start, mask);
        }
        self.dirty.clear_bits16(start, mask);
    }

    /// Before `[so, so+n)` changes (its chunks locked exclusively): in a
    /// shared store its pages are dirty already, so a kill in the middle
    /// of the change leaves them dirty (`ledger.rs`).
    #[inline]
    fn mark_before_change(&self, so: usize, n: usize) {
        if self.pending.is_some() {
            let page = PAGE_BYTES as usize;
            self.dirty.set_range(so / page, (so + n).div_ceil(page));
        }
    }

    /// A saved cut: nothing is pending any more (no cut runs, so nobody
    /// sets pending bits meanwhile).
    fn clear_pending(&self) {
        if let Some(p) = &self.pending {
            p.clear_all();
        }
    }

    /// First page in `[p, last)` whose hole state differs from `hole`.
    fn find_hole_change(&self, p: usize, last: usize, hole: bool) -> usize {
        if !hole {
            // Data ends at the first unallocated or zeroed page.
            let a = self.allocated.find(p, last, false);
            return a.min(self.zeroed.find(p, last, true));
        }
        // A hole ends at the first allocated page that is not zeroed.
        let mut q = p;
        loop {
            let a = self.allocated.find(q, last, true);
            if a == last || !self.zeroed.get(a) {
                return a;
            }
            q = self.zeroed.find(a, last, false);
        }
    }

    /// An empty segment: anonymous memory, or (`memfd`) segment `index`
    /// of the drive's memfd, which grows to hold it, its bits in the
    /// ledger (cleared: a page there from before a shrink is stale).
    fn new(huge: bool, shared: Option<(BorrowedFd<'_>, &Ledger)>, index: usize) -> Result<Segment> {
        let len = SEGMENT_BYTES as usize;
        let Some((fd, ledger)) = shared else {
            return Ok(Segment::with_region(Region::new(len, huge)?, None));
        };
        memfd::grow_to(fd, (index + 1) * len).map_err(std::io::Error::from)?;
        let region = Region::shared(fd, index * len, len, huge)?;
        let seg = Segment::with_region(region, Some(ledger.segment(index)?));
        seg.dirty.clear_all();
        if let Some(p) = &seg.pending {
            p.clear_all();
        }
        Ok(seg)
    }

    /// A segment over `region`, its dirty and pending bits in `ledger`
    /// (as they are there) or its own.
    fn with_region(region: Region, ledger: Option<Arc<LedgerPage>>) -> Segment {
        const HALF: usize = ledger::PAGE_WORDS / 2;
        let (dirty, pending) = match ledger {
            None => (AtomicBitmap::new(PAGES_PER_SEGMENT), None),
            Some(page) => (
                AtomicBitmap::shared(page.clone(), 0, PAGES_PER_SEGMENT),
                Some(AtomicBitmap::shared(page, HALF, PAGES_PER_SEGMENT)),
            ),
        };
        Segment {
            region,
            allocated: AtomicBitmap::new(PAGES_PER_SEGMENT),
            dirty,
            pending,
            zeroed: AtomicBitmap::new(PAGES_PER_SEGMENT),
            locks: (0..CHUNKS_PER_SEGMENT).map(|_| RwLock::new(())).collect(),
            epochs: (0..CHUNKS_PER_SEGMENT).map(|_| AtomicU32::new(0)).collect(),
            huge: AtomicU32::new(0),
        }
    }
}

/// The pages changed since the previous take: one bit per page, pages
/// numbered from the start of the drive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirtyPages {
    words: Vec<u64>,
}

impl DirtyPages {
    /// Page indices in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros() as u64;
                w &= w - 1;
                Some(wi as u64 * 64 + b)
            })
        })
    }

    /// Number of dirty pages.
    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| w.count_ones() as u64).sum()
    }

    /// True when no page is dirty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }
}

/// A RAM drive's storage: the shared state plus the drive's prefaulter.
/// Dereferences to [`StoreState`] for the drive's own methods.
pub struct RamStore {
    state: Arc<StoreState>,
    /// Commits pages ahead of sequential fills (None if it could not start).
    prefaulter: Option<Prefaulter>,
}

impl std::ops::Deref for RamStore {
    type Target = StoreState;
    fn deref(&self) -> &StoreState {
        &self.state
    }
}

/// The state of a RAM drive, shared with its prefaulter thread.
pub struct StoreState {
    /// Current size in bytes. Loaded (Acquire) before the segment table.
    size: AtomicU64,
    /// The segments covering `size`, swapped whole on resize.
    segments: ArcSwap<Vec<Arc<Segment>>>,
    /// This drive's memory: `used` = allocated pages, `limit` = mem-limit.
    drive_mem: MemoryBudget,
    /// The daemon-wide budget shared by all drives.
    global_mem: Arc<MemoryBudget>,
    /// Serialises resizes (never taken on the data path).
    resize_lock: Mutex<()>,
    /// End of the last write that committed new pages: a write starting
    /// here continues a sequential fill (a prefaulter hint).
    fill_end: AtomicU64,
    /// Point-in-time snapshots for syncs (copy-on-write, see snapshot.rs).
    snap: SnapState,
    /// Smallest size since the last snapshot began: a sync must record a
    /// shrink even when the drive grew back before it (the bytes beyond
    /// the smaller size became zero). Changed under `resize_lock`.
    min_size: AtomicU64,
    /// Collapsing full 2 MiB ranges into huge pages (see `huge.rs`).
    huge: HugeState,
    /// Every segment's mapping is locked in RAM (`StoreOptions::lock_memory`).
    lock: bool,
    /// The memfd the segments map and the ledger their dirty bits live in
    /// (`StoreOptions::shared_memory`; None: anonymous memory). Segment
    /// `i` is the memfd's range at `i * SEGMENT_BYTES`.
    shared: Option<Shared>,
    /// Who else holds the memfd (set once; see [`SegmentKeeper`]), told
    /// under `resize_lock` whenever the size changes.
    keeper: OnceLock<Arc<dyn SegmentKeeper>>,
}

/// A shared store's memory: its data and its dirty ledger.
struct Shared {
    memfd: OwnedFd,
    ledger: Ledger,
}

/// What a keeper holds of a shared store, for [`RamStore::adopt`].
pub struct KeptMemory {
    /// The data (`memfd.rs`).
    pub memfd: OwnedFd,
    /// The dirty ledger (`ledger.rs`); None from a keeper that had none
    /// (the dirty set starts empty then).
    pub ledger: Option<OwnedFd>,
}

/// Someone who keeps a drive's memory alive beyond this process (a
/// supervisor). The store knows nothing of it but this call.
pub trait SegmentKeeper: Send + Sync {
    /// The drive is `size_bytes` long, its memory in `fds`: a raw store's
    /// memfd and dirty ledger; a compressed store's arena and meta memfds
    /// and, if it has one, its ledger (`compressed::keep`). Called when the
    /// keeper is set, before a grow publishes the new size (so no write
    /// beyond the old one is acknowledged before the keeper knows) and
    /// before a shrink changes anything. Failures are the keeper's to
    /// report.
    fn keep(&self, size_bytes: u64, fds: &[BorrowedFd<'_>]);
}

/// How a chunk is locked for an operation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Shared,
    /// A change: saves the chunk's pre-cut pages first when a snapshot runs.
    Exclusive,
    /// Exclusive, but changes no bytes (the prefaulter commits zero pages
    /// over holes), so a running snapshot has nothing to save.
    ExclusiveNoCow,
}

/// Where bytes to store come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    Data(&'a [u8]),
    Zeroes,
}

/// How a drive is set up beyond its size.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// Most memory the drive may hold (None: only its size bounds it).
    pub mem_limit_bytes: Option<u64>,
    /// Commit pages ahead of sequential fills on a background thread (see
    /// `prefault.rs`). Off, a page is committed only when written.
    pub prefault: bool,
    /// Collapse fully written 2 MiB ranges into huge pages on that thread
    /// (see `huge.rs`); ignored where the system cannot.
    pub huge_pages: bool,
    /// Lock the drive's pages in RAM as they are written (`--lock-memory`:
    /// never swapped; `region.rs`). The kernel charges `RLIMIT_MEMLOCK`
    /// the drive's whole size (in pages) at creation and on growth.
    pub lock_memory: bool,
    /// The drive's memory in a sealed memfd mapped shared (`memfd.rs`),
    /// so it can outlive the process; off: private anonymous memory. Off
    /// by default: first fills of fresh pages are about half as fast on
    /// shmem (bench/RESULTS.md), and nothing keeps the memfd yet (the
    /// supervisor of issue 31 will turn it on for the drives it keeps).
    pub shared_memory: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            mem_limit_bytes: None,
            prefault: true,
            huge_pages: true,
            lock_memory: false,
            shared_memory: false,
        }
    }
}

impl RamStore {
    /// Stores bytes that `fill` produces at `offset` in place, straight
    /// into the drive's memory (see `StoreState::write_with`): a prefix of
    /// `len` bytes, whose length is returned (at least 1 when `len > 0`;
    /// the caller loops). `fill` must fill the whole slice it is given
    /// without waiting on anyone (chunk locks are held); its error comes
    /// back as `Error::Io`. Restore reads snapshot pages this way.
    pub fn write_with(
        &self,
        offset: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<usize> {
        let (n, fresh) = self.state.write_with(offset, len, fill)?;
        self.note_fill(offset, n as u64, fresh);
        Ok(n)
    }

    /// A drive of `size_bytes`, charging its pages to `global_mem` and to its
    /// own `mem_limit_bytes` (None: only the drive size bounds it), with the
    /// prefaulter on.
    pub fn new(
        size_bytes: u64,
        mem_limit_bytes: Option<u64>,
        global_mem: Arc<MemoryBudget>,
    ) -> Result<RamStore> {
        let opts = StoreOptions {
            mem_limit_bytes,
            ..StoreOptions::default()
        };
        RamStore::with_options(size_bytes, opts, global_mem)
    }

    /// A drive of `size_bytes` set up by `opts`.
    pub fn with_options(
        size_bytes: u64,
        opts: StoreOptions,
        global_mem: Arc<MemoryBudget>,
    ) -> Result<RamStore> {
        let mem_limit_bytes = opts.mem_limit_bytes;
        if size_bytes > MAX_DRIVE_BYTES {
            return Err(Error::Invalid(format!(
                "drive size {size_bytes} exceeds the maximum of {MAX_DRIVE_BYTES} bytes"
            )));
        }
        if region::page_size() as u64 != PAGE_BYTES {
            return Err(Error::NotSupported("an OS page size other than 4 KiB"));
        }
        let state = Arc::new(StoreState {
            size: AtomicU64::new(0),
            segments: ArcSwap::from_pointee(Vec::new()),
            drive_mem: MemoryBudget::new(mem_limit_bytes.unwrap_or(u64::MAX)),
            global_mem,
            resize_lock: Mutex::new(()),
            fill_end: AtomicU64::new(u64::MAX),
            snap: SnapState::default(),
            min_size: AtomicU64::new(0),
            huge: HugeState::new(
                opts.huge_pages && (!opts.shared_memory || memfd::collapse_possible()),
            ),
            lock: opts.lock_memory,
            shared: match opts.shared_memory {
                true => Some(Shared {
                    memfd: memfd::create().map_err(std::io::Error::from)?,
                    ledger: Ledger::create(size_bytes)?,
                }),
                false => None,
            },
            keeper: OnceLock::new(),
        });
        state.resize(size_bytes)?;
        state.min_size.store(size_bytes, Ordering::Release);
        Ok(RamStore::start(state, opts))
    }

    /// A drive of `size_bytes` over the memory another process kept (see
    /// `memfd.rs`): the same memory, so the same bytes. The allocation
    /// bitmaps are rebuilt from the file's data runs and the pages charged
    /// to both budgets, past their limits if need be (the memory is there
    /// already). Data beyond `size_bytes` (none, if the file is ours) is
    /// freed. The dirty set is the ledger's dirty and pending pages, and
    /// the next cut records the smallest size the ledger saw since its
    /// last saved one (`ledger.rs`): what a persistent drive's state
    /// directory lacks. Refused when the descriptor is not a sealed drive
    /// memfd long enough for the size, or the ledger not a ledger.
    pub fn adopt(
        size_bytes: u64,
        kept: KeptMemory,
        opts: StoreOptions,
        global_mem: Arc<MemoryBudget>,
    ) -> Result<RamStore> {
        if size_bytes > MAX_DRIVE_BYTES || size_bytes == 0 {
            return Err(Error::Invalid(format!(
                "cannot adopt a drive of {size_bytes} bytes"
            )));
        }
        let nsegs = size_bytes.div_ceil(SEGMENT_BYTES) as usize;
        let seg_len = SEGMENT_BYTES as usize;
        let fd = kept.memfd;
        let borrowed = std::os::fd::AsFd::as_fd(&fd);
        memfd::check(borrowed, nsegs * seg_len).map_err(std::io::Error::from)?;
        let (ledger, fresh_ledger) = match kept.ledger {
            Some(l) => (Ledger::adopt(l)?, false),
            None => (Ledger::create(size_bytes)?, true),
        };
        let huge = HugeState::new(opts.huge_pages && memfd::collapse_possible());
        let segs = (0..nsegs)
            .map(|i| {
                let region = Region::shared(borrowed, i * seg_len, seg_len, huge.enabled())?;
                let seg = Segment::with_region(region, Some(ledger.segment(i)?));
                if fresh_ledger {
                    seg.dirty.clear_all();
                }
                if let Some(p) = &seg.pending {
                    if fresh_ledger {
                        p.clear_all();
                    }
                    seg.dirty.or_from(p);
                }
                Ok(Arc::new(seg))
            })
            .collect::<Result<Vec<_>>>()?;
        let bytes = mark_data_runs(&segs, borrowed, size_bytes)?;
        zero_end_tail(&segs, size_bytes);
        let min_size = ledger.unsaved_min().min(size_bytes);
        let state = Arc::new(StoreState {
            size: AtomicU64::new(size_bytes),
            segments: ArcSwap::from_pointee(segs),
            drive_mem: MemoryBudget::new(opts.mem_limit_bytes.unwrap_or(u64::MAX)),
            global_mem,
            resize_lock: Mutex::new(()),
            fill_end: AtomicU64::new(u64::MAX),
            snap: SnapState::default(),
            min_size: AtomicU64::new(min_size),
            huge,
            lock: opts.lock_memory,
            shared: Some(Shared { memfd: fd, ledger }),
            keeper: OnceLock::new(),
        });
        state.drive_mem.try_reserve_over(bytes, u64::MAX);
        state.global_mem.try_reserve_over(bytes, u64::MAX);
        if state.lock {
            lock_segments(&state.segments.load(), size_bytes)?;
        }
        Ok(RamStore::start(state, opts))
    }

    /// The inode number of the drive's memfd (None: anonymous memory):
    /// the same in every process that maps this memory, another for
    /// every new memfd while this one exists.
    pub fn memfd_inode(&self) -> Option<u64> {
        let fd = &self.state.shared.as_ref()?.memfd;
        rustix::fs::fstat(fd).ok().map(|st| st.st_ino)
    }

    /// Hands the drive's memfd to `keeper` now and at every resize (see
    /// [`SegmentKeeper`]); a second keeper is ignored. Does nothing for a
    /// store in anonymous memory.
    pub fn set_keeper(&self, keeper: Arc<dyn SegmentKeeper>) {
        if self.state.shared.is_none() {
            return;
        }
        let _guard = self.state.resize_lock.lock();
        if self.state.keeper.set(keeper).is_ok() {
            self.state.tell_keeper(self.size());
        }
    }

    /// The store around `state`, with its background thread.
    fn start(state: Arc<StoreState>, opts: StoreOptions) -> RamStore {
        let prefaulter = if opts.prefault || state.huge.enabled() {
            Prefaulter::spawn(Arc::downgrade(&state), opts.prefault)
                .inspect_err(|e| {
                    tracing::warn!(
                        "no background thread for this drive (first writes will be slower, no huge pages): {e}"
                    )
                })
                .ok()
        } else {
            None
        };
        RamStore { state, prefaulter }
    }

    /// After a successful write of `[offset, offset+len)`; `fresh` when it
    /// filled empty pages (new, or prefaulted). When it continues the
    /// previous such write, the drive is being filled sequentially, so ask
    /// for pages ahead.
    #[inline]
    fn note_fill(&self, offset: u64, len: u64, fresh: bool) {
        if !fresh {
            return;
        }
        let end = offset + len;
        huge::note_commit();
        let due = self.state.huge.note_fill();
        let Some(p) = &self.prefaulter else { return };
        if due {
            p.wake();
        }
        let prev = self.state.fill_end.swap(end, Ordering::Relaxed);
        if prev == offset {
            p.hint(end, self.state.size());
        }
    }
}

impl StoreState {
    /// True when the drive's memory is locked in RAM.
    pub fn is_locked(&self) -> bool {
        self.lock
    }

    /// Bytes the kernel counts against `RLIMIT_MEMLOCK` for this drive:
    /// its size in whole pages when locked, else 0.
    pub fn locked_map_bytes(&self) -> u64 {
        self.segments
            .load()
            .iter()
            .map(|s| s.region.locked_len() as u64)
            .sum()
    }

    /// Bytes of memory this drive holds (allocated pages).
    pub fn allocated_bytes(&self) -> u64 {
        self.drive_mem.used_bytes()
    }

    /// The drive's memory limit (`u64::MAX` when unlimited).
    pub fn mem_limit_bytes(&self) -> u64 {
        self.drive_mem.limit_bytes()
    }

    /// Changes the drive's memory limit (None: unlimited).
    pub fn set_mem_limit_bytes(&self, limit: Option<u64>) {
        self.drive_mem.set_limit_bytes(limit.unwrap_or(u64::MAX));
    }

    /// Bytes of metadata (bitmaps, locks, tables) this drive keeps.
    pub fn metadata_bytes(&self) -> u64 {
        let segs = self.segments.load().len() as u64;
        let per_seg = std::mem::size_of::<Segment>() as u64
            + 3 * (PAGES_PER_SEGMENT as u64 / 8)
            + (CHUNKS_PER_SEGMENT * std::mem::size_of::<RwLock<()>>()) as u64
            + snapshot::EPOCH_BYTES_PER_SEGMENT;
        segs * (per_seg + std::mem::size_of::<Arc<Segment>>() as u64)
    }

    /// Takes the set of pages changed since the last call (see module docs
    /// for the guarantee with respect to concurrent writers).
    /// A shared store's ledger forgets its pending pages too: whoever
    /// takes the set saves it (or knows it saved).
    pub fn take_dirty(&self) -> DirtyPages {
        self.min_size.store(self.size(), Ordering::Release);
        let segs = self.segments.load();
        let mut words = Vec::with_capacity(segs.len() * PAGES_PER_SEGMENT / 64);
        for seg in segs.iter() {
            words.extend(seg.dirty.take());
            if let Some(p) = &seg.pending {
                p.clear_all();
            }
        }
        if let Some(s) = &self.shared {
            s.ledger.note_saved(self.size());
        }
        DirtyPages { words }
    }

    /// Number of pages currently marked dirty.
    pub fn dirty_pages(&self) -> u64 {
        self.segments
            .load()
            .iter()
            .map(|s| s.dirty.count() as u64)
            .sum()
    }

    /// Grows or shrinks the drive. Shrinking releases the memory beyond the
    /// new end; growing adds zero-filled space.
    pub fn resize(&self, new_size: u64) -> Result<()> {
        if new_size > MAX_DRIVE_BYTES {
            return Err(Error::Invalid(format!(
                "drive size {new_size} exceeds the maximum of {MAX_DRIVE_BYTES} bytes"
            )));
        }
        let _guard = self.resize_lock.lock();
        let old_size = self.size.load(Ordering::Acquire);
        let want_segs = new_size.div_ceil(SEGMENT_BYTES) as usize;
        if new_size >= old_size {
            let old = self.segments.load_full();
            let mut segs: Vec<Arc<Segment>> = old.as_ref().clone();
            while segs.len() < want_segs {
                let shared = self
                    .shared
                    .as_ref()
                    .map(|s| (std::os::fd::AsFd::as_fd(&s.memfd), &s.ledger));
                segs.push(Arc::new(Segment::new(
                    self.huge.enabled(),
                    shared,
                    segs.len(),
                )?));
            }
            if self.lock {
                if let Err(e) = lock_segments(&segs, new_size) {
                    // Back to what the old size locked; the new segments go.
                    let _ = lock_segments(&old, old_size);
                    return Err(e);
                }
            }
            // The keeper learns every larger size before it is published
            // (a grow inside the last segment too): an adopted drive must
            // not come back shorter than what was acknowledged.
            if new_size > old_size {
                self.tell_keeper(new_size);
            }
            if want_segs > old.len() {
                self.segments.store(Arc::new(segs));
            }
            self.size.store(new_size, Ordering::Release);
        } else {
            // The keeper first, then the ledger: a kill from here on comes
            // back at the smaller size (the adoption frees what lies beyond
            // and zeroes the end page's tail), never at the old size with
            // a half-released tail that nothing marks as changed.
            self.tell_keeper(new_size);
            if let Some(s) = &self.shared {
                s.ledger.note_shrink(new_size);
            }
            self.size.store(new_size, Ordering::Release);
            self.min_size.fetch_min(new_size, Ordering::AcqRel);
            self.release_tail(new_size, old_size);
            let segs = self.segments.load_full();
            if segs.len() > want_segs {
                self.segments.store(Arc::new(segs[..want_segs].to_vec()));
            }
            if self.lock {
                // Unlocking cannot fail for want of a limit.
                let _ = lock_segments(&self.segments.load(), new_size);
            }
        }
        Ok(())
    }

    /// Tells the keeper (if any) that the drive is `size` bytes long. The
    /// caller holds the resize lock.
    fn tell_keeper(&self, size: u64) {
        if let (Some(keeper), Some(s)) = (self.keeper.get(), &self.shared) {
            keeper.keep(size, &[std::os::fd::AsFd::as_fd(&s.memfd), s.ledger.fd()]);
        }
    }

    /// The persistence generations a shared store's ledger noted (last
    /// committed, being committed: `SyncStore::note_committing`); None in
    /// anonymous memory.
    pub fn kept_generations(&self) -> Option<(u64, u64)> {
        self.shared.as_ref().map(|s| s.ledger.generations())
    }

    /// Notes in a shared store's ledger that `gen` is being committed.
    pub fn note_committing(&self, gen: u64) {
        if let Some(s) = &self.shared {
            s.ledger.set_committing(gen);
        }
    }

    /// The state directory id a shared store's ledger noted.
    pub fn kept_directory(&self) -> Option<[u8; 16]> {
        self.shared.as_ref().map(|s| s.ledger.directory())
    }

    /// Notes in a shared store's ledger which state directory it saves to.
    pub fn note_directory(&self, id: [u8; 16]) {
        if let Some(s) = &self.shared {
            s.ledger.set_directory(id);
        }
    }

    /// Notes in a shared store's ledger that `gen` is committed.
    pub fn note_committed(&self, gen: u64) {
        if let Some(s) = &self.shared {
            s.ledger.set_committed(gen);
        }
    }

    /// True when the drive's memory is a memfd (`memfd.rs`).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Frees everything in `[new_size, old_size)` after a shrink, zeroing
    /// the tail of the page that holds the new end.
    fn release_tail(&self, new_size: u64, old_size: u64) {
        let segs = self.segments.load();
        let mut chunk_start = new_size / CHUNK_BYTES * CHUNK_BYTES;
        while chunk_start < old_size {
            let seg = &segs[(chunk_start / SEGMENT_BYTES) as usize];
            let seg_off = (chunk_start % SEGMENT_BYTES) as usize;
            let _lock = seg.locks[seg_off / CHUNK_BYTES as usize].write();
            let from = new_size.max(chunk_start);
            let to = (chunk_start + CHUNK_BYTES).min(old_size.next_multiple_of(PAGE_BYTES));
            if from < to {
                let seg_base = chunk_start / SEGMENT_BYTES * SEGMENT_BYTES;
                let (so, eo) = (from - seg_base, to - seg_base);
                let freed = self.discard_in_chunk(seg, so as usize, (eo - so) as usize, true);
                // Beyond the end nothing is dirty: those pages no longer exist.
                for p in so.div_ceil(PAGE_BYTES)..eo.div_ceil(PAGE_BYTES) {
                    seg.dirty.clear(p as usize);
                }
                // The page holding the new end had its tail zeroed: changed.
                if so % PAGE_BYTES != 0 {
                    seg.dirty.set((so / PAGE_BYTES) as usize);
                }
                self.release_mem(freed);
            }
            chunk_start += CHUNK_BYTES;
        }
    }

    /// Charges `bytes` of new pages to the drive and the daemon.
    fn reserve_mem(&self, bytes: u64) -> Result<()> {
        if !self.drive_mem.try_reserve(bytes) {
            return Err(Error::NoSpace(format!(
                "drive memory limit of {} bytes reached ({} in use)",
                self.drive_mem.limit_bytes(),
                self.drive_mem.used_bytes()
            )));
        }
        if let Err(refusal) = self.global_mem.reserve(bytes) {
            self.drive_mem.release(bytes);
            if refusal == budget::Refusal::HostCap {
                return Err(Error::HostShort);
            }
            return Err(Error::NoSpace(format!(
                "daemon memory budget of {} bytes reached ({} in use)",
                self.global_mem.limit_bytes(),
                self.global_mem.used_bytes()
            )));
        }
        Ok(())
    }

    fn release_mem(&self, bytes: u64) {
        if bytes > 0 {
            self.drive_mem.release(bytes);
            self.global_mem.release(bytes);
        }
    }

    /// Runs `f(segment, offset in segment, len, offset in request)` over each
    /// chunk-sized piece of `[offset, offset+len)`, holding that chunk's lock
    /// and re-checking the size under it.
    #[inline]
    fn for_each_chunk(
        &self,
        offset: u64,
        len: u64,
        access: Access,
        mut f: impl FnMut(&Segment, usize, usize, usize) -> Result<()>,
    ) -> Result<()> {
        check_range(offset, len, self.size.load(Ordering::Acquire))?;
        let segs = self.segments.load();
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let n = (CHUNK_BYTES - pos % CHUNK_BYTES).min(end - pos);
            let Some(seg) = segs.get((pos / SEGMENT_BYTES) as usize) else {
                return Err(self.out_of_range(offset, len));
            };
            let so = (pos % SEGMENT_BYTES) as usize;
            let ci = so / CHUNK_BYTES as usize;
            let lock = &seg.locks[ci];
            let (_r, _w);
            if access == Access::Shared {
                _r = lock.read();
            } else {
                let mut w = lock.write();
                if access == Access::Exclusive {
                    // A running snapshot: save this chunk's pre-cut pages
                    // before changing it (one atomic load when none runs).
                    loop {
                        let e = self.snap.active();
                        if e == 0 {
                            break;
                        }
                        match self.cow_chunk(seg, ci, pos / CHUNK_BYTES, e) {
                            CowOutcome::Proceed => break,
                            CowOutcome::Wait => {
                                drop(w);
                                self.wait_captured(seg, ci, pos / CHUNK_BYTES, e);
                                w = lock.write();
                            }
                        }
                    }
                }
                _w = w;
            }
            if pos + n > self.size.load(Ordering::Acquire) {
                return Err(self.out_of_range(offset, len));
            }
            if access == Access::Exclusive {
                seg.mark_before_change(so, n as usize);
            }
            f(seg, so, n as usize, (pos - offset) as usize)?;
            pos += n;
        }
        Ok(())
    }

    /// Stores `src` over `[offset, offset+len)`; returns the bytes of pages
    /// that were empty before (see `store_in_chunk`).
    fn store_range(&self, offset: u64, len: u64, src: Source<'_>) -> Result<u64> {
        let mut fresh = 0usize;
        self.for_each_chunk(offset, len, Access::Exclusive, |seg, so, n, at| {
            let piece = match src {
                Source::Data(d) => Source::Data(&d[at..at + n]),
                Source::Zeroes => Source::Zeroes,
            };
            fresh += self.store_in_chunk(seg, so, n, piece)?;
            Ok(())
        })?;
        Ok(fresh as u64 * PAGE_BYTES)
    }

    /// Commits the unallocated pages of `[from, to)` (clipped to the drive)
    /// as zero pages, chunk by chunk, while both budgets keep
    /// `margin_bytes` of headroom. Returns the bytes committed.
    fn prefault(&self, from: u64, to: u64, margin_bytes: u64) -> u64 {
        let page = PAGE_BYTES as usize;
        let to = to.min(self.size());
        let mut pos = from;
        let mut committed = 0;
        while pos < to {
            let n = (CHUNK_BYTES - pos % CHUNK_BYTES).min(to - pos);
            let r = self.for_each_chunk(pos, n, Access::ExclusiveNoCow, |seg, so, n, _| {
                let (p0, p1) = (so / page, (so + n).div_ceil(page));
                let fresh = (p1 - p0) - seg.allocated.count_range(p0, p1);
                if fresh == 0 {
                    return Ok(());
                }
                let bytes = (fresh * page) as u64;
                let room = |b: &MemoryBudget| b.limit_bytes().saturating_sub(b.used_bytes());
                if room(&self.drive_mem).min(room(&self.global_mem)) < bytes + margin_bytes {
                    return Err(Error::NoSpace("prefault margin".into()));
                }
                self.reserve_mem(bytes)?;
                huge::note_commit();
                seg.region.populate(p0 * page, (p1 - p0) * page);
                for p in p0..p1 {
                    if !seg.allocated.set(p) {
                        seg.zeroed.set(p);
                    }
                }
                committed += bytes;
                Ok(())
            });
            if r.is_err() {
                break;
            }
            pos += n;
        }
        committed
    }

    fn out_of_range(&self, offset: u64, len: u64) -> Error {
        Error::OutOfRange {
            offset,
            len,
            size: self.size.load(Ordering::Acquire),
        }
    }

    /// Stores `src` at segment offset `so` (within one chunk, lock held).
    /// Returns the number of pages that were empty before: newly committed,
    /// or committed by the prefaulter and not yet written.
    fn store_in_chunk(&self, seg: &Segment, so: usize, n: usize, src: Source<'_>) -> Result<usize> {
        let fresh = self.prepare_store(seg, so, n)?;
        let dst = seg.region.ptr(so);
        match src {
            // SAFETY: `dst..dst+n` lies inside the segment (so + n <= chunk
            // end <= SEGMENT_BYTES); we hold this chunk's exclusive lock, so no
            // other thread accesses these bytes; `data` is a distinct buffer.
            Source::Data(data) => unsafe { ntcopy::copy_streaming(data.as_ptr(), dst, n) },
            // SAFETY: same range and lock as above.
            Source::Zeroes => unsafe { std::ptr::write_bytes(dst, 0, n) },
        }
        Ok(self.commit_store(seg, so, n, fresh))
    }

    /// First half of a store into `[so, so+n)` of one chunk (exclusive lock
    /// held), before any byte changes: charges the pages that were empty to
    /// the budgets and commits them. Returns how many there were.
    #[inline]
    fn prepare_store(&self, seg: &Segment, so: usize, n: usize) -> Result<usize> {
        let page = PAGE_BYTES as usize;
        let (p0, p1) = (so / page, (so + n).div_ceil(page));
        let fresh = (p1 - p0) - seg.allocated.count_range(p0, p1);
        if fresh > 0 {
            self.reserve_mem((fresh * page) as u64)?;
            if fresh >= POPULATE_MIN_PAGES {
                seg.region.populate(p0 * page, (p1 - p0) * page);
            }
        }
        Ok(fresh)
    }

    /// Second half of a store into `[so, so+n)` (same lock still held),
    /// after the bytes changed: marks the pages allocated, written and
    /// dirty. Returns the pages that were empty before (`fresh` new ones
    /// plus prefaulted ones nobody had written).
    #[inline]
    fn commit_store(&self, seg: &Segment, so: usize, n: usize, fresh: usize) -> usize {
        let page = PAGE_BYTES as usize;
        let (p0, p1) = (so / page, (so + n).div_ceil(page));
        if fresh > 0 {
            seg.allocated.set_range(p0, p1);
        }
        let prefaulted = seg.zeroed.count_range(p0, p1);
        if prefaulted > 0 {
            for p in p0..p1 {
                seg.zeroed.clear(p);
            }
        }
        seg.dirty.set_range(p0, p1);
        fresh + prefaulted
    }

    /// The chunk locks over `[offset, offset+len)` clipped to one segment
    /// and to `DIRECT_MAX_BYTES`, taken in ascending order (the only order
    /// in which anyone holds several), with the size re-checked under them.
    /// Returns the segment, the segment offset, the clipped length and the
    /// guards (released on drop).
    fn lock_span<'s, G>(
        &self,
        segs: &'s [Arc<Segment>],
        offset: u64,
        len: usize,
        lock: impl Fn(&'s RwLock<()>) -> G,
    ) -> Result<(&'s Segment, usize, usize, Vec<G>)> {
        check_range(offset, len as u64, self.size())?;
        let Some(seg) = segs.get((offset / SEGMENT_BYTES) as usize) else {
            return Err(self.out_of_range(offset, len as u64));
        };
        let so = (offset % SEGMENT_BYTES) as usize;
        let n = len.min(SEGMENT_BYTES as usize - so).min(DIRECT_MAX_BYTES);
        let chunk = CHUNK_BYTES as usize;
        let guards: Vec<G> = (so / chunk..(so + n).div_ceil(chunk))
            .map(|c| lock(&seg.locks[c]))
            .collect();
        if offset + n as u64 > self.size() {
            return Err(self.out_of_range(offset, len as u64));
        }
        Ok((seg, so, n, guards))
    }

    /// Stores bytes that `fill` produces in place, straight into the
    /// drive's memory: no intermediate buffer (restore reads snapshot
    /// pages from their file this way). Covers a prefix of
    /// `[offset, offset+len)` (up to `DIRECT_MAX_BYTES`, within one segment)
    /// with its chunks locked exclusively, calls `fill` once with that whole
    /// prefix, and returns its length. `fill` must fill all of it without
    /// waiting on anyone (the locks are held). When memory runs out part-way
    /// the prefix ends there; a call with no room at all is `NoSpace`. An
    /// error from `fill` is returned as `Error::Io` after the range is
    /// accounted as written (its bytes may have changed).
    pub fn write_with(
        &self,
        offset: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<(usize, bool)> {
        if len == 0 {
            check_range(offset, 0, self.size())?;
            return Ok((0, false));
        }
        let segs = self.segments.load();
        let (seg, so, n, _guards) = loop {
            let (seg, so, n, guards) = self.lock_span(&segs, offset, len, |l| l.write())?;
            // A running snapshot: save the chunks' pre-cut pages first.
            match self.cow_span(seg, so, n, offset / SEGMENT_BYTES) {
                None => break (seg, so, n, guards),
                Some((ci, chunk, e)) => {
                    drop(guards);
                    self.wait_captured(seg, ci, chunk, e);
                }
            }
        };
        let chunk = CHUNK_BYTES as usize;
        // Charge chunk by chunk; on ENOSPC keep what was charged so far.
        // An unaligned span of DIRECT_MAX_BYTES touches one chunk more.
        let mut fresh_per_chunk = [0usize; DIRECT_MAX_BYTES / CHUNK_BYTES as usize + 1];
        let (mut ready, mut no_space) = (so, None);
        for (i, a) in (so / chunk * chunk..so + n).step_by(chunk).enumerate() {
            let (a, b) = (a.max(so), (a + chunk).min(so + n));
            match self.prepare_store(seg, a, b - a) {
                Ok(f) => (fresh_per_chunk[i], ready) = (f, b),
                Err(e) => {
                    no_space = Some(e);
                    break;
                }
            }
        }
        if ready == so {
            return Err(no_space.expect("a chunk failed to prepare"));
        }
        seg.mark_before_change(so, ready - so);
        // SAFETY: `[so, ready)` lies inside the segment's mapping; we hold
        // the exclusive locks of every chunk it touches, so no other thread
        // reads or writes these bytes while the slice lives.
        let dst = unsafe { std::slice::from_raw_parts_mut(seg.region.ptr(so), ready - so) };
        let filled = fill(dst);
        let mut was_empty = 0;
        for (i, a) in (so / chunk * chunk..ready).step_by(chunk).enumerate() {
            let (a, b) = (a.max(so), (a + chunk).min(ready));
            was_empty += self.commit_store(seg, a, b - a, fresh_per_chunk[i]);
        }
        filled?;
        Ok((ready - so, was_empty > 0))
    }

    /// Hands the bytes of a prefix of `[offset, offset+len)` (up to
    /// `DIRECT_MAX_BYTES`, within one segment) to `sink` in place, as
    /// slices of the drive's memory (holes as slices of a shared zero
    /// buffer), with their chunks locked shared. `sink` takes a prefix of
    /// the slices' bytes without waiting on anyone and returns how many;
    /// so does this call.
    pub fn read_with(
        &self,
        offset: u64,
        len: usize,
        sink: &mut dyn FnMut(&[IoSlice<'_>]) -> std::io::Result<usize>,
    ) -> Result<usize> {
        if len == 0 {
            check_range(offset, 0, self.size())?;
            return Ok(0);
        }
        let segs = self.segments.load();
        let (seg, so, n, _guards) = self.lock_span(&segs, offset, len, |l| l.read())?;
        let page = PAGE_BYTES as usize;
        let end = so + n;
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(8);
        let mut pos = so;
        while pos < end {
            let p = pos / page;
            let alloc = seg.allocated.get(p);
            let run_end = (seg.allocated.find(p, end.div_ceil(page), !alloc) * page).min(end);
            if alloc {
                // SAFETY: inside the mapping; the shared locks of every chunk
                // in the span are held until after `sink` returns, so no
                // writer changes or frees these bytes meanwhile.
                let data =
                    unsafe { std::slice::from_raw_parts(seg.region.ptr(pos), run_end - pos) };
                slices.push(IoSlice::new(data));
            } else {
                let mut at = pos;
                while at < run_end {
                    let m = (run_end - at).min(ZEROES.len());
                    slices.push(IoSlice::new(&ZEROES[..m]));
                    at += m;
                }
            }
            pos = run_end;
        }
        Ok(sink(&slices)?)
    }

    /// Copies segment bytes `[so, so+out.len())` into `out`, filling zeroes
    /// for unallocated pages (which are never touched, so never faulted in).
    fn load_in_chunk(&self, seg: &Segment, so: usize, out: &mut [u8]) {
        let page = PAGE_BYTES as usize;
        let end = so + out.len();
        let mut pos = so;
        while pos < end {
            let p = pos / page;
            let last_page = end.div_ceil(page);
            let alloc = seg.allocated.get(p);
            let run_end_page = seg.allocated.find(p, last_page, !alloc);
            let run_end = (run_end_page * page).min(end);
            let dst = &mut out[pos - so..run_end - so];
            if alloc {
                // SAFETY: the source range is inside the segment; we hold the
                // chunk's shared lock so no writer changes it; `dst` is a
                // separate buffer of exactly this length.
                unsafe {
                    std::ptr::copy_nonoverlapping(seg.region.ptr(pos), dst.as_mut_ptr(), dst.len())
                };
            } else {
                dst.fill(0);
            }
            pos = run_end;
        }
    }

    /// Makes `[so, so+n)` read as zero, releasing whole allocated pages.
    /// With `to_drive_end`, the range ends at the end of the drive, so the
    /// partial page there is wholly covered (bytes past the end are zero)
    /// and is released too. Returns the bytes released. Caller holds the
    /// chunk's exclusive lock.
    fn discard_in_chunk(&self, seg: &Segment, so: usize, n: usize, to_drive_end: bool) -> u64 {
        let page = PAGE_BYTES as usize;
        let end = so + n;
        let full_start = so.next_multiple_of(page);
        let full_end = if to_drive_end {
            end.next_multiple_of(page)
        } else {
            end / page * page
        };
        let mut freed = 0u64;
        // Partial pages at either edge: zero the covered bytes in place.
        let head_end = full_start.min(end);
        let tail_start = full_end.max(head_end);
        for (a, b) in [(so, head_end), (tail_start, end)] {
            if a < b && seg.allocated.get(a / page) {
                // SAFETY: inside the segment; exclusive chunk lock held.
                unsafe { std::ptr::write_bytes(seg.region.ptr(a), 0, b - a) };
            }
        }
        // Whole pages: hand allocated runs back to the OS.
        if full_start < full_end {
            let (pe, mut p) = (full_end / page, full_start / page);
            while p < pe {
                let start = seg.allocated.find(p, pe, true);
                if start == pe {
                    break;
                }
                let stop = seg.allocated.find(start, pe, false);
                huge::forget_ranges(seg, start * page, stop * page);
                seg.region.release(start * page, (stop - start) * page);
                for q in start..stop {
                    seg.allocated.clear(q);
                    seg.zeroed.clear(q);
                }
                freed += ((stop - start) * page) as u64;
                p = stop;
            }
        }
        freed
    }
}

/// Locks the part of each segment in `segs` that a drive of `size` bytes
/// covers (whole pages) and unlocks the rest (`region.rs`). The caller
/// holds the resize lock.
fn lock_segments(segs: &[Arc<Segment>], size: u64) -> Result<()> {
    for (i, seg) in segs.iter().enumerate() {
        let covered = size
            .saturating_sub(i as u64 * SEGMENT_BYTES)
            .min(SEGMENT_BYTES)
            .next_multiple_of(PAGE_BYTES);
        let before = seg.region.locked_len() as u64;
        seg.region
            .lock_to(covered as usize)
            .map_err(|e| lock_error(e, covered.saturating_sub(before)))?;
    }
    Ok(())
}

/// Sets the `allocated` bits of the pages of `segs` that hold data in
/// `fd` (its data runs, `memfd.rs`) below `size`; frees data beyond it (a
/// file a shrink left longer). Returns the bytes of those pages.
/// An adopted drive's end page beyond its size reads as zero, as after a
/// completed shrink (a kill in the middle of one may have left old bytes
/// there); changed, so marked dirty. Before anyone else uses the store.
fn zero_end_tail(segs: &[Arc<Segment>], size: u64) {
    let tail = (size % PAGE_BYTES) as usize;
    if tail == 0 {
        return;
    }
    let page = size / PAGE_BYTES;
    let seg = &segs[(page / PAGES_PER_SEGMENT as u64) as usize];
    let p = (page % PAGES_PER_SEGMENT as u64) as usize;
    if !seg.allocated.get(p) {
        return;
    }
    let at = p * PAGE_BYTES as usize + tail;
    // SAFETY: the rest of page `p`, inside the segment's mapping; nothing
    // else uses the store yet (it is being adopted).
    unsafe { std::ptr::write_bytes(seg.region.ptr(at), 0, PAGE_BYTES as usize - tail) };
    seg.dirty.set(p);
}

fn mark_data_runs(segs: &[Arc<Segment>], fd: BorrowedFd<'_>, size: u64) -> Result<u64> {
    let (page, per_seg) = (PAGE_BYTES as usize, PAGES_PER_SEGMENT);
    let end_page = size.div_ceil(PAGE_BYTES) as usize;
    let mut bytes = 0;
    for (a, b) in memfd::data_runs(fd, segs.len() * SEGMENT_BYTES as usize)? {
        let (mut p, p1) = (a / page, b.div_ceil(page));
        while p < p1 {
            let (si, q) = (p / per_seg, p % per_seg);
            let n = (per_seg - q).min(p1 - p);
            if p >= end_page {
                segs[si].region.release(q * page, n * page);
            } else {
                let n = n.min(end_page - p);
                segs[si].allocated.set_range(q, q + n);
                bytes += (n * page) as u64;
                p += n;
                continue;
            }
            p += n;
        }
    }
    Ok(bytes)
}

/// Why locking a drive's memory failed, for people: the limit and how to
/// raise it.
pub fn lock_error(e: std::io::Error, bytes: u64) -> Error {
    Error::NoSpace(format!(
        "cannot lock {} more of the drive in RAM (mlock2: {e}): the daemon's RLIMIT_MEMLOCK does not cover it; \
         raise it (`ulimit -l` before starting the daemon, LimitMEMLOCK= in its systemd unit) or give the daemon CAP_IPC_LOCK",
        crate::size::format_size(bytes)
    ))
}

/// The data path. `RamStore` exposes it as a [`Backend`], adding prefault
/// hints to writes.
impl StoreState {
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.for_each_chunk(
            offset,
            buf.len() as u64,
            Access::Shared,
            |seg, so, n, at| {
                self.load_in_chunk(seg, so, &mut buf[at..at + n]);
                Ok(())
            },
        )
    }

    pub fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()> {
        if !may_trim {
            return self.store_range(offset, len, Source::Zeroes).map(drop);
        }
        self.trim(offset, len)
    }

    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        let mut freed = 0;
        let size = self.size();
        let r = self.for_each_chunk(offset, len, Access::Exclusive, |seg, so, n, at| {
            let to_drive_end = offset + (at + n) as u64 == size;
            freed += self.discard_in_chunk(seg, so, n, to_drive_end);
            let page = PAGE_BYTES as usize;
            seg.dirty.set_range(so / page, (so + n).div_ceil(page));
            Ok(())
        });
        self.release_mem(freed);
        r
    }

    pub fn flush(&self) -> Result<()> {
        Ok(())
    }

    pub fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range(offset, len, self.size())?;
        let segs = self.segments.load();
        let mut out: Vec<Extent> = Vec::new();
        let end = offset + len;
        let mut pos = offset;
        while pos < end && out.len() < MAX_EXTENTS {
            let Some(seg) = segs.get((pos / SEGMENT_BYTES) as usize) else {
                return Err(self.out_of_range(offset, len));
            };
            let seg_base = pos / SEGMENT_BYTES * SEGMENT_BYTES;
            let seg_end = (seg_base + SEGMENT_BYTES).min(end);
            let p = ((pos - seg_base) / PAGE_BYTES) as usize;
            let last = ((seg_end - seg_base).div_ceil(PAGE_BYTES)) as usize;
            let hole = seg.is_hole(p);
            let stop = seg.find_hole_change(p, last, hole);
            let run_end = (seg_base + stop as u64 * PAGE_BYTES).min(end);
            match out.last_mut() {
                Some(e) if e.hole == hole => e.len += run_end - pos,
                _ => out.push(Extent {
                    len: run_end - pos,
                    hole,
                    zero: hole,
                }),
            }
            pos = run_end;
        }
        Ok(out)
    }

    pub fn capabilities(&self) -> Caps {
        Caps {
            can_trim: true,
            can_zero: true,
            can_fast_zero: true,
            can_fua: true,
            can_flush: true,
            can_multi_conn: true,
            can_extents: true,
            can_cache: true,
            direct_io: true,
            piece_bytes: CHUNK_BYTES as u32,
        }
    }
}

/// The drive as a backend: the state's data path plus prefault hints.
impl Backend for RamStore {
    fn size(&self) -> u64 {
        self.state.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.state.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<()> {
        let fresh = self
            .state
            .store_range(offset, data.len() as u64, Source::Data(data))?;
        self.note_fill(offset, data.len() as u64, fresh > 0);
        Ok(())
    }
    fn read_with(
        &self,
        offset: u64,
        len: usize,
        sink: &mut dyn FnMut(&[IoSlice<'_>]) -> std::io::Result<usize>,
    ) -> Result<usize> {
        self.state.read_with(offset, len, sink)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()> {
        self.state.write_zeroes(offset, len, may_trim)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.state.trim(offset, len)
    }
    fn flush(&self) -> Result<()> {
        self.state.flush()
    }
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.state.extents(offset, len)
    }
    fn capabilities(&self) -> Caps {
        self.state.capabilities()
    }
}

impl Drop for StoreState {
    fn drop(&mut self) {
        // The segments unmap themselves; give their pages back to the budget.
        self.global_mem.release(self.drive_mem.used_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};

    fn store(size: u64) -> RamStore {
        RamStore::new(size, None, Arc::new(MemoryBudget::new(u64::MAX))).unwrap()
    }

    #[test]
    fn unwritten_reads_zero_without_allocating() {
        let s = store(1 << 20);
        let mut buf = vec![1u8; 8192];
        s.read(4096, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(s.allocated_bytes(), 0);
    }

    #[test]
    fn unaligned_write_read_and_trim() {
        let s = store(1 << 20);
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8 | 1).collect();
        s.write(4000, &data, false).unwrap();
        assert_eq!(s.allocated_bytes(), 4 * PAGE_BYTES);
        let mut back = vec![0u8; data.len()];
        s.read(4000, &mut back).unwrap();
        assert_eq!(back, data);
        s.trim(4096, 8192).unwrap();
        assert_eq!(s.allocated_bytes(), 2 * PAGE_BYTES);
        s.read(4000, &mut back).unwrap();
        assert!(back[96..96 + 8192].iter().all(|&b| b == 0));
        assert_eq!(back[..96], data[..96]);
    }

    #[test]
    fn out_of_range_is_an_error() {
        let s = store(4096 * 3);
        let mut buf = [0u8; 2];
        assert!(matches!(
            s.read(4096 * 3 - 1, &mut buf),
            Err(Error::OutOfRange { .. })
        ));
        assert!(s.write(u64::MAX, &buf, false).is_err());
        assert!(s.trim(0, 4096 * 3 + 1).is_err());
    }

    #[test]
    fn memory_limits_give_enospc() {
        let global = Arc::new(MemoryBudget::new(3 * PAGE_BYTES));
        let a = RamStore::new(1 << 20, Some(2 * PAGE_BYTES), global.clone()).unwrap();
        let b = RamStore::new(1 << 20, None, global.clone()).unwrap();
        a.write(0, &[1; 8192], false).unwrap();
        assert!(matches!(a.write(8192, &[1], false), Err(Error::NoSpace(_))));
        // Overwrites of allocated pages keep working.
        a.write(100, &[2; 100], false).unwrap();
        b.write(0, &[1; 4096], false).unwrap();
        assert!(matches!(b.write(4096, &[1], false), Err(Error::NoSpace(_))));
        assert_eq!(global.used_bytes(), 3 * PAGE_BYTES);
        drop(a);
        assert_eq!(global.used_bytes(), PAGE_BYTES);
        b.write(4096, &[1], false).unwrap();
    }

    #[test]
    fn extents_report_holes() {
        let s = store(1 << 20);
        s.write(8192, &[1; 4096], false).unwrap();
        let e = s.extents(0, 1 << 20).unwrap();
        assert_eq!(
            e,
            vec![
                Extent {
                    len: 8192,
                    hole: true,
                    zero: true
                },
                Extent {
                    len: 4096,
                    hole: false,
                    zero: false
                },
                Extent {
                    len: (1 << 20) - 12288,
                    hole: true,
                    zero: true
                },
            ]
        );
        let e = s.extents(8200, 10).unwrap();
        assert_eq!(
            e,
            vec![Extent {
                len: 10,
                hole: false,
                zero: false
            }]
        );
    }

    #[test]
    fn shrink_frees_and_grow_reads_zero() {
        let s = store(SEGMENT_BYTES * 2);
        s.write(SEGMENT_BYTES + 10, &[7; 9000], false).unwrap();
        s.write(5000, &[9; 100], false).unwrap();
        s.resize(5050).unwrap();
        assert_eq!(s.allocated_bytes(), PAGE_BYTES);
        s.resize(SEGMENT_BYTES * 2).unwrap();
        let mut buf = vec![1u8; 200];
        s.read(5000, &mut buf).unwrap();
        assert!(buf[..50].iter().all(|&b| b == 9));
        assert!(buf[50..].iter().all(|&b| b == 0));
        let mut buf = vec![1u8; 9000];
        s.read(SEGMENT_BYTES + 10, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn dirty_set_is_taken_once() {
        let s = store(1 << 20);
        s.write(4096 * 3 + 5, &[1; 4096], false).unwrap();
        s.trim(4096 * 10, 4096).unwrap();
        let d = s.take_dirty();
        assert_eq!(d.iter().collect::<Vec<_>>(), vec![3, 4, 10]);
        assert!(s.take_dirty().is_empty());
    }

    /// Drives `write_with` over a whole range the way the NBD layer does.
    fn write_with_all(s: &RamStore, offset: u64, data: &[u8]) -> Result<Vec<usize>> {
        let (mut done, mut pieces) = (0, Vec::new());
        while done < data.len() {
            let n = s.write_with(offset + done as u64, data.len() - done, &mut |dst| {
                dst.copy_from_slice(&data[done..done + dst.len()]);
                Ok(())
            })?;
            pieces.push(n);
            done += n;
        }
        Ok(pieces)
    }

    #[test]
    fn write_with_stores_in_place_across_segments() {
        // No prefaulter: it would commit pages ahead of this sequential fill
        // on its own thread, racing the exact allocation count below.
        let opts = StoreOptions {
            mem_limit_bytes: None,
            prefault: false,
            ..StoreOptions::default()
        };
        let s = RamStore::with_options(
            SEGMENT_BYTES * 2,
            opts,
            Arc::new(MemoryBudget::new(u64::MAX)),
        )
        .unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let at = SEGMENT_BYTES - 5000;
        let pieces = write_with_all(&s, at, &data).unwrap();
        // Clipped at the segment's end, then at most 1 MiB at a time.
        assert_eq!(pieces[0], 5000);
        assert!(pieces[1..].iter().all(|&n| n <= DIRECT_MAX_BYTES));
        let mut back = vec![0u8; data.len()];
        s.read(at, &mut back).unwrap();
        assert!(back == data);
        let pages = (at + data.len() as u64).div_ceil(PAGE_BYTES) - at / PAGE_BYTES;
        assert_eq!(s.allocated_bytes(), pages * PAGE_BYTES);
        assert_eq!(s.take_dirty().count(), pages);
        assert!(s.write_with(s.size() - 1, 2, &mut |_| Ok(())).is_err());
    }

    #[test]
    fn write_with_stops_where_memory_runs_out() {
        let global = Arc::new(MemoryBudget::new(u64::MAX));
        let s = RamStore::new(1 << 20, Some(20 * PAGE_BYTES), global).unwrap();
        let data = vec![7u8; 1 << 20];
        // The first chunk's 16 pages fit, the second chunk's do not.
        let n = s
            .write_with(0, data.len(), &mut |d| {
                d.fill(7);
                Ok(())
            })
            .unwrap();
        assert_eq!(n, CHUNK_BYTES as usize);
        assert!(matches!(
            write_with_all(&s, n as u64, &data[n..]),
            Err(Error::NoSpace(_))
        ));
        assert_eq!(s.allocated_bytes(), 16 * PAGE_BYTES);
        // A failing source is an I/O error; its range counts as written.
        let r = s.write_with(0, 100, &mut |_| {
            Err(std::io::ErrorKind::UnexpectedEof.into())
        });
        assert!(matches!(r, Err(Error::Io(_))));
    }

    #[test]
    fn read_with_offers_data_and_holes_in_place() {
        let s = store(SEGMENT_BYTES * 2);
        s.write(3 * PAGE_BYTES + 10, &[5; 5000], false).unwrap();
        s.write(SEGMENT_BYTES - 100, &[6; 300], false).unwrap();
        let (offset, len) = (PAGE_BYTES + 1, SEGMENT_BYTES as usize);
        let mut expect = vec![0u8; len];
        s.read(offset, &mut expect).unwrap();
        let mut got = Vec::new();
        while got.len() < len {
            let n = s
                .read_with(offset + got.len() as u64, len - got.len(), &mut |slices| {
                    // Take all but the last byte offered: partial takes work.
                    let total: usize = slices.iter().map(|b| b.len()).sum();
                    let take = (total - 1).max(1);
                    let mut left = take;
                    for b in slices {
                        let m = b.len().min(left);
                        got.extend_from_slice(&b[..m]);
                        left -= m;
                    }
                    Ok(take)
                })
                .unwrap();
            assert!(n > 0 && n <= DIRECT_MAX_BYTES);
        }
        assert!(got == expect);
        // Reading allocates nothing.
        assert_eq!(s.allocated_bytes(), 4 * PAGE_BYTES);
    }

    /// Keeps duplicates of the descriptors it is given, as a supervisor
    /// does.
    #[derive(Default)]
    struct Holder(Mutex<(u64, Option<OwnedFd>, Option<OwnedFd>)>);

    impl SegmentKeeper for Holder {
        fn keep(&self, size_bytes: u64, fds: &[BorrowedFd<'_>]) {
            *self.0.lock() = (
                size_bytes,
                Some(fds[0].try_clone_to_owned().unwrap()),
                Some(fds[1].try_clone_to_owned().unwrap()),
            );
        }
    }

    impl Holder {
        /// What it holds, as an adoption takes it (duplicates).
        fn kept(&self) -> (u64, KeptMemory) {
            let g = self.0.lock();
            let kept = KeptMemory {
                memfd: g.1.as_ref().unwrap().try_clone().unwrap(),
                ledger: g.2.as_ref().map(|l| l.try_clone().unwrap()),
            };
            (g.0, kept)
        }
    }

    /// Shared memory, no prefaulter (its pages would blur the checks).
    fn kept_opts() -> StoreOptions {
        StoreOptions {
            shared_memory: true,
            prefault: false,
            ..StoreOptions::default()
        }
    }

    /// A store of `size` bytes in shared memory that a `Holder` keeps.
    fn kept_store(size: u64, global: &Arc<MemoryBudget>) -> (RamStore, Arc<Holder>) {
        let s = RamStore::with_options(size, kept_opts(), global.clone()).unwrap();
        let holder = Arc::new(Holder::default());
        s.set_keeper(holder.clone());
        (s, holder)
    }

    fn dirty_list(s: &StoreState) -> Vec<u64> {
        s.segments
            .load()
            .iter()
            .enumerate()
            .flat_map(|(i, seg)| {
                (0..PAGES_PER_SEGMENT)
                    .filter(|&p| seg.dirty.get(p))
                    .map(move |p| (i * PAGES_PER_SEGMENT + p) as u64)
            })
            .collect()
    }

    /// The dirty set outlives the process with the memory (`ledger.rs`):
    /// an adopted store's dirty set holds every page written since the
    /// last saved cut, including the ones a cut had taken but not saved
    /// when the process died; a saved cut's pages are not dirty again.
    #[test]
    fn the_dirty_set_survives_an_adoption() {
        let global = Arc::new(MemoryBudget::new(u64::MAX));
        let opts = kept_opts();
        let (s, holder) = kept_store(SEGMENT_BYTES * 2, &global);
        s.take_dirty();
        s.write(0, &[1; 4096], false).unwrap();
        s.write(SEGMENT_BYTES, &[2; 4096], false).unwrap();
        // A saved cut.
        let mut cut = s.snapshot();
        while cut.next_chunk().is_some() {}
        cut.finish();
        s.write(8192, &[3; 4096], false).unwrap();
        s.write(SEGMENT_BYTES + 8192, &[4; 4096], false).unwrap();
        // A cut that took everything and died before it was saved.
        let mut cut = s.snapshot();
        while cut.next_chunk().is_some() {}
        std::mem::forget(cut);
        assert!(dirty_list(&s).is_empty());
        s.write(4 * 4096, &[5; 10], false).unwrap();
        let (size, kept) = holder.kept();
        let a = RamStore::adopt(size, kept, opts, global.clone()).unwrap();
        let p = SEGMENT_BYTES / PAGE_BYTES;
        assert_eq!(dirty_list(&a), vec![2, 4, p + 2]);
        // Saved by the adopter: a second adoption starts clean.
        let mut cut = a.snapshot();
        while cut.next_chunk().is_some() {}
        cut.finish();
        let (size, kept) = holder.kept();
        let b = RamStore::adopt(size, kept, opts, global.clone()).unwrap();
        assert!(dirty_list(&b).is_empty());
        // A shrink and grow since the last saved cut is remembered.
        b.resize(SEGMENT_BYTES / 2).unwrap();
        b.resize(SEGMENT_BYTES * 2).unwrap();
        let (size, kept) = holder.kept();
        let c = RamStore::adopt(size, kept, opts, global).unwrap();
        assert_eq!(c.snapshot().min_size_bytes(), SEGMENT_BYTES / 2);
    }

    fn kept(memfd: OwnedFd) -> KeptMemory {
        KeptMemory {
            memfd,
            ledger: None,
        }
    }

    /// A kill in the middle of a shrink: the keeper was told the smaller
    /// size first, the tail was not released yet. The adoption frees what
    /// lies beyond and zeroes the end page's tail (marked changed), so
    /// growing again shows zeroes, as after a completed shrink.
    #[test]
    fn an_adoption_finishes_a_shrink_the_kill_interrupted() {
        let global = Arc::new(MemoryBudget::new(u64::MAX));
        let opts = kept_opts();
        let (s, holder) = kept_store(1 << 20, &global);
        s.write(0, &[7; 8192], false).unwrap();
        s.take_dirty();
        let (_, kept) = holder.kept();
        let a = RamStore::adopt(100, kept, opts, global).unwrap();
        assert_eq!(dirty_list(&a), vec![0]);
        a.resize(8192).unwrap();
        let mut buf = vec![1u8; 8192];
        a.read(0, &mut buf).unwrap();
        assert_eq!(&buf[..100], &[7; 100][..]);
        assert!(buf[100..].iter().all(|&b| b == 0), "old bytes came back");
    }

    /// A store over memfds survives its own drop: a new store adopting
    /// the kept descriptors reads every byte written before, holds the
    /// same pages (rebuilt from the files' data runs: trimmed pages stay
    /// holes) and charges them to the budgets. A grow hands the new
    /// segment to the keeper before the size is published.
    #[test]
    fn adopted_memfds_hold_what_was_written() {
        let global = Arc::new(MemoryBudget::new(u64::MAX));
        let shared = StoreOptions {
            shared_memory: true,
            ..StoreOptions::default()
        };
        let s = RamStore::with_options(SEGMENT_BYTES + 8192, shared, global.clone()).unwrap();
        assert!(s.is_shared());
        let holder = Arc::new(Holder::default());
        s.set_keeper(holder.clone());
        assert_eq!(holder.0.lock().0, SEGMENT_BYTES + 8192);
        s.write(4096 * 3 + 5, &[1; 9000], false).unwrap();
        s.write(SEGMENT_BYTES + 100, &[2; 50], false).unwrap();
        s.trim(4096 * 4, 4096).unwrap();
        s.resize(3 * SEGMENT_BYTES).unwrap();
        assert_eq!(holder.0.lock().0, 3 * SEGMENT_BYTES);
        s.write(2 * SEGMENT_BYTES + 7, &[3; 10], false).unwrap();
        let mut want = vec![0u8; 3 * SEGMENT_BYTES as usize];
        s.read(0, &mut want).unwrap();
        let (allocated, extents) = (s.allocated_bytes(), s.extents(0, s.size()).unwrap());
        drop(s);
        assert_eq!(global.used_bytes(), 0);
        let (size, fd, _) = std::mem::take(&mut *holder.0.lock());
        let fd = fd.unwrap();
        let opts = StoreOptions {
            prefault: false,
            ..StoreOptions::default()
        };
        let dup = fd.try_clone().unwrap();
        let a = RamStore::adopt(size, kept(dup), opts, global.clone()).unwrap();
        let mut got = vec![0u8; want.len()];
        a.read(0, &mut got).unwrap();
        assert!(got == want);
        assert_eq!(a.allocated_bytes(), allocated);
        assert_eq!(global.used_bytes(), allocated);
        assert_eq!(a.extents(0, a.size()).unwrap(), extents);
        // A shrink frees the tail and keeps the file's length; adopting at
        // the smaller size finds the rest of the file empty.
        a.resize(SEGMENT_BYTES / 2).unwrap();
        let held = a.allocated_bytes();
        drop(a);
        let b = RamStore::adopt(SEGMENT_BYTES / 2, kept(fd), opts, global.clone()).unwrap();
        assert_eq!(b.allocated_bytes(), held);
        b.resize(3 * SEGMENT_BYTES).unwrap();
        let mut tail = vec![1u8; 16];
        b.read(2 * SEGMENT_BYTES, &mut tail).unwrap();
        assert_eq!(tail, [0; 16]);
        drop(b);
        // Short and unsealed files are refused.
        let short = memfd::create().unwrap();
        assert!(RamStore::adopt(4096, kept(short), opts, global.clone()).is_err());
        // SAFETY: a fresh memfd, owned at once.
        let plain = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"x".as_ptr(), 0)) };
        // SAFETY: ftruncate on our descriptor.
        unsafe { libc::ftruncate(plain.as_raw_fd(), SEGMENT_BYTES as i64) };
        assert!(RamStore::adopt(4096, kept(plain), opts, global).is_err());
    }

    /// With `shared_memory` off the segments are anonymous: nothing to
    /// keep, and the same data path.
    #[test]
    fn anonymous_segments_have_no_memfds() {
        let opts = StoreOptions {
            shared_memory: false,
            ..StoreOptions::default()
        };
        let s =
            RamStore::with_options(1 << 20, opts, Arc::new(MemoryBudget::new(u64::MAX))).unwrap();
        let holder = Arc::new(Holder::default());
        s.set_keeper(holder.clone());
        assert!(!s.is_shared() && holder.0.lock().1.is_none());
        s.write(10, &[4; 10], false).unwrap();
        s.trim(0, 4096).unwrap();
        assert_eq!(s.allocated_bytes(), 0);
    }

    #[test]
    fn zero_no_hole_keeps_allocation() {
        let s = store(1 << 20);
        s.write_zeroes(0, 3 * 4096, false).unwrap();
        assert_eq!(s.allocated_bytes(), 3 * PAGE_BYTES);
        s.write_zeroes(0, 3 * 4096, true).unwrap();
        assert_eq!(s.allocated_bytes(), 0);
    }
}
