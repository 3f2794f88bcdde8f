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
// attn_prefill_mma_d{64,128}: the same on tensor cores, 64 x 64 tiles (see its own comment below).
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

// attn_prefill_mma_d{64,128}: the prefill kernel on tensor cores (mma.sync m16n8k16, f16 inputs,
//   f32 accumulators; sm_80 and later), for the same arguments, grid and tile map as
//   attn_prefill_d{D}: grid (query tiles, n_head), 128 threads, MMA_BQ = 64 rows of one chunk per
//   block, 16 per warp, against key tiles of MMA_BK = 64 keys. Each key tile's K and V rows are
//   staged once, f16 as stored ([MMA_BK][D + MMA_PADH] halfs each, one block table look-up per
//   key), and each warp takes S = Q K^T for its 16 rows, the online softmax, O += P V, with S, P
//   and O in registers (Q's split halves wait in shared memory, [MMA_BQ][D + MMA_PADH] each: in
//   registers they would spill at D = 128). Two barriers per key tile.
//
//   Precision. K and V are f16 already, so a product of an f16 with a K or V element is exact in
//   f32, and the tensor cores sum such products in f32. Q (scaled, f32) and P (f32
//   probabilities) are not f16: each is split into hi = f16(x) and lo = f16(x - hi), and both
//   halves go through an mma into the same f32 accumulator, so x is taken to ~22 bits (a row of
//   x differs from hi + lo by at most 2^-22 |x| + 2^-25 absolute: f16 subnormals) instead of
//   f16's 11. P is scaled by 2^15 before the split (exact; p <= 1, so p 2^15 <= 32768 stays in
//   f16's range) and O by 2^-15 at the end: small probabilities keep their low half out of f16's
//   subnormals (2^-25 absolute of p 2^15 is 2^-40 of p). Q is split unscaled (a scale would cap
//   q's range; 2^-25 absolute per element is below the f32 rounding of the scores). The CPU
//   emulation of this arithmetic (cpu.rs, `tolerance_covers_the_mma_kernels_split`) stays far
//   below the attention tolerance at 40,960 keys.
//
//   Fragments of mma.sync.m16n8k16.row.col (g = lane >> 2, t = lane & 3; two f16 per 32-bit
//   register, the lower k (A, B) in the lower half):
//     A (16 x 16, row major): a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..2t+1),
//                             a2 = (row g, k 2t+8..2t+9), a3 = (row g+8, k 2t+8..2t+9)
//     B (16 x 8, column):     b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//     C (16 x 8, f32):        c0, c1 = (row g, n 2t, 2t+1), c2, c3 = (row g+8, n 2t, 2t+1)
//   S = Q K^T: A = Q rows (k = head dims), B = K^T (k = dims, n = keys): b0 is K[key g][dims 2t,
//   2t+1], two adjacent halfs of a staged K row (one 32-bit load). S's C fragment of 8-key block
//   j holds keys 8j + 2t, 8j + 2t + 1 of rows g (c0, c1) and g + 8 (c2, c3), so P's A fragment
//   for keys 16kk.. is (c0c1, c2c3) of block 2kk and (c0c1, c2c3) of block 2kk + 1: P stays in
//   the registers S was computed in. O += P V: B = V (k = keys, n = dims): b0 = V[keys 2t, 2t+1]
//   [dim g], two rows apart in the staged V: ldmatrix .trans delivers exactly that (the 8 x 8
//   matrix whose rows are 8 keys of 8 dims, transposed: lane (g, t) gets rows 2t, 2t+1 of column
//   g). Each lane holds two rows of the warp (g, g + 8): their max and sum are taken over its
//   own keys, then over the 4 lanes of the row (xor 1, 2; every lane of the warp takes part).
//   Padding rows of 8 halfs (16 B) make both the 32-bit K loads and ldmatrix's 16-byte row reads
//   conflict-free (a row is D / 2 + 4 words: 8 rows fall on 8 distinct 4-bank groups).
//
//   Rows past the chunk's end repeat its last row (valid loads, finite values) and are masked at
//   the store; a warp whose 16 rows are all past the end, or whose rows all mask every key of a
//   tile (causal: the tile starts after the warp's last row; window: it ends before the warp's
//   first row's window), skips that tile's arithmetic, warp-uniformly, between the barriers
//   (for such a row the tile would change nothing: its max stays, alpha = 1 or o = l = 0). The
//   key-tile loop, its bounds and the windowed -inf handling are those of attn_prefill.

#define MMA_BQ 64                                 // query rows per block: 16 per warp
#define MMA_BK 64                                 // keys per staged tile
#define MMA_PADH 8                                // halfs after each staged K/V row
#define MMA_P_SCALE 32768.0f                      // 2^15: P's scale before its split
#define MMA_P_UNSCALE 3.0517578125e-05f           // 2^-15

// 32-bit shared-memory address of a generic pointer into shared memory (for ldmatrix).
static __device__ __forceinline__ u32 att_smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Four 8 x 8 f16 matrices, transposed: lanes 8i .. 8i + 7 give the 16-byte rows of matrix i,
// r[i] gets lane (g, t)'s elements (row 2t, column g) and (row 2t + 1, column g) of it.
static __device__ __forceinline__ void att_ldsm_x4_trans(u32 (&r)[4], const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(att_smem_u32(row))
                 : "memory");
}

// c += a b on one 16 x 8 x 16 tile (fragments above).
static __device__ __forceinline__ void att_mma_f16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (x0, x1) = hi + lo: hi = f16(x) and lo = f16(x - hi) (x - hi is exact in f32), packed with x0
// in the lower half.
static __device__ __forceinline__ void att_split_f16x2(float x0, float x1, u32& hi, u32& lo) {
    const u16 h0 = f32_to_f16(x0), h1 = f32_to_f16(x1);
    const u16 l0 = f32_to_f16(x0 - f16_to_f32(h0)), l1 = f32_to_f16(x1 - f16_to_f32(h1));
    hi = (u32)h0 | ((u32)h1 << 16);
    lo = (u32)l0 | ((u32)l1 << 16);
}

// Stages keys k0 .. k0 + ROWS - 1 of one kv head, K into sk and V into sv ([ROWS][D + MMA_PADH]
// halfs each, f16 as stored), 16 bytes per load; keys clamped to kmin ..= kmax and looked up in
// the block table as in att_stage (one table load per key, by one thread, into blk[]). A barrier
// inside: every thread calls it; the caller's barrier before each call keeps the previous call's
// readers of blk[], sk and sv done.
template <int D, int ROWS>
static __device__ __forceinline__ void att_stage_kv_f16(u16* sk, u16* sv, const u16* __restrict__ kc, const u16* __restrict__ vc,
                                                        const int* __restrict__ tab, int shift, int k0, int kmin, int kmax, int n_kv,
                                                        int kvh) {
    constexpr int V8 = D / 8;
    constexpr int LDH = D + MMA_PADH;
    __shared__ int blk[ROWS];
    for (int r = threadIdx.x; r < ROWS; r += ATT_THREADS) blk[r] = tab[max(min(k0 + r, kmax), kmin) >> shift];
    __syncthreads();
    // Every thread moves the same number of 16-byte pieces: all its loads are issued before the
    // first store, so their latencies overlap.
    static_assert((ROWS * V8) % ATT_THREADS == 0, "whole rounds of 16-byte pieces");
    constexpr int N = ROWS * V8 / ATT_THREADS;
    uint4 k[N], v[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int e = threadIdx.x + i * ATT_THREADS, r = e / V8, c = e - r * V8;
        const int key = max(min(k0 + r, kmax), kmin);
        const u64 row = ((u64)(u32)blk[r] << shift) | (u64)(key & ((1 << shift) - 1));
        const u64 at = att_kv_offset(row, n_kv, kvh, D) + (u64)c * 8;
        k[i] = *(const uint4*)(kc + at);
        v[i] = *(const uint4*)(vc + at);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int e = threadIdx.x + i * ATT_THREADS, r = e / V8, c = e - r * V8;
        *(uint4*)(sk + r * LDH + c * 8) = k[i];
        *(uint4*)(sv + r * LDH + c * 8) = v[i];
    }
}

template <int D>
static __device__ __forceinline__ void att_prefill_mma(const float* __restrict__ q, const u16* __restrict__ kc,
                                                       const u16* __restrict__ vc, float* __restrict__ out,
                                                       const AttChunk* __restrict__ chunks, const int2* __restrict__ tiles,
                                                       const int* __restrict__ table, int n_head, int n_kv, int shift, float qscale,
                                                       int window, const float* __restrict__ sinks) {
    constexpr int BQ = MMA_BQ;
    constexpr int BK = MMA_BK;
    constexpr int LDH = D + MMA_PADH;
    constexpr int KS = D / 16;   // 16-dim k-steps of S = Q K^T
    constexpr int NB = BK / 8;   // 8-key blocks of S
    constexpr int KK = BK / 16;  // 16-key k-steps of O += P V
    constexpr int ND = D / 8;    // 8-dim blocks of O
    static_assert(BQ == 16 * (ATT_THREADS / 32), "a warp takes 16 rows");
    static_assert(D % 16 == 0 && ND % 2 == 0, "ldmatrix x4 takes two 8-dim blocks");
    extern __shared__ __align__(16) float att_smem[];
    u16* sk = (u16*)att_smem;  // [BK][LDH]: K of the current key tile
    u16* sv = sk + BK * LDH;   // [BK][LDH]: its V
    u16* sqh = sv + BK * LDH;  // [BQ][LDH]: Q's hi halves (rows w0 .. w0 + 15 written and read by warp w0 / 16 only)
    u16* sql = sqh + BQ * LDH; // [BQ][LDH]: Q's lo halves

    const int2 tile = tiles[blockIdx.x];
    const AttChunk ch = chunks[tile.x];
    const int q0 = tile.y;
    const int nq = min(BQ, ch.n_tokens - q0);
    const int h = blockIdx.y;
    const int kvh = h / (n_head / n_kv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int* __restrict__ tab = table + (u64)(u32)ch.table;  // the chunk's block table

    // This lane's rows of the tile: w0 + g and w0 + g + 8 (past the end: the last row).
    const int w0 = warp * 16;
    const int row_of[2] = {min(w0 + g, nq - 1), min(w0 + g + 8, nq - 1)};

    // Q's A fragments, scaled as attn_prefill scales it (one f32 product), split into hi and lo,
    // kept in shared memory (registers hold O and S): each lane stores the words it reads back
    // for every key tile, and no other lane reads them, so no barrier is needed for them.
    {
        const float* qa = q + (((u64)ch.first_row + (u64)(q0 + row_of[0])) * (u64)n_head + (u64)h) * (u64)D + 2 * t;
        const float* qb = q + (((u64)ch.first_row + (u64)(q0 + row_of[1])) * (u64)n_head + (u64)h) * (u64)D + 2 * t;
        u32* ha = (u32*)(sqh + (w0 + g) * LDH + 2 * t);
        u32* la = (u32*)(sql + (w0 + g) * LDH + 2 * t);
        u32* hb = (u32*)(sqh + (w0 + g + 8) * LDH + 2 * t);
        u32* lb = (u32*)(sql + (w0 + g + 8) * LDH + 2 * t);
#pragma unroll 4
        for (int c = 0; c < D; c += 8) {  // dims c + 2t, +1: a0/a1 (c = 16ks) and a2/a3 (c = 16ks + 8)
            const float2 xa = *(const float2*)(qa + c);
            const float2 xb = *(const float2*)(qb + c);
            att_split_f16x2(xa.x * qscale, xa.y * qscale, ha[c / 2], la[c / 2]);
            att_split_f16x2(xb.x * qscale, xb.y * qscale, hb[c / 2], lb[c / 2]);
        }
    }

    // The sink starts each row's softmax: max = sink, sum = 1, o = 0 (as attn_prefill).
    const float sink = att_sink(sinks, h);
    float m[2], l[2];
    int lim[2], lo[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        m[i] = sink;
        l[i] = sinks ? 1.0f : 0.0f;
        lim[i] = ch.start_pos + q0 + row_of[i];
        lo[i] = window > 0 ? lim[i] - window + 1 : 0;
    }
    float o[ND][4];  // O 2^15: (row g, dims 8nd + 2t, +1), (row g + 8, the same dims)
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;

    const int kmax = ch.start_pos + q0 + nq - 1;  // the last key any row of the tile sees
    const int kmin = window > 0 ? max(0, ch.start_pos + q0 - window + 1) : 0;  // the first (row 0's window)
    const int n_kt = kmax / BK + 1;               // block-uniform, as is the first tile
    const int kt0 = kmin / BK;
    // The warp's keys: from its first row's window to its last row (warp-uniform).
    const bool warp_idle = w0 >= nq;
    const int wlast = ch.start_pos + q0 + min(w0 + 15, nq - 1);
    const int wfirst = window > 0 ? ch.start_pos + q0 + min(w0, nq - 1) - window + 1 : 0;

    for (int kt = kt0; kt < n_kt; ++kt) {
        const int k0 = kt * BK;
        __syncthreads();  // every warp done with the previous tile's K, V and blk[]
        att_stage_kv_f16<D, BK>(sk, sv, kc, vc, tab, shift, k0, kmin, kmax, n_kv, kvh);
        __syncthreads();
        if (warp_idle || k0 > wlast || k0 + BK - 1 < wfirst) continue;  // warp-uniform: no key of the tile for its rows

        float s[NB][4];
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            u32 qh[4], ql[4];  // a0 (row g, dims 16ks + 2t, +1), a1 (row g + 8), a2, a3 (dims + 8)
            const int qa = (w0 + g) * LDH + ks * 16 + 2 * t, qb = qa + 8 * LDH;
            qh[0] = *(const u32*)(sqh + qa);
            qh[1] = *(const u32*)(sqh + qb);
            qh[2] = *(const u32*)(sqh + qa + 8);
            qh[3] = *(const u32*)(sqh + qb + 8);
            ql[0] = *(const u32*)(sql + qa);
            ql[1] = *(const u32*)(sql + qb);
            ql[2] = *(const u32*)(sql + qa + 8);
            ql[3] = *(const u32*)(sql + qb + 8);
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                const u16* kr = sk + (nb * 8 + g) * LDH + ks * 16 + 2 * t;  // key 8nb + g, dims 16ks + 2t, +1
                const u32 b0 = *(const u32*)kr;
                const u32 b1 = *(const u32*)(kr + 8);                       // dims 16ks + 8 + 2t, +1
                att_mma_f16(s[nb], qh, b0, b1);
                att_mma_f16(s[nb], ql, b0, b1);
            }
        }

#pragma unroll
        for (int i = 0; i < 2; ++i) {  // row g (c0, c1), row g + 8 (c2, c3)
            float mx = ATT_NEG_INF;
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = k0 + nb * 8 + 2 * t + e;
                    if (key > lim[i] || key < lo[i]) s[nb][2 * i + e] = ATT_NEG_INF;
                    mx = fmaxf(mx, s[nb][2 * i + e]);
                }
            }
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
            const float m_new = fmaxf(m[i], mx);
            const float m_use = m_new == ATT_NEG_INF ? 0.0f : m_new;  // nothing seen yet: exponents against 0
            const float alpha = exp2f(m[i] - m_use);
            float sum = 0.0f;
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    s[nb][2 * i + e] = exp2f(s[nb][2 * i + e] - m_use);
                    sum += s[nb][2 * i + e];
                }
            }
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(FULL_MASK, sum, 2);
            l[i] = l[i] * alpha + sum;
            m[i] = m_new;
#pragma unroll
            for (int nd = 0; nd < ND; ++nd) {
                o[nd][2 * i] *= alpha;
                o[nd][2 * i + 1] *= alpha;
            }
        }

#pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
            // P's A fragment for keys 16kk ..: S blocks 2kk (k 2t..) and 2kk + 1 (k 2t + 8..).
            u32 ph[4], pl[4];
            att_split_f16x2(s[2 * kk][0] * MMA_P_SCALE, s[2 * kk][1] * MMA_P_SCALE, ph[0], pl[0]);          // row g,     keys 2t, +1
            att_split_f16x2(s[2 * kk][2] * MMA_P_SCALE, s[2 * kk][3] * MMA_P_SCALE, ph[1], pl[1]);          // row g + 8, keys 2t, +1
            att_split_f16x2(s[2 * kk + 1][0] * MMA_P_SCALE, s[2 * kk + 1][1] * MMA_P_SCALE, ph[2], pl[2]);  // row g,     keys 2t + 8, +9
            att_split_f16x2(s[2 * kk + 1][2] * MMA_P_SCALE, s[2 * kk + 1][3] * MMA_P_SCALE, ph[3], pl[3]);  // row g + 8, keys 2t + 8, +9
            // ldmatrix rows: lane l gives key 16kk + (l & 7) + 8 ((l >> 3) & 1) at dims 8 (nd + (l >> 4)):
            // matrices 0, 1 = b0, b1 of dim block nd; 2, 3 = b0, b1 of dim block nd + 1.
            const u16* vr = sv + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDH + (lane >> 4) * 8;
#pragma unroll
            for (int nd = 0; nd < ND; nd += 2) {
                u32 b[4];
                att_ldsm_x4_trans(b, vr + nd * 8);
                // These 16 keys' P.V from zero, then added to O: the tensor cores' f32
                // accumulation does not round to nearest (O as the mma accumulator measured
                // ~1e-4 relative error at 40k keys on the H100), so O grows by
                // round-to-nearest adds.
                float t0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, t1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                att_mma_f16(t0, ph, b[0], b[1]);
                att_mma_f16(t0, pl, b[0], b[1]);
                att_mma_f16(t1, ph, b[2], b[3]);
                att_mma_f16(t1, pl, b[2], b[3]);
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    o[nd][q] += t0[q];
                    o[nd + 1][q] += t1[q];
                }
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = w0 + g + 8 * i;
        if (r < nq) {
            const u64 row = (u64)ch.first_row + (u64)(q0 + r);
            const float inv = 1.0f / l[i];  // l >= 1, as in attn_prefill
            float* dst = out + (row * (u64)n_head + (u64)h) * (u64)D + 2 * t;
#pragma unroll
            for (int nd = 0; nd < ND; ++nd) {
                float2 v;
                v.x = o[nd][2 * i] * MMA_P_UNSCALE * inv;
                v.y = o[nd][2 * i + 1] * MMA_P_UNSCALE * inv;
                *(float2*)(dst + nd * 8) = v;
            }
        }
    }
}

#define ATT_PREFILL_MMA(D)                                                                                                  \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                              \
    attn_prefill_mma_d##D(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,              \
                          float* __restrict__ out, const AttChunk* __restrict__ chunks, const int2* __restrict__ tiles,     \
                          const int* __restrict__ table, int n_head, int n_kv, int shift, float qscale, int window,         \
                          const float* __restrict__ sinks) {                                                                \
        GRID_DEPENDENCY_WAIT();                                                                                             \
        att_prefill_mma<D>(q, kc, vc, out, chunks, tiles, table, n_head, n_kv, shift, qscale, window, sinks);               \
    }

// mma.sync m16n8k16 (f16) needs sm_80: older targets leave these kernels out (the plan never
// selects them below compute capability 8.0).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
ATT_PREFILL_MMA(64)
ATT_PREFILL_MMA(128)
#endif

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
