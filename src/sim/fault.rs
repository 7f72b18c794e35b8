//! A fault-injection layer: wraps any backend and fails the requests that
//! touch a chosen byte range with EIO, as a dying disk under a cache or a
//! bad region of a device would. Everything else is forwarded untouched
//! (it is a [`Layer`], so no method can be forgotten).

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::block::backend::{Backend, Error, Result};
use crate::block::Layer;

/// Fails data requests overlapping `bad` with EIO and counts them.
pub struct Faulty {
    inner: Arc<dyn Backend>,
    bad: Mutex<Option<Range<u64>>>,
    failed: AtomicU64,
}

impl Faulty {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Faulty {
            inner,
            bad: Mutex::new(None),
            failed: AtomicU64::new(0),
        }
    }

    /// From now on, requests touching `bad` fail (None: none do).
    pub fn set_bad(&self, bad: Option<Range<u64>>) {
        *self.bad.lock() = bad;
    }

    /// How many requests failed so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        let hit = match &*self.bad.lock() {
            Some(bad) => offset < bad.end && offset.saturating_add(len) > bad.start,
            None => false,
        };
        if hit {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Io(io::Error::from_raw_os_error(libc::EIO)));
        }
        Ok(())
    }
}

impl Layer for Faulty {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.inner.read(offset, buf)
    }
    fn read_with(
        &self,
        offset: u64,
        len: usize,
        sink: &mut dyn FnMut(&[io::IoSlice<'_>]) -> io::Result<usize>,
    ) -> Result<usize> {
        self.check(offset, len as u64)?;
        self.inner.read_with(offset, len, sink)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        self.inner.write(offset, data, fua)
    }
    fn write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        for &(offset, data) in writes {
            self.check(offset, data.len() as u64)?;
        }
        self.inner.write_many(writes)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()> {
        self.check(offset, len)?;
        self.inner.write_zeroes(offset, len, may_trim)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        self.inner.trim(offset, len)
    }
}
