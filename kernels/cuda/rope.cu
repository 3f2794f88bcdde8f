// Rotary position embedding, NEOX style (qwen3): within each head of d floats, the pairs
// (i, i + d/2), i < d/2, rotate by the angle pos[t] * freq[i]:
//   y[i] = x[i] cos - x[i + d/2] sin,   y[i + d/2] = x[i] sin + x[i + d/2] cos.
// x is [tokens, heads, d] (Q or K: one launch per tensor); positions are [tokens] i32 and restart
// per sequence. freq[i] = theta^(-2i/d) in f32 as llama.cpp's CUDA backend computes it
// (powf(powf(theta, -2/d), i)), made on the host: d/2 floats, nothing that grows with tokens.
//
// Geometry: a grid-stride loop over the (token, head, i) items, tokens x heads x d/2 of them
// (64-bit), one rotated pair per item: a decode step's single token still spreads over
// heads x d/2 threads (one thread per (token, i) looping over the heads was ~15 us for Q at one
// token, latency-bound). Consecutive threads take consecutive i, so each head's loads and
// stores are coalesced. No collectives. y may alias x (in place): each pair is read and written
// by the same thread. The angle depends on (t, i) only and is recomputed per head: the same f32
// product, so the same sincosf result.
// The angle is one f32 product and the rotation is spelled out with _rn intrinsics (no FMA
// contraction), so the CPU twin repeats it exactly: only sincosf (2 ulp) differs from the host.
// Element offsets t * heads * d pass 2^31 at 524,288 tokens for Q (32 heads of 128): 64-bit.
// YaRN (gpt-oss; llama.cpp's rope_yarn, ext_factor 1): the host's table holds each pair's
// blended frequency theta^(-2i/d) * (freq_scale * (1 - ramp_i) + ramp_i), and cos and sin are
// scaled by mscale (attn_factor * (1 + 0.1 ln(1 / freq_scale))); plain RoPE passes mscale 1,
// an exact product.

#define ROPE_THREADS 256

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
rope_neox(const float* x, float* y, const int* __restrict__ pos, const float* __restrict__ freq, u64 tokens, int heads,
          int half, float mscale) {
    GRID_DEPENDENCY_WAIT();
    const u64 per_token = (u64)heads * (u64)half;
    const u64 items = tokens * per_token;
    const u64 head = 2 * (u64)half;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 it = (u64)blockIdx.x * blockDim.x + threadIdx.x; it < items; it += stride) {
        const u64 t = it / per_token;
        const u64 r = it - t * per_token;
        const u64 h = r / (u64)half;
        const u64 i = r - h * (u64)half;
        float s, c;
        sincosf(__fmul_rn((float)pos[t], freq[i]), &s, &c);
        s = __fmul_rn(s, mscale);
        c = __fmul_rn(c, mscale);
        const u64 a = (t * (u64)heads + h) * head + i;
        const float x0 = x[a], x1 = x[a + half];
        y[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        y[a + half] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
}
