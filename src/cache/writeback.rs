//! Writing dirty blocks back to the backing (write-back mode): the one
//! mechanism behind the flusher, FLUSH, FUA, making room, and close.
//!
//! Dirty blocks are grouped in ascending block order; runs of adjacent
//! dirty blocks become one backing write of at most `writeback_max_io_bytes`
//! (slow backings are dominated by per-request latency); runs go to the
//! backing in waves of up to `WAVE_GROUPS` writes handed over together
//! (`Backend::write_many`, which an NBD backing pipelines), and up to
//! `WRITEBACK_WORKERS` waves are in flight at once (the flusher's
//! background drain keeps one, see `drain_workers`). Each block's data
//! is copied out under its read lock, so writers are held up only for the
//! copy, never for the backing I/O; a block written again meanwhile stays
//! dirty (its generation moved) and goes in a later round.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::engine::{Inner, State};
use super::stats::Ctr;
use crate::block::backend::Result;

/// Most waves one write-back keeps in flight (the NBD client's default
/// connection count; a disk's queue takes as many).
pub(crate) const WRITEBACK_WORKERS: usize = 4;
/// Most runs of blocks in one wave (the NBD client pipelines up to 64
/// writes per round trip).
pub(crate) const WAVE_GROUPS: usize = 64;
/// Most bytes in one wave.
pub(crate) const WAVE_BYTES: u64 = 8 << 20;
/// Dirty share of the cache from which the flusher drains with every
/// worker (below it, one wave at a time).
pub(crate) const URGENT_DIRTY_PERCENT: u64 = 90;

/// One dirty block found by a scan.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirtyBlock {
    pub block: u64,
    pub slot: u32,
    pub since_ms: u64,
}

impl Inner {
    /// Every dirty block now, in slot order.
    pub(crate) fn scan_dirty(&self) -> Vec<DirtyBlock> {
        let mut out = Vec::with_capacity(
            self.dirty_count.load(std::sync::atomic::Ordering::Relaxed) as usize,
        );
        let mut s = self.dirty.find(0, self.nslots as usize, true);
        while s < self.nslots as usize {
            let g = self.slots[s].meta.read();
            if g.state == State::Dirty {
                out.push(DirtyBlock {
                    block: g.block,
                    slot: s as u32,
                    since_ms: g.dirty_since_ms,
                });
            }
            drop(g);
            s = self.dirty.find(s + 1, self.nslots as usize, true);
        }
        out
    }

    /// Writes back every block that was dirty when the call began.
    pub(crate) fn writeback_all(&self) -> Result<u64> {
        let list: Vec<(u64, u32)> = self
            .scan_dirty()
            .iter()
            .map(|d| (d.block, d.slot))
            .collect();
        self.writeback_blocks(&list)
    }

    /// Writes back the oldest dirty blocks, about `max_bytes` of them, to
    /// make room. Returns the bytes written.
    pub(crate) fn writeback_some(&self, max_bytes: u64) -> Result<u64> {
        let mut d = self.scan_dirty();
        let n = (max_bytes / self.bs).max(1) as usize;
        if d.len() > n {
            d.select_nth_unstable_by_key(n, |x| x.since_ms);
            d.truncate(n);
        }
        let list: Vec<(u64, u32)> = d.iter().map(|x| (x.block, x.slot)).collect();
        self.writeback_blocks(&list)
    }

    /// Writes back `(block, slot)` pairs (any order); returns the bytes
    /// written. Runs of adjacent blocks become one backing write each;
    /// runs are sent in waves (up to [`WAVE_GROUPS`] runs or
    /// [`WAVE_BYTES`]) whose writes the backing keeps in flight together
    /// (`Backend::write_many`: an NBD backing pipelines them on one
    /// connection), and up to [`WRITEBACK_WORKERS`] waves are in flight at
    /// once (a slow backing is bound by its latency, not its bandwidth).
    /// Stops at the first backing error, leaving what is not written dirty.
    pub(crate) fn writeback_blocks(&self, list: &[(u64, u32)]) -> Result<u64> {
        self.writeback_blocks_with(list, WRITEBACK_WORKERS)
    }

    /// How many waves the flusher keeps in flight now: one while there is
    /// room (a background drain should not take the CPU and the backing
    /// from the requests being served), all of them once dirty blocks fill
    /// [`URGENT_DIRTY_PERCENT`] of the cache and writers are about to wait.
    pub(crate) fn drain_workers(&self) -> usize {
        let dirty = self.dirty_count.load(Ordering::Relaxed);
        if dirty * 100 >= self.nslots as u64 * URGENT_DIRTY_PERCENT {
            WRITEBACK_WORKERS
        } else {
            1
        }
    }

    /// [`Self::writeback_blocks`] with at most `max_workers` waves in flight.
    pub(crate) fn writeback_blocks_with(
        &self,
        list: &[(u64, u32)],
        max_workers: usize,
    ) -> Result<u64> {
        let mut list = list.to_vec();
        list.sort_unstable();
        let max_blocks = (self.cfg.writeback_max_io_bytes / self.bs).max(1) as usize;
        let mut groups: Vec<std::ops::Range<usize>> = Vec::new();
        let mut i = 0;
        while i < list.len() {
            let mut j = i + 1;
            while j < list.len() && j - i < max_blocks && list[j].0 == list[j - 1].0 + 1 {
                j += 1;
            }
            groups.push(i..j);
            i = j;
        }
        // Waves of consecutive runs.
        let wave_blocks = (WAVE_BYTES / self.bs).max(1) as usize;
        let mut waves: Vec<std::ops::Range<usize>> = Vec::new();
        let mut g = 0;
        while g < groups.len() {
            let (mut h, mut blocks) = (g, 0);
            while h < groups.len()
                && h - g < WAVE_GROUPS
                && (h == g || blocks + groups[h].len() <= wave_blocks)
            {
                blocks += groups[h].len();
                h += 1;
            }
            waves.push(g..h);
            g = h;
        }
        let wave = |w: &std::ops::Range<usize>| -> Vec<&[(u64, u32)]> {
            groups[w.clone()].iter().map(|r| &list[r.clone()]).collect()
        };
        let workers = waves.len().min(max_workers.max(1));
        if workers <= 1 {
            let mut written = 0;
            for w in &waves {
                written += self.writeback_wave(&wave(w))?;
            }
            return Ok(written);
        }
        // Waves hold disjoint slots and each takes its slots' locks in
        // ascending order and releases them before the next: workers
        // cannot deadlock one another or anyone else.
        let next = AtomicUsize::new(0);
        let written = AtomicU64::new(0);
        let first_error: Mutex<Option<crate::block::backend::Error>> = Mutex::new(None);
        let work = || loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            if k >= waves.len() || first_error.lock().is_some() {
                return;
            }
            match self.writeback_wave(&wave(&waves[k])) {
                Ok(n) => {
                    written.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    first_error.lock().get_or_insert(e);
                    return;
                }
            }
        };
        std::thread::scope(|s| {
            for _ in 1..workers {
                if std::thread::Builder::new()
                    .name("ramd-cache-wb".into())
                    .spawn_scoped(s, work)
                    .is_err()
                {
                    // No thread: fewer writes in flight, same result.
                    break;
                }
            }
            work();
        });
        match first_error.into_inner() {
            Some(e) => Err(e),
            None => Ok(written.into_inner()),
        }
    }

    /// Writes back a wave of runs of consecutive blocks: the units each
    /// block holds (a block partly written before it was ever read holds
    /// only those), as few backing writes as the runs of held units allow,
    /// all handed to the backing at once. Nothing is marked clean unless
    /// every write succeeded.
    fn writeback_wave(&self, groups: &[&[(u64, u32)]]) -> Result<u64> {
        // Serialise with other write-backs (and zero/trim) of these slots,
        // in slot order; held until the blocks are marked clean.
        let mut slots: Vec<u32> = groups
            .iter()
            .flat_map(|g| g.iter().map(|&(_, s)| s))
            .collect();
        slots.sort_unstable();
        let _wb: Vec<_> = slots
            .iter()
            .map(|&s| self.slots[s as usize].wb.lock())
            .collect();
        // One buffer per run of blocks; backing ranges to write, per run,
        // ascending, adjacent ones merged.
        let mut bufs: Vec<(u64, Vec<u8>)> = Vec::with_capacity(groups.len());
        let mut ranges: Vec<(usize, u64, u64)> = Vec::new();
        let mut gens: Vec<Vec<Option<u64>>> = Vec::with_capacity(groups.len());
        for (gi, group) in groups.iter().enumerate() {
            let base = self.block_start(group[0].0);
            let last = group[group.len() - 1].0;
            let mut buf = vec![0u8; (self.block_start(last) + self.blen(last) - base) as usize];
            let mut group_gens = vec![None; group.len()];
            for (i, &(b, s)) in group.iter().enumerate() {
                let g = self.slots[s as usize].meta.read();
                if g.block != b || g.state != State::Dirty {
                    continue;
                }
                let bstart = self.block_start(b);
                for (from, to) in self.valid_runs(b, g.valid) {
                    let at = (bstart - base + from) as usize;
                    self.copy_out(s, from, &mut buf[at..at + (to - from) as usize]);
                    match ranges.last_mut() {
                        Some(r) if r.0 == gi && r.2 == bstart + from => r.2 = bstart + to,
                        _ => ranges.push((gi, bstart + from, bstart + to)),
                    }
                }
                group_gens[i] = Some(g.gen);
            }
            bufs.push((base, buf));
            gens.push(group_gens);
        }
        let writes: Vec<(u64, &[u8])> = ranges
            .iter()
            .map(|&(gi, from, to)| {
                let (base, buf) = &bufs[gi];
                (from, &buf[(from - base) as usize..(to - base) as usize])
            })
            .collect();
        let written: u64 = writes.iter().map(|w| w.1.len() as u64).sum();
        if !writes.is_empty() {
            self.backing_write_many(&writes)?;
        }
        for (gi, group) in groups.iter().enumerate() {
            for (k, &(b, s)) in group.iter().enumerate() {
                let Some(gen) = gens[gi][k] else { continue };
                let mut g = self.slots[s as usize].meta.write();
                if g.block == b && g.state == State::Dirty && g.gen == gen {
                    self.mark_clean(s, &mut g);
                }
            }
        }
        self.stats.add(Ctr::WritebackBytes, written);
        Ok(written)
    }

    /// Hands every run of units that dirty blocks hold to `f` as
    /// `(backing offset, bytes)`, ascending, each copied under its block's
    /// read lock (for saving dirty data the backing cannot take). Returns
    /// the bytes handed over.
    pub(crate) fn for_each_dirty(
        &self,
        f: &mut dyn FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<u64> {
        let mut list = self.scan_dirty();
        list.sort_unstable_by_key(|d| d.block);
        let mut buf = vec![0u8; self.bs as usize];
        let mut total = 0;
        for d in list {
            let g = self.slots[d.slot as usize].meta.read();
            if g.block != d.block || g.state != State::Dirty {
                continue;
            }
            let runs = self.valid_runs(d.block, g.valid);
            for &(from, to) in &runs {
                self.copy_out(d.slot, from, &mut buf[from as usize..to as usize]);
            }
            drop(g);
            let bstart = self.block_start(d.block);
            for (from, to) in runs {
                f(bstart + from, &buf[from as usize..to as usize])?;
                total += to - from;
            }
        }
        Ok(total)
    }

    /// Block-relative byte ranges of the units in `valid`.
    fn valid_runs(&self, b: u64, valid: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let blen = self.blen(b);
        let unit = self.unit_bytes();
        let mut rest = valid & self.full_mask(b);
        while rest != 0 {
            let first = rest.trailing_zeros() as u64;
            let run = (!(rest >> first)).trailing_zeros() as u64;
            out.push((first * unit, ((first + run) * unit).min(blen)));
            rest &= if first + run >= 64 {
                0
            } else {
                u64::MAX << (first + run)
            };
        }
        out
    }
}
