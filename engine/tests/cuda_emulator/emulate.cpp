// Runs the CUDA kernels of engine/src/backend/cuda/matmul.cu on the CPU, unchanged: one
// std::thread per CUDA thread of a block, warp shuffles through a shared array between two
// barriers, IEEE single precision without contraction (-ffp-contract=off) or flush-to-zero.
// Used by engine/tests/cuda_emulated.rs to check the kernel source against the scalar
// reference on machines without a GPU.
//
// Input (stdin, little-endian): 7 x i32 (format, rows, cols, n, p0, p1, scale dtype),
// 2 x u64 (data bytes, scale bytes), the data, the scales, n * cols f32.
// Output (stdout): n * rows f32.

#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 0, y = 0, z = 0;
};
static thread_local dim3 emu_thread, emu_block;
#define threadIdx emu_thread
#define blockIdx emu_block
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(n)
#define __restrict__

static inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
template <class T>
static inline T __ldg(const T* p) { return *p; }

static const int BLOCK_X = 16, BLOCK_Y = 16, THREADS = BLOCK_X * BLOCK_Y;
static std::barrier<>* emu_barrier;
static float emu_slots[THREADS];

static inline float __shfl_down_sync(unsigned, float v, int delta, int width) {
    const int tid = (int)(threadIdx.x + threadIdx.y * BLOCK_X);
    emu_slots[tid] = v;
    emu_barrier->arrive_and_wait();
    const float r = (tid % width) + delta < width ? emu_slots[tid + delta] : v;
    emu_barrier->arrive_and_wait();
    return r;
}

#include "../../src/backend/cuda/matmul.cu"

typedef void (*Kernel)(const u8*, const u8*, const float*, float*, int, int, int, int, int, int, int);

static bool read_all(void* dst, size_t len) { return std::fread(dst, 1, len, stdin) == len; }

int main() {
    int32_t h[7];
    uint64_t lens[2];
    if (!read_all(h, sizeof h) || !read_all(lens, sizeof lens)) return 2;
    const int fmt = h[0], rows = h[1], cols = h[2], n = h[3], p0 = h[4], p1 = h[5], sdt = h[6];
    std::vector<u8> data(lens[0] + 16), scales(lens[1] + 16);
    std::vector<float> x((size_t)n * cols + 1), y((size_t)n * rows, -12345.0f);
    if (!read_all(data.data(), lens[0]) || !read_all(scales.data(), lens[1]) ||
        !read_all(x.data(), sizeof(float) * (size_t)n * cols))
        return 2;
    const Kernel kernels[] = {deltafin_matmul_f32, deltafin_matmul_bf16, deltafin_matmul_fp8,
                              deltafin_matmul_int4, deltafin_matmul_mxfp4};
    if (fmt < 0 || fmt > 4) return 2;
    const Kernel k = kernels[fmt];
    const unsigned grid_x = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, grid_y = (n + TILE - 1) / TILE;
    for (unsigned bx = 0; bx < grid_x; ++bx) {
        for (unsigned by = 0; by < grid_y; ++by) {
            std::barrier<> bar(THREADS);
            emu_barrier = &bar;
            std::vector<std::thread> threads;
            for (int t = 0; t < THREADS; ++t) {
                threads.emplace_back([&, t] {
                    emu_thread = dim3{(unsigned)(t % BLOCK_X), (unsigned)(t / BLOCK_X), 0};
                    emu_block = dim3{bx, by, 0};
                    k(data.data(), scales.data(), x.data(), y.data(), rows, cols, n, 0, p0, p1, sdt);
                });
            }
            for (auto& th : threads) th.join();
        }
    }
    return std::fwrite(y.data(), sizeof(float), y.size(), stdout) == y.size() ? 0 : 3;
}
