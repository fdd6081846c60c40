//! Row-wise f32 operations used by the architectures (norms, activations, softmax). Each works on
//! one row at a time, so results never depend on how many rows are processed together, and uses
//! the device-independent [`math`](super::math) functions and the canonical 16-lane sum, so a GPU
//! kernel can compute the same bits (`backend/cuda/layers.cu`).

use super::math::exp;
pub use super::math::sigmoid;
use super::reference::dot;

/// HF-style RMSNorm of one row in f32: `out = weight * (x * 1/sqrt(mean(x²) + eps))`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), weight.len());
    let inv = rms_inv(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * inv);
    }
}

/// `1 / sqrt(mean(x²) + eps)`, the sum of squares in the canonical 16-lane order
/// ([`dot`]`(x, x)`), then one division, square root and division, each rounded once.
pub fn rms_inv(x: &[f32], eps: f32) -> f32 {
    1.0 / (dot(x, x) / x.len() as f32 + eps).sqrt()
}

/// In-place RMSNorm.
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let inv = rms_inv(x, eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = w * (*v * inv);
    }
}

/// SiLU (`x * sigmoid(x)`).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// Numerically stable in-place softmax.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    super::math::fma_scope(|| {
        for v in x.iter_mut() {
            *v = exp(*v - max);
            sum += *v;
        }
    });
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// Index of the largest value (lowest index wins ties); NaN never wins.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] || x[best].is_nan() {
            best = i;
        }
    }
    best
}
