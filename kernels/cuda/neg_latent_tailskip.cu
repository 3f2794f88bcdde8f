// NEGATIVE CONTROL ONLY: a deliberately broken twin of latent_proj.cu that the engine never
// launches. The self-test runs it (only when no replica is resident on the node) to prove that it
// can detect the third failure of the design: a warp deadlock on a partly filled row tile.
//
// Identical to latent_proj except one line: lanes whose row lies past the end (row >= T)
// `continue` to the next chunk before the quad's full-mask __shfl_xor_sync reduction, as the
// failing engine's epilogue did. That is undefined behaviour: the real lanes of a warp wait in
// the full-mask shuffle for lanes that never come, while those lanes wait at the block barrier
// after the loop for the real ones. The block deadlocks and the kernel never finishes (gpu.md
// records this shape hanging on the H200 at T = 1, 5, 63, 127). Without the barrier the H200
// let the real lanes through and computed correct rows (measured 2026-11-30): the hang needs
// the skipping lanes parked somewhere else, as in the failing engine's staged epilogue.
//
// It hangs exactly when some warp holds real and spare rows together: 8 rows per warp, so when
// T % 8 != 0. With T a multiple of 8 (a full 64-row tile in particular) whole warps are real or
// spare, the skip is warp-uniform, and the results equal latent_proj's.

// Compiled after latent_proj.cu (its twin): the tile constants and lane_dots are the twin's.

extern "C" __global__ void __launch_bounds__(LP_THREADS)
latent_proj_tailskip_broken(const unsigned char* __restrict__ w, int wtype, const block_q8_1* __restrict__ x, float* __restrict__ y,
            u64 tokens, int nb, int width, int gw) {
    GRID_DEPENDENCY_WAIT();
    const u64 row = (u64)blockIdx.x * LP_TILE_M + threadIdx.x / LP_LANES_PER_ROW;
    const bool real = row < tokens;
    const u64 src = real ? row : tokens - 1;
    const int q = threadIdx.x % LP_LANES_PER_ROW;
    const int first_col = blockIdx.y * gw;
    const u64 row_bytes = weight_row_bytes(wtype, nb * QK);
    const block_q8_1* xr = x + src * (u64)nb;
    float* yr = y + src * (u64)width + first_col;
    float ss = 0.0f;
    for (int c0 = 0; c0 < gw; c0 += LP_CHUNK) {
        float acc[LP_COLS];
        if (wtype == WTYPE_Q8_0) lane_dots<WTYPE_Q8_0>(w, row_bytes, first_col, c0 + q, gw, xr, nb, acc);
        else lane_dots<WTYPE_Q4_0>(w, row_bytes, first_col, c0 + q, gw, xr, nb, acc);
        if (!real) continue;  // THE BUG: these lanes never reach the shuffles below
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < LP_COLS; ++j)
            if (c0 + q + LP_LANES_PER_ROW * j < gw) part += acc[j] * acc[j];
        // Full mask, but the spare rows' lanes skipped it above.
        part += __shfl_xor_sync(FULL_MASK, part, 1);
        part += __shfl_xor_sync(FULL_MASK, part, 2);
        ss += part;
        if (real) {
#pragma unroll
            for (int j = 0; j < LP_COLS; ++j) {
                const int c = c0 + q + LP_LANES_PER_ROW * j;
                if (c < gw) yr[c] = acc[j];
            }
        }
    }
    // The tile's row norms go through shared memory, block-wide, before the stores are scaled
    // (the staged epilogue of the failing engine; also where its skipping lanes parked).
    __shared__ float row_ss[LP_TILE_M];
    if (q == 0) row_ss[threadIdx.x / LP_LANES_PER_ROW] = ss;
    __syncthreads();
    // __fdividef: an IEEE division's slow path is a call, whose saved registers spill.
    const float scale = rsqrtf(__fdividef(row_ss[threadIdx.x / LP_LANES_PER_ROW], (float)gw) + LP_EPS);
    if (real)
        for (int c = q; c < gw; c += LP_LANES_PER_ROW) yr[c] *= scale;
}
