// Deltafin CUDA matrix kernels, compiled at start-up with NVRTC (--fmad=false --ftz=false).
//
// They compute the canonical 16-lane dot product of engine/src/kernels/mod.rs exactly:
//   * W[r, k] decoded by the element rules of engine/src/kernels/format.rs (exact, or one f32
//     rounding for scaled formats);
//   * the row padded with zeros to a multiple of 16; lane l (threadIdx.x) accumulates
//     acc = fma(w, x, acc) for every k = l (mod 16) in increasing k, with __fmaf_rn (IEEE fused
//     multiply-add, one rounding, as on the CPU); decoding multiplies stay __fmul_rn, never
//     contracted (--fmad=false);
//   * the lanes reduced by the fixed tree acc[l] += acc[l + s], s = 8, 4, 2, 1 (shuffles within
//     the row's 16-lane segment).
// So every output is bit-identical to the CPU kernels and to the scalar reference, and row i
// of a multi-row call equals the single-row call.
//
// Launch: block (16, ROWS_PER_BLOCK), grid (ceil(rows / ROWS_PER_BLOCK), ceil(n_here / TILE)).
// Thread (l, t) of block (bx, by) owns output row r = bx * ROWS_PER_BLOCK + t and input rows
// i_base + by * TILE .. + TILE, whose accumulators live in registers: each weight element is
// loaded once for TILE input rows.

#define LANES 16
#define ROWS_PER_BLOCK 16
#define TILE 8

#define FMT_F32 0
#define FMT_BF16 1
#define FMT_FP8 2
#define FMT_INT4 3
#define FMT_MXFP4 4

#define SCALE_F32 0
#define SCALE_BF16 1
#define SCALE_F16 2

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float bf16_to_f32(u32 bits) { return __uint_as_float(bits << 16); }

// IEEE binary16 to f32, exact (the `half` crate's widening).
__device__ __forceinline__ float f16_to_f32(u32 h) {
    const u32 sign = (h & 0x8000u) << 16;
    const u32 exp = (h >> 10) & 0x1fu;
    const u32 man = h & 0x3ffu;
    if (exp == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0u) {
        const float v = __fmul_rn((float)man, 5.9604644775390625e-8f);  // man * 2^-24, exact
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// float8_e4m3fn to f32, exact: bias 7, no infinities, S.1111.111 is NaN.
__device__ __forceinline__ float e4m3_to_f32(u32 b) {
    const u32 exp = (b >> 3) & 0xfu;
    const u32 man = b & 7u;
    if (exp == 0xfu && man == 7u) return __uint_as_float(0x7fc00000u);
    const float v = exp == 0u ? __fmul_rn((float)man, 0.001953125f)  // subnormal: m * 2^-9
                              : __uint_as_float(((exp + 120u) << 23) | (man << 20));
    return (b & 0x80u) ? -v : v;
}

// FP4 E2M1 nibble to f32 (bit 3 is the sign; 0x8 is -0.0).
// Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6: exponent e = bits 2..1, mantissa m = bit 0;
// e = 0 is m * 0.5, otherwise (1 + m / 2) * 2^(e - 1), built directly as f32 bits.
__device__ __forceinline__ float e2m1_to_f32(u32 nibble) {
    const u32 e = (nibble >> 1) & 3u;
    const u32 m = nibble & 1u;
    const float v = e == 0u ? (m ? 0.5f : 0.0f) : __uint_as_float(((e + 126u) << 23) | (m << 22));
    return (nibble & 8u) ? -v : v;
}

// E8M0 scale: 2^(E - 127); E = 0 is 2^-127 (an f32 subnormal), E = 255 is NaN.
__device__ __forceinline__ float e8m0_to_f32(u32 e) {
    if (e == 255u) return __uint_as_float(0x7fc00000u);
    if (e == 0u) return __uint_as_float(1u << 22);
    return __uint_as_float(e << 23);
}

__device__ __forceinline__ float scale_at(const u8* scales, u64 i, int dtype) {
    if (dtype == SCALE_F32) return ((const float*)scales)[i];
    const u32 bits = ((const u16*)scales)[i];
    return dtype == SCALE_BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}

// Element (r, k) of the matrix. p0/p1: FP8 block rows/cols; INT4/MXFP4 group in p0.
template <int FMT>
__device__ __forceinline__ float weight(const u8* data, const u8* scales, u64 r, u64 k, u64 cols,
                                        int p0, int p1, int sdt) {
    const u64 e = r * cols + k;
    if (FMT == FMT_F32) return ((const float*)data)[e];
    if (FMT == FMT_BF16) return bf16_to_f32(((const u16*)data)[e]);
    if (FMT == FMT_FP8) {
        const u64 scale_cols = (cols + (u64)p1 - 1) / (u64)p1;
        const float s = ((const float*)scales)[(r / (u64)p0) * scale_cols + k / (u64)p1];
        return __fmul_rn(e4m3_to_f32(data[e]), s);
    }
    if (FMT == FMT_INT4) {
        const u32 word = ((const u32*)data)[e / 8];
        const int q = (int)((word >> (4u * (u32)(k % 8))) & 0xfu) - 8;
        return __fmul_rn((float)q, scale_at(scales, r * (cols / (u64)p0) + k / (u64)p0, sdt));
    }
    // FMT_MXFP4
    const u32 byte = data[e / 2];
    const u32 nibble = (k % 2 == 0) ? (byte & 0xfu) : (byte >> 4);
    return __fmul_rn(e2m1_to_f32(nibble), e8m0_to_f32(scales[r * (cols / (u64)p0) + k / (u64)p0]));
}

template <int FMT>
__device__ __forceinline__ void matmul_body(const u8* __restrict__ data, const u8* __restrict__ scales,
                                            const float* __restrict__ x, float* __restrict__ y,
                                            int rows, int cols, int n, int i_base, int p0, int p1,
                                            int sdt) {
    const int lane = threadIdx.x;
    const int r = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y;
    const int i0 = i_base + blockIdx.y * TILE;
    const bool live = r < rows;
    const int padded = (cols + LANES - 1) / LANES * LANES;
    float acc[TILE];
#pragma unroll
    for (int t = 0; t < TILE; ++t) acc[t] = 0.0f;
    for (int k = lane; k < padded; k += LANES) {
        const bool in = k < cols;
        const float w = (live && in) ? weight<FMT>(data, scales, r, k, cols, p0, p1, sdt) : 0.0f;
#pragma unroll
        for (int t = 0; t < TILE; ++t) {
            const int i = i0 + t;
            const float xv = (in && i < n) ? __ldg(&x[(u64)i * (u64)cols + (u64)k]) : 0.0f;
            acc[t] = __fmaf_rn(w, xv, acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < TILE; ++t) {
        float v = acc[t];
        for (int s = LANES / 2; s > 0; s /= 2) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, s, LANES));
        const int i = i0 + t;
        if (lane == 0 && live && i < n) y[(u64)i * (u64)rows + (u64)r] = v;
    }
}

#define DELTAFIN_MATMUL(NAME, FMT)                                                                \
    extern "C" __global__ void __launch_bounds__(LANES * ROWS_PER_BLOCK)                          \
        NAME(const u8* data, const u8* scales, const float* x, float* y, int rows, int cols, int n, \
             int i_base, int p0, int p1, int sdt) {                                               \
        matmul_body<FMT>(data, scales, x, y, rows, cols, n, i_base, p0, p1, sdt);                 \
    }

DELTAFIN_MATMUL(deltafin_matmul_f32, FMT_F32)
DELTAFIN_MATMUL(deltafin_matmul_bf16, FMT_BF16)
DELTAFIN_MATMUL(deltafin_matmul_fp8, FMT_FP8)
DELTAFIN_MATMUL(deltafin_matmul_int4, FMT_INT4)
DELTAFIN_MATMUL(deltafin_matmul_mxfp4, FMT_MXFP4)
