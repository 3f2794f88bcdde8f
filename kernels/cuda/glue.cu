// The small kernels the engine runs between the big ones (twins in `ops/glue.rs`):
//   swiglu        out[r, j] = silu(gate[r, j]) * up[r, j], silu(g) = g / (1 + expf(-g)), f32;
//                 clamped (gpt-oss, ggml_swiglu_oai): x = min(g, limit), y = clamp(u, -limit, limit),
//                 x / (1 + expf(alpha * -x)) * (y + 1)
//   swiglu_q8_1   the same, quantized straight to q8_1 blocks (the down projection's input),
//                 optionally gathered into expert order as the routed GEMM reads it
//   add_f32       out = a + b elementwise (the residual; out may be a: in place)
//   add_bias_f32  x[r, i] += bias[i] over rows of `width` (gpt-oss's q/k/v/o projection biases)
//   add_pick_bias_f32  y[p, i] += bias[ids[p], i] over the (token, slot) pairs' rows (the picked
//                 expert's gate/up/down bias)
//   dense_f32     y[t, n] = Σ_k W[n, k] * x[t, k], f32 (the MoE router's ffn_gate_inp)
//
// Rows grow with tokens (swiglu's rows are (token, slot) pairs: tokens x top_k x ffn passes 2^31
// at large prefills): grid-stride loops or row tiles on grid.x, every index 64-bit. gate and up
// are read at row stride `in_stride` from element offsets, so they may be two buffers or the
// two halves of one fused [rows, 2 * ffn] gate/up output.

#define GLUE_THREADS 256
#define GLUE_WARPS (GLUE_THREADS / 32)
#define DENSE_TOKENS 8  // tokens per dense_f32 block: each W row read serves them all

// swiglu_value, swiglu_oai_value and glue_act are in common.cuh: the fused gate/up GEMV of
// moe_gemv.cu computes them too, and the two must agree bit for bit.

extern "C" __global__ void __launch_bounds__(GLUE_THREADS)
swiglu(const float* __restrict__ gate, u64 gate_offset, const float* __restrict__ up, u64 up_offset, u64 in_stride,
       float* __restrict__ out, u64 rows, int width, int clamped, float alpha, float limit) {
    GRID_DEPENDENCY_WAIT();
    const u64 items = rows * (u64)width;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += stride) {
        const u64 r = i / (u64)width;
        const u64 at = r * in_stride + (i - r * (u64)width);
        out[i] = glue_act(gate[gate_offset + at], up[up_offset + at], clamped, alpha, limit);
    }
}

// One warp per 32-value block of the output, in a grid-stride loop whose index is the warp's:
// a warp-uniform trip count, so every lane reaches both reductions of warp_quantize_q8_1.
// Output row r comes from source row r (sorted_ids null: the pairs in order, e.g. the decode
// GEMV's per-pair input) or from source row sorted_ids[r] / rows_per_token (the routed GEMM's A
// for the down projection: rows in expert order); an id outside [0, src_rows * rows_per_token)
// is the alignment's padding: the warp reads row 0, runs the reductions and stores zeros.
extern "C" __global__ void __launch_bounds__(GLUE_THREADS)
swiglu_q8_1(const float* __restrict__ gate, u64 gate_offset, const float* __restrict__ up, u64 up_offset, u64 in_stride,
            const int* __restrict__ sorted_ids, u64 src_rows, int rows_per_token, block_q8_1* __restrict__ out, u64 rows, int width,
            int clamped, float alpha, float limit) {
    GRID_DEPENDENCY_WAIT();
    const int nb = width / QK;
    const u64 items = rows * (u64)nb;
    const u64 warps = (u64)gridDim.x * GLUE_WARPS;
    for (u64 i = (u64)blockIdx.x * GLUE_WARPS + (threadIdx.x >> 5); i < items; i += warps) {
        const u64 r = i / (u64)nb;
        u64 src;
        const bool valid = gather_source(sorted_ids, r, src_rows, rows_per_token, &src);
        const u64 at = src * in_stride + (i - r * (u64)nb) * QK + (threadIdx.x & 31);
        warp_quantize_q8_1(glue_act(gate[gate_offset + at], up[up_offset + at], clamped, alpha, limit), valid, out + i);
    }
}

// No __restrict__: out may alias a (the in-place residual add); each element is read and
// written by one thread.
extern "C" __global__ void __launch_bounds__(GLUE_THREADS) add_f32(const float* a, const float* __restrict__ b, float* out, u64 n) {
    GRID_DEPENDENCY_WAIT();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = __fadd_rn(a[i], b[i]);
}

// In place over the n = rows x width values of x: one thread per value, the bias's element
// i % width; one IEEE addition each (ggml_add's broadcast of the bias row).
extern "C" __global__ void __launch_bounds__(GLUE_THREADS) add_bias_f32(float* __restrict__ x, const float* __restrict__ bias, u64 n, u64 width) {
    GRID_DEPENDENCY_WAIT();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = __fadd_rn(x[i], bias[i % width]);
}

// In place over the pairs x width values of y (rows in pair order): row p gains the row of
// expert ids[p] of bias [experts, width]; an id outside [0, experts) adds nothing (the router
// never writes one). One thread per value, one IEEE addition.
extern "C" __global__ void __launch_bounds__(GLUE_THREADS)
add_pick_bias_f32(float* __restrict__ y, const int* __restrict__ ids, const float* __restrict__ bias, u64 pairs, u64 width, int experts) {
    GRID_DEPENDENCY_WAIT();
    const u64 n = pairs * width;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const u64 p = i / width;
        const int e = ids[p];
        if (e >= 0 && e < experts) y[i] = __fadd_rn(y[i], bias[(u64)e * width + (i - p * width)]);
    }
}

// acc + w.x*x.x + w.y*x.y + w.z*x.z + w.w*x.w, one fused multiply-add at a time in that order.
__device__ __forceinline__ float dot4_acc(float4 w, float4 x, float acc) {
    acc = __fmaf_rn(w.x, x.x, acc);
    acc = __fmaf_rn(w.y, x.y, acc);
    acc = __fmaf_rn(w.z, x.z, acc);
    return __fmaf_rn(w.w, x.w, acc);
}

// One warp per item (tile of DENSE_TOKENS tokens, output n), items = tiles x n_out in a warp
// grid-stride loop: at decode (one tile) the router's rows are spread over many SMs instead of
// one block streaming the whole matrix. Lane l accumulates k = l, l + 32, ... with fused
// multiply-adds (k a multiple of 4: the float4s l, l + 32, ..., each value in order), then the
// xor butterfly (warp_sum); the twin repeats that order exactly. Spare
// tokens of the last tile read token tokens - 1 and are masked at the store; the item loop
// depends on the warp only and the token loop on a constant, so every lane reaches every shuffle.
extern "C" __global__ void __launch_bounds__(GLUE_THREADS)
dense_f32(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, u64 tokens, int n_out, int k) {
    GRID_DEPENDENCY_WAIT();
    const int lane = threadIdx.x & 31;
    const u64 items = (tokens + DENSE_TOKENS - 1) / DENSE_TOKENS * (u64)n_out;
    const u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    for (u64 i = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); i < items; i += warps) {
        const u64 t0 = i / (u64)n_out * DENSE_TOKENS;
        const u64 n = i % (u64)n_out;
        const float* xs[DENSE_TOKENS];
#pragma unroll
        for (int t = 0; t < DENSE_TOKENS; ++t) xs[t] = x + (t0 + t < tokens ? t0 + t : tokens - 1) * (u64)k;
        const float* wr = w + n * (u64)k;
        float acc[DENSE_TOKENS];
#pragma unroll
        for (int t = 0; t < DENSE_TOKENS; ++t) acc[t] = 0.0f;
        // A tile's tokens past the end (decode's single token: 7 of 8) load nothing; the ones
        // that exist accumulate in the same order either way.
        const u64 valid = tokens - t0 < DENSE_TOKENS ? tokens - t0 : DENSE_TOKENS;
        if ((k & 3) == 0) {
            // 16-byte loads (the launch checks the alignment): lane l takes the float4s
            // q = l, l + 32, ... and their four values in order, so a warp at decode has four
            // times the bytes in flight of 4-byte loads (the router was latency-bound).
            const float4* w4 = reinterpret_cast<const float4*>(wr);
            const int k4 = k >> 2;
            if (valid == DENSE_TOKENS) {
#pragma unroll 2
                for (int q = lane; q < k4; q += 32) {
                    const float4 wv = __ldg(w4 + q);
#pragma unroll
                    for (int t = 0; t < DENSE_TOKENS; ++t) acc[t] = dot4_acc(wv, reinterpret_cast<const float4*>(xs[t])[q], acc[t]);
                }
            } else if (valid == 1) {
                // Decode's one token: eight loads of W and x in flight a lane.
                const float4* x4 = reinterpret_cast<const float4*>(xs[0]);
#pragma unroll 8
                for (int q = lane; q < k4; q += 32) acc[0] = dot4_acc(__ldg(w4 + q), x4[q], acc[0]);
            } else {
#pragma unroll 2
                for (int q = lane; q < k4; q += 32) {
                    const float4 wv = __ldg(w4 + q);
#pragma unroll
                    for (int t = 0; t < DENSE_TOKENS; ++t)
                        if ((u64)t < valid) acc[t] = dot4_acc(wv, reinterpret_cast<const float4*>(xs[t])[q], acc[t]);
                }
            }
        } else if (valid == DENSE_TOKENS) {
#pragma unroll 4
            for (int c = lane; c < k; c += 32) {
                const float wv = __ldg(wr + c);
#pragma unroll
                for (int t = 0; t < DENSE_TOKENS; ++t) acc[t] = __fmaf_rn(wv, xs[t][c], acc[t]);
            }
        } else {
#pragma unroll 8
            for (int c = lane; c < k; c += 32) {
                const float wv = __ldg(wr + c);
#pragma unroll
                for (int t = 0; t < DENSE_TOKENS; ++t)
                    if ((u64)t < valid) acc[t] = __fmaf_rn(wv, xs[t][c], acc[t]);
            }
        }
#pragma unroll
        for (int t = 0; t < DENSE_TOKENS; ++t) {
            const float v = warp_sum(acc[t]);
            if (lane == 0 && t0 + t < tokens) y[(t0 + t) * (u64)n_out + n] = v;
        }
    }
}
