//! DeepSeek-V4's manifold-constrained hyper-connections (mHC; HF `DeepseekV4HyperConnection`
//! and `DeepseekV4HyperHead`). The residual is `n` streams of the hidden width. Around each
//! sub-layer a site reads all streams (flattened, RMS-normalised without weight) through one
//! projection into three weights:
//! * `pre = σ(a·s₀ + b) + ε` collapses the streams into the sub-layer's input `Σ_j pre_j x_j`;
//! * `post = 2σ(a'·s₁ + b')` expands its output back over the streams;
//! * `comb`: a row softmax `+ ε`, then Sinkhorn normalisation (columns, then `iters − 1` times
//!   rows and columns), mixes the streams: `x'_k = post_k·y + Σ_j comb[j][k]·x_j`.
//!
//! The head collapses the final streams with its own `pre` weights before the final norm.

use crate::error::Result;
use crate::kernels::math::exp;
use crate::kernels::ops::{dot16, rms_inv, sigmoid};
use crate::model::Loader;

/// One site's parameters.
#[derive(Debug, Clone)]
pub struct HyperSite {
    /// `[(2 + n)·n, n·H]` projection (`fn`).
    pub proj: Vec<f32>,
    /// `[(2 + n)·n]` (`base`).
    pub base: Vec<f32>,
    /// `pre`, `post` and `comb` scales.
    pub scale: [f32; 3],
    pub streams: usize,
    pub iters: usize,
    /// Sinkhorn and weight floor (`hc_eps`).
    pub hc_eps: f32,
    /// The flattened streams' RMSNorm epsilon (`rms_norm_eps`).
    pub norm_eps: f32,
}

/// Mixing weights of one row at one site, flat: `pre` (`n`), `post` (`n`), then `comb`
/// (`n × n`, `comb[j·n + k]`: stream `j`'s share in output stream `k`); the layout the
/// device kernels read too (`deltafin_hyper_weights`).
#[derive(Debug, Clone, PartialEq)]
pub struct HyperWeights<'a> {
    pub pre: &'a [f32],
    pub post: &'a [f32],
    pub comb: &'a [f32],
}

impl<'a> HyperWeights<'a> {
    /// The weights of `n` streams in `flat` ([`HyperSite::mix_count`] values).
    pub fn of(flat: &'a [f32], n: usize) -> Self {
        let (pre, rest) = flat.split_at(n);
        let (post, comb) = rest.split_at(n);
        HyperWeights {
            pre,
            post,
            comb: &comb[..n * n],
        }
    }
}

/// The flattened streams `x` (RMS-normalised without weight) through `proj` rows.
pub fn mixes(proj: &[f32], x: &[f32], eps: f32) -> Vec<f32> {
    let inv = rms_inv(x, eps);
    let normed: Vec<f32> = x.iter().map(|v| v * inv).collect();
    proj.chunks(x.len()).map(|row| dot16(&normed, row)).collect()
}

impl HyperSite {
    /// The site `{p}.fn` / `{p}.base` / `{p}.scale` (HF names) for `streams` of `hidden`.
    pub fn load(
        ld: &Loader<'_>,
        p: &str,
        (streams, hidden): (usize, usize),
        iters: usize,
        eps: (f32, f32),
    ) -> Result<Self> {
        let m = (2 + streams) * streams;
        let scale = ld.floats(&format!("{p}.scale"), &[3])?;
        Ok(HyperSite {
            proj: ld.floats(&format!("{p}.fn"), &[m, streams * hidden])?,
            base: ld.floats(&format!("{p}.base"), &[m])?,
            scale: [scale[0], scale[1], scale[2]],
            streams,
            iters,
            hc_eps: eps.0,
            norm_eps: eps.1,
        })
    }

    /// Mixing values per row: `(2 + n)·n`.
    pub fn mix_count(&self) -> usize {
        (2 + self.streams) * self.streams
    }

    /// The flat weights (see [`HyperWeights`]) of one row's streams `x` (`n·H` values,
    /// stream-major).
    pub fn weights(&self, x: &[f32]) -> Vec<f32> {
        self.weights_of(&mixes(&self.proj, x, self.norm_eps))
    }

    /// The flat weights from the row's mixes `m` (its normalised streams through `proj`).
    pub fn weights_of(&self, m: &[f32]) -> Vec<f32> {
        let n = self.streams;
        let mut w: Vec<f32> = (0..n)
            .map(|j| sigmoid(m[j] * self.scale[0] + self.base[j]) + self.hc_eps)
            .collect();
        w.extend((0..n).map(|j| 2.0 * sigmoid(m[n + j] * self.scale[1] + self.base[n + j])));
        w.extend((0..n * n).map(|i| m[2 * n + i] * self.scale[2] + self.base[2 * n + i]));
        let comb = &mut w[2 * n..];
        for row in comb.chunks_mut(n) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row.iter_mut().for_each(|v| *v = exp(*v - max));
            let sum: f32 = row.iter().sum();
            row.iter_mut().for_each(|v| *v = *v / sum + self.hc_eps);
        }
        normalise_columns(comb, n, self.hc_eps);
        for _ in 1..self.iters {
            for row in comb.chunks_mut(n) {
                let sum: f32 = row.iter().sum::<f32>() + self.hc_eps;
                row.iter_mut().for_each(|v| *v /= sum);
            }
            normalise_columns(comb, n, self.hc_eps);
        }
        w
    }
}

/// Divide each column of the `n × n` matrix by its sum plus `eps` (rows summed in order).
fn normalise_columns(comb: &mut [f32], n: usize, eps: f32) {
    for k in 0..n {
        let sum = (0..n).map(|j| comb[j * n + k]).sum::<f32>() + eps;
        (0..n).for_each(|j| comb[j * n + k] /= sum);
    }
}

/// `Σ_j pre_j · x_j`: one row's streams collapsed (streams summed in order).
pub fn collapse(pre: &[f32], x: &[f32], out: &mut [f32]) {
    let h = out.len();
    out.fill(0.0);
    for (j, &p) in pre.iter().enumerate() {
        out.iter_mut()
            .zip(&x[j * h..(j + 1) * h])
            .for_each(|(o, v)| *o += p * v);
    }
}

/// `x'_k = post_k · y + Σ_j comb[j][k] · x_j` for one row, in place of `x`.
pub fn expand(w: &HyperWeights<'_>, y: &[f32], x: &mut [f32]) {
    let (n, h) = (w.post.len(), y.len());
    let old = x.to_vec();
    for k in 0..n {
        for (d, out) in x[k * h..(k + 1) * h].iter_mut().enumerate() {
            let mut mix = 0.0f32;
            for j in 0..n {
                mix += w.comb[j * n + k] * old[j * h + d];
            }
            *out = w.post[k] * y[d] + mix;
        }
    }
}

/// A site over `n` rows of `streams` (each `S·h` values, stream-major): every row's flat
/// weights ([`HyperWeights`]) and its collapsed sub-layer input (`n × h`).
pub fn site_rows(site: &HyperSite, streams: &[f32], (n, h): (usize, usize)) -> (Vec<f32>, Vec<f32>) {
    let width = site.streams * h;
    let mut out = vec![0.0f32; n * h];
    let mut weights = Vec::with_capacity(n * site.mix_count());
    for (x, o) in streams.chunks(width).zip(out.chunks_mut(h)).take(n) {
        let w = site.weights(x);
        collapse(&w[..site.streams], x, o);
        weights.extend(w);
    }
    (weights, out)
}

/// [`expand`] over `n` rows of `S` streams: `weights` as [`site_rows`] gives them, `y` the
/// sub-layer's `n × h` output.
pub fn expand_rows(weights: &[f32], y: &[f32], streams: &mut [f32], (s, h): (usize, usize)) {
    let m = (2 + s) * s;
    for ((w, y), x) in weights.chunks(m).zip(y.chunks(h)).zip(streams.chunks_mut(s * h)) {
        expand(&HyperWeights::of(w, s), y, x);
    }
}

/// The final collapse (`hc_head_fn` / `hc_head_base` / `hc_head_scale`).
#[derive(Debug, Clone)]
pub struct HyperHead {
    /// `[n, n·H]`.
    pub proj: Vec<f32>,
    pub base: Vec<f32>,
    pub scale: f32,
    pub hc_eps: f32,
    pub norm_eps: f32,
}

impl HyperHead {
    /// The head `{p}.hc_fn` / `{p}.hc_base` / `{p}.hc_scale` (HF names).
    pub fn load(
        ld: &Loader<'_>,
        p: &str,
        (streams, hidden): (usize, usize),
        eps: (f32, f32),
    ) -> Result<Self> {
        Ok(HyperHead {
            proj: ld.floats(&format!("{p}.hc_fn"), &[streams, streams * hidden])?,
            base: ld.floats(&format!("{p}.hc_base"), &[streams])?,
            scale: ld.floats(&format!("{p}.hc_scale"), &[1])?[0],
            hc_eps: eps.0,
            norm_eps: eps.1,
        })
    }

    /// One row's streams `x` collapsed into `out`.
    pub fn collapse(&self, x: &[f32], out: &mut [f32]) {
        let pre = self.weights_of(&mixes(&self.proj, x, self.norm_eps));
        collapse(&pre, x, out);
    }

    /// Each of `n` rows of `streams` collapsed (`n × h`).
    pub fn rows(&self, streams: &[f32], (n, h): (usize, usize)) -> Vec<f32> {
        let width = streams.len() / n.max(1);
        let mut out = vec![0.0f32; n * h];
        for (x, o) in streams.chunks(width.max(1)).zip(out.chunks_mut(h)) {
            self.collapse(x, o);
        }
        out
    }

    /// The collapse weights from the row's mixes `m`.
    pub fn weights_of(&self, m: &[f32]) -> Vec<f32> {
        m.iter()
            .zip(&self.base)
            .map(|(&v, &b)| sigmoid(v * self.scale + b) + self.hc_eps)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sinkhorn leaves `comb` doubly stochastic (to its epsilon), whatever the projection.
    #[test]
    fn comb_is_doubly_stochastic() {
        let (n, h) = (4, 8);
        let site = HyperSite {
            proj: (0..(2 + n) * n * n * h)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
                .collect(),
            base: (0..(2 + n) * n).map(|i| (i as f32 - 10.0) / 7.0).collect(),
            scale: [0.8, 1.1, 1.3],
            streams: n,
            iters: 20,
            hc_eps: 1e-6,
            norm_eps: 1e-6,
        };
        let x: Vec<f32> = (0..n * h).map(|i| ((i * 13 % 17) as f32 - 8.0) / 3.0).collect();
        let flat = site.weights(&x);
        let w = HyperWeights::of(&flat, n);
        for k in 0..n {
            let col: f32 = (0..n).map(|j| w.comb[j * n + k]).sum();
            let row: f32 = w.comb[k * n..(k + 1) * n].iter().sum();
            assert!(
                (col - 1.0).abs() < 1e-4 && (row - 1.0).abs() < 1e-3,
                "{col} {row}"
            );
        }
        assert!(w.pre.iter().all(|&p| p > 0.0 && p <= 1.0 + 1e-6));
        assert!(w.post.iter().all(|&p| p > 0.0 && p < 2.0));
    }
}
