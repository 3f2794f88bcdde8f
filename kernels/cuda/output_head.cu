// Dense quantized matmul on int8 (mma.sync tiles for the GEMM, dp4a for the GEMV): the LM
// head, and every dense projection of the engine (`ops::linear`):  out[r, v] = dot(W[v, :], x[src(r), :]).
// x [x_rows, K/32] q8_1, W [V, K] in any weight format (common.cuh), out [R, V] f32 (V = vocab
// for the head, the projection's output width otherwise). src(r) = rows[r], or r when rows is
// null (full logits for the parity tests; every dense projection); prefill passes the last
// position of each sequence, so only the sampled rows are computed.
// A row index outside [0, x_rows) reads row 0 (never out of bounds) and stores a row of NaN.
//
// Full logits pass 2^31 elements at 14,135 tokens for V = 151,936: every row and element
// index is 64-bit (r * V + v, src * K/32).
//
// Two kernels, chosen by the plan from R:
// - output_head_gemm (R > 8): grid.x = row tiles of HEAD_BM rows (they grow with tokens),
//   grid.y = column tiles of HEAD_BN (bounded: 2,374 for V = 151,936; the plan refuses past
//   65535 tiles), 256 threads each computing 4 x 4 outputs, the K loop of gemm_tile.cuh with
//   each next step prefetched (23,552 B dynamic shared memory: within every card's 48 KiB). Spare rows of the last row
//   tile read the last real row and spare columns the last W row; both are masked at the store,
//   after the last barrier.
// - output_head_gemv (R <= 8, decode): grid.x = column tiles of 8 rows of W, one warp per W row
//   (read once for all R rows), its lanes splitting the K/32 blocks and meeting in warp_sum.
//   The loop over R is bounded by a kernel argument (the same for every lane), so every lane
//   reaches every shuffle; warps past V read W row V - 1 and are masked at the store.

#define HEAD_BM 64
#define HEAD_BN 64
#define HEAD_KB 4
#define HEAD_TM 4
#define HEAD_TN 4
#define HEAD_THREADS ((HEAD_BM / HEAD_TM) * (HEAD_BN / HEAD_TN))
#define HEAD_GEMV_WARPS 8
#define HEAD_GEMV_MAX_ROWS 8
#define HEAD_NAN __int_as_float(0x7fc00000)

// Source row of output row r; `bad` when the index list points outside x.
static __device__ __forceinline__ u64 head_source(const int* __restrict__ rows, u64 r, u64 x_rows, bool* bad) {
    const i64 s = rows ? (i64)rows[r] : (i64)r;
    *bad = s < 0 || (u64)s >= x_rows;
    return *bad ? 0 : (u64)s;
}

template <int WT>
static __device__ __forceinline__ void head_gemm_tile(const u32* __restrict__ x, const int* __restrict__ rows, u64 n_rows, u64 x_rows,
                                                      const unsigned char* __restrict__ w, float* __restrict__ out, int vocab, int nb,
                                                      u64* src, bool* bad) {
    extern __shared__ __align__(16) int smem[];

    const int tid = threadIdx.x;
    const u64 row0 = (u64)blockIdx.x * HEAD_BM;
    const u64 col0 = (u64)blockIdx.y * HEAD_BN;
    // Spare rows of the last tile take the last real row: valid reads, finite sums.
    for (int i = tid; i < HEAD_BM; i += HEAD_THREADS) {
        const u64 r = row0 + i < n_rows ? row0 + i : n_rows - 1;
        bool b;
        src[i] = head_source(rows, r, x_rows, &b);
        bad[i] = b;
    }

    float acc[HEAD_TM][HEAD_TN];
    gemm_tile_loop<HEAD_BM, HEAD_BN, HEAD_KB, HEAD_TM, HEAD_TN, WT, true>(x, src, w, weight_row_bytes(WT, nb * QK), (u64)vocab, col0, nb, smem,
                                                                   acc);

    // No barrier below: spare rows and columns are masked here, at the store.
#pragma unroll
    for (int r = 0; r < HEAD_TM; ++r) {
        const int t = gemm_tile_row<HEAD_BM, HEAD_BN, HEAD_TM, HEAD_TN>(r);
        const u64 row = row0 + t;
        if (row >= n_rows) continue;
#pragma unroll
        for (int c = 0; c < HEAD_TN; ++c) {
            const u64 col = col0 + gemm_tile_col<HEAD_BM, HEAD_BN, HEAD_TM, HEAD_TN>(c);
            if (col < (u64)vocab) out[row * (u64)vocab + col] = bad[t] ? HEAD_NAN : acc[r][c];
        }
    }
}

// One block per SM asked of ptxas: the prefetched step stays in registers (as moe_gemm.cu's
// default tile; at the 128 registers of 2 blocks it would spill).
extern "C" __global__ void __launch_bounds__(HEAD_THREADS, 1)
output_head_gemm(const u32* x, const int* rows, u64 n_rows, u64 x_rows, const unsigned char* w, int wtype, float* out, int vocab, int nb) {
    GRID_DEPENDENCY_WAIT();
    __shared__ u64 src[HEAD_BM];
    __shared__ bool bad[HEAD_BM];
    DISPATCH_WTYPE(wtype, head_gemm_tile<WT>(x, rows, n_rows, x_rows, w, out, vocab, nb, src, bad));
}

// One W row against up to HEAD_GEMV_MAX_ROWS activation rows: each lane unpacks a weight block
// once (wq_int, wq_scale) and dots it with every row's block (the GEMM's block formula).
template <int WT>
static __device__ __forceinline__ void head_gemv_col(const block_q8_1* __restrict__ x, const int* __restrict__ rows, int n_rows,
                                                     u64 x_rows, const unsigned char* __restrict__ w, float* __restrict__ out,
                                                     int vocab, int nb, u64 tile) {
    const int lane = threadIdx.x & 31;
    const u64 col = tile * HEAD_GEMV_WARPS + (threadIdx.x >> 5);
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
    const unsigned char* w_row = w + col_read * weight_row_bytes(WT, nb * QK);
    for (int b = lane; b < nb; b += 32) {
        int q[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = wq_int<WT>(w_row, b, j);
        const wscale ws = wq_scale<WT>(w_row, b);
#pragma unroll
        for (int r = 0; r < HEAD_GEMV_MAX_ROWS; ++r) {
            if (r >= n_rows) break;
            const block_q8_1* xb = x + src[r] * (u64)nb + b;
            int lo, hi, usum;
            block_isums<WT>(q, xb, &lo, &hi, &usum);
            acc[r] += block_partial<WT>(ws, lo, hi, usum, f16_to_f32(xb->d), f16_to_f32(xb->s));
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
    GRID_DEPENDENCY_WAIT();
    DISPATCH_WTYPE(wtype, head_gemv_col<WT>(x, rows, n_rows, x_rows, w, out, vocab, nb, blockIdx.x));
}

// Up to three projections of the same q8_1 rows in one launch (q, k and v at decode): the
// column tiles of the three (HEAD_GEMV_WARPS W rows each, as output_head_gemv's) follow each
// other on grid.x, tiles0 of W0, then tiles1 of W1, then the rest of W2 (none for two). Each
// block finds its matrix from blockIdx.x (block-uniform) and runs output_head_gemv's body on its
// tile, so every output column is computed exactly as one output_head_gemv launch per matrix
// computes it. Each matrix has its own weight type, output and width; x rows are r (no index
// list), n_rows <= HEAD_GEMV_MAX_ROWS.
extern "C" __global__ void __launch_bounds__(HEAD_GEMV_WARPS * 32)
output_head_gemv3(const block_q8_1* x, int n_rows, u64 x_rows, int nb, const unsigned char* w0, int wtype0, float* out0, int n0,
                  u64 tiles0, const unsigned char* w1, int wtype1, float* out1, int n1, u64 tiles1, const unsigned char* w2, int wtype2,
                  float* out2, int n2) {
    GRID_DEPENDENCY_WAIT();
    u64 tile = blockIdx.x;
    if (tile < tiles0) {
        DISPATCH_WTYPE(wtype0, head_gemv_col<WT>(x, nullptr, n_rows, x_rows, w0, out0, n0, nb, tile));
        return;
    }
    tile -= tiles0;
    if (tile < tiles1) {
        DISPATCH_WTYPE(wtype1, head_gemv_col<WT>(x, nullptr, n_rows, x_rows, w1, out1, n1, nb, tile));
        return;
    }
    tile -= tiles1;
    DISPATCH_WTYPE(wtype2, head_gemv_col<WT>(x, nullptr, n_rows, x_rows, w2, out2, n2, nb, tile));
}
