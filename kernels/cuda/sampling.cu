// Sampling: one token id per row of logits [R, V] f32 (V = vocab), with per-row parameters.
// temperature <= 0 (or NaN): argmax. Otherwise temperature, top-k, top-p (nucleus), then the
// inverse-CDF pick at the row's uniform number u in [0, 1).
//
// Ranking: by logit descending, ties to the lowest id, NaN counted as -inf. It is the order of
// the composite key ckey = orderable(logit) << 32 | ~id, distinct for every element, so "the n
// best" is always the exact set {ckey >= theta} of the n-th best key theta.
//
// Arithmetic, bit-exact with the CPU twin (sampling.rs), so ids match exactly for any u:
// - mass q = trunc(exp((l - m) * (1 / T)) * 2^32) as u64, m the max logit: 2^32 for the max, 0
//   for -inf / NaN and below exp(-32) (under 2^-32 of the max's probability: never sampled).
//   exp is sample_exp, built only from IEEE-rounded intrinsics (no contraction, no hardware
//   approximation). Masses are integers, so every sum is exact in any summation order.
// - top-k keeps the k best (top_k <= 0 or >= V: all); Z_k is their mass.
// - top-p keeps the shortest prefix of the ranking whose mass reaches t_p = ceil(top_p * Z_k)
//   (exact, sample_scale; at least 1; top_p >= 1 or NaN: no cut); Z is its mass.
// - the pick is the first candidate in ranking order whose cumulative mass exceeds
//   t = floor(u * Z) (exact; at most Z - 1; a negative or NaN u counts as 0).
//
// Selection without sorting: a radix select over the composite key, 8 bits per level from the
// top. A level streams the row and builds a 256-bin histogram (count, weight) of the candidates
// whose higher digits match the prefix chosen so far; warp 0 scans the bins from the top for the
// one where the cumulative weight passes the target; it stops as soon as that bin holds a single
// element (at the latest after 8 levels: keys are distinct). The weight is 1 for top-k (the k-th
// best) and the mass for top-p and the pick. Histogram updates are aggregated per warp and bin
// (__match_any_sync, __reduce_add_sync over the lanes of one bin): the few bins that hold most of
// a row at the first level cost one shared atomic per warp, not one per element.
//
// Geometry: one block of SAMPLE_THREADS per row, rows on grid.x (they grow with the batch); the
// vocabulary is streamed in block-stride loops. The loop with warp collectives runs the same trip
// count on every thread (lanes past V take part with no bin). Every __syncthreads is reached by
// the whole block: the early exit of greedy rows depends only on the row's parameters and its
// max, the same for every thread. Row offsets are 64-bit (R * V passes 2^31 at 14,135 rows for
// V = 151,936).

#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SAMPLE_UNROLL 8                                 // elements a thread loads before using them
#define SAMPLE_CHUNK (SAMPLE_THREADS * SAMPLE_UNROLL)  // elements a block takes per step
#define SAMPLE_BINS 256
#define SAMPLE_NO_BIN 256u
#define SAMPLE_ONE 4294967296.0f  // 2^32: the mass of the max logit
#define SAMPLE_MIN_Z (-32.0f)     // exp(-32) * 2^32 < 1: lower z have mass 0
#define SAMPLE_NEG_INF __int_as_float(0xff800000)

// The per-row parameters (`SamplingParams` in sampling.rs, same layout).
struct SamplingParams {
    float temperature;
    int top_k;
    float top_p;
    float u;
};

// exp(z) for z in [-32, 0]: z = n ln2 + r (Cody-Waite, |r| <= ln2 / 2), e^r by its degree-7
// Taylor polynomial (Horner on fmaf), times 2^n (exact: n >= -47 keeps it normal).
static __device__ __forceinline__ float sample_exp(float z) {
    const int n = __float2int_rn(__fmul_rn(z, __int_as_float(0x3fb8aa3b)));  // z * log2(e)
    const float fn = (float)n;
    float r = __fmaf_rn(fn, -__int_as_float(0x3f317200), z);  // ln2, high part
    r = __fmaf_rn(fn, -__int_as_float(0x35bfbe8e), r);        // ln2, low part
    float p = __int_as_float(0x39500d01);                     // 1/7!
    p = __fmaf_rn(p, r, __int_as_float(0x3ab60b61));          // 1/6!
    p = __fmaf_rn(p, r, __int_as_float(0x3c088889));          // 1/5!
    p = __fmaf_rn(p, r, __int_as_float(0x3d2aaaab));          // 1/4!
    p = __fmaf_rn(p, r, __int_as_float(0x3e2aaaab));          // 1/3!
    p = __fmaf_rn(p, r, 0.5f);
    p = __fmaf_rn(p, r, 1.0f);
    p = __fmaf_rn(p, r, 1.0f);
    return __fmul_rn(p, __int_as_float((n + 127) << 23));
}

static __device__ __forceinline__ u64 sample_mass(float x, float m, float inv_t) {
    if (!(x > SAMPLE_NEG_INF)) return 0;  // -inf and NaN
    if (x == m) return 1ull << 32;        // also +inf == +inf
    const float z = __fmul_rn(__fsub_rn(x, m), inv_t);
    if (!(z >= SAMPLE_MIN_Z)) return 0;   // also NaN (-inf * 0 when T = inf)
    return __float2ull_rz(__fmul_rn(sample_exp(z), SAMPLE_ONE));
}

static __device__ __forceinline__ u64 sample_key(float x, u32 i) {
    u32 b = __float_as_uint(x == x ? x : SAMPLE_NEG_INF);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)b << 32) | (u64)(~i);
}

static __device__ __forceinline__ float sample_key_logit(u64 k) {
    const u32 b = (u32)(k >> 32);
    return __uint_as_float((b & 0x80000000u) ? (b & 0x7fffffffu) : ~b);
}

static __device__ __forceinline__ int sample_key_id(u64 k) {
    return (int)~(u32)k;
}

// floor(f * z), or ceil when `round_up`, exactly (128-bit product) for f in [0, 1].
static __device__ __forceinline__ u64 sample_scale(float f, u64 z, bool round_up) {
    const u32 bits = __float_as_uint(f);
    const u32 e = bits >> 23;  // f >= 0: no sign bit
    const u64 m = (bits & 0x7fffffu) | (e ? 0x800000u : 0u);
    const int s = e ? 150 - (int)e : 149;  // f = m * 2^-s, s >= 23
    const u64 lo = m * z, hi = __umul64hi(m, z);
    u64 q, rem;
    if (s >= 128) {
        q = 0;
        rem = lo | hi;
    } else if (s >= 64) {
        q = hi >> (s - 64);
        rem = lo | (hi & ((1ull << (s - 64)) - 1));
    } else {
        q = (lo >> s) | (hi << (64 - s));
        rem = lo & ((1ull << s) - 1);
    }
    return q + (round_up && rem != 0 ? 1 : 0);
}

// Element j of the step at i0 that this thread owns is i0 + j * SAMPLE_THREADS + threadIdx.x
// (coalesced per j). All SAMPLE_UNROLL loads are issued before any is used: one row is streamed
// by one block, so its speed is the number of loads in flight. Past the row: -inf, flagged by
// the caller through the index.
static __device__ __forceinline__ void sample_load(const float* __restrict__ l, u32 vocab, u32 i0, float x[SAMPLE_UNROLL]) {
#pragma unroll
    for (int j = 0; j < SAMPLE_UNROLL; ++j) {
        const u32 i = i0 + j * SAMPLE_THREADS + threadIdx.x;
        x[j] = i < vocab ? l[i] : SAMPLE_NEG_INF;
    }
}

struct SampleShared {
    u32 count[SAMPLE_BINS];
    u64 weight[SAMPLE_BINS];
    u64 key[SAMPLE_BINS];  // when the bin holds one element, its key (atomicMax: no racing stores)
    u64 scratch[SAMPLE_WARPS];
    u32 bin;     // the bin chosen at this level
    u64 before;  // weight of the prefix's candidates in the bins above it
};

// Max (MAX) or sum of v over the block; every thread gets the result.
template <bool MAX>
static __device__ __forceinline__ u64 block_reduce(u64 v, u64* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u64 other = __shfl_xor_sync(FULL_MASK, v, o);
        v = MAX ? (other > v ? other : v) : v + other;
    }
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < SAMPLE_WARPS ? scratch[lane] : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u64 other = __shfl_xor_sync(FULL_MASK, v, o);
        v = MAX ? (other > v ? other : v) : v + other;
    }
    __syncthreads();  // scratch is free again
    return v;
}

// The candidate found by a selection, and the total weight of the candidates ranked up to and
// including it.
struct SampleHit {
    u64 key;
    u64 through;
};

// Among the candidates (ckey >= theta), the one at which the cumulative weight in ranking order
// first exceeds `target` (which must be below their total weight). Weight: the mass when
// `by_mass`, else 1.
static __device__ __forceinline__ SampleHit sample_select(const float* __restrict__ l, u32 vocab, u64 theta, bool by_mass,
                                                          u64 target, float m, float inv_t, SampleShared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 prefix = 0, above = 0;
    for (int shift = 56;; shift -= 8) {
        for (int b = threadIdx.x; b < SAMPLE_BINS; b += SAMPLE_THREADS) {
            sh.count[b] = 0;
            sh.weight[b] = 0;
            sh.key[b] = 0;
        }
        __syncthreads();
        const u64 high = shift == 56 ? 0 : ~0ull << (shift + 8);  // the digits chosen so far
        for (u32 i0 = 0; i0 < vocab; i0 += SAMPLE_CHUNK) {
            float xs[SAMPLE_UNROLL];
            sample_load(l, vocab, i0, xs);
#pragma unroll
            for (int j = 0; j < SAMPLE_UNROLL; ++j) {
                const u32 i = i0 + j * SAMPLE_THREADS + threadIdx.x;
                const u64 k = sample_key(xs[j], i);
                const bool in = i < vocab && k >= theta && (k & high) == prefix;
                const u32 bin = in ? (u32)(k >> shift) & 0xffu : SAMPLE_NO_BIN;
                // Warp-uniform: at the deeper levels most warps hold no candidate at all.
                if (!__any_sync(FULL_MASK, in)) continue;
                const u64 wt = !in ? 0 : by_mass ? sample_mass(xs[j], m, inv_t) : 1;
                // Every lane, with a bin or not: the lanes of one bin sum their weights (<= 2^32
                // each, summed as 16-bit halves so the u32 reductions cannot overflow).
                const u32 peers = __match_any_sync(FULL_MASK, bin);
                const u32 lo = __reduce_add_sync(peers, (u32)(wt & 0xffffu));
                const u32 hi = __reduce_add_sync(peers, (u32)(wt >> 16));
                if (in && lane == __ffs(peers) - 1) {
                    atomicAdd(&sh.count[bin], (u32)__popc(peers));
                    atomicAdd(&sh.weight[bin], ((u64)hi << 16) + (u64)lo);
                    atomicMax(&sh.key[bin], k);
                }
            }
        }
        __syncthreads();
        if (warp == 0) {
            // Lane j owns bins 255 - 8j down to 248 - 8j: descending bins are ranking order.
            u64 part = 0;
            for (int j = 0; j < 8; ++j) part += sh.weight[255 - 8 * lane - j];
            u64 incl = part;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u64 v = __shfl_up_sync(FULL_MASK, incl, o);
                if (lane >= o) incl += v;
            }
            u64 before = incl - part;
            if (before <= target && target < incl) {  // exactly one lane
                for (int j = 0; j < 8; ++j) {
                    const int b = 255 - 8 * lane - j;
                    if (before + sh.weight[b] > target) {
                        sh.bin = b;
                        sh.before = before;
                        break;
                    }
                    before += sh.weight[b];
                }
            }
        }
        __syncthreads();
        const u32 b = sh.bin;
        target -= sh.before;
        above += sh.before;
        prefix |= (u64)b << shift;
        const bool found = sh.count[b] == 1 || shift == 0;  // block-uniform
        const SampleHit hit = {sh.key[b], above + sh.weight[b]};
        __syncthreads();  // every thread has read the bins before they are cleared again
        if (found) return hit;
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 2)
sampling_rows(const float* __restrict__ logits, int vocab, const SamplingParams* __restrict__ params, int* __restrict__ ids) {
    GRID_DEPENDENCY_WAIT();
    __shared__ SampleShared sh;
    const u64 row = blockIdx.x;
    const float* l = logits + row * (u64)vocab;
    const SamplingParams p = params[row];
    const u32 v = (u32)vocab;

    u64 best = 0;
    for (u32 i0 = 0; i0 < v; i0 += SAMPLE_CHUNK) {
        float xs[SAMPLE_UNROLL];
        sample_load(l, v, i0, xs);
#pragma unroll
        for (int j = 0; j < SAMPLE_UNROLL; ++j) {
            const u32 i = i0 + j * SAMPLE_THREADS + threadIdx.x;
            const u64 k = i < v ? sample_key(xs[j], i) : 0;
            best = k > best ? k : best;
        }
    }
    best = block_reduce<true>(best, sh.scratch);
    const float m = sample_key_logit(best);
    // Greedy, or nothing to weigh (every logit -inf or NaN): the best candidate.
    if (!(p.temperature > 0.0f) || m == SAMPLE_NEG_INF) {
        if (threadIdx.x == 0) ids[row] = sample_key_id(best);
        return;
    }
    const float inv_t = __frcp_rn(p.temperature);

    const u64 k = p.top_k <= 0 || p.top_k >= vocab ? (u64)vocab : (u64)p.top_k;
    u64 theta = k < (u64)vocab ? sample_select(l, v, 0, false, k - 1, m, inv_t, sh).key : 0;

    u64 z = 0;
    for (u32 i0 = 0; i0 < v; i0 += SAMPLE_CHUNK) {
        float xs[SAMPLE_UNROLL];
        sample_load(l, v, i0, xs);
#pragma unroll
        for (int j = 0; j < SAMPLE_UNROLL; ++j) {
            const u32 i = i0 + j * SAMPLE_THREADS + threadIdx.x;
            if (i < v && sample_key(xs[j], i) >= theta) z += sample_mass(xs[j], m, inv_t);
        }
    }
    z = block_reduce<false>(z, sh.scratch);  // >= 2^32: the max is always a candidate

    if (p.top_p < 1.0f) {
        const u64 t_p = sample_scale(p.top_p > 0.0f ? p.top_p : 0.0f, z, true);
        const SampleHit cut = sample_select(l, v, theta, true, (t_p > 1 ? t_p : 1) - 1, m, inv_t, sh);
        theta = cut.key;
        z = cut.through;
    }
    const u64 t = sample_scale(p.u > 0.0f ? fminf(p.u, 1.0f) : 0.0f, z, false);
    const SampleHit pick = sample_select(l, v, theta, true, t < z ? t : z - 1, m, inv_t, sh);
    if (threadIdx.x == 0) ids[row] = sample_key_id(pick.key);
}
