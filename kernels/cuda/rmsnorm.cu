// RMS norm over rows of `width` floats: y = x * (1 / sqrt(mean(x^2) + eps)) * w, w of length width.
// Used for the hidden norm (rows = tokens, width = hidden) and for Qwen3's per-head Q/K norm
// (rows = tokens x heads, width = head_dim). y may alias x (the in-place Q/K norm): x and y are
// not __restrict__, every element is read and written by the same thread, and a row's writes
// come after its reduction, which follows every read of its sum of squares.
//
// Two geometries, both with rows on grid.x (they grow with tokens) and 256 threads:
// - rmsnorm_warp_rows (narrow rows): one warp per row, 8 rows per block. A warp past the last
//   row computes on row rows - 1 (valid address, finite values), takes part in its shuffles
//   like every other warp, and stores nothing. In place, it may read that row while its own
//   warp rewrites it: only its discarded sum sees the mix.
// - rmsnorm_block_rows (wide rows): one block per row; the 8 warp sums meet in shared memory.
//
// The arithmetic is spelled out with _rn intrinsics so the CPU twin can repeat it exactly:
// thread j accumulates x^2 over columns j, j + threads, ... with fused multiply-adds, the warp
// adds its 32 partials in the xor butterfly, the block adds its warps' sums in order; then
// scale = 1 / sqrt(ss / width + eps) with IEEE division and square root, y = (x * scale) * w.
// Row offsets row * width are 64-bit (tokens x 2048 passes 2^31 at 1,048,576 tokens).

#define RMS_THREADS 256
#define RMS_WARPS (RMS_THREADS / 32)

static __device__ __forceinline__ float rms_sum_squares(const float* x, int width, int first, int stride) {
    float acc = 0.0f;
    for (int c = first; c < width; c += stride) acc = __fmaf_rn(x[c], x[c], acc);
    return acc;
}

static __device__ __forceinline__ float rms_scale(float ss, int width, float eps) {
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)width), eps)));
}

static __device__ __forceinline__ void rms_store(const float* x, const float* __restrict__ w, float* y, int width, int first,
                                                 int stride, float scale) {
    for (int c = first; c < width; c += stride) y[c] = __fmul_rn(__fmul_rn(x[c], scale), w[c]);
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
rmsnorm_warp_rows(const float* x, float* y, const float* __restrict__ w, u64 rows, int width, float eps) {
    GRID_DEPENDENCY_WAIT();
    const u64 row = (u64)blockIdx.x * RMS_WARPS + threadIdx.x / 32;
    const bool real = row < rows;
    const u64 src = real ? row : rows - 1;
    const int lane = threadIdx.x & 31;
    const float* xr = x + src * (u64)width;
    const float ss = warp_sum(rms_sum_squares(xr, width, lane, 32));
    if (real) rms_store(xr, w, y + row * (u64)width, width, lane, 32, rms_scale(ss, width, eps));
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
rmsnorm_block_rows(const float* x, float* y, const float* __restrict__ w, int width, float eps) {
    GRID_DEPENDENCY_WAIT();
    __shared__ float warp_ss[RMS_WARPS];
    const u64 row = blockIdx.x;
    const float* xr = x + row * (u64)width;
    const float part = warp_sum(rms_sum_squares(xr, width, threadIdx.x, RMS_THREADS));
    if ((threadIdx.x & 31) == 0) warp_ss[threadIdx.x / 32] = part;
    __syncthreads();
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < RMS_WARPS; ++i) ss = __fadd_rn(ss, warp_ss[i]);
    rms_store(xr, w, y + row * (u64)width, width, threadIdx.x, RMS_THREADS, rms_scale(ss, width, eps));
}

// ---- RMS norm that also writes the row's q8_1 quantization ----
// For the hidden norms whose output feeds a quantized projection (attn_norm before q/k/v,
// ffn_norm before the router and the experts): y as rmsnorm_warp_rows / rmsnorm_block_rows
// write it (the same geometry, chosen by the plan from the width in the same way, and the same
// arithmetic), and yq = `quantize` (dense) of y. The width is a multiple of 32, so each pass of
// a warp's store loop (columns first, first + stride, ...: stride 32 or 256) covers the 32
// consecutive columns of one q8_1 block, lane j holding column j of it: the warp quantizes the
// values it has just stored with common.cuh's warp_quantize_q8_1, step for step what `quantize`
// does after reading y back, so yq is bit for bit its output. The loop's trip count is
// warp-uniform (c - lane is the same for every lane and the width a multiple of 32): every lane
// reaches both reductions of every block. A spare warp (warp kernel, past the last row) stores
// neither y nor yq and skips the loop as a whole warp. Row offsets are 64-bit, as above.
static __device__ __forceinline__ void rms_store_q8_1(const float* x, const float* __restrict__ w, float* y,
                                                      block_q8_1* __restrict__ yq, int width, int first, int stride, float scale) {
    for (int c = first; c < width; c += stride) {
        const float v = __fmul_rn(__fmul_rn(x[c], scale), w[c]);
        y[c] = v;
        warp_quantize_q8_1(v, true, yq + c / QK);
    }
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
rmsnorm_q8_1_warp_rows(const float* x, float* y, const float* __restrict__ w, block_q8_1* __restrict__ yq, u64 rows, int width,
                       float eps) {
    GRID_DEPENDENCY_WAIT();
    const u64 row = (u64)blockIdx.x * RMS_WARPS + threadIdx.x / 32;
    const bool real = row < rows;
    const u64 src = real ? row : rows - 1;
    const int lane = threadIdx.x & 31;
    const float* xr = x + src * (u64)width;
    const float ss = warp_sum(rms_sum_squares(xr, width, lane, 32));
    if (real) {
        rms_store_q8_1(xr, w, y + row * (u64)width, yq + row * (u64)(width / QK), width, lane, 32, rms_scale(ss, width, eps));
    }
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
rmsnorm_q8_1_block_rows(const float* x, float* y, const float* __restrict__ w, block_q8_1* __restrict__ yq, int width, float eps) {
    GRID_DEPENDENCY_WAIT();
    __shared__ float warp_ss[RMS_WARPS];
    const u64 row = blockIdx.x;
    const float* xr = x + row * (u64)width;
    const float part = warp_sum(rms_sum_squares(xr, width, threadIdx.x, RMS_THREADS));
    if ((threadIdx.x & 31) == 0) warp_ss[threadIdx.x / 32] = part;
    __syncthreads();
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < RMS_WARPS; ++i) ss = __fadd_rn(ss, warp_ss[i]);
    rms_store_q8_1(xr, w, y + row * (u64)width, yq + row * (u64)(width / QK), width, threadIdx.x, RMS_THREADS, rms_scale(ss, width, eps));
}

// ---- Per-head RMS norm fused with NEOX RoPE (Qwen3's Q/K norm, then the rotation) ----
// x is [tokens, heads, d] (Q or K), one row per (token, head), d = 2 * half <= 1024: the rows
// rmsnorm_warp_rows takes, in its geometry (a warp per row, 8 rows per block, rows on grid.x)
// and with its sum of squares and scale. Lane l then takes the pairs (i, i + half), i = l,
// l + 32, ...: it normalises both values as rms_store does (y = (x * scale) * w, kept in
// registers) and rotates them as rope_neox does (the same f32 angle pos[t] * freq[i], the same
// sincosf, the same _rn products), so y is bit for bit rmsnorm then rope. The loop holds no
// collective (a lane's trip count may differ when half is not a multiple of 32). y may alias x:
// each element is read and written by the same lane, after the warp's reduction, which follows
// every read of the sums of squares. A spare warp (past the last row) computes its reduction on
// row rows - 1 with all its lanes and stores nothing. Offsets row * d are 64-bit.
extern "C" __global__ void __launch_bounds__(RMS_THREADS)
rmsnorm_rope_neox(const float* x, float* y, const float* __restrict__ w, const int* __restrict__ pos, const float* __restrict__ freq,
                  u64 rows, int heads, int half, float eps) {
    GRID_DEPENDENCY_WAIT();
    const u64 row = (u64)blockIdx.x * RMS_WARPS + threadIdx.x / 32;
    const bool real = row < rows;
    const u64 src = real ? row : rows - 1;
    const int lane = threadIdx.x & 31;
    const int width = 2 * half;
    const float* xr = x + src * (u64)width;
    const float ss = warp_sum(rms_sum_squares(xr, width, lane, 32));
    if (!real) return;
    const float scale = rms_scale(ss, width, eps);
    const float p = (float)pos[row / (u64)heads];
    float* yr = y + row * (u64)width;
    for (int i = lane; i < half; i += 32) {
        const float x0 = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        const float x1 = __fmul_rn(__fmul_rn(xr[i + half], scale), w[i + half]);
        float s, c;
        sincosf(__fmul_rn(p, freq[i]), &s, &c);
        yr[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        yr[i + half] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
}
