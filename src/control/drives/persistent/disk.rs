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

use crate::block::backend::Backend;
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

/// Every `Backend` method reaches the engine's drive through `Layer`'s
/// forwarding, so none can be missed (this impl once forwarded eight by
/// hand and served `read_with`, `write_many` and `cache` with `Backend`'s
/// defaults instead of the drive's own).
impl crate::block::layer::Layer for DiskDrive {
    fn inner(&self) -> &dyn Backend {
        each!(self, d => d.as_ref())
    }
}

#[cfg(test)]
mod tests {
    /// The wrappers forward through `Layer` (compiled, so it cannot
    /// regress quietly into hand-written forwarding that misses a method).
    #[test]
    fn the_wrapper_backends_are_layers() {
        fn is_layer<T: crate::block::layer::Layer>() {}
        is_layer::<super::DiskDrive>();
        is_layer::<crate::store::compressed::CompressedStore>();
    }
}
