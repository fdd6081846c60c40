//! RoPE parameters in either spelling (`rope_parameters`, or legacy `rope_scaling` + `rope_theta`)
//! and the YaRN frequency / attention-scale computation of HF `modeling_rope_utils`.

use serde_json::Value;

use super::Fields;
use crate::error::Result;

/// Frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// YaRN with HF's parameter names.
    Yarn {
        factor: f64,
        beta_fast: f64,
        beta_slow: f64,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        original_max_position_embeddings: usize,
        attention_factor: Option<f64>,
        truncate: bool,
    },
}

/// RoPE configuration (the default is HF's when nothing is given: plain RoPE, θ = 10,000).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    pub scaling: RopeScaling,
}

impl Default for RopeConfig {
    fn default() -> Self {
        RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::Default,
        }
    }
}

impl RopeConfig {
    /// The rotated fraction of each head: `rope_parameters.partial_rotary_factor`, else the
    /// top-level `partial_rotary_factor` (older spelling), else `default` (the family's HF
    /// default).
    pub(crate) fn partial_rotary_factor(f: Fields<'_>, default: f64) -> Result<f64> {
        let nested = match f.get("rope_parameters") {
            Some(Value::Object(p)) => p.get("partial_rotary_factor").and_then(Value::as_f64),
            _ => None,
        };
        Ok(match nested {
            Some(x) => x,
            None => f.opt_f64("partial_rotary_factor")?.unwrap_or(default),
        })
    }

    /// Parse from a (text) config. `max_position_embeddings` is YaRN's fallback for the original
    /// length, as in HF.
    pub(crate) fn parse(f: Fields<'_>, max_position_embeddings: usize) -> Result<RopeConfig> {
        let params = match (f.get("rope_parameters"), f.get("rope_scaling")) {
            (Some(p), _) => Some(("rope_parameters", p)),
            (None, Some(s)) => Some(("rope_scaling", s)),
            (None, None) => None,
        };
        let Some((key, Value::Object(map))) = params else {
            if let Some((key, _)) = params {
                return Err(f.err(key, "expected an object"));
            }
            return Ok(RopeConfig {
                theta: f.f64("rope_theta")?,
                scaling: RopeScaling::Default,
            });
        };
        let scope = format!("{}{key}.", f.scope);
        let p = Fields {
            map,
            path: f.path,
            scope: &scope,
        };
        let theta = match p.opt_f64("rope_theta")? {
            Some(t) => t,
            None => f.f64("rope_theta")?,
        };
        let kind = p
            .opt_str("rope_type")?
            .or(p.opt_str("type")?)
            .unwrap_or("default");
        let scaling = match kind {
            "default" => RopeScaling::Default,
            "yarn" => {
                let original = match p.opt_usize("original_max_position_embeddings")? {
                    Some(o) => o,
                    None => f
                        .opt_usize("original_max_position_embeddings")?
                        .unwrap_or(max_position_embeddings),
                };
                let factor = match p.opt_f64("factor")? {
                    Some(x) => x,
                    None => max_position_embeddings as f64 / original as f64,
                };
                if factor <= 0.0 {
                    return Err(p.err("factor", "must be positive"));
                }
                RopeScaling::Yarn {
                    factor,
                    beta_fast: p.opt_f64("beta_fast")?.filter(|&b| b != 0.0).unwrap_or(32.0),
                    beta_slow: p.opt_f64("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
                    mscale: p.opt_f64("mscale")?,
                    mscale_all_dim: p.opt_f64("mscale_all_dim")?,
                    original_max_position_embeddings: original,
                    attention_factor: p.opt_f64("attention_factor")?,
                    truncate: p.opt_bool("truncate")?.unwrap_or(true),
                }
            }
            other => {
                return Err(p.err(
                    "rope_type",
                    format!("unsupported RoPE type `{other}` (supported: default, yarn)"),
                ));
            }
        };
        if theta <= 0.0 {
            return Err(p.err("rope_theta", "must be positive"));
        }
        Ok(RopeConfig { theta, scaling })
    }

    /// Inverse frequencies for a rotary dimension `dim` (f32 arithmetic, as torch computes them),
    /// and the factor applied to cos/sin.
    pub fn inv_freq(&self, dim: usize) -> (Vec<f32>, f32) {
        let base = self.theta as f32;
        let pos_freqs: Vec<f32> = (0..dim / 2)
            .map(|i| base.powf((2 * i) as f32 / dim as f32))
            .collect();
        match &self.scaling {
            RopeScaling::Default => (pos_freqs.iter().map(|p| 1.0 / p).collect(), 1.0),
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                original_max_position_embeddings,
                attention_factor,
                truncate,
            } => {
                let attention = match (attention_factor, mscale, mscale_all_dim) {
                    (Some(a), _, _) => *a,
                    (None, Some(m), Some(a)) if *m != 0.0 && *a != 0.0 => {
                        yarn_mscale(*factor, *m) / yarn_mscale(*factor, *a)
                    }
                    _ => yarn_mscale(*factor, 1.0),
                };
                let correction = |rot: f64| {
                    (dim as f64
                        * (*original_max_position_embeddings as f64 / (rot * 2.0 * std::f64::consts::PI))
                            .ln())
                        / (2.0 * self.theta.ln())
                };
                let (mut low, mut high) = (correction(*beta_fast), correction(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let high = high.min(dim as f64 - 1.0);
                let (min, max) = (
                    low as f32,
                    if low == high {
                        high as f32 + 0.001
                    } else {
                        high as f32
                    },
                );
                let factor = *factor as f32;
                let inv = pos_freqs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let ramp = ((i as f32 - min) / (max - min)).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        let interp = 1.0 / (factor * p);
                        let extrap = 1.0 / p;
                        interp * (1.0 - extrapolation) + extrap * extrapolation
                    })
                    .collect();
                (inv, attention as f32)
            }
        }
    }

    /// DeepSeek's softmax-scale multiplier: `mscale(factor, mscale_all_dim)²` for YaRN with a
    /// non-zero `mscale_all_dim`, else 1 (HF `yarn_apply_mscale`).
    pub fn softmax_scale_multiplier(&self) -> f64 {
        match &self.scaling {
            RopeScaling::Yarn {
                factor,
                mscale_all_dim: Some(m),
                ..
            } if *m != 0.0 => {
                let s = yarn_mscale(*factor, *m);
                s * s
            }
            _ => 1.0,
        }
    }
}

/// `0.1 * mscale * ln(scale) + 1` for `scale > 1`, else 1.
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}
