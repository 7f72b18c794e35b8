//! A [`ChunkSource`] over any block backend (a RAM drive's store, a cache),
//! so the engine can push a drive, and a [`ChunkSink`] that restores into
//! one.
//!
//! For a live drive, push a [`Cut`] (block/cut.rs): the drive as it was
//! when the cut was opened, while clients go on writing. Open the cut with
//! the push's chunk size (`PushOptions::chunk_bytes`); a push with another
//! size fails on its first read instead of reading a torn image.
//!
//! [`BackendSource`] reads the backend as it is at each read, so its image
//! is point-in-time only while the backend takes no writes during the
//! push (a locked drive). The store's own `snapshot()` hands out only the
//! pages changed since the previous sync and consumes their dirty bits,
//! which persistence relies on, so it is not a full-image source.
//!
//! Never-written space costs no read: `is_unwritten` asks the backend's
//! extents, and whole-zero runs (holes, trimmed or zeroed ranges) become
//! zero chunks without touching memory.

use crate::block::backend::Backend;
use crate::block::Cut;

use super::push::ChunkSource;
use super::restore::ChunkSink;

/// Reads a backend for a push (see the module docs for consistency).
pub struct BackendSource<'a, B: Backend + ?Sized> {
    backend: &'a B,
    size_bytes: u64,
}

impl<'a, B: Backend + ?Sized> BackendSource<'a, B> {
    /// A source of `backend`'s current size.
    pub fn new(backend: &'a B) -> Self {
        BackendSource {
            size_bytes: backend.size(),
            backend,
        }
    }
}

impl<B: Backend + ?Sized> ChunkSource for BackendSource<'_, B> {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.backend
            .read(offset, buf)
            .map_err(std::io::Error::other)
    }

    fn is_unwritten(&self, offset: u64, len: u64) -> bool {
        let Ok(extents) = self.backend.extents(offset, len) else {
            return false;
        };
        let mut covered = 0;
        for e in extents {
            if !e.zero {
                return false;
            }
            covered += e.len;
        }
        covered >= len
    }
}

/// A cut is read chunk by chunk, at the cut's chunk size.
impl ChunkSource for Cut {
    fn size_bytes(&self) -> u64 {
        Cut::size_bytes(self)
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let cb = self.chunk_bytes();
        // The cut's chunk at this offset, exactly.
        let want = cb.min(Cut::size_bytes(self).saturating_sub(offset));
        if offset % cb != 0 || buf.len() as u64 != want {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("the cut was opened with {cb}-byte chunks; push with the same chunk size"),
            ));
        }
        self.read_chunk(offset / cb, buf)
            .map_err(std::io::Error::other)
    }

    fn is_unwritten(&self, offset: u64, len: u64) -> bool {
        let cb = self.chunk_bytes();
        offset % cb == 0 && len <= cb && self.chunk_is_unwritten(offset / cb)
    }
}

/// Writes a restore into a backend (a new, empty drive of the snapshot's
/// size): zero chunks are skipped, since a new drive reads as zeroes.
pub struct BackendSink<'a, B: Backend + ?Sized>(pub &'a B);

impl<B: Backend + ?Sized> ChunkSink for BackendSink<'_, B> {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0
            .write(offset, data, false)
            .map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::snapshot::push::{push, PushOptions};
    use crate::snapshot::remote::Remote;
    use crate::snapshot::restore::{restore, RestoreOptions};
    use crate::store::{MemoryBudget, RamStore, StoreOptions};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cut_pushes_the_drive_as_it_was_while_writes_go_on() {
        use crate::block::cut::CutLayer;
        const MIB: u64 = 1 << 20;
        let layer = Arc::new(CutLayer::new(Arc::new(store(8 * MIB))));
        layer.write(0, &vec![1; 3 * MIB as usize], false).unwrap();
        let mut before = vec![0u8; 8 * MIB as usize];
        layer.read(0, &mut before).unwrap();
        let mut cut = layer.begin(MIB).unwrap();
        // After the cut: overwrite a chunk, fill a hole.
        layer.write(MIB, &vec![9; MIB as usize], false).unwrap();
        layer.write(6 * MIB, &[7; 4096], false).unwrap();
        let remote = Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "mem");
        let at_mib = PushOptions {
            chunk_bytes: MIB,
            ..PushOptions::new("live")
        };
        let rep = push(&remote, &mut cut, &at_mib, &mut |_: &_| {})
            .await
            .unwrap();
        drop(cut);
        assert_eq!((rep.chunks_zero, rep.chunks_deduped), (5, 2), "{rep:?}");
        let mut sink = crate::snapshot::restore::BufferSink(vec![0; 8 * MIB as usize]);
        let id = rep.id.unwrap();
        restore(
            &remote,
            &id,
            &mut sink,
            &RestoreOptions::default(),
            &mut |_: &_| {},
        )
        .await
        .unwrap();
        assert!(sink.0 == before, "the snapshot is not the drive at the cut");
        // A push with another chunk size than the cut's is refused.
        let mut cut = layer.begin(MIB).unwrap();
        let o = PushOptions {
            chunk_bytes: 2 * MIB,
            ..PushOptions::new("live")
        };
        let e = push(&remote, &mut cut, &o, &mut |_: &_| {})
            .await
            .unwrap_err();
        assert!(e.to_string().contains("same chunk size"), "{e}");
    }

    fn store(size: u64) -> RamStore {
        let opts = StoreOptions {
            prefault: false,
            ..StoreOptions::default()
        };
        RamStore::with_options(size, opts, Arc::new(MemoryBudget::new(u64::MAX))).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ram_drive_round_trips_and_its_holes_cost_nothing() {
        const MIB: u64 = 1 << 20;
        let drive = store(16 * MIB);
        drive.write(0, &[1; 4096], false).unwrap();
        drive.write(5 * MIB + 12345, &[2; 70_000], false).unwrap();
        drive.write(9 * MIB, &vec![3; MIB as usize], false).unwrap();
        drive.write_zeroes(9 * MIB, MIB, true).unwrap();
        let remote = Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "mem");
        let mut src = BackendSource::new(&drive);
        let rep = push(
            &remote,
            &mut src,
            &PushOptions::new("ram0"),
            &mut |_: &_| {},
        )
        .await
        .unwrap();
        // The chunks at 0 and at 5 MiB: everything else is holes.
        assert_eq!(
            (rep.chunks_uploaded, rep.chunks_zero),
            (2, rep.chunks_total - 2),
            "{rep:?}"
        );
        let copy = store(16 * MIB);
        let mut sink = BackendSink(&copy);
        let id = rep.id.unwrap();
        restore(
            &remote,
            &id,
            &mut sink,
            &RestoreOptions::default(),
            &mut |_: &_| {},
        )
        .await
        .unwrap();
        let (mut a, mut b) = (vec![0u8; 16 * MIB as usize], vec![0u8; 16 * MIB as usize]);
        drive.read(0, &mut a).unwrap();
        copy.read(0, &mut b).unwrap();
        assert!(a == b, "the restored drive differs");
    }
}
