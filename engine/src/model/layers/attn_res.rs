//! Block Attention Residuals (Kimi K3; `reference/kimi-k3.md` §1.2).
//!
//! A sub-layer's input is a softmax-weighted mix over depth of the completed block
//! representations ("anchors") and the current partial sum. For values `v_0 … v_N`:
//! `k_i = RMS(v_i)` (unweighted RMS normalisation), `s_i = Σ_j k_i[j] · q[j]` (in the canonical
//! 16-lane order of `kernels::reference::dot`, so `deltafin_attn_res` on a GPU matches),
//! `α = softmax(s)` in f32, output `Σ_i α_i v_i`. The pseudo-query `q` is formed once at load
//! time as `res_norm.weight ⊙ res_proj.weight[0]` (the reference operation order, equal to a
//! weighted RMSNorm followed by the `[1, H]` projection). Everything is f32 and row-local.

use crate::kernels::LANES;
use crate::kernels::math::exp;
use crate::kernels::ops::rms_inv;
use crate::kernels::reference::reduce_lanes;

/// One AttnRes site (attention input, FFN input, or the tail).
#[derive(Debug, Clone)]
pub struct AttnRes {
    /// `norm.weight ⊙ proj.weight[0]`, length `H`.
    pub query: Vec<f32>,
    pub eps: f32,
}

impl AttnRes {
    /// The pseudo-query from the norm weight and the `[1, H]` projection row.
    pub fn new(norm: &[f32], proj: &[f32], eps: f32) -> Self {
        debug_assert_eq!(norm.len(), proj.len());
        AttnRes {
            query: norm.iter().zip(proj).map(|(n, p)| n * p).collect(),
            eps,
        }
    }

    /// Mix one row: `anchors[a]` is anchor `a`'s row (each `H` values), `last` the partial sum.
    /// Writes `Σ α_i v_i` (anchors first, `last` at the end) into `out`.
    pub fn mix(&self, anchors: &[&[f32]], last: &[f32], out: &mut [f32]) {
        mix(&self.query, self.eps, anchors, last, out)
    }
}

/// [`AttnRes::mix`] by the pseudo-query `query` (`H` values) and `eps`.
pub fn mix(query: &[f32], eps: f32, anchors: &[&[f32]], last: &[f32], out: &mut [f32]) {
    let mut scores = Vec::with_capacity(anchors.len() + 1);
    for v in anchors.iter().copied().chain(std::iter::once(last)) {
        scores.push(score(query, eps, v));
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    crate::kernels::math::fma_scope(|| {
        for s in scores.iter_mut() {
            *s = exp(*s - max);
            sum += *s;
        }
    });
    out.iter_mut().for_each(|o| *o = 0.0);
    for (v, s) in anchors.iter().copied().chain(std::iter::once(last)).zip(&scores) {
        let alpha = s / sum;
        for (o, &x) in out.iter_mut().zip(v) {
            *o += alpha * x;
        }
    }
}

/// `Σ_j RMS(v)[j] · q[j]`: lane `j mod 16` accumulates `fma(v[j]·inv, q[j], acc)` in order,
/// then the fixed lane tree.
fn score(query: &[f32], eps: f32, v: &[f32]) -> f32 {
    let inv = rms_inv(v, eps);
    crate::kernels::math::fma_scope(|| {
        let mut acc = [0.0f32; LANES];
        for (j, (&x, &q)) in v.iter().zip(query).enumerate() {
            acc[j % LANES] = (x * inv).mul_add(q, acc[j % LANES]);
        }
        reduce_lanes(&mut acc)
    })
}

#[cfg(test)]
mod tests {
    use super::AttnRes;

    #[test]
    fn single_value_passes_through_and_equal_scores_average() {
        let r = AttnRes::new(&[1.0, 1.0], &[0.5, -0.5], 1e-5);
        let mut out = [0.0; 2];
        r.mix(&[], &[3.0, -1.0], &mut out);
        assert_eq!(out, [3.0, -1.0]);
        // Two values with the same RMS-normalised direction get equal weight.
        r.mix(&[&[2.0, 2.0]], &[4.0, 4.0], &mut out);
        assert!(
            (out[0] - 3.0).abs() < 1e-6 && (out[1] - 3.0).abs() < 1e-6,
            "{out:?}"
        );
    }

    #[test]
    fn scores_follow_the_pseudo_query() {
        // q favours the first channel: the value pointing there dominates.
        let r = AttnRes::new(&[2.0, 1.0], &[5.0, 0.0], 1e-5);
        let mut out = [0.0; 2];
        r.mix(&[&[1.0, 0.0]], &[0.0, 1.0], &mut out);
        assert!(out[0] > 0.99 && out[1] < 0.01, "{out:?}");
    }
}
