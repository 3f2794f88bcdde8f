//! Deterministic test inputs: the CPU twin of `cuda/testdata.cu`.
//!
//! Every input element is a pure function of `(seed, index)`, computed with the same integer
//! hash and the same exact float steps on both sides. The self-test fills gigabyte buffers on
//! the device and the CPU reference recomputes just the elements a sampled output needs.

use half::f16;

use crate::quant::{BLOCK_Q4_0_BYTES, BLOCK_Q8_0_BYTES, BlockQ8_1, QK, WeightType};

/// The poison word written over outputs (and a guard zone past their end) before a kernel
/// runs. As f32 it is a NaN with a payload no kernel computes; as an i32 id it is negative;
/// as the (d, s) word of a q8_1 block it is a negative d.
pub const POISON: u32 = 0xFFBA_DBAD;

pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

pub fn hash2(seed: u64, i: u64) -> u64 {
    mix64(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ i)
}

/// Uniform in [-1, 1), exact in f32.
pub fn uniform_pm1(seed: u64, i: u64) -> f32 {
    (hash2(seed, i) >> 40) as f32 * (1.0 / 8_388_608.0) - 1.0
}

/// Element `i` of a `fill_uniform_f32(seed, scale)` buffer.
pub fn uniform_f32(seed: u64, i: u64, scale: f32) -> f32 {
    uniform_pm1(seed, i) * scale
}

/// A row of `fill_uniform_f32`: elements `[start, start + len)`.
pub fn uniform_row(seed: u64, start: u64, len: usize, scale: f32) -> Vec<f32> {
    (0..len as u64).map(|j| uniform_f32(seed, start + j, scale)).collect()
}

/// Weight block `b` of a `fill_weights(seed, wtype)` buffer, as bytes.
pub fn weight_block(seed: u64, b: u64, wtype: WeightType, out: &mut Vec<u8>) {
    let u = (uniform_pm1(seed, b * 33) + 1.0) * 0.5;
    let d = f16::from_f32(0.002 + 0.004 * u);
    out.extend_from_slice(&d.to_le_bytes());
    match wtype {
        WeightType::Q8_0 => out.extend((0..QK as u64).map(|j| ((hash2(seed, b * 33 + 1 + j) % 255) as i32 - 127) as i8 as u8)),
        WeightType::Q4_0 => out.extend((0..QK as u64 / 2).map(|j| (hash2(seed, b * 33 + 1 + j) & 0xff) as u8)),
    }
}

/// Row `row` (of `k` weights) of a `fill_weights` buffer holding rows of `k` weights.
pub fn weight_row(seed: u64, row: u64, k: usize, wtype: WeightType) -> Vec<u8> {
    let nb = (k / QK) as u64;
    let mut out = Vec::with_capacity(wtype.row_bytes(k));
    for b in 0..nb {
        weight_block(seed, row * nb + b, wtype, &mut out);
    }
    debug_assert_eq!(out.len(), nb as usize * if wtype == WeightType::Q8_0 { BLOCK_Q8_0_BYTES } else { BLOCK_Q4_0_BYTES });
    out
}

/// Source row `src` (of `nb` blocks) of a `fill_q8_1_rows` buffer.
pub fn q8_1_row(seed: u64, src: u64, nb: usize) -> Vec<BlockQ8_1> {
    (0..nb as u64)
        .map(|b| {
            let blk = src * nb as u64 + b;
            let mut qs = [0i8; QK];
            let mut sum = 0i32;
            for (j, q) in qs.iter_mut().enumerate() {
                *q = ((hash2(seed, blk * 33 + 1 + j as u64) % 255) as i32 - 127) as i8;
                sum += *q as i32;
            }
            let u = (uniform_pm1(seed, blk * 33) + 1.0) * 0.5;
            let d = f16::from_f32(0.001 + 0.01 * u);
            BlockQ8_1 { d, s: f16::from_f32(d.to_f32() * sum as f32), qs }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_in_range_and_spread() {
        let v: Vec<f32> = (0..10_000).map(|i| uniform_pm1(7, i)).collect();
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.05, "mean {mean}");
        assert_ne!(uniform_pm1(7, 0), uniform_pm1(8, 0));
    }

    #[test]
    fn weight_blocks_have_positive_scale_in_range() {
        for wtype in WeightType::ALL {
            let row = weight_row(3, 5, 64, wtype);
            assert_eq!(row.len(), wtype.row_bytes(64));
            for b in row.chunks_exact(wtype.block_bytes()) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                assert!((0.0019..=0.0061).contains(&d), "{d}");
            }
        }
    }
}
