//! Writing dirty blocks back to the backing (write-back mode): the one
//! mechanism behind the flusher, FLUSH, FUA, making room, and close.
//!
//! Dirty blocks are written in ascending block order; runs of adjacent
//! dirty blocks become one backing write of at most `writeback_max_io_bytes`
//! (slow backings are dominated by per-request latency). Each block's data
//! is copied out under its read lock, so writers are held up only for the
//! copy, never for the backing I/O; a block written again meanwhile stays
//! dirty (its generation moved) and goes in a later round.

use super::engine::{Inner, State};
use super::stats::Ctr;
use crate::backend::Result;

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
    /// written. Stops at the first backing error, leaving what is not
    /// written dirty.
    pub(crate) fn writeback_blocks(&self, list: &[(u64, u32)]) -> Result<u64> {
        let mut list = list.to_vec();
        list.sort_unstable();
        let max_blocks = (self.cfg.writeback_max_io_bytes / self.bs).max(1) as usize;
        let mut written = 0;
        let mut i = 0;
        while i < list.len() {
            let mut j = i + 1;
            while j < list.len() && j - i < max_blocks && list[j].0 == list[j - 1].0 + 1 {
                j += 1;
            }
            written += self.writeback_group(&list[i..j])?;
            i = j;
        }
        Ok(written)
    }

    /// Writes back a run of consecutive blocks: the units each holds (a
    /// block partly written before it was ever read holds only those), as
    /// few backing writes as the runs of held units allow. Nothing is
    /// marked clean unless every write succeeded.
    fn writeback_group(&self, group: &[(u64, u32)]) -> Result<u64> {
        // Serialise with other write-backs (and zero/trim) of these slots,
        // in slot order.
        let mut order: Vec<usize> = (0..group.len()).collect();
        order.sort_unstable_by_key(|&i| group[i].1);
        let mut wb = Vec::with_capacity(group.len());
        for &i in &order {
            wb.push(self.slots[group[i].1 as usize].wb.lock());
        }
        let b0 = group[0].0;
        let base = self.block_start(b0);
        let last = group[group.len() - 1].0;
        let mut buf = vec![0u8; (self.block_start(last) + self.blen(last) - base) as usize];
        let mut gens = vec![None; group.len()];
        // Backing ranges to write, ascending, adjacent ones merged.
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (i, &(b, s)) in group.iter().enumerate() {
            let g = self.slots[s as usize].meta.read();
            if g.block != b || g.state != State::Dirty {
                continue;
            }
            let bstart = self.block_start(b);
            for (from, to) in self.valid_runs(b, g.valid) {
                let at = (bstart - base + from) as usize;
                self.copy_out(s, from, &mut buf[at..at + (to - from) as usize]);
                match runs.last_mut() {
                    Some(r) if r.1 == bstart + from => r.1 = bstart + to,
                    _ => runs.push((bstart + from, bstart + to)),
                }
            }
            gens[i] = Some(g.gen);
        }
        let mut written = 0;
        for (from, to) in runs {
            self.backing_write(
                from,
                &buf[(from - base) as usize..(to - base) as usize],
                false,
            )?;
            written += to - from;
        }
        for (k, &(b, s)) in group.iter().enumerate() {
            let Some(gen) = gens[k] else { continue };
            let mut g = self.slots[s as usize].meta.write();
            if g.block == b && g.state == State::Dirty && g.gen == gen {
                self.mark_clean(s, &mut g);
            }
        }
        self.stats.add(Ctr::WritebackBytes, written);
        drop(wb);
        Ok(written)
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
