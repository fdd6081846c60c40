// Runs the CUDA kernels of engine/src/backend/cuda/matmul.cu on the CPU, unchanged, through
// cuda_shim.h.
// Used by engine/tests/cuda_emulated.rs to check the kernel source against the scalar
// reference on machines without a GPU.
//
// Input (stdin, little-endian): 7 x i32 (format, rows, cols, n, p0, p1, scale dtype),
// 2 x u64 (data bytes, scale bytes), the data, the scales, n * cols f32.
// Output (stdout): n * rows f32.

#include <cstdio>

#include "cuda_shim.h"

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
    emu_launch(dim3{grid_x, grid_y, 1}, dim3{LANES, ROWS_PER_BLOCK, 1}, [&] {
        k(data.data(), scales.data(), x.data(), y.data(), rows, cols, n, 0, p0, p1, sdt);
    });
    return std::fwrite(y.data(), sizeof(float), y.size(), stdout) == y.size() ? 0 : 3;
}
