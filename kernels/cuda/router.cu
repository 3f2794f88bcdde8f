// MoE router: per token, score the E expert logits (softmax or sigmoid), pick the top_k
// experts, write their ids and weights (optionally renormalised to sum 1), token-major.
// Top-k-then-softmax (gpt-oss; llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT): the
// top_k by logit, then the softmax over the picks' logits alone: weight j = exp(l_j - l_0)
// (pick 0 holds the largest logit), renormalised to sum 1 (the plan requires renormalize).
//
// Geometry: one warp per token, ROUTER_WARPS tokens per block, tokens on grid.x. Lane l holds
// experts l, l + 32, ... in registers (E <= 32 * ROUTER_PER_LANE) and pick l (top_k <= 32);
// the plan rejects larger shapes.
// Spare warps of the last block read row tokens - 1 and only their stores are masked, so
// every lane of every warp reaches every shuffle.
//
// Ranking is by logit (NaN counted as -inf): both scorings are strictly increasing in the
// logit, so this is the top-k by score, and it makes the ids bit-exact with the CPU twin
// (no dependence on expf rounding). Ties go to the lowest expert id. Ids are always distinct
// and in [0, E), whatever the logits.

#define ROUTER_WARPS 8
#define ROUTER_PER_LANE 16
#define NO_EXPERT 0x7fffffff
#define SCORING_SOFTMAX 0
#define SCORING_SIGMOID 1
#define SCORING_TOPK_SOFTMAX 2
#define NEG_INF __int_as_float(0xff800000)

// The order the picks follow: larger key first, then lower expert id.
static __device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

extern "C" __global__ void __launch_bounds__(ROUTER_WARPS * 32, 1)
router_topk(const float* __restrict__ logits, u64 tokens, int experts, int top_k, int scoring,
            int renormalize, int* __restrict__ ids, float* __restrict__ weights) {
    GRID_DEPENDENCY_WAIT();
    const int lane = threadIdx.x & 31;
    const u64 token = (u64)blockIdx.x * ROUTER_WARPS + (threadIdx.x >> 5);
    const u64 row = token < tokens ? token : tokens - 1;
    const float* l = logits + row * (u64)experts;

    float key[ROUTER_PER_LANE];
    float local_max = NEG_INF;
#pragma unroll
    for (int i = 0; i < ROUTER_PER_LANE; ++i) {
        const int e = lane + 32 * i;
        const float x = e < experts ? l[e] : NEG_INF;
        key[i] = x == x ? x : NEG_INF;
        local_max = fmaxf(local_max, key[i]);
    }

    // Softmax denominator: per-lane sums in slot order, then the butterfly (the CPU twin
    // replays exactly this order).
    float m = 0.0f, denom = 1.0f;
    if (scoring == SCORING_SOFTMAX) {
        m = warp_max(local_max);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ROUTER_PER_LANE; ++i)
            if (lane + 32 * i < experts) s += expf(key[i] - m);
        denom = warp_sum(s);
    }

    // k rounds of a warp arg-max; the winner's owner lane marks it taken. Lane j keeps pick j
    // (top_k <= 32), so the stores at the end are one coalesced row.
    u32 taken = 0;
    int my_id = 0;
    float my_w = 0.0f, wsum = 0.0f, top = 0.0f;
    for (int j = 0; j < top_k; ++j) {
        float bv = NEG_INF;
        int bi = NO_EXPERT;
#pragma unroll
        for (int i = 0; i < ROUTER_PER_LANE; ++i) {
            const int e = lane + 32 * i;
            if (e < experts && !((taken >> i) & 1u) && ranks_before(key[i], e, bv, bi)) {
                bv = key[i];
                bi = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
            const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (ranks_before(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        // top_k <= E, so an untaken expert always exists: bi is a real id on every lane.
        if (lane == (bi & 31)) taken |= 1u << (bi >> 5);
        if (j == 0) top = bv;  // the largest logit: the picks' softmax max
        const float w = scoring == SCORING_SOFTMAX        ? expf(bv - m) / denom
                        : scoring == SCORING_TOPK_SOFTMAX ? expf(bv - top)
                                                          : 1.0f / (1.0f + expf(-bv));
        wsum += w;
        if (lane == j) {
            my_id = bi;
            my_w = w;
        }
    }

    if (token < tokens && lane < top_k) {  // masked after the last collective
        const u64 out = token * (u64)top_k + (u64)lane;
        ids[out] = my_id;
        weights[out] = renormalize ? my_w / wsum : my_w;
    }
}
