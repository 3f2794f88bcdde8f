//! Softmax as ggml's CPU computes it (`ggml_compute_forward_soft_max_f32`): w = x · scale (+ the
//! mask, which only ever removes positions here), max, e = expf(w − max), Σe in f64, then every
//! e times (f32)(1 / Σ).
//!
//! ggml's AVX2/NEON loops use their own vector `expf` (within about 1.5 ulp of libm's); we use
//! libm's `expf`, so single probabilities may differ from llama.cpp's by an ulp or two.

/// Softmax of one row, each value first multiplied by `scale`, into `out`.
///
/// # Panics
/// If `out.len() != x.len()`.
pub fn soft_max(x: &[f32], scale: f32, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "soft_max: {} values into {}", x.len(), out.len());
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * scale;
    }
    soft_max_in_place(out, 1.0);
}

/// [`soft_max`] in place.
pub fn soft_max_in_place(x: &mut [f32], scale: f32) {
    if scale != 1.0 {
        x.iter_mut().for_each(|v| *v *= scale);
    }
    // ggml_vec_max_f32: MAX(max, x) from −inf.
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Softmax of each row of `width` values.
///
/// # Panics
/// If the lengths are not whole rows.
pub fn soft_max_rows(x: &[f32], width: usize, scale: f32, out: &mut [f32]) {
    assert!(
        width > 0 && x.len().is_multiple_of(width) && out.len() == x.len(),
        "soft_max_rows: {} values into {} (rows of {width})",
        x.len(),
        out.len()
    );
    x.chunks_exact(width).zip(out.chunks_exact_mut(width)).for_each(|(x, o)| soft_max(x, scale, o));
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_kernels::testdata::uniform_pm1;

    /// Against f64 softmax: each of our steps rounds once or twice in f32 (scale, −max, exp, the
    /// 1/Σ, the product): within 8 ulp relative per probability.
    #[test]
    fn matches_f64_softmax() {
        for (n, scale) in [(1, 1.0), (7, 0.125), (128, 1.0), (4097, 0.088)] {
            let x: Vec<f32> = (0..n as u64).map(|i| uniform_pm1(n as u64, i) * 20.0).collect();
            let mut p = vec![0.0; n];
            soft_max(&x, scale, &mut p);
            let m = x.iter().map(|&v| v as f64 * scale as f64).fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = x.iter().map(|&v| (v as f64 * scale as f64 - m).exp()).collect();
            let s: f64 = e.iter().sum();
            for (i, (&got, &e)) in p.iter().zip(&e).enumerate() {
                let exact = e / s;
                // exp amplifies the argument's rounding by |argument|: up to 40·scale ulp of it.
                let tol = (8.0 + 40.0 * scale as f64) * 2f64.powi(-24) * exact;
                assert!((got as f64 - exact).abs() <= tol + 1e-45, "n{n} i{i}: {got} vs {exact}");
            }
            assert!((p.iter().map(|&v| v as f64).sum::<f64>() - 1.0).abs() < 1e-5);
        }
    }

    #[test]
    fn masked_positions_and_ties() {
        let mut x = [1.0, f32::NEG_INFINITY, 1.0, 1.0];
        soft_max_in_place(&mut x, 1.0);
        assert_eq!(x, [1.0 / 3.0, 0.0, 1.0 / 3.0, 1.0 / 3.0].map(|v: f64| v as f32));
        let rows = [0.0, 0.0, 3.0, 1.0];
        let mut out = [0.0; 4];
        soft_max_rows(&rows, 2, 1.0, &mut out);
        assert_eq!(out[..2], [0.5, 0.5]);
        assert!(out[2] > 0.88 && out[2] < 0.881);
    }
}
