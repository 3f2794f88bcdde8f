//! Dot products of one weight row with one activation row, with ggml's CPU arithmetic.
//!
//! Quantized types: per block an exact integer sum of quant products, then one f32 multiply by
//! the block's scales and an f32 accumulation over the blocks (`ggml_vec_dot_*_q8_*`):
//! - q4_0 · q8_0, q8_0 · q8_0: acc += (d_w · d_x) · Σ q_w q_x (q4_0 weights are nibble − 8);
//! - q4_K, q5_K · q8_K: Σ_blocks (d_w · d_x) · Σ_sub sc·Σ q_w q_x − Σ_blocks (dmin_w · d_x) ·
//!   Σ_16 bsums · m (the mins meet the activations' sums of 16);
//! - q6_K · q8_K: Σ_blocks (d_w · d_x) · Σ_16 sc·Σ (q_w − 32) q_x.
//!
//! ggml's SIMD versions spread the same integer sums over 8 f32 lanes with FMAs; ours keep one
//! f32 accumulator, so the results agree to f32 rounding, not bit for bit.
//!
//! Float types: the weights widened to f32 against the activations (already rounded to f16 or
//! bf16 for those types, so each product is exact), summed in the lanes and order of ggml's
//! AVX2 code ([`super::float_dot`]): `ggml_vec_dot_*` here, llamafile's sgemm in
//! [`vec_dot_sgemm`] (what `mul_mat` runs for two or more activation rows).

use brink_kernels::quant::kquants::{
    BLOCK_Q4_K_BYTES, BLOCK_Q5_K_BYTES, BLOCK_Q6_K_BYTES, Q4_K_D, Q4_K_DMIN, Q4_K_QS, Q4_K_SCALES, Q5_K_D, Q5_K_DMIN, Q5_K_QH, Q5_K_QS,
    Q5_K_SCALES, Q6_K_D, Q6_K_QH, Q6_K_QL, Q6_K_SCALES, get_scale_min_k4,
};
use brink_kernels::quant::{BLOCK_Q4_0_BYTES, BLOCK_Q8_0_BYTES};

use super::act_quant::{ActRow, BlockQ8_0, BlockQ8K, QK_K, VecDotType, f16_to_f32};
use super::error::CpuError;
use super::float_dot::{self, SumOrder};
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
}

impl WeightKind {
    pub const ALL: [WeightKind; 8] = [
        WeightKind::F32,
        WeightKind::F16,
        WeightKind::BF16,
        WeightKind::Q4_0,
        WeightKind::Q8_0,
        WeightKind::Q4_K,
        WeightKind::Q5_K,
        WeightKind::Q6_K,
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
        }
    }

    /// The activation format ggml converts the other operand to (`vec_dot_type`).
    pub fn vec_dot_type(self) -> VecDotType {
        match self {
            WeightKind::F32 => VecDotType::F32,
            WeightKind::F16 => VecDotType::F16,
            WeightKind::BF16 => VecDotType::BF16,
            WeightKind::Q4_0 | WeightKind::Q8_0 => VecDotType::Q8_0,
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
        (WeightKind::Q4_K, ActRow::Q8K(x)) => dot_q4_k_q8_k(w_row, x),
        (WeightKind::Q5_K, ActRow::Q8K(x)) => dot_q5_k_q8_k(w_row, x),
        (WeightKind::Q6_K, ActRow::Q8K(x)) => dot_q6_k_q8_k(w_row, x),
        (kind, _) => panic!("{kind:?} weights take {:?} activations", kind.vec_dot_type()),
    }
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

// The integer sums below are written as plain loops over fixed-size arrays of i8/u8 widened to
// i16 products summed in i32, which LLVM turns into pmaddwd (SSE2) / smlal (NEON) without
// target-specific code. Every sum is exact: |product| <= 2^14 per value, 256 values per block.

/// Σ w·x over 32 pairs, w given as the bytes of i8 quants.
#[inline]
fn isum_i8(w: &[u8; 32], x: &[i8; 32]) -> i32 {
    let mut s = 0i32;
    for i in 0..32 {
        s += (w[i] as i8 as i16 * x[i] as i16) as i32;
    }
    s
}

pub fn dot_q8_0_q8_0(w_row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_Q8_0_BYTES>();
    let mut acc = 0.0f32;
    for (b, xb) in blocks.iter().zip(x) {
        let q: &[u8; 32] = b[2..].try_into().expect("34-byte block");
        acc += (f16_at(b, 0) * xb.d) * isum_i8(q, &xb.qs) as f32;
    }
    acc
}

pub fn dot_q4_0_q8_0(w_row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_Q4_0_BYTES>();
    let mut acc = 0.0f32;
    for (b, xb) in blocks.iter().zip(x) {
        let q: &[u8; 16] = b[2..].try_into().expect("18-byte block");
        acc += (f16_at(b, 0) * xb.d) * isum_q4_0(q, &xb.qs) as f32;
    }
    acc
}

/// Σ (q − 8)·x for one q4_0 block: element j < 16 is the low nibble of byte j, element 16 + j
/// its high nibble. Computed as Σ q·x − 8·Σ x (both exact): unsigned nibbles multiply cheaply.
#[inline(always)]
fn isum_q4_0(q: &[u8; 16], x: &[i8; 32]) -> i32 {
    let (lo, hi) = x.split_at(16);
    let (mut s, mut sx) = (0i32, 0i32);
    for j in 0..16 {
        s += ((q[j] & 0x0f) as i16 * lo[j] as i16) as i32 + ((q[j] >> 4) as i16 * hi[j] as i16) as i32;
        sx += lo[j] as i32 + hi[j] as i32;
    }
    s - 8 * sx
}

/// The 8 six-bit scales and mins of a q4_K/q5_K block.
fn scales_mins(packed: &[u8]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0; 8];
    let mut m = [0; 8];
    for j in 0..8 {
        let (s, mm) = get_scale_min_k4(j, packed);
        sc[j] = s as i32;
        m[j] = mm as i32;
    }
    (sc, m)
}

/// Σ_16 bsums[g] · mins[g / 2]: the mins' share of a q4_K/q5_K block.
fn min_isum(y: &BlockQ8K, mins: &[i32; 8]) -> i32 {
    y.bsums.iter().enumerate().map(|(g, &s)| s as i32 * mins[g / 2]).sum()
}

/// Σ_sub scale · Σ q·x for a q4_K/q5_K block: sub-blocks 2j and 2j + 1 are the low and the high
/// nibbles of qs[32j .. 32j + 32], plus 16 where bit 2j (2j + 1) of qh[l] is set (q5_K).
#[inline]
fn nibble_block_isum(qs: &[u8; QK_K / 2], qh: Option<&[u8; 32]>, y: &[i8; QK_K], sc: &[i32; 8]) -> i32 {
    let (qs, _) = qs.as_chunks::<32>();
    let (ys, _) = y.as_chunks::<64>();
    let mut isum = 0;
    for (j, (q, y)) in qs.iter().zip(ys).enumerate() {
        let (y_lo, y_hi) = y.split_at(32);
        let (mut lo, mut hi) = (0i32, 0i32);
        match qh {
            None => {
                for l in 0..32 {
                    lo += ((q[l] & 0x0f) as i16 * y_lo[l] as i16) as i32;
                    hi += ((q[l] >> 4) as i16 * y_hi[l] as i16) as i32;
                }
            }
            Some(qh) => {
                for l in 0..32 {
                    let h = qh[l] >> (2 * j);
                    lo += (((q[l] & 0x0f) | ((h & 1) << 4)) as i16 * y_lo[l] as i16) as i32;
                    hi += (((q[l] >> 4) | ((h & 2) << 3)) as i16 * y_hi[l] as i16) as i32;
                }
            }
        }
        isum += sc[2 * j] * lo + sc[2 * j + 1] * hi;
    }
    isum
}

pub fn dot_q4_k_q8_k(w_row: &[u8], x: &[BlockQ8K]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_Q4_K_BYTES>();
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (b, y) in blocks.iter().zip(x) {
        let (sc, m) = scales_mins(&b[Q4_K_SCALES..Q4_K_QS]);
        let qs = b[Q4_K_QS..].try_into().expect("q4_K quants");
        acc += (f16_at(b, Q4_K_D) * y.d) * nibble_block_isum(qs, None, &y.qs, &sc) as f32;
        acc_min += (f16_at(b, Q4_K_DMIN) * y.d) * min_isum(y, &m) as f32;
    }
    acc - acc_min
}

pub fn dot_q5_k_q8_k(w_row: &[u8], x: &[BlockQ8K]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_Q5_K_BYTES>();
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (b, y) in blocks.iter().zip(x) {
        let (sc, m) = scales_mins(&b[Q5_K_SCALES..Q5_K_QH]);
        let qh = b[Q5_K_QH..Q5_K_QS].try_into().expect("q5_K high bits");
        let qs = b[Q5_K_QS..].try_into().expect("q5_K quants");
        acc += (f16_at(b, Q5_K_D) * y.d) * nibble_block_isum(qs, Some(qh), &y.qs, &sc) as f32;
        acc_min += (f16_at(b, Q5_K_DMIN) * y.d) * min_isum(y, &m) as f32;
    }
    acc - acc_min
}

pub fn dot_q6_k_q8_k(w_row: &[u8], x: &[BlockQ8K]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_Q6_K_BYTES>();
    let mut acc = 0.0f32;
    for (b, y) in blocks.iter().zip(x) {
        let mut isum = 0i32;
        // Halves of 128 values: quarter k (32 values) takes nibble k / 2 of ql[64n + 32(k % 2) + l]
        // and bits 2k, 2k + 1 of qh[32n + l]; q − 32 is signed; one i8 scale per 16 values.
        for n in 0..2 {
            let ql: &[u8; 64] = b[Q6_K_QL + 64 * n..][..64].try_into().expect("q6_K low bits");
            let qh: &[u8; 32] = b[Q6_K_QH + 32 * n..][..32].try_into().expect("q6_K high bits");
            let yh: &[i8; 128] = y.qs[128 * n..][..128].try_into().expect("q8_K half");
            let mut s = [0i32; 8]; // quarter k, values 0..16 → s[2k], 16..32 → s[2k + 1]
            for half in 0..2 {
                for l in 16 * half..16 * half + 16 {
                    let (a, c, h) = (ql[l], ql[l + 32], qh[l]);
                    let q = [
                        ((a & 0x0f) | ((h & 3) << 4)) as i16 - 32,
                        ((c & 0x0f) | (((h >> 2) & 3) << 4)) as i16 - 32,
                        ((a >> 4) | (((h >> 4) & 3) << 4)) as i16 - 32,
                        ((c >> 4) | (((h >> 6) & 3) << 4)) as i16 - 32,
                    ];
                    for k in 0..4 {
                        s[2 * k + half] += (q[k] * yh[32 * k + l] as i16) as i32;
                    }
                }
            }
            for (g, s) in s.iter().enumerate() {
                isum += b[Q6_K_SCALES + 8 * n + g] as i8 as i32 * s;
            }
        }
        acc += (f16_at(b, Q6_K_D) * y.d) * isum as f32;
    }
    acc
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
    use crate::cpu::act_quant::{QuantizedActs, round_bf16, round_f16};
    use brink_kernels::quant::TensorType;
    use brink_kernels::testdata::{hash2, uniform_pm1};
    use half::f16;

    /// Random blocks of `kind` whose f16 scales are of model size (2^-12 .. 2^-4, either sign for
    /// d) and whose other bytes are arbitrary.
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
                // One block, a few, and the shapes of the models (2048, 768 K-multiples).
                let cols = [256, 512, 768, 2048, 256 * 3, 4096][seed as usize % 6];
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
    fn q4_0_hand_block() {
        // d = 0.5; byte j: low nibble j (value j − 8), high nibble 15 − j (value 7 − j).
        let mut w = f16::from_f32(0.5).to_le_bytes().to_vec();
        w.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let x = BlockQ8_0 { d: 0.25, qs: std::array::from_fn(|j| if j < 16 { 1 } else { 2 }) };
        // Σ_j (j − 8)·1 + Σ_j (7 − j)·2 = −8 + 2·(−8) = −24; · 0.5 · 0.25 = −3.
        assert_eq!(dot_q4_0_q8_0(&w, &[x]), -3.0);
    }

    #[test]
    fn unsupported_types_are_named() {
        for ty in GgmlType::ALL {
            match WeightKind::of(ty) {
                Ok(k) => assert_eq!(k.ggml_type(), ty),
                Err(e) => {
                    assert_eq!(e, CpuError::UnsupportedType(ty));
                    assert!(e.to_string().contains(ty.name()), "{e}");
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

    #[test]
    fn q8k_block_sums_are_used_for_the_mins() {
        // A q4_K block with all quants 0 and every min 1: the dot is −dmin·d_x·Σ x_q exactly.
        let mut b = vec![0u8; BLOCK_Q4_K_BYTES];
        b[Q4_K_D..Q4_K_D + 2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b[Q4_K_DMIN..Q4_K_DMIN + 2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        // mins of sub-blocks 0..4 in bytes 4..8 (low six bits); 4..8 in the high nibbles of 8..12.
        for j in 0..4 {
            b[Q4_K_SCALES + 4 + j] = 1;
            b[Q4_K_SCALES + 8 + j] = 1 << 4;
        }
        let x: Vec<f32> = (0..QK_K).map(|i| (i % 7) as f32 - 3.0).collect();
        let acts = QuantizedActs::new(VecDotType::Q8K, &x, QK_K, 1);
        let ActRow::Q8K(y) = acts.row(0) else { unreachable!() };
        let sum: i32 = y[0].qs.iter().map(|&q| q as i32).sum();
        assert_eq!(dot_q4_k_q8_k(&b, y), -(0.5 * y[0].d) * sum as f32);
    }
}
