//! Sequential-stream detection for cache bypass (like bcache's
//! `sequential_cutoff`).
//!
//! A request continues a stream when it starts where an earlier request
//! ended (on any connection: the kernel's NBD client spreads one stream over
//! several). Streams are remembered in a small table indexed by a hash of
//! their end offset, so the check is one atomic load, and recording a stream
//! two stores, with no lock: the hit path must not serialise on it.
//!
//! Requests under `MIN_START_BYTES` that continue no stream are not
//! recorded: random 4 KiB I/O then only reads the table, and connections on
//! different CPUs do not bounce its cache lines (measured: the stores cost
//! the hit path more than everything else in it). Streaming I/O comes in
//! larger requests (readahead, `dd bs=1M`, qemu-img), which start streams.
//!
//! Concurrent updates of one entry can mix an end with another stream's
//! length; the detector is a heuristic and such a race only delays or
//! advances one bypass decision.

use std::sync::atomic::{AtomicU64, Ordering};

/// Entries in the stream table (a power of two).
const STREAMS: usize = 64;
/// Smallest request that starts a stream.
pub const MIN_START_BYTES: u64 = 16 * 1024;

/// Remembers recent I/O streams and says when one is long enough to bypass.
pub struct SeqDetector {
    /// Bypass once a stream (this request included) reaches this many bytes;
    /// 0 disables detection.
    cutoff_bytes: u64,
    /// Per entry: the stream's end offset (`u64::MAX`: empty).
    ends: Box<[AtomicU64]>,
    /// Per entry: the stream's length so far.
    lens: Box<[AtomicU64]>,
}

fn bucket(end: u64) -> usize {
    (end.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % STREAMS
}

impl SeqDetector {
    pub fn new(cutoff_bytes: u64) -> Self {
        SeqDetector {
            cutoff_bytes,
            ends: (0..STREAMS).map(|_| AtomicU64::new(u64::MAX)).collect(),
            lens: (0..STREAMS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Records a request and returns true when it should bypass the cache.
    #[inline]
    pub fn note(&self, offset: u64, len: u64) -> bool {
        if self.cutoff_bytes == 0 {
            return false;
        }
        let b = bucket(offset);
        let mut total = len;
        let continues = self.ends[b].load(Ordering::Relaxed) == offset;
        if !continues && len < MIN_START_BYTES {
            return len >= self.cutoff_bytes;
        }
        if continues {
            total = self.lens[b].load(Ordering::Relaxed).saturating_add(len);
            // The stream moves to the bucket of its new end.
            self.ends[b].store(u64::MAX, Ordering::Relaxed);
        }
        let end = offset.saturating_add(len);
        let nb = bucket(end);
        self.ends[nb].store(end, Ordering::Relaxed);
        self.lens[nb].store(total, Ordering::Relaxed);
        total >= self.cutoff_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_streams_bypass_random_io_does_not() {
        let d = SeqDetector::new(1 << 20);
        let mut bypassed = 0;
        for i in 0..64u64 {
            if d.note(i * 64 * 1024, 64 * 1024) {
                bypassed += 1;
            }
        }
        // The first 15 requests build the stream up to 1 MiB.
        assert_eq!(bypassed, 64 - 15);
        let d = SeqDetector::new(1 << 20);
        let mut x = 12345u64;
        for _ in 0..1000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            assert!(!d.note((x >> 20) / 4096 * 4096, 4096));
        }
        // A single large request bypasses on its own.
        assert!(d.note(0, 2 << 20));
        assert!(!SeqDetector::new(0).note(0, 1 << 30));
    }

    #[test]
    fn two_interleaved_streams_are_both_detected() {
        let d = SeqDetector::new(256 * 1024);
        let (mut a, mut b) = (0u64, 1 << 30);
        let mut last = (false, false);
        for _ in 0..16 {
            last.0 = d.note(a, 32 * 1024);
            last.1 = d.note(b, 32 * 1024);
            a += 32 * 1024;
            b += 32 * 1024;
        }
        assert_eq!(last, (true, true));
    }
}
