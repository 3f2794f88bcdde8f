// Expert alignment: sorts the (token, slot) pairs by expert and pads each expert's segment to
// a multiple of the GEMM row tile. Three launches on one stream (counts zeroed before them):
//   moe_align_count    grid-stride over pairs: per-block shared histogram, then one global
//                      atomicAdd per expert and block (all-on-one-expert routing would
//                      otherwise serialise every pair on a single address);
//   moe_align_offsets  one block, a thread per expert: padded prefix sum -> offsets and
//                      padded_rows, expert of every row tile (-1 past the end), the sentinel in
//                      every padding row and every row past padded_rows; counts become cursors;
//   moe_align_scatter  grid-stride over pairs in block-wide chunks: ranks within the chunk
//                      from a shared histogram, one global atomicAdd per expert and chunk
//                      reserves the rows; sorted_ids[row] = pair.
// Order inside a segment follows the atomics (arbitrary). Pair and row indexes are 64-bit in
// the loops; the plan guarantees every row index and the sentinel fit in int.

#define ALIGN_MAX_EXPERTS 1024

static __device__ __forceinline__ bool is_expert(int e, int experts) {
    return (u32)e < (u32)experts;  // an out-of-range id is never placed (no write out of bounds)
}

extern "C" __global__ void moe_align_count(const int* __restrict__ ids, u64 pairs, int experts,
                                           int* __restrict__ counts) {
    GRID_DEPENDENCY_WAIT();
    __shared__ int hist[ALIGN_MAX_EXPERTS];
    for (int x = threadIdx.x; x < experts; x += blockDim.x) hist[x] = 0;
    __syncthreads();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += stride) {
        const int e = ids[i];
        if (is_expert(e, experts)) atomicAdd(&hist[e], 1);
    }
    __syncthreads();
    for (int x = threadIdx.x; x < experts; x += blockDim.x)
        if (hist[x]) atomicAdd(&counts[x], hist[x]);
}

// Inclusive prefix sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread must call it. Also returns the block total.
static __device__ long long block_inclusive_scan(long long x, long long* total) {
    __shared__ long long warp_tot[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const long long y = __shfl_up_sync(FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_tot[warp] = x;
    __syncthreads();
    if (warp == 0) {
        long long w = lane < nwarps ? warp_tot[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const long long y = __shfl_up_sync(FULL_MASK, w, o);
            if (lane >= o) w += y;
        }
        warp_tot[lane] = w;
    }
    __syncthreads();
    *total = warp_tot[nwarps - 1];
    return x + (warp > 0 ? warp_tot[warp - 1] : 0);
}

// Largest expert whose segment starts at or before `row` (row < padded total): the expert of
// that row, since empty segments start where the next one does.
static __device__ int expert_of_row(const int* off, int experts, long long row) {
    int lo = 0, hi = experts - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if ((long long)off[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

extern "C" __global__ void __launch_bounds__(1024)
moe_align_offsets(int* __restrict__ counts, int experts, int tile, u64 max_rows, int sentinel,
                  int* __restrict__ offsets, int* __restrict__ padded_rows,
                  int* __restrict__ tile_expert, int* __restrict__ sorted_ids) {
    GRID_DEPENDENCY_WAIT();
    __shared__ int off[ALIGN_MAX_EXPERTS];
    const int e = threadIdx.x;
    const long long count = e < experts ? counts[e] : 0;
    const long long padded = (count + tile - 1) / tile * tile;
    long long total;
    const long long start = block_inclusive_scan(padded, &total) - padded;
    if (e < experts) {
        off[e] = (int)start;
        offsets[e] = (int)start;
        counts[e] = 0;  // the scatter's cursor
    }
    if (e == 0) {
        offsets[experts] = (int)total;
        *padded_rows = (int)total;
    }
    __syncthreads();
    // Padding of this expert's segment (fewer than `tile` rows), then rows past the total.
    for (long long r = start + count; r < start + padded; ++r) sorted_ids[r] = sentinel;
    for (u64 r = (u64)total + e; r < max_rows; r += blockDim.x) sorted_ids[r] = sentinel;
    const u64 tiles = max_rows / (u64)tile;
    for (u64 t = e; t < tiles; t += blockDim.x) {
        const long long row = (long long)(t * (u64)tile);
        tile_expert[t] = row < total ? expert_of_row(off, experts, row) : -1;
    }
}

extern "C" __global__ void moe_align_scatter(const int* __restrict__ ids, u64 pairs, int experts,
                                             const int* __restrict__ offsets, int* __restrict__ cursor,
                                             int* __restrict__ sorted_ids) {
    GRID_DEPENDENCY_WAIT();
    __shared__ int chunk_count[ALIGN_MAX_EXPERTS];
    __shared__ int chunk_base[ALIGN_MAX_EXPERTS];
    for (int x = threadIdx.x; x < experts; x += blockDim.x) chunk_count[x] = 0;
    __syncthreads();
    // The chunk loop's trip count depends on the block only: every thread reaches the syncs.
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 base = (u64)blockIdx.x * blockDim.x; base < pairs; base += step) {
        const u64 i = base + threadIdx.x;
        const int e = i < pairs ? ids[i] : -1;
        const bool placed = is_expert(e, experts);
        const int rank = placed ? atomicAdd(&chunk_count[e], 1) : 0;
        __syncthreads();
        for (int x = threadIdx.x; x < experts; x += blockDim.x) {
            const int n = chunk_count[x];
            if (n) {
                chunk_base[x] = offsets[x] + atomicAdd(&cursor[x], n);
                chunk_count[x] = 0;
            }
        }
        __syncthreads();
        // chunk_base is rewritten only after the next chunk's first sync: no third sync needed.
        if (placed) sorted_ids[(u64)chunk_base[e] + (u64)rank] = (int)i;
    }
}
