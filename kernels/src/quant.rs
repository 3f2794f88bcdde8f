//! GGUF block formats used by the kernels, and their CPU twins.
//!
//! Layouts match ggml exactly (`block_q8_0`, `block_q4_0`, `block_q8_1`): 32 weights per block,
//! an f16 scale first. The dot products below are the CPU references of the GPU dot products:
//! the same integer sums, the same f16 scales, the same formula per block.

use half::f16;
use serde::{Deserialize, Serialize};

/// Weights per quantization block.
pub const QK: usize = 32;

/// Weight formats the routed path and the dense projections take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightType {
    Q8_0,
    Q4_0,
}

impl WeightType {
    pub const ALL: [WeightType; 2] = [WeightType::Q8_0, WeightType::Q4_0];

    pub fn block_bytes(self) -> usize {
        match self {
            WeightType::Q8_0 => BLOCK_Q8_0_BYTES,
            WeightType::Q4_0 => BLOCK_Q4_0_BYTES,
        }
    }

    /// The `WTYPE_*` constant the kernels take to select the weight format.
    pub fn code(self) -> i32 {
        match self {
            WeightType::Q8_0 => 0,
            WeightType::Q4_0 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WeightType::Q8_0 => "q8_0",
            WeightType::Q4_0 => "q4_0",
        }
    }

    /// Bytes of one row of `k` weights (`k` a multiple of [`QK`]).
    pub fn row_bytes(self, k: usize) -> usize {
        k / QK * self.block_bytes()
    }

    /// Dot product of one quantized weight row with one q8_1 activation row.
    pub fn dot_q8_1(self, w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
        match self {
            WeightType::Q8_0 => dot_q8_0_q8_1(w_row, x),
            WeightType::Q4_0 => dot_q4_0_q8_1(w_row, x),
        }
    }

    /// Dequantizes one row of weights to f32.
    pub fn dequantize_row(self, w_row: &[u8]) -> Vec<f32> {
        match self {
            WeightType::Q8_0 => dequantize_q8_0(w_row),
            WeightType::Q4_0 => dequantize_q4_0(w_row),
        }
    }
}

impl std::fmt::Display for WeightType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `block_q8_0`: f16 d, 32 x i8. x = d * q.
pub const BLOCK_Q8_0_BYTES: usize = 2 + QK;
/// `block_q4_0`: f16 d, 16 bytes of nibbles; element j < 16 is the low nibble of byte j,
/// element j >= 16 the high nibble of byte j - 16. x = d * (q - 8).
pub const BLOCK_Q4_0_BYTES: usize = 2 + QK / 2;
/// `block_q8_1` (activations): f16 d, f16 s = d * sum(q), 32 x i8.
pub const BLOCK_Q8_1_BYTES: usize = 4 + QK;

/// One q8_1 block, as the CPU reference holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}

impl BlockQ8_1 {
    pub fn to_bytes(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.s.to_le_bytes());
        for (o, q) in out[4..4 + QK].iter_mut().zip(&self.qs) {
            *o = *q as u8;
        }
    }

    pub fn from_bytes(b: &[u8]) -> Self {
        let mut qs = [0i8; QK];
        for (q, &byte) in qs.iter_mut().zip(&b[4..4 + QK]) {
            *q = byte as i8;
        }
        BlockQ8_1 { d: f16::from_le_bytes([b[0], b[1]]), s: f16::from_le_bytes([b[2], b[3]]), qs }
    }
}

/// Quantizes 32 activations the way the `quantize_q8_1` kernel does: d = amax / 127,
/// q = round(x / d) (half away from zero), s = d * sum(q).
pub fn quantize_block_q8_1(x: &[f32]) -> BlockQ8_1 {
    debug_assert_eq!(x.len(), QK);
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let mut qs = [0i8; QK];
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        let r = if amax == 0.0 { 0.0 } else { (v / d).round() };
        *q = r as i8;
        sum += *q as i32;
    }
    BlockQ8_1 { d: f16::from_f32(d), s: f16::from_f32(sum as f32 * d), qs }
}

pub fn quantize_row_q8_1(x: &[f32]) -> Vec<BlockQ8_1> {
    assert_eq!(x.len() % QK, 0, "row length {} is not a multiple of {QK}", x.len());
    x.chunks_exact(QK).map(quantize_block_q8_1).collect()
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

pub fn dequantize_q8_0(row: &[u8]) -> Vec<f32> {
    row.chunks_exact(BLOCK_Q8_0_BYTES)
        .flat_map(|b| {
            let d = f16_at(b, 0);
            b[2..].iter().map(move |&q| d * (q as i8) as f32)
        })
        .collect()
}

pub fn dequantize_q4_0(row: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(row.len() / BLOCK_Q4_0_BYTES * QK);
    for b in row.chunks_exact(BLOCK_Q4_0_BYTES) {
        let d = f16_at(b, 0);
        let qs = &b[2..];
        out.extend(qs.iter().map(|&q| d * ((q & 0x0f) as i32 - 8) as f32));
        out.extend(qs.iter().map(|&q| d * ((q >> 4) as i32 - 8) as f32));
    }
    out
}

pub fn dequantize_q8_1(x: &[BlockQ8_1]) -> Vec<f32> {
    x.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d.to_f32() * q as f32)).collect()
}

/// Σ_blocks d_w · d_x · Σ q_w q_x, the formula of the `dot_q8_0_q8_1` device function.
pub fn dot_q8_0_q8_1(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
    let mut acc = 0.0f32;
    for (b, xb) in w_row.chunks_exact(BLOCK_Q8_0_BYTES).zip(x) {
        let isum: i32 = b[2..].iter().zip(&xb.qs).map(|(&w, &q)| (w as i8) as i32 * q as i32).sum();
        acc += f16_at(b, 0) * xb.d.to_f32() * isum as f32;
    }
    acc
}

/// Σ_blocks d_w · (d_x · Σ q_w q_x − 8 s_x) with q_w in 0..15, the formula of the
/// `dot_q4_0_q8_1` device function (the −8 offset folded into the activation sum).
pub fn dot_q4_0_q8_1(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
    let mut acc = 0.0f32;
    for (b, xb) in w_row.chunks_exact(BLOCK_Q4_0_BYTES).zip(x) {
        let qs = &b[2..];
        let mut isum = 0i32;
        for (j, &q) in qs.iter().enumerate() {
            isum += (q & 0x0f) as i32 * xb.qs[j] as i32;
            isum += (q >> 4) as i32 * xb.qs[j + QK / 2] as i32;
        }
        acc += f16_at(b, 0) * (xb.d.to_f32() * isum as f32 - 8.0 * xb.s.to_f32());
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q8_0_block(d: f32, qs: impl Fn(usize) -> i8) -> Vec<u8> {
        let mut b = f16::from_f32(d).to_le_bytes().to_vec();
        b.extend((0..QK).map(|j| qs(j) as u8));
        b
    }

    #[test]
    fn q8_0_known_block() {
        // d = 0.5 (exact in f16), q_j = j - 16.
        let b = q8_0_block(0.5, |j| j as i8 - 16);
        let x = dequantize_q8_0(&b);
        assert_eq!(x.len(), 32);
        assert_eq!(x[0], -8.0);
        assert_eq!(x[16], 0.0);
        assert_eq!(x[31], 7.5);
    }

    #[test]
    fn q4_0_known_block_nibble_order() {
        // d = 0.25; byte j = (hi << 4) | lo with lo = j, hi = 15 - j.
        let mut b = f16::from_f32(0.25).to_le_bytes().to_vec();
        b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        let x = dequantize_q4_0(&b);
        // element j < 16: (j - 8) * 0.25; element 16 + j: (15 - j - 8) * 0.25.
        assert_eq!(x[0], -2.0);
        assert_eq!(x[15], 1.75);
        assert_eq!(x[16], 1.75);
        assert_eq!(x[31], -2.0);
    }

    #[test]
    fn q8_1_roundtrip_and_sum() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 13.3) * 0.37).collect();
        let b = quantize_block_q8_1(&x);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(b.qs.iter().any(|&q| q == 127 || q == -127));
        let back = dequantize_q8_1(&[b]);
        for (a, r) in x.iter().zip(&back) {
            assert!((a - r).abs() <= amax / 127.0 * 0.51 + 1e-3, "{a} vs {r}");
        }
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        assert!((b.s.to_f32() - b.d.to_f32() * sum as f32).abs() <= 1e-2 * b.s.to_f32().abs().max(1.0));
        let mut bytes = [0u8; BLOCK_Q8_1_BYTES];
        b.to_bytes(&mut bytes);
        assert_eq!(BlockQ8_1::from_bytes(&bytes), b);
    }

    #[test]
    fn zero_block_quantizes_to_zero() {
        let b = quantize_block_q8_1(&[0.0; 32]);
        assert!(b.qs.iter().all(|&q| q == 0));
        assert_eq!(b.d.to_f32(), 0.0);
    }

    /// The block-formula dots equal the straightforward dequantize-then-multiply sums.
    #[test]
    fn dots_match_dequantized_scalar_formula() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.11).collect();
        let xq = quantize_row_q8_1(&x);
        let xd = dequantize_q8_1(&xq);
        let mut w8 = q8_0_block(0.03, |j| ((j as i32 * 7) % 127 - 60) as i8);
        w8.extend(q8_0_block(0.02, |j| (100 - j as i32 * 5) as i8));
        let mut w4 = f16::from_f32(0.1).to_le_bytes().to_vec();
        w4.extend((0..16u8).map(|j| (j * 7 % 16) | ((j * 3 % 16) << 4)));
        w4.extend(f16::from_f32(0.05).to_le_bytes());
        w4.extend((0..16u8).map(|j| (15 - j) | (j << 4)));
        for (t, w) in [(WeightType::Q8_0, &w8), (WeightType::Q4_0, &w4)] {
            let wd = t.dequantize_row(w);
            let scalar: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
            let block = t.dot_q8_1(w, &xq) as f64;
            // q4_0 goes through the f16 s = d * sum(q): allow its rounding.
            assert!((scalar - block).abs() <= 2e-3 * scalar.abs().max(1.0), "{t}: {scalar} vs {block}");
        }
    }
}
