//! The load generators' random offsets and mixes (pure): SplitMix64, a
//! few instructions per number, seeded per job so jobs do not walk the
//! same offsets. Not for anything secret. (`sim::Rng` is the test
//! suite's seeded generator and is not compiled into the shipped binary.)

/// A SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), without modulo bias worth measuring.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// True with probability `pct` percent.
    #[inline]
    pub fn percent(&mut self, pct: u32) -> bool {
        self.below(100) < pct as u64
    }

    /// Fills `buf` with random bytes (the data written: incompressible, so
    /// no layer below can shortcut it).
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_enough_and_reproducible() {
        let mut r = Rng::new(7);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
        let reads = (0..100_000).filter(|_| r.percent(70)).count();
        assert!((68_000..72_000).contains(&reads), "{reads}");
        assert_eq!(Rng::new(1).next_u64(), Rng::new(1).next_u64());
        let mut buf = [0u8; 13];
        r.fill(&mut buf);
        assert!(buf.iter().any(|&b| b != 0));
    }
}
