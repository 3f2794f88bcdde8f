//! SiLU and SwiGLU as ggml's CPU computes them (x86 AVX2): per vector of 8 from the start of the
//! row `ggml_v_silu` = x / (1 + `ggml_v_expf`(0 − x)) ([`super::ggml_exp`]), the last n % 8
//! values `ggml_silu_f32` = x / (1 + expf(−x)) with libm's expf; swiglu(g, u) = silu(g) · u
//! (`ggml_vec_swiglu_f32`). A slice is one row: call per row when rows are not a multiple of 8.

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
