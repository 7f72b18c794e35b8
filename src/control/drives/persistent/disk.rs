//! [`DiskDrive`]: a persistent drive on a real disk, over the raw store or
//! a compressed one. The engine is the same (`persist::PersistentDrive`,
//! generic over `store::SyncStore`); this enum is the daemon's handle on
//! either, a fixed set of two, so the control code (status, sync, close,
//! durability, resize, the scheduler) is written once.
//!
//! NBD and FUSE never go through the enum: [`DiskDrive::backend`] hands
//! the export the engine's drive itself, so a request costs what it cost
//! before compressed drives could be persistent. Its own `Backend` impl
//! is for the daemon's direct writes (a snapshot restore filling a staged
//! drive).

use std::sync::Arc;

use crate::block::backend::{self, Backend, Caps, Extent};
use crate::persist::{
    DirStorage, Durability, PersistStatus, PersistentDrive, SyncReport, SyncScheduler,
};
use crate::store::compressed::CompressedStore;
use crate::store::RamStore;

/// A persistent drive on a real disk (see the module docs).
#[derive(Clone)]
pub enum DiskDrive {
    /// Over the raw store.
    Raw(Arc<PersistentDrive<DirStorage>>),
    /// Over a compressed store (`--compress` with `--persist`).
    Compressed(Arc<PersistentDrive<DirStorage, CompressedStore>>),
}

/// `$body` with `$d` bound to the engine's drive, whatever its store.
macro_rules! each {
    ($self:expr, $d:ident => $body:expr) => {
        match $self {
            DiskDrive::Raw($d) => $body,
            DiskDrive::Compressed($d) => $body,
        }
    };
}

impl DiskDrive {
    /// What exports serve: the engine's drive itself.
    pub fn backend(&self) -> Arc<dyn Backend> {
        each!(self, d => d.clone())
    }

    /// The raw store, for a raw drive.
    pub fn raw_store(&self) -> Option<&RamStore> {
        match self {
            DiskDrive::Raw(d) => Some(d.store()),
            DiskDrive::Compressed(_) => None,
        }
    }

    /// The compressed store, for a compressed drive.
    pub fn compressed_store(&self) -> Option<&CompressedStore> {
        match self {
            DiskDrive::Raw(_) => None,
            DiskDrive::Compressed(d) => Some(d.store()),
        }
    }

    /// The persistence status.
    pub fn status(&self) -> PersistStatus {
        each!(self, d => d.status())
    }

    /// Saves everything now and checkpoints (`ramd sync`).
    pub fn sync(&self) -> crate::persist::Result<SyncReport> {
        each!(self, d => d.sync())
    }

    /// Clean shutdown: saves everything; later syncs are refused.
    pub fn close(&self) -> crate::persist::Result<SyncReport> {
        each!(self, d => d.close())
    }

    /// Changes the durability mode.
    pub fn set_durability(&self, durability: Durability) {
        each!(self, d => d.set_durability(durability))
    }

    /// Changes the background sync interval.
    pub fn set_sync_interval_ms(&self, ms: u64) {
        each!(self, d => d.set_sync_interval_ms(ms))
    }

    /// Grows or shrinks the drive (waits for a running sync).
    pub fn resize(&self, size_bytes: u64) -> crate::persist::Result<()> {
        each!(self, d => d.resize(size_bytes))
    }

    /// Starts the drive's background sync thread.
    pub fn spawn_scheduler(&self, name: &str) -> std::io::Result<SyncScheduler> {
        each!(self, d => SyncScheduler::spawn(d.clone(), name))
    }
}

impl Backend for DiskDrive {
    fn size(&self) -> u64 {
        each!(self, d => d.size())
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> backend::Result<()> {
        each!(self, d => d.read(offset, buf))
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> backend::Result<()> {
        each!(self, d => d.write(offset, data, fua))
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> backend::Result<()> {
        each!(self, d => d.write_zeroes(offset, len, may_trim))
    }
    fn trim(&self, offset: u64, len: u64) -> backend::Result<()> {
        each!(self, d => d.trim(offset, len))
    }
    fn flush(&self) -> backend::Result<()> {
        each!(self, d => d.flush())
    }
    fn extents(&self, offset: u64, len: u64) -> backend::Result<Vec<Extent>> {
        each!(self, d => d.extents(offset, len))
    }
    fn capabilities(&self) -> Caps {
        each!(self, d => d.capabilities())
    }
}
