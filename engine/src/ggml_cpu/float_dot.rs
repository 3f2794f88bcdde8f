//! The summation orders of ggml's float dot products on x86-64 AVX2, which llama.cpp's CPU
//! backend runs in CI. The products themselves are exact whenever both sides are f16 or bf16
//! (11 or 8 significant bits each), so with the same order the sums come out bit for bit.
//!
//! - [`SumOrder::VecDot`]: `ggml_vec_dot_f16` / `ggml_vec_dot_f32`, used for one activation row
//!   (decode): 4 accumulators of 8 lanes (value i in lane i % 32), reduced by
//!   `GGML_F32x8_REDUCE`, the last n % 32 values added in f64.
//! - [`SumOrder::VecDotBf16`]: `ggml_vec_dot_bf16`: the same lanes, reduced as
//!   (c1 + c3) + (c2 + c4), then halves, then pairs.
//! - [`SumOrder::Sgemm`]: llamafile's tinyBLAS, which `mul_mat` takes for two or more activation
//!   rows (prefill) when the rows of the matrix are a multiple of 4 and their length of 8: one
//!   accumulator of 8 lanes (value i in lane i % 8), `hsum`.
//!
//! ggml's f32 dots accumulate with FMAs: [`dot_fused`] does too, exactly and without FMA
//! hardware ([`super::ggml_exp::fma_f32`]; x86-64's baseline has none, and `f32::mul_add` would
//! be a libm call per product).

use super::ggml_exp::fma_f32;

/// Lanes of ggml's AVX2 `ggml_vec_dot_f16`/`_f32`/`_bf16` (`GGML_F16_STEP`).
pub const VEC_DOT_LANES: usize = 32;
/// Lanes of tinyBLAS's AVX2 accumulators.
pub const SGEMM_LANES: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SumOrder {
    VecDot,
    VecDotBf16,
    Sgemm,
}

/// `GGML_F32x8_REDUCE` of 4 × 8 accumulators: 0 += 2, 1 += 3, 0 += 1, the two halves of the 8
/// lanes, then `hadd` twice: (t0 + t1) + (t2 + t3).
#[inline]
pub fn reduce_vec_dot(acc: &[f32; VEC_DOT_LANES]) -> f32 {
    let v: [f32; 16] = std::array::from_fn(|i| acc[i] + acc[i + 16]);
    let u: [f32; 8] = std::array::from_fn(|i| v[i] + v[i + 8]);
    let t: [f32; 4] = std::array::from_fn(|i| u[i] + u[i + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}

/// `ggml_vec_dot_bf16`'s reduction: c = (c1 + c3) + (c2 + c4), g = halves of c, then
/// (g0 + g2) + (g1 + g3).
#[inline]
pub fn reduce_vec_dot_bf16(acc: &[f32; VEC_DOT_LANES]) -> f32 {
    let c: [f32; 8] = std::array::from_fn(|i| (acc[i] + acc[i + 16]) + (acc[i + 8] + acc[i + 24]));
    hsum8(&c)
}

/// tinyBLAS's `hsum` of 8 lanes: halves, then (t0 + t2) + (t1 + t3).
#[inline]
pub fn hsum8(acc: &[f32; SGEMM_LANES]) -> f32 {
    let t: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
    (t[0] + t[2]) + (t[1] + t[3])
}

/// Σ widen(w[i]) · x[i] over the shorter of the two rows, in `order`, each step
/// `acc + w·x` rounded once (an FMA, see the module docs): for f32 weights.
#[inline]
pub fn dot_fused<T: Copy>(order: SumOrder, w: &[T], x: &[f32], widen: impl Fn(T) -> f32) -> f32 {
    dot_with(order, w, x, widen, |acc, w, x| fma_f32(w, x, acc))
}

/// Σ widen(w[i]) · x[i] over the shorter of the two rows, in `order`, each step `acc + w·x`
/// with the product rounded first: for f16/bf16 weights, whose products are exact anyway.
#[inline]
pub fn dot<T: Copy>(order: SumOrder, w: &[T], x: &[f32], widen: impl Fn(T) -> f32) -> f32 {
    dot_with(order, w, x, widen, |acc, w, x| acc + w * x)
}

#[inline(always)]
fn dot_with<T: Copy>(order: SumOrder, w: &[T], x: &[f32], widen: impl Fn(T) -> f32, madd: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let n = w.len().min(x.len());
    match order {
        SumOrder::Sgemm => {
            let full = n / SGEMM_LANES * SGEMM_LANES;
            let mut acc = [0.0f32; SGEMM_LANES];
            for (wc, xc) in w[..full].chunks_exact(SGEMM_LANES).zip(x[..full].chunks_exact(SGEMM_LANES)) {
                for i in 0..SGEMM_LANES {
                    acc[i] = madd(acc[i], widen(wc[i]), xc[i]);
                }
            }
            // tinyBLAS only runs with n % 8 == 0; a tail, if a caller has one, is added last.
            let mut sum = hsum8(&acc);
            for (w, x) in w[full..n].iter().zip(&x[full..n]) {
                sum = madd(sum, widen(*w), *x);
            }
            sum
        }
        SumOrder::VecDot | SumOrder::VecDotBf16 => {
            let full = n / VEC_DOT_LANES * VEC_DOT_LANES;
            let mut acc = [0.0f32; VEC_DOT_LANES];
            for (wc, xc) in w[..full].chunks_exact(VEC_DOT_LANES).zip(x[..full].chunks_exact(VEC_DOT_LANES)) {
                for i in 0..VEC_DOT_LANES {
                    acc[i] = madd(acc[i], widen(wc[i]), xc[i]);
                }
            }
            let reduced = if order == SumOrder::VecDot { reduce_vec_dot(&acc) } else { reduce_vec_dot_bf16(&acc) };
            let mut sum = reduced as f64;
            for (w, x) in w[full..n].iter().zip(&x[full..n]) {
                sum += (widen(*w) * x) as f64;
            }
            sum as f32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Powers of two spread so that every partial sum is exact: each order must give the exact
    /// total, and moving one value between lanes must not change it.
    #[test]
    fn exact_sums_agree_in_every_order() {
        for n in [1usize, 7, 8, 31, 32, 33, 64, 100, 256] {
            let w: Vec<f32> = (0..n).map(|i| 2f32.powi((i % 20) as i32 - 10)).collect();
            let x = vec![1.0f32; n];
            let exact: f64 = w.iter().map(|&v| v as f64).sum();
            for order in [SumOrder::VecDot, SumOrder::VecDotBf16, SumOrder::Sgemm] {
                assert_eq!(dot(order, &w, &x, |v| v) as f64, exact, "{order:?} n {n}");
            }
        }
    }

    /// Values chosen so that the orders round differently: each reduction is checked against
    /// its written-out tree.
    #[test]
    fn reductions_follow_ggmls_trees() {
        let acc: [f32; 32] = std::array::from_fn(|i| 1.0 + ((i * 2) % 11) as f32 * 0.1 + if i % 4 == 0 { 1e7 } else { 0.0 });
        let v: Vec<f32> = (0..16).map(|i| acc[i] + acc[i + 16]).collect();
        let u: Vec<f32> = (0..8).map(|i| v[i] + v[i + 8]).collect();
        let t: Vec<f32> = (0..4).map(|i| u[i] + u[i + 4]).collect();
        assert_eq!(reduce_vec_dot(&acc), (t[0] + t[1]) + (t[2] + t[3]));
        let c: Vec<f32> = (0..8).map(|i| (acc[i] + acc[i + 16]) + (acc[i + 8] + acc[i + 24])).collect();
        let g: Vec<f32> = (0..4).map(|i| c[i] + c[i + 4]).collect();
        assert_eq!(reduce_vec_dot_bf16(&acc), (g[0] + g[2]) + (g[1] + g[3]));
        let a8: [f32; 8] = std::array::from_fn(|i| acc[i * 3]);
        assert_eq!(hsum8(&a8), ((a8[0] + a8[4]) + (a8[2] + a8[6])) + ((a8[1] + a8[5]) + (a8[3] + a8[7])));
        // The trees round differently on these values (so a swapped tree fails above), and
        // differently from a running sum.
        assert_ne!(reduce_vec_dot(&acc), reduce_vec_dot_bf16(&acc));
        assert_ne!(hsum8(&a8), a8.iter().sum::<f32>());
    }
}
