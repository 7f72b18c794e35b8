//! The bookkeeping every store's point-in-time sync cut shares: the
//! running cut's epoch, the side table of pre-cut pages writers copied
//! aside, the chunks writers without memory for a copy wait for, and the
//! budget those copies are charged to.
//!
//! A store keeps, per unit of locking (the raw store's 64 KiB chunk, the
//! compressed store's 64 KiB page group), a dirty mask and the epoch of
//! the last cut that captured it, both changed only under that unit's lock;
//! this module knows nothing of them. The protocol (drawn in `snapshot.rs`,
//! where the raw store's side of it lives, and why it is a consistent cut):
//!
//! - [`CutState::begin`] publishes a new epoch E: the cut.
//! - A writer that finds `active() == E` under a unit's exclusive lock and
//!   the unit not yet captured copies the unit's dirty pre-cut pages into
//!   the side table ([`CutState::charge`], then [`CutState::insert`]), or,
//!   without memory for the copy, releases its lock and waits
//!   ([`CutState::wait_captured`]) for the walk to capture the unit first.
//! - The walk takes units in ascending order, first the urgent ones
//!   ([`CutState::pop_urgent`]), each from memory or from the side table
//!   ([`CutState::take`]).
//! - [`CutState::end`] closes the cut and hands back what the side table
//!   still holds (pages the next cut must save).
//!
//! Bounds: one cut at a time (the store's resize lock), copies charged to
//! the daemon budget but never its last [`COPY_MARGIN_BYTES`] (kept for
//! writes that need new pages, so a running sync never makes a write fail
//! with ENOSPC), one urgent entry per waiting writer.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};

use super::budget::MemoryBudget;

/// Headroom of the daemon's memory budget that copies never use (the same
/// margin the prefaulter keeps).
pub const COPY_MARGIN_BYTES: u64 = super::prefault::MARGIN_BYTES;

/// A unit's pre-cut pages as a store copied them aside.
pub trait SideCopy {
    /// Bytes of memory the copy holds (what its charge was).
    fn charged_bytes(&self) -> u64;
}

/// The running cut's shared state (see the module docs).
pub struct CutState<C> {
    /// The running cut's epoch, 0 when none runs. Writers load it under
    /// each unit lock they take (the only cost on the data path).
    active: AtomicU32,
    /// Set when `shared.urgent` is non-empty, so the walk can check cheaply.
    urgent_flag: AtomicBool,
    /// Bytes of copies in the side table now (for stats and the budget).
    copy_bytes: AtomicU64,
    /// Everything that is not on the data path's fast path.
    shared: Mutex<Shared<C>>,
    /// Wakes writers waiting for the walk to capture their unit.
    captured_cv: Condvar,
}

struct Shared<C> {
    /// Epoch of the most recent cut (the next one is this + 1).
    last_epoch: u32,
    /// Units captured by writers, waiting for the walk to take them.
    side: BTreeMap<u64, C>,
    /// Units whose writers could not afford a copy: capture these next.
    urgent: Vec<u64>,
}

impl<C: SideCopy> Default for CutState<C> {
    fn default() -> Self {
        CutState {
            active: AtomicU32::new(0),
            urgent_flag: AtomicBool::new(false),
            copy_bytes: AtomicU64::new(0),
            shared: Mutex::new(Shared {
                last_epoch: 0,
                side: BTreeMap::new(),
                urgent: Vec::new(),
            }),
            captured_cv: Condvar::new(),
        }
    }
}

impl<C: SideCopy> CutState<C> {
    /// The running cut's epoch, 0 when none runs.
    #[inline]
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Acquire)
    }

    /// Bytes currently copied aside for the running cut.
    pub fn copy_bytes(&self) -> u64 {
        self.copy_bytes.load(Ordering::Relaxed)
    }

    /// Starts a cut: returns its epoch (1, 2, ...). The caller holds the
    /// store's resize lock, so no other cut runs.
    pub fn begin(&self) -> u32 {
        let epoch = {
            let mut sh = self.shared.lock();
            debug_assert!(sh.side.is_empty() && sh.urgent.is_empty());
            sh.last_epoch += 1;
            sh.last_epoch
        };
        self.active.store(epoch, Ordering::SeqCst);
        epoch
    }

    /// Charges a copy of `bytes` to `global`, never taking its last
    /// [`COPY_MARGIN_BYTES`]; false when there is no room (the writer then
    /// waits for the walk instead).
    pub fn charge(&self, global: &MemoryBudget, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let room = global.limit_bytes().saturating_sub(global.used_bytes());
        room >= bytes + COPY_MARGIN_BYTES && global.try_reserve(bytes)
    }

    /// Puts a writer's copy of `unit` (charged to `global`) into the side
    /// table and runs `clear` (which clears the unit's dirty mask), if cut
    /// `epoch` still runs; otherwise gives the charge back and returns
    /// false (the unit's pages stay dirty for the next cut). The copy goes
    /// in before the mask is cleared (the walk reads masks before the side
    /// table, so it always sees the unit in one of them), and both happen
    /// under the lock `end` takes: a cut that ends meanwhile, and marks
    /// its untaken copies' pages dirty again, does so after the clear, not
    /// before it (which would lose those pages' dirty bits).
    pub fn insert(
        &self,
        global: &MemoryBudget,
        epoch: u32,
        unit: u64,
        copy: C,
        clear: impl FnOnce(),
    ) -> bool {
        let bytes = copy.charged_bytes();
        let mut sh = self.shared.lock();
        if self.active() != epoch {
            drop(sh);
            global.release(bytes);
            return false;
        }
        sh.side.insert(unit, copy);
        self.copy_bytes.fetch_add(bytes, Ordering::Relaxed);
        clear();
        true
    }

    /// Asks the walk to capture `unit` next and waits until
    /// `captured()` holds or cut `epoch` ended. Called with no lock held.
    pub fn wait_captured(&self, unit: u64, epoch: u32, captured: impl Fn() -> bool) {
        let mut sh = self.shared.lock();
        sh.urgent.push(unit);
        self.urgent_flag.store(true, Ordering::Release);
        while self.active() == epoch && !captured() {
            self.captured_cv.wait(&mut sh);
        }
    }

    /// The next unit a writer waits for, if any.
    pub fn pop_urgent(&self) -> Option<u64> {
        if !self.urgent_flag.load(Ordering::Acquire) {
            return None;
        }
        let mut sh = self.shared.lock();
        let u = sh.urgent.pop();
        if sh.urgent.is_empty() {
            self.urgent_flag.store(false, Ordering::Release);
        }
        u
    }

    /// Wakes the writers waiting for a capture (after the walk took one).
    pub fn notify_captured(&self) {
        self.captured_cv.notify_all();
    }

    /// Takes the side table's copy of `unit`, releasing its charge.
    pub fn take(&self, global: &MemoryBudget, unit: u64) -> Option<C> {
        let c = self.shared.lock().side.remove(&unit)?;
        let bytes = c.charged_bytes();
        global.release(bytes);
        self.copy_bytes.fetch_sub(bytes, Ordering::Relaxed);
        Some(c)
    }

    /// The first unit at or after `from` with a copy in the side table.
    pub fn first_copy_from(&self, from: u64) -> Option<u64> {
        self.shared
            .lock()
            .side
            .range(from..)
            .next()
            .map(|(&k, _)| k)
    }

    /// Ends the running cut (under the shared lock: a writer inserts its
    /// copy only while the cut it saw is still active) and returns the
    /// copies never taken, their charges released.
    pub fn end(&self, global: &MemoryBudget) -> Vec<C> {
        let side = {
            let mut sh = self.shared.lock();
            self.active.store(0, Ordering::SeqCst);
            sh.urgent.clear();
            std::mem::take(&mut sh.side)
        };
        self.urgent_flag.store(false, Ordering::Release);
        self.captured_cv.notify_all();
        let bytes: u64 = side.values().map(|c| c.charged_bytes()).sum();
        global.release(bytes);
        self.copy_bytes.fetch_sub(bytes, Ordering::Relaxed);
        side.into_values().collect()
    }
}
