//! Dot products of one weight row with one activation row, with ggml's CPU arithmetic.
//!
//! Quantized types: [`super::quant_dot`], in the lanes and order of ggml's AVX2 code (bit for
//! bit). The q4_0 and q8_0 dots of llamafile's sgemm are the same arithmetic; sgemm takes no
//! mxfp4, so ggml's mul_mat dots it with `ggml_vec_dot_mxfp4_q8_0` however many rows.
//!
//! Float types: the weights widened to f32 against the activations (already rounded to f16 or
//! bf16 for those types, so each product is exact), summed in the lanes and order of ggml's
//! AVX2 code ([`super::float_dot`]): `ggml_vec_dot_*` here, llamafile's sgemm in
//! [`vec_dot_sgemm`] (what `mul_mat` runs for two or more activation rows).

use super::act_quant::{ActRow, VecDotType, f16_to_f32};
use super::error::CpuError;
use super::float_dot::{self, SumOrder};
use super::quant_dot::{dot_mxfp4_q8_0, dot_q4_0_q8_0, dot_q4_k_q8_k, dot_q5_k_q8_k, dot_q6_k_q8_k, dot_q8_0_q8_0};
use crate::gguf::GgmlType;

/// A weight type the CPU multiplies, resolved once (at model load) from the file's type.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightKind {
    F32,
    F16,
    BF16,
    Q4_0,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    MXFP4,
}

impl WeightKind {
    pub const ALL: [WeightKind; 9] = [
        WeightKind::F32,
        WeightKind::F16,
        WeightKind::BF16,
        WeightKind::Q4_0,
        WeightKind::Q8_0,
        WeightKind::Q4_K,
        WeightKind::Q5_K,
        WeightKind::Q6_K,
        WeightKind::MXFP4,
    ];

    /// The CPU's kind for a tensor type, or an error naming the type.
    pub fn of(ty: GgmlType) -> Result<WeightKind, CpuError> {
        Self::ALL.into_iter().find(|k| k.ggml_type() == ty).ok_or(CpuError::UnsupportedType(ty))
    }

    pub fn ggml_type(self) -> GgmlType {
        match self {
            WeightKind::F32 => GgmlType::F32,
            WeightKind::F16 => GgmlType::F16,
            WeightKind::BF16 => GgmlType::BF16,
            WeightKind::Q4_0 => GgmlType::Q4_0,
            WeightKind::Q8_0 => GgmlType::Q8_0,
            WeightKind::Q4_K => GgmlType::Q4_K,
            WeightKind::Q5_K => GgmlType::Q5_K,
            WeightKind::Q6_K => GgmlType::Q6_K,
            WeightKind::MXFP4 => GgmlType::MXFP4,
        }
    }

    /// The activation format ggml converts the other operand to (`vec_dot_type`).
    pub fn vec_dot_type(self) -> VecDotType {
        match self {
            WeightKind::F32 => VecDotType::F32,
            WeightKind::F16 => VecDotType::F16,
            WeightKind::BF16 => VecDotType::BF16,
            WeightKind::Q4_0 | WeightKind::Q8_0 | WeightKind::MXFP4 => VecDotType::Q8_0,
            WeightKind::Q4_K | WeightKind::Q5_K | WeightKind::Q6_K => VecDotType::Q8K,
        }
    }

    /// Values per block.
    pub fn block_size(self) -> usize {
        self.ggml_type().block_size() as usize
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.ggml_type().block_bytes() as usize
    }
}

/// Dot of one weight row (`kind`'s bytes) with one activation row of the matching format.
///
/// # Panics
/// If the activation format is not `kind.vec_dot_type()`; lengths are the caller's (matmul
/// checks them once per call): the shorter of the two rows bounds the sum.
pub fn vec_dot(kind: WeightKind, w_row: &[u8], x: ActRow<'_>) -> f32 {
    match (kind, x) {
        (WeightKind::F32, ActRow::Float(x)) => dot_f32(w_row, x),
        (WeightKind::F16, ActRow::Float(x)) => dot_f16(w_row, x),
        (WeightKind::BF16, ActRow::Float(x)) => dot_bf16(w_row, x),
        (WeightKind::Q4_0, ActRow::Q8_0(x)) => dot_q4_0_q8_0(w_row, x),
        (WeightKind::Q8_0, ActRow::Q8_0(x)) => dot_q8_0_q8_0(w_row, x),
        (WeightKind::MXFP4, ActRow::Q8_0(x)) => dot_mxfp4_q8_0(w_row, x),
        (WeightKind::Q4_K, ActRow::Q8K(x)) => dot_q4_k_q8_k(w_row, x),
        (WeightKind::Q5_K, ActRow::Q8K(x)) => dot_q5_k_q8_k(w_row, x),
        (WeightKind::Q6_K, ActRow::Q8K(x)) => dot_q6_k_q8_k(w_row, x),
        (kind, _) => panic!("{kind:?} weights take {:?} activations", kind.vec_dot_type()),
    }
}

fn widen_f32(b: [u8; 4]) -> f32 {
    f32::from_le_bytes(b)
}

fn widen_f16(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

fn widen_bf16(b: [u8; 2]) -> f32 {
    f32::from_bits((u16::from_le_bytes(b) as u32) << 16)
}

pub fn dot_f32(w_row: &[u8], x: &[f32]) -> f32 {
    float_dot::dot_fused(SumOrder::VecDot, w_row.as_chunks::<4>().0, x, widen_f32)
}

/// f16 weights against activations already rounded to f16 (`round_f16`).
pub fn dot_f16(w_row: &[u8], x: &[f32]) -> f32 {
    float_dot::dot(SumOrder::VecDot, w_row.as_chunks::<2>().0, x, widen_f16)
}

/// bf16 weights against activations already rounded to bf16 (`round_bf16`).
pub fn dot_bf16(w_row: &[u8], x: &[f32]) -> f32 {
    float_dot::dot(SumOrder::VecDotBf16, w_row.as_chunks::<2>().0, x, widen_bf16)
}

/// [`vec_dot`] in the order llama.cpp's dense `mul_mat` uses for two or more activation rows:
/// float types sum as llamafile's tinyBLAS does ([`SumOrder::Sgemm`]); quantized types are the
/// same as [`vec_dot`] (their block formula has no such choice here).
pub fn vec_dot_sgemm(kind: WeightKind, w_row: &[u8], x: ActRow<'_>) -> f32 {
    match (kind, x) {
        (WeightKind::F32, ActRow::Float(x)) => float_dot::dot_fused(SumOrder::Sgemm, w_row.as_chunks::<4>().0, x, widen_f32),
        (WeightKind::F16, ActRow::Float(x)) => float_dot::dot(SumOrder::Sgemm, w_row.as_chunks::<2>().0, x, widen_f16),
        (WeightKind::BF16, ActRow::Float(x)) => float_dot::dot(SumOrder::Sgemm, w_row.as_chunks::<2>().0, x, widen_bf16),
        _ => vec_dot(kind, w_row, x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml_cpu::act_quant::{BlockQ8K, QK_K};
    use crate::ggml_cpu::act_quant::{QuantizedActs, round_bf16, round_f16};
    use brink_kernels::quant::TensorType;
    use brink_kernels::quant::kquants::{Q4_K_D, Q4_K_DMIN, Q5_K_D, Q5_K_DMIN, Q6_K_D};
    use brink_kernels::testdata::{hash2, uniform_pm1};
    use half::f16;

    /// Random blocks of `kind` whose f16 scales (or mxfp4 exponents) are of model size (2^-12 ..
    /// 2^-4, either sign for d) and whose other bytes are arbitrary.
    fn random_row(kind: WeightKind, seed: u64, cols: usize) -> Vec<u8> {
        let bb = kind.block_bytes();
        let nb = cols / kind.block_size();
        let mut row: Vec<u8> = (0..(nb * bb) as u64).map(|i| hash2(seed, i) as u8).collect();
        let scale = |h: u64, signed: bool| {
            let mag = (1.0 + (h & 0xff) as f32 / 256.0) * 2f32.powi(-12 + ((h >> 8) % 9) as i32);
            f16::from_f32(if signed && h >> 20 & 1 == 1 { -mag } else { mag }).to_le_bytes()
        };
        let fields: &[(usize, bool)] = match kind {
            WeightKind::Q4_0 | WeightKind::Q8_0 => &[(0, true)],
            WeightKind::Q4_K => &[(Q4_K_D, true), (Q4_K_DMIN, true)],
            WeightKind::Q5_K => &[(Q5_K_D, true), (Q5_K_DMIN, true)],
            WeightKind::Q6_K => &[(Q6_K_D, true)],
            WeightKind::MXFP4 => {
                // Exponents of model size: scales 2^-13 .. 2^-5, values up to 12 times that.
                for (b, block) in row.chunks_exact_mut(bb).enumerate() {
                    block[0] = 115 + (hash2(seed ^ 0xe8, b as u64) % 9) as u8;
                }
                return row;
            }
            WeightKind::F32 => return (0..cols as u64).flat_map(|i| uniform_pm1(seed, i).to_le_bytes()).collect(),
            WeightKind::F16 => return (0..cols as u64).flat_map(|i| f16::from_f32(uniform_pm1(seed, i)).to_le_bytes()).collect(),
            WeightKind::BF16 => {
                return (0..cols as u64).flat_map(|i| ((uniform_pm1(seed, i).to_bits() >> 16) as u16).to_le_bytes()).collect();
            }
        };
        for (b, block) in row.chunks_exact_mut(bb).enumerate() {
            for (k, &(at, signed)) in fields.iter().enumerate() {
                block[at..at + 2].copy_from_slice(&scale(hash2(seed ^ 0x5eed, (b * 4 + k) as u64), signed));
            }
        }
        row
    }

    /// The activation row as the dot sees it, dequantized to f64.
    fn act_values(row: ActRow<'_>) -> Vec<f64> {
        match row {
            ActRow::Float(v) => v.iter().map(|&v| v as f64).collect(),
            ActRow::Q8_0(b) => b.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d as f64 * q as f64)).collect(),
            ActRow::Q8K(b) => b.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d as f64 * q as f64)).collect(),
        }
    }

    /// The dots against dequantize-then-f64: the weights dequantized by brink-kernels' CPU
    /// dequantizers (checked bit for bit against gguf-py), the activations as quantized. Every
    /// block's integer sum is exact; what remains is f32 rounding of the per-block products
    /// (d_w·d_x, then ·isum: 2 roundings) and of the running sum (1 per block), so the error is
    /// bounded by (3 + blocks)·2^-24 of Σ|terms|, with Σ|terms| taken per part (scales and mins
    /// can cancel: their magnitudes are summed separately by zeroing one scale field at a time).
    #[test]
    fn dots_match_dequantized_f64_dot() {
        let mut worst = 0.0f64;
        for kind in WeightKind::ALL {
            for seed in 0..24u64 {
                // One block, a few, and the shapes of the models (2048, 768 K-multiples); for the
                // 32-wide blocks also odd block counts (mxfp4's tail).
                let cols = if kind.block_size() == 32 { [32, 96, 800, 2048, 2880, 4096] } else { [256, 512, 768, 2048, 256 * 3, 4096] }
                    [seed as usize % 6];
                let w = random_row(kind, seed, cols);
                let x: Vec<f32> = (0..cols as u64).map(|i| uniform_pm1(seed + 100, i) * 3.0).collect();
                let acts = QuantizedActs::new(kind.vec_dot_type(), &x, cols, 1);
                let xv = act_values(acts.row(0));
                let tt = TensorType::from_ggml_id(kind.ggml_type().id()).unwrap();
                let dot_f64 = |w: &[u8]| {
                    let wd = tt.dequantize_row(w).unwrap();
                    wd.iter().zip(&xv).fold((0.0, 0.0), |(s, a): (f64, f64), (&w, &x)| (s + w as f64 * x, a + (w as f64 * x).abs()))
                };
                let (exact, mut magnitude) = dot_f64(&w);
                let min_field = match kind {
                    WeightKind::Q4_K => Some((Q4_K_D, Q4_K_DMIN)),
                    WeightKind::Q5_K => Some((Q5_K_D, Q5_K_DMIN)),
                    _ => None,
                };
                if let Some((d, dmin)) = min_field {
                    magnitude = 0.0;
                    for zero in [d, dmin] {
                        let mut part = w.clone();
                        part.chunks_exact_mut(kind.block_bytes()).for_each(|b| b[zero..zero + 2].fill(0));
                        magnitude += dot_f64(&part).1;
                    }
                }
                let got = vec_dot(kind, &w, acts.row(0)) as f64;
                let terms = if kind.block_size() == 1 { cols / float_dot::VEC_DOT_LANES + 6 } else { cols / kind.block_size() };
                let bound = (3 + terms) as f64 * 2f64.powi(-24) * magnitude + 1e-30;
                assert!((got - exact).abs() <= bound, "{kind:?} seed {seed}: {got} vs {exact} (bound {bound})");
                worst = worst.max((got - exact).abs() / bound);
            }
        }
        eprintln!("worst dot error: {worst:.3} of its bound");
    }

    /// Float products are exact once the activations are rounded to the weight's type, so the
    /// f16/bf16 dots differ from f64 only by the lane sums' rounding; a row that is not a
    /// multiple of 32 takes the f64 tail.
    #[test]
    fn float_dots_round_activations_to_the_weight_type() {
        for cols in [1, 31, 32, 33, 100, 2048] {
            let x: Vec<f32> = (0..cols as u64).map(|i| uniform_pm1(7, i) + 1.0 / 3.0).collect();
            let w16: Vec<u8> = (0..cols as u64).flat_map(|i| f16::from_f32(uniform_pm1(8, i)).to_le_bytes()).collect();
            let wb: Vec<u8> = (0..cols as u64).flat_map(|i| ((uniform_pm1(8, i).to_bits() >> 16) as u16).to_le_bytes()).collect();
            let x16: Vec<f32> = x.iter().map(|&v| round_f16(v)).collect();
            let xb: Vec<f32> = x.iter().map(|&v| round_bf16(v)).collect();
            let exact16: f64 = w16.chunks(2).zip(&x16).map(|(w, &x)| f16::from_le_bytes([w[0], w[1]]).to_f64() * x as f64).sum();
            let exactb: f64 = wb
                .chunks(2)
                .zip(&xb)
                .map(|(w, &x)| f32::from_bits((u16::from_le_bytes([w[0], w[1]]) as u32) << 16) as f64 * x as f64)
                .sum();
            let tol = 1e-6 * cols as f64;
            assert!((dot_f16(&w16, &x16) as f64 - exact16).abs() <= tol, "f16 cols {cols}");
            assert!((dot_bf16(&wb, &xb) as f64 - exactb).abs() <= tol, "bf16 cols {cols}");
            // Unrounded activations give a different answer: the rounding is the caller's, and it matters.
            if cols >= 32 {
                assert_ne!(dot_f16(&w16, &x16), dot_f16(&w16, &x));
            }
        }
    }

    #[test]
    fn f32_dot_known_values() {
        // 40 ones · (1..=40): 820 exactly (lanes and tail).
        let w: Vec<u8> = (0..40).flat_map(|_| 1.0f32.to_le_bytes()).collect();
        let x: Vec<f32> = (1..=40).map(|v| v as f32).collect();
        assert_eq!(dot_f32(&w, &x), 820.0);
    }

    #[test]
    fn unsupported_types_are_named() {
        for ty in GgmlType::ALL {
            match WeightKind::of(ty) {
                Ok(k) => assert_eq!(k.ggml_type(), ty),
                Err(e) => {
                    assert_eq!(e, CpuError::UnsupportedType(ty));
                    assert!(e.to_string().contains(ty.name()), "{e}");
                    assert!(e.to_string().ends_with("it multiplies f32, f16, bf16, q4_0, q8_0, q4_K, q5_K, q6_K, mxfp4"), "{e}");
                }
            }
        }
        assert!(WeightKind::of(GgmlType::Q4_1).is_err());
        assert!(WeightKind::of(GgmlType::IQ4_XS).is_err());
        assert_eq!(WeightKind::of(GgmlType::Q5_K), Ok(WeightKind::Q5_K));
    }

    #[test]
    #[should_panic(expected = "Q8_0 activations")]
    fn mismatched_activation_format_panics() {
        let x = [BlockQ8K { d: 1.0, qs: [0; QK_K], bsums: [0; 16] }];
        vec_dot(WeightKind::Q4_0, &[0; 18], ActRow::Q8K(&x));
    }
}
