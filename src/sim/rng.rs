//! The one seeded generator of the tests and simulators: SplitMix64
//! (Steele, Lea and Flood, "Fast splittable pseudorandom number
//! generators", OOPSLA 2014), the generator Java's `SplittableRandom` and
//! xoshiro's seeding use.
//!
//! Small, fast, and reproducible from its seed; not cryptographic. Every
//! 64-bit state is valid (the state is a counter stepped by the golden
//! ratio, so no seed is degenerate) and the period is 2^64.
//!
//! Stability: the sequence for a seed is part of the contract. Tests print
//! their seed so a failure replays; changing this generator changes what
//! every recorded seed means, so do not.

/// The golden-ratio increment of SplitMix64.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A SplitMix64 generator. Cloning forks an identical sequence.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`; the same seed gives the same sequence.
    pub fn seed(seed: u64) -> Rng {
        Rng(seed ^ GOLDEN)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`; `n` must be > 0. (A modulo: its bias, below
    /// `n / 2^64`, does not matter to a test.)
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        self.next_u64() % n
    }

    /// Uniform in `[0, 1)`, 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }

    /// Fills `buf` with random bytes (each `next_u64`, little-endian; a
    /// short tail takes the low bytes of one more).
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let n = tail.len();
            tail.copy_from_slice(&self.next_u64().to_le_bytes()[..n]);
        }
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.fill(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducible_and_seed_dependent() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::seed(7);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng::seed(7);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert_ne!(a[0], Rng::seed(8).next_u64());
    }

    #[test]
    fn splitmix64_reference_values() {
        // SplitMix64 from state 0 (Vigna's reference splitmix64.c): the
        // first outputs for x = 0. Our seed(s) starts from s ^ GOLDEN.
        let mut r = Rng::seed(GOLDEN);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn below_fill_and_chance() {
        let mut r = Rng::seed(1);
        assert!((0..1000).all(|_| r.below(3) < 3));
        let mut buf = [0u8; 13];
        r.fill(&mut buf);
        assert!(buf.iter().any(|&b| b != 0));
        let mut a = Rng::seed(2);
        let mut b = Rng::seed(2);
        let mut whole = [0u8; 16];
        a.fill(&mut whole);
        assert_eq!(whole[..8], b.next_u64().to_le_bytes());
        assert!((0..100).all(|_| !r.chance(0.0)) && (0..100).all(|_| r.chance(1.0)));
    }
}
