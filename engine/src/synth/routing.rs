//! How a synthetic checkpoint's routers behave: the knobs ([`RoutingShape`]) and the named
//! routing models built from them ([`RoutingModel`]).
//!
//! Random weights route close to the worst case an expert cache can see: every token picks its
//! experts almost independently of the previous one, and every expert is picked about as often.
//! Real MoE routers are not like that (`shared/reference/performance.md` §2.6): consecutive
//! tokens reuse experts (29.5 % of K3's top-16, 41.3 % of GLM-5.2's top-8 come back at the next
//! token), and load is uneven between experts and between layers. Three knobs shape the
//! synthetic router after those measurements:
//!
//! - **temporal reuse** (`locality`): token embeddings are written with RMS `8^(1 - 2·locality)`
//!   against the O(1) outputs of the attention and FFN blocks. A large embedding (0) makes each
//!   token's own identity decide its routes; a small one (1) lets the slowly-changing attention
//!   context decide, so consecutive tokens share experts;
//! - **skew** (`skew`): each MoE layer's `e_score_correction_bias` (selection only, like
//!   DeepSeek's balancing bias) gets a per-expert offset drawn from N(0, σ_l²), so some experts
//!   win more often than others. Hot experts are hot for every stream, which is what makes
//!   concurrent streams overlap beyond chance;
//! - **per-layer skew** (`layer_spread`): σ_l = skew · (1 + layer_spread · (2u_l − 1)) with u_l
//!   uniform in [0, 1) per layer from the seed, so some layers are flat and some skewed, as
//!   measured (K3's tail mass per layer ranges 21.6-48.4 %).
//!
//! What the models give is measured by `deltafin bench serve --routing …` (previous-token
//! reuse, look-ahead recall, experts per layer per step at each concurrency level) and listed in
//! `docs/performance.md`.

use super::Rng;

/// Knobs shaping how the synthetic router behaves (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutingShape {
    /// Mean standard deviation of per-expert selection-bias offsets (0: balanced).
    pub skew: f32,
    /// 0: routes follow the token; 1: routes follow the context (more token-to-token reuse).
    pub locality: f32,
    /// Relative spread of the skew between layers (0: every layer has `skew`).
    pub layer_spread: f32,
}

impl Default for RoutingShape {
    fn default() -> Self {
        RoutingShape {
            skew: 0.0,
            locality: 0.5,
            layer_spread: 0.0,
        }
    }
}

impl RoutingShape {
    /// RMS of the token embeddings relative to the blocks' O(1) outputs.
    pub fn embed_rms(&self) -> f32 {
        8f32.powf(1.0 - 2.0 * self.locality.clamp(0.0, 1.0))
    }

    /// σ of layer `layer`'s selection-bias offsets, drawn from `seed`.
    pub fn layer_skew(&self, seed: u64, layer: usize) -> f32 {
        if self.layer_spread == 0.0 {
            return self.skew;
        }
        let mut rng = Rng::new(seed ^ 0x005E_ED0F_5C3E ^ (layer as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let u = rng.unit();
        (self.skew * (1.0 + self.layer_spread.clamp(0.0, 1.0) * (2.0 * u - 1.0))).max(0.0)
    }
}

/// Named routing models for `deltafin synth --routing` and `deltafin bench serve --routing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutingModel {
    /// Random weights as they come: independent, balanced routes (the worst case for a cache,
    /// and the case the I/O bound formula assumes). The benchmark model's default.
    Uniform,
    /// Calibrated to the published measurements of §2.6: previous-token reuse in the measured
    /// 29.5-41.3 % band, and uneven load that differs between layers.
    Published,
}

impl RoutingModel {
    /// Every model, in the order benchmarks list them.
    pub const ALL: [RoutingModel; 2] = [RoutingModel::Uniform, RoutingModel::Published];

    /// The model's knobs.
    pub fn shape(self) -> RoutingShape {
        match self {
            RoutingModel::Uniform => RoutingShape::default(),
            RoutingModel::Published => RoutingShape {
                skew: PUBLISHED_SKEW,
                locality: PUBLISHED_LOCALITY,
                layer_spread: PUBLISHED_LAYER_SPREAD,
            },
        }
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            RoutingModel::Uniform => "uniform",
            RoutingModel::Published => "published",
        }
    }

    /// The model named `name`.
    pub fn parse(name: &str) -> Option<RoutingModel> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Calibrated on the `bench serve` model (64 experts, top-6; see `docs/performance.md`).
const PUBLISHED_LOCALITY: f32 = 0.8;
const PUBLISHED_SKEW: f32 = 0.13;
const PUBLISHED_LAYER_SPREAD: f32 = 0.8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_shape_is_the_uniform_model_and_writes_the_same_bytes_as_before() {
        // The built-in and benchmark checkpoints were written with skew 0 and locality 0.5:
        // their embeddings (RMS 1) and biases must not change.
        let s = RoutingModel::Uniform.shape();
        assert_eq!(s, RoutingShape::default());
        assert_eq!(s.embed_rms(), 1.0);
        assert_eq!(s.layer_skew(7, 3), 0.0);
    }

    #[test]
    fn per_layer_skew_varies_around_the_mean_within_the_spread() {
        let s = RoutingShape {
            skew: 0.1,
            locality: 0.5,
            layer_spread: 0.8,
        };
        let v: Vec<f32> = (0..64).map(|l| s.layer_skew(1, l)).collect();
        assert!(
            v.iter().all(|&x| (0.02 - 1e-6..=0.18 + 1e-6).contains(&x)),
            "{v:?}"
        );
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!((mean - 0.1).abs() < 0.02, "mean {mean}");
        assert!(v.windows(2).any(|w| w[0] != w[1]));
        assert_eq!(v[5], s.layer_skew(1, 5), "drawn from the seed");
        assert_ne!(s.layer_skew(2, 5), v[5]);
    }

    #[test]
    fn names_round_trip() {
        for m in RoutingModel::ALL {
            assert_eq!(RoutingModel::parse(m.name()), Some(m));
        }
        assert_eq!(RoutingModel::parse("zipf"), None);
    }
}
