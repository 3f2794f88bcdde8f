// Embedding lookup: out[t, :] = dequantize(table[ids[t], :]).
// The table is [vocab, hidden] in q8_0, q4_0 or f32; out is f32 [tokens, hidden].
//
// Geometry: one block per token on grid.x (tokens grow: limit 2^31 - 1), its threads stride over
// the hidden columns. No collectives, so a block may return early.
// An id outside [0, vocab) would read outside the table: its row is written as zeros and counted
// in `bad` (clamp-and-flag: the engine reads the counter and fails the request, the kernel never
// faults). Row offsets id * row_bytes (up to 1.2 GB for an f32 151,936 x 2048 table) and
// t * hidden (past 2^31 at 1,048,576 tokens for hidden 2048) are 64-bit.

#define EMBED_THREADS 256

static __device__ __forceinline__ u64 embed_row_bytes(int ttype, int hidden) {
    return ttype == TTYPE_F32 ? (u64)hidden * sizeof(float) : weight_row_bytes(ttype, hidden);
}

// Element c of a table row: d * q as in ggml's dequantize (exact in f32: an f16 times an integer
// of at most 8 bits).
static __device__ __forceinline__ float embed_element(const unsigned char* row, int ttype, int c) {
    if (ttype == TTYPE_F32) return ((const float*)row)[c];
    const int j = c % QK;
    if (ttype == WTYPE_Q8_0) {
        const block_q8_0* b = (const block_q8_0*)row + c / QK;
        return f16_to_f32(b->d) * (float)b->qs[j];
    }
    // q4_0: element j < 16 is the low nibble of byte j, element j >= 16 the high nibble of byte j - 16.
    const block_q4_0* b = (const block_q4_0*)row + c / QK;
    const int q = j < QK / 2 ? (b->qs[j] & 0x0f) : (b->qs[j - QK / 2] >> 4);
    return f16_to_f32(b->d) * (float)(q - 8);
}

extern "C" __global__ void __launch_bounds__(EMBED_THREADS)
embed(const int* __restrict__ ids, const unsigned char* __restrict__ table, int ttype, float* __restrict__ out, int vocab,
      int hidden, unsigned long long* __restrict__ bad) {
    GRID_DEPENDENCY_WAIT();
    const u64 t = blockIdx.x;
    const int id = ids[t];
    float* o = out + t * (u64)hidden;
    if (id < 0 || id >= vocab) {
        for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = 0.0f;
        if (threadIdx.x == 0) atomicAdd(bad, 1ull);
        return;
    }
    const unsigned char* row = table + (u64)id * embed_row_bytes(ttype, hidden);
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = embed_element(row, ttype, c);
}
