//! MXFP4 (ggml type 39, `block_mxfp4` of ggml-common.h): 32 values per 17-byte block, one E8M0
//! exponent byte `e` then 16 bytes of 4-bit codes; value j < 16 is the low nibble of byte j,
//! value 16 + j its high nibble. A code indexes the E2M1 values doubled ([`KVALUES`], so that
//! they are integers), and the scale is the exponent halved to match:
//! x = KVALUES[code] · 2^(e − 128) ([`e8m0_to_f32_half`]).
//!
//! Every product is exact (a power of two times an integer of at most 4 bits) unless it
//! reaches 2^128: e = 253 with |code value| ≥ 8, 254 with ≥ 4 and 255 with ≥ 2 give ±infinity
//! in ggml, in gguf-py and here alike. Exponents 0 and 1 give f32 subnormals, kept (no flush
//! to zero).

/// Bytes of one block: the exponent, then 16 bytes of nibbles.
pub const BLOCK_MXFP4_BYTES: usize = 1 + super::QK / 2;

/// The E2M1 values times two (`kvalues_mxfp4`): codes 0-7 are +0, 0.5, 1, 1.5, 2, 3, 4, 6
/// doubled, codes 8-15 their negatives (code 8, −0, is stored as the integer 0).
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// 2^(e − 128): the E8M0 scale 2^(e − 127) halved, since [`KVALUES`] are doubled
/// (`ggml_e8m0_to_fp32_half`). e = 0 and 1 are the subnormals 2^-128 and 2^-127; e = 255 is
/// 2^127, not the NaN the OCP format reserves it for (ggml does not special-case it).
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
    f32::from_bits(bits)
}

/// Dequantizes the whole blocks of `row` into `out` (as many as both hold), as
/// `dequantize_row_mxfp4` does: the f32 product of the code value and the scale.
pub fn dequantize_mxfp4_into(row: &[u8], out: &mut [f32]) {
    let (blocks, _) = row.as_chunks::<BLOCK_MXFP4_BYTES>();
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(super::QK)) {
        let d = e8m0_to_f32_half(b[0]);
        let (lo, hi) = y.split_at_mut(super::QK / 2);
        for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(&b[1..]) {
            *lo = KVALUES[(q & 0x0f) as usize] as f32 * d;
            *hi = KVALUES[(q >> 4) as usize] as f32 * d;
        }
    }
}

/// One row of MXFP4 blocks dotted with q8_1 activation blocks: per block the exact integer sum
/// Σ KVALUES[code]·q8 over its 32 values, then `acc += (d_w · d_x) · Σ`, the formula of the
/// device's `block_partial_f<WTYPE_MXFP4>` (common.cuh) in its order. Every product of the sum
/// is exact and |Σ| ≤ 32·12·127 < 2^19, exact in f32; only the two products round.
pub fn dot_mxfp4_q8_1(w_row: &[u8], x: &[super::BlockQ8_1]) -> f32 {
    let mut acc = 0.0f32;
    for (b, xb) in w_row.as_chunks::<BLOCK_MXFP4_BYTES>().0.iter().zip(x) {
        let (lo, hi) = xb.qs.split_at(super::QK / 2);
        let mut isum = 0i32;
        for ((&q, &l), &h) in b[1..].iter().zip(lo).zip(hi) {
            isum += KVALUES[(q & 0x0f) as usize] as i32 * l as i32;
            isum += KVALUES[(q >> 4) as usize] as i32 * h as i32;
        }
        acc += e8m0_to_f32_half(b[0]) * super::f16_to_f32(xb.d) * isum as f32;
    }
    acc
}

/// The code whose value times `d` is nearest `x`, the first one on ties (`best_index_mxfp4`):
/// +0 (code 0) rather than −0 (code 8).
fn best_code(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (KVALUES[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// Quantizes `x` (a whole number of blocks) to MXFP4 as `quantize_row_mxfp4_ref` does:
/// e = floor(log2(amax)) − 2 + 127, so that amax / 2^(e − 128) lies in [8, 16) and the largest
/// value maps near code value 12 (6 in E2M1); each value then takes its nearest code.
///
/// `log2` is the platform's `log2f`, as in ggml: just below a power of two it may round up to
/// the integer, and the exponent with it, in both. Where ggml's float-to-`uint8_t` cast is
/// undefined (amax below 2^-125, infinite, or NaN values only) the exponent here saturates to
/// 0 or 255; an all-zero block has e = 0 and code 0 everywhere, as in ggml.
///
/// # Panics
/// If `x.len()` is not a multiple of 32.
pub fn quantize_row_mxfp4(x: &[f32]) -> Vec<u8> {
    let qk = super::QK;
    assert!(x.len().is_multiple_of(qk), "MXFP4 quantizes whole blocks of {qk}, not {} values", x.len());
    let mut out = Vec::with_capacity(x.len() / qk * BLOCK_MXFP4_BYTES);
    for xb in x.chunks_exact(qk) {
        // `amax < |v|`: a NaN never becomes the maximum.
        let amax = xb.iter().fold(0.0f32, |m, v| if m < v.abs() { v.abs() } else { m });
        let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
        let d = e8m0_to_f32_half(e);
        out.push(e);
        let (lo, hi) = xb.split_at(qk / 2);
        out.extend(lo.iter().zip(hi).map(|(&l, &h)| best_code(l, d) | best_code(h, d) << 4));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{hash2, uniform_pm1};

    #[test]
    fn scales_are_ggmls_bit_patterns() {
        assert_eq!(e8m0_to_f32_half(0).to_bits(), 0x0020_0000); // 2^-128, subnormal
        assert_eq!(e8m0_to_f32_half(1).to_bits(), 0x0040_0000); // 2^-127, subnormal
        assert_eq!(e8m0_to_f32_half(2), f32::MIN_POSITIVE); // 2^-126
        assert_eq!(e8m0_to_f32_half(128), 1.0);
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
        // Every one is 2^(e − 128), exactly: doubling climbs one exponent at a time.
        for e in 0..255u8 {
            assert_eq!(e8m0_to_f32_half(e) * 2.0, e8m0_to_f32_half(e + 1), "e = {e}");
        }
    }

    #[test]
    fn known_block_nibble_order_and_edges() {
        // e = 128 (scale 1); byte j: low nibble j, high nibble 15 − j.
        let mut b = vec![128u8];
        b.extend((0..16u8).map(|j| j | (15 - j) << 4));
        let mut y = [f32::NAN; 32];
        dequantize_mxfp4_into(&b, &mut y);
        for j in 0..16 {
            assert_eq!(y[j], KVALUES[j] as f32, "value {j}");
            assert_eq!(y[16 + j], KVALUES[15 - j] as f32, "value {}", 16 + j);
        }
        assert_eq!(y[8].to_bits(), 0, "code 8 is +0, not −0");
        // e = 255 overflows from code value 2 up; e = 0 stays subnormal.
        b[0] = 255;
        dequantize_mxfp4_into(&b, &mut y);
        assert_eq!((y[1], y[2], y[7], y[15]), (2f32.powi(127), f32::INFINITY, f32::INFINITY, f32::NEG_INFINITY));
        b[0] = 0;
        dequantize_mxfp4_into(&b, &mut y);
        assert_eq!(y[1].to_bits(), 0x0020_0000, "2^-128, a subnormal");
        assert_eq!(y[7] as f64, 12.0 * 2f64.powi(-128));
        assert_eq!(y[16] as f64, -12.0 * 2f64.powi(-128));
    }

    /// ggml's formula on a hand-made block: amax 5 gives e = floor(log2 5) − 2 + 127 = 127
    /// (scale 0.5, values −6 .. 6), and each value its nearest code, +0 for zeros and ties to the
    /// lower code.
    #[test]
    fn quantizes_a_known_block() {
        let mut x = [0.0f32; 32];
        x[0] = 5.0; // nearest of 4 (code 6 → 8·0.5) and 6 (code 7): |5 − 4| = |5 − 6|, the first wins
        x[1] = -0.3; // −0.5 (code 9) vs 0 (code 0): 0.2 < 0.3
        x[16] = -2.9; // −3 (code 13)
        x[17] = 0.25; // tie between 0 and 0.5: code 0
        let q = quantize_row_mxfp4(&x);
        assert_eq!(q.len(), BLOCK_MXFP4_BYTES);
        assert_eq!(q[0], 127);
        assert_eq!(q[1], 6 | 13 << 4);
        assert_eq!(q[2], 9);
        assert_eq!(q[1 + 15], 0);
        assert_eq!(quantize_row_mxfp4(&[0.0; 32]), vec![0u8; BLOCK_MXFP4_BYTES]);
    }

    /// Quantize, dequantize: every value lands on its nearest representable value (at most half
    /// a step away, or clipped to ±12·d above the largest code); quantizing the dequantized
    /// block again gives the same bytes, since the largest value keeps the exponent.
    #[test]
    fn round_trip_is_nearest_and_stable() {
        for seed in 0..64u64 {
            let scale = 2f32.powi((hash2(seed, 99) % 60) as i32 - 30);
            let x: Vec<f32> = (0..32 * 16).map(|i| uniform_pm1(seed, i) * scale).collect();
            let q = quantize_row_mxfp4(&x);
            let mut back = vec![0.0; x.len()];
            dequantize_mxfp4_into(&q, &mut back);
            for (b, (xb, yb)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
                let d = e8m0_to_f32_half(q[b * BLOCK_MXFP4_BYTES]);
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert!((8.0 * d..16.0 * d).contains(&amax), "seed {seed} block {b}: amax {amax}, d {d}");
                for (&v, &r) in xb.iter().zip(yb) {
                    let nearest = KVALUES.iter().map(|&k| (k as f32 * d - v).abs()).fold(f32::INFINITY, f32::min);
                    assert_eq!((r - v).abs(), nearest, "seed {seed}: {v} came back as {r}");
                }
            }
            assert_eq!(quantize_row_mxfp4(&back), q, "seed {seed}: requantizing changed the blocks");
        }
    }

    /// q8_1 blocks from random bytes: quants in −127..=127, d a random positive f16.
    fn q8_1_blocks(seed: u64, n: usize) -> Vec<crate::quant::BlockQ8_1> {
        (0..n as u64)
            .map(|b| crate::quant::BlockQ8_1 {
                d: half::f16::from_f32(1e-3 + (hash2(seed, b) % 1000) as f32 * 1e-4),
                s: half::f16::ZERO,
                qs: std::array::from_fn(|l| ((hash2(seed + 1, 32 * b + l as u64) % 255) as i32 - 127) as i8),
            })
            .collect()
    }

    /// The twin dot, block by block, equals (d·d8)·Σ with Σ taken from the dequantized values of
    /// the same codes at scale 1 and d = 2^(e − 128) computed in f64: for every exponent from 0
    /// (subnormal scales) to 254, random codes and activations.
    #[test]
    fn dot_is_the_scaled_sum_of_the_dequantized_codes() {
        for seed in 0..8u64 {
            let exps: Vec<u8> = (0..=254u8).collect();
            let mut row = Vec::new();
            for (b, &e) in exps.iter().enumerate() {
                row.push(e);
                row.extend((0..16).map(|j| hash2(seed + 10, 16 * b as u64 + j) as u8));
            }
            let x = q8_1_blocks(seed, exps.len());
            let mut want = 0.0f32;
            for (b, (blk, xb)) in row.chunks_exact(BLOCK_MXFP4_BYTES).zip(&x).enumerate() {
                let mut unit = blk.to_vec();
                unit[0] = 128;
                let mut v = [f32::NAN; 32];
                dequantize_mxfp4_into(&unit, &mut v);
                let sum: i32 = v.iter().zip(&xb.qs).map(|(&w, &q)| w as i32 * q as i32).sum();
                assert!(v.iter().all(|w| w.fract() == 0.0 && w.abs() <= 12.0));
                let d = 2f64.powi(exps[b] as i32 - 128) as f32;
                want += d * xb.d.to_f32() * sum as f32;
                let one = dot_mxfp4_q8_1(blk, std::slice::from_ref(xb));
                assert_eq!(one.to_bits(), (d * xb.d.to_f32() * sum as f32).to_bits(), "seed {seed} e = {}", exps[b]);
            }
            assert_eq!(dot_mxfp4_q8_1(&row, &x).to_bits(), want.to_bits(), "seed {seed}");
        }
    }

    /// Each code, in either nibble of any byte, dots as its KVALUES entry; code 8 (−0) gives +0.
    #[test]
    fn every_code_dots_as_its_value() {
        let x1 = |l: usize| crate::quant::BlockQ8_1 { d: half::f16::ONE, s: half::f16::ZERO, qs: std::array::from_fn(|i| (i == l) as i8) };
        for code in 0..16u8 {
            let block: Vec<u8> = std::iter::once(128).chain(std::iter::repeat_n(code | code << 4, 16)).collect();
            for l in 0..32 {
                let got = dot_mxfp4_q8_1(&block, &[x1(l)]);
                assert_eq!(got.to_bits(), (KVALUES[code as usize] as f32).to_bits(), "code {code} value {l}");
            }
        }
        // Only the addressed nibble counts: low codes 7 (12), high codes 15 (−12).
        let block: Vec<u8> = std::iter::once(129).chain(std::iter::repeat_n(7 | 15 << 4, 16)).collect();
        assert_eq!(dot_mxfp4_q8_1(&block, &[x1(3)]), 24.0);
        assert_eq!(dot_mxfp4_q8_1(&block, &[x1(19)]), -24.0);
    }

    #[test]
    #[should_panic(expected = "whole blocks of 32")]
    fn partial_blocks_are_refused() {
        quantize_row_mxfp4(&[1.0; 33]);
    }
}
