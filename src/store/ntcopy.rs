//! Copies into drive memory with non-temporal stores.
//!
//! A write into a drive much larger than the CPU caches lands on lines
//! that are not cached: an ordinary copy first reads each line from memory
//! (read-for-ownership), then writes it back later, and the next atomic
//! instruction waits for all of it. Streaming stores write whole lines
//! straight to memory without reading them, and leave the caches to data
//! that is used again.

/// Copies `n` bytes from `src` to `dst`, streaming the 64-byte-aligned
/// middle of the destination.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping(src, dst, n)`.
#[inline]
pub unsafe fn copy_streaming(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = dst.align_offset(64).min(n);
        let body = (n - head) / 64 * 64;
        if body == 0 {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
            return;
        }
        // SAFETY: every pointer below stays inside `[src, src+n)` and
        // `[dst, dst+n)`, which the caller vouches for; `d` is 64-byte
        // aligned in the loop, as `_mm_stream_si128` needs 16.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (mut s, mut d) = (src.add(head), dst.add(head));
            let end = d.add(body);
            while d < end {
                let a = _mm_loadu_si128(s as *const __m128i);
                let b = _mm_loadu_si128(s.add(16) as *const __m128i);
                let c = _mm_loadu_si128(s.add(32) as *const __m128i);
                let e = _mm_loadu_si128(s.add(48) as *const __m128i);
                _mm_stream_si128(d as *mut __m128i, a);
                _mm_stream_si128(d.add(16) as *mut __m128i, b);
                _mm_stream_si128(d.add(32) as *mut __m128i, c);
                _mm_stream_si128(d.add(48) as *mut __m128i, e);
                s = s.add(64);
                d = d.add(64);
            }
            std::ptr::copy_nonoverlapping(s, d, n - head - body);
            // Streaming stores are weakly ordered: make them visible before
            // the lock that publishes them is released.
            _mm_sfence();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the 64-byte body, at every destination
    /// alignment in a line: the bytes land, the neighbours do not change.
    #[test]
    fn copies_exactly_the_range_at_any_alignment() {
        let src: Vec<u8> = (0..1024u32).map(|i| (i * 31 + 7) as u8).collect();
        for dst_off in 0..64 {
            for n in [0, 1, 63, 64, 65, 127, 128, 200, 511, 700] {
                let mut dst = vec![0xAAu8; 1024 + 128];
                let base = dst.as_mut_ptr().align_offset(64);
                let at = base + dst_off;
                // SAFETY: `src` has at least `n` bytes and `dst[at..at+n]`
                // lies inside `dst`; the two buffers are distinct.
                unsafe { copy_streaming(src.as_ptr().add(3), dst.as_mut_ptr().add(at), n) };
                assert_eq!(&dst[at..at + n], &src[3..3 + n], "off {dst_off} len {n}");
                assert!(dst[..at].iter().all(|&b| b == 0xAA));
                assert!(dst[at + n..].iter().all(|&b| b == 0xAA));
            }
        }
    }
}
