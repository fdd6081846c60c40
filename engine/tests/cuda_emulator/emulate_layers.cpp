// Runs the CUDA layer kernels (engine/src/backend/cuda/layers.cu) and the device math
// (math.cuh) on the CPU, unchanged, through cuda_shim.h. Used by
// engine/tests/cuda_emulated_layers.rs to check them bit for bit against the CPU's functions.
//
// Input (stdin, little-endian), requests one after another until the end of input, each:
//   u32 0 (launch): u32 name length, the name, grid 3 x u32, block 3 x u32, u32 buffer count,
//     per buffer u64 length and its bytes, then DF_INTS x i32 and DF_FLOATS x f32.
//     Output: every buffer's bytes after the kernel ran, in order.
//   u32 1 (math): u32 function (0 exp, 1 exp_m1, 2 tanh, 3 ln, 4 ln_1p, 5 sigmoid, 6 softplus),
//     u64 count, count x f32. Output: count x f32.

#include <malloc.h>

#include <cstdio>
#include <string>

#include "cuda_shim.h"

#include "../../src/backend/cuda/matmul.cu"
#include "../../src/backend/cuda/math.cuh"
#include "../../src/backend/cuda/layers.cu"
#include "../../src/backend/cuda/deepseek.cu"

static bool read_all(void* dst, size_t len) { return std::fread(dst, 1, len, stdin) == len; }
static bool write_all(const void* src, size_t len) { return std::fwrite(src, 1, len, stdout) == len; }

typedef void (*LayerKernel)(LayerParams);
typedef void (*MatmulKernel)(const u8*, const u8*, const float*, float*, int, int, int, int, int, int, int);

// A matrix product through the matmul kernels (name "deltafin_matmul"; grid from its sizes).
static void emu_matmul(LayerParams) {}

static LayerKernel find(const std::string& name) {
    if (name == "deltafin_matmul") return emu_matmul;
    if (name == "deltafin_rms_norm") return deltafin_rms_norm;
    if (name == "deltafin_gated_act") return deltafin_gated_act;
    if (name == "deltafin_add") return deltafin_add;
    if (name == "deltafin_route") return deltafin_route;
    if (name == "deltafin_combine") return deltafin_combine;
    if (name == "deltafin_mla_attend") return deltafin_mla_attend;
    if (name == "deltafin_mla_partials") return deltafin_mla_partials;
    if (name == "deltafin_mla_merge") return deltafin_mla_merge;
    if (name == "deltafin_kda_conv") return deltafin_kda_conv;
    if (name == "deltafin_kda_l2") return deltafin_kda_l2;
    if (name == "deltafin_kda_gates") return deltafin_kda_gates;
    if (name == "deltafin_kda_recurrence") return deltafin_kda_recurrence;
    if (name == "deltafin_rope") return deltafin_rope;
    if (name == "deltafin_mla_absorb") return deltafin_mla_absorb;
    if (name == "deltafin_mla_values") return deltafin_mla_values;
    if (name == "deltafin_mul_sigmoid") return deltafin_mul_sigmoid;
    if (name == "deltafin_copy_rows") return deltafin_copy_rows;
    if (name == "deltafin_attn_res") return deltafin_attn_res;
    if (name == "deltafin_gqa_attend") return deltafin_gqa_attend;
    if (name == "deltafin_dsa_scores") return deltafin_dsa_scores;
    if (name == "deltafin_dsa_topk") return deltafin_dsa_topk;
    if (name == "deltafin_v4_attend") return deltafin_v4_attend;
    if (name == "deltafin_hyper_mixes") return deltafin_hyper_mixes;
    if (name == "deltafin_hyper_weights") return deltafin_hyper_weights;
    if (name == "deltafin_hyper_expand") return deltafin_hyper_expand;
    return nullptr;
}

static int launch() {
    uint32_t len;
    if (!read_all(&len, 4) || len > 256) return 2;
    std::string name(len, '\0');
    uint32_t dims[6], nbufs;
    if (!read_all(name.data(), len) || !read_all(dims, sizeof dims) || !read_all(&nbufs, 4)) return 2;
    const LayerKernel k = find(name);
    if (!k || nbufs > DF_BUFS) return 4;
    std::vector<std::vector<unsigned char>> bufs(nbufs);
    LayerParams p{};
    for (uint32_t b = 0; b < nbufs; ++b) {
        uint64_t n;
        if (!read_all(&n, 8)) return 2;
        bufs[b].resize(n + 64);  // slack: a kernel reading past its buffer reads zeros, not a crash
        if (!read_all(bufs[b].data(), n)) return 2;
        bufs[b].resize(n);
        p.buf[b] = n ? (u64)(uintptr_t)bufs[b].data() : 0;
    }
    if (!read_all(p.i, sizeof p.i) || !read_all(p.f, sizeof p.f)) return 2;
    if (k == emu_matmul) {
        // buf data, scales, x, y; i rows, cols, n, format code, p0, p1, scale dtype.
        const int rows = p.i[0], n = p.i[2];
        const unsigned gx = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, gy = (n + TILE - 1) / TILE;
        const MatmulKernel kernels[] = {deltafin_matmul_f32, deltafin_matmul_bf16, deltafin_matmul_fp8,
                                        deltafin_matmul_int4, deltafin_matmul_mxfp4};
        if (p.i[3] < 0 || p.i[3] > 4) return 4;
        const u8* scales = p.buf[1] ? (const u8*)p.buf[1] : (const u8*)p.buf[0];
        emu_launch(dim3{gx, gy, 1}, dim3{LANES, ROWS_PER_BLOCK, 1}, [&] {
            kernels[p.i[3]]((const u8*)p.buf[0], scales, (const float*)p.buf[2], (float*)p.buf[3], rows, p.i[1], n,
                            0, p.i[4], p.i[5], p.i[6]);
        });
    } else {
        emu_launch(dim3{dims[0], dims[1], dims[2]}, dim3{dims[3], dims[4], dims[5]}, [&] { k(p); });
    }
    for (auto& b : bufs)
        if (!write_all(b.data(), b.size())) return 3;
    return 0;
}

static int math() {
    uint32_t fn;
    uint64_t n;
    if (!read_all(&fn, 4) || !read_all(&n, 8)) return 2;
    std::vector<float> x(n);
    if (!read_all(x.data(), 4 * n)) return 2;
    for (auto& v : x) {
        switch (fn) {
            case 0: v = df_exp(v); break;
            case 1: v = df_exp_m1(v); break;
            case 2: v = df_tanh(v); break;
            case 3: v = df_ln(v); break;
            case 4: v = df_ln_1p(v); break;
            case 5: v = df_sigmoid(v); break;
            case 6: v = df_softplus(v); break;
            default: return 4;
        }
    }
    return write_all(x.data(), 4 * n) ? 0 : 3;
}

int main() {
    // Keep freed memory for the next request (no fresh, zero-filled pages per launch).
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    for (uint32_t op; read_all(&op, 4);) {
        const int rc = op == 0 ? launch() : op == 1 ? math() : 4;
        if (rc != 0) return rc;
        std::fflush(stdout);
    }
    return 0;
}
