//! Softmax as ggml's CPU computes it (`ggml_compute_forward_soft_max_f32` with
//! `ggml_vec_soft_max_f32`, x86 AVX2): w = x · scale (+ the mask, which only ever removes
//! positions here), max, then per vector of 8 from the start of the row e = `ggml_v_expf(w −
//! max)` ([`super::ggml_exp`]) summed in f32 (`hsum`) and added to an f64 total; the last n % 8
//! values use libm's `expf`, each added in f64; finally every e times (f32)(1 / total).
//!
//! With a sink (`ggml_soft_max_add_sinks`, gpt-oss's per-head attention sinks), the sink logit
//! joins the max (ggml's `MAX(max, sink)`, unscaled) and the total (libm's `expf(sink − max)`
//! added in f64 after the row's sum), and has no output of its own.

use super::float_dot::hsum8;
use super::ggml_exp::{VECTOR, ggml_expf};

/// Softmax of one row, each value first multiplied by `scale`, into `out`.
///
/// # Panics
/// If `out.len() != x.len()`.
pub fn soft_max(x: &[f32], scale: f32, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "soft_max: {} values into {}", x.len(), out.len());
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * scale;
    }
    soft_max_scaled(out, false, None);
}

/// [`soft_max`] with a sink logit (`ggml_soft_max_ext` + `ggml_soft_max_add_sinks`): the
/// outputs sum to 1 − the sink's share.
///
/// # Panics
/// If `out.len() != x.len()`.
pub fn soft_max_sink(x: &[f32], scale: f32, sink: f32, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "soft_max_sink: {} values into {}", x.len(), out.len());
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * scale;
    }
    soft_max_scaled(out, false, Some(sink));
}

/// [`soft_max`] in place.
pub fn soft_max_in_place(x: &mut [f32], scale: f32) {
    if scale != 1.0 {
        x.iter_mut().for_each(|v| *v *= scale);
    }
    soft_max_scaled(x, false, None);
}

/// Softmax of the visible part of an attention row: llama.cpp's row runs on over masked
/// positions (its KV length is a multiple of 256) whose exp is 0, so every visible value is in
/// a full vector of 8: the last, partial one is completed with zeros rather than left to libm.
/// `x` must start at a multiple of 8 of llama.cpp's row (masked values given as −inf).
pub(crate) fn soft_max_visible_in_place(x: &mut [f32], scale: f32, sink: Option<f32>) {
    if scale != 1.0 {
        x.iter_mut().for_each(|v| *v *= scale);
    }
    soft_max_scaled(x, true, sink);
}

fn soft_max_scaled(x: &mut [f32], pad_last_vector: bool, sink: Option<f32>) {
    // ggml_vec_max_f32: MAX(max, x) from −inf; then MAX(max, sink).
    let mut max = x.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if let Some(s) = sink {
        max = if max > s { max } else { s };
    }
    let full = if pad_last_vector { x.len() } else { x.len() / VECTOR * VECTOR };
    let mut sum = 0.0f64;
    for chunk in x[..full].chunks_mut(VECTOR) {
        let mut lanes = [0.0f32; VECTOR];
        for (l, v) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *v = ggml_expf(*v - max);
            *l = *v;
        }
        sum += hsum8(&lanes) as f64;
    }
    for v in x[full..].iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    if let Some(s) = sink {
        sum += (s - max).exp() as f64;
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

    /// Against f64 softmax: ggml's expf is within 1.5 ulp, and the other steps (scale, −max, the
    /// 1/Σ, the product) round once each; exp amplifies its argument's rounding by |argument|
    /// (<= 40·scale here).
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
                let tol = (8.0 + 40.0 * scale as f64) * 2f64.powi(-24) * exact;
                assert!((got as f64 - exact).abs() <= tol + 1e-45, "n{n} i{i}: {got} vs {exact}");
            }
            assert!((p.iter().map(|&v| v as f64).sum::<f64>() - 1.0).abs() < 1e-5);
        }
    }

    #[test]
    fn vectors_use_ggmls_exp_and_the_tail_libms() {
        // 11 values: 8 through ggml_expf, 3 through libm's expf.
        let x: Vec<f32> = (0..11).map(|i| -0.37 * i as f32).collect();
        let mut p = x.clone();
        soft_max_in_place(&mut p, 1.0);
        let e: Vec<f32> = x.iter().enumerate().map(|(i, &v)| if i < 8 { ggml_expf(v) } else { v.exp() }).collect();
        let sum = hsum8(e[..8].try_into().unwrap()) as f64 + e[8..].iter().map(|&v| v as f64).sum::<f64>();
        let inv = (1.0 / sum) as f32;
        assert!(p.iter().zip(&e).all(|(p, e)| *p == e * inv));
        // The visible part of an attention row: all 11 through ggml_expf, the last vector padded.
        let mut q = x.clone();
        soft_max_visible_in_place(&mut q, 1.0, None);
        let e: Vec<f32> = x.iter().map(|&v| ggml_expf(v)).collect();
        let mut last = [0.0; 8];
        last[..3].copy_from_slice(&e[8..]);
        let inv = (1.0 / (hsum8(e[..8].try_into().unwrap()) as f64 + hsum8(&last) as f64)) as f32;
        assert!(q.iter().zip(&e).all(|(q, e)| *q == e * inv));
    }

    /// A −inf sink is plain softmax, bit for bit; a finite one takes its exact share (checked in
    /// f64), moves the max when it is the largest logit, and leaves the outputs' ratios alone.
    #[test]
    fn sinks() {
        for n in [3usize, 8, 13, 257] {
            let x: Vec<f32> = (0..n as u64).map(|i| uniform_pm1(40 + n as u64, i) * 10.0).collect();
            let (mut plain, mut sunk) = (vec![0.0; n], vec![0.0; n]);
            soft_max(&x, 0.3, &mut plain);
            soft_max_sink(&x, 0.3, f32::NEG_INFINITY, &mut sunk);
            assert_eq!(plain, sunk, "n {n}: a -inf sink");
            for sink in [-2.0f32, 0.5, 9.0] {
                soft_max_sink(&x, 0.3, sink, &mut sunk);
                let w: Vec<f64> = x.iter().map(|&v| (v * 0.3) as f64).collect();
                let m = w.iter().cloned().fold(sink as f64, f64::max);
                let z: f64 = w.iter().map(|v| (v - m).exp()).sum::<f64>() + (sink as f64 - m).exp();
                for (i, (&got, v)) in sunk.iter().zip(&w).enumerate() {
                    let exact = (v - m).exp() / z;
                    assert!((got as f64 - exact).abs() <= 1e-6 * exact + 1e-45, "n {n} sink {sink} i {i}: {got} vs {exact}");
                }
                let share = (sink as f64 - m).exp() / z;
                assert!((sunk.iter().map(|&v| v as f64).sum::<f64>() + share - 1.0).abs() < 1e-5, "n {n} sink {sink}");
            }
        }
        // The sink is not scaled: logits 0 and a sink of 0 split evenly at any scale.
        let mut p = [0.0; 1];
        soft_max_sink(&[0.0], 1e-3, 0.0, &mut p);
        assert_eq!(p, [0.5]);
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
