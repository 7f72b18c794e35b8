//! Layers: backends that wrap a backend, as nbdkit's filters wrap its
//! plugins (read-only, fault injection in tests, and the layers to come).
//!
//! A layer implements [`Layer`], not [`Backend`]: every `Layer` method
//! forwards to [`Layer::inner`] unless the layer overrides it, and a blanket
//! impl makes every layer a `Backend`. So a layer states only what it
//! changes, and cannot forget a method: a `Backend` method added later is
//! forwarded to the inner backend, never silently served by `Backend`'s
//! own default (which, for `read_with` or `write_many`, would lose the
//! inner backend's zero-copy or pipelined path).
//!
//! Invariant: `Layer` mirrors `Backend` method for method (checked by the
//! blanket impl below, which must name each one).

use std::io::IoSlice;

use crate::block::backend::{Backend, Caps, Extent, Result};

/// A backend that wraps another; override what the layer changes.
pub trait Layer: Send + Sync {
    /// The wrapped backend.
    fn inner(&self) -> &dyn Backend;

    fn size(&self) -> u64 {
        self.inner().size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner().read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.inner().write(offset, data, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()> {
        self.inner().write_zeroes(offset, len, may_trim)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.inner().trim(offset, len)
    }
    fn flush(&self) -> Result<()> {
        self.inner().flush()
    }
    fn write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        self.inner().write_many(writes)
    }
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.inner().extents(offset, len)
    }
    fn capabilities(&self) -> Caps {
        self.inner().capabilities()
    }
    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.inner().cache(offset, len)
    }
    fn read_with(
        &self,
        offset: u64,
        len: usize,
        sink: &mut dyn FnMut(&[IoSlice<'_>]) -> std::io::Result<usize>,
    ) -> Result<usize> {
        self.inner().read_with(offset, len, sink)
    }
}

impl<L: Layer> Backend for L {
    fn size(&self) -> u64 {
        Layer::size(self)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        Layer::read(self, offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        Layer::write(self, offset, data, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()> {
        Layer::write_zeroes(self, offset, len, may_trim)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        Layer::trim(self, offset, len)
    }
    fn flush(&self) -> Result<()> {
        Layer::flush(self)
    }
    fn write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        Layer::write_many(self, writes)
    }
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        Layer::extents(self, offset, len)
    }
    fn capabilities(&self) -> Caps {
        Layer::capabilities(self)
    }
    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        Layer::cache(self, offset, len)
    }
    fn read_with(
        &self,
        offset: u64,
        len: usize,
        sink: &mut dyn FnMut(&[IoSlice<'_>]) -> std::io::Result<usize>,
    ) -> Result<usize> {
        Layer::read_with(self, offset, len, sink)
    }
}
