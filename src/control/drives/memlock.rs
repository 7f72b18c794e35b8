//! `--lock-memory`: may the daemon lock what a drive asks for?
//!
//! A drive with `lock_memory` has its memory locked in RAM as it is
//! written (never swapped: `store::region`, `store::compressed::arena`).
//! The kernel charges `RLIMIT_MEMLOCK` for whole locked *mappings*, not for
//! the pages in them, and refuses a lock past the limit unless the process
//! has `CAP_IPC_LOCK`. So before a locked drive is created or grows, the
//! daemon adds up what its locked drives map and compares that with the
//! limit, refusing with a message that says how to raise it, instead of
//! failing later on a write.
//!
//! What a drive locks: a raw drive its size in whole pages (locked at
//! creation, ahead of any write); a compressed drive at most its promise
//! `min(size, mem_limit)`, rounded up to its locked regions (2-64 MiB,
//! `store::compressed::locked_region_bytes_for`), as its slabs need them.

use crate::size::format_size;
use crate::store::compressed::locked_region_bytes_for;
use crate::store::PAGE_BYTES;

/// Bit of `CAP_IPC_LOCK` in the capability sets.
const CAP_IPC_LOCK: u32 = 14;

/// The daemon's right to lock memory now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemlockLimit {
    /// `RLIMIT_MEMLOCK`'s soft limit (`u64::MAX`: unlimited).
    pub limit_bytes: u64,
    /// The process holds `CAP_IPC_LOCK` (the limit does not apply).
    pub cap_ipc_lock: bool,
}

impl MemlockLimit {
    /// The calling process's.
    pub fn current() -> MemlockLimit {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into `r`, which we own.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
        let limit_bytes = match (ok, r.rlim_cur) {
            (false, _) => 0,
            (true, libc::RLIM_INFINITY) => u64::MAX,
            (true, n) => n,
        };
        MemlockLimit {
            limit_bytes,
            cap_ipc_lock: has_cap_ipc_lock(),
        }
    }

    /// True when `bytes` may be locked in all.
    pub fn allows(&self, bytes: u64) -> bool {
        self.cap_ipc_lock || bytes <= self.limit_bytes
    }
}

/// Whether the effective capability set holds `CAP_IPC_LOCK`
/// (`/proc/self/status`, `CapEff`).
fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Bytes the kernel will count against `RLIMIT_MEMLOCK` for a locked drive
/// (see the module docs).
pub fn locked_bytes(size_bytes: u64, mem_limit_bytes: Option<u64>, compressed: bool) -> u64 {
    if !compressed {
        return size_bytes.next_multiple_of(PAGE_BYTES);
    }
    let promise = size_bytes.min(mem_limit_bytes.unwrap_or(u64::MAX));
    promise.next_multiple_of(locked_region_bytes_for(promise) as u64)
}

/// A locked drive that does not fit the daemon's `RLIMIT_MEMLOCK`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "drive '{name}' asks to lock {} in RAM (--lock-memory: {what}), but the daemon may lock at most {} \
     (RLIMIT_MEMLOCK, without CAP_IPC_LOCK) and its other locked drives take {}: raise the limit \
     (`ulimit -l unlimited` in the shell that starts `ramd daemon`, LimitMEMLOCK=infinity in its systemd unit), \
     give the daemon CAP_IPC_LOCK (AmbientCapabilities=CAP_IPC_LOCK), or drop --lock-memory",
    format_size(*want_bytes),
    format_limit(*limit_bytes),
    format_size(*others_bytes)
)]
pub struct MemlockTooLow {
    pub name: String,
    /// What the kernel counts for this drive, and why (for people).
    pub what: &'static str,
    pub want_bytes: u64,
    pub limit_bytes: u64,
    pub others_bytes: u64,
}

fn format_limit(bytes: u64) -> String {
    if bytes == u64::MAX {
        "unlimited".into()
    } else {
        format_size(bytes)
    }
}

/// Checks that drive `name`, locking `want` more bytes beside `others`
/// already locked by other drives, fits `limit`.
pub fn check(
    limit: MemlockLimit,
    name: &str,
    compressed: bool,
    want: u64,
    others: u64,
) -> Result<(), MemlockTooLow> {
    if limit.allows(want.saturating_add(others)) {
        return Ok(());
    }
    Err(MemlockTooLow {
        name: name.to_owned(),
        what: match compressed {
            true => {
                "its memory promise, min(size, mem-limit), in whole locked regions of its slabs"
            }
            false => "the kernel counts its whole size",
        },
        want_bytes: want,
        limit_bytes: limit.limit_bytes,
        others_bytes: others,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_drive_locks_and_the_refusal() {
        assert_eq!(locked_bytes(1, None, false), 4096);
        assert_eq!(locked_bytes(100 << 20, Some(1 << 20), false), 100 << 20);
        assert_eq!(locked_bytes(16 << 30, Some(1 << 30), true), 1 << 30);
        assert_eq!(locked_bytes(10 << 20, None, true), 10 << 20);
        assert_eq!(locked_bytes(3 << 20, None, true), 4 << 20);
        let low = MemlockLimit {
            limit_bytes: 8 << 20,
            cap_ipc_lock: false,
        };
        let e = check(low, "db", false, 64 << 20, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("asks to lock 64 MiB"), "{e}");
        assert!(e.contains("at most 8 MiB"), "{e}");
        assert!(
            e.contains("ulimit -l") && e.contains("LimitMEMLOCK="),
            "{e}"
        );
        assert!(e.contains("CAP_IPC_LOCK"), "{e}");
        let cap = MemlockLimit {
            cap_ipc_lock: true,
            ..low
        };
        check(cap, "db", false, 1 << 40, 1 << 40).unwrap();
        let big = MemlockLimit {
            limit_bytes: 128 << 20,
            cap_ipc_lock: false,
        };
        check(big, "db", true, 64 << 20, 64 << 20).unwrap();
        assert!(check(big, "db", true, 64 << 20, 65 << 20).is_err());
    }
}
