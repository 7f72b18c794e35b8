//! Giving the heap memory a compressed drive freed back to the OS.
//!
//! A drive's data lives in its arena's mappings (`arena.rs`), released as
//! pages are freed; its page tables and the classes' bookkeeping are heap
//! allocations (1 KiB table chunks, growing vectors). glibc keeps freed
//! chunks inside its arenas (one per thread that allocates, up to 8 per
//! core) and returns memory on its own only from the top of an arena, so
//! after a large trim the tables' memory would stay resident.
//! `malloc_trim(0)` releases the free pages inside every arena
//! (`MADV_DONTNEED`). It walks the arenas' free chunks, so it is not run on
//! the data path: the daemon's sampler calls [`return_freed_memory`] once a
//! second, and it trims only when at least [`TRIM_MIN_BYTES`] of table
//! chunks were freed since the last trim (2 GiB of a full drive trimmed).
//! (The first design kept the data itself in heap blocks: 64 MiB of a
//! 100 MiB drive stayed resident after trimming all of it, without this.)

use std::sync::atomic::{AtomicU64, Ordering};

/// Freed bytes that make a trim worth its walk.
pub const TRIM_MIN_BYTES: u64 = 4 << 20;

/// Heap bytes freed since the last trim, over every drive.
static FREED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Counts a freed heap allocation.
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
