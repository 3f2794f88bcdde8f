// LM head: logits[r, v] = dot(W[v, :], x[src(r), :]) on int8 dp4a.
// x [x_rows, K/32] q8_1 holds the final hidden states, W [V, K] is q8_0 or q4_0 (V = vocab),
// logits [R, V] f32. src(r) = rows[r], or r when rows is null (full logits for the parity tests);
// prefill passes the last position of each sequence, so only the sampled rows are computed.
// A row index outside [0, x_rows) reads row 0 (never out of bounds) and stores a row of NaN.
//
// Full logits pass 2^31 elements at 14,135 tokens for V = 151,936: every row and element
// index is 64-bit (r * V + v, src * K/32).
//
// Two kernels, chosen by the plan from R:
// - output_head_gemm (R > 8): grid.x = row tiles of HEAD_BM rows (they grow with tokens),
//   grid.y = vocab tiles of HEAD_BN columns (bounded: 2,374 for V = 151,936; the plan refuses a
//   vocab past 65535 tiles), 256 threads each computing 4 x 4 outputs. A and W are staged in
//   shared memory as in moe_gemm.cu (21,504 B dynamic: within every card's 48 KiB). Spare rows
//   of the last row tile read the last real row and spare columns the last vocab row; both are
//   masked at the store, after the last barrier.
// - output_head_gemv (R <= 8, decode): grid.x = vocab tiles of 8 rows of W, one warp per W row
//   (read once for all R rows), its lanes splitting the K/32 blocks and meeting in warp_sum.
//   The loop over R is bounded by a kernel argument (the same for every lane), so every lane
//   reaches every shuffle; warps past V read W row V - 1 and are masked at the store.

#define HEAD_BM 64
#define HEAD_BN 64
#define HEAD_KB 4
#define HEAD_TM 4
#define HEAD_TN 4
#define HEAD_QS 9  // ints per staged block: 8 quant ints + 1 pad (conflict-free column reads)
#define HEAD_GEMV_WARPS 8
#define HEAD_GEMV_MAX_ROWS 8
#define HEAD_NAN __int_as_float(0x7fc00000)

// Source row of output row r; `bad` when the index list points outside x.
static __device__ __forceinline__ u64 head_source(const int* __restrict__ rows, u64 r, u64 x_rows, bool* bad) {
    const i64 s = rows ? (i64)rows[r] : (i64)r;
    *bad = s < 0 || (u64)s >= x_rows;
    return *bad ? 0 : (u64)s;
}

template <int WTYPE>
static __device__ __forceinline__ void head_gemm_tile(const u32* __restrict__ x, const int* __restrict__ rows, u64 n_rows, u64 x_rows,
                                                      const u16* __restrict__ w, float* __restrict__ out, int vocab, int nb) {
    constexpr int COLS_T = HEAD_BN / HEAD_TN;  // threads along a tile's columns
    constexpr int ROWS_T = HEAD_BM / HEAD_TM;
    constexpr int THREADS = COLS_T * ROWS_T;

    extern __shared__ __align__(16) int smem[];
    int* a_q = smem;                                           // [KB][BM][QS]
    int* w_q = a_q + HEAD_KB * HEAD_BM * HEAD_QS;              // [KB][BN][QS]
    float* a_d = (float*)(w_q + HEAD_KB * HEAD_BN * HEAD_QS);  // [KB][BM]
    float* a_s = a_d + HEAD_KB * HEAD_BM;                      // [KB][BM]
    float* w_d = a_s + HEAD_KB * HEAD_BM;                      // [KB][BN]
    u16* w_q16 = (u16*)w_q;
    __shared__ u64 src[HEAD_BM];
    __shared__ bool bad[HEAD_BM];

    const int tid = threadIdx.x;
    const int tx = tid % COLS_T;
    const int ty = tid / COLS_T;
    const u64 row0 = (u64)blockIdx.x * HEAD_BM;
    const u64 col0 = (u64)blockIdx.y * HEAD_BN;
    // u16 units per weight block: d + 16 quant halves (q8_0) or d + 8 nibble halves (q4_0).
    constexpr int W_UNITS = WTYPE == WTYPE_Q8_0 ? 17 : 9;
    const u64 w_row_units = (u64)nb * W_UNITS;

    // Spare rows of the last tile take the last real row: valid reads, finite sums.
    for (int i = tid; i < HEAD_BM; i += THREADS) {
        const u64 r = row0 + i < n_rows ? row0 + i : n_rows - 1;
        bool b;
        src[i] = head_source(rows, r, x_rows, &b);
        bad[i] = b;
    }

    float acc[HEAD_TM][HEAD_TN];
#pragma unroll
    for (int r = 0; r < HEAD_TM; ++r)
#pragma unroll
        for (int c = 0; c < HEAD_TN; ++c) acc[r][c] = 0.0f;

    for (int kb0 = 0; kb0 < nb; kb0 += HEAD_KB) {
        __syncthreads();  // the source table is written / the previous step's reads are done

        // A: 9 words per q8_1 block (word 0 = d | s << 16, words 1..8 = quants).
        for (int i = tid; i < HEAD_BM * HEAD_KB * 9; i += THREADS) {
            const int blk = i / 9, word = i - blk * 9;
            const int row = blk / HEAD_KB, kb = blk - row * HEAD_KB;
            u32 v = 0;
            if (kb0 + kb < nb) v = x[(src[row] * (u64)nb + (u64)(kb0 + kb)) * 9 + word];
            if (word == 0) {
                a_d[kb * HEAD_BM + row] = f16_to_f32((u16)(v & 0xffff));
                a_s[kb * HEAD_BM + row] = f16_to_f32((u16)(v >> 16));
            } else {
                a_q[(kb * HEAD_BM + row) * HEAD_QS + word - 1] = (int)v;
            }
        }
        // W: one u16 unit per thread and step; q4_0 nibbles unpacked to int8 halves.
        for (int i = tid; i < HEAD_BN * HEAD_KB * W_UNITS; i += THREADS) {
            const int blk = i / W_UNITS, u = i - blk * W_UNITS;
            const int c = blk / HEAD_KB, kb = blk - c * HEAD_KB;
            const u64 col = col0 + c < (u64)vocab ? col0 + c : (u64)vocab - 1;
            u16 v = 0;
            if (kb0 + kb < nb) v = w[col * w_row_units + (u64)(kb0 + kb) * W_UNITS + u];
            u16* q = w_q16 + (kb * HEAD_BN + c) * (2 * HEAD_QS);
            if (u == 0) {
                w_d[kb * HEAD_BN + c] = f16_to_f32(v);
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

        const int kb_n = min(HEAD_KB, nb - kb0);  // block-uniform
        for (int kb = 0; kb < kb_n; ++kb) {
            int isum[HEAD_TM][HEAD_TN];
#pragma unroll
            for (int r = 0; r < HEAD_TM; ++r)
#pragma unroll
                for (int c = 0; c < HEAD_TN; ++c) isum[r][c] = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                int av[HEAD_TM], wv[HEAD_TN];
#pragma unroll
                for (int r = 0; r < HEAD_TM; ++r) av[r] = a_q[(kb * HEAD_BM + ty + r * ROWS_T) * HEAD_QS + j];
#pragma unroll
                for (int c = 0; c < HEAD_TN; ++c) wv[c] = w_q[(kb * HEAD_BN + tx + c * COLS_T) * HEAD_QS + j];
#pragma unroll
                for (int r = 0; r < HEAD_TM; ++r)
#pragma unroll
                    for (int c = 0; c < HEAD_TN; ++c) isum[r][c] = dp4a(wv[c], av[r], isum[r][c]);
            }
#pragma unroll
            for (int r = 0; r < HEAD_TM; ++r) {
                const float ad = a_d[kb * HEAD_BM + ty + r * ROWS_T];
                const float as8 = 8.0f * a_s[kb * HEAD_BM + ty + r * ROWS_T];
#pragma unroll
                for (int c = 0; c < HEAD_TN; ++c) {
                    const float wd = w_d[kb * HEAD_BN + tx + c * COLS_T];
                    // The block formulas of quant.rs: q8_0 d_w * d_a * sum, q4_0 d_w * (d_a * sum - 8 s_a).
                    if (WTYPE == WTYPE_Q8_0) acc[r][c] += wd * ad * (float)isum[r][c];
                    else acc[r][c] += wd * (ad * (float)isum[r][c] - as8);
                }
            }
        }
    }

    // No barrier below: spare rows and columns are masked here, at the store.
#pragma unroll
    for (int r = 0; r < HEAD_TM; ++r) {
        const int t = ty + r * ROWS_T;
        const u64 row = row0 + t;
        if (row >= n_rows) continue;
#pragma unroll
        for (int c = 0; c < HEAD_TN; ++c) {
            const u64 col = col0 + tx + c * COLS_T;
            if (col < (u64)vocab) out[row * (u64)vocab + col] = bad[t] ? HEAD_NAN : acc[r][c];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
output_head_gemm(const u32* x, const int* rows, u64 n_rows, u64 x_rows, const u16* w, int wtype, float* out, int vocab, int nb) {
    if (wtype == WTYPE_Q8_0) head_gemm_tile<WTYPE_Q8_0>(x, rows, n_rows, x_rows, w, out, vocab, nb);
    else head_gemm_tile<WTYPE_Q4_0>(x, rows, n_rows, x_rows, w, out, vocab, nb);
}

// One W row against up to HEAD_GEMV_MAX_ROWS activation rows: the weight block is loaded once
// per lane and dotted with every row's block (same block formulas as the GEMM).
template <int WTYPE>
static __device__ __forceinline__ void head_gemv_col(const block_q8_1* __restrict__ x, const int* __restrict__ rows, int n_rows,
                                                     u64 x_rows, const unsigned char* __restrict__ w, float* __restrict__ out,
                                                     int vocab, int nb) {
    const int lane = threadIdx.x & 31;
    const u64 col = (u64)blockIdx.x * HEAD_GEMV_WARPS + (threadIdx.x >> 5);
    const u64 col_read = col < (u64)vocab ? col : (u64)vocab - 1;
    u64 src[HEAD_GEMV_MAX_ROWS];
    bool bad[HEAD_GEMV_MAX_ROWS];
    float acc[HEAD_GEMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < HEAD_GEMV_MAX_ROWS; ++r) {
        bool b = false;
        src[r] = r < n_rows ? head_source(rows, (u64)r, x_rows, &b) : 0;
        bad[r] = b;
        acc[r] = 0.0f;
    }
    const unsigned char* w_row = w + col_read * weight_row_bytes(WTYPE, nb * QK);
    for (int b = lane; b < nb; b += 32) {
        if (WTYPE == WTYPE_Q8_0) {
            const block_q8_0* wb = (const block_q8_0*)w_row + b;
            const float dw = f16_to_f32(wb->d);
            int q[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) q[i] = load_int_b2(wb->qs, i);
#pragma unroll
            for (int r = 0; r < HEAD_GEMV_MAX_ROWS; ++r) {
                if (r >= n_rows) break;
                const block_q8_1* xb = x + src[r] * (u64)nb + b;
                int s = 0;
#pragma unroll
                for (int i = 0; i < 8; ++i) s = dp4a(q[i], load_int_b4(xb->qs, i), s);
                acc[r] += dw * f16_to_f32(xb->d) * (float)s;
            }
        } else {
            const block_q4_0* wb = (const block_q4_0*)w_row + b;
            const float dw = f16_to_f32(wb->d);
            int q[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) q[i] = load_int_b2(wb->qs, i);
#pragma unroll
            for (int r = 0; r < HEAD_GEMV_MAX_ROWS; ++r) {
                if (r >= n_rows) break;
                const block_q8_1* xb = x + src[r] * (u64)nb + b;
                int s = 0;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    s = dp4a(q[i] & 0x0f0f0f0f, load_int_b4(xb->qs, i), s);
                    s = dp4a((q[i] >> 4) & 0x0f0f0f0f, load_int_b4(xb->qs, i + 4), s);
                }
                acc[r] += dw * (f16_to_f32(xb->d) * (float)s - 8.0f * f16_to_f32(xb->s));
            }
        }
    }
    // n_rows is a kernel argument: the same bound for every lane of every warp.
#pragma unroll
    for (int r = 0; r < HEAD_GEMV_MAX_ROWS; ++r) {
        if (r >= n_rows) break;
        const float v = warp_sum(acc[r]);
        if (lane == 0 && col < (u64)vocab) out[(u64)r * (u64)vocab + col] = bad[r] ? HEAD_NAN : v;
    }
}

extern "C" __global__ void __launch_bounds__(HEAD_GEMV_WARPS * 32)
output_head_gemv(const block_q8_1* x, const int* rows, int n_rows, u64 x_rows, const unsigned char* w, int wtype, float* out, int vocab,
                 int nb) {
    if (wtype == WTYPE_Q8_0) head_gemv_col<WTYPE_Q8_0>(x, rows, n_rows, x_rows, w, out, vocab, nb);
    else head_gemv_col<WTYPE_Q4_0>(x, rows, n_rows, x_rows, w, out, vocab, nb);
}
