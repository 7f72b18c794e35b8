//! Segment memory in memfds: memory that outlives the process that maps it.
//!
//! A plain drive's memory lives in one `memfd` (a shmem file) whose 64 MiB
//! segments are mapped `MAP_SHARED | MAP_NORESERVE` (`Region::shared`, at
//! offset `index * SEGMENT_BYTES`) instead of private anonymous mappings,
//! so whoever holds a copy of the descriptor (a supervisor: issue 31)
//! keeps the pages when the serving process dies, and the next one maps
//! the same memory again (`RamStore::adopt`).
//!
//! One file per drive, not per segment: a 64 TiB sparse drive has a
//! million segments, and a descriptor each would exhaust `RLIMIT_NOFILE`
//! (and make every hand-over a million `SCM_RIGHTS` entries).
//!
//! The memfd is created with `MFD_CLOEXEC | MFD_ALLOW_SEALING`, empty, and
//! sealed with `F_SEAL_SHRINK | F_SEAL_SEAL` at once; it grows by
//! `ftruncate` when the drive gets a segment beyond its end ([`grow_to`]).
//! - SHRINK: a shrunk file under a live mapping turns accesses into
//!   SIGBUS; nobody holding the descriptor can do that to the server. A
//!   drive that shrinks frees its tail pages (holes) and keeps the file's
//!   size; growing back maps the same, empty, offsets.
//! - not GROW: drives grow.
//! - SEAL: nobody adds `F_SEAL_WRITE` later (every write fault would
//!   fail) or takes SHRINK back off.
//!
//! What the kernel does differently for shmem, measured on 6.18 (the unit
//! tests below check each):
//! - Giving pages back: `MADV_DONTNEED` on a shared mapping only unmaps
//!   the pages, the file keeps them. `MADV_REMOVE` (the same as
//!   `fallocate(PUNCH_HOLE | KEEP_SIZE)` on the range, without needing the
//!   descriptor) frees them: the memory really goes back, the range reads
//!   as zeroes, `SEEK_DATA` skips it. `Region::release` uses it. It
//!   refuses a locked range, which `release` unlocks around it already.
//! - Huge pages: shmem faults follow
//!   `/sys/kernel/mm/transparent_hugepage/shmem_enabled`, not `enabled`.
//!   With `never` or `advise` (the defaults) a fault commits 4 KiB, as
//!   for anonymous memory. With `always`, `within_size` or `force`, a
//!   fault could commit 2 MiB behind the page accounting; the mapping is
//!   marked `MADV_NOHUGEPAGE` then, which shmem honours except under
//!   `force` (and `deny` rules out collapses). `MADV_COLLAPSE` works on a
//!   shmem mapping (6.1+), even with `never`, since it ignores the sysfs
//!   mode except `deny`: a full 2 MiB range becomes one huge page in the
//!   page cache, and a hole punched into it later splits it.
//! - `mlock2(MLOCK_ONFAULT)` works on a shared mapping as on a private
//!   one; a punched hole frees locked pages too.
//! - Reading a hole through the mapping commits a page (shmem has no
//!   shared zero page for shared mappings): the store's rule that pages
//!   with a clear `allocated` bit are never read from memory matters more
//!   here, since such a page would come back allocated after an adoption.
//! - Accounting: pages are counted as `RssShmem` (and `Shmem` in
//!   /proc/meminfo), not `RssAnon`; the budgets count allocated pages
//!   either way.
//!
//! Rebuilding the allocation bitmap of an adopted segment: the pages that
//! hold data are the file's data ranges, which `lseek(SEEK_DATA /
//! SEEK_HOLE)` walks without touching them (one pair of calls per run of
//! pages; cost measured in `bench/RESULTS.md`, "restart"). A page the
//! prefaulter committed and nobody wrote is data to the file (zeroes): it
//! comes back allocated and is reported as data by block status, not as a
//! hole: only precision is lost, never bytes.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// The seals every drive memfd carries (see the module docs).
pub const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;

/// Why a memfd cannot be a segment.
#[derive(Debug, thiserror::Error)]
pub enum MemfdError {
    /// A system call failed.
    #[error("{op}: {source}")]
    Sys { op: &'static str, source: io::Error },
    /// An adopted file shorter than the drive's segments.
    #[error("a drive memfd of {found} bytes, less than the {expected} its segments need")]
    WrongSize { found: u64, expected: u64 },
    /// An adopted file without the seals.
    #[error("a drive memfd without its seals (has {found:#x}, needs {SEALS:#x})")]
    NotSealed { found: libc::c_int },
}

impl From<MemfdError> for io::Error {
    fn from(e: MemfdError) -> io::Error {
        match e {
            MemfdError::Sys { source, .. } => source,
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

fn sys(op: &'static str) -> MemfdError {
    MemfdError::Sys {
        op,
        source: io::Error::last_os_error(),
    }
}

/// A new, empty, sealed memfd for a drive (module docs).
pub fn create() -> Result<OwnedFd, MemfdError> {
    create_named(c"ramd-drive")
}

/// A new, empty, sealed memfd named `name` (in /proc/PID/fd).
pub fn create_named(name: &std::ffi::CStr) -> Result<OwnedFd, MemfdError> {
    // SAFETY: the name is NUL-terminated; the result is checked.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(sys("memfd_create"));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: fcntl with an int argument on our own descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(sys("fcntl(F_ADD_SEALS)"));
    }
    Ok(fd)
}

/// The file's size in bytes.
fn file_len(fd: BorrowedFd<'_>) -> Result<u64, MemfdError> {
    // SAFETY: `stat` is plain data and fstat writes one into it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a valid descriptor into our own struct.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(sys("fstat"));
    }
    Ok(st.st_size as u64)
}

/// Makes the file at least `len` bytes long (the new part holes).
pub fn grow_to(fd: BorrowedFd<'_>, len: usize) -> Result<(), MemfdError> {
    if file_len(fd)? < len as u64 {
        // SAFETY: ftruncate on a valid descriptor; no memory is passed.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(sys("ftruncate"));
        }
    }
    Ok(())
}

/// Checks that an adopted descriptor is a drive memfd of at least `len`
/// bytes with its seals.
pub fn check(fd: BorrowedFd<'_>, len: usize) -> Result<(), MemfdError> {
    let found = file_len(fd)?;
    if found < len as u64 {
        return Err(MemfdError::WrongSize {
            found,
            expected: len as u64,
        });
    }
    // SAFETY: fcntl without an argument on a valid descriptor.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(sys("fcntl(F_GET_SEALS)"));
    }
    if seals & SEALS != SEALS {
        return Err(MemfdError::NotSealed { found: seals });
    }
    Ok(())
}

/// 64-bit words of a memfd mapped shared (`MAP_NORESERVE`: nothing is
/// committed but what is touched), unmapped on drop; the metadata that
/// kept drives share with whoever maps the same file after them (the
/// dirty ledger, a compressed drive's meta, a cache's shadow). Only
/// touched through atomics.
pub struct SharedWords {
    ptr: NonNull<AtomicU64>,
    len: usize,
}

// SAFETY: shared memory touched only through atomics, mapped as long as
// the value lives.
unsafe impl Send for SharedWords {}
// SAFETY: as above.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Maps `words` words of `fd` from byte `offset` (page aligned); the
    /// file must be that long already (it is sealed against shrinking).
    pub fn map(fd: BorrowedFd<'_>, offset: usize, words: usize) -> io::Result<SharedWords> {
        // SAFETY: a fresh shared mapping of a range inside the file at a
        // kernel-chosen address; checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                words * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<AtomicU64>()).expect("mmap returned null");
        Ok(SharedWords { ptr, len: words })
    }

    /// The words.
    #[inline]
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is `len` words, page aligned, alive as long
        // as `self`; AtomicU64 has the size and alignment of u64.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `len` words; nothing borrows it beyond
        // `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len * 8) };
    }
}

/// The data runs of the file's first `len` bytes, as `[start, end)` byte
/// ranges in ascending order (`SEEK_DATA`/`SEEK_HOLE`).
pub fn data_runs(fd: BorrowedFd<'_>, len: usize) -> io::Result<Vec<(usize, usize)>> {
    let mut runs = Vec::new();
    let mut pos: libc::off_t = 0;
    let end = len as libc::off_t;
    while pos < end {
        // SAFETY: lseek on a valid descriptor; no memory is passed.
        let start = unsafe { libc::lseek(fd.as_raw_fd(), pos, libc::SEEK_DATA) };
        if start < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // No data after `pos`.
            }
            return Err(e);
        }
        if start >= end {
            break;
        }
        // SAFETY: as above.
        let stop = unsafe { libc::lseek(fd.as_raw_fd(), start, libc::SEEK_HOLE) };
        if stop < 0 {
            return Err(io::Error::last_os_error());
        }
        let stop = stop.min(end);
        runs.push((start as usize, stop as usize));
        pos = stop;
    }
    Ok(runs)
}

/// The system's shmem THP mode (`shmem_enabled`): the word in brackets.
pub fn shmem_thp_mode() -> &'static str {
    static MODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MODE.get_or_init(|| {
        let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
            .unwrap_or_default();
        text.split_whitespace()
            .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
            .unwrap_or("never")
            .to_owned()
    })
}

/// True when a fault in a shmem mapping may bring a huge page unasked
/// (`always`, `within_size`, `force`): the mapping is marked
/// `MADV_NOHUGEPAGE` then (module docs).
pub fn faults_may_be_huge() -> bool {
    matches!(shmem_thp_mode(), "always" | "within_size" | "force")
}

/// True when full ranges may be collapsed into huge pages (not `deny`,
/// and not a mode where `MADV_NOHUGEPAGE` is needed, which forbids it).
pub fn collapse_possible() -> bool {
    !faults_may_be_huge() && shmem_thp_mode() != "deny"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::region::{Region, HUGE_BYTES};
    use std::os::fd::AsFd;

    const LEN: usize = 4 * HUGE_BYTES;

    fn shared(huge: bool) -> (Region, OwnedFd) {
        let fd = create().unwrap();
        grow_to(fd.as_fd(), LEN).unwrap();
        (Region::shared(fd.as_fd(), 0, LEN, huge).unwrap(), fd)
    }

    fn write(r: &Region, at: usize, len: usize, byte: u8) {
        // SAFETY: inside the mapping; nobody else uses it in the test.
        unsafe { std::ptr::write_bytes(r.ptr(at), byte, len) };
    }

    /// Kilobytes of the file's pages in memory (st_blocks are 512 bytes).
    fn file_kib(fd: &OwnedFd) -> u64 {
        // SAFETY: plain data written by fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and our own struct.
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        st.st_blocks as u64 / 2
    }

    /// The seals hold: the file grows but never shrinks, nor loses its
    /// seals; `check` accepts it and refuses a short or unsealed one.
    #[test]
    fn drive_files_are_sealed_and_checked() {
        let fd = create().unwrap();
        grow_to(fd.as_fd(), LEN).unwrap();
        grow_to(fd.as_fd(), 4096).unwrap();
        check(fd.as_fd(), LEN).unwrap();
        assert!(matches!(
            check(fd.as_fd(), LEN * 2),
            Err(MemfdError::WrongSize { .. })
        ));
        // SAFETY: ftruncate on our descriptor.
        assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        // SAFETY: fcntl with an int argument on our descriptor.
        assert_ne!(
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) },
            0
        );
        // SAFETY: a fresh memfd without seals, owned at once.
        let plain = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"x".as_ptr(), 0)) };
        // SAFETY: as above.
        unsafe { libc::ftruncate(plain.as_raw_fd(), LEN as i64) };
        assert!(matches!(
            check(plain.as_fd(), LEN),
            Err(MemfdError::NotSealed { .. })
        ));
    }

    /// Writes commit 4 KiB pages of the file; a release punches them out
    /// (memory back, zeroes read, no data run left), which
    /// `MADV_DONTNEED` alone would not do on a shared mapping.
    #[test]
    fn release_punches_the_file() {
        let (r, fd) = shared(false);
        write(&r, 8192, 4096, 7);
        write(&r, HUGE_BYTES, 3 * 4096, 9);
        assert_eq!(file_kib(&fd), 16);
        assert_eq!(
            data_runs(fd.as_fd(), LEN).unwrap(),
            vec![(8192, 12288), (HUGE_BYTES, HUGE_BYTES + 3 * 4096)]
        );
        r.release(HUGE_BYTES, 4096);
        r.release(8192, 4096);
        assert_eq!(file_kib(&fd), 8);
        assert_eq!(
            data_runs(fd.as_fd(), LEN).unwrap(),
            vec![(HUGE_BYTES + 4096, HUGE_BYTES + 3 * 4096)]
        );
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { r.ptr(8192).read() }, 0);
        // Unlike anonymous memory (the shared zero page), a read fault on
        // a shmem hole commits a page: the store never reads holes.
        assert_eq!(file_kib(&fd), 12);
    }

    /// Another mapping of the same memfd (the next serving process) sees
    /// the bytes.
    #[test]
    fn a_second_mapping_sees_the_same_memory() {
        let (r, fd) = shared(false);
        write(&r, 5 * 4096, 4096, 0x5a);
        drop(r);
        let again = Region::shared(fd.as_fd(), 0, LEN, false).unwrap();
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { again.ptr(5 * 4096 + 17).read() }, 0x5a);
    }

    /// Locked shared regions: pages lock on fault, and a punched hole
    /// frees locked pages too (`release` unlocks, punches, relocks).
    #[test]
    fn locked_regions_release_too() {
        let (r, fd) = shared(false);
        if r.lock_to(LEN).is_err() {
            eprintln!("skipped: RLIMIT_MEMLOCK below {LEN} bytes");
            return;
        }
        write(&r, 0, 8 * 4096, 1);
        assert_eq!(file_kib(&fd), 32);
        r.release(0, 8 * 4096);
        assert_eq!(file_kib(&fd), 0);
        write(&r, 0, 4096, 2);
        assert_eq!(file_kib(&fd), 4);
    }

    /// A full 2 MiB range of a shmem mapping collapses into a huge page
    /// (`MADV_COLLAPSE` ignores `shmem_enabled` except `deny`); a hole
    /// punched into it afterwards frees just what it covers.
    #[test]
    fn full_ranges_collapse_on_shmem() {
        if !collapse_possible() {
            eprintln!("skipped: shmem THP mode {}", shmem_thp_mode());
            return;
        }
        let (r, fd) = shared(true);
        write(&r, 0, HUGE_BYTES, 3);
        match r.collapse(0) {
            Ok(()) => {}
            Err(e) => {
                eprintln!("skipped: MADV_COLLAPSE on shmem: {e}");
                return;
            }
        }
        r.release(4096, 4096);
        assert_eq!(file_kib(&fd), (HUGE_BYTES as u64 - 4096) / 1024);
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { (r.ptr(4096).read(), r.ptr(8192).read()) }, (0, 3));
    }
}
