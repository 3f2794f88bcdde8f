// Routed-expert GEMV for small token counts (decode):
//   y[pair, n] = dot(W[ids[pair]][n, :], xq[pair / top_k, :]),  pair = token * top_k + slot.
// W is [experts, N, K] in any weight format (rows e * N + n; common.cuh), xq is dense q8_1
// [tokens, K / 32], y is f32 [tokens * top_k, N]. With top_k = 1 and "tokens" = pairs it takes
// one input row per pair (the down projection in decode).
//
// Geometry: the (token, slot) pair, which grows with tokens, is blockIdx.x (limit 2^31 - 1);
// grid.y carries only the column tiles of N (bounded by the weight shape). Each warp owns one
// output row n; its lanes split the K / 32 blocks and meet in warp_sum. Warps past N (the last
// tile of an N that is not a multiple of the warps per block) read row N - 1 so that every
// lane reaches the shuffles with finite values, and are masked at the store.
// pair * N and (e * N + n) * row bytes pass 2^31 at large counts: 64-bit.

// One output row of one pair; the caller says which grid axis carries the pair.
static __device__ __forceinline__ void gemv_pair(u64 pair, const unsigned char* __restrict__ w, int wtype,
                                                 const block_q8_1* __restrict__ xq, const int* __restrict__ ids,
                                                 float* __restrict__ y, int top_k, int n, int k) {
    const int lane = threadIdx.x & 31;
    const int row = (int)(blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5));
    const int row_read = row < n ? row : n - 1;
    const int nb = k / QK;
    const u64 token = pair / (u64)top_k;
    const u64 e = (u64)ids[pair];
    const unsigned char* w_row = w + (e * (u64)n + (u64)row_read) * weight_row_bytes(wtype, k);
    const float acc = warp_sum(dot_row_partial(w_row, wtype, xq + token * (u64)nb, nb, lane, 32));
    if (lane == 0 && row < n) y[pair * (u64)n + (u64)row] = acc;
}

extern "C" __global__ void moe_gemv(const unsigned char* __restrict__ w, int wtype,
                                    const block_q8_1* __restrict__ xq, const int* __restrict__ ids,
                                    float* __restrict__ y, int top_k, int n, int k) {
    GRID_DEPENDENCY_WAIT();
    gemv_pair(blockIdx.x, w, wtype, xq, ids, y, top_k, n, k);
}

// ---------------------------------------------------------------------------------------------
// Fused decode kernels (ops/moe_gemv_fused.rs). Both use the arithmetic of gemv_pair above per
// output row (lanes split the K / 32 blocks, then warp_sum), so their outputs equal the chains
// they replace bit for bit.
//
// GEMV_FUSED_MAX_WARPS bounds the block (the plan picks the warps from the device's limits).
#define GEMV_FUSED_MAX_WARPS 16

// The gate and up partials of one lane over blocks first, first + stride, ...: the loop of
// dot_row_partial_t with the two rows interleaved (twice the loads in flight); each sum takes
// its blocks in the same order as dot_row_partial.
template <int WT>
static __device__ __forceinline__ void dot_rows2_partial_t(const unsigned char* g_row, const unsigned char* u_row,
                                                           const block_q8_1* x, int nb, int first, int stride,
                                                           float* g, float* u) {
    float ag = 0.0f, au = 0.0f;
    for (int b = first; b < nb; b += stride) {
        ag += dot_block<WT>(g_row, b, x + b);
        au += dot_block<WT>(u_row, b, x + b);
    }
    *g = ag;
    *u = au;
}

// Gate and up GEMVs with the activation and the q8_1 quantization in the epilogue:
//   out[pair, c / 32] = q8_1 of act(gate[pair, c], up[pair, c]) over a tile of 32 columns c,
//   gate[pair, c] = dot(Wg[ids[pair]][c, :], xq[pair / top_k, :]) (+ b_gate[ids[pair], c]), up
//   likewise with Wu and b_up; act plain SwiGLU or gpt-oss's clamped one (glue_act);
// = moe_gemv(gate), moe_gemv(up), add_pick_bias_f32 on both when biased, swiglu_q8_1 (pair
// order), bit for bit. The biases are null or both present. N (the FFN width) is a multiple of
// 32 (the plan refuses others), so every column of a tile exists.
// Geometry: the pair (grows with tokens) on grid.x, the N / 32 column tiles on grid.y. Warp w
// takes columns w, w + warps, ... of the tile (a warp-uniform loop: every lane reaches both
// warp_sums), lane 0 leaves the two sums in shared memory; after the barrier warp 0 holds
// column `lane`'s values and quantizes them (every lane of it reaches warp_quantize_q8_1's
// reductions). pair * N and (e * N + c) * row bytes pass 2^31: 64-bit.
extern "C" __global__ void __launch_bounds__(GEMV_FUSED_MAX_WARPS * 32)
moe_gemv_swiglu_q8_1(const unsigned char* __restrict__ w_gate, const unsigned char* __restrict__ w_up, int wtype,
                     const block_q8_1* __restrict__ xq, const int* __restrict__ ids, block_q8_1* __restrict__ out,
                     int top_k, int n, int k, const float* __restrict__ b_gate, const float* __restrict__ b_up,
                     int clamped, float alpha, float limit) {
    GRID_DEPENDENCY_WAIT();
    __shared__ float gs[QK];
    __shared__ float us[QK];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const u64 pair = blockIdx.x;
    const int nb = k / QK;
    const u64 token = pair / (u64)top_k;
    const u64 e = (u64)ids[pair];
    const u64 rb = weight_row_bytes(wtype, k);
    const block_q8_1* x = xq + token * (u64)nb;
    for (int c = warp; c < QK; c += warps) {
        const u64 row = e * (u64)n + (u64)blockIdx.y * QK + (u64)c;
        float g = 0.0f, u = 0.0f;
        DISPATCH_WTYPE(wtype, dot_rows2_partial_t<WT>(w_gate + row * rb, w_up + row * rb, x, nb, lane, 32, &g, &u));
        g = warp_sum(g);
        u = warp_sum(u);
        if (lane == 0) {
            gs[c] = b_gate != nullptr ? __fadd_rn(g, b_gate[row]) : g;
            us[c] = b_up != nullptr ? __fadd_rn(u, b_up[row]) : u;
        }
    }
    __syncthreads();
    if (warp == 0) warp_quantize_q8_1(glue_act(gs[lane], us[lane], clamped, alpha, limit), true, out + pair * (u64)(n / QK) + blockIdx.y);
}

// Down GEMV with the weighted sum over the top_k slots in the epilogue:
//   out[t, n] = sum_j weights[t * top_k + j] * y_j,
//   y_j = dot(Wd[ids[t * top_k + j]][n, :], act[t * top_k + j, :]) (+ b_down[ids[t * top_k + j], n])
// = moe_gemv(down, one pair per "token"), add_pick_bias_f32 when b_down is not null, then
// moe_combine, bit for bit: each dot as gemv_pair, the sum as moe_combine's (acc = 0, then
// acc += w * y in slot order).
// Geometry: the token (grows) on grid.x, tiles of `rows` output rows on grid.y (bounded by N).
// The block's rows x top_k (row, slot) dots go to its warps in a warp-uniform loop (item
// i = r * top_k + j); lane 0 leaves each in dynamic shared memory ys[i]; after the barrier,
// thread r sums row r's slots in order. Rows past N (the last tile) read row N - 1 and are
// masked at the store. t * top_k * N and the row offsets pass 2^31: 64-bit.
extern "C" __global__ void __launch_bounds__(GEMV_FUSED_MAX_WARPS * 32)
moe_gemv_combine(const unsigned char* __restrict__ w, int wtype, const block_q8_1* __restrict__ act,
                 const int* __restrict__ ids, const float* __restrict__ weights, float* __restrict__ out,
                 int top_k, int n, int k, int rows, const float* __restrict__ b_down) {
    GRID_DEPENDENCY_WAIT();
    extern __shared__ float ys[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const u64 t = blockIdx.x;
    const int nb = k / QK;
    const u64 rb = weight_row_bytes(wtype, k);
    const int items = rows * top_k;
    for (int i = warp; i < items; i += warps) {
        const int r = i / top_k;
        const int j = i - r * top_k;
        const int row = (int)(blockIdx.y * rows + r);
        const int row_read = row < n ? row : n - 1;
        const u64 pair = t * (u64)top_k + (u64)j;
        const u64 e = (u64)ids[pair];
        const unsigned char* w_row = w + (e * (u64)n + (u64)row_read) * rb;
        const float y = warp_sum(dot_row_partial(w_row, wtype, act + pair * (u64)nb, nb, lane, 32));
        if (lane == 0) ys[i] = b_down != nullptr ? __fadd_rn(y, b_down[e * (u64)n + (u64)row_read]) : y;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const int row = (int)(blockIdx.y * rows + r);
        if (row < n) {
            float acc = 0.0f;
            for (int j = 0; j < top_k; ++j) {
                const u64 pair = t * (u64)top_k + (u64)j;
                acc += weights[pair] * ys[r * top_k + j];
            }
            out[t * (u64)n + (u64)row] = acc;
        }
    }
}
