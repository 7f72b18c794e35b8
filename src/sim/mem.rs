//! An in-memory backing for tests and simulations: it can fail on demand
//! and simulate a power loss.
//!
//! It models a disk with a volatile write cache: every completed write is
//! visible to reads at once (`current`), but only a FLUSH (or a FUA write,
//! modelled as write + flush) makes it durable. [`MemBacking::crash`]
//! returns what would be on the platters after a power loss: the durable
//! image plus, in order, each unflushed write applied wholly, not at all,
//! or torn (a seeded random subset of its 512-byte sectors).
//!
//! ```text
//!   write ──► current (what reads see) + pending list
//!   flush ──► durable := current, pending := []
//!   crash ──► durable + each pending write: all / none / some sectors
//! ```
//!
//! A single mutex guards everything: this is a test double, not a fast path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::block::backend::{check_range, Backend, Caps, Error, Extent, Result};
use crate::cache::backing::{all_data, PLAIN_CAPS};
use crate::sim::Rng;

/// Which calls fail with EIO while set.
#[derive(Debug, Default)]
pub struct Faults {
    pub reads: AtomicBool,
    pub writes: AtomicBool,
    pub flushes: AtomicBool,
}

impl Faults {
    /// Fails (or stops failing) every kind of call.
    pub fn set_all(&self, on: bool) {
        self.reads.store(on, Ordering::Relaxed);
        self.writes.store(on, Ordering::Relaxed);
        self.flushes.store(on, Ordering::Relaxed);
    }
}

struct State {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Writes (offset, bytes) since the last flush, oldest first. Zeroes
    /// and trims are recorded as writes of zero bytes.
    pending: Vec<(u64, Vec<u8>)>,
}

/// The in-memory backing.
pub struct MemBacking {
    state: Mutex<State>,
    /// Switch failures on and off while a test runs.
    pub faults: Faults,
    /// Calls that reached the backing (successful or not), to check that
    /// hits do not touch it.
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
}

fn eio(what: &str) -> Error {
    Error::Io(std::io::Error::other(format!(
        "injected {what} failure (EIO)"
    )))
}

impl MemBacking {
    /// A zero-filled backing of `size` bytes.
    pub fn new(size: u64) -> Self {
        MemBacking::with_contents(vec![0; size as usize])
    }

    /// A backing holding `data`, durable.
    pub fn with_contents(data: Vec<u8>) -> Self {
        MemBacking {
            state: Mutex::new(State {
                durable: data.clone(),
                current: data,
                pending: Vec::new(),
            }),
            faults: Faults::default(),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
        }
    }

    /// What reads see now.
    pub fn contents(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }

    /// What survives a power loss for sure (the last flush).
    pub fn durable(&self) -> Vec<u8> {
        self.state.lock().durable.clone()
    }

    /// Unflushed writes.
    pub fn pending_writes(&self) -> usize {
        self.state.lock().pending.len()
    }

    /// Simulates a power loss (see the module docs) and returns the image
    /// that survived; the backing then holds that image, durably.
    pub fn crash(&self, seed: u64) -> Vec<u8> {
        let mut rng = Rng::seed(seed);
        let mut s = self.state.lock();
        let mut image = s.durable.clone();
        for (off, data) in std::mem::take(&mut s.pending) {
            let off = off as usize;
            match rng.below(3) {
                0 => {}
                1 => image[off..off + data.len()].copy_from_slice(&data),
                _ => {
                    // Torn: sector by sector (sectors of the device, so
                    // aligned to absolute 512-byte boundaries).
                    let end = off + data.len();
                    let mut pos = off;
                    while pos < end {
                        let next = ((pos / 512) + 1) * 512;
                        let n = next.min(end) - pos;
                        if rng.below(2) == 1 {
                            image[pos..pos + n].copy_from_slice(&data[pos - off..pos - off + n]);
                        }
                        pos += n;
                    }
                }
            }
        }
        s.current = image.clone();
        s.durable = image.clone();
        image
    }

    fn store(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let mut s = self.state.lock();
        check_range(offset, data.len() as u64, s.current.len() as u64)?;
        if self.faults.writes.load(Ordering::Relaxed) {
            return Err(eio("write"));
        }
        let o = offset as usize;
        s.current[o..o + data.len()].copy_from_slice(&data);
        if fua {
            s.durable = s.current.clone();
            s.pending.clear();
        } else {
            s.pending.push((offset, data));
        }
        Ok(())
    }
}

impl Backend for MemBacking {
    fn size(&self) -> u64 {
        self.state.lock().current.len() as u64
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let s = self.state.lock();
        check_range(offset, buf.len() as u64, s.current.len() as u64)?;
        if self.faults.reads.load(Ordering::Relaxed) {
            return Err(eio("read"));
        }
        let o = offset as usize;
        buf.copy_from_slice(&s.current[o..o + buf.len()]);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.store(offset, data.to_vec(), fua)
    }

    fn write_zeroes(&self, offset: u64, len: u64, _may_trim: bool) -> Result<()> {
        check_range(offset, len, self.size())?;
        self.store(offset, vec![0; len as usize], false)
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.write_zeroes(offset, len, true)
    }

    fn flush(&self) -> Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        if self.faults.flushes.load(Ordering::Relaxed) {
            return Err(eio("flush"));
        }
        let mut s = self.state.lock();
        s.durable = s.current.clone();
        s.pending.clear();
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        all_data(offset, len, self.size())
    }

    fn capabilities(&self) -> Caps {
        PLAIN_CAPS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_keeps_flushed_and_tears_the_rest() {
        let b = MemBacking::new(4096);
        b.write(0, &[1; 1024], false).unwrap();
        b.flush().unwrap();
        b.write(0, &[2; 2048], false).unwrap();
        assert_eq!(b.pending_writes(), 1);
        let img = b.crash(3);
        assert!(img[..1024].iter().all(|&x| x == 1 || x == 2));
        assert!(img[1024..2048].iter().all(|&x| x == 0 || x == 2));
        // Sectors are all-or-nothing.
        for s in img.chunks(512) {
            assert!(s.iter().all(|&x| x == s[0]));
        }
        assert_eq!(b.pending_writes(), 0);
        b.faults.set_all(true);
        assert!(b.read(0, &mut [0; 1]).is_err());
        assert!(b.flush().is_err());
    }
}
