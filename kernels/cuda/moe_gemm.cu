// Routed-expert GEMM for prefill, on int8 dp4a:
//   y[sorted_ids[r], n] = dot(W[tile_expert[r / BM]][n, :], A[r, :])
// A [max_padded_rows, K/32] q8_1 holds the activations gathered in sorted row order (padding
// rows are zeros); W [E, N, K] is q8_0 or q4_0; y [pairs, N] f32 is indexed by (token, slot) pair.
//
// Geometry: grid.x = row tiles of BM = 64 rows (they grow with tokens: the launch covers
// max_padded_rows / 64, the real count is on the device), grid.y = column tiles of BN (bounded),
// block = THREADS threads, each computing TM x TN outputs. A block whose tile_expert is -1 (past
// the real padded rows) returns before any __syncthreads: the test is block-uniform.
//
// Per K step a block stages KB blocks of its 64 A rows and BN W columns in shared memory: the
// 8 quant ints of each block (row stride QS = 9 ints so the column reads of a warp hit distinct
// banks) and the f16 scales as floats. q4_0 weights are unpacked to one int8 per weight while
// staged, so the inner loop is the same dp4a for both types and only the block scale differs:
// q8_0: d_w * d_a * sum, q4_0: d_w * (d_a * sum - 8 * s_a) (the twins in quant.rs).
// Columns past N read column N - 1 and are masked at the store; K blocks past K/32 are staged as
// zeros and skipped by a block-uniform bound. Every index that grows with tokens is 64-bit.

#define GEMM_QS 9  // ints per staged block: 8 quant ints + 1 pad

template <int BM, int BN, int KB, int TM, int TN, int WTYPE>
static __device__ __forceinline__ void moe_gemm_tile(const int* __restrict__ sorted_ids, const int* __restrict__ tile_expert,
                                                     const u32* __restrict__ a, const u16* __restrict__ w, float* __restrict__ y,
                                                     u64 pairs, int n, int nb, int experts) {
    constexpr int COLS_T = BN / TN;  // threads along a tile's columns
    constexpr int ROWS_T = BM / TM;
    constexpr int THREADS = COLS_T * ROWS_T;
    static_assert(BM % TM == 0 && BN % TN == 0, "tile not divisible by the thread sub-tile");

    const int e = tile_expert[blockIdx.x];
    if (e < 0 || e >= experts) return;  // block-uniform, before any barrier

    extern __shared__ __align__(16) int smem[];
    int* a_q = smem;                                     // [KB][BM][QS]
    int* w_q = a_q + KB * BM * GEMM_QS;                  // [KB][BN][QS]
    float* a_d = (float*)(w_q + KB * BN * GEMM_QS);      // [KB][BM]
    float* a_s = a_d + KB * BM;                          // [KB][BM]
    float* w_d = a_s + KB * BM;                          // [KB][BN]
    u16* w_q16 = (u16*)w_q;

    const int tid = threadIdx.x;
    const int tx = tid % COLS_T;
    const int ty = tid / COLS_T;
    const u64 row0 = (u64)blockIdx.x * BM;
    const int col0 = blockIdx.y * BN;
    // u16 units per weight block: d + 16 quant halves (q8_0) or d + 8 nibble halves (q4_0).
    constexpr int W_UNITS = WTYPE == WTYPE_Q8_0 ? 17 : 9;
    const u64 w_row_units = (u64)nb * W_UNITS;

    float acc[TM][TN];
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) acc[r][c] = 0.0f;

    for (int kb0 = 0; kb0 < nb; kb0 += KB) {
        __syncthreads();  // the previous step's reads are done before the stage is overwritten

        // A: 9 words per q8_1 block (word 0 = d | s << 16, words 1..8 = quants).
        for (int i = tid; i < BM * KB * 9; i += THREADS) {
            const int blk = i / 9, word = i - blk * 9;
            const int row = blk / KB, kb = blk - row * KB;
            u32 v = 0;
            if (kb0 + kb < nb) v = a[((row0 + row) * (u64)nb + (u64)(kb0 + kb)) * 9 + word];
            if (word == 0) {
                a_d[kb * BM + row] = f16_to_f32((u16)(v & 0xffff));
                a_s[kb * BM + row] = f16_to_f32((u16)(v >> 16));
            } else {
                a_q[(kb * BM + row) * GEMM_QS + word - 1] = (int)v;
            }
        }
        // W: one u16 unit per thread and step; q4_0 nibbles unpacked to int8 halves.
        for (int i = tid; i < BN * KB * W_UNITS; i += THREADS) {
            const int blk = i / W_UNITS, u = i - blk * W_UNITS;
            const int c = blk / KB, kb = blk - c * KB;
            const int col = min(col0 + c, n - 1);
            u16 v = 0;
            if (kb0 + kb < nb) v = w[((u64)e * (u64)n + (u64)col) * w_row_units + (u64)(kb0 + kb) * W_UNITS + u];
            u16* q = w_q16 + (kb * BN + c) * (2 * GEMM_QS);
            if (u == 0) {
                w_d[kb * BN + c] = f16_to_f32(v);
            } else if (WTYPE == WTYPE_Q8_0) {
                q[u - 1] = v;
            } else {
                // Half h of a q4_0 block holds bytes 2h, 2h + 1: low nibbles are weights 2h, 2h + 1,
                // high nibbles weights 16 + 2h, 17 + 2h.
                q[u - 1] = v & 0x0f0f;
                q[u - 1 + 8] = (v >> 4) & 0x0f0f;
            }
        }
        __syncthreads();

        const int kb_n = min(KB, nb - kb0);  // block-uniform
        for (int kb = 0; kb < kb_n; ++kb) {
            int isum[TM][TN];
#pragma unroll
            for (int r = 0; r < TM; ++r)
#pragma unroll
                for (int c = 0; c < TN; ++c) isum[r][c] = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                int av[TM], wv[TN];
#pragma unroll
                for (int r = 0; r < TM; ++r) av[r] = a_q[(kb * BM + ty + r * ROWS_T) * GEMM_QS + j];
#pragma unroll
                for (int c = 0; c < TN; ++c) wv[c] = w_q[(kb * BN + tx + c * COLS_T) * GEMM_QS + j];
#pragma unroll
                for (int r = 0; r < TM; ++r)
#pragma unroll
                    for (int c = 0; c < TN; ++c) isum[r][c] = dp4a(wv[c], av[r], isum[r][c]);
            }
            if (WTYPE == WTYPE_Q8_0) {
#pragma unroll
                for (int r = 0; r < TM; ++r)
#pragma unroll
                    for (int c = 0; c < TN; ++c)
                        acc[r][c] += w_d[kb * BN + tx + c * COLS_T] * a_d[kb * BM + ty + r * ROWS_T] * (float)isum[r][c];
            } else {
#pragma unroll
                for (int r = 0; r < TM; ++r) {
                    const float ad = a_d[kb * BM + ty + r * ROWS_T];
                    const float as8 = 8.0f * a_s[kb * BM + ty + r * ROWS_T];
#pragma unroll
                    for (int c = 0; c < TN; ++c) acc[r][c] += w_d[kb * BN + tx + c * COLS_T] * (ad * (float)isum[r][c] - as8);
                }
            }
        }
    }

    // No barrier below: padding rows and columns past N are masked here, at the store.
#pragma unroll
    for (int r = 0; r < TM; ++r) {
        const int pair = sorted_ids[row0 + ty + r * ROWS_T];
        if (pair < 0 || (u64)pair >= pairs) continue;
#pragma unroll
        for (int c = 0; c < TN; ++c) {
            const int col = col0 + tx + c * COLS_T;
            if (col < n) y[(u64)pair * (u64)n + (u64)col] = acc[r][c];
        }
    }
}

// One entry point per row of the Rust `TILES` table: BM x BN x KB, TM x TN per thread. The
// weight type is a template argument so staging divides by constants and has no type branch.
#define MOE_GEMM_KERNEL(NAME, BM, BN, KB, TM, TN)                                                                   \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN))                                             \
        NAME(const int* sorted_ids, const int* tile_expert, const u32* a, const u16* w, float* y, u64 pairs, int n,  \
             int nb, int experts, int wtype) {                                                                      \
        if (wtype == WTYPE_Q8_0)                                                                                    \
            moe_gemm_tile<BM, BN, KB, TM, TN, WTYPE_Q8_0>(sorted_ids, tile_expert, a, w, y, pairs, n, nb, experts); \
        else                                                                                                        \
            moe_gemm_tile<BM, BN, KB, TM, TN, WTYPE_Q4_0>(sorted_ids, tile_expert, a, w, y, pairs, n, nb, experts); \
    }

MOE_GEMM_KERNEL(moe_gemm_m64n64k4, 64, 64, 4, 4, 4)
MOE_GEMM_KERNEL(moe_gemm_m64n128k16, 64, 128, 16, 4, 4)
