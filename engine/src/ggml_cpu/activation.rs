//! SiLU and SwiGLU as ggml's CPU computes them (x86 AVX2): per vector of 8 from the start of the
//! row `ggml_v_silu` = x / (1 + `ggml_v_expf`(0 − x)) ([`super::ggml_exp`]), the last n % 8
//! values `ggml_silu_f32` = x / (1 + expf(−x)) with libm's expf; swiglu(g, u) = silu(g) · u
//! (`ggml_vec_swiglu_f32`). A slice is one row: call per row when rows are not a multiple of 8.
//!
//! gpt-oss's clamped SwiGLU (`ggml_swiglu_oai`) is scalar C with libm's expf on every value:
//! x = min(gate, limit), y = clamp(up, −limit, limit), out = x / (1 + expf(alpha · −x)) · (y + 1).

use super::ggml_exp::{VECTOR, ggml_silu};

/// `ggml_silu_f32`: x / (1 + expf(−x)) with libm's expf.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SiLU of value `i` of a row: ggml's vector form for the whole vectors, libm's for the tail.
#[inline]
fn silu_at(x: f32, i: usize, full: usize) -> f32 {
    if i < full { ggml_silu(x) } else { silu(x) }
}

/// `out[i] = silu(gate[i]) · up[i]` over one row.
///
/// # Panics
/// If the three lengths differ.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len(), "swiglu: gate {}, up {}, out {}", gate.len(), up.len(), out.len());
    let full = gate.len() / VECTOR * VECTOR;
    for (i, ((o, &g), &u)) in out.iter_mut().zip(gate).zip(up).enumerate() {
        *o = silu_at(g, i, full) * u;
    }
}

/// gpt-oss's constants for [`swiglu_oai`] (llama.cpp's `LLM_FFN_SWIGLU_OAI_MOE`).
pub const OAI_ALPHA: f32 = 1.702;
pub const OAI_LIMIT: f32 = 7.0;

/// `ggml_swiglu_oai(gate, up, alpha, limit)` over any number of values (it has no vectors).
///
/// # Panics
/// If the three lengths differ.
pub fn swiglu_oai(gate: &[f32], up: &[f32], alpha: f32, limit: f32, out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len(), "swiglu_oai: gate {}, up {}, out {}", gate.len(), up.len(), out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        // std::min(g, limit) and std::clamp(u, −limit, limit) as the C++ compares them: the
        // CUDA kernel's twin computes the same, so the one function serves both.
        *o = brink_kernels::ops::swiglu::swiglu_oai_value(g, u, alpha, limit);
    }
}

/// `x[i] = silu(x[i])` over one row.
pub fn silu_in_place(x: &mut [f32]) {
    let full = x.len() / VECTOR * VECTOR;
    for (i, v) in x.iter_mut().enumerate() {
        *v = silu_at(*v, i, full);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_matches_f64_and_limits() {
        for i in -400..=400 {
            let x = i as f32 * 0.05;
            let exact = x as f64 / (1.0 + (-(x as f64)).exp());
            // exp (within 1.5 ulp for ggml's), +1, / each round once; exp's argument error grows with |x| (<= 20 here).
            for got in [silu(x), ggml_silu(x)] {
                assert!((got as f64 - exact).abs() <= 24.0 * 2f64.powi(-24) * exact.abs() + 1e-30, "{x}");
            }
        }
        assert_eq!(silu(0.0), 0.0);
        assert_eq!(silu(-200.0), -0.0);
        assert_eq!(silu(200.0), 200.0);
        assert_eq!(ggml_silu(200.0), 200.0);
    }

    /// Against f64: clamps at the limit (gate above only, up both ways), sigmoid of alpha·x, the
    /// (up + 1) factor; with alpha 1 and no clamping in reach it is libm-SiLU SwiGLU on up + 1.
    #[test]
    fn swiglu_oai_clamps_and_matches_f64() {
        let g: Vec<f32> = (-200..=200).map(|i| i as f32 * 0.06).collect();
        let u: Vec<f32> = g.iter().rev().map(|&v| v * 0.9).collect();
        let mut out = vec![0.0; g.len()];
        swiglu_oai(&g, &u, OAI_ALPHA, OAI_LIMIT, &mut out);
        for ((&o, &g), &u) in out.iter().zip(&g).zip(&u) {
            let x = (g as f64).min(7.0);
            let y = (u as f64).clamp(-7.0, 7.0);
            let exact = x / (1.0 + (-1.702f32 as f64 * x).exp()) * (y + 1.0);
            // exp's argument (<= 20.5) rounds once, exp, +1, /, +1 and × once each.
            assert!((o as f64 - exact).abs() <= 40.0 * 2f64.powi(-24) * exact.abs() + 1e-30, "g {g} u {u}: {o} vs {exact}");
        }
        // Above the limit the gate is the limit: equal outputs for gates 7, 8 and 1e30.
        let mut o = [0.0; 3];
        swiglu_oai(&[7.0, 8.0, 1e30], &[1.0; 3], OAI_ALPHA, OAI_LIMIT, &mut o);
        assert!(o[0] == o[1] && o[1] == o[2], "{o:?}");
        // Up clamps both ways: up −1e9 gives (−7 + 1) = −6 times the gate's part.
        swiglu_oai(&[1.0, 1.0, 1.0], &[-1e9, -7.0, 100.0], OAI_ALPHA, OAI_LIMIT, &mut o);
        let gate = 1.0f32 / (1.0 + (-1.702f32).exp());
        assert_eq!(o, [gate * -6.0, gate * -6.0, gate * 8.0]);
        // alpha 1, small values: silu(g) · (u + 1) with libm's SiLU.
        let mut o = [0.0; 10];
        let g10: Vec<f32> = (0..10).map(|i| i as f32 * 0.4 - 2.0).collect();
        swiglu_oai(&g10, &[0.5; 10], 1.0, 7.0, &mut o);
        assert!(o.iter().zip(&g10).all(|(o, &g)| *o == silu(g) * 1.5));
    }

    #[test]
    fn vectors_then_tail() {
        // 10 values: 8 in ggml's vector form, 2 in libm's.
        let g: Vec<f32> = (0..10).map(|i| i as f32 * 0.7 - 3.0).collect();
        let u = vec![2.0; 10];
        let mut out = vec![0.0; 10];
        swiglu(&g, &u, &mut out);
        for i in 0..10 {
            let want = if i < 8 { ggml_silu(g[i]) } else { silu(g[i]) } * 2.0;
            assert_eq!(out[i], want, "value {i}");
        }
        let mut x = g.clone();
        silu_in_place(&mut x);
        assert_eq!(x[9], silu(g[9]));
        assert_eq!(x[0], ggml_silu(g[0]));
    }
}
