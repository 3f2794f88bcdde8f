// NEGATIVE CONTROL ONLY: never launched by the engine. It exists so that the self-test can
// prove it detects the first failure of the design (a rejected launch) and attributes it to
// the right kernel.
//
// The routed-expert GEMV of `moe_gemv.cu`, written the way the failing engine wrote it: the
// flat (token, slot) pair index on grid.z, i.e. grid = (1, ceil(N / rows_per_block),
// tokens * top_k). maxGridDimZ is 65535 on every CUDA card, so at tokens * top_k > 65535 (8192
// tokens at top_k 8) the driver rejects the launch with CUDA_ERROR_INVALID_VALUE. Below that it
// computes exactly what `moe_gemv` computes (same body, same inputs, same check), so it passes.
// Its plan (`moe_gemv::negative_gridz_plan`) is deliberately built without `Launch::checked`.
// Compiled after moe_gemv.cu (its twin): the body is the same `gemv_pair`, only the axis differs.

extern "C" __global__ void moe_gemv_gridz_broken(const unsigned char* __restrict__ w, int wtype,
                                                 const block_q8_1* __restrict__ xq, const int* __restrict__ ids,
                                                 float* __restrict__ y, int top_k, int n, int k) {
    GRID_DEPENDENCY_WAIT();
    gemv_pair(blockIdx.z, w, wtype, xq, ids, y, top_k, n, k);  // the bug: pairs grow with tokens, z stops at 65535
}
