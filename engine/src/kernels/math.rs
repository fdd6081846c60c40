//! Transcendental functions with the same bits on every device: `exp`, `exp_m1`, `tanh`, `ln`,
//! `ln_1p` and the activations built on them (sigmoid, softplus). Model code calls these, never
//! `f32::exp` and friends, for every value that reaches the logits.
//!
//! Each is written with IEEE single-precision operations only (add, multiply, divide, fused
//! multiply-add, round-to-integer, bit moves), in a fixed order, so it rounds identically on any
//! CPU and on a GPU: `backend/cuda/math.cuh` is the same sequence in CUDA, checked bit for bit
//! against this file by `engine/tests/cuda_emulated.rs`. The platform `libm` (`f32::exp`) cannot
//! give that: glibc's `expf` and CUDA's `expf` differ in the last bit for some inputs, so a layer
//! moved to the GPU would change the logits.
//!
//! Accuracy (tested below against `f64`): `exp` and `ln` within 1 ulp, `exp_m1` within 1.5,
//! `tanh` and `ln_1p` within 3, over the whole f32 range; infinities, NaN, zeros and subnormal
//! results as libm.

/// `log2(e)` rounded to f32.
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split for Cody–Waite reduction: `LN2_HI` has 8 significant bits, so `n · LN2_HI` is
/// exact for every `|n| ≤ 255`; `LN2_HI + LN2_LO` is `ln 2` to about 2^-32.
const LN2_HI: f32 = f32::from_bits(0x3f31_8000); // 0.693359375
const LN2_LO: f32 = -2.121_944_4e-4;
/// Above this `exp` overflows (`ln(f32::MAX)` rounded down); below `EXP_UNDER` it rounds to 0.
const EXP_OVER: f32 = 88.722_83;
const EXP_UNDER: f32 = -103.972_08;
/// `1/k!` for k = 2..=8 (the Taylor series of `e^r − 1 − r` over `|r| ≤ ln2/2`; the truncation
/// error, `r^9/9!`, is below 2^-40).
const INV_FACT: [f32; 7] = [
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
];

/// Inputs at the edges of the functions' ranges and reductions (overflow and underflow
/// thresholds, the `exp_m1` and `tanh` cut-offs, the softplus threshold, subnormals, the
/// specials), for the accuracy tests here and the device parity tests.
pub const EDGE_INPUTS: [f32; 18] = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    EXP_OVER,
    EXP_UNDER,
    88.8,
    -104.0,
    -87.3,
    -17.5,
    9.1,
    20.0,
    f32::MIN_POSITIVE,
    1e-45,
    f32::MAX,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
];

/// Run `f` compiled with hardware fused multiply-add when the CPU has it (x86-64 `fma`;
/// always on aarch64). The functions here use `f32::mul_add`, which on a baseline x86-64 build
/// is a call into libm's `fmaf` (about ten times slower for `exp`); inlined into `f` under this
/// scope it is one instruction. Same bits either way: both are the IEEE fused operation. Hot
/// loops over activations wrap themselves in it.
#[inline(always)]
pub fn fma_scope<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "fma")]
        fn with_fma<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU reports FMA, the only feature this instance is compiled with.
            #[allow(unsafe_code)]
            return unsafe { with_fma(f) };
        }
    }
    f()
}

/// `2^k` for `-126 ≤ k ≤ 127`, built from its bits.
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Adding and subtracting `1.5·2^23` rounds an f32 of magnitude below 2^22 to the nearest
/// integer, ties to even: two IEEE additions, the same on every device.
const ROUNDER: f32 = 12_582_912.0;

/// `x = n·ln2 + r` with `|r| ≤ ln2/2` (about): `n = rint(x·log2 e)`, `r` by two fused steps.
#[inline(always)]
fn reduce(x: f32) -> (i32, f32) {
    let t = x * LOG2_E + ROUNDER;
    let n = t - ROUNDER;
    let r = n.mul_add(-LN2_HI, x);
    // `t` lies in [2^23, 2^24), where the ulp is 1: its mantissa holds `ROUNDER + n`, so `n` is
    // the difference of the bit patterns. The same value as `n as i32`, whose saturating
    // conversion the compiler scalarised lane by lane in vector loops.
    let k = t.to_bits() as i32 - ROUNDER.to_bits() as i32;
    (k, n.mul_add(-LN2_LO, r))
}

/// `e^r − 1` for `|r| ≤ ~0.35`: `r + r²·(1/2! + r/3! + … + r⁶/8!)`, Horner with fma.
#[inline(always)]
fn exp_m1_small(r: f32) -> f32 {
    let mut q = INV_FACT[6];
    for &c in INV_FACT[..6].iter().rev() {
        q = q.mul_add(r, c);
    }
    q.mul_add(r * r, r)
}

/// `e^x`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Branch-free so that loops over rows vectorise: the arithmetic runs on x clamped to the
    // finite range (x itself there), and NaN, overflow and underflow are selected at the end.
    let c = x.clamp(EXP_UNDER, EXP_OVER);
    let (n, r) = reduce(c);
    let p = exp_m1_small(r) + 1.0;
    // n is in [-150, 128]: two exact power-of-two factors, so only the last product rounds
    // (once, also into the subnormal range).
    let half = n / 2;
    let v = (p * pow2(half)) * pow2(n - half);
    if x.is_nan() {
        x
    } else if x > EXP_OVER {
        f32::INFINITY
    } else if x < EXP_UNDER {
        0.0
    } else {
        v
    }
}

/// `e^x − 1`, accurate near 0.
#[inline(always)]
pub fn exp_m1(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x == 0.0 || x > EXP_OVER {
        return if x == 0.0 { x } else { f32::INFINITY };
    }
    if x < -17.5 {
        return -1.0; // e^x < 2^-25: −1 + e^x rounds to −1
    }
    let (n, r) = reduce(x);
    let m = exp_m1_small(r);
    if n == 0 {
        return m;
    }
    if n < -24 {
        // 2^n − 1 is not exact here; e^x is tiny beside −1, so round the sum once.
        return (m + 1.0) * pow2(n) - 1.0;
    }
    if n > 127 {
        // e^x as in `exp`; the −1 is far below its ulp.
        return ((m + 1.0) * pow2(64)) * pow2(n - 64);
    }
    // 2^n·m + (2^n − 1), one rounding in the fma: 2^n − 1 is exact for n ≤ 24, and above that
    // its rounding is at most a quarter of the result's ulp.
    let s = pow2(n);
    s.mul_add(m, s - 1.0)
}

/// Hyperbolic tangent: `sign(x) · e/(e + 2)` with `e = e^{2|x|} − 1`.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    if a.is_nan() {
        return x;
    }
    if a < 1.0 / 8192.0 {
        return x; // tanh x = x − x³/3: the correction is below half an ulp of x
    }
    if a > 9.1 {
        return 1.0f32.copysign(x); // 1 − tanh(9.1) < 2^-26
    }
    let e = exp_m1(a + a);
    (e / (e + 2.0)).copysign(x)
}

/// `1/k` for odd k = 3..=13, times 2: the series of `ln m = 2·atanh(s)` beyond its first term.
const ATANH_2: [f32; 6] = [2.0 / 3.0, 2.0 / 5.0, 2.0 / 7.0, 2.0 / 9.0, 2.0 / 11.0, 2.0 / 13.0];

/// Natural logarithm.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        return x;
    }
    // x = m · 2^e with m in [√½, √2).
    let (mut bits, mut e) = (x.to_bits(), 0i32);
    if bits < 0x0080_0000 {
        bits = (x * 16_777_216.0).to_bits(); // subnormal: scale by 2^24, exactly
        e = -24;
    }
    e += ((bits >> 23) as i32) - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > std::f32::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    // ln m = 2 atanh(s), s = (m − 1)/(m + 1), |s| ≤ 0.1716. `m − 1` is exact; `m + 1` is
    // carried as d + err (two-sum) and `s` as s + corr, so the leading term 2s keeps ~2^-30.
    let f = m - 1.0;
    let d = m + 1.0;
    let t = d - m;
    let err = (m - (d - t)) + (1.0 - t);
    let s = f / d;
    let corr = (-s).mul_add(err, (-s).mul_add(d, f)) / d;
    let z = s * s;
    let mut q = ATANH_2[5];
    for &c in ATANH_2[..5].iter().rev() {
        q = q.mul_add(z, c);
    }
    let lm = (s * z).mul_add(q, corr + corr) + (s + s);
    let ef = e as f32;
    ef.mul_add(LN2_HI, ef.mul_add(LN2_LO, lm))
}

/// `ln(1 + y)`, accurate near 0 (`ln(u)·y/(u − 1)` with `u = 1 + y` rounded).
#[inline(always)]
pub fn ln_1p(y: f32) -> f32 {
    let u = 1.0 + y;
    if u == 1.0 {
        return y;
    }
    if u == f32::INFINITY || y.is_nan() {
        return ln(u);
    }
    ln(u) * (y / (u - 1.0))
}

/// Logistic sigmoid `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `ln(1 + e^x)`, linear above 20 (torch's thresholded softplus).
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { ln_1p(exp(x)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between `got` and the exact `want` (f64).
    fn ulps(got: f32, want: f64) -> f64 {
        if got as f64 == want || (got.is_nan() && want.is_nan()) {
            return 0.0;
        }
        let w = want as f32;
        if !w.is_finite() || !got.is_finite() {
            return if w == got { 0.0 } else { f64::INFINITY };
        }
        let ulp = {
            let a = w.abs().max(f32::MIN_POSITIVE * f32::EPSILON);
            (f32::from_bits(a.to_bits() + 1) - a) as f64
        };
        (got as f64 - want).abs() / ulp
    }

    /// Every 1009th f32 bit pattern of both signs, every pattern of [0.25, 4) in steps of 7,
    /// plus the edges.
    fn sweep() -> impl Iterator<Item = f32> {
        let near_one = (0x3e80_0000u32..0x4080_0000).step_by(7).map(f32::from_bits);
        (0..u32::MAX / 1009)
            .map(|i| f32::from_bits(i * 1009))
            .chain(near_one)
            .chain(EDGE_INPUTS)
    }

    fn worst(f: fn(f32) -> f32, exact: fn(f64) -> f64, domain: impl Fn(f32) -> bool) -> (f64, f32) {
        let mut worst = (0.0, 0.0);
        for x in sweep().filter(|&x| domain(x)) {
            let e = ulps(f(x), exact(x as f64));
            if e > worst.0 {
                worst = (e, x);
            }
        }
        worst
    }

    #[test]
    fn the_reduction_exponent_is_the_rounded_multiple() {
        // Every input `exp` and `exp_m1` reduce (clamped to the finite range; NaN is selected
        // apart), against the conversion it replaced.
        for x in sweep()
            .filter(|x| !x.is_nan())
            .map(|x| x.clamp(EXP_UNDER, EXP_OVER))
        {
            let n = (x * LOG2_E + ROUNDER) - ROUNDER;
            assert_eq!(reduce(x).0, n as i32, "x = {x}");
        }
    }

    #[test]
    fn exp_is_within_one_ulp() {
        let (e, x) = worst(exp, f64::exp, |_| true);
        assert!(e <= 1.0, "exp({x:e}) is {e} ulp off");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn exp_m1_is_within_one_and_a_half_ulp() {
        let (e, x) = worst(exp_m1, f64::exp_m1, |_| true);
        assert!(e <= 1.5, "exp_m1({x:e}) is {e} ulp off");
        assert_eq!(exp_m1(-0.0).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn tanh_is_within_three_ulp() {
        let (e, x) = worst(tanh, f64::tanh, |_| true);
        assert!(e <= 3.0, "tanh({x:e}) is {e} ulp off");
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn ln_and_ln_1p_are_accurate() {
        let (e, x) = worst(ln, f64::ln, |x| x >= 0.0);
        assert!(e <= 1.0, "ln({x:e}) is {e} ulp off");
        let (e, x) = worst(ln_1p, f64::ln_1p, |x| x >= -1.0);
        assert!(e <= 3.0, "ln_1p({x:e}) is {e} ulp off");
        assert!(ln(-1.0).is_nan());
        assert_eq!(ln(0.0), f32::NEG_INFINITY);
        assert_eq!(ln_1p(-1.0), f32::NEG_INFINITY);
    }

    #[test]
    fn the_activations_are_close_to_their_f64_definitions() {
        // Beyond ±80 sigmoid's result is subnormal or 1, where a relative bound means little.
        for x in sweep().filter(|x| x.abs() < 80.0) {
            let d = x as f64;
            assert!(ulps(sigmoid(x), 1.0 / (1.0 + (-d).exp())) <= 3.0, "sigmoid({x})");
            let sp = if d > 20.0 { d } else { d.exp().ln_1p() };
            assert!(ulps(softplus(x), sp) <= 3.0, "softplus({x})");
        }
    }
}
