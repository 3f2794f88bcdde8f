// Deterministic test inputs generated on the device, and the poison checks of the self-test.
// The CPU twin of every generator is in `src/testdata.rs`: the reference recomputes any input
// element from (seed, index) without copying gigabytes back.

static __device__ __forceinline__ u64 mix64(u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static __device__ __forceinline__ u64 hash2(u64 seed, u64 i) {
    return mix64(seed * 0xD1B54A32D192ED03ull ^ i);
}

// Uniform in [-1, 1), exact in f32 (24 random bits).
static __device__ __forceinline__ float uniform_pm1(u64 seed, u64 i) {
    return __fadd_rn(__fmul_rn((float)(hash2(seed, i) >> 40), 1.0f / 8388608.0f), -1.0f);  // exact either way
}

extern "C" __global__ void fill_uniform_f32(float* out, u64 n, u64 seed, float scale) {
    GRID_DEPENDENCY_WAIT();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = __fmul_rn(uniform_pm1(seed, i), scale);
}

// f16(lo + span * u), u uniform in [0, 1) from (seed, i); no FMA: the CPU twin rounds twice.
static __device__ __forceinline__ u16 scale_f16(u64 seed, u64 i, float lo, float span) {
    const float u = __fmul_rn(__fadd_rn(uniform_pm1(seed, i), 1.0f), 0.5f);
    return f32_to_f16(__fadd_rn(lo, __fmul_rn(span, u)));
}

// K-quant super-block b: every byte random (8 per hash: byte i is byte i % 8 of
// hash(seed, 64b + i / 8)), so sub-block scales, mins and quants take all their values; then the
// f16 fields are set from hash indexes 64b + 48 (d) and 64b + 49 (dmin). dmin is ~ d times the
// mean quant (7.5 for q4_K, 15.5 for q5_K), so the min term cancels the mean weight as in a
// real model. Constants: `testdata::kquant_scale_ranges` in Rust.
static __device__ __forceinline__ void fill_kquant_block(unsigned char* blk, u64 b, u64 seed, int wtype) {
    const int bytes = (int)weight_row_bytes(wtype, QK_K);
    for (int w = 0; w * 8 < bytes; ++w) {
        const u64 h = hash2(seed, b * 64 + (u64)w);
        for (int i = 0; i < 8 && w * 8 + i < bytes; ++i) blk[w * 8 + i] = (unsigned char)(h >> (8 * i));
    }
    if (wtype == WTYPE_Q6_K) {
        ((block_q6_K*)blk)->d = scale_f16(seed, b * 64 + 48, 1e-4f, 2e-4f);
    } else {
        block_q4_K* h = (block_q4_K*)blk;  // q5_K starts the same way
        const bool q4 = wtype == WTYPE_Q4_K;
        h->d = scale_f16(seed, b * 64 + 48, q4 ? 2e-4f : 1e-4f, q4 ? 4e-4f : 2e-4f);
        h->dmin = scale_f16(seed, b * 64 + 49, q4 ? 1.5e-3f : 1.55e-3f, q4 ? 3e-3f : 3.1e-3f);
    }
}

// Weight blocks of `wtype`. q8_0 / q4_0: d = f16(0.002 + 0.004 * u), q8_0 quants in
// [-127, 127], q4_0 bytes uniform. mxfp4: exponent 119 + hash % 3, code bytes uniform.
// K-quants: fill_kquant_block.
extern "C" __global__ void fill_weights(unsigned char* out, u64 nblocks, u64 seed, int wtype) {
    GRID_DEPENDENCY_WAIT();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks; b += stride) {
        if (wtype == WTYPE_Q8_0) {
            block_q8_0* w = (block_q8_0*)out + b;
            w->d = scale_f16(seed, b * 33, 0.002f, 0.004f);
            for (int j = 0; j < QK; ++j) w->qs[j] = (signed char)((int)(hash2(seed, b * 33 + 1 + j) % 255) - 127);
        } else if (wtype == WTYPE_Q4_0) {
            block_q4_0* w = (block_q4_0*)out + b;
            w->d = scale_f16(seed, b * 33, 0.002f, 0.004f);
            for (int j = 0; j < QK / 2; ++j) w->qs[j] = (unsigned char)(hash2(seed, b * 33 + 1 + j) & 0xff);
        } else if (wtype == WTYPE_MXFP4) {
            block_mxfp4* w = (block_mxfp4*)out + b;
            w->e = (unsigned char)(119 + hash2(seed, b * 33) % 3);
            for (int j = 0; j < QK / 2; ++j) w->qs[j] = (unsigned char)(hash2(seed, b * 33 + 1 + j) & 0xff);
        } else {
            fill_kquant_block(out + b * weight_row_bytes(wtype, QK_K), b, seed, wtype);
        }
    }
}

extern "C" __global__ void fill_u32(u32* out, u64 n, u32 value) {
    GRID_DEPENDENCY_WAIT();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = value;
}

// Counts items i < n whose word at i * stride equals (`want_equal`) or differs from `value`.
extern "C" __global__ void count_words(const u32* buf, u64 n, u64 stride, u32 value, int want_equal,
                                       unsigned long long* count) {
    GRID_DEPENDENCY_WAIT();
    const u64 step = (u64)gridDim.x * blockDim.x;
    unsigned long long local = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        local += ((buf[i * stride] == value) == (want_equal != 0)) ? 1 : 0;
    // Whole warp reaches the reduction: the loop above has no collective inside.
    for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(FULL_MASK, local, o);
    if ((threadIdx.x & 31) == 0 && local) atomicAdd(count, local);
}

// q8_1 activation rows from (seed, source row): block b of source row s has quants
// hash(seed, (s * nb + b) * 33 + 1 + j) % 255 - 127, d = f16(0.001 + 0.01 * u), s = f16(d * Σq).
// Row r of the output holds source row `row_ids[r]` (or r when row_ids is null); a source
// outside [0, n_src) is a padding row and is written as zeros.
extern "C" __global__ void fill_q8_1_rows(block_q8_1* out, u64 rows, int nb, u64 seed, const int* row_ids, u64 n_src) {
    GRID_DEPENDENCY_WAIT();
    const u64 total = rows * (u64)nb;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const u64 r = i / (u64)nb;
        const int b = (int)(i - r * (u64)nb);
        const i64 src = row_ids ? (i64)row_ids[r] : (i64)r;
        block_q8_1* o = out + i;
        if (src < 0 || (u64)src >= n_src) {
            o->d = 0; o->s = 0;
            for (int j = 0; j < QK; ++j) o->qs[j] = 0;
            continue;
        }
        const u64 blk = (u64)src * (u64)nb + (u64)b;
        int sum = 0;
        for (int j = 0; j < QK; ++j) {
            const int q = (int)(hash2(seed, blk * 33 + 1 + j) % 255) - 127;
            o->qs[j] = (signed char)q;
            sum += q;
        }
        const float u = __fmul_rn(__fadd_rn(uniform_pm1(seed, blk * 33), 1.0f), 0.5f);
        const u16 d = f32_to_f16(__fadd_rn(0.001f, __fmul_rn(0.01f, u)));  // no FMA: the CPU twin rounds twice
        o->d = d;
        o->s = f32_to_f16(__fmul_rn(f16_to_f32(d), (float)sum));
    }
}
