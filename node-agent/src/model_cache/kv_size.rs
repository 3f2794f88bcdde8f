//! Bytes of KV cache one token takes, as the engine allocates it: per layer, K and V, each
//! `kv_heads x head_dim` elements of the cache's element type. The CUDA backend
//! (engine/src/backend/cuda/kv.rs, `KvSpec::bytes`) stores both as f16, so an element is 2
//! bytes; the operator multiplies this by a replica's context and concurrency to size its
//! memory request, so it must match what the engine really allocates.

/// Bytes of one KV-cache element: f16, as the CUDA backend stores K and V.
pub const KV_ELEMENT_BYTES: u64 = 2;

/// K and V.
const KV_TENSORS: u64 = 2;

/// `layers x kv_heads x head_dim x 2 (K and V) x KV_ELEMENT_BYTES`; None when a factor is zero
/// (no KV cache to size: a broken header, not a free model) or the product overflows u64.
pub fn kv_bytes_per_token(layers: u64, kv_heads: u64, head_dim: u64) -> Option<u64> {
    let bytes = [kv_heads, head_dim, KV_TENSORS, KV_ELEMENT_BYTES].into_iter().try_fold(layers, |n, f| n.checked_mul(f))?;
    (bytes > 0).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_30b_a3b_takes_96_kib_per_token() {
        // Qwen3-30B-A3B: 48 layers, 4 KV heads of 128 dims: 48 x 4 x 128 x 2 x 2 bytes.
        assert_eq!(kv_bytes_per_token(48, 4, 128), Some(98_304));
        // A 32k context for 4 sequences: 12 GiB, the figure a replica's memory request carries.
        assert_eq!(kv_bytes_per_token(48, 4, 128).unwrap() * 32_768 * 4, 12 << 30);
        // Qwen3-235B-A22B: 94 layers, 4 KV heads of 128 dims.
        assert_eq!(kv_bytes_per_token(94, 4, 128), Some(192_512));
    }

    #[test]
    fn zero_and_overflow_give_none() {
        assert_eq!(kv_bytes_per_token(0, 4, 128), None);
        assert_eq!(kv_bytes_per_token(48, 0, 128), None);
        assert_eq!(kv_bytes_per_token(48, 4, 0), None);
        assert_eq!(kv_bytes_per_token(u64::MAX / 2, 4, 128), None);
        assert_eq!(kv_bytes_per_token(1, 1, 1), Some(4));
    }
}
