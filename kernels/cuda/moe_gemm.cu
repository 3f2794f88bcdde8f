// Routed-expert GEMM for prefill, on int8 tensor cores (gemm_tile.cuh):
//   y[sorted_ids[r], n] = dot(W[tile_expert[r / BM]][n, :], A[r, :])
// A [max_padded_rows, K/32] q8_1 holds the activations gathered in sorted row order (padding
// rows are zeros); W [E, N, K] is in any weight format (common.cuh); y [pairs, N] f32 is indexed
// by (token, slot) pair.
//
// Geometry: grid.x = row tiles of BM = 64 rows (they grow with tokens: the launch covers
// max_padded_rows / 64, the real count is on the device), grid.y = column tiles of BN (bounded),
// block = THREADS threads (warps of mma.sync sub-tiles), each computing TM x TN outputs. A block whose tile_expert is -1 (past
// the real padded rows) returns before any __syncthreads: the test is block-uniform.
//
// The K loop is gemm_tile.cuh's (shared with the dense GEMM of output_head.cu): the tile's A
// rows are simply row0 .. row0 + BM - 1, its W rows those of the tile's expert. Padding rows are
// computed (zeros) and columns past N read column N - 1; both are masked at the store, after the
// last barrier. Every index that grows with tokens is 64-bit.

template <int BM, int BN, int KB, int TM, int TN, int WT, bool PF, int STAGES>
static __device__ __forceinline__ void moe_gemm_tile(const int* __restrict__ sorted_ids, const int* __restrict__ tile_expert,
                                                     const u32* __restrict__ a, const unsigned char* __restrict__ w, float* __restrict__ y,
                                                     u64 pairs, int n, int nb, int experts, u64* a_rows) {
    constexpr int THREADS = (BM / TM) * (BN / TN);

    const int e = tile_expert[blockIdx.x];
    if (e < 0 || e >= experts) return;  // block-uniform, before any barrier

    extern __shared__ __align__(16) int smem[];
    const u64 row0 = (u64)blockIdx.x * BM;
    for (int i = threadIdx.x; i < BM; i += THREADS) a_rows[i] = row0 + (u64)i;
    const u64 row_bytes = weight_row_bytes(WT, nb * QK);
    const unsigned char* w_e = w + (u64)e * (u64)n * row_bytes;
    const u64 col0 = (u64)blockIdx.y * BN;

    float acc[TM][TN];
    gemm_tile_loop<BM, BN, KB, TM, TN, WT, PF, STAGES>(a, a_rows, w_e, row_bytes, (u64)n, col0, nb, smem, acc);

    // No barrier below: padding rows and columns past N are masked here, at the store.
#pragma unroll
    for (int r = 0; r < TM; ++r) {
        const int pair = sorted_ids[row0 + gemm_tile_row<BM, BN, TM, TN>(r)];
        if (pair < 0 || (u64)pair >= pairs) continue;
#pragma unroll
        for (int c = 0; c < TN; ++c) {
            const u64 col = col0 + gemm_tile_col<BM, BN, TM, TN>(c);
            if (col < (u64)n) y[(u64)pair * (u64)n + col] = acc[r][c];
        }
    }
}

// One entry point per row of the Rust `TILES` table: BM x BN x KB, TM x TN per thread, PF 1 to
// prefetch each next K step during the current one's mma loop, STAGES of shared memory
// (gemm_tile_loop). The
// weight format is a template argument (DISPATCH_WTYPE), so staging and the block formula have
// no type branch. a_rows is declared here, once for every instantiation.
// Blocks per SM the register allocation must allow: 2 for 256-thread tiles (128 registers a
// thread; without a minimum ptxas picks as few as 48 on sm_90 and spills), 1 for larger ones
// (their shared memory allows one block per SM anyway).
// A prefetching tile (PF) holds a staged step in registers through its mma loop: its
// 256-thread tile asks for 1 block per SM, so ptxas may use more than 128 registers rather
// than spill.
#define MOE_GEMM_MIN_BLOCKS(THREADS, PF) ((THREADS) <= 256 && !(PF) ? 2 : 1)

#define MOE_GEMM_KERNEL(NAME, BM, BN, KB, TM, TN, PF, STAGES)                                                                               \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), MOE_GEMM_MIN_BLOCKS((BM / TM) * (BN / TN), PF))             \
        NAME(const int* sorted_ids, const int* tile_expert, const u32* a, const unsigned char* w, float* y, u64 pairs, int n,   \
             int nb, int experts, int wtype) {                                                                                  \
        GRID_DEPENDENCY_WAIT();                                                                                                 \
        __shared__ u64 a_rows[BM];                                                                                              \
        DISPATCH_WTYPE(wtype,                                                                                                   \
                       moe_gemm_tile<BM, BN, KB, TM, TN, WT, PF != 0, STAGES>(sorted_ids, tile_expert, a, w, y, pairs, n, nb, experts, a_rows)); \
    }

MOE_GEMM_KERNEL(moe_gemm_m64n64k4_pf, 64, 64, 4, 4, 4, 1, 1)
MOE_GEMM_KERNEL(moe_gemm_m64n64k4, 64, 64, 4, 4, 4, 0, 1)
MOE_GEMM_KERNEL(moe_gemm_m64n64k4_pf2, 64, 64, 4, 4, 4, 1, 2)
MOE_GEMM_KERNEL(moe_gemm_m64n128k2_pf, 64, 128, 2, 4, 8, 1, 1)
MOE_GEMM_KERNEL(moe_gemm_m32n64k2_pf, 32, 64, 2, 4, 4, 1, 1)
