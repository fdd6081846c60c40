//! Row-wise f32 operations used by the architectures (norms, activations, softmax). Each works on
//! one row at a time, so results never depend on how many rows are processed together, and uses
//! the device-independent [`math`](super::math) functions and the canonical 16-lane sum, so a GPU
//! kernel can compute the same bits (`backend/cuda/layers.cu`).

use super::LANES;
use super::math::exp;
pub use super::math::sigmoid;
use super::reference::reduce_lanes;

/// HF-style RMSNorm of one row in f32: `out = weight * (x * 1/sqrt(mean(x²) + eps))`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), weight.len());
    let inv = rms_inv(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * inv);
    }
}

/// `1 / sqrt(mean(x²) + eps)`, the sum of squares in the canonical 16-lane order
/// ([`lanes_dot`]`(x, x)`), then one division, square root and division, each rounded once.
pub fn rms_inv(x: &[f32], eps: f32) -> f32 {
    let ss = super::math::fma_scope(|| lanes_dot(x, x));
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

/// The canonical 16-lane dot product of two f32 rows: the bits of [`reference::dot`], inlined
/// so that a caller under [`super::math::fma_scope`] gets hardware FMA.
///
/// [`reference::dot`]: super::reference::dot
#[inline(always)]
pub fn lanes_dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let whole = a.len() / LANES * LANES;
    for (x, y) in a[..whole].chunks_exact(LANES).zip(b[..whole].chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    for (l, (x, y)) in a[whole..].iter().zip(&b[whole..]).enumerate() {
        acc[l] = x.mul_add(*y, acc[l]);
    }
    reduce_lanes(&mut acc)
}

/// [`lanes_dot`] with FMA instructions where the CPU has them (the same bits either way):
/// without them `mul_add` is a libm call, ten times slower in attention's inner loops.
#[inline(always)]
pub fn dot16(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the CPU reports AVX2 and FMA (`has_fma`).
        #[allow(unsafe_code)]
        return unsafe { dot16_fma(a, b) };
    }
    lanes_dot(a, b)
}

/// Whether this CPU has AVX2 and FMA (checked once).
#[cfg(target_arch = "x86_64")]
fn has_fma() -> bool {
    static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FMA.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

/// [`lanes_dot`] compiled with FMA instructions. Not `math::fma_scope(|| lanes_dot(a, b))`:
/// that closure was left out of line, its `mul_add`s became `fmaf` calls, and a 1k MLA prefill
/// ran at 43.4–43.8 tok/s against 58.2–59.4.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot16_fma(a: &[f32], b: &[f32]) -> f32 {
    lanes_dot(a, b)
}

/// RMSNorm of every `width`-value row of `x`, into a new buffer (the bits of [`rms_norm`] per
/// row).
pub fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, width: usize) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for (src, dst) in x.chunks(width).zip(out.chunks_mut(width)) {
        rms_norm(src, weight, eps, dst);
    }
    out
}

/// The sum of a row in the canonical 16-lane order (the bits of [`lanes_dot`] with ones).
fn lanes_sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let whole = a.len() / LANES * LANES;
    for x in a[..whole].chunks_exact(LANES) {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    for (l, x) in a[whole..].iter().enumerate() {
        acc[l] += x;
    }
    reduce_lanes(&mut acc)
}

/// In-place RMSNorm.
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let inv = rms_inv(x, eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = w * (*v * inv);
    }
}

/// PyTorch `LayerNorm` of one row in f32: `out = (x - mean) / sqrt(var + eps) * weight + bias`
/// with the biased variance; both means are sums in the canonical 16-lane order.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == weight.len() && x.len() == bias.len());
    let n = x.len() as f32;
    let mean = lanes_sum(x) / n;
    out.iter_mut().zip(x).for_each(|(o, &v)| *o = v - mean);
    let var = super::math::fma_scope(|| lanes_dot(out, out)) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for (o, (&w, &b)) in out.iter_mut().zip(weight.iter().zip(bias)) {
        *o = (*o * inv) * w + b;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_dot_is_the_reference_dot() {
        for len in [0usize, 1, 15, 16, 17, 100, 7168] {
            let a: Vec<f32> = (0..len).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
            let b: Vec<f32> = (0..len).map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.021).collect();
            let want = super::super::reference::dot(&a, &b);
            assert_eq!(lanes_dot(&a, &b).to_bits(), want.to_bits(), "len {len}");
            assert_eq!(
                super::super::math::fma_scope(|| lanes_dot(&a, &b)).to_bits(),
                want.to_bits()
            );
            assert_eq!(dot16(&a, &b).to_bits(), want.to_bits(), "dot16, len {len}");
        }
    }

    /// The f32 LayerNorm is within rounding of the f64 definition (biased variance).
    #[test]
    fn layer_norm_matches_the_f64_definition() {
        let x: Vec<f32> = (0..40)
            .map(|i| ((i * 29 % 31) as f32 - 12.0) * 0.37 + 3.0)
            .collect();
        let w: Vec<f32> = (0..40).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..40).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
        let mut out = vec![0.0f32; 40];
        layer_norm(&x, &w, &b, 1e-6, &mut out);
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        for i in 0..40 {
            let want = (x[i] as f64 - mean) / (var + 1e-6).sqrt() * w[i] as f64 + b[i] as f64;
            assert!((out[i] as f64 - want).abs() < 1e-5, "{i}: {} vs {want}", out[i]);
        }
    }
}
