//! Huge pages for full 2 MiB ranges of a drive, made while no drive is
//! being filled.
//!
//! Random I/O over a drive much larger than the TLB's reach takes a TLB
//! miss on nearly every request, and on a VM each miss walks two sets of
//! page tables. Once every 4 KiB page of an aligned 2 MiB range is
//! committed, nothing is lost by backing it with one huge page: the range
//! holds the same memory either way. Measured with fio 4 KiB random I/O at
//! QD64x2 over a full 1 GiB drive (A/B in bench/HISTORY.md, item 16):
//! 1.27-1.29 us of server CPU per request against 1.48-1.54, and 7-8% more
//! IOPS.
//!
//! When:
//! - A collapse (`MADV_COLLAPSE`, Linux 6.1) copies the range into a fresh
//!   huge page under the process's `mmap` lock, taken for writing. On our
//!   VM that takes 2-5 ms per range (the host backs the fresh huge page
//!   first), and every page fault of the process waits meanwhile: collapsing
//!   while a drive was being filled cut first fills 5-10x (item 14). So the
//!   drive's background thread (`prefault.rs`) collapses only after no
//!   drive of the process has committed a fresh page for `IDLE_MS`
//!   (`COMMITS` did not move), and stops at the next fresh commit.
//! - It runs when a write committed fresh pages since its last pass
//!   (`pending`), scans the drive for full ranges not yet collapsed, and
//!   rests as long as each collapse took, so it never takes more than half
//!   a core from the requests that run meanwhile. Requests are not stopped:
//!   only one touching the range being collapsed waits (its chunk locks).
//!
//! Warm pages first: on our VM the 2-5 ms of a collapse were the host
//! backing the fresh huge page while the kernel copied into it, with the
//! range's requests waiting (QD128 on one connection fell from ~280k to
//! ~175k IOPS for the seconds a 1 GiB pass took). So before each collapse
//! the thread commits a huge page in a scratch mapping of its own and
//! frees it at once (`Region::warm_huge_page`): the collapse then gets that
//! block, already backed, and takes ~0.5 ms (`bench/HISTORY.md`, item 20).
//! The rest after a collapse counts the warm-up too. The scratch page
//! holds 2 MiB outside the budgets for the moment between the two calls,
//! like the collapse itself, which holds the new huge page and the old
//! pages together while it copies.
//!
//! How one range is collapsed (`collapse_huge`): its 32 chunk locks are
//! taken exclusively, in ascending order like every multi-chunk lock; every
//! page must still be allocated and the range inside the drive (otherwise
//! the kernel would commit pages our accounting thinks free); then the
//! kernel is asked, and the range's bit in `Segment::huge` is set. A trim
//! inside it splits it (the kernel does, on `MADV_DONTNEED`), frees just
//! the trimmed pages and clears the bit, so the range is collapsed again
//! once it is full again. Failures cost nothing but the attempt: EINVAL (a
//! kernel before 6.1) turns collapsing off for the drive; EAGAIN or ENOMEM
//! (no free huge page) end the pass.
//!
//! Invariant: collapsing never changes a byte, a bitmap bit of the data
//! path or a budget.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::region::{self, HUGE_BYTES};
use super::{Segment, StoreState, CHUNK_BYTES, PAGE_BYTES, SEGMENT_BYTES};

thread_local! {
    /// Each background thread's scratch mapping for `Region::warm_huge_page`
    /// (address space only; unmapped when the thread ends). None where it
    /// could not be mapped: collapses then go unwarmed.
    static SCRATCH: Option<region::Region> = region::Region::new(HUGE_BYTES, true).ok();
}

/// No fresh page committed in the process for this long: fills are over,
/// collapsing may start.
pub const IDLE_MS: u64 = 250;

/// Fresh-page commits of every drive in the process (writes that filled
/// empty pages, and the prefaulter's commits).
static COMMITS: AtomicU64 = AtomicU64::new(0);

/// Counts a commit of fresh pages (a write that filled empty pages, or a
/// prefault).
#[inline]
pub fn note_commit() {
    COMMITS.fetch_add(1, Ordering::Relaxed);
}

/// The fresh-page commits so far (compare two readings to tell whether any
/// drive committed pages in between).
pub fn commits() -> u64 {
    COMMITS.load(Ordering::Relaxed)
}

/// A drive's huge-page state.
pub struct HugeState {
    /// Asked for, possible on this system and not found unsupported.
    enabled: AtomicBool,
    /// A write committed fresh pages since the last pass.
    pending: AtomicBool,
    /// Ranges collapsed so far.
    collapsed: AtomicU64,
}

impl HugeState {
    pub fn new(wanted: bool) -> HugeState {
        HugeState {
            enabled: AtomicBool::new(wanted && region::collapse_possible()),
            pending: AtomicBool::new(false),
            collapsed: AtomicU64::new(0),
        }
    }

    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// A write filled empty pages: ranges may have become full. True when
    /// this made a pass due (the background thread must be woken).
    #[inline]
    pub fn note_fill(&self) -> bool {
        self.enabled()
            && !self.pending.load(Ordering::Relaxed)
            && !self.pending.swap(true, Ordering::Relaxed)
    }
}

/// How a pass ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Pass {
    /// Every full range is collapsed.
    Done,
    /// A fresh commit happened (or `stop` said so): try again when idle.
    Interrupted,
    /// The kernel could not (no huge page free, or no support).
    Failed,
}

impl StoreState {
    /// Collapses every full 2 MiB range not collapsed yet, if a write
    /// filled pages since the last pass; stops early when `stop()` says so
    /// (checked before each range) or another fresh commit happens.
    pub(super) fn collapse_pass(&self, stop: &dyn Fn() -> bool) -> Pass {
        if !self.huge.enabled() || !self.huge.pending.swap(false, Ordering::Relaxed) {
            return Pass::Done;
        }
        let start_commits = commits();
        let started = Instant::now();
        let before = self.huge_collapsed();
        let segs = self.segments.load_full();
        let per_seg = SEGMENT_BYTES as usize / HUGE_BYTES;
        for (si, seg) in segs.iter().enumerate() {
            for h in 0..per_seg {
                if seg.huge.load(Ordering::Relaxed) & (1 << h) != 0 || !range_full(seg, h) {
                    continue;
                }
                if stop() || commits() != start_commits {
                    self.huge.pending.store(true, Ordering::Relaxed);
                    return Pass::Interrupted;
                }
                let at = si as u64 * SEGMENT_BYTES + (h * HUGE_BYTES) as u64;
                let t0 = Instant::now();
                SCRATCH.with(|scratch| {
                    if let Some(scratch) = scratch {
                        scratch.warm_huge_page();
                    }
                });
                match self.collapse_huge(at) {
                    // Rest as long as the warm-up and the collapse took (not
                    // after a skip).
                    Ok(true) => std::thread::sleep(t0.elapsed().min(Duration::from_millis(20))),
                    Ok(false) => {}
                    Err(()) => return Pass::Failed,
                }
            }
        }
        tracing::debug!(
            "huge pages: collapsed {} ranges of 2 MiB in {} ms",
            self.huge_collapsed() - before,
            started.elapsed().as_millis()
        );
        Pass::Done
    }

    /// Collapses the 2 MiB range at drive offset `at` into a huge page if
    /// it is still fully allocated and inside the drive. `Ok(true)` when
    /// done, `Ok(false)` when the range no longer qualifies, `Err` when the
    /// kernel could not.
    pub(super) fn collapse_huge(&self, at: u64) -> Result<bool, ()> {
        if !self.huge.enabled() {
            return Err(());
        }
        let segs = self.segments.load();
        let Some(seg) = segs.get((at / SEGMENT_BYTES) as usize) else {
            return Ok(false);
        };
        let so = (at % SEGMENT_BYTES) as usize;
        let chunk = CHUNK_BYTES as usize;
        let _locks: Vec<_> = (so / chunk..(so + HUGE_BYTES) / chunk)
            .map(|c| seg.locks[c].write())
            .collect();
        if at + HUGE_BYTES as u64 > self.size() || !range_full(seg, so / HUGE_BYTES) {
            return Ok(false);
        }
        match seg.region.collapse(so) {
            Ok(()) => {
                seg.huge.fetch_or(1 << (so / HUGE_BYTES), Ordering::Relaxed);
                self.huge.collapsed.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) => {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    tracing::debug!("huge pages off for this drive: MADV_COLLAPSE: {e}");
                    self.huge.enabled.store(false, Ordering::Relaxed);
                }
                Err(())
            }
        }
    }

    /// True when a write filled pages since the last collapse pass.
    pub fn huge_pass_pending(&self) -> bool {
        self.huge.enabled() && self.huge.pending.load(Ordering::Relaxed)
    }

    /// 2 MiB ranges collapsed into huge pages so far (some may have been
    /// split again by trims since).
    pub fn huge_collapsed(&self) -> u64 {
        self.huge.collapsed.load(Ordering::Relaxed)
    }

    /// True when this drive collapses full ranges into huge pages.
    pub fn huge_pages_enabled(&self) -> bool {
        self.huge.enabled()
    }
}

/// True when every page of range `h` (the `h`-th 2 MiB of `seg`) is
/// allocated.
fn range_full(seg: &Segment, h: usize) -> bool {
    let pages = HUGE_BYTES / PAGE_BYTES as usize;
    let p0 = h * pages;
    seg.allocated.count_range(p0, p0 + pages) == pages
}

/// Before pages in `[from, to)` of `seg` are released (chunk lock held):
/// the huge ranges they touch are split by the release, so they are no
/// longer marked collapsed.
#[inline]
pub(super) fn forget_ranges(seg: &Segment, from: usize, to: usize) {
    let mask = seg.huge.load(Ordering::Relaxed);
    if mask == 0 {
        return;
    }
    for h in from / HUGE_BYTES..to.div_ceil(HUGE_BYTES) {
        if mask & (1 << h) != 0 {
            seg.huge.fetch_and(!(1 << h), Ordering::Relaxed);
        }
    }
}
