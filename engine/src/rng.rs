//! A small deterministic PRNG (SplitMix64) using only integer arithmetic and exact float
//! scaling, so synthetic weights are identical on every platform.

/// SplitMix64's state increment.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A generator for stream `key` of `seed` (independent per tensor).
    pub fn keyed(seed: u64, key: &str) -> Self {
        let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
        for b in key.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// Output `k` (0-based) of `Rng::new(state)`, without producing the ones before it: the
    /// state advances by a constant, so draws can be computed independently (in parallel,
    /// vectorised) and still match the sequential stream exactly.
    pub fn nth_of(state: u64, k: u64) -> u64 {
        mix(state.wrapping_add(k.wrapping_add(1).wrapping_mul(GAMMA)))
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-a, a).
    pub fn symmetric(&mut self, a: f32) -> f32 {
        (self.unit() * 2.0 - 1.0) * a
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn nth_of_matches_the_sequential_stream() {
        let mut r = Rng::new(0xABCD);
        for k in 0..100 {
            assert_eq!(r.next_u64(), Rng::nth_of(0xABCD, k));
        }
    }
}
