//! The cache's core: slots, the index, claims, evictions, and the backing
//! calls that the data paths (read.rs, write.rs, discard.rs, writeback.rs)
//! build on. The layout and invariants below hold for all of them.
//!
//! # Layout
//!
//! ```text
//!  backing  | b0 | b1 | b2 | b3 | ... | bN-1 |   blocks of `block_bytes`
//!                 \         \                    (the last may be short)
//!  index    b1 -> s7, b3 -> s0, ...              flat array or sharded map (index.rs)
//!  slots    s0 s1 ... s(nslots-1)                per slot: RwLock<Meta>, wb mutex
//!  data     one mmap: slot s at s * block_bytes  committed as slots are first used
//!  policy   orders resident slots (policy.rs)    one mutex, taken on misses only
//!  dirty    1 bit per slot                       the flusher's work list
//! ```
//!
//! # Invariants
//!
//! - A slot's bytes are read under its `meta` read lock and changed under
//!   its write lock. `meta.block` names the block the slot holds, and the
//!   index maps that block to the slot, while `meta.state` is not `Empty`
//!   or a claim is filling it (the claimer holds the write lock).
//! - Within a resident slot, only the units in `meta.valid` hold data; the
//!   backing holds the newest bytes of the others (they are never dirty).
//!   Reads fetch missing units first; a write marks the units it covers
//!   wholly valid and fetches only the units it covers in part (at most
//!   two: a 512-byte-aligned write to a 4 KiB block fetches nothing).
//! - The index is only a hint: after locking a slot found through it, the
//!   reader checks `meta.block` and retries the lookup on a mismatch.
//! - A dirty slot is never evicted or invalidated without being written
//!   back, except by a zero/trim that covers it wholly (its data is
//!   superseded) or by a forced close. A block that is not in the index is
//!   never dirty, so the backing holds its newest data and a bypassing read
//!   may go straight to it.
//! - Write-backs of one slot are serialised by its `wb` mutex and mark the
//!   slot clean only if its generation did not change meanwhile, so a write
//!   racing with a write-back leaves the slot dirty, never lost.
//! - Lock order: whoever holds several slot locks takes them in ascending
//!   *slot* order (a slot's number never changes, the block it holds may),
//!   a slot's `wb` before its `meta`. Index shard locks and the policy
//!   mutex are leaves, except that the policy mutex holder *tries* slot
//!   locks (never blocks on them). Fills hold write locks on slots they
//!   claimed with `try_write` and block on nothing but leaves and backing
//!   I/O. The flusher re-takes `meta` of slots whose `wb` it holds, which is
//!   safe because every other holder of a `meta` lock that blocks while
//!   holding it took that slot's `wb` first. So no cycle can form.
//! - Hits take one atomic load of the index (a shard lock for backings too
//!   large for the flat index), one slot read lock and bump an atomic
//!   counter: no cache-wide lock (LRU, the comparison policy, adds one).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock, RwLockWriteGuard};

use super::config::{CacheConfig, Mode};
use super::gate::{Gate, Pass};
use super::health::{Health, Op};
use super::index::Index;
use super::keep::{CacheKeep, Geometry};
use super::policy::{HitMarks, Policy};
use super::seq::SeqDetector;
use super::stats::{Counters, Ctr};
use crate::block::backend::{Backend, Error, Result};
use crate::store::bitmap::AtomicBitmap;
use crate::store::region::Region;
use crate::store::MemoryBudget;

/// `Meta::block` of a slot that holds nothing.
pub(crate) const NO_BLOCK: u64 = u64::MAX;
/// Most bytes one miss reads from the backing (consecutive missing blocks
/// are fetched together up to this).
pub(crate) const MAX_FILL_BYTES: u64 = 1 << 20;
/// Retries of a lookup that raced with an eviction before giving up.
pub(crate) const MAX_RACE_RETRIES: u32 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Holds nothing (or is being filled by its claimer).
    Empty,
    /// Same bytes as the backing.
    Clean,
    /// Newer than the backing; must be written back before it may go.
    Dirty,
}

/// How a zero/trim reaches the backing (`discard.rs` runs them).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Discard {
    Zero { may_trim: bool },
    Trim,
}

/// What a slot holds. Guarded by the slot's `meta` lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    /// The block held, or `NO_BLOCK`.
    pub block: u64,
    pub state: State,
    /// Bumped on every change of the slot's bytes; a write-back marks the
    /// slot clean only if it is unchanged since the copy was taken.
    pub gen: u64,
    /// When the slot last went from clean to dirty (ms since the cache
    /// started): the write-back lag and the age trigger.
    pub dirty_since_ms: u64,
    /// Which units of the block the slot holds (bit i: unit i). A block
    /// partly written before it was ever read holds only what was written;
    /// the backing holds the newest bytes of every other unit.
    pub valid: u64,
}

/// One cache line per slot: the hit path touches a slot's lock word, block,
/// state and valid mask, which then take one cache miss, never two (an
/// unaligned 56-byte slot straddles two lines most of the time), and
/// readers of neighbouring slots never share a line.
#[repr(align(64))]
pub(crate) struct Slot {
    pub meta: RwLock<Meta>,
    /// Serialises write-backs of this slot (and zero/trim of it), so an
    /// older copy can never land on the backing after a newer one.
    pub wb: Mutex<()>,
}

/// Slot allocation state: the policy plus slots not in it.
pub(super) struct Alloc {
    pub(super) policy: Policy,
    /// Slots that were used and emptied (invalidated, failed fills); their
    /// memory is committed and charged.
    pub(super) free: Vec<u32>,
    /// Slots whose memory was given back under memory pressure
    /// (reclaim.rs): neither committed nor charged, like fresh ones.
    pub(super) released: Vec<u32>,
    /// Slots `fresh_next..nslots` were never used (no memory committed).
    pub(super) fresh_next: u32,
    /// The memory budget refused a slot: reuse resident ones instead, and
    /// ask the budget again only after `budget_retry_ms`.
    budget_full: bool,
    /// When (ms since the cache started) to ask the budget again.
    budget_retry_ms: u64,
    /// The "limited by the budget" warning was logged.
    warned_full: bool,
}

/// How long a cache that the budget refused waits before asking again
/// (memory given back elsewhere, or the end of a pressure episode, lets it
/// grow again).
pub(super) const BUDGET_RETRY_MS: u64 = 1000;

/// Wakes the flusher.
#[derive(Default)]
pub(crate) struct Signal {
    pub kicked: Mutex<bool>,
    pub cv: Condvar,
}

impl Signal {
    pub fn kick(&self) {
        *self.kicked.lock() = true;
        self.cv.notify_all();
    }

    /// Waits until kicked or `timeout` passes; clears the kick.
    pub fn wait(&self, timeout: Duration) {
        let mut k = self.kicked.lock();
        if !*k {
            self.cv.wait_for(&mut k, timeout);
        }
        *k = false;
    }
}

/// The shared state of one cache (the flusher holds it too).
pub(crate) struct Inner {
    pub cfg: CacheConfig,
    pub backing: Arc<dyn Backend>,
    /// The export's size: the backing's size when the cache was created.
    pub size: u64,
    pub bs: u64,
    pub shift: u32,
    /// log2 of the unit size: the granularity of `Meta::valid`, 512 bytes
    /// or 1/64 of a block, whichever is larger.
    unit_shift: u32,
    pub nslots: u32,
    pub slots: Box<[Slot]>,
    /// Slot data: slot `s` at `s * bs`.
    pub(super) data: Region,
    pub index: Index,
    pub(super) alloc: Mutex<Alloc>,
    /// Lock-free hit counters for S3-FIFO.
    pub marks: HitMarks,
    /// Dirty slots (the flusher's work list).
    pub dirty: AtomicBitmap,
    pub dirty_count: AtomicU64,
    /// Slots holding a block.
    resident: AtomicU64,
    pub stats: Counters,
    pub health: Health,
    pub seq: SeqDetector,
    /// Where slot memory is charged (None: not charged).
    pub(super) budget: Option<Arc<MemoryBudget>>,
    /// A kept cache's memfds and dirty shadow (`keep.rs`).
    pub(crate) keep: Option<CacheKeep>,
    /// Bytes charged to `budget`, given back on drop.
    pub(super) charged: AtomicU64,
    epoch: Instant,
    /// Requests pass through it; closed by close/crash, after which every
    /// request fails.
    pub gate: Gate,
    pub flusher_signal: Signal,
    /// Flusher's last measured write-back throughput.
    pub writeback_rate: AtomicU64,
    /// When the oldest dirty block went dirty (`now_ms` clock; `u64::MAX`
    /// for none): set by the flusher's scans, lowered by `mark_dirty`. A
    /// time, not an age, so that the lag read from it keeps growing while
    /// the flusher waits on a dead backing (an age stored at the last
    /// scan froze there).
    pub oldest_dirty_ms: AtomicU64,
    /// Scans of the dirty set made by the flusher.
    pub flusher_scans: AtomicU64,
}

/// A slot claimed for a block: mapped in the index, write-locked, empty.
pub(crate) struct Claimed<'a> {
    pub slot: u32,
    pub block: u64,
    pub g: RwLockWriteGuard<'a, Meta>,
}

pub(crate) enum ClaimErr {
    /// Another thread mapped the block meanwhile: retry as a hit.
    Exists,
    /// No slot can be reused now (all dirty or busy).
    NoSlot,
}

fn closed_error() -> Error {
    Error::Io(std::io::Error::other(
        "the cache is closed (being deleted or shut down)",
    ))
}

impl Inner {
    pub fn new(
        backing: Arc<dyn Backend>,
        cfg: CacheConfig,
        budget: Option<Arc<MemoryBudget>>,
        kept: bool,
    ) -> std::io::Result<Inner> {
        let bs = cfg.block_bytes;
        let size = backing.size();
        let nblocks = size.div_ceil(bs);
        // A cache larger than its backing would only waste metadata.
        let nslots = cfg.slots().min(nblocks.max(1)) as u32;
        let unit_shift = 9.max(bs.trailing_zeros().saturating_sub(6));
        let len = (nslots as u64 * bs) as usize;
        let keep = match kept {
            true => Some(CacheKeep::create(Geometry {
                block_bytes: bs,
                unit_shift,
                slots: nslots,
                size_bytes: size,
            })?),
            false => None,
        };
        let data = match &keep {
            Some(k) => Region::shared(k.fds()[0], 0, len, false)?,
            None => Region::new(len, false)?,
        };
        Ok(Inner {
            size,
            bs,
            shift: bs.trailing_zeros(),
            unit_shift,
            nslots,
            slots: (0..nslots)
                .map(|_| Slot {
                    meta: RwLock::new(Meta {
                        block: NO_BLOCK,
                        state: State::Empty,
                        gen: 0,
                        dirty_since_ms: 0,
                        valid: 0,
                    }),
                    wb: Mutex::new(()),
                })
                .collect(),
            data,
            index: Index::new(nslots as usize, nblocks)?,
            alloc: Mutex::new(Alloc {
                policy: Policy::new(cfg.policy, nslots as usize),
                free: Vec::new(),
                released: Vec::new(),
                fresh_next: 0,
                budget_full: false,
                budget_retry_ms: 0,
                warned_full: false,
            }),
            marks: HitMarks::new(nslots as usize),
            dirty: AtomicBitmap::new(nslots as usize),
            dirty_count: AtomicU64::new(0),
            resident: AtomicU64::new(0),
            stats: Counters::default(),
            health: Health::new(
                Duration::from_millis(cfg.retry_initial_ms),
                Duration::from_millis(cfg.retry_max_ms),
            ),
            seq: SeqDetector::new(cfg.sequential_cutoff_bytes),
            budget,
            keep,
            charged: AtomicU64::new(0),
            epoch: Instant::now(),
            gate: Gate::new(),
            flusher_signal: Signal::default(),
            writeback_rate: AtomicU64::new(0),
            oldest_dirty_ms: AtomicU64::new(u64::MAX),
            flusher_scans: AtomicU64::new(0),
            backing,
            cfg,
        })
    }

    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn resident_bytes(&self) -> u64 {
        self.resident.load(Ordering::Relaxed) * self.bs
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_count.load(Ordering::Relaxed) * self.bs
    }

    /// Bytes of block `b` (the last block may be short).
    #[inline]
    pub fn blen(&self, b: u64) -> u64 {
        self.bs.min(self.size - (b << self.shift))
    }

    #[inline]
    pub fn block_of(&self, pos: u64) -> u64 {
        pos >> self.shift
    }

    #[inline]
    pub fn block_start(&self, b: u64) -> u64 {
        b << self.shift
    }

    /// Units `[u0, u1)` as a mask.
    #[inline]
    fn mask(u0: u64, u1: u64) -> u64 {
        if u1 <= u0 {
            0
        } else if u1 - u0 >= 64 {
            u64::MAX
        } else {
            ((1u64 << (u1 - u0)) - 1) << u0
        }
    }

    /// Bytes per unit of `Meta::valid`.
    pub(crate) fn unit_bytes(&self) -> u64 {
        1 << self.unit_shift
    }

    /// Every unit of block `b`.
    #[inline]
    pub(crate) fn full_mask(&self, b: u64) -> u64 {
        Self::mask(0, self.blen(b).div_ceil(1 << self.unit_shift))
    }

    /// The units of block `b` that block-relative `[from, to)` covers
    /// wholly, and those it touches at all.
    #[inline]
    pub(crate) fn unit_masks(&self, b: u64, from: u64, to: u64) -> (u64, u64) {
        let u = self.unit_shift;
        let unit = 1u64 << u;
        let touched = Self::mask(from >> u, to.div_ceil(unit));
        // The block's last unit may be short: reaching the block's end
        // covers it wholly.
        let end_unit = if to >= self.blen(b) {
            to.div_ceil(unit)
        } else {
            to >> u
        };
        (Self::mask(from.div_ceil(unit), end_unit), touched)
    }

    /// Reads the units `need` of block `b` from the backing into slot `s`
    /// (whose write lock the caller holds) and marks them valid. On error
    /// nothing is marked.
    pub(crate) fn fill_units(&self, b: u64, s: u32, g: &mut Meta, need: u64) -> Result<()> {
        let u = self.unit_shift;
        let blen = self.blen(b);
        let mut rest = need;
        while rest != 0 {
            let first = rest.trailing_zeros() as u64;
            let run = (!(rest >> first)).trailing_zeros() as u64;
            let (from, to) = (first << u, ((first + run) << u).min(blen));
            // SAFETY: the caller holds the slot's write lock; the range is
            // inside the block.
            let dst = unsafe { self.slot_bytes(s, from, to - from) };
            self.backing_read(self.block_start(b) + from, dst)?;
            rest &= !Self::mask(first, first + run);
        }
        g.valid |= need;
        Ok(())
    }

    /// Admits a request (held until it returns), or fails when closed.
    #[inline]
    pub(crate) fn enter(&self) -> Result<Pass<'_>> {
        self.gate.enter().ok_or_else(closed_error)
    }

    /// Bytes `[off, off+len)` of slot `s`. The caller holds the slot's meta
    /// lock (read for reading, write for writing) for as long as it uses
    /// the slice, and keeps `off + len <= bs`.
    ///
    /// # Safety
    /// The returned slice aliases the slot's memory; the lock discipline
    /// above is what makes the access exclusive (writes) or shared (reads).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slot_bytes(&self, s: u32, off: u64, len: u64) -> &mut [u8] {
        debug_assert!(off + len <= self.bs);
        let p = self.data.ptr((s as u64 * self.bs + off) as usize);
        std::slice::from_raw_parts_mut(p, len as usize)
    }

    /// Copies out of slot `s` under the caller's read (or write) guard.
    pub fn copy_out(&self, s: u32, off: u64, dst: &mut [u8]) {
        // SAFETY: callers hold `slots[s].meta` at least shared, so no writer
        // changes these bytes; `dst` is a separate buffer; the range is
        // within the slot (callers pass pieces of one block).
        let src = unsafe { self.slot_bytes(s, off, dst.len() as u64) };
        dst.copy_from_slice(src);
    }

    /// Copies into slot `s` under the caller's write guard.
    pub(crate) fn copy_in(&self, s: u32, off: u64, src: &[u8]) {
        // SAFETY: callers hold `slots[s].meta` exclusively, so nobody else
        // reads or writes these bytes; the range is within the slot.
        let dst = unsafe { self.slot_bytes(s, off, src.len() as u64) };
        dst.copy_from_slice(src);
    }

    pub(crate) fn zero_in(&self, s: u32, off: u64, len: u64) {
        // SAFETY: as in `copy_in`.
        unsafe { self.slot_bytes(s, off, len) }.fill(0);
    }

    // ------------------------------------------------------------ backing

    pub fn backing_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        match self.backing.read(offset, buf) {
            Ok(()) => {
                self.health.ok();
                self.stats.add(Ctr::BackingReadBytes, buf.len() as u64);
                Ok(())
            }
            Err(e) => {
                self.health.failed(Op::Read, &e);
                Err(e)
            }
        }
    }

    pub fn backing_write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let r = self.backing.write(offset, data, fua);
        self.note_backing_write(r, data.len() as u64)
    }

    /// Several backing writes kept in flight together (write-back).
    pub(crate) fn backing_write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        let bytes: usize = writes.iter().map(|w| w.1.len()).sum();
        let r = self.backing.write_many(writes);
        self.note_backing_write(r, bytes as u64)
    }

    /// The backing's health and byte count after a write of `bytes`.
    fn note_backing_write(&self, r: Result<()>, bytes: u64) -> Result<()> {
        match r {
            Ok(()) => {
                self.health.ok();
                self.stats.add(Ctr::BackingWriteBytes, bytes);
                Ok(())
            }
            Err(e) => {
                self.health.failed(Op::Write, &e);
                Err(e)
            }
        }
    }

    pub fn backing_flush(&self) -> Result<()> {
        match self.backing.flush() {
            Ok(()) => {
                self.health.ok();
                Ok(())
            }
            Err(e) => {
                self.health.failed(Op::Flush, &e);
                Err(e)
            }
        }
    }

    pub(crate) fn backing_discard(&self, offset: u64, len: u64, how: Discard) -> Result<()> {
        let caps = self.backing.capabilities();
        let r = match how {
            Discard::Zero { may_trim } if caps.can_zero => {
                self.backing.write_zeroes(offset, len, may_trim)
            }
            Discard::Trim if caps.can_trim => self.backing.trim(offset, len),
            Discard::Trim if caps.can_zero => self.backing.write_zeroes(offset, len, true),
            _ => {
                // No native zeroing: write zeroes in bounded pieces.
                let zeroes = vec![0u8; len.min(1 << 20) as usize];
                let mut pos = offset;
                let end = offset + len;
                let mut r = Ok(());
                while pos < end && r.is_ok() {
                    let n = (end - pos).min(zeroes.len() as u64);
                    r = self.backing.write(pos, &zeroes[..n as usize], false);
                    pos += n;
                }
                r
            }
        };
        match r {
            Ok(()) => {
                self.health.ok();
                Ok(())
            }
            Err(e) => {
                self.health.failed(Op::Write, &e);
                Err(e)
            }
        }
    }

    // -------------------------------------------------------------- slots

    /// Charges one slot of memory to the budget.
    pub(crate) fn charge_slot(&self) -> bool {
        let Some(b) = &self.budget else {
            return true;
        };
        if b.try_reserve(self.bs) {
            self.charged.fetch_add(self.bs, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// A slot to reuse, write-locked: a free one, a never-used one, or a
    /// clean one the policy evicts.
    pub(crate) fn take_slot(&self) -> Option<(u32, RwLockWriteGuard<'_, Meta>)> {
        let mut a = self.alloc.lock();
        let mut busy = Vec::new();
        let mut found = None;
        while let Some(s) = a.free.pop() {
            // A stale reader may hold it for a moment: skip rather than wait.
            match self.slots[s as usize].meta.try_write() {
                Some(g) => {
                    found = Some((s, g));
                    break;
                }
                None => busy.push(s),
            }
        }
        a.free.extend(busy);
        if found.is_some() {
            return found;
        }
        if let Some(s) = self.uncharged_slot(&mut a) {
            // Not in the index (never used, or emptied when its memory was
            // given back); a stale lookup may still hold its lock a moment:
            // then it waits on the free list (charged now) like any other.
            match self.slots[s as usize].meta.try_write() {
                Some(g) => return Some((s, g)),
                None => a.free.push(s),
            }
        }
        self.evict_clean(&mut a)
    }

    /// The clean slot the policy evicts next, write-locked (still mapped:
    /// the caller unmaps it); None when every resident slot is dirty or
    /// busy.
    pub(super) fn evict_clean(&self, a: &mut Alloc) -> Option<(u32, RwLockWriteGuard<'_, Meta>)> {
        let mut guard = None;
        let slots = &self.slots;
        let victim = a.policy.evict(
            &self.marks,
            &mut |s| match slots[s as usize].meta.try_write() {
                Some(g) if g.state == State::Clean => {
                    guard = Some(g);
                    true
                }
                _ => false,
            },
        );
        victim.map(|s| (s, guard.expect("evict returned an accepted slot")))
    }

    /// Unmaps the block slot `s` holds (its write lock held by the
    /// caller): out of the index, meta emptied, no longer resident.
    pub(super) fn unmap_locked(&self, s: u32, g: &mut Meta) {
        self.index.remove_if(g.block, s);
        g.block = NO_BLOCK;
        g.state = State::Empty;
        g.gen += 1;
        g.valid = 0;
        self.resident.fetch_sub(1, Ordering::Relaxed);
    }

    /// A slot without memory (given back, or never used), charged to the
    /// budget now; None when there is none or the budget says no.
    fn uncharged_slot(&self, a: &mut Alloc) -> Option<u32> {
        let next = match a.released.last() {
            Some(&s) => s,
            None if a.fresh_next < self.nslots => a.fresh_next,
            None => return None,
        };
        if a.budget_full && self.now_ms() < a.budget_retry_ms {
            return None;
        }
        if !self.charge_slot() {
            a.budget_full = true;
            a.budget_retry_ms = self.now_ms() + BUDGET_RETRY_MS;
            if !a.warned_full {
                a.warned_full = true;
                tracing::warn!(
                    "cache memory limited by the daemon's memory budget to {} of {} blocks",
                    a.fresh_next as usize - a.released.len(),
                    self.nslots
                );
            }
            return None;
        }
        a.budget_full = false;
        if a.released.last() == Some(&next) {
            a.released.pop();
        } else {
            a.fresh_next += 1;
        }
        Some(next)
    }

    /// Claims a slot for block `b`: evicts what it held, maps `b` to it.
    pub(crate) fn claim(&self, b: u64) -> std::result::Result<Claimed<'_>, ClaimErr> {
        let (slot, mut g) = self.take_slot().ok_or(ClaimErr::NoSlot)?;
        if g.block != NO_BLOCK {
            debug_assert_eq!(g.state, State::Clean);
            self.unmap_locked(slot, &mut g);
            self.stats.add(Ctr::Evictions, 1);
        }
        if self.index.insert_if_absent(b, slot).is_err() {
            drop(g);
            self.alloc.lock().free.push(slot);
            return Err(ClaimErr::Exists);
        }
        if let Some(k) = &self.keep {
            k.set_clean(slot);
        }
        g.block = b;
        g.gen += 1;
        g.valid = 0;
        Ok(Claimed { slot, block: b, g })
    }

    /// A filled claim becomes resident in `state`.
    pub(crate) fn publish(&self, mut c: Claimed<'_>, state: State) {
        c.g.state = state;
        if state == State::Dirty {
            self.mark_dirty(c.slot, &mut c.g);
        }
        self.resident.fetch_add(1, Ordering::Relaxed);
        // Under the slot lock, so an invalidation cannot slip in between.
        self.alloc
            .lock()
            .policy
            .insert(c.block, c.slot, &self.marks);
    }

    /// A claim whose fill failed: unmap and free it.
    pub(crate) fn abort(&self, mut c: Claimed<'_>) {
        self.index.remove_if(c.block, c.slot);
        c.g.block = NO_BLOCK;
        c.g.state = State::Empty;
        drop(c.g);
        self.alloc.lock().free.push(c.slot);
    }

    pub(crate) fn mark_dirty(&self, s: u32, g: &mut Meta) {
        g.state = State::Dirty;
        g.dirty_since_ms = self.now_ms();
        // A block dirtied since the flusher's last scan may be the oldest
        // (the scan found none): the lag counts from it. A load first, so
        // the common case (an older block is dirty) writes nothing.
        if self.oldest_dirty_ms.load(Ordering::Relaxed) > g.dirty_since_ms {
            self.oldest_dirty_ms
                .fetch_min(g.dirty_since_ms, Ordering::Relaxed);
        }
        self.dirty.set(s as usize);
        let n = self.dirty_count.fetch_add(1, Ordering::Relaxed) + 1;
        if n * 100 >= self.nslots as u64 * self.cfg.dirty_high_percent as u64 {
            self.flusher_signal.kick();
        }
    }

    /// Marks a dirty slot clean (its data reached the backing).
    pub fn mark_clean(&self, s: u32, g: &mut Meta) {
        debug_assert_eq!(g.state, State::Dirty);
        g.state = State::Clean;
        if let Some(k) = &self.keep {
            k.set_clean(s);
        }
        self.dirty.clear(s as usize);
        self.dirty_count.fetch_sub(1, Ordering::Relaxed);
    }

    /// Before the bytes of slot `s` (holding `b`, dirty or becoming so)
    /// change in the units of `valid`: a kept cache's shadow says so
    /// (`keep.rs`).
    #[inline]
    pub(crate) fn keep_dirty(&self, s: u32, b: u64, valid: u64) {
        if let Some(k) = &self.keep {
            k.set_dirty(s, b, valid);
        }
    }

    /// Empties a resident slot whose write lock the caller holds.
    pub(crate) fn invalidate_locked(&self, s: u32, g: &mut Meta) {
        debug_assert_ne!(g.state, State::Empty);
        if g.state == State::Dirty {
            // Superseded (a zero or trim the backing did) or given up on.
            if let Some(k) = &self.keep {
                k.set_clean(s);
            }
            self.dirty.clear(s as usize);
            self.dirty_count.fetch_sub(1, Ordering::Relaxed);
        }
        self.unmap_locked(s, g);
        self.stats.add(Ctr::Invalidations, 1);
        let mut a = self.alloc.lock();
        a.policy.remove(s);
        a.free.push(s);
    }

    /// Records a hit for the policy (after the slot lock is released).
    #[inline]
    pub(crate) fn note_hit(&self, s: u32) {
        self.marks.bump(s);
        if self.cfg.policy.hit_needs_lock() {
            self.alloc.lock().policy.touch(s);
        }
    }

    /// Write-locks the slot holding block `b`, if any.
    pub(crate) fn lock_block(&self, b: u64) -> Option<(u32, RwLockWriteGuard<'_, Meta>)> {
        for _ in 0..MAX_RACE_RETRIES {
            let s = self.index.get(b)?;
            let g = self.slots[s as usize].meta.write();
            if g.block == b && g.state != State::Empty {
                return Some((s, g));
            }
        }
        None
    }

    /// Resident blocks in `[first, last]` with their slots, ascending.
    /// Looks each block up when the range is small, else scans the slots.
    pub(crate) fn resident_in(&self, first: u64, last: u64) -> Vec<(u64, u32)> {
        if last - first < self.nslots as u64 {
            (first..=last)
                .filter_map(|b| self.index.get(b).map(|s| (b, s)))
                .collect()
        } else {
            let mut v: Vec<(u64, u32)> = (0..self.nslots)
                .filter_map(|s| {
                    let b = self.slots[s as usize].meta.read().block;
                    (b != NO_BLOCK && (first..=last).contains(&b)).then_some((b, s))
                })
                .collect();
            v.sort_unstable();
            v
        }
    }

    // -------------------------------------------------------------- flush

    pub fn flush(&self) -> Result<()> {
        let _pass = self.enter()?;
        if self.cfg.mode == Mode::WriteBack {
            self.writeback_all()?;
        }
        self.backing_flush()
    }

    /// Writes back the dirty blocks that `[offset, offset+len)` touches.
    pub(crate) fn writeback_range(&self, offset: u64, len: u64) -> Result<()> {
        let (first, last) = (self.block_of(offset), self.block_of(offset + len - 1));
        let blocks: Vec<(u64, u32)> = self
            .resident_in(first, last)
            .into_iter()
            .filter(|&(_, s)| self.dirty.get(s as usize))
            .collect();
        self.writeback_blocks(&blocks).map(drop)
    }

    /// Drops every dirty block without writing it back (forced close).
    /// Returns the bytes dropped.
    pub fn drop_dirty(&self) -> u64 {
        let mut dropped = 0;
        for s in 0..self.nslots {
            if !self.dirty.get(s as usize) {
                continue;
            }
            let mut g = self.slots[s as usize].meta.write();
            if g.state == State::Dirty {
                dropped += self.blen(g.block);
                self.invalidate_locked(s, &mut g);
            }
        }
        dropped
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.release(self.charged.load(Ordering::Relaxed));
        }
    }
}
