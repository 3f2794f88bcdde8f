//! The generator's random numbers: SplitMix64, written out here rather than taken from a crate so
//! that a model's bytes depend only on this file (a crate update could change its stream and with
//! it every synthetic model).

/// SplitMix64 (Steele, Lea, Flood 2014): one 64-bit add and a mixing function per draw.
#[derive(Clone, Debug)]
pub struct Rng(u64);

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijection of u64 that spreads every input bit over the output.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a name: tensors are seeded by name, so a tensor's bytes do not depend on which
/// other tensors the model has (layer 0 is the same in a 2-layer and a 48-layer model).
pub fn hash_name(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The stream of one chunk of one tensor: a pure function of (model seed, tensor, chunk), so
    /// chunks can be generated in any order on any number of threads.
    pub fn for_chunk(seed: u64, tensor: u64, chunk: u64) -> Self {
        Rng(mix64(mix64(mix64(seed) ^ tensor).wrapping_add(chunk)))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix64(self.0)
    }

    /// Uniform in [0, 1) with 24 bits (every value exact in f32).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in [-1, 1).
    pub fn symmetric(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }

    /// Uniform integer in `lo..=hi` (Lemire's multiply-shift; the bias for ranges this small,
    /// at most 2^-56, does not matter here).
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        debug_assert!(lo <= hi);
        let span = u64::from(hi - lo) + 1;
        lo + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // The first outputs of SplitMix64 seeded with 0 (as in the reference C implementation).
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn ranges_stay_in_bounds_and_cover_them() {
        let mut r = Rng::new(7);
        let mut seen = [false; 6];
        for _ in 0..1000 {
            let v = r.range(3, 8);
            assert!((3..=8).contains(&v));
            seen[(v - 3) as usize] = true;
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn chunk_streams_differ() {
        let a = Rng::for_chunk(1, hash_name("a"), 0).next_u64();
        assert_ne!(a, Rng::for_chunk(1, hash_name("a"), 1).next_u64());
        assert_ne!(a, Rng::for_chunk(1, hash_name("b"), 0).next_u64());
        assert_ne!(a, Rng::for_chunk(2, hash_name("a"), 0).next_u64());
        assert_eq!(a, Rng::for_chunk(1, hash_name("a"), 0).next_u64());
    }
}
