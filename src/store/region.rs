//! An anonymous, lazily committed memory mapping.
//!
//! `mmap(MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)` reserves address space
//! only: the kernel commits a page on its first write fault. `release` hands
//! pages back with `MADV_DONTNEED` (RSS drops at once; the range reads as
//! zeroes afterwards).
//!
//! Huge pages: a fault never brings in a transparent huge page, so a 4 KiB
//! write commits 4 KiB and our accounting stays equal to RSS. Once every
//! page of an aligned 2 MiB range is committed, `collapse` may turn it into
//! one huge page (`MADV_COLLAPSE`, Linux 6.1): random I/O over a large,
//! full drive then misses the TLB far less (measured: ~15% less CPU per
//! request, see `huge.rs`). A later trim inside it splits it back into
//! 4 KiB pages and frees just what it covers. Mappings are 2 MiB aligned
//! for this. On a system whose THP mode is `always`, faults themselves would
//! bring huge pages, so there the mapping is marked `MADV_NOHUGEPAGE`
//! (which also rules out collapsing).
//!
//! Locked regions (`--lock-memory`, [`Region::lock_to`]): `mlock2` with
//! `MLOCK_ONFAULT` on a prefix of the mapping (the part a drive's size
//! covers), so a page is locked in RAM (never swapped) as it is faulted in
//! and nothing is committed ahead; `MADV_DONTFORK` and `MADV_DONTDUMP`
//! keep the mapping out of forked children and core dumps. The kernel
//! charges `RLIMIT_MEMLOCK` the whole locked range at `mlock2` time (its
//! `locked_vm` counts locked ranges, not faulted pages), so the daemon
//! checks that limit against a drive's size before creating it. A locked
//! range refuses `MADV_DONTNEED`: `release` unlocks the range, drops it
//! and locks it again (three calls instead of one, on trims only).
//!
//! Shared regions ([`Region::shared`]): the same over a range of a sealed
//! memfd mapped `MAP_SHARED` (a plain drive's segments: their memory
//! outlives the process, see `memfd.rs` for what shmem does differently).
//! `release` uses `MADV_REMOVE`, which punches a hole in the file (the
//! memory goes back), instead of `MADV_DONTNEED` (which would only unmap
//! the pages, the file keeping them). The region keeps no descriptor.
//!
//! The region hands out raw pointers; callers synchronise access (the store's
//! chunk locks) and keep offsets in bounds.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A mapping of `len` bytes.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    /// Bytes of the locked prefix (see the module docs); changed only by
    /// `lock_to`, which its owner serialises (the store's resize lock).
    locked_len: AtomicUsize,
    /// The mapping shows a memfd (else anonymous memory).
    shared: bool,
}

// SAFETY: the mapping is plain memory owned by this value; all access goes
// through raw pointers that callers synchronise with the store's locks.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only exposes the base pointer and madvise calls,
// which the kernel serialises itself.
unsafe impl Sync for Region {}

impl Region {
    /// Reserves `len` bytes of address space (nothing is committed),
    /// aligned to `HUGE_BYTES`. With `huge`, full 2 MiB ranges may later be
    /// collapsed into huge pages (when `collapse_possible()`).
    pub fn new(len: usize, huge: bool) -> io::Result<Region> {
        let ptr = reserve_aligned(len)?;
        if !huge || !collapse_possible() {
            // SAFETY: `ptr`/`len` is our mapping. Failure to disable THP
            // only costs accounting precision, so the result is ignored.
            unsafe { libc::madvise(ptr.cast(), len, libc::MADV_NOHUGEPAGE) };
        }
        Ok(Region {
            base: NonNull::new(ptr).expect("mmap returned null"),
            len,
            locked_len: AtomicUsize::new(0),
            shared: false,
        })
    }

    /// Maps `[offset, offset+len)` of the sealed memfd `fd` (`memfd.rs`;
    /// the file must be that long) shared, 2 MiB aligned; its holes read
    /// as zeroes and commit nothing until written. With `huge`, full
    /// ranges may be collapsed (shmem's rules, `memfd.rs`). The mapping
    /// keeps the memory alive after `fd` is closed.
    pub fn shared(fd: BorrowedFd<'_>, offset: usize, len: usize, huge: bool) -> io::Result<Region> {
        let ptr = reserve_aligned(len)?;
        // SAFETY: maps the file over the reservation we own (MAP_FIXED
        // replaces exactly our own address range); checked for MAP_FAILED.
        let raw = unsafe {
            libc::mmap(
                ptr.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE | libc::MAP_FIXED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if raw == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: the reservation is ours and unused.
            unsafe { libc::munmap(ptr.cast(), len) };
            return Err(e);
        }
        if !huge || !super::memfd::collapse_possible() {
            // SAFETY: our mapping; advisory (see `new`).
            unsafe { libc::madvise(ptr.cast(), len, libc::MADV_NOHUGEPAGE) };
        }
        Ok(Region {
            base: NonNull::new(ptr).expect("mmap returned null"),
            len,
            locked_len: AtomicUsize::new(0),
            shared: true,
        })
    }

    /// True for a mapping of a memfd.
    pub fn is_shared(&self) -> bool {
        self.shared
    }
}

/// Reserves `len` bytes of private anonymous address space aligned to
/// `HUGE_BYTES` (nothing committed).
fn reserve_aligned(len: usize) -> io::Result<*mut u8> {
    assert!(len > 0);
    let padded = len + HUGE_BYTES;
    // SAFETY: an anonymous private mapping at a kernel-chosen address; no
    // existing memory is affected. The result is checked for MAP_FAILED.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            padded,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let head = raw.cast::<u8>().align_offset(HUGE_BYTES);
    // SAFETY: `head < HUGE_BYTES`, so `ptr..ptr+len` lies inside the
    // padded mapping; the unmapped head and tail are ours and unused.
    let ptr = unsafe {
        let ptr = raw.cast::<u8>().add(head);
        if head > 0 {
            libc::munmap(raw, head);
        }
        // Never empty: head < HUGE_BYTES.
        libc::munmap(ptr.add(len).cast(), HUGE_BYTES - head);
        ptr
    };
    Ok(ptr)
}

impl Region {
    /// Makes `[0, len)` (page aligned, at most the mapping) the locked
    /// prefix: pages there are locked in RAM as they are faulted in, and
    /// the mapping is kept out of forked children and core dumps (see the
    /// module docs). Locking more fails (ENOMEM, EPERM) when
    /// `RLIMIT_MEMLOCK` does not cover it and the process lacks
    /// `CAP_IPC_LOCK`; the prefix is then as it was. Callers serialise it.
    pub fn lock_to(&self, len: usize) -> io::Result<()> {
        debug_assert!(len <= self.len && len % page_size() == 0);
        let cur = self.locked_len.load(Ordering::Acquire);
        let base = self.ptr(0).cast::<libc::c_void>();
        if len > cur {
            // SAFETY: `[cur, len)` lies inside our mapping; locking changes
            // no contents and commits nothing (MLOCK_ONFAULT).
            let rc = unsafe { libc::mlock2(self.ptr(cur).cast(), len - cur, libc::MLOCK_ONFAULT) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            if cur == 0 {
                // SAFETY: advisory flags on our own mapping; failing only
                // leaves it in forked children or core dumps.
                unsafe {
                    libc::madvise(base, self.len, libc::MADV_DONTFORK);
                    libc::madvise(base, self.len, libc::MADV_DONTDUMP);
                }
            }
        } else if len < cur {
            // SAFETY: `[len, cur)` lies inside our mapping; unlocking
            // changes no contents.
            unsafe { libc::munlock(self.ptr(len).cast(), cur - len) };
        }
        self.locked_len.store(len, Ordering::Release);
        Ok(())
    }

    /// Bytes of the locked prefix (0: not locked).
    pub fn locked_len(&self) -> usize {
        self.locked_len.load(Ordering::Acquire)
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
        let ptr = self.ptr(offset).cast::<libc::c_void>();
        // The part of the range in the locked prefix.
        let locked = self.locked_len().saturating_sub(offset).min(len);
        if locked > 0 {
            // SAFETY: the range is inside our mapping; the caller holds the
            // chunk locks, so nobody uses it. Unlocking it is what lets
            // MADV_DONTNEED drop it; it is locked again at once.
            unsafe { libc::munlock(ptr, locked) };
        }
        if self.shared {
            // SAFETY: as below; MADV_REMOVE punches the range out of the
            // file, so the pages themselves (not just our view) go back.
            let rc = unsafe { libc::madvise(ptr, len, libc::MADV_REMOVE) };
            debug_assert_eq!(rc, 0, "madvise(REMOVE) failed");
        } else {
            // SAFETY: the range is inside our mapping; the caller holds the
            // chunk locks so nobody reads or writes it concurrently.
            let rc = unsafe { libc::madvise(ptr, len, libc::MADV_DONTNEED) };
            debug_assert_eq!(rc, 0, "madvise(DONTNEED) failed");
        }
        // SAFETY: as above; MLOCK_ONFAULT commits nothing. The range was
        // locked a moment ago, so the limit has room for it again.
        if locked > 0 && unsafe { libc::mlock2(ptr, locked, libc::MLOCK_ONFAULT) } != 0 {
            tracing::warn!(
                "cannot lock {locked} bytes of a locked drive again after a trim: {}; those pages may be swapped",
                io::Error::last_os_error()
            );
        }
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

    /// Commits a huge page at the start of this mapping and gives it
    /// straight back (the mapping must be at least `HUGE_BYTES`). The page
    /// allocator hands the block just freed to the next huge-page
    /// allocation, the `collapse` that follows on the same thread, and by
    /// then the host backs it: on a VM that reports free memory to its host
    /// (virtio-balloon free page reporting), a huge page that nobody touched
    /// lately is not backed, and a collapse copying into one took 4-5 ms
    /// under the process's `mmap` lock instead of ~0.5 (`huge.rs`). The
    /// backing is done here, where nothing waits for it. Advisory: where
    /// THP is off (`never`) this commits and frees 4 KiB pages, harmlessly.
    pub fn warm_huge_page(&self) {
        debug_assert!(self.len >= HUGE_BYTES);
        let ptr = self.ptr(0).cast();
        // SAFETY: the first HUGE_BYTES of our own mapping, which nothing
        // else uses (a scratch region): asking for THP, committing the
        // range and releasing it touch no other memory.
        unsafe {
            libc::madvise(ptr, HUGE_BYTES, libc::MADV_HUGEPAGE);
            libc::madvise(ptr, HUGE_BYTES, MADV_POPULATE_WRITE);
            libc::madvise(ptr, HUGE_BYTES, libc::MADV_DONTNEED);
        }
    }

    /// Turns the fully committed, `HUGE_BYTES`-aligned range at `offset`
    /// into one huge page. The caller holds the range's chunk locks and has
    /// checked that every page in it is committed (otherwise the kernel
    /// would commit the missing ones behind our accounting). Fails when the
    /// kernel cannot (too old: EINVAL; no free huge page: EAGAIN/ENOMEM).
    pub fn collapse(&self, offset: usize) -> io::Result<()> {
        debug_assert!(offset % HUGE_BYTES == 0 && offset + HUGE_BYTES <= self.len);
        // SAFETY: the range is inside our mapping; collapsing copies the
        // pages into a huge page without changing what they hold.
        let rc = unsafe { libc::madvise(self.ptr(offset).cast(), HUGE_BYTES, MADV_COLLAPSE) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Bytes of a transparent huge page (a PMD on x86-64).
pub const HUGE_BYTES: usize = 2 << 20;

/// `MADV_POPULATE_WRITE` (Linux 5.14), not in every libc crate version.
const MADV_POPULATE_WRITE: libc::c_int = 23;
/// `MADV_COLLAPSE` (Linux 6.1).
const MADV_COLLAPSE: libc::c_int = 25;

/// True unless the system's THP mode is `always` (faults would then bring
/// huge pages into a sparse drive; see the module docs). Read once.
pub fn collapse_possible() -> bool {
    static POSSIBLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *POSSIBLE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .map(|mode| !mode.contains("[always]"))
            .unwrap_or(false)
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `[ptr, ptr+len)` the kernel holds in memory (`mincore`).
    fn resident(region: &Region, len: usize) -> usize {
        let mut vec = vec![0u8; len.div_ceil(page_size())];
        // SAFETY: the range is inside the mapping and `vec` has one byte per
        // page of it, as mincore writes.
        let rc = unsafe { libc::mincore(region.ptr(0).cast(), len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// Warming commits a huge page and hands it straight back: the scratch
    /// mapping holds no memory afterwards, and reads as zeroes.
    #[test]
    fn warming_leaves_the_scratch_empty() {
        let scratch = Region::new(HUGE_BYTES, true).unwrap();
        // SAFETY: the first page is inside the mapping and nobody else uses it.
        unsafe { scratch.ptr(0).write(7) };
        assert_eq!(resident(&scratch, HUGE_BYTES), 1);
        for _ in 0..3 {
            scratch.warm_huge_page();
            assert_eq!(resident(&scratch, HUGE_BYTES), 0, "memory left committed");
        }
        // SAFETY: as above.
        assert_eq!(unsafe { scratch.ptr(0).read() }, 0);
    }
}
