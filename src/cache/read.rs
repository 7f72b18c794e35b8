//! The read path: hits copied out under the slot's read lock; misses
//! extended over the following missing blocks and fetched from the backing
//! with one read (or read straight through when the request bypasses the
//! cache or no slot can be had); NBD_CMD_CACHE prefetch.

use super::engine::{ClaimErr, Claimed, Inner, State, MAX_FILL_BYTES, MAX_RACE_RETRIES};
use super::stats::Ctr;
use crate::block::backend::{check_range, Result};

/// How `read_hit` served a piece of a block.
enum Served {
    /// From the cache alone.
    Hit,
    /// From the cache after fetching units it lacked.
    Filled,
    /// Not cached: the caller fetches the block.
    Absent,
}

impl Inner {
    /// Copies a piece of block `b` out of the cache if it is resident,
    /// fetching units of it the cache does not hold yet.
    #[inline]
    fn read_hit(&self, b: u64, off: u64, dst: &mut [u8]) -> Result<Served> {
        let end = off + dst.len() as u64;
        for _ in 0..MAX_RACE_RETRIES {
            let Some(s) = self.index.get(b) else {
                return Ok(Served::Absent);
            };
            let g = self.slots[s as usize].meta.read();
            if g.block != b || g.state == State::Empty {
                // Evicted (or its fill failed) after the lookup: look again.
                continue;
            }
            let (_, touched) = self.unit_masks(b, off, end);
            if g.valid & touched != touched {
                drop(g);
                return self.read_filling_units(b, s, off, dst);
            }
            self.copy_out(s, off, dst);
            drop(g);
            self.note_hit(s);
            return Ok(Served::Hit);
        }
        Ok(Served::Absent)
    }

    /// A resident block lacks some units the read needs (it was partly
    /// written before it was ever read): fetch them, then copy out.
    #[cold]
    fn read_filling_units(&self, b: u64, s: u32, off: u64, dst: &mut [u8]) -> Result<Served> {
        let mut g = self.slots[s as usize].meta.write();
        if g.block != b || g.state == State::Empty {
            return Ok(Served::Absent);
        }
        let (_, touched) = self.unit_masks(b, off, off + dst.len() as u64);
        let need = touched & !g.valid;
        if need != 0 {
            self.fill_units(b, s, &mut g, need)?;
        }
        self.copy_out(s, off, dst);
        drop(g);
        self.note_hit(s);
        Ok(Served::Filled)
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(offset, buf.len() as u64, self.size)?;
        let _pass = self.enter()?;
        let len = buf.len() as u64;
        if len == 0 {
            return Ok(());
        }
        let bypass = self.seq.note(offset, len);
        let end = offset + len;
        let mut pos = offset;
        let mut bypassed = false;
        while pos < end {
            let b = self.block_of(pos);
            let bstart = self.block_start(b);
            let n = (bstart + self.bs).min(end) - pos;
            let at = (pos - offset) as usize;
            match self.read_hit(b, pos - bstart, &mut buf[at..at + n as usize])? {
                Served::Hit => {
                    self.stats.add(Ctr::ReadHits, 1);
                    pos += n;
                    continue;
                }
                Served::Filled => {
                    self.stats.add(Ctr::ReadMisses, 1);
                    pos += n;
                    continue;
                }
                Served::Absent => {}
            }
            // A miss: extend it over the following missing blocks.
            let max_run = (MAX_FILL_BYTES >> self.shift).max(1);
            let mut last = b;
            while self.block_start(last + 1) < end
                && last + 1 - b < max_run
                && self.index.get(last + 1).is_none()
            {
                last += 1;
            }
            if bypass {
                let run_end = self.block_start(last + 1).min(end);
                let piece = &mut buf[at..(run_end - offset) as usize];
                self.backing_read(pos, piece)?;
                self.stats.add(Ctr::ReadMisses, last - b + 1);
                bypassed = true;
                pos = run_end;
                continue;
            }
            pos = self.fill_run(b, last, Some((offset, &mut *buf)))?;
        }
        if bypassed {
            self.stats.add(Ctr::BypassedRequests, 1);
            self.stats.add(Ctr::BypassedBytes, len);
        }
        Ok(())
    }

    /// Fetches blocks `b..=last` (all missing at the caller's look) from the
    /// backing into the cache with one read, copying the part of them the
    /// request `(offset, buf)` covers into `buf`. Stops early at a block
    /// someone else cached meanwhile. Returns the position in the request
    /// (or block space when `out` is None) up to which it is done.
    fn fill_run(&self, b: u64, last: u64, out: Option<(u64, &mut [u8])>) -> Result<u64> {
        let mut claims: Vec<Claimed<'_>> = Vec::new();
        let mut no_slot = false;
        for blk in b..=last {
            match self.claim(blk) {
                Ok(c) => claims.push(c),
                Err(ClaimErr::Exists) => break,
                Err(ClaimErr::NoSlot) => {
                    no_slot = true;
                    break;
                }
            }
        }
        let out_end = out.as_ref().map(|(o, buf)| o + buf.len() as u64);
        if claims.is_empty() {
            if !no_slot {
                // Cached by someone else meanwhile: the caller retries as a hit.
                return Ok(out.map_or(self.block_start(b), |(o, _)| o.max(self.block_start(b))));
            }
            // Every slot is dirty or busy: read through without caching.
            self.flusher_signal.kick();
            let bstart = self.block_start(b);
            let bend = bstart + self.blen(b);
            return match out {
                Some((o, buf)) => {
                    self.stats.add(Ctr::ReadMisses, 1);
                    self.stats.add(Ctr::BypassedRequests, 1);
                    let from = o.max(bstart);
                    let to = bend.min(o + buf.len() as u64);
                    self.stats.add(Ctr::BypassedBytes, to - from);
                    self.backing_read(from, &mut buf[(from - o) as usize..(to - o) as usize])?;
                    Ok(to)
                }
                None => Ok(bend),
            };
        }
        let first = self.block_start(b);
        let k = claims.len() as u64;
        let run_end = (self.block_start(b + k)).min(self.size);
        let mut tmp = vec![0u8; (run_end - first) as usize];
        if let Err(e) = self.backing_read(first, &mut tmp) {
            for c in claims {
                self.abort(c);
            }
            return Err(e);
        }
        if out.is_some() {
            // (A prefetch is no client read: it counts as neither.)
            self.stats.add(Ctr::ReadMisses, k);
        }
        let mut done = run_end;
        if let Some((o, buf)) = out {
            let from = o.max(first);
            let to = run_end.min(o + buf.len() as u64);
            buf[(from - o) as usize..(to - o) as usize]
                .copy_from_slice(&tmp[(from - first) as usize..(to - first) as usize]);
            done = to;
        }
        for mut c in claims {
            let bo = self.block_start(c.block) - first;
            let bl = self.blen(c.block);
            self.copy_in(c.slot, 0, &tmp[bo as usize..(bo + bl) as usize]);
            c.g.valid = self.full_mask(c.block);
            self.publish(c, State::Clean);
        }
        Ok(out_end.map_or(done, |e| done.min(e)))
    }

    /// NBD_CMD_CACHE: fetches the range into the cache (no bypass).
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.size)?;
        let _pass = self.enter()?;
        if len == 0 {
            return Ok(());
        }
        let (first, last) = (self.block_of(offset), self.block_of(offset + len - 1));
        let max_run = (MAX_FILL_BYTES >> self.shift).max(1);
        let mut b = first;
        while b <= last {
            if self.index.get(b).is_some() {
                b += 1;
                continue;
            }
            let mut end = b;
            while end < last && end + 1 - b < max_run && self.index.get(end + 1).is_none() {
                end += 1;
            }
            let done = self.fill_run(b, end, None)?;
            b = self.block_of(done.max(self.block_start(b) + 1) - 1) + 1;
        }
        Ok(())
    }
}
