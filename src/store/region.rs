//! An anonymous, lazily committed memory mapping.
//!
//! `mmap(MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)` reserves address space
//! only: the kernel commits a page on its first write fault. `release` hands
//! pages back with `MADV_DONTNEED` (RSS drops at once; the range reads as
//! zeroes afterwards). Transparent huge pages are disabled on the mapping so a
//! 4 KiB write commits 4 KiB, keeping our accounting equal to RSS, and a trim
//! never has to split a huge page.
//!
//! The region hands out raw pointers; callers synchronise access (the store's
//! chunk locks) and keep offsets in bounds.

use std::io;
use std::ptr::NonNull;

/// A mapping of `len` bytes.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; all access goes
// through raw pointers that callers synchronise with the store's locks.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only exposes the base pointer and madvise calls,
// which the kernel serialises itself.
unsafe impl Sync for Region {}

impl Region {
    /// Reserves `len` bytes of address space (nothing is committed).
    pub fn new(len: usize) -> io::Result<Region> {
        assert!(len > 0);
        // SAFETY: an anonymous private mapping at a kernel-chosen address; no
        // existing memory is affected. The result is checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ptr`/`len` is the mapping just created. Failure to disable
        // THP only costs accounting precision, so the result is ignored.
        unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
        Ok(Region {
            base: NonNull::new(ptr.cast()).expect("mmap returned null"),
            len,
        })
    }

    /// Size of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mapping (never: `new` refuses zero).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pointer to byte `offset`. The caller keeps `offset <= len`.
    #[inline]
    pub fn ptr(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.len);
        // SAFETY: offset is within the mapping (checked in debug builds and
        // guaranteed by callers), so the result stays inside the allocation.
        unsafe { self.base.as_ptr().add(offset) }
    }

    /// Returns the pages of `[offset, offset+len)` to the OS; they read as
    /// zeroes afterwards. Both must be page aligned.
    pub fn release(&self, offset: usize, len: usize) {
        debug_assert!(offset + len <= self.len);
        debug_assert!(offset % page_size() == 0 && len % page_size() == 0);
        // SAFETY: the range is inside our mapping; the caller holds the chunk
        // locks so nobody reads or writes it concurrently.
        let rc = unsafe { libc::madvise(self.ptr(offset).cast(), len, libc::MADV_DONTNEED) };
        debug_assert_eq!(rc, 0, "madvise(DONTNEED) failed");
    }

    /// Commits the pages of `[offset, offset+len)` in one call instead of one
    /// page fault per page. Advisory: on kernels without MADV_POPULATE_WRITE
    /// the pages fault in on first touch as usual.
    pub fn populate(&self, offset: usize, len: usize) {
        debug_assert!(offset + len <= self.len);
        // SAFETY: the range is inside our mapping; populating only commits
        // zero pages that are already ours and changes no contents.
        unsafe { libc::madvise(self.ptr(offset).cast(), len, MADV_POPULATE_WRITE) };
    }
}

/// `MADV_POPULATE_WRITE` (Linux 5.14), not in every libc crate version.
const MADV_POPULATE_WRITE: libc::c_int = 23;

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping we own; no references outlive `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The OS page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}
