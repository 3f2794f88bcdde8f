//! NEOX RoPE as ggml's CPU computes it (`ggml_compute_forward_rope_flt`, `ggml_rope_cache_init`,
//! `rotate_pairs`) with n_dims = head_dim; [`rope_neox`] without YaRN (freq_scale 1,
//! ext_factor 0, attn_factor 1), as qwen3moe uses it:
//!
//! theta_scale = powf(freq_base, −2 / n_dims); per token, theta starts at the position (as f32)
//! and is multiplied by theta_scale after each pair (iteratively, as ggml does: not
//! base^(−2i/n)); pair i rotates x[i] and x[i + n_dims/2] by cosf/sinf(theta_i), with the FMAs
//! GCC makes of ggml's rotation wherever the target has FMA (x86-64 `-march=native` builds,
//! aarch64). Without hardware FMA, `mul_add` is a libm call: correct, slower, and rope is a
//! small share of a step.
//!
//! YaRN (gpt-oss: [`Yarn`], [`rope_neox_yarn`]) changes only the cache, as `rope_yarn` does:
//! theta_interp = freq_scale · theta; with ext_factor != 0 the pair's angle mixes in the
//! unscaled one by a ramp over the correction dims (`ggml_rope_yarn_corr_dims`, in f32 from
//! n_ctx_orig, beta_fast and beta_slow), theta = theta_interp·(1 − mix) + theta·mix, and the
//! magnitude is attn_factor · (1 + 0.1·ln(1 / freq_scale)); cos and sin are each multiplied by
//! that magnitude. Where ggml-cpu's C has a·b + c, GCC's contraction makes it one FMA (the
//! first product fused), so those are [`fma_f32`] here.

use rayon::prelude::*;

use super::ggml_exp::fma_f32;

/// `ggml_rope_ext`'s YaRN parameters (llama.cpp's cparams: freq_scale = 1 / the rope scaling
/// factor, ext_factor 1 for YaRN models, attn_factor as llama.cpp derives it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: u32,
}

impl Yarn {
    /// No scaling: the cache is plain RoPE's, bit for bit.
    pub const NONE: Yarn = Yarn { freq_scale: 1.0, ext_factor: 0.0, attn_factor: 1.0, beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 0 };
}

/// `ggml_rope_yarn_corr_dim`: the dim whose wavelength fits `n_rot` turns into n_ctx_orig.
fn corr_dim(n_dims: usize, n_ctx_orig: u32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln())
}

/// `ggml_rope_yarn_corr_dims`: [max(0, floor(dim(beta_fast))), min(n_dims − 1, ceil(dim(beta_slow)))].
pub fn yarn_corr_dims(n_dims: usize, n_ctx_orig: u32, freq_base: f32, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
    let start = corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base).floor();
    let end = corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base).ceil();
    let last = (n_dims - 1) as f32;
    // ggml's MAX(0, start) and MIN(n_dims − 1, end), NaN falling through as the C does.
    [if 0.0 > start { 0.0 } else { start }, if last < end { last } else { end }]
}

/// The (cos, sin) of each of the `n_dims / 2` pairs at position `pos` under YaRN
/// (`ggml_rope_cache_init` with `rope_yarn`, no frequency factors).
pub fn rope_cache_yarn(pos: u32, n_dims: usize, freq_base: f32, yarn: &Yarn) -> Vec<(f32, f32)> {
    let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
    let [low, high] = yarn_corr_dims(n_dims, yarn.n_ctx_orig, freq_base, yarn.beta_fast, yarn.beta_slow);
    let mut mscale = yarn.attn_factor;
    if yarn.ext_factor != 0.0 {
        mscale *= fma_f32(0.1, (1.0 / yarn.freq_scale).ln(), 1.0);
    }
    let ramp_div = if 0.001 > high - low { 0.001 } else { high - low };
    let mut theta = pos as f32;
    (0..n_dims / 2)
        .map(|i| {
            let interp = yarn.freq_scale * theta;
            let t = if yarn.ext_factor != 0.0 {
                // rope_yarn_ramp: 1 − MIN(1, MAX(0, (i − low) / MAX(0.001, high − low))).
                let y = (i as f32 - low) / ramp_div;
                let y = if 0.0 > y { 0.0 } else { y };
                let mix = (1.0 - if 1.0 < y { 1.0 } else { y }) * yarn.ext_factor;
                fma_f32(interp, 1.0 - mix, theta * mix)
            } else {
                interp
            };
            theta *= theta_scale;
            (t.cos() * mscale, t.sin() * mscale)
        })
        .collect()
}

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
    rope_neox_with(x, n_heads, head_dim, positions, |pos| rope_cache(pos, head_dim, freq_base));
}

/// [`rope_neox`] with YaRN scaling ([`Yarn`]), n_dims = head_dim as gpt-oss uses it.
///
/// # Panics
/// As [`rope_neox`].
pub fn rope_neox_yarn(x: &mut [f32], n_heads: usize, head_dim: usize, positions: &[u32], freq_base: f32, yarn: &Yarn) {
    rope_neox_with(x, n_heads, head_dim, positions, |pos| rope_cache_yarn(pos, head_dim, freq_base, yarn));
}

fn rope_neox_with(x: &mut [f32], n_heads: usize, head_dim: usize, positions: &[u32], cache: impl Fn(u32) -> Vec<(f32, f32)> + Sync) {
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
        let cache = cache(pos);
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

    /// gpt-oss's YaRN: factor 32 over n_ctx_orig 4096, base 150000, 64 dims.
    const GPT_OSS: Yarn =
        Yarn { freq_scale: 1.0 / 32.0, ext_factor: 1.0, attn_factor: 1.0, beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 4096 };

    #[test]
    fn yarn_corr_dims_match_f64() {
        for (n_dims, n_ctx, base) in [(64usize, 4096u32, 150_000.0f32), (128, 32_768, 1e6), (128, 4096, 10_000.0), (16, 8, 10_000.0)] {
            let dim = |beta: f64| n_dims as f64 * (n_ctx as f64 / (beta * 2.0 * std::f64::consts::PI)).ln() / (2.0 * (base as f64).ln());
            let want = [dim(32.0).floor().max(0.0), dim(1.0).ceil().min(n_dims as f64 - 1.0)];
            assert_eq!(yarn_corr_dims(n_dims, n_ctx, base, 32.0, 1.0).map(f64::from), want, "{n_dims} dims, n_ctx {n_ctx}, base {base}");
        }
        assert_eq!(yarn_corr_dims(64, 4096, 150_000.0, 32.0, 1.0), [8.0, 18.0]);
    }

    /// Without YaRN (ext_factor 0, freq_scale 1, attn_factor 1) the cache is plain RoPE's, bit
    /// for bit; with gpt-oss's, pairs at or below the low dim keep the unscaled angle, pairs at
    /// or above the high dim take the interpolated one, exactly, and between them the angle
    /// lies between the two; every (cos, sin) has the magnitude 1 + 0.1·ln 32.
    #[test]
    fn yarn_cache_limits() {
        for pos in [0u32, 1, 127, 128, 4095, 131_071] {
            assert_eq!(rope_cache_yarn(pos, 64, 150_000.0, &Yarn::NONE), rope_cache(pos, 64, 150_000.0), "pos {pos}");
            let none_but_factor = Yarn { freq_scale: 1.0, ext_factor: 0.0, ..GPT_OSS };
            assert_eq!(rope_cache_yarn(pos, 64, 150_000.0, &none_but_factor), rope_cache(pos, 64, 150_000.0), "pos {pos}");
            let got = rope_cache_yarn(pos, 64, 150_000.0, &GPT_OSS);
            // 1 + 0.1·ln 32 rounded once (ggml's FMA); the f64 product and sum are exact here.
            let mscale = (1.0 + 0.1f32 as f64 * 32f32.ln() as f64) as f32;
            let ts = 150_000.0f32.powf(-2.0 / 64.0);
            let mut theta = pos as f32;
            for (i, &(c, s)) in got.iter().enumerate() {
                let interp = theta / 32.0;
                if i <= 8 || i >= 18 {
                    let t = if i <= 8 { theta } else { interp };
                    assert_eq!((c, s), (t.cos() * mscale, t.sin() * mscale), "pos {pos} pair {i}");
                } else if theta < std::f32::consts::PI {
                    // Between the dims the angle is a mix: recover it where it is unambiguous.
                    let a = (s as f64).atan2(c as f64);
                    assert!(a >= interp as f64 - 1e-5 && a <= theta as f64 + 1e-5, "pos {pos} pair {i}: {a} outside [{interp}, {theta}]");
                }
                assert!(((c as f64).hypot(s as f64) - mscale as f64).abs() < 1e-6, "pos {pos} pair {i}");
                theta *= ts;
            }
        }
    }

    /// YaRN rotation against f64 with the same ramp: the angle differs from the f64 one by the
    /// iterated theta's rounding (as in matches_f64_rotation) and the mix's few roundings.
    #[test]
    fn yarn_rotation_matches_f64() {
        let (n_heads, head_dim, base) = (2, 64, 150_000.0f32);
        let [low, high] = [8.0f64, 18.0];
        let mscale = 1.0 + 0.1 * 32f64.ln();
        for &pos in &[0u32, 5, 127, 128, 129, 4097, 100_000] {
            let mut x: Vec<f32> = (0..(n_heads * head_dim) as u64).map(|i| uniform_pm1(50 + pos as u64, i)).collect();
            let orig = x.clone();
            rope_neox_yarn(&mut x, n_heads, head_dim, &[pos], base, &GPT_OSS);
            let ts = (base as f64).powf(-2.0 / head_dim as f64);
            for h in 0..n_heads {
                for i in 0..head_dim / 2 {
                    let extrap = pos as f64 * ts.powi(i as i32);
                    let mix = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let theta = extrap / 32.0 * (1.0 - mix) + extrap * mix;
                    let (c, s) = (theta.cos() * mscale, theta.sin() * mscale);
                    let (x0, x1) = (orig[h * head_dim + i] as f64, orig[h * head_dim + i + head_dim / 2] as f64);
                    let tol = (x0.abs() + x1.abs()) * mscale * (8.0 + extrap * (2 * i + 8) as f64) * 2f64.powi(-24);
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
