// The int8 tensor-core GEMM tile shared by the routed GEMM (moe_gemm.cu) and the dense GEMM
// (output_head.cu): compiled in front of both, after common.cuh (`sources.rs`).
//
// A block computes a BM x BN tile of  acc[r, c] = dot(W[col0 + c, :], A[a_rows[r], :])  with
// THREADS = (BM / TM) * (BN / TN) threads, each TM x TN outputs. A holds q8_1 rows of K / 32
// blocks (9 words each: d | s << 16, 8 quant words); W holds rows of any weight format
// (common.cuh), `w_row_bytes` apart.
//
// Each 32-wide block's integer sums come from mma.sync m16n8k32 (s8 x s8 -> s32; q6_K: two
// m16n8k16 halves, as it scales weights 16..31 apart): exactly the sums dp4a gave, so with the
// same per-block float formula (block_partial) in the same block order the outputs are bit for
// bit those of the CPU twins' arithmetic. Warps tile the block as (BM / 8TM) x (BN / 4TN), each
// warp TM/2 x TN/2 sub-tiles of 16 x 8; thread outputs are rows gemm_tile_row(r) and columns
// gemm_tile_col(c), which the callers' stores use.
//
// Per K step of KB 32-wide blocks the block stages in shared memory, as ints:
//   a_q [KB][BM][QS]    activation quants;    w_q [KB][BN][QS]  weight quants unpacked to one
//   a_dx [KB][BM][2]    activation d, then                    signed byte per weight (wq_int)
//                       q4_0: s (float bits); q4_K, q5_K: Σ quants (int); others unused
//   w_d, w_m [KB][BN]   the block's d and dmin; w_sc [KB][BN] its two small scales, 16 bits each
// (mxfp4: the weight bytes are its code values -12..12, d is 2^(e - 128)).
// QS = 8 quant ints per block, word j (values 4j..4j+3) in slot gemm_slot(j) = 2 (j % 4) + j / 4:
// the two words an mma fragment takes from a row (j = tig and 4 + tig) are adjacent, one 8-byte
// load, and a half-warp's loads of rows g = 0..3 cover the 32 banks once. A row's d and x, and
// the d (dmin, scales) of two adjacent columns, are one 8-byte load each too. Every format then
// runs the same mma inner loop; only block_partial differs.
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
#define GEMM_QS 8

// The slot of quant word j (0..7) of a staged block (the header comment).
static __device__ __forceinline__ int gemm_slot(int j) { return 2 * (j & 3) + (j >> 2); }

// q8_0, q4_0 and mxfp4 blocks start their mma accumulators at the bits of 1.5 * 2^23 (as an int):
// an integer sum |Σ| < 2^22 then leaves the bits of the float 1.5 * 2^23 + Σ, exact, and
// subtracting 1.5 * 2^23 gives (float)Σ exactly without an I2F, which runs at a quarter of the
// FP32 rate on sm_90 and was the tile's busiest pipe (one per output per block). Their sums are
// at most 32 * 128 * 128 = 2^19 (mxfp4: 32 * 12 * 127). The K-quants multiply the sum by a sub-block scale as an
// integer first, so they keep I2F.
#define GEMM_I2F_BIAS 0x4B400000
#define GEMM_I2F_BIAS_F 12582912.0f

// D += A (16 x 32, row-major s8) . B (32 x 8, column-major s8). Lane (g = lane / 4, t = lane % 4)
// holds a = {A[g][4t..], A[g+8][4t..], A[g][16+4t..], A[g+8][16+4t..]}, b = {B[4t..][g],
// B[16+4t..][g]} and d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]} (PTX ISA fragments).
static __device__ __forceinline__ void mma_s8_k32(int (&d)[4], const int (&a)[4], const int (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The k = 16 shape: a = {A[g][4t..], A[g+8][4t..]}, b = B[4t..][g]; d as above.
static __device__ __forceinline__ void mma_s8_k16(int (&d)[4], int a0, int a1, int b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// The tile row of this thread's output row r (0 <= r < TM): its warp's rows, then the 16-row
// sub-tile r / 2, then g or g + 8.
template <int BM, int BN, int TM, int TN>
static __device__ __forceinline__ int gemm_tile_row(int r) {
    const int warp_m = (int)(threadIdx.x >> 5) / (BN / (4 * TN));
    return warp_m * 8 * TM + (r >> 1) * 16 + (r & 1) * 8 + (int)((threadIdx.x & 31) >> 2);
}

// The tile column of this thread's output column c (0 <= c < TN): its warp's columns, then the
// 8-column sub-tile c / 2, then 2t or 2t + 1.
template <int BM, int BN, int TM, int TN>
static __device__ __forceinline__ int gemm_tile_col(int c) {
    const int warp_n = (int)(threadIdx.x >> 5) % (BN / (4 * TN));
    return warp_n * 4 * TN + (c >> 1) * 8 + 2 * (int)(threadIdx.x & 3) + (c & 1);
}

// With PF, one K step's global reads, held in registers between `gemm_stage_load` and
// `gemm_stage_store`: each thread's items at fixed strides of THREADS, so every load of the
// step is issued before the first one is waited on, and while the step before it computes.
template <int BM, int BN, int KB, int THREADS>
struct gemm_stage {
    static constexpr int A_ITEMS = BM * KB * 9, A_PER = (A_ITEMS + THREADS - 1) / THREADS;  // q8_1 words
    static constexpr int Q_ITEMS = BN * KB * 8, Q_PER = (Q_ITEMS + THREADS - 1) / THREADS;  // weight quant ints
    static constexpr int S_ITEMS = BN * KB, S_PER = (S_ITEMS + THREADS - 1) / THREADS;      // weight scales
    u32 a[A_PER];
    int q[Q_PER];
    wscale sc[S_PER];
};

// Reads K step kb0 (blocks kb0 .. kb0 + KB - 1; those past nb as zeros). Item i of A is word
// i % 9 of the block (row i / 9 / KB, kb i / 9 % KB); of the quants, int i % 8 of (column
// i / 8 / KB, kb i / 8 % KB); of the scales, (column i / KB, kb i % KB): KB consecutive blocks
// of one row or column are contiguous in memory.
template <int BM, int BN, int KB, int THREADS, int WT>
static __device__ __forceinline__ void gemm_stage_load(gemm_stage<BM, BN, KB, THREADS>& st, const u32* __restrict__ a, const u64* a_rows,
                                                       const unsigned char* __restrict__ w, u64 w_row_bytes, u64 n_cols, u64 col0,
                                                       int nb, int kb0) {
    using S = gemm_stage<BM, BN, KB, THREADS>;
    const int tid = threadIdx.x;
#pragma unroll
    for (int j = 0; j < S::A_PER; ++j) {
        const int i = tid + j * THREADS;
        if (S::A_ITEMS % THREADS != 0 && i >= S::A_ITEMS) break;
        const int blk = i / 9, word = i - blk * 9;
        const int row = blk / KB, kb = blk - row * KB;
        st.a[j] = kb0 + kb < nb ? a[(a_rows[row] * (u64)nb + (u64)(kb0 + kb)) * 9 + word] : 0u;
    }
#pragma unroll
    for (int j = 0; j < S::Q_PER; ++j) {
        const int i = tid + j * THREADS;
        if (S::Q_ITEMS % THREADS != 0 && i >= S::Q_ITEMS) break;
        const int blk = i >> 3, u = i & 7;
        const int c = blk / KB, kb = blk - c * KB;
        const u64 col = col0 + c < n_cols ? col0 + c : n_cols - 1;
        st.q[j] = kb0 + kb < nb ? wq_int<WT>(w + col * w_row_bytes, kb0 + kb, u) : 0;
    }
#pragma unroll
    for (int j = 0; j < S::S_PER; ++j) {
        const int i = tid + j * THREADS;
        if (S::S_ITEMS % THREADS != 0 && i >= S::S_ITEMS) break;
        const int c = i / KB, kb = i - c * KB;
        const u64 col = col0 + c < n_cols ? col0 + c : n_cols - 1;
        wscale r = {0.0f, 0.0f, 0, 0};
        if (kb0 + kb < nb) r = wq_scale<WT>(w + col * w_row_bytes, kb0 + kb);
        st.sc[j] = r;
    }
}

// Writes a step read by gemm_stage_load into the shared-memory layout of the header comment.
template <int BM, int BN, int KB, int THREADS, int WT>
static __device__ __forceinline__ void gemm_stage_store(const gemm_stage<BM, BN, KB, THREADS>& st, const u32* __restrict__ a,
                                                        const u64* a_rows, int nb, int kb0, int* a_q, int* w_q, int* a_dx,
                                                        float* w_d, float* w_m, int* w_sc) {
    using S = gemm_stage<BM, BN, KB, THREADS>;
    constexpr bool ROW_SUM = WT == WTYPE_Q4_K || WT == WTYPE_Q5_K;  // the min term needs Σ quants
    const int tid = threadIdx.x;
#pragma unroll
    for (int j = 0; j < S::A_PER; ++j) {
        const int i = tid + j * THREADS;
        if (S::A_ITEMS % THREADS != 0 && i >= S::A_ITEMS) break;
        const int blk = i / 9, word = i - blk * 9;
        const int row = blk / KB, kb = blk - row * KB;
        const u32 v = st.a[j];
        if (word == 0) {
            a_dx[(kb * BM + row) * 2] = __float_as_int(f16_to_f32((u16)(v & 0xffff)));
            int x = __float_as_int(f16_to_f32((u16)(v >> 16)));
            if constexpr (ROW_SUM) {
                // The block's quant words, read again (other threads hold them): Σ quants.
                x = 0;
                if (kb0 + kb < nb) {
                    const u32* src = a + (a_rows[row] * (u64)nb + (u64)(kb0 + kb)) * 9;
                    for (int q = 1; q <= 8; ++q) x = dp4a((int)src[q], 0x01010101, x);
                }
            }
            a_dx[(kb * BM + row) * 2 + 1] = x;
        } else {
            a_q[(kb * BM + row) * GEMM_QS + gemm_slot(word - 1)] = (int)v;
        }
    }
#pragma unroll
    for (int j = 0; j < S::Q_PER; ++j) {
        const int i = tid + j * THREADS;
        if (S::Q_ITEMS % THREADS != 0 && i >= S::Q_ITEMS) break;
        const int blk = i >> 3, u = i & 7;
        const int c = blk / KB, kb = blk - c * KB;
        w_q[(kb * BN + c) * GEMM_QS + gemm_slot(u)] = st.q[j];
    }
#pragma unroll
    for (int j = 0; j < S::S_PER; ++j) {
        const int i = tid + j * THREADS;
        if (S::S_ITEMS % THREADS != 0 && i >= S::S_ITEMS) break;
        const int c = i / KB, kb = i - c * KB;
        const wscale r = st.sc[j];
        w_d[kb * BN + c] = r.d;
        w_m[kb * BN + c] = r.dmin;
        w_sc[kb * BN + c] = (int)(((u32)r.sc & 0xffffu) | ((u32)r.m << 16));
    }
}

// A step staged item by item, each stored as it arrives (no PF): a batch of a step's reads in
// registers spills at the 128 registers a thread that two 256-thread blocks per SM allow.
template <int BM, int KB, int THREADS, int WT>
static __device__ __forceinline__ void gemm_stage_a_direct(const u32* __restrict__ a, const u64* a_rows, int nb, int kb0, int* a_q,
                                                           int* a_dx) {
    constexpr bool ROW_SUM = WT == WTYPE_Q4_K || WT == WTYPE_Q5_K;  // the min term needs Σ quants
    for (int i = threadIdx.x; i < BM * KB * 9; i += THREADS) {
        const int blk = i / 9, word = i - blk * 9;
        const int row = blk / KB, kb = blk - row * KB;
        const bool in = kb0 + kb < nb;
        const u32* src = a + (a_rows[row] * (u64)nb + (u64)(kb0 + kb)) * 9;
        const u32 v = in ? src[word] : 0u;
        if (word == 0) {
            a_dx[(kb * BM + row) * 2] = __float_as_int(f16_to_f32((u16)(v & 0xffff)));
            int x = __float_as_int(f16_to_f32((u16)(v >> 16)));
            if constexpr (ROW_SUM) {
                // The quant words are this block's own (the word threads load them too).
                x = 0;
                if (in)
                    for (int q = 1; q <= 8; ++q) x = dp4a((int)src[q], 0x01010101, x);
            }
            a_dx[(kb * BM + row) * 2 + 1] = x;
        } else {
            a_q[(kb * BM + row) * GEMM_QS + gemm_slot(word - 1)] = (int)v;
        }
    }
}

template <int BN, int KB, int THREADS, int WT>
static __device__ __forceinline__ void gemm_stage_w_direct(const unsigned char* __restrict__ w, u64 w_row_bytes, u64 n_cols, u64 col0,
                                                           int nb, int kb0, int* w_q, float* w_d, float* w_m, int* w_sc) {
    for (int i = threadIdx.x; i < BN * KB * 9; i += THREADS) {
        const int blk = i / 9, u = i - blk * 9;
        const int c = blk / KB, kb = blk - c * KB;
        const int b = kb0 + kb;
        const u64 col = col0 + c < n_cols ? col0 + c : n_cols - 1;
        const unsigned char* row = w + col * w_row_bytes;
        if (u < 8) {
            w_q[(kb * BN + c) * GEMM_QS + gemm_slot(u)] = b < nb ? wq_int<WT>(row, b, u) : 0;
        } else {
            wscale s = {0.0f, 0.0f, 0, 0};
            if (b < nb) s = wq_scale<WT>(row, b);
            w_d[kb * BN + c] = s.d;
            w_m[kb * BN + c] = s.dmin;
            w_sc[kb * BN + c] = (int)(((u32)s.sc & 0xffffu) | ((u32)s.m << 16));
        }
    }
}

// Ints of one stage of the shared-memory layout (the header comment's arrays).
template <int BM, int BN, int KB>
static __device__ __forceinline__ constexpr int gemm_stage_ints() {
    return KB * ((BM + BN) * GEMM_QS + 2 * BM + 3 * BN);
}

// PF (prefetch): the next K step's global reads are issued before this step's mma loop, so
// their latency hides behind it (registers: one gemm_stage more per thread). STAGES = 2 (with
// PF) keeps two steps in shared memory: step k + 1 is stored into the other stage right after
// step k's mma loop, so one barrier a step instead of two. Either way the shared-memory
// contents each step reads and the arithmetic are the same, so the outputs are bit for bit
// equal.
template <int BM, int BN, int KB, int TM, int TN, int WT, bool PF = false, int STAGES = 1>
static __device__ __forceinline__ void gemm_tile_loop(const u32* __restrict__ a, const u64* a_rows, const unsigned char* __restrict__ w,
                                                      u64 w_row_bytes, u64 n_cols, u64 col0, int nb, int* smem, float (&acc)[TM][TN]) {
    constexpr int THREADS = (BM / TM) * (BN / TN);
    static_assert(BM % TM == 0 && BN % TN == 0, "tile not divisible by the thread sub-tile");
    static_assert(TM % 2 == 0 && TN % 2 == 0 && BM % (8 * TM) == 0 && BN % (4 * TN) == 0,
                  "the warps' 16 x 8 mma sub-tiles must cover the tile");
    static_assert(STAGES == 1 || (STAGES == 2 && PF), "two stages are filled from the prefetched registers");
    constexpr int STAGE_INTS = gemm_stage_ints<BM, BN, KB>();

    const int tid = threadIdx.x;
    constexpr int MI = TM / 2, NI = TN / 2;  // 16 x 8 mma sub-tiles per warp
    constexpr int WM = 8 * TM, WN = 4 * TN;  // a warp's rows and columns
    const int warp = tid >> 5, lane = tid & 31;
    const int warp_m = warp / (BN / WN), warp_n = warp % (BN / WN);
    const int g = lane >> 2, tig = lane & 3;

#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) acc[r][c] = 0.0f;

    // The layout's arrays in stage `base`.
    auto store = [&](const gemm_stage<BM, BN, KB, THREADS>& st, int* base, int kb0) {
        int* q = base;
        int* wq = q + KB * BM * GEMM_QS;
        int* adx = wq + KB * BN * GEMM_QS;
        float* wd = (float*)(adx + 2 * KB * BM);
        gemm_stage_store<BM, BN, KB, THREADS, WT>(st, a, a_rows, nb, kb0, q, wq, adx, wd, wd + KB * BN, (int*)(wd + 2 * KB * BN));
    };
    gemm_stage<BM, BN, KB, THREADS> st;
    if constexpr (PF) {
        __syncthreads();  // a_rows is written
        gemm_stage_load<BM, BN, KB, THREADS, WT>(st, a, a_rows, w, w_row_bytes, n_cols, col0, nb, 0);
        if constexpr (STAGES == 2) {
            store(st, smem, 0);
            __syncthreads();
        }
    }
    for (int kb0 = 0; kb0 < nb; kb0 += KB) {
        int* base = smem + (STAGES == 2 ? ((kb0 / KB) & 1) * STAGE_INTS : 0);
        int* a_q = base;
        int* w_q = a_q + KB * BM * GEMM_QS;
        int* a_dx = w_q + KB * BN * GEMM_QS;
        float* w_d = (float*)(a_dx + 2 * KB * BM);
        float* w_m = w_d + KB * BN;
        int* w_sc = (int*)(w_m + KB * BN);
        const bool next = kb0 + KB < nb;  // block-uniform: every thread loads the next step or none does
        if constexpr (STAGES == 1) {
            __syncthreads();  // a_rows is written / the previous step's reads are done
            if constexpr (PF) {
                store(st, base, kb0);
            } else {
                gemm_stage_a_direct<BM, KB, THREADS, WT>(a, a_rows, nb, kb0, a_q, a_dx);
                gemm_stage_w_direct<BN, KB, THREADS, WT>(w, w_row_bytes, n_cols, col0, nb, kb0, w_q, w_d, w_m, w_sc);
            }
            __syncthreads();
        }
        if constexpr (PF) {
            if (next) gemm_stage_load<BM, BN, KB, THREADS, WT>(st, a, a_rows, w, w_row_bytes, n_cols, col0, nb, kb0 + KB);
        }

        const int kb_n = min(KB, nb - kb0);  // block-uniform
        for (int kb = 0; kb < kb_n; ++kb) {
            // Fragments straight from the staged words (word j of a block holds values 4j..4j+3):
            // A rows g and g + 8 of each 16-row sub-tile take words tig and 4 + tig, W columns g
            // of each 8-column sub-tile the same words, adjacent in slots 2 tig, 2 tig + 1
            // (gemm_slot); no ldmatrix needed.
            int af[MI][4], bf[NI][2];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                const int* ar = a_q + (kb * BM + warp_m * WM + mi * 16 + g) * GEMM_QS + 2 * tig;
                const int2 r0 = *reinterpret_cast<const int2*>(ar);
                const int2 r8 = *reinterpret_cast<const int2*>(ar + 8 * GEMM_QS);
                af[mi][0] = r0.x;
                af[mi][1] = r8.x;
                af[mi][2] = r0.y;
                af[mi][3] = r8.y;
            }
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                const int2 c = *reinterpret_cast<const int2*>(w_q + (kb * BN + warp_n * WN + ni * 8 + g) * GEMM_QS + 2 * tig);
                bf[ni][0] = c.x;
                bf[ni][1] = c.y;
            }
            constexpr bool BIASED = WT == WTYPE_Q8_0 || WT == WTYPE_Q4_0 || WT == WTYPE_MXFP4;  // GEMM_I2F_BIAS
            constexpr int INIT = BIASED ? GEMM_I2F_BIAS : 0;
            int lo[TM][TN], hi[TM][TN];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) {
                    int d[4] = {INIT, INIT, INIT, INIT}, h[4] = {0, 0, 0, 0};
                    if constexpr (WT == WTYPE_Q6_K) {
                        // q6_K scales weights 16..31 apart: two k = 16 halves.
                        mma_s8_k16(d, af[mi][0], af[mi][1], bf[ni][0]);
                        mma_s8_k16(h, af[mi][2], af[mi][3], bf[ni][1]);
                    } else {
                        mma_s8_k32(d, af[mi], bf[ni]);
                    }
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        lo[2 * mi + (q >> 1)][2 * ni + (q & 1)] = d[q];
                        hi[2 * mi + (q >> 1)][2 * ni + (q & 1)] = h[q];
                    }
                }
            wscale ws[TN];
#pragma unroll
            for (int c = 0; c < TN; c += 2) {
                // Columns c and c + 1 are 2 tig and 2 tig + 1 of one sub-tile: `at` is even.
                const int at = kb * BN + gemm_tile_col<BM, BN, TM, TN>(c);
                const float2 d = *reinterpret_cast<const float2*>(w_d + at);
                const float2 m = *reinterpret_cast<const float2*>(w_m + at);
                const int2 sc = *reinterpret_cast<const int2*>(w_sc + at);
                ws[c] = wscale{d.x, m.x, (int)(short)(sc.x & 0xffff), sc.x >> 16};  // both halves signed
                ws[c + 1] = wscale{d.y, m.y, (int)(short)(sc.y & 0xffff), sc.y >> 16};
            }
#pragma unroll
            for (int r = 0; r < TM; ++r) {
                const int2 dx = *reinterpret_cast<const int2*>(a_dx + 2 * (kb * BM + gemm_tile_row<BM, BN, TM, TN>(r)));
                const float ad = __int_as_float(dx.x);
                const int ax = dx.y;
#pragma unroll
                for (int c = 0; c < TN; ++c) {
                    if constexpr (BIASED)
                        acc[r][c] += block_partial_f<WT>(ws[c], __int_as_float(lo[r][c]) - GEMM_I2F_BIAS_F, ad, __int_as_float(ax));
                    else
                        acc[r][c] += block_partial<WT>(ws[c], lo[r][c], hi[r][c], ax, ad, __int_as_float(ax));
                }
            }
        }
        if constexpr (STAGES == 2) {
            // The other stage was last read in the step before, which every thread has left
            // (the barrier below it); this barrier publishes it for the next step.
            if (next) store(st, smem + (((kb0 / KB) + 1) & 1) * STAGE_INTS, kb0 + KB);
            __syncthreads();
        }
    }
}
