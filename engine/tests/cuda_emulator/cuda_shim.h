// The CUDA built-ins the kernel sources use, for running them unchanged on the CPU: the threads
// of a block are fibers (ucontext) on one OS thread, run in turn up to their next barrier, in
// ascending order in even phases and descending order in odd ones (so a missing __syncthreads()
// changes the result instead of passing by luck); blocks one after another; warp shuffles
// through a per-thread slot array between two barriers; __shared__ arrays are statics (one
// block runs at a time); IEEE single precision without contraction (-ffp-contract=off) or
// flush-to-zero. Included by emulate.cpp (matrix kernels) and emulate_layers.cpp (layer
// kernels).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ucontext.h>
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

static std::vector<float> emu_slots;

// One block thread: its context, its stack, whether its kernel has returned.
struct EmuFiber {
    ucontext_t ctx;
    std::vector<char> stack;
    dim3 thread;
    bool done;
};
static ucontext_t emu_scheduler;
static std::vector<EmuFiber> emu_fibers;
static unsigned emu_current;
static const std::function<void()>* emu_kernel;

// A barrier: back to the scheduler, which resumes this fiber once every live fiber arrived.
static inline void emu_barrier() { swapcontext(&emu_fibers[emu_current].ctx, &emu_scheduler); }

static inline int emu_tid() {
    return (int)(threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y);
}

static inline void __syncthreads() { emu_barrier(); }

// Fibers switch only at barriers, so a plain read-modify-write is atomic here.
static inline int atomicAdd(int* a, int v) {
    const int old = *a;
    *a = old + v;
    return old;
}

static inline float __shfl_down_sync(unsigned, float v, int delta, int width) {
    const int tid = emu_tid();
    emu_slots[tid] = v;
    emu_barrier();
    const float r = (tid % width) + delta < width ? emu_slots[tid + delta] : v;
    emu_barrier();
    return r;
}

static inline float __shfl_sync(unsigned, float v, int src, int width) {
    const int tid = emu_tid();
    emu_slots[tid] = v;
    emu_barrier();
    const float r = emu_slots[tid - tid % width + src];
    emu_barrier();
    return r;
}

static void emu_fiber_entry() {
    (*emu_kernel)();
    emu_fibers[emu_current].done = true;
}  // returns to emu_scheduler (uc_link)

// Run `kernel()` as a grid of blocks, one block after another; each block's threads as fibers
// advanced phase by phase (barrier to barrier) until all have returned.
template <class F>
static void emu_launch(dim3 grid, dim3 block, F kernel) {
    static constexpr size_t STACK = 256 << 10;
    emu_grid_dim = grid;
    emu_block_dim = block;
    const unsigned threads = block.x * block.y * block.z;
    emu_slots.assign(threads, 0.0f);
    const std::function<void()> body = kernel;
    emu_kernel = &body;
    emu_fibers.resize(threads);
    for (unsigned t = 0; t < threads; ++t) {
        emu_fibers[t].stack.resize(STACK);
        emu_fibers[t].thread = dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
    }
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                emu_block = dim3{bx, by, bz};
                for (auto& f : emu_fibers) {
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = f.stack.data();
                    f.ctx.uc_stack.ss_size = f.stack.size();
                    f.ctx.uc_link = &emu_scheduler;
                    f.done = false;
                    makecontext(&f.ctx, emu_fiber_entry, 0);
                }
                for (unsigned phase = 0, live = threads; live > 0; ++phase) {
                    live = 0;
                    for (unsigned i = 0; i < threads; ++i) {
                        const unsigned t = phase % 2 == 0 ? i : threads - 1 - i;
                        if (emu_fibers[t].done) continue;
                        emu_current = t;
                        emu_thread = emu_fibers[t].thread;
                        swapcontext(&emu_scheduler, &emu_fibers[t].ctx);
                        live += !emu_fibers[t].done;
                    }
                }
            }
}
