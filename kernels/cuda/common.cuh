// Shared by every kernel family; prepended to each .cu by `sources.rs` (NVRTC gets no include
// path, and no CUDA headers are needed: half conversion and dp4a are inline PTX).
//
// Rules every kernel follows (see docs/kernels.md):
// - an index that grows with tokens is on grid.x or in a grid-stride loop, never on y/z;
// - products that can pass 2^31 are computed in 64 bits (i64/u64);
// - all 32 lanes reach every __shfl_*_sync and every __syncthreads: rows past the end read a
//   valid row and are masked at the store, never skipped before a collective.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;

#define QK 32
#define WTYPE_Q8_0 0
#define WTYPE_Q4_0 1
#define FULL_MASK 0xffffffffu

struct block_q8_0 { u16 d; signed char qs[QK]; };        // 34 bytes
struct block_q4_0 { u16 d; unsigned char qs[QK / 2]; };  // 18 bytes
struct block_q8_1 { u16 d; u16 s; signed char qs[QK]; }; // 36 bytes

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

// Row of `nb` weight blocks (either type) dotted with `nb` activation blocks, blocks
// `lane, lane + stride, ...`: the per-lane partial of a warp-cooperative dot product.
static __device__ __forceinline__ float dot_row_partial(const unsigned char* w_row, int wtype,
                                                        const block_q8_1* x, int nb, int first, int stride) {
    float acc = 0.0f;
    if (wtype == WTYPE_Q8_0) {
        const block_q8_0* w = (const block_q8_0*)w_row;
        for (int b = first; b < nb; b += stride) acc += dot_block_q8_0(w + b, x + b);
    } else {
        const block_q4_0* w = (const block_q4_0*)w_row;
        for (int b = first; b < nb; b += stride) acc += dot_block_q4_0(w + b, x + b);
    }
    return acc;
}

static __device__ __forceinline__ u64 weight_row_bytes(int wtype, int k) {
    return (u64)(k / QK) * (wtype == WTYPE_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0));
}
