// Weighted combine of the top-k expert outputs:
//   out[t, n] = sum_j w[t * top_k + j] * y[(t * top_k + j) * N + n]
// One thread per output element in a grid-stride loop; every index is 64-bit (T * top_k * N
// passes 2^31 at 349,526 tokens for top_k 8, N 768). No collectives.

extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ w,
                                       float* __restrict__ out, u64 tokens, int top_k, int n) {
    GRID_DEPENDENCY_WAIT();
    const u64 items = tokens * (u64)n;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += stride) {
        const u64 t = i / (u64)n;
        const u64 col = i - t * (u64)n;
        float acc = 0.0f;
        for (int j = 0; j < top_k; ++j) {
            const u64 pair = t * (u64)top_k + (u64)j;
            acc += w[pair] * y[pair * (u64)n + col];
        }
        out[i] = acc;
    }
}
