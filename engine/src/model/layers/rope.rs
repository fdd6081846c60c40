//! Rotary position embedding on one head vector: DeepSeek's interleaved pair layout (output
//! de-interleaved, as HF `apply_rotary_pos_emb_interleave`) or the Llama `rotate_half` layout.

use crate::config::RopeConfig;

/// Precomputed RoPE frequencies.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    attention_factor: f32,
    interleave: bool,
}

impl Rope {
    /// Frequencies for a rotary width `dim`.
    pub fn new(cfg: &RopeConfig, dim: usize, interleave: bool) -> Self {
        let (inv_freq, attention_factor) = cfg.inv_freq(dim);
        Rope {
            inv_freq,
            attention_factor,
            interleave,
        }
    }

    /// Rotate `x` (length `dim`) in place for absolute position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let mut f = [0.0f32; 512];
        let f = &mut f[..2 * self.inv_freq.len()];
        self.factors_into(pos, f);
        self.apply_factors(x, f);
    }

    /// The rotation factors of position `pos`, `(cos·m, sin·m)` per frequency (`m` the attention
    /// factor), into `out` (`dim` values). Computed on the host only, so a GPU applying them
    /// ([`Rope::apply_factors`], `deltafin_rope`) rotates with the CPU's exact values.
    pub fn factors_into(&self, pos: usize, out: &mut [f32]) {
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let angle = pos as f32 * f;
            out[2 * i] = angle.cos() * self.attention_factor;
            out[2 * i + 1] = angle.sin() * self.attention_factor;
        }
    }

    /// The rotary width.
    pub fn dim(&self) -> usize {
        2 * self.inv_freq.len()
    }

    /// Whether pairs are interleaved (DeepSeek) rather than split in halves (Llama).
    pub fn interleaved(&self) -> bool {
        self.interleave
    }

    /// Rotate `x` in place by precomputed `factors` (see [`Rope::factors_into`]).
    pub fn apply_factors(&self, x: &mut [f32], factors: &[f32]) {
        let half = self.inv_freq.len();
        debug_assert_eq!(x.len(), 2 * half);
        let mut out = [0.0f32; 512];
        let out = &mut out[..2 * half];
        for i in 0..half {
            let (cos, sin) = (factors[2 * i], factors[2 * i + 1]);
            let (a, b) = if self.interleave {
                (x[2 * i], x[2 * i + 1])
            } else {
                (x[i], x[i + half])
            };
            out[i] = a * cos - b * sin;
            out[i + half] = b * cos + a * sin;
        }
        x.copy_from_slice(out);
    }
}
