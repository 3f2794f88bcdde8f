// Activation quantize to q8_1, fused with the gather by expert.
//
// One warp per 32-value block (lane j = element j), quantized by common.cuh's
// warp_quantize_q8_1: step for step `quant::quantize_block_q8_1` (IEEE division: NVRTC's
// default -prec-div=true), so GPU and CPU blocks agree bit for bit.
//
// Geometry: warps walk the (row, block) items in a grid-stride loop on grid.x; the loop index is
// the warp's, so its trip count is warp-uniform and every lane reaches both reductions. Rows x K
// passes 2^31 at large prefills: every index is 64-bit.
//
// Gather (sorted_ids != null): output row r quantizes source row sorted_ids[r] / rows_per_token
// (rows_per_token = top_k for the gate/up input [tokens, K]; 1 for the down input, whose rows are
// already (token, slot) pairs). An id outside [0, src_rows * rows_per_token) is the alignment's
// padding sentinel: the warp still reads a valid row (row 0) and runs the reductions, then
// stores zeros. Dense (sorted_ids == null): row r quantizes source row r.

extern "C" __global__ void quantize(const float* __restrict__ x, u64 src_rows, int k,
                                    const int* __restrict__ sorted_ids, int rows_per_token,
                                    block_q8_1* __restrict__ out, u64 rows) {
    GRID_DEPENDENCY_WAIT();
    const int nb = k / QK;
    const int lane = threadIdx.x & 31;
    const u64 items = rows * (u64)nb;
    const u64 warps_per_block = blockDim.x >> 5;
    const u64 warps = (u64)gridDim.x * warps_per_block;
    for (u64 i = (u64)blockIdx.x * warps_per_block + (threadIdx.x >> 5); i < items; i += warps) {
        const u64 r = i / (u64)nb;
        const u64 b = i - r * (u64)nb;
        u64 src;
        const bool valid = gather_source(sorted_ids, r, src_rows, rows_per_token, &src);
        // Masked at the store only: `valid` is warp-uniform and both reductions are done.
        warp_quantize_q8_1(x[src * (u64)k + b * QK + lane], valid, out + i);
    }
}
