//! The load generators (I/O): one job per thread, each with its own
//! connection or file handle, keeping `iodepth` I/Os in flight until the
//! test's deadline, recording every completion.
//!
//! ```text
//!  nbd     a drive or cache of the daemon: one NBD connection per job over
//!          its socket (cache::backing::nbd_client's handshake), requests
//!          pipelined on a non-blocking socket with poll(2), as libnbd does
//!  uring   a file or block device: io_uring, O_DIRECT when the target
//!          allows it, `iodepth` reads/writes in flight per ring
//!  psync   the same with pread/pwrite when io_uring is not available
//!          (one I/O in flight per job; the report says so)
//!  files   a directory: small files created, written, read back, deleted
//! ```
//!
//! Every engine takes its offsets and read/write mix from [`Offsets`], so
//! a test asks the same of every target. Time is taken once per batch of
//! submissions and once per batch of completions (a batch is what one
//! system call moved), which is what a latency means at QD1 and costs one
//! clock read per batch at depth.

pub mod files;
pub mod nbd;
pub mod psync;
pub mod uring;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use super::profile::{Pattern, TestSpec};
use super::rng::Rng;

/// Why a job stopped early.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The NBD server answered an I/O with an error.
    #[error("the drive answered {command} at offset {offset} with error {errno} ({})", std::io::Error::from_raw_os_error(*errno as i32))]
    Nbd {
        command: &'static str,
        offset: u64,
        errno: u32,
    },
    /// The NBD server broke the protocol or went quiet.
    #[error("NBD connection: {0}")]
    Protocol(String),
    /// A read or write moved fewer bytes than asked (past the end?).
    #[error("{what} at offset {offset} moved {got} of {want} bytes")]
    Short {
        what: &'static str,
        offset: u64,
        got: usize,
        want: usize,
    },
}

impl EngineError {
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EngineError {
        let what = what.into();
        move |source| EngineError::Io { what, source }
    }
}

/// What one job does.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub pattern: Pattern,
    pub read_pct: u32,
    pub block_bytes: u64,
    pub iodepth: u32,
    /// Bytes from offset 0 the I/Os stay within (a multiple of
    /// `block_bytes`).
    pub region_bytes: u64,
    /// This job's index and the test's number of jobs (sequential jobs
    /// start at different places).
    pub job: u32,
    pub jobs: u32,
}

impl Workload {
    pub fn new(t: &TestSpec, region_bytes: u64, job: u32) -> Workload {
        Workload {
            pattern: t.pattern,
            read_pct: t.read_pct,
            block_bytes: t.block_bytes,
            iodepth: t.iodepth,
            region_bytes: region_bytes / t.block_bytes * t.block_bytes,
            job,
            jobs: t.jobs,
        }
    }
}

/// The next I/O's offset and direction.
#[derive(Debug, Clone)]
pub struct Offsets {
    rng: Rng,
    w: Workload,
    blocks: u64,
    next_block: u64,
}

impl Offsets {
    pub fn new(w: &Workload, seed: u64) -> Offsets {
        let blocks = (w.region_bytes / w.block_bytes).max(1);
        Offsets {
            rng: Rng::new(seed ^ (u64::from(w.job) << 32)),
            w: *w,
            blocks,
            next_block: blocks * u64::from(w.job) / u64::from(w.jobs.max(1)),
        }
    }

    /// `(offset, is_read)`.
    #[inline]
    pub fn draw(&mut self) -> (u64, bool) {
        let block = if self.w.pattern.is_random() {
            self.rng.below(self.blocks)
        } else {
            let b = self.next_block;
            self.next_block = (b + 1) % self.blocks;
            b
        };
        let read = match self.w.pattern {
            Pattern::RandRead | Pattern::SeqRead => true,
            Pattern::RandWrite | Pattern::SeqWrite => false,
            Pattern::RandRw | Pattern::Files => self.rng.percent(self.w.read_pct),
        };
        (block * self.w.block_bytes, read)
    }
}

/// When a job must stop: the test's deadline, or Ctrl-C.
#[derive(Debug, Clone, Copy)]
pub struct Until<'a> {
    pub deadline: Instant,
    pub stop: &'a AtomicBool,
}

impl Until<'_> {
    #[inline]
    pub fn reached(&self, now: Instant) -> bool {
        now >= self.deadline || self.stop.load(Ordering::Relaxed)
    }
}

/// Completions so far, read by the progress display while the job runs.
#[derive(Debug, Default)]
pub struct Live(AtomicU64);

impl Live {
    /// Only the job's own thread adds (a load and a store, no locked
    /// instruction).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0
            .store(self.0.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A buffer of `len` bytes aligned to 4096 (what O_DIRECT needs), carved
/// out of a larger vector so no unsafe allocation is needed; filled with
/// random bytes (the data written).
pub struct AlignedBuf {
    vec: Vec<u8>,
    start: usize,
    len: usize,
}

/// Alignment for O_DIRECT buffers, offsets and sizes.
pub const DIRECT_ALIGN: usize = 4096;

impl AlignedBuf {
    pub fn new(len: usize, seed: u64) -> AlignedBuf {
        let mut vec = vec![0u8; len + DIRECT_ALIGN];
        let start = vec.as_ptr().align_offset(DIRECT_ALIGN);
        Rng::new(seed).fill(&mut vec[start..start + len]);
        AlignedBuf { vec, start, len }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.vec[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.vec[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::profile::find;

    #[test]
    fn offsets_stay_in_the_region_and_follow_the_pattern() {
        let t = find("randrw-4k-qd32").unwrap();
        let w = Workload::new(&t, (1 << 20) + 100, 0);
        assert_eq!(w.region_bytes, 1 << 20);
        let mut o = Offsets::new(&w, 1);
        let mut reads = 0;
        for _ in 0..10_000 {
            let (off, read) = o.draw();
            assert!(off % 4096 == 0 && off + 4096 <= 1 << 20);
            reads += read as u32;
        }
        assert!((4_500..5_500).contains(&reads), "{reads}");

        let t = find("seqwrite-1m").unwrap();
        let w = Workload::new(&t, 4 << 20, 0);
        let mut o = Offsets::new(&w, 1);
        let offs: Vec<u64> = (0..5).map(|_| o.draw().0 >> 20).collect();
        assert_eq!(offs, [0, 1, 2, 3, 0]);
        assert!(!o.draw().1);
    }

    #[test]
    fn aligned_buffers_are_aligned_and_random() {
        let mut b = AlignedBuf::new(8192, 3);
        assert_eq!(b.as_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
        assert_eq!(b.as_mut_slice().len(), 8192);
        assert!(b.as_slice().iter().any(|&x| x != 0));
    }
}
