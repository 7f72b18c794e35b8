//! A regular file or a block device as a cache backing.
//!
//! - Data: `pread`/`pwrite` at any offset from any thread (no lock).
//! - FUA and FLUSH: `fdatasync`, which on a block device also flushes the
//!   device's volatile write cache.
//! - Zero and trim: `fallocate` (ZERO_RANGE, or PUNCH_HOLE when holes are
//!   allowed; both KEEP_SIZE, and both supported on block devices since
//!   Linux 4.9), falling back to writing zeroes where the filesystem or
//!   device refuses.
//! - O_DIRECT (optional): bypasses the host page cache, which would
//!   otherwise cache the same data a second time. It needs offsets, lengths
//!   and memory aligned to the device's logical block size; aligned
//!   requests (all the cache's own block I/O) go straight through,
//!   unaligned ones are bounced through an aligned buffer, writes by
//!   read-modify-write under an exclusive lock (aligned writes take it
//!   shared, so a read-modify-write never undoes a concurrent write).
//! - A block device is opened with O_EXCL, so one that is mounted or used
//!   by another exclusive opener is refused instead of corrupted.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

use super::{all_data, PLAIN_CAPS};
use crate::block::backend::{check_range, Backend, Caps, Error, Extent, Result};

/// `BLKGETSIZE64`: a block device's size in bytes.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `BLKSSZGET`: a block device's logical sector size.
const BLKSSZGET: libc::c_ulong = 0x1268;
/// Alignment assumed for O_DIRECT on regular files (safe on every
/// filesystem Linux has).
const FILE_DIRECT_ALIGN: u64 = 4096;

/// A heap buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize, align: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(1), align.max(1))
            .expect("alignment is a power of two");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `layout.size()` initialised (zeroed)
        // bytes we own exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Why opening failed: the message plus the OS error number, kept so
/// callers can tell a missing file from a busy device (`io::Error` loses
/// the number once a message is attached).
#[derive(Debug)]
pub struct OpenFailure {
    /// The errno of the failed call, if it was a system call.
    pub errno: Option<i32>,
    text: String,
}

impl std::fmt::Display for OpenFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for OpenFailure {}

/// A file or block device backing.
pub struct FileBacking {
    file: File,
    path: PathBuf,
    size: u64,
    block_device: bool,
    /// Opened with O_DIRECT.
    direct: bool,
    /// Alignment O_DIRECT and fallocate on a block device need (1: none).
    align: u64,
    /// Unaligned O_DIRECT writes (read-modify-write) take it exclusively,
    /// aligned ones shared.
    rmw: RwLock<()>,
    /// fallocate refused PUNCH_HOLE / ZERO_RANGE here: write zeroes instead.
    no_punch: AtomicBool,
    no_zero_range: AtomicBool,
}

fn ioctl_u64(f: &File, req: libc::c_ulong) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: both requests write one integer of at most 8 bytes to the
    // pointer, which points to a live u64.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), req as _, &mut v as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

impl FileBacking {
    /// Opens an existing file or block device read-write.
    pub fn open(path: &Path, direct: bool) -> io::Result<FileBacking> {
        let ctx = |e: io::Error, what: &str| {
            let errno = e.raw_os_error();
            io::Error::new(
                e.kind(),
                OpenFailure {
                    errno,
                    text: format!("{what}: {e}"),
                },
            )
        };
        let meta = std::fs::metadata(path).map_err(|e| ctx(e, "cannot open"))?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file, a block device or an NBD URI",
            ));
        }
        let mut flags = 0;
        if direct {
            flags |= libc::O_DIRECT;
        }
        if block_device {
            flags |= libc::O_EXCL;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    ctx(
                        e,
                        "the device is in use (mounted, or opened exclusively by another program)",
                    )
                } else if e.raw_os_error() == Some(libc::EINVAL) && direct {
                    ctx(
                        e,
                        "O_DIRECT is not supported here (tmpfs?): open without direct I/O",
                    )
                } else {
                    ctx(e, "cannot open read-write")
                }
            })?;
        let (size, align) = if block_device {
            let size =
                ioctl_u64(&file, BLKGETSIZE64).map_err(|e| ctx(e, "cannot get the device size"))?;
            // BLKSSZGET writes an int: read it through a zeroed u64 (little
            // endian, so the low half holds it).
            let ssz = ioctl_u64(&file, BLKSSZGET)
                .map_err(|e| ctx(e, "cannot get the sector size"))?
                & 0xffff_ffff;
            (size, ssz.max(512))
        } else {
            (meta.len(), if direct { FILE_DIRECT_ALIGN } else { 1 })
        };
        if direct && size % align != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "O_DIRECT needs a size that is a multiple of {align} bytes (this is {size})"
                ),
            ));
        }
        Ok(FileBacking {
            file,
            path: path.to_owned(),
            size,
            block_device,
            direct,
            align,
            rmw: RwLock::new(()),
            no_punch: AtomicBool::new(false),
            no_zero_range: AtomicBool::new(false),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn aligned(&self, offset: u64, len: usize, ptr: *const u8) -> bool {
        !self.direct
            || (offset % self.align == 0
                && len as u64 % self.align == 0
                && ptr as usize % self.align as usize == 0)
    }

    /// The aligned span around `[offset, offset+len)`.
    fn span(&self, offset: u64, len: u64) -> (u64, u64) {
        let a = offset / self.align * self.align;
        let e = (offset + len).div_ceil(self.align) * self.align;
        (a, e.min(self.size.max(a)))
    }

    fn pread_all(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_inner(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.aligned(offset, data.len(), data.as_ptr()) {
            let _shared = self.direct.then(|| self.rmw.read());
            return self.file.write_all_at(data, offset);
        }
        let _excl = self.rmw.write();
        let (a, e) = self.span(offset, data.len() as u64);
        let mut b = AlignedBuf::new((e - a) as usize, self.align as usize);
        let buf = b.as_mut();
        let head = (offset - a) as usize;
        let tail_start = head + data.len();
        // Only the edge blocks hold bytes we must preserve.
        if head > 0 {
            let n = self.align as usize;
            self.pread_all(a, &mut buf[..n])?;
        }
        if tail_start < buf.len() {
            // (Re-reads the first block when the span is one block: harmless.)
            let at = buf.len() - self.align as usize;
            self.pread_all(a + at as u64, &mut buf[at..])?;
        }
        buf[head..tail_start].copy_from_slice(data);
        self.file.write_all_at(buf, a)
    }

    fn zero_by_writing(&self, offset: u64, len: u64) -> io::Result<()> {
        let chunk = len.min(1 << 20) as usize;
        let mut z = AlignedBuf::new(chunk, self.align as usize);
        let z = z.as_mut();
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let n = (end - pos).min(chunk as u64) as usize;
            self.write_inner(pos, &z[..n])?;
            pos += n as u64;
        }
        Ok(())
    }

    /// Zeroes `[offset, offset+len)` with fallocate where it can (the
    /// aligned middle), writing zeroes elsewhere.
    fn zero_range(&self, offset: u64, len: u64, punch: bool) -> io::Result<()> {
        let end = offset + len;
        let a = offset.next_multiple_of(self.align);
        let e = end / self.align * self.align;
        if a >= e {
            return self.zero_by_writing(offset, len);
        }
        let (flag, refused) = if punch {
            (libc::FALLOC_FL_PUNCH_HOLE, &self.no_punch)
        } else {
            (libc::FALLOC_FL_ZERO_RANGE, &self.no_zero_range)
        };
        let mut done = false;
        if !refused.load(Ordering::Relaxed) {
            // SAFETY: fallocate on our own open fd with a range inside the
            // file; no memory is involved.
            let rc = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    flag | libc::FALLOC_FL_KEEP_SIZE,
                    a as libc::off_t,
                    (e - a) as libc::off_t,
                )
            };
            if rc == 0 {
                done = true;
            } else {
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) | Some(libc::ENODEV) => {
                        refused.store(true, Ordering::Relaxed)
                    }
                    _ => return Err(err),
                }
            }
        }
        if !done {
            return self.zero_by_writing(offset, len);
        }
        if offset < a {
            self.zero_by_writing(offset, a - offset)?;
        }
        if e < end {
            self.zero_by_writing(e, end - e)?;
        }
        Ok(())
    }
}

impl Backend for FileBacking {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(offset, buf.len() as u64, self.size)?;
        if self.aligned(offset, buf.len(), buf.as_ptr()) {
            return Ok(self.pread_all(offset, buf)?);
        }
        let (a, e) = self.span(offset, buf.len() as u64);
        let mut b = AlignedBuf::new((e - a) as usize, self.align as usize);
        self.pread_all(a, b.as_mut())?;
        let head = (offset - a) as usize;
        buf.copy_from_slice(&b.as_mut()[head..head + buf.len()]);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        check_range(offset, data.len() as u64, self.size)?;
        self.write_inner(offset, data)?;
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()> {
        check_range(offset, len, self.size)?;
        Ok(self.zero_range(offset, len, may_trim)?)
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.size)?;
        Ok(self.zero_range(offset, len, true)?)
    }

    fn flush(&self) -> Result<()> {
        self.file.sync_data().map_err(Error::Io)
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        all_data(offset, len, self.size)
    }

    fn capabilities(&self) -> Caps {
        PLAIN_CAPS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(len: u64) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(len).unwrap();
        f
    }

    #[test]
    fn read_write_zero_trim_flush() {
        let f = temp_file(1 << 20);
        let b = FileBacking::open(f.path(), false).unwrap();
        assert_eq!(b.size(), 1 << 20);
        b.write(1000, &[7; 5000], true).unwrap();
        let mut buf = vec![0u8; 6000];
        b.read(500, &mut buf).unwrap();
        assert!(buf[..500].iter().all(|&x| x == 0));
        assert!(buf[500..5500].iter().all(|&x| x == 7));
        b.write_zeroes(2000, 10_000, false).unwrap();
        b.trim(0, 1500).unwrap();
        b.read(0, &mut buf).unwrap();
        assert!(buf[..1500].iter().all(|&x| x == 0));
        assert!(buf[1500..2000].iter().all(|&x| x == 7));
        assert!(buf[2000..].iter().all(|&x| x == 0));
        b.flush().unwrap();
        assert!(b.read(1 << 20, &mut [0u8; 1]).is_err());
        // The file really changed.
        let on_disk = std::fs::read(f.path()).unwrap();
        assert_eq!(&on_disk[1500..2000], &[7u8; 500][..]);
    }

    #[test]
    fn directories_and_devices_that_are_not_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = FileBacking::open(d.path(), false)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn unaligned_direct_io_bounces() {
        // /work is on a filesystem with O_DIRECT (tmpfs may refuse it; then
        // the open error is the clear one and the test has nothing to do).
        let dir = std::env::var("CARGO_TARGET_TMPDIR").unwrap_or_else(|_| "target".into());
        std::fs::create_dir_all(&dir).unwrap();
        let f = tempfile::NamedTempFile::new_in(&dir).unwrap();
        f.as_file().set_len(64 << 10).unwrap();
        let b = match FileBacking::open(f.path(), true) {
            Ok(b) => b,
            Err(e) => {
                assert!(e.to_string().contains("O_DIRECT"), "{e}");
                return;
            }
        };
        assert!(b.is_direct());
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        b.write(4000, &data, false).unwrap();
        b.write(20_000, &[9u8; 3], false).unwrap();
        let mut back = vec![0u8; 10_000];
        b.read(4000, &mut back).unwrap();
        assert_eq!(back, data);
        let mut around = vec![1u8; 8];
        b.read(19_998, &mut around).unwrap();
        assert_eq!(around, [0, 0, 9, 9, 9, 0, 0, 0]);
        b.write_zeroes(4001, 100, true).unwrap();
        b.read(4000, &mut back[..102]).unwrap();
        assert_eq!(back[0], data[0]);
        assert!(back[1..101].iter().all(|&x| x == 0));
        assert_eq!(back[101], data[101]);
    }
}
