// Deltafin's CUDA kernels for DeepSeek Sparse Attention (V3.2, GLM-5) and DeepSeek-V4: the
// indexers' scores (each family's order) and their top-k, V4's window and entry attention and its
// hyper-connections (mHC). Compiled after layers.cu into the same NVRTC module (it uses
// LayerParams, the lane helpers and math.cuh), with the same rule: each kernel computes the CPU
// function's own sequence of IEEE operations, so its outputs are the CPU's bits.
// engine/tests/cuda_emulated_layers.rs runs this source on the CPU against those functions.

// The canonical 16-lane dot of one thread: lane l's fused multiply-adds over t = l (mod 16),
// then the tree 8, 4, 2, 1 (kernels/ops.rs::lanes_dot).
__device__ __forceinline__ float df_dot16_serial(const float* a, const float* b, int n) {
    float acc[LANES];
    for (int l = 0; l < LANES; ++l) acc[l] = 0.0f;
    for (int t = 0; t < n; ++t) acc[t % LANES] = __fmaf_rn(a[t], b[t], acc[t % LANES]);
    for (int s = LANES / 2; s > 0; s /= 2)
        for (int l = 0; l < s; ++l) acc[l] = __fadd_rn(acc[l], acc[l + s]);
    return acc[0];
}

// ---- DeepSeek-V4's window and entry attention (model/layers/compressed.rs::attend) ----
//
// One 16-lane group per (row, head): grid (rows, heads), block (LANES). The row's keys are its
// window's kv rows, then its chosen compressed entries (K = V). As the CPU: each score the
// canonical 16-lane dot times the scale (one lane per key); the maximum over the sink and the
// scores; the sum from exp(sink - max), then exp(score - max) in key order; then
// out = sum_j (e_j / sum) * k_j in key order from zero, lane l owning channels d = l (mod 16).
// Buffers: q [rows, heads, hd], window keys [.., hd], entries [.., hd], rows [rows, 4] (i32:
// first window row, window keys, offset in the chosen list, chosen entries), chosen (i32 entry
// rows), sinks [heads], out [rows, heads, hd]; i rows, heads, hd; f scale.
#define DF_V4_PER_LANE 32  // head_dim <= 16 * 32

__device__ __forceinline__ const float* df_v4_key(const LayerParams& p, const int* r, int j, int hd) {
    if (j < r[1]) return (const float*)p.buf[1] + ((u64)r[0] + j) * (u64)hd;
    return (const float*)p.buf[2] + (u64)((const int*)p.buf[4])[r[2] + j - r[1]] * (u64)hd;
}

extern "C" __global__ void __launch_bounds__(LANES) deltafin_v4_attend(LayerParams p) {
    const int row = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int heads = p.i[1], hd = p.i[2];
    if (row >= p.i[0] || h >= heads || hd > LANES * DF_V4_PER_LANE) return;
    const float scale = p.f[0];
    const int* r = (const int*)p.buf[3] + 4 * row;
    const int keys = r[1] + r[3];
    const float* q = (const float*)p.buf[0] + ((u64)row * heads + h) * (u64)hd;
    const float sink = ((const float*)p.buf[5])[h];
    float m = __uint_as_float(0xff800000u);
    for (int j = lane; j < keys; j += LANES) m = fmaxf(m, __fmul_rn(df_dot16_serial(q, df_v4_key(p, r, j, hd), hd), scale));
    m = fmaxf(df_lane_max(m), sink);
    float sum = df_exp(__fsub_rn(sink, m));
    for (int base = 0; base < keys; base += LANES) {
        const int j = base + lane;
        const float e = j < keys ? df_exp(__fsub_rn(__fmul_rn(df_dot16_serial(q, df_v4_key(p, r, j, hd), hd), scale), m)) : 0.0f;
        for (int t = 0; t < LANES; ++t) {
            const float et = __shfl_sync(0xffffffffu, e, t, LANES);
            if (base + t < keys) sum = __fadd_rn(sum, et);
        }
    }
    float acc[DF_V4_PER_LANE];
    for (int i = 0; i < DF_V4_PER_LANE; ++i) acc[i] = 0.0f;
    for (int base = 0; base < keys; base += LANES) {
        const int j = base + lane;
        const float e = j < keys ? df_exp(__fsub_rn(__fmul_rn(df_dot16_serial(q, df_v4_key(p, r, j, hd), hd), scale), m)) : 0.0f;
        const float pj = __fdiv_rn(e, sum);
        for (int t = 0; t < LANES; ++t) {
            const float pt = __shfl_sync(0xffffffffu, pj, t, LANES);
            if (base + t >= keys) continue;
            const float* v = df_v4_key(p, r, base + t, hd);
            for (int i = 0, d = lane; d < hd; ++i, d += LANES) acc[i] = __fadd_rn(acc[i], __fmul_rn(pt, v[d]));
        }
    }
    float* out = (float*)p.buf[6] + ((u64)row * heads + h) * (u64)hd;
    for (int i = 0, d = lane; d < hd; ++i, d += LANES) out[d] = acc[i];
}

// ---- DeepSeek Sparse Attention's index scores (model/layers/dsa.rs) ----
//
// One thread per (row, key): score = sum over heads h in order of w[h] * max(scale * (q_h . k), 0),
// each dot one chain of fused multiply-adds over the dimensions in order (dsa.rs::
// index_scores_reference, the order its tiled CPU kernel keeps in every lane). Buffers: rotated
// queries [rows, heads, d], head weights [rows, heads] (already scaled by heads^-1/2), keys
// [positions, d], rows [rows, 2] (i32: first key position, keys scored), out [rows, stride];
// i rows, heads, d, stride, order; f scale. Grid (stride / 256, rows).
//
// order 1 is DeepSeek-V4's indexer (compressed.rs::index_scores): per head the canonical 16-lane
// dot (lane l accumulates fused multiply-adds over t = l mod 16, then the tree 8, 4, 2, 1), then
// relu as Rust's f32::max(d, 0) (NaN and negatives to +0, -0 kept), times the scale, times the
// head weight, summed over heads from -0.
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_dsa_scores(LayerParams p) {
    const int row = blockIdx.y, j = blockIdx.x * DF_THREADS + threadIdx.x;
    const int heads = p.i[1], d = p.i[2], stride = p.i[3], order = p.i[4];
    const int* info = (const int*)p.buf[3];
    if (row >= p.i[0] || j >= info[2 * row + 1]) return;
    const float* q = (const float*)p.buf[0] + (u64)row * heads * d;
    const float* w = (const float*)p.buf[1] + (u64)row * heads;
    const float* k = (const float*)p.buf[2] + ((u64)info[2 * row] + j) * (u64)d;
    float total = order ? -0.0f : 0.0f;
    for (int h = 0; h < heads; ++h) {
        if (order) {
            const float dot = df_dot16_serial(q + h * d, k, d);
            const float relu = (dot < 0.0f || dot != dot) ? 0.0f : dot;
            total = __fadd_rn(total, __fmul_rn(__fmul_rn(relu, p.f[0]), w[h]));
            continue;
        }
        float acc = 0.0f;
        for (int t = 0; t < d; ++t) acc = __fmaf_rn(q[h * d + t], k[t], acc);
        total = __fadd_rn(total, __fmul_rn(w[h], fmaxf(__fmul_rn(acc, p.f[0]), 0.0f)));
    }
    ((float*)p.buf[4])[(u64)row * stride + j] = total;
}

// DeepSeek Sparse Attention's top-k (dsa.rs::top_positions): per row, the k positions of highest
// score under IEEE total order, equal scores to the earlier position, in ascending order; every
// position when there are at most k. One block per row. The k-th largest score's total-order key
// comes from a radix select (four passes of 8 bits, each a histogram of the keys that match the
// bits found so far); then every position above it and the first `need` equal to it (in position
// order) are written in order: each thread counts its contiguous share, one thread lays out the
// offsets and the ties' quota, and each thread writes its share. Counting is order-free, so the
// result is the CPU's set in the CPU's order. Buffers: scores [rows, stride], rows [rows, 2]
// (i32: first key position, keys scored), out [rows, k] (i32, -1 past the row's count); i rows,
// stride, k. Block (DF_TOPK_THREADS).
#define DF_TOPK_THREADS 256

// The IEEE total order of f32 as an unsigned order (f32::total_cmp).
__device__ __forceinline__ u32 df_total_order(float v) {
    const u32 b = __float_as_uint(v);
    return (b >> 31) ? ~b : (b | 0x80000000u);
}

extern "C" __global__ void __launch_bounds__(DF_TOPK_THREADS) deltafin_dsa_topk(LayerParams p) {
    const int rows = p.i[0], stride = p.i[1], k = p.i[2];
    const int r = blockIdx.x, t = threadIdx.x, threads = blockDim.x;
    __shared__ int hist[256];
    __shared__ u32 found;
    __shared__ int left;
    __shared__ int gt[DF_TOPK_THREADS], eq[DF_TOPK_THREADS], base[DF_TOPK_THREADS], take[DF_TOPK_THREADS];
    if (r >= rows || threads > DF_TOPK_THREADS) return;
    const int len = ((const int*)p.buf[1])[2 * r + 1];
    const float* s = (const float*)p.buf[0] + (u64)r * (u64)stride;
    int* out = (int*)p.buf[2] + (u64)r * (u64)k;
    if (len <= k) {
        for (int i = t; i < k; i += threads) out[i] = i < len ? i : -1;
        return;
    }
    u32 prefix = 0, mask = 0;
    int need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = t; b < 256; b += threads) hist[b] = 0;
        __syncthreads();
        for (int i = t; i < len; i += threads) {
            const u32 key = df_total_order(s[i]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
        }
        __syncthreads();
        if (t == 0) {
            int above = 0, b = 255;
            for (; b > 0 && above + hist[b] < need; --b) above += hist[b];
            found = prefix | ((u32)b << shift);
            left = need - above;
        }
        __syncthreads();
        prefix = found;
        need = left;
        mask |= 255u << shift;
        __syncthreads();
    }
    const int share = (len + threads - 1) / threads;
    const int lo = t * share < len ? t * share : len, hi = lo + share < len ? lo + share : len;
    int above = 0, equal = 0;
    for (int i = lo; i < hi; ++i) {
        const u32 key = df_total_order(s[i]);
        above += key > prefix;
        equal += key == prefix;
    }
    gt[t] = above;
    eq[t] = equal;
    __syncthreads();
    if (t == 0) {
        int at = 0, quota = need;
        for (int j = 0; j < threads; ++j) {
            take[j] = eq[j] < quota ? eq[j] : quota;
            quota -= take[j];
            base[j] = at;
            at += gt[j] + take[j];
        }
    }
    __syncthreads();
    int o = base[t], ties = take[t];
    for (int i = lo; i < hi; ++i) {
        const u32 key = df_total_order(s[i]);
        if (key > prefix || (key == prefix && ties > 0)) {
            ties -= key == prefix;
            out[o++] = i;
        }
    }
}

// ---- DeepSeek-V4's hyper-connections (model/layers/hyper.rs) ----
//
// A site per row: the S·H stream values x (stream-major) times rms_inv(x) (the sum of squares in
// the canonical 16-lane order), dotted with each projection row in the same order (hyper.rs::mixes);
// then the weights from the mixes (HyperSite::weights_of: sigmoid gates, a row softmax, Sinkhorn,
// each sum in order) and the collapse sum_j pre_j * x_j in stream order from zero. The expand is
// x'_k = post_k * y + sum_j comb[j][k] * x_j, the sum in stream order from zero.
#define DF_HC_MAX 8                                 // streams
#define DF_HC_MIX (DF_HC_MAX * (DF_HC_MAX + 2))     // mixes per row of a site

// The mixes: one 16-lane group per (row, projection row). Buffers streams [rows, width], proj
// [m, width], out [rows, m]; i rows, width, m; f eps. Grid (rows, m), block (LANES).
extern "C" __global__ void __launch_bounds__(LANES) deltafin_hyper_mixes(LayerParams p) {
    const int rows = p.i[0], width = p.i[1], m = p.i[2];
    const int r = blockIdx.x, i = blockIdx.y, lane = threadIdx.x;
    if (r >= rows || i >= m) return;
    const float* x = (const float*)p.buf[0] + (u64)r * (u64)width;
    const float* w = (const float*)p.buf[1] + (u64)i * (u64)width;
    float acc = 0.0f;
    for (int k = lane; k < width; k += LANES) acc = __fmaf_rn(x[k], x[k], acc);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(df_lane_sum(acc), (float)width), p.f[0])));
    float d = 0.0f;
    for (int k = lane; k < width; k += LANES) d = __fmaf_rn(__fmul_rn(x[k], inv), w[k], d);
    const float s = df_lane_sum(d);
    if (lane == 0) ((float*)p.buf[2])[(u64)r * (u64)m + i] = s;
}

// Each column of the n x n comb divided by its sum (rows in order) plus eps.
__device__ __forceinline__ void df_hc_columns(float* c, int n, float eps) {
    for (int k = 0; k < n; ++k) {
        float sum = -0.0f;
        for (int j = 0; j < n; ++j) sum = __fadd_rn(sum, c[j * n + k]);
        sum = __fadd_rn(sum, eps);
        for (int j = 0; j < n; ++j) c[j * n + k] = __fdiv_rn(c[j * n + k], sum);
    }
}

// A site's (head == 0) or the head's (head == 1) weights of one row from its mixes mx, into w:
// pre, post, comb (site) or pre (head). consts: base, then the scales (3, or 1 for the head).
__device__ void df_hc_weights(const float* mx, const float* consts, float* w, int n, int iters, int head, float eps) {
    const float* base = consts;
    if (head) {
        for (int j = 0; j < n; ++j)
            w[j] = __fadd_rn(df_sigmoid(__fadd_rn(__fmul_rn(mx[j], consts[n]), base[j])), eps);
        return;
    }
    const float* scale = consts + (2 + n) * n;
    for (int j = 0; j < n; ++j) w[j] = __fadd_rn(df_sigmoid(__fadd_rn(__fmul_rn(mx[j], scale[0]), base[j])), eps);
    for (int j = 0; j < n; ++j)
        w[n + j] = __fmul_rn(2.0f, df_sigmoid(__fadd_rn(__fmul_rn(mx[n + j], scale[1]), base[n + j])));
    float* c = w + 2 * n;
    for (int i = 0; i < n * n; ++i) c[i] = __fadd_rn(__fmul_rn(mx[2 * n + i], scale[2]), base[2 * n + i]);
    for (int j = 0; j < n; ++j) {
        float* row = c + j * n;
        float max = __uint_as_float(0xff800000u), sum = -0.0f;
        for (int k = 0; k < n; ++k) max = fmaxf(max, row[k]);
        for (int k = 0; k < n; ++k) {
            row[k] = df_exp(__fsub_rn(row[k], max));
            sum = __fadd_rn(sum, row[k]);
        }
        for (int k = 0; k < n; ++k) row[k] = __fadd_rn(__fdiv_rn(row[k], sum), eps);
    }
    df_hc_columns(c, n, eps);
    for (int it = 1; it < iters; ++it) {
        for (int j = 0; j < n; ++j) {
            float* row = c + j * n;
            float sum = -0.0f;
            for (int k = 0; k < n; ++k) sum = __fadd_rn(sum, row[k]);
            sum = __fadd_rn(sum, eps);
            for (int k = 0; k < n; ++k) row[k] = __fdiv_rn(row[k], sum);
        }
        df_hc_columns(c, n, eps);
    }
}

// The weights and the collapse: one block per row. Buffers mixes [rows, m], consts (see
// df_hc_weights), streams [rows, S*H], weights [rows, m] (site; absent for the head), out
// [rows, H]; i rows, H, S, iters, head; f eps.
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_hyper_weights(LayerParams p) {
    const int rows = p.i[0], h = p.i[1], n = p.i[2], iters = p.i[3], head = p.i[4];
    const int r = blockIdx.x, m = head ? n : (2 + n) * n;
    __shared__ float w[DF_HC_MIX];
    if (r >= rows || n > DF_HC_MAX) return;
    if (threadIdx.x == 0) {
        df_hc_weights((const float*)p.buf[0] + (u64)r * (u64)m, (const float*)p.buf[1], w, n, iters, head, p.f[0]);
        if (p.buf[3])
            for (int i = 0; i < m; ++i) ((float*)p.buf[3])[(u64)r * (u64)m + i] = w[i];
    }
    __syncthreads();
    const float* x = (const float*)p.buf[2] + (u64)r * (u64)n * (u64)h;
    float* out = (float*)p.buf[4] + (u64)r * (u64)h;
    for (int d = threadIdx.x; d < h; d += blockDim.x) {
        float o = 0.0f;
        for (int j = 0; j < n; ++j) o = __fadd_rn(o, __fmul_rn(w[j], x[(u64)j * (u64)h + d]));
        out[d] = o;
    }
}

// The expand: one thread per output value. Buffers weights [rows, (2 + S) * S], y [rows, H],
// streams [rows, S*H], out [rows, S*H]; i rows, H, S.
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_hyper_expand(LayerParams p) {
    const int rows = p.i[0], h = p.i[1], n = p.i[2];
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x, width = (u64)n * (u64)h;
    if (t >= (u64)rows * width) return;
    const u64 r = t / width;
    const int k = (int)(t % width / (u64)h), d = (int)(t % (u64)h);
    const float* w = (const float*)p.buf[0] + r * (u64)((2 + n) * n);
    const float* x = (const float*)p.buf[2] + r * width;
    float mix = 0.0f;
    for (int j = 0; j < n; ++j) mix = __fadd_rn(mix, __fmul_rn(w[2 * n + j * n + k], x[(u64)j * (u64)h + d]));
    const float y = ((const float*)p.buf[1])[r * (u64)h + d];
    ((float*)p.buf[3])[t] = __fadd_rn(__fmul_rn(w[n + k], y), mix);
}
