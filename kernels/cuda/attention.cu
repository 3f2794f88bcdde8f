// Attention over the f16 KV cache: causal prefill (flash-attention style, online softmax) and
// decode (flash-decoding: the context split over blocks, then a combine).
//
// Layouts (element offsets are 64-bit: a cache of 327,680 blocks x 16 positions x 4 x 128 passes
// 2^31, and so do Q/O at 524,288 rows of 32 x 128):
//   q, out   [rows, n_head, D] f32 (q already normed and RoPE'd)
//   k/v      [num_blocks, block_size, n_kv, D] f16 bits (paged: block_size = 1 << shift)
//   table    int32 block ids, the block tables of every chunk, flattened
//   chunks   AttChunk {table, start_pos, n_tokens, first_row}: rows first_row.. of the batch sit at
//            positions start_pos.. of the sequence whose block table starts at table[table], and
//            query i sees the sequence's positions 0 ..= start_pos + i. Position p lives in cache
//            row table[table + (p >> shift)] << shift | (p & mask) (att_stage); the host checks
//            that every entry a chunk reads exists and is below num_blocks.
// GQA: query head h reads kv head h / (n_head / n_kv). Scores are taken in log2 units: q is
// scaled by scale * log2(e) once, then softmax uses exp2f (the CPU twin does the same).
// Sliding window (llama.cpp's LLAMA_SWA_TYPE_STANDARD, llama_hparams::is_masked_swa): with
// window > 0 the query at position q sees key p only when q - p < window, i.e. keys
// max(0, q - window + 1) ..= q; window 0 is plain causal attention. Whole key tiles and decode
// spans before the first row's window are neither loaded nor scored; keys staged below a
// row's window repeat the tile's first visible key (loads never leave the window) and are -inf.
// Sinks (gpt-oss; ggml_soft_max_ext with sinks): sinks null, or one f32 logit per query head,
// in natural-log units like scale * q.k; the softmax's max is taken over the scores and the
// sink, its denominator gains exp(sink - max), the sink adds no value. In log2 units the sink
// is sinks[h] * log2(e). Prefill starts each row's online softmax at (m = sink, l = 1); decode
// adds it in the combine, once per (chunk, head). sinks == null and window == 0 take exactly
// the arithmetic of plain causal attention.
//
// attn_prefill_d{64,128,256}: grid (query tiles, n_head), 128 threads. A tile is BQ rows of one
//   chunk (tiles of all chunks flattened on grid.x through tiles[]: {chunk, first query}). The
//   block stages its Q tile (scaled, f32) in shared memory, then for each BK-key tile stages K
//   (f16 -> f32), takes S = Q K^T, updates the running max / sum, stages V, accumulates O += P V.
//   Thread t = 8 * qg + g: rows qg*TQ .. +TQ; keys j*8 + g of a tile (S); dims c*32 + g*4 .. +4 of
//   a row (O). The 8 lanes of a query group are aligned in one warp: row max and sum are 3-step
//   xor shuffles, and P reaches the PV lanes by width-8 shuffles (no shared memory for P).
//   Rows past the chunk's end repeat its last row (valid loads, finite values), take part in
//   every shuffle and __syncthreads, and are masked at the store. The key-tile loop bound is
//   block-uniform (the tile's last row); keys past each row's causal limit are -inf, and loads
//   past the tile's last key repeat that key. Without a window key 0 is visible to every row, so
//   the first tile gives each row a finite max; with one a row may see nothing in the first tiles
//   (the tile loop starts at the first row's window): while a row's max is -inf its exponents are
//   taken against 0 (exp2(-inf - 0) = 0), never (-inf) - (-inf). Its own key is in a later tile.
// attn_decode_d{64,128,256}: grid (splits of all decode chunks, n_head / hb), 128 threads. A
//   block takes DEC_SPAN keys of one 1-token chunk for hb heads sharing a kv head (K and V read
//   once for the group): scores into shared memory, an exact max and sum over the span, the
//   partial o = sum p v, written with (max, sum) to the workspace at index blockIdx.x. With a
//   window the plan lists only the spans from the one holding the window's first key: each holds
//   at least one visible key, so every partial's max is finite.
// attn_decode_combine: grid (decode chunks, n_head): merges a chunk's partials
//   (o = sum_s o_s 2^(m_s - M) / (sum_s l_s 2^(m_s - M) [+ 2^(sink - M)]), M over the partials'
//   maxima [and the sink]) into its output row.

#define ATT_THREADS 128
#define ATT_PAD 4                  // floats after each staged row: spreads banks, keeps 16 B alignment
#define DEC_SPAN 64                // keys per decode split
#define DEC_MAX_HB 8               // heads per decode block at most
#define DEC_TILE_FLOATS 8192       // keys x D staged at once by the decode kernel
#define ATT_NEG_INF __int_as_float(0xff800000)
#define ATT_LOG2E 1.44269504088896340736f  // log2(e), rounded to f32 as Rust's f32::consts::LOG2_E

// Head h's sink in log2 units, or -inf without sinks.
static __device__ __forceinline__ float att_sink(const float* __restrict__ sinks, int h) {
    return sinks ? sinks[h] * ATT_LOG2E : ATT_NEG_INF;
}

struct __align__(16) AttChunk {
    int table, start_pos, n_tokens, first_row;
};

// Element offset of (cache row, kv head) in a cache.
static __device__ __forceinline__ u64 att_kv_offset(u64 row, int n_kv, int kvh, int d) {
    return (row * (u64)n_kv + (u64)kvh) * (u64)d;
}

static __device__ __forceinline__ float4 att_f16x4(u32 lo, u32 hi) {
    float4 r;
    r.x = f16_to_f32((u16)(lo & 0xffffu));
    r.y = f16_to_f32((u16)(lo >> 16));
    r.z = f16_to_f32((u16)(hi & 0xffffu));
    r.w = f16_to_f32((u16)(hi >> 16));
    return r;
}

// Stages keys k0 .. k0 + ROWS - 1 of one kv head into s ([ROWS][D + ATT_PAD] f32), 16 bytes of
// f16 per load; keys past kmax repeat kmax and keys below kmin repeat kmin (kmin <= kmax; valid
// memory: the table covers kmin ..= kmax; the callers mask them). Key p lives in cache row
// tab[p >> shift] << shift | (p & mask): one table load per staged key row, by one thread, into
// blk[]. A barrier inside: every thread calls this (the callers' loop bounds are block-uniform),
// and the callers' own barrier before each call keeps the previous call's readers of blk[] done
// before it is rewritten.
template <int D, int ROWS>
static __device__ __forceinline__ void att_stage(float* s, const u16* __restrict__ cache, const int* __restrict__ tab, int shift,
                                                 int k0, int kmin, int kmax, int n_kv, int kvh) {
    constexpr int V8 = D / 8;
    constexpr int LD = D + ATT_PAD;
    __shared__ int blk[ROWS];
    for (int r = threadIdx.x; r < ROWS; r += ATT_THREADS) blk[r] = tab[max(min(k0 + r, kmax), kmin) >> shift];
    __syncthreads();
    for (int e = threadIdx.x; e < ROWS * V8; e += ATT_THREADS) {
        const int r = e / V8, c = e - r * V8;
        const int key = max(min(k0 + r, kmax), kmin);
        const u64 row = ((u64)(u32)blk[r] << shift) | (u64)(key & ((1 << shift) - 1));
        const uint4 raw = *(const uint4*)(cache + att_kv_offset(row, n_kv, kvh, D) + (u64)c * 8);
        float* dst = s + r * LD + c * 8;
        *(float4*)dst = att_f16x4(raw.x, raw.y);
        *(float4*)(dst + 4) = att_f16x4(raw.z, raw.w);
    }
}

static __device__ __forceinline__ float att_dot4(float4 a, float4 b, float acc) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

// TQ rows and TK keys per thread: BQ = 16 TQ query rows, BK = 8 TK keys per tile.
template <int D, int TQ, int TK>
static __device__ __forceinline__ void att_prefill(const float* __restrict__ q, const u16* __restrict__ kc,
                                                   const u16* __restrict__ vc, float* __restrict__ out,
                                                   const AttChunk* __restrict__ chunks, const int2* __restrict__ tiles,
                                                   const int* __restrict__ table, int n_head, int n_kv, int shift, float qscale,
                                                   int window, const float* __restrict__ sinks) {
    constexpr int BQ = 16 * TQ;
    constexpr int BK = 8 * TK;
    constexpr int LD = D + ATT_PAD;
    constexpr int TD = D / 8;  // output dims per thread
    extern __shared__ __align__(16) float att_smem[];
    float* sq = att_smem;            // [BQ][LD]
    float* skv = att_smem + BQ * LD; // [BK][LD]: K, then V, of the current key tile

    const int2 tile = tiles[blockIdx.x];
    const AttChunk ch = chunks[tile.x];
    const int q0 = tile.y;
    const int nq = min(BQ, ch.n_tokens - q0);
    const int h = blockIdx.y;
    const int kvh = h / (n_head / n_kv);
    const int t = threadIdx.x, g = t & 7, qg = t >> 3;
    const int* __restrict__ tab = table + (u64)(u32)ch.table;  // the chunk's block table

    for (int e = t; e < BQ * (D / 4); e += ATT_THREADS) {
        const int r = e / (D / 4), c = e - r * (D / 4);
        const u64 row = (u64)ch.first_row + (u64)(q0 + min(r, nq - 1));
        float4 v = *(const float4*)(q + (row * (u64)n_head + (u64)h) * (u64)D + (u64)c * 4);
        v.x *= qscale; v.y *= qscale; v.z *= qscale; v.w *= qscale;
        *(float4*)(sq + r * LD + c * 4) = v;
    }

    // The sink starts each row's softmax: max = sink, sum = 2^(sink - sink) = 1, o = 0.
    const float sink = att_sink(sinks, h);
    float o[TQ][TD], m[TQ], l[TQ];
    int lim[TQ], lo[TQ];
#pragma unroll
    for (int i = 0; i < TQ; ++i) {
        m[i] = sink;                   // -inf without sinks
        l[i] = sinks ? 1.0f : 0.0f;
        lim[i] = ch.start_pos + q0 + min(qg * TQ + i, nq - 1);
        lo[i] = window > 0 ? lim[i] - window + 1 : 0;  // the row's first key (may be < 0: none masked below)
#pragma unroll
        for (int c = 0; c < TD; ++c) o[i][c] = 0.0f;
    }
    const int kmax = ch.start_pos + q0 + nq - 1;  // the last key any row of the tile sees
    const int kmin = window > 0 ? max(0, ch.start_pos + q0 - window + 1) : 0;  // the first (row 0's window)
    const int n_kt = kmax / BK + 1;               // block-uniform, as is the first tile
    const int kt0 = kmin / BK;                    // tiles before the first row's window are skipped

    for (int kt = kt0; kt < n_kt; ++kt) {
        const int k0 = kt * BK;
        __syncthreads();  // Q staged (first tile); every warp done with the previous V tile
        att_stage<D, BK>(skv, kc, tab, shift, k0, kmin, kmax, n_kv, kvh);
        __syncthreads();
        float s[TQ][TK];
#pragma unroll
        for (int i = 0; i < TQ; ++i)
#pragma unroll
            for (int j = 0; j < TK; ++j) s[i][j] = 0.0f;
#pragma unroll 2
        for (int d = 0; d < D; d += 4) {
            float4 qv[TQ];
#pragma unroll
            for (int i = 0; i < TQ; ++i) qv[i] = *(const float4*)(sq + (qg * TQ + i) * LD + d);
#pragma unroll
            for (int j = 0; j < TK; ++j) {
                const float4 kv = *(const float4*)(skv + (j * 8 + g) * LD + d);
#pragma unroll
                for (int i = 0; i < TQ; ++i) s[i][j] = att_dot4(qv[i], kv, s[i][j]);
            }
        }
#pragma unroll
        for (int i = 0; i < TQ; ++i) {
            float mx = ATT_NEG_INF;
#pragma unroll
            for (int j = 0; j < TK; ++j) {
                const int key = k0 + j * 8 + g;
                if (key > lim[i] || key < lo[i]) s[i][j] = ATT_NEG_INF;
                mx = fmaxf(mx, s[i][j]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 4));
            const float m_new = fmaxf(m[i], mx);
            // Nothing seen yet (a window's first tiles, no sink): exponents against 0, all 0.
            const float m_use = m_new == ATT_NEG_INF ? 0.0f : m_new;
            const float alpha = exp2f(m[i] - m_use);  // 0 on the first visible tile (m = -inf)
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < TK; ++j) {
                s[i][j] = exp2f(s[i][j] - m_use);  // masked keys: exp2(-inf) = 0
                sum += s[i][j];
            }
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(FULL_MASK, sum, 2);
            sum += __shfl_xor_sync(FULL_MASK, sum, 4);
            l[i] = l[i] * alpha + sum;
            m[i] = m_new;
#pragma unroll
            for (int c = 0; c < TD; ++c) o[i][c] *= alpha;
        }
        __syncthreads();  // every warp done with K
        att_stage<D, BK>(skv, vc, tab, shift, k0, kmin, kmax, n_kv, kvh);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < TK; ++j) {
#pragma unroll
            for (int src = 0; src < 8; ++src) {
                float p[TQ];
#pragma unroll
                for (int i = 0; i < TQ; ++i) p[i] = __shfl_sync(FULL_MASK, s[i][j], src, 8);
                const float* vr = skv + (j * 8 + src) * LD + g * 4;
#pragma unroll
                for (int c = 0; c < TD / 4; ++c) {
                    const float4 v = *(const float4*)(vr + c * 32);
#pragma unroll
                    for (int i = 0; i < TQ; ++i) {
                        o[i][4 * c] = fmaf(p[i], v.x, o[i][4 * c]);
                        o[i][4 * c + 1] = fmaf(p[i], v.y, o[i][4 * c + 1]);
                        o[i][4 * c + 2] = fmaf(p[i], v.z, o[i][4 * c + 2]);
                        o[i][4 * c + 3] = fmaf(p[i], v.w, o[i][4 * c + 3]);
                    }
                }
            }
        }
    }

#pragma unroll
    for (int i = 0; i < TQ; ++i) {
        const int r = qg * TQ + i;
        if (r < nq) {
            const u64 row = (u64)ch.first_row + (u64)(q0 + r);
            const float inv = 1.0f / l[i];  // l >= 1: the row's max term (its own key or the sink) is exp2(0)
            float* dst = out + (row * (u64)n_head + (u64)h) * (u64)D + g * 4;
#pragma unroll
            for (int c = 0; c < TD / 4; ++c) {
                float4 v;
                v.x = o[i][4 * c] * inv;
                v.y = o[i][4 * c + 1] * inv;
                v.z = o[i][4 * c + 2] * inv;
                v.w = o[i][4 * c + 3] * inv;
                *(float4*)(dst + c * 32) = v;
            }
        }
    }
}

#define ATT_PREFILL(D, TQ, TK)                                                                                              \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                              \
    attn_prefill_d##D(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,                  \
                      float* __restrict__ out, const AttChunk* __restrict__ chunks, const int2* __restrict__ tiles,         \
                      const int* __restrict__ table, int n_head, int n_kv, int shift, float qscale, int window,             \
                      const float* __restrict__ sinks) {                                                                    \
        GRID_DEPENDENCY_WAIT();                                                                                             \
        att_prefill<D, TQ, TK>(q, kc, vc, out, chunks, tiles, table, n_head, n_kv, shift, qscale, window, sinks);          \
    }

// (D, TQ, TK): tiles of 64 rows x 64 keys for D 64 and 128, 32 x 32 for D 256 (registers: TQ*D/8
// accumulators per thread; shared memory (BQ + BK) * (D + 4) * 4 bytes).
ATT_PREFILL(64, 4, 8)
ATT_PREFILL(128, 4, 8)
ATT_PREFILL(256, 2, 4)

template <int D>
static __device__ __forceinline__ void att_decode(const float* __restrict__ q, const u16* __restrict__ kc,
                                                  const u16* __restrict__ vc, float* __restrict__ part_o,
                                                  float* __restrict__ part_ml, const AttChunk* __restrict__ chunks,
                                                  const int2* __restrict__ work, const int* __restrict__ table, int n_head,
                                                  int n_kv, int shift, int hb, float qscale, int window) {
    constexpr int LD = D + ATT_PAD;
    constexpr int KT = DEC_TILE_FLOATS / D < DEC_SPAN ? DEC_TILE_FLOATS / D : DEC_SPAN;  // keys staged at once: 64, 64, 32
    constexpr int NSUB = DEC_SPAN / KT;
    constexpr int NO = DEC_MAX_HB * D / ATT_THREADS;   // outputs per thread at hb = DEC_MAX_HB
    extern __shared__ __align__(16) float att_smem[];
    float* sq = att_smem;                     // [DEC_MAX_HB][D]
    float* ss = sq + DEC_MAX_HB * D;          // [DEC_MAX_HB][DEC_SPAN]: scores, then p
    float* skv = ss + DEC_MAX_HB * DEC_SPAN;  // [KT][LD]

    const int2 w = work[blockIdx.x];
    // Padding of a captured graph's grid (BatchPlan::pad_decode_splits): the whole block leaves
    // before any barrier, and the combine never reads its partials.
    if (w.x < 0) return;
    const AttChunk ch = chunks[w.x];
    const int pos = ch.start_pos;  // the query's position: it sees keys lo ..= pos
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    const int k0 = w.y * DEC_SPAN;
    const int h0 = blockIdx.y * hb;
    const int kvh = h0 / (n_head / n_kv);
    const int t = threadIdx.x;
    const int* __restrict__ tab = table + (u64)(u32)ch.table;  // the chunk's block table
    const u64 qrow = ((u64)ch.first_row * (u64)n_head + (u64)h0) * (u64)D;  // heads h0.. are contiguous

    for (int e = t; e < hb * D; e += ATT_THREADS) sq[e] = q[qrow + (u64)e] * qscale;

    for (int sub = 0; sub < NSUB; ++sub) {
        __syncthreads();  // Q staged; every thread done with the previous K tile
        att_stage<D, KT>(skv, kc, tab, shift, k0 + sub * KT, lo, pos, n_kv, kvh);
        __syncthreads();
        const int kk = t % KT;
        const int key = k0 + sub * KT + kk;
        for (int hg = t / KT; hg < hb; hg += ATT_THREADS / KT) {
            float acc = 0.0f;
            for (int d = 0; d < D; d += 4)
                acc = att_dot4(*(const float4*)(sq + hg * D + d), *(const float4*)(skv + kk * LD + d), acc);
            ss[hg * DEC_SPAN + sub * KT + kk] = key <= pos && key >= lo ? acc : ATT_NEG_INF;
        }
    }
    __syncthreads();

    // Exact softmax pieces over the span, a warp per head (warp-uniform loop). Every span the
    // plan lists holds a visible key (k0 <= pos, and lo <= k0 + DEC_SPAN - 1), so the max is finite.
    const int warp = t >> 5, lane = t & 31;
    for (int hg = warp; hg < hb; hg += ATT_THREADS / 32) {
        float v[DEC_SPAN / 32];
        float mx = ATT_NEG_INF;
#pragma unroll
        for (int i = 0; i < DEC_SPAN / 32; ++i) {
            v[i] = ss[hg * DEC_SPAN + lane + 32 * i];
            mx = fmaxf(mx, v[i]);
        }
        mx = warp_max(mx);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < DEC_SPAN / 32; ++i) {
            v[i] = exp2f(v[i] - mx);
            ss[hg * DEC_SPAN + lane + 32 * i] = v[i];
            sum += v[i];
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            const u64 at = ((u64)blockIdx.x * (u64)n_head + (u64)(h0 + hg)) * 2;
            part_ml[at] = mx;
            part_ml[at + 1] = sum;
        }
    }

    float acc[NO];
#pragma unroll
    for (int i = 0; i < NO; ++i) acc[i] = 0.0f;
    for (int sub = 0; sub < NSUB; ++sub) {
        __syncthreads();  // p written (first); every thread done with the previous V tile
        att_stage<D, KT>(skv, vc, tab, shift, k0 + sub * KT, lo, pos, n_kv, kvh);
        __syncthreads();
        const float* ps = ss + sub * KT;
#pragma unroll 4
        for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
            for (int i = 0; i < NO; ++i) {
                const int o = t + ATT_THREADS * i;
                if (o / D < hb) acc[i] = fmaf(ps[(o / D) * DEC_SPAN + kk], skv[kk * LD + o % D], acc[i]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NO; ++i) {
        const int o = t + ATT_THREADS * i, hg = o / D, d = o % D;
        if (hg < hb) part_o[((u64)blockIdx.x * (u64)n_head + (u64)(h0 + hg)) * (u64)D + (u64)d] = acc[i];
    }
}

#define ATT_DECODE(D)                                                                                                       \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                              \
    attn_decode_d##D(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,                   \
                     float* __restrict__ part_o, float* __restrict__ part_ml, const AttChunk* __restrict__ chunks,          \
                     const int2* __restrict__ work, const int* __restrict__ table, int n_head, int n_kv, int shift, int hb,  \
                     float qscale, int window) {                                                                            \
        GRID_DEPENDENCY_WAIT();                                                                                             \
        att_decode<D>(q, kc, vc, part_o, part_ml, chunks, work, table, n_head, n_kv, shift, hb, qscale, window);          \
    }

ATT_DECODE(64)
ATT_DECODE(128)
ATT_DECODE(256)

// One block per (decode chunk, head); every thread walks the chunk's splits (a few hundred at
// most) for the global max and sum, then owns dims t, t + 128, ... No collectives. The head's
// sink (if any) enters the max and, once, the sum.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_decode_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml, const AttChunk* __restrict__ chunks,
                    const int* __restrict__ offsets, float* __restrict__ out, int n_head, int d, const float* __restrict__ sinks) {
    GRID_DEPENDENCY_WAIT();
    const int c = blockIdx.x, h = blockIdx.y;
    const int first = offsets[c], n = offsets[c + 1] - first;
    const float sink = att_sink(sinks, h);
    float mx = sink;  // -inf without sinks
    for (int s = 0; s < n; ++s) mx = fmaxf(mx, part_ml[((u64)(first + s) * (u64)n_head + (u64)h) * 2]);
    float sum = sinks ? exp2f(sink - mx) : 0.0f;
    for (int s = 0; s < n; ++s) {
        const u64 at = ((u64)(first + s) * (u64)n_head + (u64)h) * 2;
        sum += part_ml[at + 1] * exp2f(part_ml[at] - mx);
    }
    const float inv = 1.0f / sum;
    const u64 row = (u64)chunks[c].first_row;
    for (int e = threadIdx.x; e < d; e += ATT_THREADS) {
        float acc = 0.0f;
        for (int s = 0; s < n; ++s) {
            const u64 split = (u64)(first + s) * (u64)n_head + (u64)h;
            acc = fmaf(part_o[split * (u64)d + (u64)e], exp2f(part_ml[split * 2] - mx), acc);
        }
        out[(row * (u64)n_head + (u64)h) * (u64)d + (u64)e] = acc * inv;
    }
}
