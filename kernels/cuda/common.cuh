// Shared by every kernel family; prepended to each .cu by `sources.rs` (NVRTC gets no include
// path, and no CUDA headers are needed: half conversion and dp4a are inline PTX).
//
// Rules every kernel follows (docs/architecture.md, "The kernel framework"):
// - an index that grows with tokens is on grid.x or in a grid-stride loop, never on y/z;
// - products that can pass 2^31 are computed in 64 bits (i64/u64);
// - all 32 lanes reach every __shfl_*_sync and every __syncthreads: rows past the end read a
//   valid row and are masked at the store, never skipped before a collective;
// - the first statement is GRID_DEPENDENCY_WAIT() (below; `sources` tests check it).

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;

#define QK 32
#define QK_K 256
// The type codes (`TTYPE_*`, `WTYPE_*`: ggml's type ids), `WEIGHT_ROW_BYTES_CASES` and
// `DISPATCH_WTYPE` are generated from the Rust type table (quant/types.rs) and compiled in
// front of this header; a weight format's unpack (`wq_int`, the scales) is written here.
#define FULL_MASK 0xffffffffu

// Every kernel's first statement. In a replayed decode graph the edges between kernels are
// programmatic (kernels/src/cuda/graph.rs): a kernel may be scheduled while the one before it
// still runs, and waits here, before touching memory, until that one has finished and its
// writes are visible. Launched any other way it returns at once. Hopper and later only.
#if __CUDA_ARCH__ >= 900
#define GRID_DEPENDENCY_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define GRID_DEPENDENCY_WAIT() ((void)0)
#endif

struct block_q8_0 { u16 d; signed char qs[QK]; };        // 34 bytes
struct block_q4_0 { u16 d; unsigned char qs[QK / 2]; };  // 18 bytes
struct block_q8_1 { u16 d; u16 s; signed char qs[QK]; }; // 36 bytes
// MXFP4 (quant/mxfp4.rs): an E8M0 exponent, then value j < 16 in the low nibble of qs[j] and
// value 16 + j in its high nibble. Only byte-aligned: its ints are built from bytes.
struct block_mxfp4 { unsigned char e; unsigned char qs[QK / 2]; };  // 17 bytes
// K-quant super-blocks of 256 weights (ggml-common.h; layouts in quant/kquants.rs).
struct block_q4_K { u16 d; u16 dmin; unsigned char scales[12]; unsigned char qs[QK_K / 2]; };                            // 144 bytes
struct block_q5_K { u16 d; u16 dmin; unsigned char scales[12]; unsigned char qh[QK_K / 8]; unsigned char qs[QK_K / 2]; }; // 176 bytes
struct block_q6_K { unsigned char ql[QK_K / 2]; unsigned char qh[QK_K / 4]; signed char scales[QK_K / 16]; u16 d; };      // 210 bytes

static __device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("{ .reg .f16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

static __device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("{ .reg .f16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

static __device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// 4 int8 from a 2-byte aligned address (q8_0 and q4_0 blocks are only 2-byte aligned).
static __device__ __forceinline__ int load_int_b2(const void* p, int i) {
    const u16* x = (const u16*)p;
    return (int)((u32)x[2 * i] | ((u32)x[2 * i + 1] << 16));
}

// 4 int8 from any address (mxfp4 blocks are 17 bytes: byte aligned), little-endian.
static __device__ __forceinline__ int load_int_b1(const unsigned char* p, int i) {
    const unsigned char* b = p + 4 * i;
    return (int)((u32)b[0] | ((u32)b[1] << 8) | ((u32)b[2] << 16) | ((u32)b[3] << 24));
}

// 4 int8 from a 4-byte aligned address (q8_1 blocks are 36 bytes: 4-byte aligned).
static __device__ __forceinline__ int load_int_b4(const void* p, int i) {
    return ((const int*)p)[i];
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Row r of a gathered quantize: `sorted_ids[r] / rows_per_token` (padding ids and ids past
// the source are invalid: a zero row), or r itself when there is no gather (`sorted_ids` null).
// Warp-uniform: every lane of the row's warp gets the same answer.
static __device__ __forceinline__ bool gather_source(const int* __restrict__ sorted_ids, u64 r, u64 src_rows, int rows_per_token, u64* src) {
    if (!sorted_ids) {
        *src = r;
        return true;
    }
    const i64 id = sorted_ids[r];
    const bool valid = id >= 0 && (u64)id < src_rows * (u64)rows_per_token;
    *src = valid ? (u64)id / (u64)rows_per_token : 0;
    return valid;
}

// silu(g) * u with IEEE division; the twin repeats each rounding (expf itself differs by <= 2 ulp).
// Shared by swiglu/swiglu_q8_1 (glue.cu) and the fused gate/up GEMV (moe_gemv.cu).
static __device__ __forceinline__ float swiglu_value(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// gpt-oss's clamped SwiGLU (ggml_swiglu_oai), each operation IEEE-rounded in the CPU backend's
// order (std::min and std::clamp compare as written: a NaN gate or up passes through).
static __device__ __forceinline__ float swiglu_oai_value(float g, float u, float alpha, float limit) {
    const float x = limit < g ? limit : g;
    const float y = u < -limit ? -limit : (limit < u ? limit : u);
    return __fmul_rn(__fdiv_rn(x, __fadd_rn(1.0f, expf(__fmul_rn(alpha, -x)))), __fadd_rn(y, 1.0f));
}

// The activation of a launch: clamped (warp- and grid-uniform) or plain SwiGLU.
static __device__ __forceinline__ float glue_act(float g, float u, int clamped, float alpha, float limit) {
    return clamped ? swiglu_oai_value(g, u, alpha, limit) : swiglu_value(g, u);
}

// Quantizes the 32 values of a warp (lane j holds value j) into one q8_1 block, step for step
// as `quant::quantize_block_q8_1`: d = amax / 127, q = roundf(v / d) (half away from zero, IEEE
// division), s = d * Σq; d and s stored as f16. Every lane must call it (two reductions);
// `valid` false (warp-uniform) stores a zero block instead: a padding row.
static __device__ __forceinline__ void warp_quantize_q8_1(float v, bool valid, block_q8_1* o) {
    const int lane = threadIdx.x & 31;
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : (int)roundf(v / d);
    const int sum = warp_sum_int(q);
    o->qs[lane] = valid ? (signed char)q : (signed char)0;
    if (lane == 0) {
        o->d = valid ? f32_to_f16(d) : (u16)0;
        o->s = valid ? f32_to_f16((float)sum * d) : (u16)0;
    }
}

// Dot product of one q8_0 weight block with one q8_1 activation block, over the 8 ints
// `i0 .. i0 + n` of the block (callers split a block between lanes or take it whole).
static __device__ __forceinline__ int dot_q8_0_ints(const block_q8_0* w, const block_q8_1* x, int i0, int n) {
    int s = 0;
    for (int i = i0; i < i0 + n; ++i) s = dp4a(load_int_b2(w->qs, i), load_int_b4(x->qs, i), s);
    return s;
}

// Σ q4 * q8 over nibble ints `i0 .. i0 + n` (each int of q4 holds 8 nibbles: low nibbles
// pair with activation int i, high nibbles with int i + 4).
static __device__ __forceinline__ int dot_q4_0_ints(const block_q4_0* w, const block_q8_1* x, int i0, int n) {
    int s = 0;
    for (int i = i0; i < i0 + n; ++i) {
        const int q = load_int_b2(w->qs, i);
        s = dp4a(q & 0x0f0f0f0f, load_int_b4(x->qs, i), s);
        s = dp4a((q >> 4) & 0x0f0f0f0f, load_int_b4(x->qs, i + 4), s);
    }
    return s;
}

// Whole-block dot products, scaled: the CPU twins are `quant::dot_q8_0_q8_1` / `dot_q4_0_q8_1`.
static __device__ __forceinline__ float dot_block_q8_0(const block_q8_0* w, const block_q8_1* x) {
    return f16_to_f32(w->d) * f16_to_f32(x->d) * (float)dot_q8_0_ints(w, x, 0, 8);
}

static __device__ __forceinline__ float dot_block_q4_0(const block_q4_0* w, const block_q8_1* x) {
    return f16_to_f32(w->d) * (f16_to_f32(x->d) * (float)dot_q4_0_ints(w, x, 0, 4) - 8.0f * f16_to_f32(x->s));
}

// 2^(e - 128) as f32, `mxfp4::e8m0_to_f32_half`: e = 0, 1 are the subnormals 2^-128, 2^-127.
static __device__ __forceinline__ float e8m0_to_f32_half(unsigned char e) {
    return __int_as_float(e < 2 ? (int)(0x00200000u << e) : (int)((u32)(e - 1) << 23));
}

// The signed values of the 8 codes in qs[4i .. 4i + 4]: `lo` the low nibbles (values 4i ..
// 4i + 3), `hi` the high ones (16 + 4i ..). The code table [0 1 2 3 4 6 8 12 0 -1 -2 -3 -4 -6
// -8 -12] is four words; __byte_perm looks up a code's low 3 bits in the positive and the
// negative half, then its bit 3 picks the half (ggml-cuda's get_int_from_table_16): exact for
// every code, 8 (-0) giving 0. q's nibbles alternate low, high per byte, so each 16-bit half
// of q gives the values of two bytes interleaved, and the last two permutations sort them.
static __device__ __forceinline__ void mxfp4_ints(const block_mxfp4* w, int i, int* lo, int* hi) {
    const u32 q = (u32)load_int_b1(w->qs, i);
    const u32 sel = 0x32103210u | ((q & 0x88888888u) >> 1);
    u32 t[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 pos = __byte_perm(0x03020100u, 0x0c080604u, q >> (16 * h));
        const u32 neg = __byte_perm(0xfdfeff00u, 0xf4f8fafcu, q >> (16 * h));
        t[h] = __byte_perm(pos, neg, sel >> (16 * h));
    }
    *lo = (int)__byte_perm(t[0], t[1], 0x6420);
    *hi = (int)__byte_perm(t[0], t[1], 0x7531);
}

// Σ code value * q8 over the whole block: the low nibbles meet activation ints 0..3, the high
// ones ints 4..7. |Σ| <= 32 * 12 * 127 < 2^19.
static __device__ __forceinline__ int dot_mxfp4_ints(const block_mxfp4* w, const block_q8_1* x) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int lo, hi;
        mxfp4_ints(w, i, &lo, &hi);
        s = dp4a(lo, load_int_b4(x->qs, i), s);
        s = dp4a(hi, load_int_b4(x->qs, i + 4), s);
    }
    return s;
}

// (d · d8) · Σ, the order of the twin `mxfp4::dot_mxfp4_q8_1` and of block_partial_f.
static __device__ __forceinline__ float dot_block_mxfp4(const block_mxfp4* w, const block_q8_1* x) {
    return e8m0_to_f32_half(w->e) * f16_to_f32(x->d) * (float)dot_mxfp4_ints(w, x);
}

// ---- Every weight format, seen as 32-wide blocks --------------------------------------------
// Block b of a weight row meets q8_1 activation block b. For the K-quants it is sub-block b % 8
// of super-block b / 8. The kernels unpack a block to 8 ints of 4 signed 8-bit weights each
// (`wq_int`), read its scales (`wq_scale`), take the integer dot products with dp4a and apply
// the type's formula (`block_partial`). CPU twins: `WeightType::dot_q8_1` (quant/mod.rs and
// quant/kquants.rs: the same integer sums; for the K-quants the same per-sub-block terms, which
// the twin sums per super-block before scaling, so only f32 rounding differs).
//
// Alignment: q8_0, q4_0 and q6_K blocks (34, 18, 210 bytes) are only 2-byte aligned and use
// load_int_b2; q4_K and q5_K blocks (144, 176 bytes) are 4-byte aligned whenever the row base
// is (every device allocation is 256-byte aligned, GGUF tensor data 32-byte aligned); mxfp4
// blocks (17 bytes) are byte aligned and use load_int_b1.

// The scales one 32-wide block needs: q8_0, q4_0: d; mxfp4: d = 2^(e - 128); q4_K, q5_K: d,
// dmin and the sub-block's six-bit scale sc and min m; q6_K: d and the i8 scales of the block's
// two 16-weight groups (sc: weights 0..15, m: weights 16..31).
struct wscale { float d; float dmin; int sc; int m; };

// Bytes of a row of k weights; constant divisors per format (a division by a runtime block
// size costs registers in every kernel that computes a row offset).
static __device__ __forceinline__ u64 weight_row_bytes(int wtype, int k) {
    switch (wtype) {
        WEIGHT_ROW_BYTES_CASES(k)
        default: __trap(); return 0;
    }
}

// Six-bit scale and min of sub-block j (0..8) from the 12 packed bytes (ggml's get_scale_min_k4).
static __device__ __forceinline__ void scale_min_k4(int j, const unsigned char* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Int j (weights 4j .. 4j + 3) of block b of a weight row, as 4 signed bytes: q8_0 its quants;
// q4_0 its nibbles 0..15 (the -8 is folded into the formula); mxfp4 its code values -12..12;
// q4_K 0..15; q5_K 0..31; q6_K q - 32 in -32..31.
template <int WT>
static __device__ __forceinline__ int wq_int(const unsigned char* row, int b, int j) {
    const int s = b & 7;  // K-quants: the sub-block
    if constexpr (WT == WTYPE_Q8_0) {
        return load_int_b2(((const block_q8_0*)row + b)->qs, j);
    } else if constexpr (WT == WTYPE_Q4_0) {
        return (load_int_b2(((const block_q4_0*)row + b)->qs, j & 3) >> (4 * (j >> 2))) & 0x0f0f0f0f;
    } else if constexpr (WT == WTYPE_MXFP4) {
        int lo, hi;
        mxfp4_ints((const block_mxfp4*)row + b, j & 3, &lo, &hi);
        return j < 4 ? lo : hi;
    } else if constexpr (WT == WTYPE_Q4_K) {
        // Sub-blocks 2i and 2i + 1 are the low and high nibbles of qs[32i .. 32i + 32].
        const block_q4_K* w = (const block_q4_K*)row + (b >> 3);
        return (load_int_b4(w->qs + 32 * (s >> 1), j) >> (4 * (s & 1))) & 0x0f0f0f0f;
    } else if constexpr (WT == WTYPE_Q5_K) {
        // As q4_K, plus the fifth bit: bit s of qh[l] for weight l of sub-block s.
        const block_q5_K* w = (const block_q5_K*)row + (b >> 3);
        const int lo = (load_int_b4(w->qs + 32 * (s >> 1), j) >> (4 * (s & 1))) & 0x0f0f0f0f;
        return lo | (((load_int_b4(w->qh, j) >> s) & 0x01010101) << 4);
    } else {
        // q6_K: half h = s / 4 of 128 weights, quarter t = s % 4 of it: the nibble t / 2 of
        // ql[64h + 32(t % 2) + l] and bits 2t, 2t + 1 of qh[32h + l].
        const block_q6_K* w = (const block_q6_K*)row + (b >> 3);
        const int h = s >> 2, t = s & 3;
        const int lo = (load_int_b2(w->ql + 64 * h + 32 * (t & 1), j) >> (4 * (t >> 1))) & 0x0f0f0f0f;
        const int hi = ((load_int_b2(w->qh + 32 * h, j) >> (2 * t)) & 0x03030303) << 4;
        return __vsubss4(lo | hi, 0x20202020);  // bytes 0..63 - 32: never saturates
    }
}

template <int WT>
static __device__ __forceinline__ wscale wq_scale(const unsigned char* row, int b) {
    wscale r = {0.0f, 0.0f, 0, 0};
    if constexpr (WT == WTYPE_Q8_0) {
        r.d = f16_to_f32(((const block_q8_0*)row + b)->d);
    } else if constexpr (WT == WTYPE_Q4_0) {
        r.d = f16_to_f32(((const block_q4_0*)row + b)->d);
    } else if constexpr (WT == WTYPE_MXFP4) {
        r.d = e8m0_to_f32_half(((const block_mxfp4*)row + b)->e);
    } else if constexpr (WT == WTYPE_Q4_K || WT == WTYPE_Q5_K) {
        // q5_K starts like q4_K: d, dmin, scales.
        const block_q4_K* w = (const block_q4_K*)(row + (u64)(b >> 3) * (WT == WTYPE_Q4_K ? sizeof(block_q4_K) : sizeof(block_q5_K)));
        r.d = f16_to_f32(w->d);
        r.dmin = f16_to_f32(w->dmin);
        scale_min_k4(b & 7, w->scales, &r.sc, &r.m);
    } else {
        const block_q6_K* w = (const block_q6_K*)row + (b >> 3);
        r.d = f16_to_f32(w->d);
        r.sc = w->scales[2 * (b & 7)];
        r.m = w->scales[2 * (b & 7) + 1];
    }
    return r;
}

// The integer sums of one block: `lo` and `hi` over weights 0..15 and 16..31 (q6_K scales the
// halves apart; the other types keep everything in lo), `usum` = Σ activation quants, exact
// (the K-quant min term uses it, as ggml-cuda's dp4a with 0x01010101 does, not the f16 s).
template <int WT>
static __device__ __forceinline__ void block_isums(const int q[8], const block_q8_1* x, int* lo, int* hi, int* usum) {
    int l = 0, h = 0, u = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int a = load_int_b4(x->qs, j);
        if (WT == WTYPE_Q6_K && j >= 4) h = dp4a(q[j], a, h);
        else l = dp4a(q[j], a, l);
        if constexpr (WT == WTYPE_Q4_K || WT == WTYPE_Q5_K) u = dp4a(0x01010101, a, u);
    }
    *lo = l;
    *hi = h;
    *usum = u;
}

// One block's contribution from its integer sums and the activation block's d8 and s8:
//   q8_0: (d·d8)·Σ;  q4_0: d·(d8·Σ − 8·s8)  (the twins `dot_q8_0_q8_1`, `dot_q4_0_q8_1`);
//   q4_K, q5_K: d·(d8·(Σ·sc)) − dmin·(d8·(Σu·m));  q6_K: d·(d8·(lo·sc) + d8·(hi·m)),
// the terms of ggml-cuda's vec_dot_q{4,5,6}_K_q8_1. The K-quant arithmetic is spelled with _rn
// intrinsics (no FMA contraction, here or into the caller's sum) so that tests can repeat it
// exactly (`quant::kquants::device_partial`). Integer products stay below 2^24: exact in f32.
//   mxfp4: (d·d8)·Σ  (the twin `mxfp4::dot_mxfp4_q8_1`).
// q8_0, q4_0 and mxfp4 from their block sum already in f32 (exact: |Σ| <= 32·128·128 = 2^19);
// the GEMM tile converts it without I2F (gemm_tile.cuh, GEMM_I2F_BIAS).
template <int WT>
static __device__ __forceinline__ float block_partial_f(wscale w, float sum, float d8, float s8) {
    static_assert(WT == WTYPE_Q8_0 || WT == WTYPE_Q4_0 || WT == WTYPE_MXFP4, "one integer sum, no sub-block scale");
    if constexpr (WT == WTYPE_Q8_0 || WT == WTYPE_MXFP4) {
        return w.d * d8 * sum;
    } else {
        return w.d * (d8 * sum - 8.0f * s8);
    }
}

template <int WT>
static __device__ __forceinline__ float block_partial(wscale w, int lo, int hi, int usum, float d8, float s8) {
    if constexpr (WT == WTYPE_Q8_0 || WT == WTYPE_Q4_0 || WT == WTYPE_MXFP4) {
        return block_partial_f<WT>(w, (float)(lo + hi), d8, s8);
    } else if constexpr (WT == WTYPE_Q6_K) {
        return __fmul_rn(w.d, __fadd_rn(__fmul_rn(d8, (float)(lo * w.sc)), __fmul_rn(d8, (float)(hi * w.m))));
    } else {
        return __fsub_rn(__fmul_rn(w.d, __fmul_rn(d8, (float)(lo * w.sc))), __fmul_rn(w.dmin, __fmul_rn(d8, (float)(usum * w.m))));
    }
}

// Block b of a weight row dotted with activation block x, scaled.
template <int WT>
static __device__ __forceinline__ float dot_block(const unsigned char* row, int b, const block_q8_1* x) {
    if constexpr (WT == WTYPE_Q8_0) {
        return dot_block_q8_0((const block_q8_0*)row + b, x);
    } else if constexpr (WT == WTYPE_Q4_0) {
        return dot_block_q4_0((const block_q4_0*)row + b, x);
    } else if constexpr (WT == WTYPE_MXFP4) {
        return dot_block_mxfp4((const block_mxfp4*)row + b, x);
    } else {
        int q[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = wq_int<WT>(row, b, j);
        int lo, hi, usum;
        block_isums<WT>(q, x, &lo, &hi, &usum);
        return block_partial<WT>(wq_scale<WT>(row, b), lo, hi, usum, f16_to_f32(x->d), f16_to_f32(x->s));
    }
}

template <int WT>
static __device__ __forceinline__ float dot_row_partial_t(const unsigned char* w_row, const block_q8_1* x, int nb, int first,
                                                          int stride) {
    float acc = 0.0f;
    for (int b = first; b < nb; b += stride) acc += dot_block<WT>(w_row, b, x + b);
    return acc;
}

// `DISPATCH_WTYPE(wtype, statement)` (generated) runs the statement with `WT` bound to the
// runtime weight type `wtype` as a constant, so each format gets its own instantiation (no type
// branch in inner loops). Rust passes only the codes of `WeightType`; any other traps rather
// than computing garbage.

// Row of `nb` 32-wide weight blocks dotted with `nb` activation blocks, blocks
// `first, first + stride, ...`: the per-lane partial of a warp-cooperative dot product.
static __device__ __forceinline__ float dot_row_partial(const unsigned char* w_row, int wtype, const block_q8_1* x, int nb, int first,
                                                        int stride) {
    float acc = 0.0f;
    DISPATCH_WTYPE(wtype, acc = dot_row_partial_t<WT>(w_row, x, nb, first, stride));
    return acc;
}
