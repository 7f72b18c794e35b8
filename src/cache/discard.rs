//! Zero and trim: the backing does the work; cached blocks are locked
//! across it, then dropped where wholly covered and zeroed in place where
//! partly covered.

use super::engine::{Discard, Inner, Meta, State};
use crate::block::backend::{check_range, Result};

impl Inner {
    pub fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<()> {
        self.discard(offset, len, Discard::Zero { may_trim })
    }

    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.discard(offset, len, Discard::Trim)
    }

    /// Zero or trim: the backing does the work; cached blocks are locked
    /// (write-back mutex first) across it, then dropped where wholly
    /// covered and zeroed in place where partly covered.
    fn discard(&self, offset: u64, len: u64, how: Discard) -> Result<()> {
        check_range(offset, len, self.size)?;
        let _pass = self.enter()?;
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        let (first, last) = (self.block_of(offset), self.block_of(end - 1));
        let mut want = self.resident_in(first, last);
        want.sort_unstable_by_key(|&(_, s)| s);
        let mut pins = Vec::new();
        for (b, s) in want {
            let wb = self.slots[s as usize].wb.lock();
            let g = self.slots[s as usize].meta.write();
            if g.block == b && g.state != State::Empty {
                pins.push((b, s, wb, g));
            }
        }
        if let Err(e) = self.backing_discard(offset, len, how) {
            for (_, s, _wb, mut g) in pins {
                if g.state == State::Clean {
                    self.invalidate_locked(s, &mut g);
                }
            }
            return Err(e);
        }
        let mut pinned = Vec::with_capacity(pins.len());
        for (b, s, wb, mut g) in pins {
            self.zero_cached(b, s, &mut g, offset, end);
            drop(g);
            drop(wb);
            pinned.push(b);
        }
        // Blocks cached while the backing worked may predate the zeroes.
        pinned.sort_unstable();
        let mut pinned = pinned.into_iter().peekable();
        for (b, _) in self.resident_in(first, last) {
            while pinned.peek().is_some_and(|&p| p < b) {
                pinned.next();
            }
            if pinned.peek() == Some(&b) {
                continue;
            }
            if let Some((s, mut g)) = self.lock_block(b) {
                if g.state == State::Dirty {
                    self.zero_cached(b, s, &mut g, offset, end);
                } else {
                    self.invalidate_locked(s, &mut g);
                }
            }
        }
        Ok(())
    }

    /// Applies a zeroed `[offset, end)` to resident block `b` in slot `s`.
    fn zero_cached(&self, b: u64, s: u32, g: &mut Meta, offset: u64, end: u64) {
        let bstart = self.block_start(b);
        let from = offset.max(bstart);
        let to = end.min(bstart + self.blen(b));
        if from == bstart && to == bstart + self.blen(b) {
            self.invalidate_locked(s, g);
        } else {
            self.zero_in(s, from - bstart, to - from);
            g.valid |= self.unit_masks(b, from - bstart, to - bstart).0;
            g.gen += 1;
            if g.state == State::Dirty {
                self.keep_dirty(s, b, g.valid);
            }
        }
    }
}
