//! A cache's dirty data kept across a kill -9 of the serving process
//! (issue 31, docs/restart.md): write-back data acknowledged to clients
//! but not written back yet is the one thing a RAM cache must not lose.
//!
//! ```text
//!  data memfd     the slots' bytes (slot s at s * block_bytes), mapped shared
//!  shadow memfd   word 0 magic, 1 block bytes, 2 unit shift, 3 slots, 4 backing size
//!                 from word 512, per slot: [block + 1 | DIRTY (bit 63)] [valid units]
//! ```
//!
//! The shadow says which slots hold dirty data, of which block, in which
//! units; nothing else of the engine is kept. The next process does not
//! adopt the cache: before it opens any cache it writes every kept dirty
//! range back to the backing the blob names and flushes it
//! (`control::caches::kept`), and the cache starts cold. So no engine state
//! (index, policy, generations) has to survive, and a restart costs the
//! write-back of the dirty data (bounded by the cache's dirty limits).
//!
//! Order (the engine keeps it, under the slot's write lock):
//! - after the bytes of a slot that is or becomes dirty changed, and
//!   before the write is acknowledged, its shadow says dirty with the
//!   units it holds (the shadow's units are always a subset of the
//!   slot's valid ones). Units not dirty before are shadowed only once
//!   their bytes are in: a kill in the middle leaves them out (the
//!   backing keeps its older bytes: the write was not acknowledged);
//!   units already dirty may be caught half-written by a kill, old and
//!   new bytes of the write in flight, as on a disk;
//! - a slot is shadowed clean only after its data reached the backing (a
//!   write-back that found it unchanged) or was superseded there (a zero
//!   or trim that covers it wholly, after the backing did it);
//! - a slot is claimed for another block only when clean or empty.
//!
//! Units filled from the backing into a dirty slot are written back too:
//! they equal the backing's, so that costs bytes, never correctness.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::memfd;

/// "ramd_ck1": a kept cache of this layout.
const MAGIC: u64 = u64::from_le_bytes(*b"ramd_ck1");
const HEADER_WORDS: usize = 512;
const DIRTY: u64 = 1 << 63;

/// What a kept cache's shadow records of its geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub block_bytes: u64,
    pub unit_shift: u32,
    pub slots: u32,
    pub size_bytes: u64,
}

/// A cache's kept memory: its data memfd and its mapped shadow.
pub struct CacheKeep {
    data: OwnedFd,
    shadow_fd: OwnedFd,
    shadow: memfd::SharedWords,
}

impl CacheKeep {
    /// Fresh memfds for a cache of `g` (the data memfd sized for every
    /// slot, holes until written).
    pub fn create(g: Geometry) -> io::Result<CacheKeep> {
        let data = memfd::create_named(c"ramd-cache").map_err(io::Error::from)?;
        memfd::grow_to(data.as_fd(), (g.slots as u64 * g.block_bytes) as usize)
            .map_err(io::Error::from)?;
        let shadow = memfd::create_named(c"ramd-cache-shadow").map_err(io::Error::from)?;
        let k = CacheKeep::map(data, shadow, g.slots as usize)?;
        k.word(1).store(g.block_bytes, Ordering::Relaxed);
        k.word(2).store(g.unit_shift as u64, Ordering::Relaxed);
        k.word(3).store(g.slots as u64, Ordering::Relaxed);
        k.word(4).store(g.size_bytes, Ordering::Relaxed);
        k.word(0).store(MAGIC, Ordering::Release);
        Ok(k)
    }

    /// The memfds another process kept; refused when they are not a kept
    /// cache's.
    pub fn open(data: OwnedFd, shadow: OwnedFd) -> io::Result<CacheKeep> {
        let bad = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not a kept cache: {what}"),
            )
        };
        memfd::check(shadow.as_fd(), HEADER_WORDS * 8).map_err(io::Error::from)?;
        let mut head = [0u8; 32];
        rustix::io::pread(&shadow, &mut head, 0)?;
        let word =
            |i: usize| u64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        if word(0) != MAGIC {
            return Err(bad("wrong magic"));
        }
        let slots = word(3) as usize;
        let k = CacheKeep::map(data, shadow, slots)?;
        let g = k.geometry();
        if g.block_bytes == 0 || !g.block_bytes.is_power_of_two() || g.unit_shift > 20 {
            return Err(bad("a bad geometry"));
        }
        memfd::check(k.data.as_fd(), (g.slots as u64 * g.block_bytes) as usize)
            .map_err(io::Error::from)?;
        Ok(k)
    }

    fn map(data: OwnedFd, shadow_fd: OwnedFd, slots: usize) -> io::Result<CacheKeep> {
        let len_words = HEADER_WORDS + 2 * slots;
        memfd::grow_to(shadow_fd.as_fd(), len_words * 8).map_err(io::Error::from)?;
        let shadow = memfd::SharedWords::map(shadow_fd.as_fd(), 0, len_words)?;
        Ok(CacheKeep {
            data,
            shadow_fd,
            shadow,
        })
    }

    #[inline]
    fn word(&self, i: usize) -> &AtomicU64 {
        &self.shadow.words()[i]
    }

    pub fn geometry(&self) -> Geometry {
        Geometry {
            block_bytes: self.word(1).load(Ordering::Relaxed),
            unit_shift: self.word(2).load(Ordering::Relaxed) as u32,
            slots: self.word(3).load(Ordering::Relaxed) as u32,
            size_bytes: self.word(4).load(Ordering::Relaxed),
        }
    }

    /// The data memfd (mapped by the engine) and the shadow's.
    pub fn fds(&self) -> [BorrowedFd<'_>; 2] {
        [self.data.as_fd(), self.shadow_fd.as_fd()]
    }

    /// Slot `s` holds dirty data of `block` in the units of `valid`
    /// (before its bytes change: module docs).
    #[inline]
    pub fn set_dirty(&self, s: u32, block: u64, valid: u64) {
        let at = HEADER_WORDS + 2 * s as usize;
        self.word(at + 1).fetch_or(valid, Ordering::Release);
        let w = (block + 1) | DIRTY;
        if self.word(at).load(Ordering::Relaxed) != w {
            // Another block's units are not this one's.
            self.word(at + 1).store(valid, Ordering::Release);
            self.word(at).store(w, Ordering::Release);
        }
    }

    /// Slot `s` holds nothing the backing lacks.
    #[inline]
    pub fn set_clean(&self, s: u32) {
        let at = HEADER_WORDS + 2 * s as usize;
        if self.word(at).load(Ordering::Relaxed) != 0 {
            self.word(at).store(0, Ordering::Release);
            self.word(at + 1).store(0, Ordering::Release);
        }
    }

    /// The kept dirty runs, in slot order: (slot, backing offset of the
    /// block, run start and end in the block). Reads only the shadow.
    fn dirty_runs(&self) -> Vec<(u32, u64, u64, u64)> {
        let g = self.geometry();
        let unit = 1u64 << g.unit_shift;
        let mut runs = Vec::new();
        for s in 0..g.slots {
            let at = HEADER_WORDS + 2 * s as usize;
            let w = self.word(at).load(Ordering::Acquire);
            if w & DIRTY == 0 {
                continue;
            }
            let start = ((w & !DIRTY) - 1) * g.block_bytes;
            let blen = g.block_bytes.min(g.size_bytes.saturating_sub(start));
            let mut rest = self.word(at + 1).load(Ordering::Acquire);
            while rest != 0 {
                let first = rest.trailing_zeros() as u64;
                let run = (!(rest >> first)).trailing_zeros() as u64;
                let (from, to) = (first * unit, ((first + run) * unit).min(blen));
                rest &= if first + run >= 64 {
                    0
                } else {
                    u64::MAX << (first + run)
                };
                if from < to {
                    runs.push((s, start, from, to));
                }
            }
        }
        runs
    }

    /// Bytes of kept dirty data (from the shadow alone).
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_runs()
            .iter()
            .map(|&(_, _, from, to)| to - from)
            .sum()
    }

    /// Calls `f(backing offset, bytes)` for every kept dirty run, in slot
    /// order; returns the bytes handed over.
    pub fn for_each_dirty(
        &self,
        f: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
    ) -> io::Result<u64> {
        let bs = self.geometry().block_bytes;
        let mut buf = vec![0u8; bs as usize];
        let mut total = 0;
        for (s, start, from, to) in self.dirty_runs() {
            let part = &mut buf[from as usize..to as usize];
            rustix::io::pread(&self.data, &mut *part, s as u64 * bs + from)?;
            f(start + from, part)?;
            total += to - from;
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_runs_come_back_from_the_memfds() {
        let g = Geometry {
            block_bytes: 8192,
            unit_shift: 9,
            slots: 4,
            size_bytes: 3 * 8192 + 1024,
        };
        let k = CacheKeep::create(g).unwrap();
        let pattern: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        rustix::io::pwrite(&k.data, &pattern, 8192).unwrap();
        rustix::io::pwrite(&k.data, &pattern, 3 * 8192).unwrap();
        // Slot 1 holds block 0, units 0-1 and 4; slot 3 the short last
        // block (3), every unit; slot 2 was dirty, then written back.
        k.set_dirty(1, 0, 0b11);
        k.set_dirty(1, 0, 0b10000);
        k.set_dirty(3, 3, u64::MAX);
        k.set_dirty(2, 1, 1);
        k.set_clean(2);
        let [d, s] = k.fds();
        let again = CacheKeep::open(
            d.try_clone_to_owned().unwrap(),
            s.try_clone_to_owned().unwrap(),
        )
        .unwrap();
        assert_eq!(again.geometry(), g);
        let mut got = Vec::new();
        let n = again
            .for_each_dirty(&mut |off, b| {
                got.push((off, b.to_vec()));
                Ok(())
            })
            .unwrap();
        assert_eq!(n, 1024 + 512 + 1024);
        assert_eq!(got[0], (0, pattern[..1024].to_vec()));
        assert_eq!(got[1], (2048, pattern[2048..2560].to_vec()));
        assert_eq!(got[2], (3 * 8192, pattern[..1024].to_vec()));
        // A slot taken by another block forgets the old block's units.
        k.set_dirty(1, 2, 0b1);
        let mut offs = Vec::new();
        k.for_each_dirty(&mut |off, b| {
            offs.push((off, b.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(offs[0], (2 * 8192, 512));
    }
}
