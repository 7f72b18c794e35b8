//! The point-in-time layer: lets a reader (a snapshot push) see the whole
//! drive as it was at one instant while clients go on writing.
//!
//! [`CutLayer::begin`] makes a cut and returns a [`Cut`]. Until the `Cut`
//! drops, the first change to any chunk the reader has not read yet
//! copies that chunk's old bytes aside before it lands (copy-on-write at
//! chunk granularity); the reader takes the copy when there is one and
//! the live bytes otherwise. A chunk the reader has read is marked done
//! and costs writers nothing more.
//!
//! Invariants:
//! - Every change that completed before `begin` returned is in the cut;
//!   no change that started after it is. A change in flight across
//!   `begin` may be in it in part, as after a power cut in the middle of
//!   it (the store never tears a page; a request spanning store chunks
//!   may land in part).
//! - Per chunk, the reader's read and a writer's copy-aside exclude each
//!   other (one mutex per chunk, held only for that copy or that read),
//!   so the reader never sees a chunk half old, half new.
//! - One cut at a time per layer; the drive's size does not change while
//!   a cut is open (the control plane refuses a resize then).
//!
//! Cost: with no cut open, each change pays one relaxed atomic load. With
//! one open, the first write into each unread chunk pays a chunk read
//! (at most `chunk_bytes`) and holds that much memory until the cut ends
//! or the reader takes it; [`Cut::saved_bytes`] reports it.

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;

use super::layer::Layer;
use crate::block::backend::{Backend, Result};

/// Why a cut cannot start.
#[derive(Debug, thiserror::Error)]
pub enum CutError {
    /// Another cut (another push of the same drive) is open.
    #[error("a snapshot of this drive is already being taken; wait for it to finish")]
    Busy,
    /// A chunk size of zero or not a multiple of 4096.
    #[error("chunk size {0} is not a positive multiple of 4096")]
    BadChunk(u64),
}

/// What the reader knows of one chunk.
enum Chunk {
    /// Neither read nor changed since the cut.
    Pending,
    /// Read by the reader (or known unwritten): writers go straight on.
    Done,
    /// Changed after the cut: its bytes at the cut.
    Saved(Vec<u8>),
}

/// The state of an open cut, shared by the layer and the [`Cut`].
struct CutState {
    chunk_bytes: u64,
    size_bytes: u64,
    chunks: Vec<Mutex<Chunk>>,
    saved_bytes: AtomicU64,
}

/// A layer that can hold a point-in-time cut of the backend below it.
pub struct CutLayer {
    inner: Arc<dyn Backend>,
    /// True while a cut is open: the one load every change pays.
    active: AtomicBool,
    /// The open cut's state (None when none is open).
    state: ArcSwapOption<CutState>,
}

impl CutLayer {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        CutLayer {
            inner,
            active: AtomicBool::new(false),
            state: ArcSwapOption::empty(),
        }
    }

    /// True while a cut is open (a push is reading the drive).
    pub fn is_cut_open(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Opens a cut of the whole backend, in chunks of `chunk_bytes`.
    pub fn begin(self: &Arc<Self>, chunk_bytes: u64) -> std::result::Result<Cut, CutError> {
        if chunk_bytes == 0 || chunk_bytes % 4096 != 0 {
            return Err(CutError::BadChunk(chunk_bytes));
        }
        let size_bytes = self.inner.size();
        let n = size_bytes.div_ceil(chunk_bytes) as usize;
        let state = Arc::new(CutState {
            chunk_bytes,
            size_bytes,
            chunks: (0..n).map(|_| Mutex::new(Chunk::Pending)).collect(),
            saved_bytes: AtomicU64::new(0),
        });
        let prev = self
            .state
            .compare_and_swap(&None::<Arc<CutState>>, Some(state.clone()));
        if prev.is_some() {
            return Err(CutError::Busy);
        }
        // SeqCst: a change that loads `false` after this store cannot
        // exist; one that loaded `false` before it was in flight at the cut.
        self.active.store(true, Ordering::SeqCst);
        Ok(Cut {
            layer: self.clone(),
            state,
        })
    }

    /// Before a change of `[offset, offset+len)`: copies aside every chunk
    /// in it the reader has not read yet.
    fn before_change(&self, offset: u64, len: u64) -> Result<()> {
        if !self.active.load(Ordering::SeqCst) || len == 0 {
            return Ok(());
        }
        let Some(state) = self.state.load_full() else {
            return Ok(());
        };
        let end = offset.saturating_add(len).min(state.size_bytes);
        if offset >= end {
            return Ok(());
        }
        let first = offset / state.chunk_bytes;
        let last = (end - 1) / state.chunk_bytes;
        for ci in first..=last {
            let mut chunk = state.chunks[ci as usize].lock();
            if matches!(*chunk, Chunk::Pending) {
                let (at, n) = state.range(ci);
                let mut old = vec![0u8; n as usize];
                self.inner.read(at, &mut old)?;
                state.saved_bytes.fetch_add(n, Ordering::Relaxed);
                *chunk = Chunk::Saved(old);
            }
        }
        Ok(())
    }
}

impl CutState {
    /// Offset and length of chunk `ci` (the last may be short).
    fn range(&self, ci: u64) -> (u64, u64) {
        let at = ci * self.chunk_bytes;
        (at, self.chunk_bytes.min(self.size_bytes - at))
    }
}

impl Layer for CutLayer {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.before_change(offset, data.len() as u64)?;
        self.inner.write(offset, data, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()> {
        self.before_change(offset, len)?;
        self.inner.write_zeroes(offset, len, may_trim)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.before_change(offset, len)?;
        self.inner.trim(offset, len)
    }
    fn write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        for &(offset, data) in writes {
            self.before_change(offset, data.len() as u64)?;
        }
        self.inner.write_many(writes)
    }
    fn read_with(
        &self,
        offset: u64,
        len: usize,
        sink: &mut dyn FnMut(&[IoSlice<'_>]) -> std::io::Result<usize>,
    ) -> Result<usize> {
        self.inner.read_with(offset, len, sink)
    }
}

/// An open cut: reads the backend as it was when the cut was made. The
/// cut ends when this drops.
pub struct Cut {
    layer: Arc<CutLayer>,
    state: Arc<CutState>,
}

impl Cut {
    /// The drive's size at the cut.
    pub fn size_bytes(&self) -> u64 {
        self.state.size_bytes
    }

    /// The chunk size the cut tracks.
    pub fn chunk_bytes(&self) -> u64 {
        self.state.chunk_bytes
    }

    /// Bytes copied aside so far because clients changed unread chunks.
    pub fn saved_bytes(&self) -> u64 {
        self.state.saved_bytes.load(Ordering::Relaxed)
    }

    /// Reads chunk `ci` as it was at the cut into `buf` (its length is the
    /// chunk's), and marks it done: later writes to it go straight on and
    /// a copy made aside is freed.
    pub fn read_chunk(&self, ci: u64, buf: &mut [u8]) -> Result<()> {
        let (at, n) = self.state.range(ci);
        debug_assert_eq!(buf.len() as u64, n);
        let mut chunk = self.state.chunks[ci as usize].lock();
        match std::mem::replace(&mut *chunk, Chunk::Done) {
            Chunk::Saved(old) => buf.copy_from_slice(&old),
            Chunk::Done | Chunk::Pending => self.layer.inner.read(at, buf)?,
        }
        Ok(())
    }

    /// True when chunk `ci` read as holes at the cut (never written or
    /// trimmed), so a reader may skip it; marks it done then.
    pub fn chunk_is_unwritten(&self, ci: u64) -> bool {
        let (at, n) = self.state.range(ci);
        let mut chunk = self.state.chunks[ci as usize].lock();
        if !matches!(*chunk, Chunk::Pending) {
            return false;
        }
        let holes = match self.layer.inner.extents(at, n) {
            Ok(extents) => covers_holes(&extents, n),
            Err(_) => false,
        };
        if holes {
            *chunk = Chunk::Done;
        }
        holes
    }
}

/// True when `extents` cover `n` bytes, all of them holes.
fn covers_holes(extents: &[super::backend::Extent], n: u64) -> bool {
    let mut covered = 0;
    for e in extents {
        if !e.hole {
            return false;
        }
        covered += e.len;
    }
    covered >= n
}

impl Drop for Cut {
    fn drop(&mut self) {
        self.layer.active.store(false, Ordering::SeqCst);
        self.layer.state.store(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::MemBacking;

    const CHUNK: u64 = 8192;

    fn layer(size: u64) -> Arc<CutLayer> {
        Arc::new(CutLayer::new(Arc::new(MemBacking::new(size))))
    }

    fn read_all(cut: &Cut) -> Vec<u8> {
        let mut out = vec![0u8; cut.size_bytes() as usize];
        for (ci, piece) in out.chunks_mut(cut.chunk_bytes() as usize).enumerate() {
            cut.read_chunk(ci as u64, piece).unwrap();
        }
        out
    }

    #[test]
    fn reader_sees_the_cut_while_writers_go_on() {
        let l = layer(4 * CHUNK + 4096);
        let b: &dyn Backend = &*l;
        b.write(0, &[1u8; 20000], false).unwrap();
        let cut = l.begin(CHUNK).unwrap();
        let mut first = vec![0u8; CHUNK as usize];
        cut.read_chunk(0, &mut first).unwrap();
        // After the cut: a changed unread chunk, a trim, a changed read one.
        b.write(CHUNK + 5, b"new", false).unwrap();
        b.trim(2 * CHUNK, CHUNK).unwrap();
        b.write(0, b"after", false).unwrap();
        b.write_zeroes(4 * CHUNK, 4096, true).unwrap();
        assert!(cut.saved_bytes() >= CHUNK);
        let mut want = vec![0u8; (4 * CHUNK + 4096) as usize];
        want[..20000].fill(1);
        let mut got = read_all(&cut);
        got[..CHUNK as usize].copy_from_slice(&first);
        assert_eq!(got, want);
        // The live drive has every change.
        let mut live = [0u8; 5];
        b.read(0, &mut live).unwrap();
        assert_eq!(&live, b"after");
    }

    #[test]
    fn one_cut_at_a_time_and_writes_are_free_after_it() {
        let l = layer(2 * CHUNK);
        let cut = l.begin(CHUNK).unwrap();
        assert!(matches!(l.begin(CHUNK), Err(CutError::Busy)));
        assert!(matches!(l.begin(100), Err(CutError::BadChunk(100))));
        drop(cut);
        assert!(!l.is_cut_open());
        let b: &dyn Backend = &*l;
        b.write(0, b"x", false).unwrap();
        let cut = l.begin(CHUNK).unwrap();
        assert_eq!(cut.saved_bytes(), 0);
    }

    /// MemBacking reports every byte as data; this reports all-zero
    /// ranges as holes, as a RAM store reports never-written pages.
    struct Holes(Arc<MemBacking>);

    impl Layer for Holes {
        fn inner(&self) -> &dyn Backend {
            &*self.0
        }
        fn extents(&self, offset: u64, len: u64) -> Result<Vec<super::super::backend::Extent>> {
            let mut buf = vec![0u8; len as usize];
            self.0.read(offset, &mut buf)?;
            let hole = buf.iter().all(|&x| x == 0);
            Ok(vec![super::super::backend::Extent {
                len,
                hole,
                zero: hole,
            }])
        }
    }

    #[test]
    fn unwritten_chunks_are_known_and_written_ones_are_not() {
        let mem = Arc::new(MemBacking::new(3 * CHUNK));
        let l = Arc::new(CutLayer::new(Arc::new(Holes(mem))));
        let b: &dyn Backend = &*l;
        b.write(CHUNK, b"data", false).unwrap();
        let cut = l.begin(CHUNK).unwrap();
        assert!(cut.chunk_is_unwritten(0));
        assert!(!cut.chunk_is_unwritten(1));
        // Written after the cut: still unwritten as of the cut.
        b.write(2 * CHUNK, b"later", false).unwrap();
        let mut buf = vec![9u8; CHUNK as usize];
        cut.read_chunk(2, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0));
    }

    #[test]
    fn concurrent_writers_never_leak_into_the_cut() {
        let l = layer(64 * CHUNK);
        let b: Arc<dyn Backend> = l.clone();
        b.write(0, &vec![7u8; (64 * CHUNK) as usize], false)
            .unwrap();
        let cut = l.begin(CHUNK).unwrap();
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let at = ((i * 7919 + t * 104729) % (64 * CHUNK - 4096)) & !4095;
                        b.write(at, &[t as u8 + 100; 4096], false).unwrap();
                    }
                })
            })
            .collect();
        let got = read_all(&cut);
        for w in writers {
            w.join().unwrap();
        }
        assert!(got.iter().all(|&x| x == 7));
    }
}
