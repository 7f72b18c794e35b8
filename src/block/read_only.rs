//! The read-only layer: refuses every change to the data below it while
//! it is on, and can be switched at any time (`ramd lock`/`unlock`), taking
//! effect on open connections with their next request.
//!
//! Frontends read [`ReadOnly::is_on`] into `block::Limits` just before
//! `block::validate`, so a change is normally refused there, before any
//! backend runs, with the same errno on every frontend. The layer itself
//! refuses too: a request validated just before the switch flipped, or a
//! caller that does not go through a frontend, still cannot change data.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::layer::Layer;
use crate::block::backend::{Backend, Error, Result};

/// A switchable read-only layer over a backend.
pub struct ReadOnly {
    inner: Arc<dyn Backend>,
    /// Relaxed is enough: the switch orders nothing else, and a request
    /// racing the switch may go either way (as it would a moment apart).
    on: AtomicBool,
}

impl ReadOnly {
    pub fn new(inner: Arc<dyn Backend>, on: bool) -> Self {
        ReadOnly {
            inner,
            on: AtomicBool::new(on),
        }
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    fn check(&self) -> Result<()> {
        if self.is_on() {
            Err(Error::ReadOnly)
        } else {
            Ok(())
        }
    }
}

impl Layer for ReadOnly {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check()?;
        self.inner.write(offset, data, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()> {
        self.check()?;
        self.inner.write_zeroes(offset, len, may_trim)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check()?;
        self.inner.trim(offset, len)
    }
    fn write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        if !writes.is_empty() {
            self.check()?;
        }
        self.inner.write_many(writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::MemBacking;

    #[test]
    fn refuses_changes_only_while_on_and_forwards_the_rest() {
        let mem = Arc::new(MemBacking::new(1 << 16));
        let layer = ReadOnly::new(mem, true);
        let ro: &dyn Backend = &layer;
        assert!(matches!(ro.write(0, b"abc", false), Err(Error::ReadOnly)));
        assert!(matches!(ro.trim(0, 4096), Err(Error::ReadOnly)));
        assert!(matches!(
            ro.write_zeroes(0, 4096, true),
            Err(Error::ReadOnly)
        ));
        assert!(matches!(ro.write_many(&[(0, b"x")]), Err(Error::ReadOnly)));
        let mut buf = [1u8; 3];
        ro.read(0, &mut buf).unwrap();
        assert_eq!(buf, [0, 0, 0]);
        assert_eq!(ro.size(), 1 << 16);
        layer.set(false);
        ro.write(0, b"abc", false).unwrap();
        ro.read(0, &mut buf).unwrap();
        assert_eq!(&buf, b"abc");
        ro.flush().unwrap();
    }
}
