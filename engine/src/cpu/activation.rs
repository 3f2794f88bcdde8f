//! SiLU and SwiGLU as ggml's CPU computes them: silu(x) = x / (1 + expf(−x)) (`ggml_silu_f32`),
//! swiglu(g, u) = silu(g) · u (`ggml_vec_swiglu_f32`). ggml's vector loops use their own `expf`
//! (see softmax.rs); we use libm's.

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `out[i] = silu(gate[i]) · up[i]`.
///
/// # Panics
/// If the three lengths differ.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len(), "swiglu: gate {}, up {}, out {}", gate.len(), up.len(), out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// `x[i] = silu(x[i])`.
pub fn silu_in_place(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu(*v));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_matches_f64_and_limits() {
        for i in -400..=400 {
            let x = i as f32 * 0.05;
            let exact = x as f64 / (1.0 + (-(x as f64)).exp());
            // exp, +1, / each round once; exp's argument error grows with |x| (<= 20 here).
            assert!((silu(x) as f64 - exact).abs() <= 24.0 * 2f64.powi(-24) * exact.abs() + 1e-30, "{x}");
        }
        assert_eq!(silu(0.0), 0.0);
        assert_eq!(silu(-200.0), -0.0);
        assert_eq!(silu(200.0), 200.0);
    }

    #[test]
    fn swiglu_multiplies_by_up() {
        let mut out = [0.0; 3];
        swiglu(&[1.0, -2.0, 0.0], &[2.0, 3.0, 5.0], &mut out);
        assert_eq!(out, [silu(1.0) * 2.0, silu(-2.0) * 3.0, 0.0]);
        let mut x = [1.0, -2.0];
        silu_in_place(&mut x);
        assert_eq!(x, [silu(1.0), silu(-2.0)]);
    }
}
