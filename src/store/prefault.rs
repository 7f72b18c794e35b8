//! The prefaulter: commits pages just ahead of a sequential fill, on its own
//! thread, so that the page faults of a first write (the kernel zeroing a
//! fresh page: about 1.6 us per 4 KiB page on our 2-core VM) overlap with the
//! connection receiving data instead of adding to it.
//!
//! Bounds and invariants:
//! - It only runs when a write that committed new pages starts exactly where
//!   the previous such write ended (a sequential fill), and it commits at most
//!   `AHEAD_BYTES` beyond the end of that write. Random first writes never
//!   trigger it.
//! - Pages it commits are charged to the budgets like written pages, but it
//!   stops while either budget has less than `MARGIN_BYTES` of headroom, so
//!   it never makes a writer hit ENOSPC earlier than it would have.
//! - Its pages are marked `zeroed`: they read as zeroes (they are), report
//!   as holes in block status, and are not dirty. A write clears the mark; a
//!   trim frees them like any page.
//! - Hints are sent over a bounded channel with `try_send`: the data path
//!   never blocks on it. The thread exits when the drive is dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Weak;

use super::StoreState;

/// How far ahead of a sequential writer pages are committed.
pub const AHEAD_BYTES: u64 = 16 << 20;
/// Headroom both budgets keep before the prefaulter stops.
pub const MARGIN_BYTES: u64 = 64 << 20;

/// Handle to a drive's prefaulter thread.
pub struct Prefaulter {
    tx: SyncSender<(u64, u64)>,
    /// End of the furthest range requested so far.
    requested_until: AtomicU64,
}

impl Prefaulter {
    /// Starts the thread for the drive behind `state`.
    pub fn spawn(state: Weak<StoreState>) -> std::io::Result<Prefaulter> {
        let (tx, rx) = sync_channel::<(u64, u64)>(4);
        std::thread::Builder::new()
            .name("prefault".into())
            .spawn(move || {
                while let Ok((from, to)) = rx.recv() {
                    let Some(state) = state.upgrade() else { break };
                    state.prefault(from, to, MARGIN_BYTES);
                }
            })?;
        Ok(Prefaulter {
            tx,
            requested_until: AtomicU64::new(0),
        })
    }

    /// A sequential fill reached `end`: make sure pages up to
    /// `end + AHEAD_BYTES` are (being) committed.
    pub fn hint(&self, end: u64, size: u64) {
        let target = (end + AHEAD_BYTES).min(size);
        let until = self.requested_until.load(Ordering::Relaxed);
        // Top up in halves of the window, so a request covers 8 MiB.
        if until >= end + AHEAD_BYTES / 2 && until <= target {
            return;
        }
        // A new fill elsewhere starts its own window.
        let from = if until > end && until <= target {
            until
        } else {
            end
        };
        if from >= target {
            return;
        }
        if self.tx.try_send((from, target)).is_ok() {
            self.requested_until.store(target, Ordering::Relaxed);
        }
    }
}
