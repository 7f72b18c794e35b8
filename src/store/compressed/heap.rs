//! Giving the memory of freed slab blocks back to the OS.
//!
//! An unlocked compressed drive's blocks are heap allocations (4-32 KiB).
//! glibc keeps freed chunks inside its arenas (one per thread that
//! allocates, up to 8 per core) and returns memory on its own only from the
//! top of an arena, so after a large trim the daemon's RSS stays where it
//! was although the drive and the budgets hold nothing (measured: 64 MiB of
//! a 100 MiB drive stayed resident after trimming all of it).
//! `malloc_trim(0)` releases the free pages inside every arena
//! (`MADV_DONTNEED`). It walks the arenas' free chunks, so it is not run on
//! the data path: the daemon's sampler calls [`return_freed_memory`] once a
//! second, and it trims only when at least [`TRIM_MIN_BYTES`] of blocks
//! were freed since the last trim. Locked drives' blocks are not on the
//! heap (`arena.rs`) and are released as they are freed.

use std::sync::atomic::{AtomicU64, Ordering};

/// Freed block bytes that make a trim worth its walk.
pub const TRIM_MIN_BYTES: u64 = 4 << 20;

/// Heap block bytes freed since the last trim, over every drive.
static FREED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Counts a freed heap block.
pub fn note_freed(bytes: u64) {
    FREED_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

/// Returns freed heap memory to the OS when enough was freed since the
/// last call (see the module docs). True when it trimmed.
pub fn return_freed_memory() -> bool {
    if FREED_BYTES.load(Ordering::Relaxed) < TRIM_MIN_BYTES {
        return false;
    }
    FREED_BYTES.store(0, Ordering::Relaxed);
    trim();
    true
}

#[cfg(target_env = "gnu")]
fn trim() {
    // SAFETY: malloc_trim only releases free memory of the allocator's own
    // arenas; it takes their locks itself and touches no live allocation.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(target_env = "gnu"))]
fn trim() {}
