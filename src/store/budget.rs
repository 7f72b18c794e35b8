//! Memory accounting: a per-drive limit and the daemon-wide budget.
//!
//! A budget is a counter of bytes in use and a limit. `try_reserve` succeeds
//! only when the new total stays within the limit, so the counter never
//! exceeds it, whatever the interleaving. Only page *allocations* and *frees*
//! touch a budget; overwrites and reads never do, so the shared counter is off
//! the hot path of an allocated drive.
//!
//! A budget also has a host cap ([`MemoryBudget::set_host_cap_bytes`]),
//! below its limit when the host has less room than the limit promises:
//! the daemon's memory-pressure watcher (`control::pressure`) sets it on
//! the daemon-wide budget every second to what is in use plus the host's
//! room above its reserve, and to what is in use while memory is short.
//! New pages then get ENOSPC before the host would swap or call the OOM
//! killer, even between two readings. Frees are always taken.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Fraction of `MemAvailable` (at daemon start) used as the default
/// daemon-wide budget. RAM drives exist to use memory, but the rest of the
/// system (page cache, the programs using the drive) must keep room.
pub const DEFAULT_BUDGET_PERCENT: u64 = 75;

/// What refused a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The budget's limit.
    Limit,
    /// The host cap (the host is short of memory, or at its reserve).
    HostCap,
}

/// A byte counter with a hard limit.
#[derive(Debug)]
pub struct MemoryBudget {
    limit_bytes: AtomicU64,
    used_bytes: AtomicU64,
    /// The host cap (`u64::MAX`: none).
    host_cap_bytes: AtomicU64,
    /// Reservations the host cap refused (the limit alone would not have).
    refused_under_pressure: AtomicU64,
    /// The watcher's last word: the host is short of memory.
    host_short: AtomicBool,
}

impl MemoryBudget {
    /// A budget of `limit_bytes` (`u64::MAX` for none).
    pub fn new(limit_bytes: u64) -> Self {
        MemoryBudget {
            limit_bytes: AtomicU64::new(limit_bytes),
            used_bytes: AtomicU64::new(0),
            host_cap_bytes: AtomicU64::new(u64::MAX),
            refused_under_pressure: AtomicU64::new(0),
            host_short: AtomicBool::new(false),
        }
    }

    /// The default daemon budget: [`DEFAULT_BUDGET_PERCENT`] of MemAvailable,
    /// or of MemTotal when MemAvailable cannot be read.
    pub fn default_daemon() -> Self {
        MemoryBudget::new(default_budget_bytes())
    }

    /// Reserves `bytes`; false (and nothing reserved) when that would pass the
    /// limit.
    #[inline]
    pub fn try_reserve(&self, bytes: u64) -> bool {
        self.reserve(bytes).is_ok()
    }

    /// Reserves `bytes`, or says what refused it (nothing reserved then).
    #[inline]
    pub fn reserve(&self, bytes: u64) -> Result<(), Refusal> {
        let limit = self.limit_bytes.load(Ordering::Relaxed);
        let cap = self.host_cap_bytes.load(Ordering::Relaxed);
        let mut capped = false;
        let ok = self
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let n = used.checked_add(bytes).filter(|&n| n <= limit)?;
                capped = n > cap;
                (!capped).then_some(n)
            })
            .is_ok();
        if capped {
            self.refused_under_pressure.fetch_add(1, Ordering::Relaxed);
        }
        match (ok, capped) {
            (true, _) => Ok(()),
            (false, true) => Err(Refusal::HostCap),
            (false, false) => Err(Refusal::Limit),
        }
    }

    /// Reserves `bytes` allowing the limit and the host cap to be passed
    /// by up to `over_bytes`: for work that takes a little memory to give
    /// back more at once (a compressed drive's recompression, which
    /// allocates a page's new object before it frees the old one).
    pub fn try_reserve_over(&self, bytes: u64, over_bytes: u64) -> bool {
        let limit = self.limit_bytes.load(Ordering::Relaxed);
        let cap = self.host_cap_bytes.load(Ordering::Relaxed);
        let most = limit.min(cap).saturating_add(over_bytes);
        self.used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= most)
            })
            .is_ok()
    }

    /// Gives back `bytes` reserved earlier.
    #[inline]
    pub fn release(&self, bytes: u64) {
        let prev = self.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(prev >= bytes, "budget released more than reserved");
    }

    /// Bytes in use.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Acquire)
    }

    /// The limit in bytes (`u64::MAX` when unlimited).
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes.load(Ordering::Relaxed)
    }

    /// Sets the host cap; see the module docs.
    pub fn set_host_cap_bytes(&self, cap: u64) {
        self.host_cap_bytes.store(cap, Ordering::Relaxed);
    }

    /// Records whether the host is short of memory (the watcher's state,
    /// with its hysteresis), for work that waits until it recovers.
    pub fn set_host_short(&self, short: bool) {
        self.host_short.store(short, Ordering::Relaxed);
    }

    /// Whether the host was short of memory at the watcher's last reading.
    pub fn host_short(&self) -> bool {
        self.host_short.load(Ordering::Relaxed)
    }

    /// What can still be reserved now: the smaller of the limit and the
    /// host cap, less what is in use.
    pub fn room_bytes(&self) -> u64 {
        self.limit_bytes()
            .min(self.host_cap_bytes())
            .saturating_sub(self.used_bytes())
    }

    /// The host cap (`u64::MAX`: none).
    pub fn host_cap_bytes(&self) -> u64 {
        self.host_cap_bytes.load(Ordering::Relaxed)
    }

    /// True when the host cap, not the limit, is what stops a reservation
    /// of `bytes` now (for the refusal's message).
    pub fn is_host_capped(&self, bytes: u64) -> bool {
        let n = self.used_bytes().saturating_add(bytes);
        n > self.host_cap_bytes() && n <= self.limit_bytes()
    }

    /// Reservations the host cap refused since the start.
    pub fn refused_under_pressure(&self) -> u64 {
        self.refused_under_pressure.load(Ordering::Relaxed)
    }

    /// Changes the limit. Memory already in use above a lowered limit stays;
    /// only new reservations are refused.
    pub fn set_limit_bytes(&self, limit: u64) {
        self.limit_bytes.store(limit, Ordering::Relaxed);
    }
}

/// Reads `MemAvailable` (falling back to `MemTotal`) from /proc/meminfo and
/// returns [`DEFAULT_BUDGET_PERCENT`] of it.
pub fn default_budget_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    let avail = field("MemAvailable:")
        .or_else(|| field("MemTotal:"))
        .unwrap_or(1 << 30);
    avail / 100 * DEFAULT_BUDGET_PERCENT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_up_to_limit() {
        let b = MemoryBudget::new(10);
        assert!(b.try_reserve(6));
        assert!(!b.try_reserve(5));
        assert!(b.try_reserve(4));
        assert_eq!(b.used_bytes(), 10);
        b.release(10);
        assert_eq!(b.used_bytes(), 0);
        assert!(!b.try_reserve(u64::MAX));
    }

    #[test]
    fn default_is_positive() {
        assert!(default_budget_bytes() > 0);
    }
}
