//! NEOX RoPE as ggml's CPU computes it (`ggml_compute_forward_rope_flt`, `ggml_rope_cache_init`,
//! `rotate_pairs`) with n_dims = head_dim and no YaRN (freq_scale 1, ext_factor 0,
//! attn_factor 1), as qwen3moe uses it:
//!
//! theta_scale = powf(freq_base, −2 / n_dims); per token, theta starts at the position (as f32)
//! and is multiplied by theta_scale after each pair (iteratively, as ggml does: not
//! base^(−2i/n)); pair i rotates x[i] and x[i + n_dims/2] by cosf/sinf(theta_i), with the FMAs
//! GCC makes of ggml's rotation wherever the target has FMA (x86-64 `-march=native` builds,
//! aarch64). Without hardware FMA, `mul_add` is a libm call: correct, slower, and rope is a
//! small share of a step.

use rayon::prelude::*;

/// Tokens at or above this many are rotated on rayon's threads.
const PARALLEL_MIN_TOKENS: usize = 16;

/// The (cos, sin) of each of the `head_dim / 2` pairs at position `pos`.
pub fn rope_cache(pos: u32, head_dim: usize, freq_base: f32) -> Vec<(f32, f32)> {
    let theta_scale = freq_base.powf(-2.0 / head_dim as f32);
    let mut theta = pos as f32;
    (0..head_dim / 2)
        .map(|_| {
            let cs = (theta.cos(), theta.sin());
            theta *= theta_scale;
            cs
        })
        .collect()
}

fn rotate(head: &mut [f32], cache: &[(f32, f32)]) {
    let (a, b) = head.split_at_mut(cache.len());
    for ((x0, x1), &(cos, sin)) in a.iter_mut().zip(b.iter_mut()).zip(cache) {
        let (v0, v1) = (*x0, *x1);
        // ggml writes x0·cos − x1·sin and x0·sin + x1·cos; GCC contracts each into one FMA
        // (checked bit for bit against an FMA build of llama.cpp's ggml).
        *x0 = v0.mul_add(cos, -(v1 * sin));
        *x1 = v0.mul_add(sin, v1 * cos);
    }
}

/// Rotates `x`, laid out `[n_tokens, n_heads, head_dim]` with `n_tokens = positions.len()`, in
/// place; token t at `positions[t]`.
///
/// # Panics
/// If `head_dim` is odd or zero, or `x.len() != positions.len() · n_heads · head_dim`.
pub fn rope_neox(x: &mut [f32], n_heads: usize, head_dim: usize, positions: &[u32], freq_base: f32) {
    assert!(head_dim > 0 && head_dim.is_multiple_of(2), "rope: head_dim {head_dim} must be even");
    assert_eq!(
        x.len(),
        positions.len() * n_heads * head_dim,
        "rope: {} values for {} tokens x {n_heads} heads x {head_dim}",
        x.len(),
        positions.len()
    );
    if n_heads == 0 {
        return;
    }
    let token = |(tok, &pos): (&mut [f32], &u32)| {
        let cache = rope_cache(pos, head_dim, freq_base);
        tok.chunks_exact_mut(head_dim).for_each(|h| rotate(h, &cache));
    };
    let row = n_heads * head_dim;
    if positions.len() < PARALLEL_MIN_TOKENS {
        x.chunks_exact_mut(row).zip(positions).for_each(token);
    } else {
        x.par_chunks_exact_mut(row).zip(positions).for_each(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_kernels::testdata::uniform_pm1;

    /// Against f64 with exact angles theta_i = pos · base^(−2i/d): ggml's f32 theta_scale is off
    /// by half an ulp and each of the i iterated f32 products adds another, so theta_i is off by
    /// at most (2i + 3)·2^-24 relative; the rotation (cos/sin, two products, a sum) adds a few
    /// ulp of |x0| + |x1|.
    #[test]
    fn matches_f64_rotation() {
        let (n_heads, head_dim, base) = (3, 128, 1_000_000.0f32);
        for &pos in &[0u32, 1, 7, 4095, 65_535, 65_537, 200_000] {
            let mut x: Vec<f32> = (0..(n_heads * head_dim) as u64).map(|i| uniform_pm1(pos as u64, i)).collect();
            let orig = x.clone();
            rope_neox(&mut x, n_heads, head_dim, &[pos], base);
            let ts = (base as f64).powf(-2.0 / head_dim as f64);
            for h in 0..n_heads {
                for i in 0..head_dim / 2 {
                    let theta = pos as f64 * ts.powi(i as i32);
                    let (c, s) = (theta.cos(), theta.sin());
                    let (x0, x1) = (orig[h * head_dim + i] as f64, orig[h * head_dim + i + head_dim / 2] as f64);
                    let tol = (x0.abs() + x1.abs()) * (4.0 + theta * (2 * i + 3) as f64) * 2f64.powi(-24);
                    assert!((x[h * head_dim + i] as f64 - (x0 * c - x1 * s)).abs() <= tol, "pos {pos} h{h} i{i}");
                    assert!((x[h * head_dim + i + head_dim / 2] as f64 - (x0 * s + x1 * c)).abs() <= tol, "pos {pos} h{h} i{i}");
                }
            }
        }
    }

    #[test]
    fn iterated_theta_is_ggmls() {
        // The cache is built by repeated multiplication in f32, not by powers.
        let cache = rope_cache(1000, 8, 10000.0);
        let ts = 10000.0f32.powf(-2.0 / 8.0);
        let mut theta = 1000.0f32;
        for &(c, s) in &cache {
            assert_eq!((c, s), (theta.cos(), theta.sin()));
            theta *= ts;
        }
        assert_eq!(cache.len(), 4);
    }

    #[test]
    fn position_zero_is_identity_and_tokens_use_their_own_position() {
        let x: Vec<f32> = (0..64u64).map(|i| uniform_pm1(1, i)).collect();
        let mut y = x.clone();
        rope_neox(&mut y, 2, 16, &[0, 0], 10000.0);
        assert_eq!(x, y);
        // 20 tokens (the parallel path): token t equals a lone token at positions[t].
        let n = 20;
        let x: Vec<f32> = (0..(n * 32) as u64).map(|i| uniform_pm1(2, i)).collect();
        let positions: Vec<u32> = (0..n as u32).map(|t| 70_000 + 3 * t).collect();
        let mut all = x.clone();
        rope_neox(&mut all, 2, 16, &positions, 1e6);
        for t in 0..n {
            let mut one = x[t * 32..(t + 1) * 32].to_vec();
            rope_neox(&mut one, 2, 16, &positions[t..t + 1], 1e6);
            assert_eq!(&all[t * 32..(t + 1) * 32], one.as_slice());
        }
    }
}
