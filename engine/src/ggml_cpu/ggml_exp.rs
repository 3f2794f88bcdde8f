//! ggml's vector `expf` (`ggml_v_expf`, from Arm's optimized-routines: the same arithmetic in
//! its AVX2, AVX-512 and NEON versions), lane by lane. llama.cpp's softmax and SiLU run it on
//! every full vector of a row and libm's `expf` only on the last n % 8 values (AVX2), so
//! mirroring it is what makes probabilities and activations bit-identical rather than a few
//! ulp apart (it is within 1.5 ulp of the true exp, libm's within 0.5: they differ often).
//!
//! Its FMAs are computed exactly ([`fma_f32`]), with FMA hardware where the build target has it
//! and without where it may not (x86-64's baseline, where `f32::mul_add` is a libm call).

/// a·b + c rounded once to f32: the FMA instruction where the target has one for certain
/// (aarch64, or x86-64 built with the `fma` feature), else [`fma_f32_soft`].
#[inline(always)]
pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(any(target_arch = "aarch64", target_feature = "fma"))]
    {
        a.mul_add(b, c)
    }
    #[cfg(not(any(target_arch = "aarch64", target_feature = "fma")))]
    {
        fma_f32_soft(a, b, c)
    }
}

/// a·b + c rounded once to f32 without FMA hardware. The product is exact in f64; the f64 sum
/// is made round-to-odd (its last bit set when it is inexact, from the exact error of TwoSum),
/// and round-to-odd at 53 bits followed by round-to-nearest at 24 is correctly rounded
/// (53 >= 2·24 + 2).
#[inline(always)]
pub fn fma_f32_soft(a: f32, b: f32, c: f32) -> f32 {
    let p = a as f64 * b as f64;
    let c = c as f64;
    let s = p + c;
    // TwoSum: s + err == p + c exactly.
    let bv = s - p;
    let err = (p - (s - bv)) + (c - bv);
    let bits = s.to_bits();
    let odd = if err != 0.0 && bits & 1 == 0 && s.is_finite() {
        // The exact value lies between s and its neighbour towards err: take the odd one.
        f64::from_bits(if (err > 0.0) == (s > 0.0) { bits + 1 } else { bits - 1 })
    } else {
        s
    };
    odd as f32
}

const R: f32 = f32::from_bits(0x4b40_0000); // 0x1.8p23
const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b); // 0x1.715476p+0
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e); // 0x1.7f7d1cp-20
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0x1.62e4p-1
const P0: f32 = f32::from_bits(0x3c07_2010); // 0x1.0e4020p-7
const P1: f32 = f32::from_bits(0x3d2b_9f17); // 0x1.573e2ep-5
const P2: f32 = f32::from_bits(0x3e2a_af33); // 0x1.555e66p-3
const P3: f32 = f32::from_bits(0x3eff_fedb); // 0x1.fffdb6p-2
const P4: f32 = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1

/// One lane of `ggml_v_expf`.
#[inline]
pub fn ggml_expf(x: f32) -> f32 {
    let z = fma_f32(x, INV_LN2, R);
    let n = z - R;
    let b = fma_f32(-n, LN2_LO, fma_f32(-n, LN2_HI, x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = fma_f32(fma_f32(fma_f32(P0, b, P1), u, fma_f32(P2, b, P3)), u, P4 * b);
    if n.abs() <= 126.0 || n.is_nan() {
        return fma_f32(j, k, k);
    }
    // Large |n|: scale in two steps (s1·s2), or saturate to 0 / inf past 192.
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 { s1 * s1 } else { fma_f32(s2, j, s2) * s1 }
}

/// One lane of `ggml_v_silu`: x / (1 + ggml_v_expf(0 − x)).
#[inline]
pub fn ggml_silu(x: f32) -> f32 {
    x / (1.0 + ggml_expf(0.0 - x))
}

/// Values per vector of the loops that use `ggml_v_expf` (AVX2: 8 f32).
pub const VECTOR: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use brink_kernels::testdata::hash2;

    /// Exact FMA against libm's `fmaf` (correctly rounded), on random operands of every
    /// magnitude and on sums that cancel.
    #[test]
    fn fma_is_correctly_rounded() {
        let mut checked = 0;
        for i in 0..200_000u64 {
            let h = hash2(1, i);
            let a = f32::from_bits((h as u32) & 0xbfff_ffff); // finite, |a| < 2^1
            let b = f32::from_bits(((h >> 32) as u32) & 0xbfff_ffff);
            let c = if i % 2 == 0 {
                -(a * b) * (1.0 + (i % 7) as f32 * f32::EPSILON)
            } else {
                f32::from_bits(hash2(2, i) as u32 & 0xbfff_ffff)
            };
            let want = a.mul_add(b, c);
            let got = fma_f32_soft(a, b, c);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "fma({a:e}, {b:e}, {c:e}): {got:e} vs {want:e}");
            checked += 1;
        }
        assert_eq!(checked, 200_000);
        // Where the f64 sum rounds onto an f32 midpoint: a·b = 64 + 4688·2^-40 (mantissas
        // (2^23 + 2896)(2^23 − 2895) = 2^46 + 4688), + 2^30 is just above 2^30 + 64, the midpoint.
        let (a, b, c) = ((8_388_608.0 + 2896.0) * 2f32.powi(-20), (8_388_608.0 - 2895.0) * 2f32.powi(-20), 2f32.powi(30));
        assert_eq!(fma_f32_soft(a, b, c), 2f32.powi(30) + 128.0);
        assert_eq!(fma_f32(a, b, c), 2f32.powi(30) + 128.0);
        assert_eq!(a.mul_add(b, c), 2f32.powi(30) + 128.0);
        assert_eq!((a as f64 * b as f64 + c as f64) as f32, 2f32.powi(30), "the plain f64 route rounds twice here");
    }

    /// Within ggml's stated 1.5 ulp of the true exp while the result is a normal f32 (below
    /// that an ulp is 2^-149, whatever the value), and the saturations past the range.
    #[test]
    fn expf_is_ggmls_accuracy_and_range() {
        let mut i = -100.0f32;
        while i < 88.0 {
            let (got, exact) = (ggml_expf(i) as f64, (i as f64).exp());
            let ulp = (exact as f32).abs().max(f32::MIN_POSITIVE) as f64 * f32::EPSILON as f64;
            assert!((got - exact).abs() <= 2.0 * ulp, "exp({i}) = {got} vs {exact}");
            i += 0.0137;
        }
        assert_eq!(ggml_expf(0.0), 1.0);
        assert_eq!(ggml_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(ggml_expf(-200.0), 0.0);
        assert_eq!(ggml_expf(200.0), f32::INFINITY);
        assert!((ggml_silu(2.0) - 2.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
    }
}
