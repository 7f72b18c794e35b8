//! The write paths of the three modes, and what a write that went
//! straight to the backing does to cached copies.

use super::config::Mode;
use super::engine::{ClaimErr, Inner, State, MAX_RACE_RETRIES};
use super::stats::Ctr;
use crate::block::backend::{check_range, Error, Result};

impl Inner {
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let len = data.len() as u64;
        check_range(offset, len, self.size)?;
        let _pass = self.enter()?;
        if len == 0 {
            return if fua { self.flush() } else { Ok(()) };
        }
        let bypass = self.seq.note(offset, len);
        if bypass {
            self.stats.add(Ctr::BypassedRequests, 1);
            self.stats.add(Ctr::BypassedBytes, len);
        }
        match self.cfg.mode {
            Mode::WriteBack => {
                self.write_back(offset, data, bypass)?;
                if fua {
                    self.writeback_range(offset, len)?;
                    self.backing_flush()?;
                }
                Ok(())
            }
            Mode::WriteThrough => self.write_through(offset, data, fua, !bypass),
            Mode::WriteAround => {
                self.backing_write(offset, data, fua)?;
                self.after_direct_write(offset, data);
                let blocks = self.block_of(offset + len - 1) - self.block_of(offset) + 1;
                self.stats.add(Ctr::WriteMisses, blocks);
                Ok(())
            }
        }
    }

    /// Write-back: each block piece goes into RAM and is marked dirty.
    /// With `bypass`, pieces of blocks that are not cached go straight to
    /// the backing instead (cached ones must still be updated in RAM).
    fn write_back(&self, offset: u64, data: &[u8], bypass: bool) -> Result<()> {
        let end = offset + data.len() as u64;
        let mut pos = offset;
        while pos < end {
            let b = self.block_of(pos);
            let bstart = self.block_start(b);
            let n = (bstart + self.bs).min(end) - pos;
            let piece = &data[(pos - offset) as usize..(pos - offset + n) as usize];
            self.write_back_piece(b, pos - bstart, piece, bypass)?;
            pos += n;
        }
        Ok(())
    }

    fn write_back_piece(&self, b: u64, off: u64, piece: &[u8], bypass: bool) -> Result<()> {
        let mut room_tries = 0;
        for _ in 0..MAX_RACE_RETRIES {
            if let Some(s) = self.index.get(b) {
                let mut g = self.slots[s as usize].meta.write();
                if g.block != b || g.state == State::Empty {
                    continue;
                }
                let (full, touched) = self.unit_masks(b, off, off + piece.len() as u64);
                let need = touched & !full & !g.valid;
                if need != 0 {
                    // Units the write covers in part and the cache lacks.
                    self.fill_units(b, s, &mut g, need)?;
                }
                self.copy_in(s, off, piece);
                g.valid |= touched;
                self.keep_dirty(s, b, g.valid);
                g.gen += 1;
                if g.state == State::Clean {
                    self.mark_dirty(s, &mut g);
                }
                drop(g);
                self.note_hit(s);
                self.stats.add(Ctr::WriteHits, 1);
                return Ok(());
            }
            let pos = self.block_start(b) + off;
            if bypass {
                self.stats.add(Ctr::WriteMisses, 1);
                self.backing_write(pos, piece, false)?;
                self.after_direct_write(pos, piece);
                return Ok(());
            }
            match self.claim(b) {
                Ok(mut c) => {
                    // Only units the write covers in part need the backing;
                    // the rest of the block stays unfetched (not valid).
                    let (full, touched) = self.unit_masks(b, off, off + piece.len() as u64);
                    let need = touched & !full;
                    if need != 0 {
                        if let Err(e) = self.fill_units(b, c.slot, &mut c.g, need) {
                            self.abort(c);
                            return Err(e);
                        }
                    }
                    self.copy_in(c.slot, off, piece);
                    c.g.valid |= touched;
                    self.keep_dirty(c.slot, b, c.g.valid);
                    self.publish(c, State::Dirty);
                    self.stats.add(Ctr::WriteMisses, 1);
                    return Ok(());
                }
                Err(ClaimErr::Exists) => continue,
                Err(ClaimErr::NoSlot) => {
                    // Everything is dirty: write some back to make room, and
                    // if that cannot help, write this piece through.
                    self.flusher_signal.kick();
                    room_tries += 1;
                    if room_tries <= 2 && self.writeback_some(self.cfg.writeback_max_io_bytes)? > 0
                    {
                        continue;
                    }
                    self.stats.add(Ctr::WriteMisses, 1);
                    self.stats.add(Ctr::BypassedRequests, 1);
                    self.stats.add(Ctr::BypassedBytes, piece.len() as u64);
                    self.backing_write(pos, piece, false)?;
                    self.after_direct_write(pos, piece);
                    return Ok(());
                }
            }
        }
        Err(Error::Io(std::io::Error::other(
            "cache: could not place a block after many retries (heavy contention)",
        )))
    }

    /// After `data` went straight to the backing at `offset`: a cached copy
    /// of any block it touches is stale. Clean copies are dropped (reads
    /// refetch the new data); dirty ones (write-back) get the bytes too, so
    /// their eventual write-back carries them.
    fn after_direct_write(&self, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        let (first, last) = (self.block_of(offset), self.block_of(end - 1));
        for (b, _) in self.resident_in(first, last) {
            let Some((s, mut g)) = self.lock_block(b) else {
                continue;
            };
            if g.state == State::Dirty {
                let bstart = self.block_start(b);
                let from = offset.max(bstart);
                let to = end.min(bstart + self.bs);
                self.copy_in(
                    s,
                    from - bstart,
                    &data[(from - offset) as usize..(to - offset) as usize],
                );
                // Units written wholly are current here now; units written
                // in part that the cache lacks stay lacking (the backing
                // has all of them).
                g.valid |= self.unit_masks(b, from - bstart, to - bstart).0;
                g.gen += 1;
                self.keep_dirty(s, b, g.valid);
            } else {
                self.invalidate_locked(s, &mut g);
            }
        }
    }

    /// Write-through: cached blocks are locked across the backing write and
    /// updated after it, so cache and backing change together; blocks the
    /// write covers wholly are cached (`allocate`).
    fn write_through(&self, offset: u64, data: &[u8], fua: bool, allocate: bool) -> Result<()> {
        let end = offset + data.len() as u64;
        let (first, last) = (self.block_of(offset), self.block_of(end - 1));
        // Lock in slot order (stable, unlike block contents): see the
        // module docs' lock order.
        let mut want = self.resident_in(first, last);
        want.sort_unstable_by_key(|&(_, s)| s);
        let mut pins = Vec::new();
        for (b, s) in want {
            let g = self.slots[s as usize].meta.write();
            if g.block == b && g.state != State::Empty {
                pins.push((b, s, g));
            }
        }
        if let Err(e) = self.backing_write(offset, data, fua) {
            // The backing may hold part of the write: drop the copies.
            for (_, s, mut g) in pins {
                self.invalidate_locked(s, &mut g);
            }
            return Err(e);
        }
        let piece_of = |b: u64| {
            let bstart = self.block_start(b);
            let from = offset.max(bstart);
            let to = end.min(bstart + self.bs);
            (
                from - bstart,
                &data[(from - offset) as usize..(to - offset) as usize],
            )
        };
        let mut pinned = Vec::with_capacity(pins.len());
        for (b, s, mut g) in pins {
            let (off, piece) = piece_of(b);
            self.copy_in(s, off, piece);
            g.valid |= self.unit_masks(b, off, off + piece.len() as u64).0;
            drop(g);
            self.note_hit(s);
            pinned.push(b);
        }
        self.stats.add(Ctr::WriteHits, pinned.len() as u64);
        self.stats
            .add(Ctr::WriteMisses, last - first + 1 - pinned.len() as u64);
        pinned.sort_unstable();
        let mut pinned = pinned.into_iter().peekable();
        for b in first..=last {
            if pinned.peek() == Some(&b) {
                pinned.next();
                continue;
            }
            if let Some((s, mut g)) = self.lock_block(b) {
                // Cached by a read while we wrote: it may be stale.
                self.invalidate_locked(s, &mut g);
                continue;
            }
            let (off, piece) = piece_of(b);
            if allocate && off == 0 && piece.len() as u64 == self.blen(b) {
                if let Ok(mut c) = self.claim(b) {
                    self.copy_in(c.slot, 0, piece);
                    c.g.valid = self.full_mask(b);
                    self.publish(c, State::Clean);
                }
            }
        }
        Ok(())
    }
}
