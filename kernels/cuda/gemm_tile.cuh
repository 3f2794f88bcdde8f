// The dp4a GEMM tile shared by the routed GEMM (moe_gemm.cu) and the dense GEMM
// (output_head.cu): compiled in front of both, after common.cuh (`sources.rs`).
//
// A block computes a BM x BN tile of  acc[r, c] = dot(W[col0 + c, :], A[a_rows[r], :])  with
// THREADS = (BM / TM) * (BN / TN) threads, each TM x TN outputs: rows ty + i * ROWS_T, columns
// tx + j * COLS_T. A holds q8_1 rows of K / 32 blocks (9 words each: d | s << 16, 8 quant
// words); W holds rows of any weight format (common.cuh), `w_row_bytes` apart.
//
// Per K step of KB 32-wide blocks the block stages in shared memory, as ints:
//   a_q [KB][BM][QS]  activation quants;      w_q [KB][BN][QS]  weight quants unpacked to one
//   a_d [KB][BM]      activation d;                            signed byte per weight (wq_int)
//   a_x [KB][BM]      q4_0: s (float bits); q4_K, q5_K: Σ quants (int); others unused
//   w_d, w_m [KB][BN] the block's d and dmin; w_sc [KB][BN] its two small scales, 16 bits each
// (QS = 9: 8 quant ints + 1 pad, so a warp's column reads hit distinct banks). Every format
// then runs the same dp4a inner loop; only block_partial differs.
//
// Contract with the caller:
// - a_rows (BM entries, shared memory) holds a valid A row for every tile row, spare rows
//   included; it is written before the call (the loop's first barrier publishes it);
// - columns past n_cols read column n_cols - 1 (valid addresses, finite sums): the caller masks
//   them, and spare rows, at its store;
// - no barrier follows the loop, so the caller's store may skip per thread.
// K blocks past nb are staged as zeros and skipped by a block-uniform bound. Row and column
// offsets are 64-bit (A rows grow with tokens; W reaches gigabytes).

// Dynamic shared memory: KB * ((BM + BN) * GEMM_QS + 2 * BM + 3 * BN) ints
// (`moe_gemm::tile_shared_bytes` in Rust).
#define GEMM_QS 9

template <int BM, int BN, int KB, int TM, int TN, int WT>
static __device__ __forceinline__ void gemm_tile_loop(const u32* __restrict__ a, const u64* a_rows, const unsigned char* __restrict__ w,
                                                      u64 w_row_bytes, u64 n_cols, u64 col0, int nb, int* smem, float (&acc)[TM][TN]) {
    constexpr int COLS_T = BN / TN;  // threads along a tile's columns
    constexpr int ROWS_T = BM / TM;
    constexpr int THREADS = COLS_T * ROWS_T;
    constexpr bool ROW_SUM = WT == WTYPE_Q4_K || WT == WTYPE_Q5_K;  // the min term needs Σ quants
    static_assert(BM % TM == 0 && BN % TN == 0, "tile not divisible by the thread sub-tile");

    int* a_q = smem;
    int* w_q = a_q + KB * BM * GEMM_QS;
    float* a_d = (float*)(w_q + KB * BN * GEMM_QS);
    int* a_x = (int*)(a_d + KB * BM);
    float* w_d = (float*)(a_x + KB * BM);
    float* w_m = w_d + KB * BN;
    int* w_sc = (int*)(w_m + KB * BN);

    const int tid = threadIdx.x;
    const int tx = tid % COLS_T;
    const int ty = tid / COLS_T;

#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) acc[r][c] = 0.0f;

    for (int kb0 = 0; kb0 < nb; kb0 += KB) {
        __syncthreads();  // a_rows is written / the previous step's reads are done

        // A: one thread per word of each staged q8_1 block.
        for (int i = tid; i < BM * KB * 9; i += THREADS) {
            const int blk = i / 9, word = i - blk * 9;
            const int row = blk / KB, kb = blk - row * KB;
            const bool in = kb0 + kb < nb;
            const u32* src = a + (a_rows[row] * (u64)nb + (u64)(kb0 + kb)) * 9;
            const u32 v = in ? src[word] : 0u;
            if (word == 0) {
                a_d[kb * BM + row] = f16_to_f32((u16)(v & 0xffff));
                int x = __float_as_int(f16_to_f32((u16)(v >> 16)));
                if constexpr (ROW_SUM) {
                    // The quant words are this block's own (the word threads load them too).
                    x = 0;
                    if (in)
                        for (int q = 1; q <= 8; ++q) x = dp4a((int)src[q], 0x01010101, x);
                }
                a_x[kb * BM + row] = x;
            } else {
                a_q[(kb * BM + row) * GEMM_QS + word - 1] = (int)v;
            }
        }
        // W: per (column, block) 8 items for the unpacked quant ints and one for the scales.
        for (int i = tid; i < BN * KB * 9; i += THREADS) {
            const int blk = i / 9, u = i - blk * 9;
            const int c = blk / KB, kb = blk - c * KB;
            const int b = kb0 + kb;
            const u64 col = col0 + c < n_cols ? col0 + c : n_cols - 1;
            const unsigned char* row = w + col * w_row_bytes;
            if (u < 8) {
                w_q[(kb * BN + c) * GEMM_QS + u] = b < nb ? wq_int<WT>(row, b, u) : 0;
            } else {
                wscale s = {0.0f, 0.0f, 0, 0};
                if (b < nb) s = wq_scale<WT>(row, b);
                w_d[kb * BN + c] = s.d;
                w_m[kb * BN + c] = s.dmin;
                w_sc[kb * BN + c] = (int)(((u32)s.sc & 0xffffu) | ((u32)s.m << 16));
            }
        }
        __syncthreads();

        const int kb_n = min(KB, nb - kb0);  // block-uniform
        for (int kb = 0; kb < kb_n; ++kb) {
            int lo[TM][TN], hi[TM][TN];
#pragma unroll
            for (int r = 0; r < TM; ++r)
#pragma unroll
                for (int c = 0; c < TN; ++c) lo[r][c] = hi[r][c] = 0;
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
                    for (int c = 0; c < TN; ++c) {
                        // q6_K scales weights 16..31 apart; the other formats sum the block whole.
                        if (WT == WTYPE_Q6_K && j >= 4) hi[r][c] = dp4a(wv[c], av[r], hi[r][c]);
                        else lo[r][c] = dp4a(wv[c], av[r], lo[r][c]);
                    }
            }
            wscale ws[TN];
#pragma unroll
            for (int c = 0; c < TN; ++c) {
                const int at = kb * BN + tx + c * COLS_T;
                const int sc = w_sc[at];
                ws[c] = wscale{w_d[at], w_m[at], (int)(short)(sc & 0xffff), sc >> 16};  // both halves signed
            }
#pragma unroll
            for (int r = 0; r < TM; ++r) {
                const int at = kb * BM + ty + r * ROWS_T;
                const float ad = a_d[at];
                const int ax = a_x[at];
#pragma unroll
                for (int c = 0; c < TN; ++c) acc[r][c] += block_partial<WT>(ws[c], lo[r][c], hi[r][c], ax, ad, __int_as_float(ax));
            }
        }
    }
}
