// The CUDA built-ins the kernel sources use, for running them unchanged on the CPU: one
// std::thread per CUDA thread of a block, blocks one after another; warp shuffles through a
// per-thread slot array between two barriers; __shared__ arrays are statics (one block runs at
// a time); IEEE single precision without contraction (-ffp-contract=off) or flush-to-zero.
// Included by emulate.cpp (matrix kernels) and emulate_layers.cpp (layer kernels).

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
static thread_local dim3 emu_thread, emu_block;
static dim3 emu_block_dim, emu_grid_dim;
#define threadIdx emu_thread
#define blockIdx emu_block
#define blockDim emu_block_dim
#define gridDim emu_grid_dim
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(n)
#define __restrict__
#define __shared__ static

static inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
template <class T>
static inline T __ldg(const T* p) { return *p; }

static std::barrier<>* emu_barrier;
static std::vector<float> emu_slots;

static inline int emu_tid() {
    return (int)(threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y);
}

static inline void __syncthreads() { emu_barrier->arrive_and_wait(); }

static inline float __shfl_down_sync(unsigned, float v, int delta, int width) {
    const int tid = emu_tid();
    emu_slots[tid] = v;
    emu_barrier->arrive_and_wait();
    const float r = (tid % width) + delta < width ? emu_slots[tid + delta] : v;
    emu_barrier->arrive_and_wait();
    return r;
}

static inline float __shfl_sync(unsigned, float v, int src, int width) {
    const int tid = emu_tid();
    emu_slots[tid] = v;
    emu_barrier->arrive_and_wait();
    const float r = emu_slots[tid - tid % width + src];
    emu_barrier->arrive_and_wait();
    return r;
}

// Run `kernel()` as a grid of blocks, each block's threads concurrently.
template <class F>
static void emu_launch(dim3 grid, dim3 block, F kernel) {
    emu_grid_dim = grid;
    emu_block_dim = block;
    const unsigned threads = block.x * block.y * block.z;
    emu_slots.assign(threads, 0.0f);
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> bar((std::ptrdiff_t)threads);
                emu_barrier = &bar;
                std::vector<std::thread> pool;
                for (unsigned t = 0; t < threads; ++t) {
                    pool.emplace_back([&, t] {
                        emu_thread = dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        emu_block = dim3{bx, by, bz};
                        kernel();
                    });
                }
                for (auto& th : pool) th.join();
            }
}
