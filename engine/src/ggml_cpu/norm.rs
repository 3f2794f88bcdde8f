//! RMSNorm as ggml's CPU computes it (`ggml_compute_forward_rms_norm_f32`, fused or not with the
//! weight multiply): Σx² in f64 over f32 squares, mean = (f32)(Σ / n), scale = 1 / sqrtf(mean +
//! eps) in f32, y = (x · scale) · w.

use rayon::prelude::*;

/// Rows at or above this many values are normalised on rayon's threads.
const PARALLEL_MIN_VALUES: usize = 1 << 15;

/// One row: `out = x · (1 / sqrt(mean(x²) + eps)) · weight`.
fn norm_row(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// RMSNorm of each row of `width` values of `x` into `out`, times `weight` (`width` values).
/// Also per head for the Q/K norm: rows = tokens × heads, width = head_dim.
///
/// # Panics
/// If `weight.len() != width`, `x.len()` is not a multiple of `width`, or `out.len() != x.len()`.
pub fn rms_norm(x: &[f32], width: usize, weight: &[f32], eps: f32, out: &mut [f32]) {
    assert!(width > 0 && weight.len() == width, "rms_norm: weight of {} for rows of {width}", weight.len());
    assert!(x.len().is_multiple_of(width) && out.len() == x.len(), "rms_norm: {} values into {} (rows of {width})", x.len(), out.len());
    if x.len() < PARALLEL_MIN_VALUES {
        x.chunks_exact(width).zip(out.chunks_exact_mut(width)).for_each(|(x, o)| norm_row(x, weight, eps, o));
    } else {
        x.par_chunks_exact(width).zip(out.par_chunks_exact_mut(width)).for_each(|(x, o)| norm_row(x, weight, eps, o));
    }
}

/// [`rms_norm`] in place.
pub fn rms_norm_in_place(x: &mut [f32], width: usize, weight: &[f32], eps: f32) {
    assert!(width > 0 && weight.len() == width, "rms_norm: weight of {} for rows of {width}", weight.len());
    assert!(x.len().is_multiple_of(width), "rms_norm: {} values in rows of {width}", x.len());
    let f = |row: &mut [f32]| {
        let copy = row.to_vec();
        norm_row(&copy, weight, eps, row);
    };
    if x.len() < PARALLEL_MIN_VALUES { x.chunks_exact_mut(width).for_each(f) } else { x.par_chunks_exact_mut(width).for_each(f) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_kernels::testdata::uniform_pm1;

    /// Against f64: x·w / sqrt(mean(x²) + eps). Our f32 steps (square, mean, +eps, sqrt, 1/·,
    /// ·scale, ·w) each round once: within 8·2^-24 relative, per value.
    #[test]
    fn matches_f64_formula() {
        for (width, rows) in [(1, 3), (128, 7), (2048, 2), (4096, 9)] {
            let x: Vec<f32> = (0..(width * rows) as u64).map(|i| uniform_pm1(1, i) * 4.0).collect();
            let w: Vec<f32> = (0..width as u64).map(|i| 1.0 + uniform_pm1(2, i) * 0.5).collect();
            let eps = 1e-6;
            let mut out = vec![f32::NAN; x.len()];
            rms_norm(&x, width, &w, eps, &mut out);
            let mut inplace = x.clone();
            rms_norm_in_place(&mut inplace, width, &w, eps);
            assert_eq!(inplace, out);
            for r in 0..rows {
                let xr = &x[r * width..(r + 1) * width];
                let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / width as f64;
                let s = 1.0 / (ms + eps as f64).sqrt();
                for i in 0..width {
                    let exact = xr[i] as f64 * s * w[i] as f64;
                    let got = out[r * width + i] as f64;
                    assert!((got - exact).abs() <= 8.0 * 2f64.powi(-24) * exact.abs() + 1e-30, "w{width} r{r} i{i}: {got} vs {exact}");
                }
            }
        }
    }

    #[test]
    fn eps_keeps_zero_rows_finite() {
        let mut out = [f32::NAN; 4];
        rms_norm(&[0.0; 4], 4, &[1.0; 4], 1e-6, &mut out);
        assert_eq!(out, [0.0; 4]);
    }

    #[test]
    fn large_inputs_take_the_parallel_path_unchanged() {
        let width = 128;
        let x: Vec<f32> = (0..(width * 600) as u64).map(|i| uniform_pm1(3, i)).collect();
        let w = vec![0.5; width];
        let mut out = vec![0.0; x.len()];
        rms_norm(&x, width, &w, 1e-5, &mut out);
        let mut one = vec![0.0; width];
        rms_norm(&x[599 * width..], width, &w, 1e-5, &mut one);
        assert_eq!(&out[599 * width..], one.as_slice());
    }
}
