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
    gemv_pair(blockIdx.x, w, wtype, xq, ids, y, top_k, n, k);
}
