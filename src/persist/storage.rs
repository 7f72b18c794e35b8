//! The storage a drive's state directory lives on, as a trait, so the same
//! persistence code runs on real files ([`DirStorage`]) and on the simulated
//! disk of the crash tests (`sim::SimDisk`).
//!
//! The contract follows POSIX as Linux implements it, including its sharp
//! edges, because the simulator enforces exactly these and nothing kinder:
//!
//! - `write_at` reaches stable storage only after a later `sync_data` of the
//!   same file *succeeds*. Until then a crash may keep any subset of the
//!   unsynced writes, and the last one in flight may be torn at any byte.
//! - After a `sync_data` that *fails*, the unsynced writes it covered may
//!   never become durable, even if a later `sync_data` succeeds (Linux drops
//!   the dirty pages and reports the error once). Callers must write them
//!   again.
//! - Creating, renaming and removing names become durable only after a
//!   successful `sync_dir`; a crash may keep any prefix of them.
//! - `set_len` and `punch_hole` are like writes: durable after `sync_data`.
//!
//! On real disks a state directory [`DirStorage`] creates is mode 0700 and
//! every file it creates 0600, set at creation whatever the umask: drive
//! data is private to the daemon's user (`control::persistent::modes` checks
//! existing ones at start).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A directory of named files (a drive's state directory).
pub trait Storage: Send + Sync + 'static {
    /// An open file.
    type File: StorageFile;
    /// Opens `name`, creating an empty file when `create` and it is absent.
    fn open(&self, name: &str, create: bool) -> io::Result<Self::File>;
    /// True when `name` exists.
    fn exists(&self, name: &str) -> io::Result<bool>;
    /// Atomically replaces `to` with `from`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Removes `name` (absent is not an error).
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes the directory's names durable (creates, renames, removes).
    fn sync_dir(&self) -> io::Result<()>;
    /// Where `name` lives, for messages (a path on real disks).
    fn describe(&self, name: &str) -> String;
    /// Free and total bytes of the file system holding the directory;
    /// None where unknown (then nothing is held back for the journal).
    fn space(&self) -> io::Result<Option<Space>> {
        Ok(None)
    }
}

/// Room on the file system of a state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes an unprivileged writer may still allocate.
    pub free_bytes: u64,
    /// The file system's size.
    pub total_bytes: u64,
}

/// One open file. Offsets are bytes; all methods take `&self` (positioned
/// I/O), so one handle may serve several threads.
#[allow(clippy::len_without_is_empty)]
pub trait StorageFile: Send + Sync + 'static {
    /// Reads at `offset`; returns fewer bytes than `buf` only at end of file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `data` at `offset`, extending the file if needed.
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write, `set_len` and `punch_hole` durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Truncates or extends (with zeroes, sparsely) to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes `[offset, offset+len)` read as zeroes and frees its blocks
    /// where the file system can (the length of the file is unchanged).
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Hints that the file is about to be read sequentially (readahead).
    fn advise_sequential(&self) {}

    /// Writes `parts` one after the other from `offset` (one gathered
    /// write where the system has them: no copy into a staging buffer).
    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for p in parts {
            self.write_at(p, at)?;
            at += p.len() as u64;
        }
        Ok(())
    }

    /// Starts writing `[offset, offset+len)` to the disk now, without
    /// waiting, so the disk works while the caller prepares the next bytes
    /// (a later `sync_data` still decides durability). A hint: the default
    /// does nothing.
    fn start_writeback(&self, _offset: u64, _len: u64) {}

    /// Reads exactly `buf.len()` bytes at `offset`; a short file is an
    /// `UnexpectedEof` error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("file ends before byte {}", offset + buf.len() as u64),
                ));
            }
            done += n;
        }
        Ok(())
    }
}

/// A real directory on a file system.
pub struct DirStorage {
    /// The state directory.
    dir: PathBuf,
}

impl DirStorage {
    /// Uses `dir`, creating it (and its parents) with mode 0700 when absent.
    pub fn create_dir(dir: impl AsRef<Path>) -> io::Result<DirStorage> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        Ok(DirStorage { dir })
    }

    /// Uses `dir`, which must exist.
    pub fn open_dir(dir: impl AsRef<Path>) -> io::Result<DirStorage> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("state directory {} does not exist", dir.display()),
            ));
        }
        Ok(DirStorage { dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Storage for DirStorage {
    type File = RealFile;

    fn open(&self, name: &str, create: bool) -> io::Result<RealFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .mode(0o600)
            .open(self.dir.join(name))?;
        Ok(RealFile { file })
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        self.dir.join(name).try_exists()
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        match std::fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    fn describe(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn space(&self) -> io::Result<Option<Space>> {
        let st = rustix::fs::statvfs(&self.dir)?;
        Ok(Some(Space {
            free_bytes: st.f_bavail.saturating_mul(st.f_frsize),
            total_bytes: st.f_blocks.saturating_mul(st.f_frsize),
        }))
    }
}

/// A file on a real file system.
pub struct RealFile {
    file: File,
}

impl StorageFile for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        loop {
            match self.file.read_at(buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: fallocate on a file descriptor we own, with plain integer
        // arguments; it touches no memory of ours.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // No hole punching here (some file systems): write zeroes.
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
                let zeroes = vec![0u8; (len.min(1 << 20)) as usize];
                let mut at = offset;
                while at < offset + len {
                    let n = (offset + len - at).min(zeroes.len() as u64) as usize;
                    self.file.write_all_at(&zeroes[..n], at)?;
                    at += n as u64;
                }
                Ok(())
            }
            _ => Err(err),
        }
    }

    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut done = 0usize;
        while done < total {
            // The parts not yet written (the first one possibly in part).
            let mut skip = done;
            let mut iov: Vec<io::IoSlice<'_>> = Vec::with_capacity(parts.len());
            for p in parts {
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                iov.push(io::IoSlice::new(&p[skip..]));
                skip = 0;
            }
            match rustix::io::pwritev(&self.file, &iov, offset + done as u64) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => done += n,
                Err(e) if e == rustix::io::Errno::INTR => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn start_writeback(&self, offset: u64, len: u64) {
        // SAFETY: an advisory call on our own descriptor with integer
        // arguments; no memory involved. Failure only loses the hint.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }

    fn advise_sequential(&self) {
        // SAFETY: an advisory call on our own descriptor; no memory involved.
        unsafe {
            libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL);
        }
    }
}
