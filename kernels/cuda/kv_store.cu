// Writes a batch's K and V rows (f32 [rows, width], width = n_kv * head_dim) into the paged f16
// caches ([num_blocks, block_size, width], i.e. cache_rows = num_blocks * block_size rows) at each
// row's physical cache row (block * block_size + pos % block_size, resolved on the host from the
// chunk's block table), rounding to nearest even (cvt.rn, as __float2half_rn). Grid-stride over
// rows x width/4 items, 64-bit: an item converts 4 floats (one 16-byte load) of K and of V into
// 8-byte stores. A row whose physical row lies outside the cache is dropped: a bad index from the
// engine never writes out of bounds. No collectives.

extern "C" __global__ void kv_store(const float* __restrict__ k, const float* __restrict__ v, const i64* __restrict__ dest,
                                    u16* __restrict__ kc, u16* __restrict__ vc, u64 rows, int width, i64 cache_rows) {
    GRID_DEPENDENCY_WAIT();
    const u64 w4 = (u64)(width / 4);
    const u64 items = rows * w4;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 it = (u64)blockIdx.x * blockDim.x + threadIdx.x; it < items; it += stride) {
        const u64 r = it / w4;
        const u64 e = (it - r * w4) * 4;
        const i64 d = dest[r];
        if (d < 0 || d >= cache_rows) continue;
        const u64 src = r * (u64)width + e;
        const u64 dst = (u64)d * (u64)width + e;
        const float4 kv = *(const float4*)(k + src);
        const float4 vv = *(const float4*)(v + src);
        uint2 kh, vh;
        kh.x = (u32)f32_to_f16(kv.x) | ((u32)f32_to_f16(kv.y) << 16);
        kh.y = (u32)f32_to_f16(kv.z) | ((u32)f32_to_f16(kv.w) << 16);
        vh.x = (u32)f32_to_f16(vv.x) | ((u32)f32_to_f16(vv.y) << 16);
        vh.y = (u32)f32_to_f16(vv.z) | ((u32)f32_to_f16(vv.w) << 16);
        *(uint2*)(kc + dst) = kh;
        *(uint2*)(vc + dst) = vh;
    }
}
