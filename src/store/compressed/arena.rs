//! Slab blocks of a compressed drive whose memory is locked in RAM
//! (`--lock-memory`): 32 KiB blocks carved from mappings locked with
//! `mlock2(MLOCK_ONFAULT)` (`store::region`), instead of heap allocations.
//!
//! ```text
//!  regions: [locked mapping][locked mapping]...   (added as blocks are needed)
//!  blocks:   32 KiB each: handed out from `free`, else the last region's tail
//! ```
//!
//! Regions are a sixteenth of the drive's promise `min(size, mem_limit)`,
//! 2-64 MiB ([`region_bytes_for`]): few mappings for a large drive, little
//! locked address space beyond its promise for a small one.
//!
//! Why not lock heap blocks: `mlock` is per page and not counted, so
//! unlocking a freed block's pages could unlock a neighbour's, and every
//! locked range splits the heap's mapping (the kernel's map count runs out
//! long before the memory). Why one block size: a drive's blocks then never
//! need more mappings than its memory limit does (its slabs hold at most
//! the limit, and any free block fits any request), so `RLIMIT_MEMLOCK`,
//! which the kernel charges per mapping, is checked once against the limit.
//! The price, on locked drives only: every size class uses 32 KiB blocks,
//! so partly filled blocks cost more slack (up to two blocks per class per
//! shard before compaction).
//!
//! A freed block's pages go back to the OS at once (`Region::release`), so
//! the drive's resident, locked memory is what its slabs hold.

use std::io;
use std::ptr::NonNull;

use parking_lot::Mutex;

use crate::store::region::Region;

/// Bytes of every block of a locked drive.
pub const LOCKED_BLOCK_BYTES: usize = 32 << 10;
/// Bytes of the locked mappings of a drive promised `promise_bytes`
/// (see the module docs).
pub fn region_bytes_for(promise_bytes: u64) -> usize {
    let sixteenth = (promise_bytes / 16).clamp(2 << 20, 64 << 20);
    sixteenth.next_power_of_two() as usize
}

/// One block of a locked drive, owned by a slab.
pub struct LockedBlock {
    ptr: NonNull<u8>,
}

impl LockedBlock {
    /// The block's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the block is LOCKED_BLOCK_BYTES inside a mapping of the
        // arena that handed it out, which outlives every block (the store
        // drops its shards before its arena); this value is its only owner.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), LOCKED_BLOCK_BYTES) }
    }

    /// The block's bytes, to change.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), LOCKED_BLOCK_BYTES) }
    }
}

// SAFETY: a block is plain memory owned by one slab, which is only used
// under its shard's lock.
unsafe impl Send for LockedBlock {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for LockedBlock {}

#[derive(Default)]
struct Inner {
    regions: Vec<Region>,
    /// Bytes of the last region handed out so far.
    used_in_last: usize,
    /// Blocks given back (their pages released).
    free: Vec<NonNull<u8>>,
}

/// The locked blocks of one drive.
pub struct LockedArena {
    inner: Mutex<Inner>,
    /// Bytes of each mapping.
    region_bytes: usize,
}

// SAFETY: the pointers in `free` point into mappings this value owns; all
// access goes through the mutex.
unsafe impl Send for LockedArena {}
// SAFETY: as above.
unsafe impl Sync for LockedArena {}

impl LockedArena {
    /// An arena of mappings of `region_bytes` (a multiple of the block).
    pub fn new(region_bytes: usize) -> LockedArena {
        debug_assert!(region_bytes % LOCKED_BLOCK_BYTES == 0);
        LockedArena {
            inner: Mutex::default(),
            region_bytes,
        }
    }

    /// A block of zeroes. Maps and locks a new region when none is left;
    /// that fails when `RLIMIT_MEMLOCK` does not cover it.
    pub fn alloc(&self) -> io::Result<LockedBlock> {
        let mut g = self.inner.lock();
        if let Some(ptr) = g.free.pop() {
            return Ok(LockedBlock { ptr });
        }
        if g.regions.is_empty() || g.used_in_last == self.region_bytes {
            let r = Region::new(self.region_bytes, false)?;
            r.lock_to(self.region_bytes)?;
            g.regions.push(r);
            g.used_in_last = 0;
        }
        let at = g.used_in_last;
        g.used_in_last += LOCKED_BLOCK_BYTES;
        let ptr = g.regions.last().expect("a region").ptr(at);
        Ok(LockedBlock {
            ptr: NonNull::new(ptr).expect("a mapping is not at 0"),
        })
    }

    /// Takes a block back: its pages go back to the OS (they read as zero
    /// when it is handed out again).
    pub fn free(&self, block: LockedBlock) {
        let mut g = self.inner.lock();
        let p = block.ptr.as_ptr() as usize;
        let region = g.regions.iter().find(|r| {
            let base = r.ptr(0) as usize;
            (base..base + self.region_bytes).contains(&p)
        });
        let region = region.expect("a block of this arena");
        region.release(p - region.ptr(0) as usize, LOCKED_BLOCK_BYTES);
        g.free.push(block.ptr);
    }

    /// Bytes of each mapping.
    pub fn region_bytes(&self) -> usize {
        self.region_bytes
    }

    /// Bytes of locked mappings (what the kernel counts against
    /// `RLIMIT_MEMLOCK`).
    pub fn mapped_bytes(&self) -> u64 {
        (self.inner.lock().regions.len() * self.region_bytes) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_zero_reused_and_released() {
        assert_eq!(region_bytes_for(1 << 20), 2 << 20);
        assert_eq!(region_bytes_for(100 << 20), 8 << 20);
        assert_eq!(region_bytes_for(1 << 40), 64 << 20);
        let a = LockedArena::new(2 << 20);
        let mut b = match a.alloc() {
            Ok(b) => b,
            // Without CAP_IPC_LOCK and a small RLIMIT_MEMLOCK (not root).
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => return,
            Err(e) => panic!("{e}"),
        };
        assert!(b.bytes().iter().all(|&x| x == 0));
        b.bytes_mut()[100] = 7;
        let p = b.ptr;
        a.free(b);
        let again = a.alloc().unwrap();
        assert_eq!(again.ptr, p);
        assert_eq!(again.bytes()[100], 0, "released pages read as zero");
        let other = a.alloc().unwrap();
        assert_ne!(other.ptr, p);
        assert_eq!(a.mapped_bytes(), 2 << 20);
    }
}
