//! Token selection: greedy, or seeded sampling with temperature / top-k / top-p. The random
//! draw for a position depends only on `(seed, position)`, so the same request gives the same
//! tokens however it is batched or drafted.

use crate::error::{Error, Result};
use crate::kernels::ops::argmax;

/// How to pick the next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// Highest logit, lowest id on ties.
    Greedy,
    /// Sample from the filtered, temperature-scaled distribution.
    Random {
        temperature: f32,
        top_p: f32,
        top_k: usize,
        /// Drop tokens whose probability is below `min_p` × the top token's (0 = off).
        min_p: f32,
        seed: u64,
    },
}

impl Sampling {
    /// Validated sampling settings; `temperature == 0` means greedy.
    pub fn new(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> Result<Sampling> {
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(Error::InvalidArgument {
                field: "temperature",
                reason: format!("must be >= 0, got {temperature}"),
            });
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(Error::InvalidArgument {
                field: "top_p",
                reason: format!("must be in (0, 1], got {top_p}"),
            });
        }
        Ok(if temperature == 0.0 {
            Sampling::Greedy
        } else {
            Sampling::Random {
                temperature,
                top_p,
                top_k,
                min_p: 0.0,
                seed,
            }
        })
    }

    /// The same settings with a `min_p` filter (`0 <= min_p <= 1`; no effect on greedy).
    pub fn with_min_p(self, min_p: f32) -> Result<Sampling> {
        if !(0.0..=1.0).contains(&min_p) {
            return Err(Error::InvalidArgument {
                field: "min_p",
                reason: format!("must be in [0, 1], got {min_p}"),
            });
        }
        Ok(match self {
            Sampling::Random {
                temperature,
                top_p,
                top_k,
                seed,
                ..
            } => Sampling::Random {
                temperature,
                top_p,
                top_k,
                min_p,
                seed,
            },
            greedy => greedy,
        })
    }

    /// The same settings drawing from another seed (greedy is unchanged).
    pub fn with_seed(self, new_seed: u64) -> Sampling {
        match self {
            Sampling::Random {
                temperature,
                top_p,
                top_k,
                min_p,
                ..
            } => Sampling::Random {
                temperature,
                top_p,
                top_k,
                min_p,
                seed: new_seed,
            },
            greedy => greedy,
        }
    }

    /// Pick the token at absolute sequence `position` from `logits`.
    pub fn pick(&self, logits: &[f32], position: usize) -> u32 {
        match *self {
            Sampling::Greedy => argmax(logits) as u32,
            Sampling::Random {
                temperature,
                top_p,
                top_k,
                min_p,
                seed,
            } => {
                let u = uniform(seed, position as u64);
                sample_filtered(logits, temperature, top_p, top_k, min_p, u)
            }
        }
    }
}

/// Sample with a given uniform draw `u ∈ [0, 1)` (pure; deterministic tie order).
pub fn sample(logits: &[f32], temperature: f32, top_p: f32, top_k: usize, u: f64) -> u32 {
    sample_filtered(logits, temperature, top_p, top_k, 0.0, u)
}

/// [`sample`] with a `min_p` filter, applied after top-k and before top-p (pure). Tokens whose
/// logit is `-inf` (masked) are never drawn.
pub fn sample_filtered(
    logits: &[f32],
    temperature: f32,
    top_p: f32,
    top_k: usize,
    min_p: f32,
    u: f64,
) -> u32 {
    let mut order: Vec<usize> = (0..logits.len())
        .filter(|&i| !logits[i].is_nan() && logits[i] != f32::NEG_INFINITY)
        .collect();
    if order.is_empty() {
        return 0;
    }
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if top_k > 0 {
        order.truncate(top_k);
    }
    let max = logits[order[0]] as f64;
    let t = temperature as f64;
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i] as f64 - max) / t).exp())
        .collect();
    // probs[0] is the largest (exp(0) = 1): min_p keeps p >= min_p * 1 before normalising.
    if min_p > 0.0 {
        let keep = probs.iter().take_while(|&&p| p >= min_p as f64).count().max(1);
        probs.truncate(keep);
        order.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    let mut cumulative = 0.0;
    let mut keep = probs.len();
    for (i, p) in probs.iter().enumerate() {
        cumulative += p;
        if cumulative >= top_p as f64 {
            keep = i + 1;
            break;
        }
    }
    let kept: f64 = probs[..keep].iter().sum();
    let target = u * kept;
    let mut acc = 0.0;
    for (i, p) in probs[..keep].iter().enumerate() {
        acc += p;
        if target < acc {
            return order[i] as u32;
        }
    }
    order[keep - 1] as u32
}

/// A uniform f64 in [0, 1) from `(seed, position)` (SplitMix64 finaliser over both).
pub fn uniform(seed: u64, position: u64) -> f64 {
    let mut z = seed
        ^ position
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_lowest_index_on_ties() {
        assert_eq!(Sampling::Greedy.pick(&[1.0, 3.0, 3.0, f32::NAN], 0), 1);
    }

    #[test]
    fn zero_temperature_is_greedy_and_bad_values_fail() {
        assert_eq!(Sampling::new(0.0, 1.0, 0, 1).unwrap(), Sampling::Greedy);
        assert!(Sampling::new(-1.0, 1.0, 0, 1).is_err());
        assert!(Sampling::new(1.0, 0.0, 0, 1).is_err());
        assert!(Sampling::new(f32::NAN, 1.0, 0, 1).is_err());
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = [0.5, 2.0, 1.0, -1.0];
        for u in [0.0, 0.3, 0.999] {
            assert_eq!(sample(&logits, 1.0, 1.0, 1, u), 1);
            assert_eq!(sample(&logits, 1.0, 1e-6, 0, u), 1);
        }
    }

    #[test]
    fn draws_follow_the_distribution_and_are_seeded() {
        let logits = [0.0f32, (3.0f32).ln()]; // p = 0.25, 0.75
        assert_eq!(sample(&logits, 1.0, 1.0, 0, 0.74), 1);
        assert_eq!(sample(&logits, 1.0, 1.0, 0, 0.76), 0);
        let s = Sampling::new(0.8, 0.9, 40, 7).unwrap();
        let a: Vec<u32> = (0..32).map(|p| s.pick(&[0.1, 0.2, 0.3, 0.25], p)).collect();
        let b: Vec<u32> = (0..32).map(|p| s.pick(&[0.1, 0.2, 0.3, 0.25], p)).collect();
        assert_eq!(a, b);
        let hits = (0..10_000)
            .filter(|&p| sample(&logits, 1.0, 1.0, 0, uniform(3, p)) == 1)
            .count();
        assert!((7_200..7_800).contains(&hits), "{hits}");
    }
}
