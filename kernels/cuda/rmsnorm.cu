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
