//! A fixed-size bitmap of atomic words, one bit per page.
//!
//! Bits are set and cleared with atomic read-modify-write operations so that
//! threads holding locks on *different* chunks can update bits that share a
//! word. Readers that hold no lock (extents, dirty-set snapshots) see each word
//! atomically; a run spanning words is not a single snapshot.
//!
//! The words are the process's own, or part of a page of a shared ledger
//! (`ledger.rs`) that outlives the process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::ledger::LedgerPage;

/// Where a bitmap's words live.
enum Words {
    Own(Box<[AtomicU64]>),
    /// `page.words()[first..first + n]`.
    Shared {
        page: Arc<LedgerPage>,
        first: usize,
        n: usize,
    },
}

impl std::ops::Deref for Words {
    type Target = [AtomicU64];
    #[inline]
    fn deref(&self) -> &[AtomicU64] {
        match self {
            Words::Own(w) => w,
            Words::Shared { page, first, n } => &page.words()[*first..*first + *n],
        }
    }
}

/// One bit per page, `len` bits.
pub struct AtomicBitmap {
    words: Words,
    len: usize,
}

impl AtomicBitmap {
    /// A bitmap of `len` bits, all clear.
    pub fn new(len: usize) -> Self {
        let words = (0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        AtomicBitmap {
            words: Words::Own(words),
            len,
        }
    }

    /// A bitmap of `len` bits in `page`'s words from `first` on, as they
    /// are (an adopted ledger's bits stay).
    pub fn shared(page: Arc<LedgerPage>, first: usize, len: usize) -> Self {
        let n = len.div_ceil(64);
        assert!(first + n <= page.words().len(), "bitmap beyond its page");
        AtomicBitmap {
            words: Words::Shared { page, first, n },
            len,
        }
    }

    /// Sets every bit set in `other` (of the same length).
    pub fn or_from(&self, other: &AtomicBitmap) {
        for (w, o) in self.words.iter().zip(other.words.iter()) {
            let bits = o.load(Ordering::Acquire);
            if bits != 0 {
                w.fetch_or(bits, Ordering::AcqRel);
            }
        }
    }

    /// Clears every bit.
    pub fn clear_all(&self) {
        for w in self.words.iter() {
            if w.load(Ordering::Relaxed) != 0 {
                w.store(0, Ordering::Release);
            }
        }
    }

    /// Number of bits.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the bitmap holds no bits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bit at `i`.
    #[inline]
    pub fn get(&self, i: usize) -> bool {
        debug_assert!(i < self.len);
        self.words[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }

    /// Sets bit `i`; returns its previous value. Skips the write (and the cache
    /// line invalidation it costs) when the bit is already set.
    #[inline]
    pub fn set(&self, i: usize) -> bool {
        debug_assert!(i < self.len);
        let w = &self.words[i / 64];
        let mask = 1u64 << (i % 64);
        if w.load(Ordering::Relaxed) & mask != 0 {
            return true;
        }
        w.fetch_or(mask, Ordering::AcqRel) & mask != 0
    }

    /// Clears bit `i`; returns its previous value.
    #[inline]
    pub fn clear(&self, i: usize) -> bool {
        debug_assert!(i < self.len);
        let w = &self.words[i / 64];
        let mask = 1u64 << (i % 64);
        if w.load(Ordering::Relaxed) & mask == 0 {
            return false;
        }
        w.fetch_and(!mask, Ordering::AcqRel) & mask != 0
    }

    /// Sets every bit in `[start, end)`.
    pub fn set_range(&self, start: usize, end: usize) {
        self.update_range(start, end, |w, m| {
            if w.load(Ordering::Relaxed) & m != m {
                w.fetch_or(m, Ordering::AcqRel);
            }
        });
    }

    /// Number of set bits in `[start, end)`.
    pub fn count_range(&self, start: usize, end: usize) -> usize {
        let mut n = 0;
        self.update_range(start, end, |w, m| {
            n += (w.load(Ordering::Acquire) & m).count_ones() as usize;
        });
        n
    }

    /// Applies `f(word, mask)` to each word overlapping `[start, end)`, with
    /// `mask` selecting the bits of the word inside the range.
    fn update_range(&self, start: usize, end: usize, mut f: impl FnMut(&AtomicU64, u64)) {
        debug_assert!(start <= end && end <= self.len);
        let mut i = start;
        while i < end {
            let bit = i % 64;
            let n = (64 - bit).min(end - i);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            f(&self.words[i / 64], mask);
            i += n;
        }
    }

    /// Index of the first bit in `[start, end)` whose value is `value`, or `end`.
    pub fn find(&self, start: usize, end: usize, value: bool) -> usize {
        debug_assert!(start <= end && end <= self.len);
        let mut i = start;
        while i < end {
            let word = self.words[i / 64].load(Ordering::Acquire);
            let word = if value { word } else { !word };
            let masked = word >> (i % 64);
            if masked != 0 {
                let found = i + masked.trailing_zeros() as usize;
                return found.min(end);
            }
            i = (i / 64 + 1) * 64;
        }
        end
    }

    /// Atomically swaps each word with zero and returns the old words: the
    /// bits set at the moment each word was taken.
    pub fn take(&self) -> Vec<u64> {
        self.words
            .iter()
            .map(|w| w.swap(0, Ordering::AcqRel))
            .collect()
    }

    /// The 16 bits starting at `start` (a multiple of 16): one chunk's pages.
    #[inline]
    pub fn bits16(&self, start: usize) -> u16 {
        debug_assert!(start % 16 == 0 && start + 16 <= self.len.next_multiple_of(64));
        (self.words[start / 64].load(Ordering::Acquire) >> (start % 64)) as u16
    }

    /// Clears the bits of `mask` in the 16 bits starting at `start`.
    #[inline]
    pub fn clear_bits16(&self, start: usize, mask: u16) {
        debug_assert!(start % 16 == 0);
        if mask != 0 {
            let m = (mask as u64) << (start % 64);
            self.words[start / 64].fetch_and(!m, Ordering::AcqRel);
        }
    }

    /// Sets the bits of `mask` in the 16 bits starting at `start`.
    #[inline]
    pub fn set_bits16(&self, start: usize, mask: u16) {
        debug_assert!(start % 16 == 0);
        if mask != 0 {
            let m = (mask as u64) << (start % 64);
            self.words[start / 64].fetch_or(m, Ordering::AcqRel);
        }
    }

    /// Total set bits.
    pub fn count(&self) -> usize {
        self.words
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones() as usize)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_clear_find() {
        let b = AtomicBitmap::new(200);
        assert!(!b.set(3));
        assert!(b.set(3));
        assert!(b.get(3));
        assert_eq!(b.find(0, 200, true), 3);
        assert_eq!(b.find(4, 200, true), 200);
        b.set_range(60, 130);
        assert_eq!(b.count_range(0, 200), 71);
        assert_eq!(b.find(60, 200, false), 130);
        assert_eq!(b.find(0, 50, false), 0);
        assert!(b.clear(3));
        assert!(!b.clear(3));
        assert_eq!(b.find(0, 200, true), 60);
        let taken = b.take();
        assert_eq!(taken.iter().map(|w| w.count_ones()).sum::<u32>(), 70);
        assert_eq!(b.count(), 0);
    }

    #[test]
    fn sixteen_bit_groups() {
        let b = AtomicBitmap::new(128);
        b.set(17);
        b.set(31);
        b.set(32);
        assert_eq!(b.bits16(16), (1 << 1) | (1 << 15));
        b.clear_bits16(16, 1 << 1);
        assert_eq!(b.bits16(16), 1 << 15);
        assert_eq!(b.bits16(32), 1);
        b.set_bits16(112, 0x8001);
        assert!(b.get(112) && b.get(127));
    }

    #[test]
    fn find_respects_end() {
        let b = AtomicBitmap::new(128);
        b.set(100);
        assert_eq!(b.find(0, 90, true), 90);
        assert_eq!(b.find(0, 101, true), 100);
    }
}
