// Deltafin's device-independent transcendental functions, the CUDA twin of
// engine/src/kernels/math.rs: the same IEEE single-precision operations in the same order
// (explicit __fmaf_rn / __fmul_rn / __fadd_rn / __fdiv_rn, never contracted), so every function
// returns the CPU's bits. engine/tests/cuda_emulated.rs checks that on the CPU.
// Included by the kernel sources after the scalar typedefs (u32).

#define DF_LOG2_E 1.44269504088896340736f
#define DF_LN2_HI 0.693359375f
#define DF_LN2_LO -2.1219444e-4f
#define DF_EXP_OVER 88.72283f
#define DF_EXP_UNDER -103.97208f
#define DF_ROUNDER 12582912.0f

__device__ __forceinline__ float df_pow2(int k) { return __uint_as_float((u32)(k + 127) << 23); }

__device__ __forceinline__ float df_exp_m1_small(float r) {
    float q = 1.0f / 40320.0f;
    q = __fmaf_rn(q, r, 1.0f / 5040.0f);
    q = __fmaf_rn(q, r, 1.0f / 720.0f);
    q = __fmaf_rn(q, r, 1.0f / 120.0f);
    q = __fmaf_rn(q, r, 1.0f / 24.0f);
    q = __fmaf_rn(q, r, 1.0f / 6.0f);
    q = __fmaf_rn(q, r, 0.5f);
    return __fmaf_rn(q, __fmul_rn(r, r), r);
}

// x = n ln2 + r; returns n, writes r.
__device__ __forceinline__ int df_reduce(float x, float* r) {
    const float n = __fsub_rn(__fadd_rn(__fmul_rn(x, DF_LOG2_E), DF_ROUNDER), DF_ROUNDER);
    *r = __fmaf_rn(n, -DF_LN2_LO, __fmaf_rn(n, -DF_LN2_HI, x));
    return (int)n;
}

__device__ __forceinline__ float df_exp(float x) {
    if (x != x) return x;
    if (x > DF_EXP_OVER) return __uint_as_float(0x7f800000u);
    if (x < DF_EXP_UNDER) return 0.0f;
    float r;
    const int n = df_reduce(x, &r);
    const float p = __fadd_rn(df_exp_m1_small(r), 1.0f);
    const int half = n / 2;
    return __fmul_rn(__fmul_rn(p, df_pow2(half)), df_pow2(n - half));
}

__device__ __forceinline__ float df_exp_m1(float x) {
    if (x != x) return x;
    if (x == 0.0f) return x;
    if (x > DF_EXP_OVER) return __uint_as_float(0x7f800000u);
    if (x < -17.5f) return -1.0f;
    float r;
    const int n = df_reduce(x, &r);
    const float m = df_exp_m1_small(r);
    if (n == 0) return m;
    if (n < -24) return __fsub_rn(__fmul_rn(__fadd_rn(m, 1.0f), df_pow2(n)), 1.0f);
    if (n > 127) return __fmul_rn(__fmul_rn(__fadd_rn(m, 1.0f), df_pow2(64)), df_pow2(n - 64));
    const float s = df_pow2(n);
    return __fmaf_rn(s, m, __fsub_rn(s, 1.0f));
}

__device__ __forceinline__ float df_tanh(float x) {
    const float a = fabsf(x);
    if (a != a) return x;
    if (a < 1.0f / 8192.0f) return x;
    if (a > 9.1f) return copysignf(1.0f, x);
    const float e = df_exp_m1(__fadd_rn(a, a));
    return copysignf(__fdiv_rn(e, __fadd_rn(e, 2.0f)), x);
}

__device__ __forceinline__ float df_ln(float x) {
    if (x != x || x < 0.0f) return __uint_as_float(0x7fc00000u);
    if (x == 0.0f) return __uint_as_float(0xff800000u);
    if (x == __uint_as_float(0x7f800000u)) return x;
    u32 bits = __float_as_uint(x);
    int e = 0;
    if (bits < 0x00800000u) {
        bits = __float_as_uint(__fmul_rn(x, 16777216.0f));
        e = -24;
    }
    e += (int)(bits >> 23) - 127;
    float m = __uint_as_float((bits & 0x007fffffu) | 0x3f800000u);
    if (m > 1.41421353816986083984f) {
        m = __fmul_rn(m, 0.5f);
        e += 1;
    }
    const float f = __fsub_rn(m, 1.0f);
    const float d = __fadd_rn(m, 1.0f);
    const float t = __fsub_rn(d, m);
    const float err = __fadd_rn(__fsub_rn(m, __fsub_rn(d, t)), __fsub_rn(1.0f, t));
    const float s = __fdiv_rn(f, d);
    const float corr = __fdiv_rn(__fmaf_rn(-s, err, __fmaf_rn(-s, d, f)), d);
    const float z = __fmul_rn(s, s);
    float q = 2.0f / 13.0f;
    q = __fmaf_rn(q, z, 2.0f / 11.0f);
    q = __fmaf_rn(q, z, 2.0f / 9.0f);
    q = __fmaf_rn(q, z, 2.0f / 7.0f);
    q = __fmaf_rn(q, z, 2.0f / 5.0f);
    q = __fmaf_rn(q, z, 2.0f / 3.0f);
    const float lm = __fadd_rn(__fmaf_rn(__fmul_rn(s, z), q, __fadd_rn(corr, corr)), __fadd_rn(s, s));
    const float ef = (float)e;
    return __fmaf_rn(ef, DF_LN2_HI, __fmaf_rn(ef, DF_LN2_LO, lm));
}

__device__ __forceinline__ float df_ln_1p(float y) {
    const float u = __fadd_rn(1.0f, y);
    if (u == 1.0f) return y;
    if (u == __uint_as_float(0x7f800000u) || y != y) return df_ln(u);
    return __fmul_rn(df_ln(u), __fdiv_rn(y, __fsub_rn(u, 1.0f)));
}

__device__ __forceinline__ float df_sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, df_exp(-x))); }

__device__ __forceinline__ float df_softplus(float x) { return x > 20.0f ? x : df_ln_1p(df_exp(x)); }
