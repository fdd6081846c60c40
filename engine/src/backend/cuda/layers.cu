// Deltafin's CUDA layer kernels: the row-wise operations of a forward pass besides the matrix
// products (RMSNorm, the gated activations, the MoE router and its weighted combine, residual
// adds), compiled with matmul.cu and math.cuh into one NVRTC module (--fmad=false --ftz=false).
//
// Each computes exactly the CPU's sequence of IEEE operations, so its outputs are the CPU's bits:
//   * RMSNorm: the sum of squares in the canonical 16-lane order of kernels/reference.rs::dot
//     (lane l accumulates fma(x, x, acc) over k = l mod 16, tree 8, 4, 2, 1), then
//     1 / sqrt(ss / width + eps) and w * (x * inv)    (kernels/ops.rs);
//   * activations: model/layers/mlp.rs's Activation::apply with math.cuh's exp and tanh;
//   * the router: model/layers/moe.rs's Moe::route (sigmoid or f32 softmax scores, selection
//     bias, group-limited top-k ranked by the sum of each group's two best, ties to the lower
//     index under IEEE total order, renormalisation, scaling), one thread per row;
//   * the combine: per row, from zero, o += v * w over the row's routed outputs in route order.
// engine/tests/cuda_emulated_layers.rs runs this source on the CPU against those functions.
//
// Every kernel takes one LayerParams by value (backend/abi.rs mirrors it): buffer addresses,
// integers and floats, in the order each kernel's comment lists.

#define DF_BUFS 8
#define DF_INTS 12
#define DF_FLOATS 4

struct LayerParams {
    u64 buf[DF_BUFS];
    int i[DF_INTS];
    float f[DF_FLOATS];
};

#define DF_NORM_ROWS 16  // rows per RMSNorm block: block (LANES, DF_NORM_ROWS)
#define DF_THREADS 256   // threads per block of the element-wise kernels and the router

// Sum of lanes 0..15 of a 16-lane segment by the fixed tree, broadcast to every lane.
__device__ __forceinline__ float df_lane_sum(float v) {
    for (int s = LANES / 2; s > 0; s /= 2) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, s, LANES));
    return __shfl_sync(0xffffffffu, v, 0, LANES);
}

// RMSNorm of `rows` rows of `width`: buf x, weight, out (may equal x), gate (optional: then
// out = (w * (x * inv)) * act(gate), KDA's sigmoid or gated DeltaNet's SiLU gated norm); i rows,
// width, gate activation (0 sigmoid, 1 SiLU); f eps.
extern "C" __global__ void __launch_bounds__(LANES * DF_NORM_ROWS) deltafin_rms_norm(LayerParams p) {
    const float* x = (const float*)p.buf[0];
    const float* w = (const float*)p.buf[1];
    float* out = (float*)p.buf[2];
    const int rows = p.i[0], width = p.i[1];
    const int lane = threadIdx.x;
    const int r = blockIdx.x * DF_NORM_ROWS + threadIdx.y;
    const bool live = r < rows;
    const float* xr = x + (u64)(live ? r : 0) * (u64)width;
    const int padded = (width + LANES - 1) / LANES * LANES;
    float acc = 0.0f;
    for (int k = lane; k < padded; k += LANES) {
        const float v = (live && k < width) ? xr[k] : 0.0f;
        acc = __fmaf_rn(v, v, acc);
    }
    const float ss = df_lane_sum(acc);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)width), p.f[0])));
    if (!live) return;
    float* o = out + (u64)r * (u64)width;
    const float* gate = p.buf[3] ? (const float*)p.buf[3] + (u64)r * (u64)width : 0;
    for (int k = lane; k < width; k += LANES) {
        const float y = __fmul_rn(w[k], __fmul_rn(xr[k], inv));
        // i[2]: the gate's activation, 0 sigmoid (KDA), 1 SiLU (gated DeltaNet: g * sigmoid(g)).
        o[k] = !gate ? y : __fmul_rn(y, p.i[2] ? __fmul_rn(gate[k], df_sigmoid(gate[k])) : df_sigmoid(gate[k]));
    }
}

#define DF_ACT_SILU 0
#define DF_ACT_SITU 1
#define DF_ACT_SITU_LINEAR 2  // SiTU with a soft-capped up branch (linear_beta)
#define DF_ACT_CLAMPED_SWIGLU 3  // gpt-oss: (clamp(u, ±limit) + 1) · g' · σ(α g'), g' = min(g, limit)
#define DF_ACT_CLAMPED_SILU 4  // DeepSeek-V4: silu(min(g, limit)) · clamp(u, ±limit)

// out = act(g, u) element-wise: buf g, u, out (may equal g); i count, kind; f beta, linear_beta.
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_gated_act(LayerParams p) {
    const float* g = (const float*)p.buf[0];
    const float* u = (const float*)p.buf[1];
    float* out = (float*)p.buf[2];
    const u64 e = (u64)blockIdx.x * DF_THREADS + threadIdx.x;
    if (e >= (u64)p.i[0]) return;
    const float gv = g[e], uv = u[e];
    const int kind = p.i[1];
    if (kind == DF_ACT_SILU) {
        out[e] = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, df_exp(-gv))), uv);
        return;
    }
    if (kind == DF_ACT_CLAMPED_SILU) {
        const float limit = p.f[1];
        const float gc = fminf(gv, limit);
        const float uc = fminf(fmaxf(uv, -limit), limit);
        out[e] = __fmul_rn(__fdiv_rn(gc, __fadd_rn(1.0f, df_exp(-gc))), uc);
        return;
    }
    if (kind == DF_ACT_CLAMPED_SWIGLU) {
        const float alpha = p.f[0], limit = p.f[1];
        const float gc = fminf(gv, limit);
        const float uc = fminf(fmaxf(uv, -limit), limit);
        const float glu = __fmul_rn(gc, df_sigmoid(__fmul_rn(gc, alpha)));
        out[e] = __fmul_rn(__fadd_rn(uc, 1.0f), glu);
        return;
    }
    const float beta = p.f[0], lb = p.f[1];
    const float gate = __fmul_rn(__fmul_rn(beta, df_tanh(__fdiv_rn(gv, beta))), df_sigmoid(gv));
    const float up = kind == DF_ACT_SITU_LINEAR ? __fmul_rn(lb, df_tanh(__fdiv_rn(uv, lb))) : uv;
    out[e] = __fmul_rn(gate, up);
}

// out = a + b element-wise: buf a, b, out; i count.
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_add(LayerParams p) {
    const u64 e = (u64)blockIdx.x * DF_THREADS + threadIdx.x;
    if (e >= (u64)p.i[0]) return;
    ((float*)p.buf[2])[e] = __fadd_rn(((const float*)p.buf[0])[e], ((const float*)p.buf[1])[e]);
}

// Rust's f32::total_cmp as a signed key: flip the magnitude bits of negative values.
__device__ __forceinline__ int df_total_key(float v) {
    int k = (int)__float_as_uint(v);
    return k ^ (int)(((u32)(k >> 31)) >> 1);
}

// True when (score a, index ia) ranks before (b, ib): larger under total order, lower index on ties.
__device__ __forceinline__ bool df_ranks_before(float a, int ia, float b, int ib) {
    const int ka = df_total_key(a), kb = df_total_key(b);
    return ka > kb || (ka == kb && ia < ib);
}

#define DF_SCORE_SIGMOID 0
#define DF_SCORE_SOFTMAX 1
#define DF_SCORE_TOPK_SOFTMAX 2  // gpt-oss: top-k of the logits, softmax over the chosen

// Router scores (sigmoid, f32 softmax over the row, or the logits themselves) into s; the
// selection scores into c.
__device__ void df_router_scores(const float* l, const float* bias, float* s, float* c, int e, int scoring) {
    if (scoring == DF_SCORE_TOPK_SOFTMAX) {
        for (int j = 0; j < e; ++j) s[j] = c[j] = l[j];
        return;
    }
    if (scoring == DF_SCORE_SIGMOID) {
        for (int j = 0; j < e; ++j) s[j] = df_sigmoid(l[j]);
    } else {
        float max = __uint_as_float(0xff800000u);
        for (int j = 0; j < e; ++j) max = fmaxf(max, l[j]);
        float sum = -0.0f;
        for (int j = 0; j < e; ++j) {
            s[j] = df_exp(__fsub_rn(l[j], max));
            sum = __fadd_rn(sum, s[j]);
        }
        for (int j = 0; j < e; ++j) s[j] = __fdiv_rn(s[j], sum);
    }
    for (int j = 0; j < e; ++j) c[j] = bias ? __fadd_rn(s[j], bias[j]) : s[j];
}

// Group limitation: mark (allowed[j] = 1) the experts of the best topk_group groups, ranked by
// the sum of each group's two best selection scores; every expert when n_group <= 1.
__device__ void df_router_groups(const float* c, float* allowed, float* gscore, int e, int n_group, int topk_group) {
    if (n_group <= 1) {
        for (int j = 0; j < e; ++j) allowed[j] = 1.0f;
        return;
    }
    const int per = e / n_group;
    for (int g = 0; g < n_group; ++g) {
        float b0 = __uint_as_float(0xff800000u), b1 = b0;
        for (int j = g * per; j < (g + 1) * per; ++j) {
            if (c[j] > b0) {
                b1 = b0;
                b0 = c[j];
            } else if (c[j] > b1) {
                b1 = c[j];
            }
        }
        gscore[g] = __fadd_rn(b0, b1);
    }
    for (int j = 0; j < e; ++j) allowed[j] = 0.0f;
    for (int t = 0; t < topk_group; ++t) {
        int best = -1;
        for (int g = 0; g < n_group; ++g) {
            if (allowed[g * per] != 0.0f) continue;
            if (best < 0 || df_ranks_before(gscore[g], g, gscore[best], best)) best = g;
        }
        for (int j = best * per; j < (best + 1) * per; ++j) allowed[j] = 1.0f;
    }
}

// Routing of `rows` rows of router logits: buf logits [rows, E], bias [E] (0: none),
// ids [rows, top_k] (i32, -1 past the selection), weights [rows, top_k], scratch [rows, 3E + n_group];
// i rows, E, scoring, n_group, topk_group, top_k, norm_topk_prob; f scaling.
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_route(LayerParams p) {
    const int rows = p.i[0], e = p.i[1], scoring = p.i[2], n_group = p.i[3], topk_group = p.i[4];
    const int top_k = p.i[5], norm = p.i[6];
    const int r = blockIdx.x * DF_THREADS + threadIdx.x;
    if (r >= rows) return;
    const float* l = (const float*)p.buf[0] + (u64)r * (u64)e;
    int* ids = (int*)p.buf[2] + (u64)r * (u64)top_k;
    float* wts = (float*)p.buf[3] + (u64)r * (u64)top_k;
    float* s = (float*)p.buf[4] + (u64)r * (u64)(3 * e + n_group);
    float* c = s + e;
    float* allowed = c + e;
    const bool topk_softmax = scoring == DF_SCORE_TOPK_SOFTMAX;
    df_router_scores(l, (const float*)p.buf[1], s, c, e, scoring);
    df_router_groups(c, allowed, allowed + e, e, topk_softmax ? 1 : n_group, topk_group);
    int picked = 0;
    for (; picked < top_k; ++picked) {
        int best = -1;
        for (int j = 0; j < e; ++j) {
            if (allowed[j] == 0.0f) continue;
            if (best < 0 || df_ranks_before(c[j], j, c[best], best)) best = j;
        }
        if (best < 0) break;
        allowed[best] = 0.0f;
        ids[picked] = best;
        wts[picked] = s[best];
    }
    for (int t = picked; t < top_k; ++t) {
        ids[t] = -1;
        wts[t] = 0.0f;
    }
    if (topk_softmax) {
        // The softmax over the chosen logits in selection order (moe.rs::top_k_softmax).
        float max = __uint_as_float(0xff800000u), sum = -0.0f;
        for (int t = 0; t < picked; ++t) max = fmaxf(max, wts[t]);
        for (int t = 0; t < picked; ++t) {
            wts[t] = df_exp(__fsub_rn(wts[t], max));
            sum = __fadd_rn(sum, wts[t]);
        }
        for (int t = 0; t < picked; ++t) wts[t] = __fdiv_rn(wts[t], sum);
    } else if (norm) {
        float denom = -0.0f;  // Rust's f32 sum starts from -0.0
        for (int t = 0; t < picked; ++t) denom = __fadd_rn(denom, wts[t]);
        denom = __fadd_rn(denom, 1e-20f);
        for (int t = 0; t < picked; ++t) wts[t] = __fdiv_rn(wts[t], denom);
    }
    for (int t = 0; t < picked; ++t) wts[t] = __fmul_rn(wts[t], p.f[0]);
}

// Weighted combine of routed outputs: out[row, j] = sum over the row's slots, in order, from
// zero, of v * w. buf results [slots, width], weights [slots], offsets [rows + 1] (i32: the
// row's slots are offsets[row] .. offsets[row + 1]), out [rows, width]; i rows, width.
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_combine(LayerParams p) {
    const int rows = p.i[0], width = p.i[1];
    const u64 e = (u64)blockIdx.x * DF_THREADS + threadIdx.x;
    if (e >= (u64)rows * (u64)width) return;
    const u64 row = e / (u64)width, j = e % (u64)width;
    const float* res = (const float*)p.buf[0];
    const float* w = (const float*)p.buf[1];
    const int* off = (const int*)p.buf[2];
    float o = 0.0f;
    for (int slot = off[row]; slot < off[row + 1]; ++slot)
        o = __fadd_rn(o, __fmul_rn(res[(u64)slot * (u64)width + j], w[slot]));
    ((float*)p.buf[3])[e] = o;
}

// ---- Absorbed MLA attention (model/layers/latent_attention.rs::attend) ----
//
// One 16-lane group per (row, head) (deltafin_mla_attend), or for long caches one per (row,
// head, block) then a merge per (row, head) (deltafin_mla_partials, deltafin_mla_merge); block
// (LANES, 1). Positions are cut
// into blocks of DF_MLA_BLOCK from position 0 and blocks into tiles of DF_MLA_TILE; inside a
// block the softmax runs online tile by tile; block partials (max, sum, acc) are folded in
// ascending order, the same sequence of operations as the CPU whatever its thread split. Scores
// are 16-lane dot products of fused multiply-adds (latent_attention.rs::dot16);
// every lane keeps the scalar state (max, sum, the tile's scores) and owns the latent elements
// x = lane (mod 16) of the accumulators.

#define DF_MLA_BLOCK 1024
#define DF_MLA_TILE 64
#define DF_MLA_PER_LANE 64  // latent <= 16 * 64

// Lane `lane`'s share of latent_attention.rs::dot16(a, b) over n values (a chain of fused
// multiply-adds), then the fixed tree (broadcast).
__device__ __forceinline__ float df_dot16(const float* a, const float* b, int n, int lane) {
    float acc = 0.0f;
    for (int k = lane; k < n; k += LANES) acc = __fmaf_rn(a[k], b[k], acc);
    return df_lane_sum(acc);
}

// One (row, head)'s query and keys, and the positions it attends: keys 0..len from its first
// cache row, or with DeepSeek Sparse Attention key j at position chosen[j] (ascending) from it
// (latent_attention.rs::LatentKeys::chosen: the same blocks and tiles, over the chosen keys).
struct DfMlaRow {
    const float *qa, *qr, *kl, *kr;
    const int* chosen;
    int len, latent, rope, mine, lane;
    float scale;
};

__device__ __forceinline__ DfMlaRow df_mla_row(const LayerParams& p, int row, int h, int lane) {
    const int heads = p.i[1], latent = p.i[2], rope = p.i[3];
    const int* info = (const int*)p.buf[4];
    const u64 first = (u64)info[2 * row];
    DfMlaRow r;
    r.qa = (const float*)p.buf[0] + ((u64)row * heads + h) * (u64)latent;
    r.qr = (const float*)p.buf[1] + ((u64)row * heads + h) * (u64)rope;
    r.kl = (const float*)p.buf[2] + first * (u64)latent;
    r.kr = (const float*)p.buf[3] + first * (u64)rope;
    r.len = info[2 * row + 1];
    // Optional buffers 6 and 7: every sparse row's chosen positions, and each row's offset in
    // them (-1: the row attends every position).
    const int* chosen = (const int*)p.buf[6];
    const int at = chosen ? ((const int*)p.buf[7])[row] : -1;
    r.chosen = at >= 0 ? chosen + at : nullptr;
    r.latent = latent;
    r.rope = rope;
    r.mine = (latent - lane + LANES - 1) / LANES;  // latent elements this lane owns
    r.lane = lane;
    r.scale = p.f[0];
    return r;
}

// The cache row (from the row's first) of key j.
__device__ __forceinline__ u64 df_mla_key(const DfMlaRow& r, int j) {
    return r.chosen ? (u64)r.chosen[j] : (u64)j;
}

// Block `block`'s partial (max, sum, this lane's accumulators): the online softmax tile by tile.
__device__ __forceinline__ void df_mla_block(const DfMlaRow& r, int block, float& pmax, float& psum, float* pacc) {
    const int lane = r.lane;
    float scores[DF_MLA_TILE];
    pmax = __uint_as_float(0xff800000u);
    psum = 0.0f;
    for (int i = 0; i < r.mine; ++i) pacc[i] = 0.0f;
    const int start = block * DF_MLA_BLOCK;
    const int end = start + DF_MLA_BLOCK < r.len ? start + DF_MLA_BLOCK : r.len;
    for (int t0 = start; t0 < end; t0 += DF_MLA_TILE) {
        const int t1 = t0 + DF_MLA_TILE < end ? t0 + DF_MLA_TILE : end;
        float tile_max = __uint_as_float(0xff800000u);
        for (int j = t0; j < t1; ++j) {
            const u64 t = df_mla_key(r, j);
            const float d1 = df_dot16(r.qa, r.kl + t * r.latent, r.latent, lane);
            const float d2 = df_dot16(r.qr, r.kr + t * r.rope, r.rope, lane);
            scores[j - t0] = __fmul_rn(__fadd_rn(d1, d2), r.scale);
        }
        for (int j = t0; j < t1; ++j) tile_max = fmaxf(tile_max, scores[j - t0]);
        const float m = fmaxf(pmax, tile_max);
        const float a = df_exp(__fsub_rn(pmax, m));
        pmax = m;
        psum = __fmul_rn(psum, a);
        for (int i = 0; i < r.mine; ++i) pacc[i] = __fmul_rn(pacc[i], a);
        for (int j = t0; j < t1; ++j) {
            const float pj = df_exp(__fsub_rn(scores[j - t0], pmax));
            psum = __fadd_rn(psum, pj);
            const float* c = r.kl + df_mla_key(r, j) * r.latent;
            for (int i = 0; i < r.mine; ++i) pacc[i] = __fmaf_rn(pj, c[lane + LANES * i], pacc[i]);
        }
    }
}

// Fold block `block`'s partial into the running (tmax, tsum, tacc): block 0 is taken as is,
// later blocks merged with both sides rescaled to the larger maximum.
__device__ __forceinline__ void df_mla_fold(int block, int mine, float pmax, float psum, const float* pacc,
                                            float& tmax, float& tsum, float* tacc) {
    if (block == 0) {
        tmax = pmax;
        tsum = psum;
        for (int i = 0; i < mine; ++i) tacc[i] = pacc[i];
        return;
    }
    const float m = fmaxf(tmax, pmax);
    const float a = df_exp(__fsub_rn(tmax, m)), b = df_exp(__fsub_rn(pmax, m));
    tmax = m;
    tsum = __fadd_rn(__fmul_rn(tsum, a), __fmul_rn(psum, b));
    for (int i = 0; i < mine; ++i) tacc[i] = __fadd_rn(__fmul_rn(tacc[i], a), __fmul_rn(pacc[i], b));
}

__device__ __forceinline__ void df_mla_write(float* out, int mine, int lane, float tsum, const float* tacc) {
    const float inv = __fdiv_rn(1.0f, tsum);
    for (int i = 0; i < mine; ++i) out[lane + LANES * i] = __fmul_rn(tacc[i], inv);
}

// Latent context of every (row, head), all its blocks in one group: buf q_abs [rows, heads,
// latent], q_rope [rows, heads, rope], key latents [positions, latent], rope keys [positions,
// rope], rows [rows, 2] (i32: first key position, keys attended), out [rows, heads, latent],
// and optionally (DSA) chosen positions (i32) and each row's offset in them (i32, -1: dense);
// i rows, heads, latent, rope; f scale. For rows of at most one block of keys.
extern "C" __global__ void __launch_bounds__(LANES) deltafin_mla_attend(LayerParams p) {
    const int row = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const DfMlaRow r = df_mla_row(p, row, h, lane);
    float tmax = 0.0f, tsum = 0.0f, pmax, psum, tacc[DF_MLA_PER_LANE], pacc[DF_MLA_PER_LANE];
    for (int block = 0; block * DF_MLA_BLOCK < r.len; ++block) {
        df_mla_block(r, block, pmax, psum, pacc);
        df_mla_fold(block, r.mine, pmax, psum, pacc, tmax, tsum, tacc);
    }
    df_mla_write((float*)p.buf[5] + ((u64)row * p.i[1] + h) * (u64)r.latent, r.mine, lane, tsum, tacc);
}

// Long caches, step 1: every (row, head, block) at once, grid (rows, heads, blocks). Buffers 0-4
// and 6-7 as deltafin_mla_attend, then (5) partials [rows, heads, blocks, latent + 2] (max, sum, the
// accumulators); i rows, heads, latent, rope, blocks; f scale. Blocks past a row's length are
// left unwritten (the merge stops before them).
extern "C" __global__ void __launch_bounds__(LANES) deltafin_mla_partials(LayerParams p) {
    const int row = blockIdx.x, h = blockIdx.y, block = blockIdx.z, lane = threadIdx.x;
    const DfMlaRow r = df_mla_row(p, row, h, lane);
    if (block * DF_MLA_BLOCK >= r.len) return;
    float pmax, psum, pacc[DF_MLA_PER_LANE];
    df_mla_block(r, block, pmax, psum, pacc);
    const u64 stride = (u64)r.latent + 2;
    float* part = (float*)p.buf[5] + (((u64)row * p.i[1] + h) * (u64)p.i[4] + block) * stride;
    if (lane == 0) {
        part[0] = pmax;
        part[1] = psum;
    }
    for (int i = 0; i < r.mine; ++i) part[2 + lane + LANES * i] = pacc[i];
}

// Long caches, step 2: per (row, head) the partials folded in ascending block order, as
// deltafin_mla_attend folds them. Buffers: partials, rows [rows, 2], out [rows, heads, latent];
// i rows, heads, latent, blocks. Grid (rows, heads), block (LANES).
extern "C" __global__ void __launch_bounds__(LANES) deltafin_mla_merge(LayerParams p) {
    const int row = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int heads = p.i[1], latent = p.i[2], blocks = p.i[3];
    const int len = ((const int*)p.buf[1])[2 * row + 1];
    const int mine = (latent - lane + LANES - 1) / LANES;
    const u64 stride = (u64)latent + 2;
    const float* parts = (const float*)p.buf[0] + ((u64)row * heads + h) * (u64)blocks * stride;
    float tmax = 0.0f, tsum = 0.0f, tacc[DF_MLA_PER_LANE], pacc[DF_MLA_PER_LANE];
    for (int block = 0; block * DF_MLA_BLOCK < len; ++block) {
        const float* part = parts + (u64)block * stride;
        for (int i = 0; i < mine; ++i) pacc[i] = part[2 + lane + LANES * i];
        df_mla_fold(block, mine, part[0], part[1], pacc, tmax, tsum, tacc);
    }
    df_mla_write((float*)p.buf[2] + ((u64)row * heads + h) * (u64)latent, mine, lane, tsum, tacc);
}

// ---- Kimi Delta Attention (model/layers/kda.rs) ----
//
// A pass's rows belong to sequences; `seq_rows` (i32, seqs + 1 offsets) and `row_ids` (i32)
// list each sequence's rows in order. Every kernel below keeps the CPU's per-element order:
// the convolution per channel over the sequence's rows (kda::convolve, conv_push), the L2 norm
// per (row, head) (L2Norm::apply, sums in index order from -0.0 as Rust's f32 sum), the
// log-decay and beta per element (kda::log_decay), and the delta rule per (sequence, head) with
// one thread per state column: each column's decay, k^T S, update and read-out are sums over
// the key index in order (kda::delta_rule_step, kda::readout), so no value crosses threads.

// Convolution + SiLU: buf raw [n, 3P], conv [3P, K], history [seqs, (K - 1) * 3P] (advanced in
// place), seq_rows, row_ids, out [n, 3P]; i seqs, width (3P), K. Grid (width / 256, seqs).
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_kda_conv(LayerParams p) {
    const int width = p.i[1], kernel = p.i[2];
    const int c = blockIdx.x * DF_THREADS + threadIdx.x, seq = blockIdx.y;
    if (c >= width) return;
    const float* raw = (const float*)p.buf[0];
    const float* w = (const float*)p.buf[1] + (u64)c * (u64)kernel;
    float* hist = (float*)p.buf[2] + (u64)seq * (u64)(kernel - 1) * (u64)width;
    const int* seq_rows = (const int*)p.buf[3];
    const int* row_ids = (const int*)p.buf[4];
    float* out = (float*)p.buf[5];
    for (int t = seq_rows[seq]; t < seq_rows[seq + 1]; ++t) {
        const u64 r = (u64)row_ids[t];
        float acc = 0.0f;
        for (int j = 0; j < kernel - 1; ++j) acc = __fadd_rn(acc, __fmul_rn(hist[(u64)j * width + c], w[j]));
        const float x = raw[r * (u64)width + c];
        acc = __fadd_rn(acc, __fmul_rn(x, w[kernel - 1]));
        out[r * (u64)width + c] = __fmul_rn(acc, df_sigmoid(acc));
        if (kernel > 1) {
            for (int j = 0; j + 1 < kernel - 1; ++j) hist[(u64)j * width + c] = hist[(u64)(j + 1) * width + c];
            hist[(u64)(kernel - 2) * width + c] = x;
        }
    }
}

#define DF_L2_EPS_INSIDE 0  // x / sqrt(sum x^2 + eps)
#define DF_L2_EPS_FLOOR 1   // x / max(sqrt(sum x^2), eps)

// L2 norms of q (then times q_scale) and k, in place: buf qkv [n, 3P]; i n, heads, head_dim,
// mode; f eps, q_scale. One thread per (row, q or k, head).
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_kda_l2(LayerParams p) {
    const int n = p.i[0], heads = p.i[1], hd = p.i[2], mode = p.i[3];
    const u64 t = (u64)blockIdx.x * DF_THREADS + threadIdx.x;
    if (t >= (u64)n * 2u * (u64)heads) return;
    const u64 row = t / (2u * (u64)heads), part = (t / (u64)heads) % 2u, h = t % (u64)heads;
    const u64 ch = (u64)heads * (u64)hd;
    float* x = (float*)p.buf[0] + row * 3u * ch + part * ch + h * (u64)hd;
    float ss = -0.0f;
    for (int i = 0; i < hd; ++i) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
    const float eps = p.f[0];
    const float denom = mode == DF_L2_EPS_INSIDE ? __fsqrt_rn(__fadd_rn(ss, eps)) : fmaxf(__fsqrt_rn(ss), eps);
    for (int i = 0; i < hd; ++i) {
        const float v = __fdiv_rn(x[i], denom);
        x[i] = part == 0 ? __fmul_rn(v, p.f[1]) : v;
    }
}

#define DF_DECAY_SOFTPLUS 0     // g = -rate * softplus(f)
#define DF_DECAY_LOWER_BOUND 1  // g = bound * sigmoid(rate * f)

// Log-decay and beta: buf f [n, P / group], dt_bias [P], rate [P], beta logits [n, heads], g out
// [n, P], beta out [n, heads]; i n, P, heads, decay kind, group; f bound. One thread per channel.
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_kda_gates(LayerParams p) {
    const int n = p.i[0], ch = p.i[1], heads = p.i[2];
    const u64 e = (u64)blockIdx.x * DF_THREADS + threadIdx.x;
    if (e < (u64)n * (u64)heads) {
        ((float*)p.buf[5])[e] = df_sigmoid(((const float*)p.buf[3])[e]);
    }
    if (e >= (u64)n * (u64)ch) return;
    const u64 c = e % (u64)ch;
    // f holds one value per channel (KDA) or per group of i[4] channels (gated DeltaNet: per head).
    const u64 group = p.i[4] > 1 ? (u64)p.i[4] : 1;
    const u64 fi = e / (u64)ch * ((u64)ch / group) + c / group;
    const float f = __fadd_rn(((const float*)p.buf[0])[fi], ((const float*)p.buf[1])[c]);
    const float rate = ((const float*)p.buf[2])[c];
    ((float*)p.buf[4])[e] = p.i[3] == DF_DECAY_SOFTPLUS ? __fmul_rn(-rate, df_softplus(f))
                                                       : __fmul_rn(p.f[0], df_sigmoid(__fmul_rn(rate, f)));
}

// The delta rule and read-out: buf state [seqs, heads, d, d] (advanced in place), qkv [n, 3P]
// (normalised), g [n, P], beta [n, heads], seq_rows, row_ids, out [n, P]; i seqs, heads, d.
// Grid (seqs, heads), block (d): thread j owns column j of its head's state.
extern "C" __global__ void __launch_bounds__(1024) deltafin_kda_recurrence(LayerParams p) {
    const int heads = p.i[1], d = p.i[2];
    const int seq = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
    if (j >= d) return;
    const u64 ch = (u64)heads * (u64)d;
    float* st = (float*)p.buf[0] + ((u64)seq * heads + h) * (u64)d * (u64)d;
    const float* qkv = (const float*)p.buf[1];
    const float* g = (const float*)p.buf[2];
    const float* beta = (const float*)p.buf[3];
    const int* seq_rows = (const int*)p.buf[4];
    const int* row_ids = (const int*)p.buf[5];
    float* out = (float*)p.buf[6];
    for (int t = seq_rows[seq]; t < seq_rows[seq + 1]; ++t) {
        const u64 r = (u64)row_ids[t];
        const float* qh = qkv + r * 3u * ch + (u64)h * d;
        const float* kh = qh + ch;
        const float* vh = kh + ch;
        const float* gh = g + r * ch + (u64)h * d;
        for (int i = 0; i < d; ++i) st[(u64)i * d + j] = __fmul_rn(st[(u64)i * d + j], df_exp(gh[i]));
        float acc = 0.0f;
        for (int i = 0; i < d; ++i) acc = __fadd_rn(acc, __fmul_rn(st[(u64)i * d + j], kh[i]));
        const float delta = __fmul_rn(__fsub_rn(vh[j], acc), beta[r * (u64)heads + h]);
        for (int i = 0; i < d; ++i) st[(u64)i * d + j] = __fadd_rn(st[(u64)i * d + j], __fmul_rn(kh[i], delta));
        float o = 0.0f;
        for (int i = 0; i < d; ++i) o = __fadd_rn(o, __fmul_rn(st[(u64)i * d + j], qh[i]));
        out[r * ch + (u64)h * d + j] = o;
    }
}

// ---- MLA projections around the attention core (model/layers/mla.rs, rope.rs) ----

// RoPE in place by host-computed factors (rope.rs::Rope::apply_factors): buf x, factors
// [rows, 2 * half] ((cos, sin) per frequency); i rows, vectors per row, row stride, offset of
// the first vector, vector stride, half, interleave (0 halves, 1 interleaved pairs written as
// halves, 2 interleaved pairs kept in place). One thread per (row, vector).
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_rope(LayerParams p) {
    const int rows = p.i[0], vecs = p.i[1], half = p.i[5], interleave = p.i[6];
    const u64 t = (u64)blockIdx.x * DF_THREADS + threadIdx.x;
    if (t >= (u64)rows * (u64)vecs || half > 256) return;
    const u64 row = t / (u64)vecs, v = t % (u64)vecs;
    float* x = (float*)p.buf[0] + row * (u64)p.i[2] + (u64)p.i[3] + v * (u64)p.i[4];
    const float* f = (const float*)p.buf[1] + row * 2u * (u64)half;
    float out[512];
    for (int i = 0; i < half; ++i) {
        const float c = f[2 * i], s = f[2 * i + 1];
        const float a = interleave ? x[2 * i] : x[i];
        const float b = interleave ? x[2 * i + 1] : x[i + half];
        // Pairs kept in place (interleave 2: DeepSeek-V4, compressed.rs::rotate), else split
        // into halves (Rope::apply_factors).
        const int lo = interleave == 2 ? 2 * i : i, hi = interleave == 2 ? 2 * i + 1 : i + half;
        out[lo] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        out[hi] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
    for (int i = 0; i < 2 * half; ++i) x[i] = out[i];
}

// Absorbed queries (mla.rs::absorb_query) and the rotated query parts: buf q [n, heads * (nope
// + rope)], decoded kv_b [heads * (nope + v), c], q_abs out [n, heads, c], q_rope out [n, heads,
// rope]; i n, heads, nope, rope, v, c. One thread per (row, head, j < max(c, rope)).
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_mla_absorb(LayerParams p) {
    const int n = p.i[0], heads = p.i[1], nope = p.i[2], rope = p.i[3], v = p.i[4], c = p.i[5];
    const int span = c > rope ? c : rope;
    const u64 t = (u64)blockIdx.x * DF_THREADS + threadIdx.x;
    if (t >= (u64)n * (u64)heads * (u64)span) return;
    const u64 rh = t / (u64)span, row = rh / (u64)heads, h = rh % (u64)heads;
    const int j = (int)(t % (u64)span);
    const float* q = (const float*)p.buf[0] + row * (u64)heads * (u64)(nope + rope) + h * (u64)(nope + rope);
    if (j < rope) ((float*)p.buf[3])[rh * (u64)rope + j] = q[nope + j];
    if (j >= c) return;
    const float* w = (const float*)p.buf[1] + h * (u64)(nope + v) * (u64)c;
    float acc = 0.0f;
    for (int dim = 0; dim < nope; ++dim) acc = __fadd_rn(acc, __fmul_rn(q[dim], w[(u64)dim * c + j]));
    ((float*)p.buf[2])[rh * (u64)c + j] = acc;
}

// Attention values (mla.rs::value_rows): dot16 of kv_b's value rows with each head's latent
// context. buf decoded kv_b, ctx [n, heads, c], out [n, heads * v]; i n, heads, nope, v, c.
// Block (LANES, DF_NORM_ROWS): one 16-lane group per output value.
extern "C" __global__ void __launch_bounds__(LANES * DF_NORM_ROWS) deltafin_mla_values(LayerParams p) {
    const int n = p.i[0], heads = p.i[1], nope = p.i[2], v = p.i[3], c = p.i[4];
    const u64 total = (u64)n * (u64)heads * (u64)v;
    const u64 o = (u64)blockIdx.x * DF_NORM_ROWS + threadIdx.y;
    const bool live = o < total;
    const u64 oo = live ? o : 0;
    const u64 rh = oo / (u64)v, h = rh % (u64)heads;
    const int e = (int)(oo % (u64)v);
    const float* w = (const float*)p.buf[0] + (h * (u64)(nope + v) + (u64)(nope + e)) * (u64)c;
    const float* ctx = (const float*)p.buf[1] + rh * (u64)c;
    const float r = df_dot16(w, ctx, c, threadIdx.x);
    if (live && threadIdx.x == 0) ((float*)p.buf[2])[o] = r;
}

// out = a * sigmoid(g) element-wise (K3's MLA output gate): buf a, g, out; i count.
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_mul_sigmoid(LayerParams p) {
    const u64 e = (u64)blockIdx.x * DF_THREADS + threadIdx.x;
    if (e >= (u64)p.i[0]) return;
    const float a = ((const float*)p.buf[0])[e], g = ((const float*)p.buf[1])[e];
    ((float*)p.buf[2])[e] = __fmul_rn(a, df_sigmoid(g));
}

// Row copies (gathers, scatters, column slices): dst[dst_row(i), dst_col + j] =
// src[src_row(i), src_col + j] for i < count, j < width, where a row map is an i32 buffer or,
// when absent, the identity. buf src, dst, src rows (optional), dst rows (optional); i count,
// width, src stride, src col, dst stride, dst col. One thread per element.
extern "C" __global__ void __launch_bounds__(DF_THREADS) deltafin_copy_rows(LayerParams p) {
    const int count = p.i[0], width = p.i[1];
    const u64 e = (u64)blockIdx.x * DF_THREADS + threadIdx.x;
    if (e >= (u64)count * (u64)width) return;
    const u64 i = e / (u64)width, j = e % (u64)width;
    const int* sr = (const int*)p.buf[2];
    const int* dr = (const int*)p.buf[3];
    const u64 s = sr ? (u64)sr[i] : i, d = dr ? (u64)dr[i] : i;
    ((float*)p.buf[1])[d * (u64)p.i[4] + (u64)p.i[5] + j] = ((const float*)p.buf[0])[s * (u64)p.i[2] + (u64)p.i[3] + j];
}

// Block Attention Residuals (model/layers/attn_res.rs::AttnRes::mix, K3): per row, the values
// v_0 .. v_{count-1} (the anchors, then the partial sum) scored by s_i = dot16(v_i * rms_inv(v_i),
// q) in the canonical 16-lane order, softmax in f32 (max, then exp and a sum in order), and
// out = sum_i (e_i / sum) * v_i in order from zero. buf values [count, rows, H], query [H], out
// [rows, H]; i rows, H, count; f eps. Block (LANES, DF_NORM_ROWS): one 16-lane group per row.
#define DF_RES_MAX 64

extern "C" __global__ void __launch_bounds__(LANES * DF_NORM_ROWS) deltafin_attn_res(LayerParams p) {
    const int rows = p.i[0], h = p.i[1], count = p.i[2];
    const float* vals = (const float*)p.buf[0];
    const float* q = (const float*)p.buf[1];
    const int lane = threadIdx.x;
    const int r = blockIdx.x * DF_NORM_ROWS + threadIdx.y;
    const bool live = r < rows && count <= DF_RES_MAX;
    const u64 row = live ? (u64)r : 0;
    const int padded = (h + LANES - 1) / LANES * LANES;
    float s[DF_RES_MAX];
    const int n_vals = count <= DF_RES_MAX ? count : DF_RES_MAX;
    for (int i = 0; i < n_vals; ++i) {
        const float* v = vals + ((u64)i * rows + row) * (u64)h;
        float acc = 0.0f;
        for (int k = lane; k < padded; k += LANES) {
            const float x = (live && k < h) ? v[k] : 0.0f;
            acc = __fmaf_rn(x, x, acc);
        }
        const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(df_lane_sum(acc), (float)h), p.f[0])));
        float d = 0.0f;
        for (int k = lane; k < padded; k += LANES) {
            const float x = (live && k < h) ? __fmul_rn(v[k], inv) : 0.0f;
            d = __fmaf_rn(x, (live && k < h) ? q[k] : 0.0f, d);
        }
        s[i] = df_lane_sum(d);
    }
    if (!live) return;
    float max = __uint_as_float(0xff800000u), sum = 0.0f;
    for (int i = 0; i < n_vals; ++i) max = fmaxf(max, s[i]);
    for (int i = 0; i < n_vals; ++i) {
        s[i] = df_exp(__fsub_rn(s[i], max));
        sum = __fadd_rn(sum, s[i]);
    }
    float* out = (float*)p.buf[2] + row * (u64)h;
    for (int k = lane; k < h; k += LANES) {
        float o = 0.0f;
        for (int i = 0; i < n_vals; ++i)
            o = __fadd_rn(o, __fmul_rn(__fdiv_rn(s[i], sum), vals[((u64)i * rows + row) * (u64)h + k]));
        out[k] = o;
    }
}

// ---- Grouped-query attention (model/layers/gqa.rs::attend_head) ----
//
// One 16-lane group per (row, head): grid (rows, heads), block (LANES). The row's query head h
// reads key/value head h / (heads / kv_heads) over positions start..end of the cache, as the
// CPU does: each score a plain dot product in element order (a multiply, then an add, from
// -0.0) times the scale; the maximum over the scores and the sink; exp(s - max) summed in
// position order, the sink's term last; then out = sum_j (e_j / sum) * v_j in position order
// from zero. Lane l computes the scores of positions base + l of each group of 16; the sum and
// the values take them in order by shuffles, so the operations are the CPU's whatever the
// lane split. Lane l owns the head's values d = l (mod 16). Buffers: q [rows, heads * hd], keys
// [positions, kv_heads * hd], values (same), sinks [heads] (optional), rows [rows, 2] (i32:
// first position, end), out [rows, heads * hd]; i rows, heads, kv_heads, hd; f scale.
#define DF_GQA_PER_LANE 16  // head_dim <= 16 * 16

__device__ __forceinline__ float df_gqa_score(const float* q, const float* k, int hd, float scale) {
    float s = -0.0f;
    for (int d = 0; d < hd; ++d) s = __fadd_rn(s, __fmul_rn(q[d], k[d]));
    return __fmul_rn(s, scale);
}

__device__ __forceinline__ float df_lane_max(float v) {
    for (int s = LANES / 2; s > 0; s /= 2) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, s, LANES));
    return __shfl_sync(0xffffffffu, v, 0, LANES);
}

extern "C" __global__ void __launch_bounds__(LANES) deltafin_gqa_attend(LayerParams p) {
    const int row = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int heads = p.i[1], kv_heads = p.i[2], hd = p.i[3];
    const float scale = p.f[0];
    const int* info = (const int*)p.buf[4];
    const int start = info[2 * row], end = info[2 * row + 1];
    const int kv = h / (heads / kv_heads);
    const u64 kw = (u64)kv_heads * hd;
    const float* q = (const float*)p.buf[0] + (u64)row * heads * hd + (u64)h * hd;
    const float* keys = (const float*)p.buf[1] + (u64)kv * hd;
    const float* vals = (const float*)p.buf[2] + (u64)kv * hd;
    const bool has_sink = p.buf[3] != 0;
    const float sink = has_sink ? ((const float*)p.buf[3])[h] : 0.0f;
    float m = __uint_as_float(0xff800000u);
    for (int j = start + lane; j < end; j += LANES) m = fmaxf(m, df_gqa_score(q, keys + (u64)j * kw, hd, scale));
    m = df_lane_max(m);
    if (has_sink) m = fmaxf(m, sink);
    float sum = 0.0f;
    for (int base = start; base < end; base += LANES) {
        const int j = base + lane;
        const float e = j < end ? df_exp(__fsub_rn(df_gqa_score(q, keys + (u64)j * kw, hd, scale), m)) : 0.0f;
        for (int t = 0; t < LANES; ++t) {
            const float et = __shfl_sync(0xffffffffu, e, t, LANES);
            if (base + t < end) sum = __fadd_rn(sum, et);
        }
    }
    if (has_sink) sum = __fadd_rn(sum, df_exp(__fsub_rn(sink, m)));
    float acc[DF_GQA_PER_LANE];
    for (int i = 0; i < DF_GQA_PER_LANE; ++i) acc[i] = 0.0f;
    for (int base = start; base < end; base += LANES) {
        const int j = base + lane;
        const float e = j < end ? df_exp(__fsub_rn(df_gqa_score(q, keys + (u64)j * kw, hd, scale), m)) : 0.0f;
        const float pj = __fdiv_rn(e, sum);
        for (int t = 0; t < LANES; ++t) {
            const float pt = __shfl_sync(0xffffffffu, pj, t, LANES);
            if (base + t >= end) continue;
            const float* v = vals + (u64)(base + t) * kw;
            for (int i = 0, d = lane; d < hd; ++i, d += LANES) acc[i] = __fadd_rn(acc[i], __fmul_rn(pt, v[d]));
        }
    }
    float* out = (float*)p.buf[5] + (u64)row * heads * hd + (u64)h * hd;
    for (int i = 0, d = lane; d < hd; ++i, d += LANES) out[d] = acc[i];
}
