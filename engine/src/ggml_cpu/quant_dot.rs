//! Quantized weight row · q8 activation row, in the arithmetic of llama.cpp's x86-64 AVX2 build
//! (`ggml_vec_dot_*_q8_*` in `ggml-cpu/arch/x86/quants.c`; llamafile's `tinyBLAS_Q0_AVX`, which
//! `mul_mat` runs for q4_0/q8_0 and two or more activation rows, computes the same thing), so
//! that every dot comes out bit for bit, on any CPU.
//!
//! Why mirror the lanes: each block's integer sums are exact whatever the order, but AVX2 keeps
//! them in 8 i32 lanes, converts each lane to f32 and accumulates it with an FMA into its own f32
//! lane across the blocks, and only sums the 8 lanes at the end (`hsum_float_8`). One f32
//! accumulator over whole-block sums (the textbook formula) differs by an ulp or so, and that is
//! enough to flip a q8 activation rounding or a router near-tie a few layers on.
//!
//! The lane layout, from `_mm256_maddubs_epi16` (adjacent byte pairs) then `_mm256_madd_epi16`
//! (adjacent i16 pairs): i32 lane l of a 32-byte vector holds the products of bytes 4l .. 4l + 3;
//! lanes 0-3 are the low 128 bits (bytes 0-15), 4-7 the high ones. Per type:
//! - q8_0, q4_0 (nibbles − 8; bytes 0-15 the low nibbles, 16-31 the high): acc[l] = fma(d_w·d_x,
//!   lane l, acc[l]) per block; result `hsum8(acc)`.
//! - mxfp4 (`ggml_vec_dot_mxfp4_q8_0`; mul_mat always runs it, sgemm takes no mxfp4): the code
//!   values (E2M1 doubled, −12..12; low nibbles bytes 0-15, high 16-31) in the q4_0 lanes, scale
//!   d_x·e8m0_half(e). Blocks go in pairs: even blocks into one set of 8 f32 lanes, odd blocks
//!   into another, both fma'd as q4_0's; then `hsum8(acc_even + acc_odd)`, lane by lane. An odd
//!   last block takes the scalar tail: one integer sum, `sum = fma(d, isum, sum)` (GCC contracts
//!   the C's `sumf += d * (sumi1 + sumi2)` under -mfma, as for q5_K's mins: `vfmadd231ss` in the
//!   object scripts/ggml-crosscheck builds; its random rows rarely tell the two roundings apart).
//! - q4_K, q5_K: lane l = Σ over the 4 pairs of 32-value sub-blocks of scale · Σ its 4 products;
//!   acc[l] = fma(d_x·d_w, lane l, acc[l]). The mins: q8s[k] = bsums[2k] + bsums[2k+1], 4 i32
//!   lanes m[2q]·q8s[2q] + m[2q+1]·q8s[2q+1]; q4_K keeps them in 4 f32 lanes (fma with
//!   −d_x·dmin_w) summed (0 + 2) + (1 + 3) at the end, q5_K sums them to one integer and
//!   accumulates `summs = fma(−d_x·dmin_w, that, summs)` (GCC contracts the C's `summs += dmin *
//!   i` under -mfma); result `hsum8(acc) + mins`.
//! - q6_K: quants 0..63 (the −32 comes later); lane l of quarter k of half j takes scale
//!   sc[8j + 2k] (l < 4) or sc[8j + 2k + 1]; minus 32·(bsums[2l]·sc[2l] + bsums[2l+1]·sc[2l+1]);
//!   acc[l] = fma(d_x·d_w, lane l, acc[l]); result `hsum8(acc)`.
//!
//! `_mm256_maddubs_epi16` saturates its i16 pair sums; no pair here comes near (at most
//! 2·128·127 for q8_0 with a −128 weight), so plain integer sums are the same. Where ggml takes
//! |w| and moves w's sign onto x (`_mm256_sign_epi8`: q4_0, mxfp4), an activation of −128 would
//! keep its sign; q8_0 activations lie in −127..127 (`quantize_block_q8_0`), so it never meets one.

use brink_kernels::quant::kquants::{
    BLOCK_Q4_K_BYTES, BLOCK_Q5_K_BYTES, BLOCK_Q6_K_BYTES, Q4_K_D, Q4_K_DMIN, Q4_K_QS, Q4_K_SCALES, Q5_K_D, Q5_K_DMIN, Q5_K_QH, Q5_K_QS,
    Q5_K_SCALES, Q6_K_D, Q6_K_QH, Q6_K_QL, Q6_K_SCALES, get_scale_min_k4,
};
use brink_kernels::quant::mxfp4::{BLOCK_MXFP4_BYTES, KVALUES, e8m0_to_f32_half};
use brink_kernels::quant::{BLOCK_Q4_0_BYTES, BLOCK_Q8_0_BYTES};

use super::act_quant::{BlockQ8_0, BlockQ8K, QK_K, f16_to_f32};
use super::float_dot::hsum8;
use super::ggml_exp::fma_f32;

/// Lanes of an AVX2 register of f32 or i32.
const LANES: usize = 8;

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// acc[l] = fma(d, lane[l], acc[l]): `_mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc)`
/// (the conversion rounds to nearest even, as Rust's `as f32` does).
#[inline(always)]
fn fma_lanes(acc: &mut [f32; LANES], d: f32, lanes: &[i32; LANES]) {
    for l in 0..LANES {
        acc[l] = fma_f32(d, lanes[l] as f32, acc[l]);
    }
}

/// Lane sums of w·x over 32 values, w given as 32 signed values widened to i16.
#[inline(always)]
fn lanes_32(w: &[i16; 32], x: &[i8; 32]) -> [i32; LANES] {
    let mut p = [0i32; 32];
    for i in 0..32 {
        p[i] = (w[i] * x[i] as i16) as i32;
    }
    std::array::from_fn(|l| (p[4 * l] + p[4 * l + 1]) + (p[4 * l + 2] + p[4 * l + 3]))
}

pub fn dot_q8_0_q8_0(w_row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_Q8_0_BYTES>();
    let mut acc = [0.0f32; LANES];
    for (b, xb) in blocks.iter().zip(x) {
        let q: [i16; 32] = std::array::from_fn(|i| b[2 + i] as i8 as i16);
        fma_lanes(&mut acc, f16_at(b, 0) * xb.d, &lanes_32(&q, &xb.qs));
    }
    hsum8(&acc)
}

pub fn dot_q4_0_q8_0(w_row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_Q4_0_BYTES>();
    let mut acc = [0.0f32; LANES];
    for (b, xb) in blocks.iter().zip(x) {
        // Value j < 16: low nibble of byte j; 16 + j: its high nibble (`bytes_from_nibbles_32`).
        let q: [i16; 32] = std::array::from_fn(|i| if i < 16 { (b[2 + i] & 0x0f) as i16 - 8 } else { (b[2 + i - 16] >> 4) as i16 - 8 });
        fma_lanes(&mut acc, f16_at(b, 0) * xb.d, &lanes_32(&q, &xb.qs));
    }
    hsum8(&acc)
}

/// The 32 code values of an mxfp4 block, in value order.
#[inline(always)]
fn mxfp4_values(b: &[u8; BLOCK_MXFP4_BYTES]) -> [i16; 32] {
    std::array::from_fn(|i| if i < 16 { KVALUES[(b[1 + i] & 0x0f) as usize] } else { KVALUES[(b[1 + i - 16] >> 4) as usize] } as i16)
}

pub fn dot_mxfp4_q8_0(w_row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_MXFP4_BYTES>();
    let nb = blocks.len().min(x.len());
    let mut acc = [[0.0f32; LANES]; 2];
    for ib in 0..nb / 2 * 2 {
        let (b, xb) = (&blocks[ib], &x[ib]);
        fma_lanes(&mut acc[ib % 2], xb.d * e8m0_to_f32_half(b[0]), &lanes_32(&mxfp4_values(b), &xb.qs));
    }
    let mut sum = hsum8(&std::array::from_fn(|l| acc[0][l] + acc[1][l]));
    if nb % 2 == 1 {
        let (b, xb) = (&blocks[nb - 1], &x[nb - 1]);
        let isum: i32 = mxfp4_values(b).iter().zip(&xb.qs).map(|(&w, &q)| w as i32 * q as i32).sum();
        sum = fma_f32(xb.d * e8m0_to_f32_half(b[0]), isum as f32, sum);
    }
    sum
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

/// The mins' 4 i32 lanes of a q4_K/q5_K block (`_mm_madd_epi16(mins, hadd(bsums))`).
#[inline(always)]
fn min_lanes(y: &BlockQ8K, m: &[i32; 8]) -> [i32; 4] {
    let q8s: [i32; 8] = std::array::from_fn(|k| y.bsums[2 * k] as i32 + y.bsums[2 * k + 1] as i32);
    std::array::from_fn(|q| m[2 * q] * q8s[2 * q] + m[2 * q + 1] * q8s[2 * q + 1])
}

/// The scaled lane sums of a q4_K/q5_K block: sub-blocks 2j and 2j + 1 are the low and the high
/// nibbles of qs[32j .. 32j + 32], plus 16 where bit 2j (2j + 1) of qh[i] is set (q5_K).
#[inline(always)]
fn nibble_block_lanes(qs: &[u8; QK_K / 2], qh: Option<&[u8; 32]>, y: &[i8; QK_K], sc: &[i32; 8]) -> [i32; LANES] {
    let mut sumi = [0i32; LANES];
    for j in 0..QK_K / 64 {
        let q = &qs[32 * j..32 * j + 32];
        let lo: [i16; 32] = std::array::from_fn(|i| {
            let hb = qh.map_or(0, |h| ((h[i] >> (2 * j)) & 1) << 4);
            ((q[i] & 0x0f) | hb) as i16
        });
        let hi: [i16; 32] = std::array::from_fn(|i| {
            let hb = qh.map_or(0, |h| ((h[i] >> (2 * j + 1)) & 1) << 4);
            ((q[i] >> 4) | hb) as i16
        });
        let yl: &[i8; 32] = y[64 * j..64 * j + 32].try_into().expect("32 values");
        let yh: &[i8; 32] = y[64 * j + 32..64 * j + 64].try_into().expect("32 values");
        let (pl, ph) = (lanes_32(&lo, yl), lanes_32(&hi, yh));
        for l in 0..LANES {
            sumi[l] += sc[2 * j] * pl[l] + sc[2 * j + 1] * ph[l];
        }
    }
    sumi
}

pub fn dot_q4_k_q8_k(w_row: &[u8], x: &[BlockQ8K]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_Q4_K_BYTES>();
    let mut acc = [0.0f32; LANES];
    let mut acc_m = [0.0f32; 4];
    for (b, y) in blocks.iter().zip(x) {
        let d = y.d * f16_at(b, Q4_K_D);
        let dmin = -y.d * f16_at(b, Q4_K_DMIN);
        let (sc, m) = scales_mins(&b[Q4_K_SCALES..Q4_K_QS]);
        for (a, p) in acc_m.iter_mut().zip(min_lanes(y, &m)) {
            *a = fma_f32(dmin, p as f32, *a);
        }
        let qs = b[Q4_K_QS..].try_into().expect("q4_K quants");
        fma_lanes(&mut acc, d, &nibble_block_lanes(qs, None, &y.qs, &sc));
    }
    hsum8(&acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

pub fn dot_q5_k_q8_k(w_row: &[u8], x: &[BlockQ8K]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_Q5_K_BYTES>();
    let mut acc = [0.0f32; LANES];
    let mut summs = 0.0f32;
    for (b, y) in blocks.iter().zip(x) {
        let d = y.d * f16_at(b, Q5_K_D);
        let dmin = -y.d * f16_at(b, Q5_K_DMIN);
        let (sc, m) = scales_mins(&b[Q5_K_SCALES..Q5_K_QH]);
        let p = min_lanes(y, &m);
        summs = fma_f32(dmin, ((p[0] + p[1]) + (p[2] + p[3])) as f32, summs);
        let qh = b[Q5_K_QH..Q5_K_QS].try_into().expect("q5_K high bits");
        let qs = b[Q5_K_QS..].try_into().expect("q5_K quants");
        fma_lanes(&mut acc, d, &nibble_block_lanes(qs, Some(qh), &y.qs, &sc));
    }
    hsum8(&acc) + summs
}

pub fn dot_q6_k_q8_k(w_row: &[u8], x: &[BlockQ8K]) -> f32 {
    let (blocks, _) = w_row.as_chunks::<BLOCK_Q6_K_BYTES>();
    let mut acc = [0.0f32; LANES];
    for (b, y) in blocks.iter().zip(x) {
        let d = y.d * f16_at(b, Q6_K_D);
        let sc: [i32; 16] = std::array::from_fn(|i| b[Q6_K_SCALES + i] as i8 as i32);
        let mut sumi = [0i32; LANES];
        // Half j (128 values): quarter k takes nibble k / 2 of ql[64j + 32(k % 2) + i] and bits
        // 2k, 2k + 1 of qh[32j + i], as unsigned 0..63.
        for j in 0..2 {
            let ql = &b[Q6_K_QL + 64 * j..][..64];
            let qh = &b[Q6_K_QH + 32 * j..][..32];
            for k in 0..4 {
                let q: [i16; 32] = std::array::from_fn(|i| {
                    let low = ql[32 * (k % 2) + i] >> (4 * (k / 2)) & 0x0f;
                    (low | ((qh[i] >> (2 * k)) & 3) << 4) as i16
                });
                let yq: &[i8; 32] = y.qs[128 * j + 32 * k..][..32].try_into().expect("32 values");
                let p = lanes_32(&q, yq);
                let (s_lo, s_hi) = (sc[8 * j + 2 * k], sc[8 * j + 2 * k + 1]);
                for l in 0..LANES {
                    sumi[l] += if l < 4 { s_lo } else { s_hi } * p[l];
                }
            }
        }
        let lanes: [i32; LANES] =
            std::array::from_fn(|l| sumi[l] - 32 * (y.bsums[2 * l] as i32 * sc[2 * l] + y.bsums[2 * l + 1] as i32 * sc[2 * l + 1]));
        fma_lanes(&mut acc, d, &lanes);
    }
    hsum8(&acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn q4_0_hand_block() {
        // d = 0.5; byte j: low nibble j (value j − 8), high nibble 15 − j (value 7 − j).
        let mut w = f16::from_f32(0.5).to_le_bytes().to_vec();
        w.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let x = BlockQ8_0 { d: 0.25, qs: std::array::from_fn(|j| if j < 16 { 1 } else { 2 }) };
        // Σ_j (j − 8)·1 + Σ_j (7 − j)·2 = −8 + 2·(−8) = −24; · 0.5 · 0.25 = −3.
        assert_eq!(dot_q4_0_q8_0(&w, &[x]), -3.0);
    }

    /// Two q8_0 blocks whose lanes round differently from one running sum: lane 0 holds 2^24
    /// from block 0 and takes +1 from block 1 (lost to rounding), while the textbook order adds
    /// block 1's whole sum (1 + 2) at once and keeps it.
    #[test]
    fn q8_0_accumulates_per_lane() {
        let block = |d: f32, q: [i8; 32]| {
            let mut b = f16::from_f32(d).to_le_bytes().to_vec();
            b.extend(q.iter().map(|&v| v as u8));
            b
        };
        let mut q0 = [0i8; 32];
        q0[0] = 1;
        let mut q1 = [0i8; 32];
        q1[0] = 1; // lane 0
        q1[4] = 2; // lane 1
        let mut w = block(1.0, q0);
        w.extend(block(1.0, q1));
        let x0 = BlockQ8_0 { d: 16_777_216.0, qs: [1; 32] };
        let x1 = BlockQ8_0 { d: 1.0, qs: [1; 32] };
        // Lanes: [2^24 + 1 → 2^24, 2, 0, …]; hsum: 2^24 + 2 exactly.
        assert_eq!(dot_q8_0_q8_0(&w, &[x0, x1]), 16_777_218.0);
        // The textbook order: 2^24 + 3 rounds to 2^24 + 4.
        assert_eq!(16_777_216.0f32 + 3.0, 16_777_220.0);
    }

    /// An mxfp4 block of `codes` (value order) with exponent `e`.
    fn mxfp4_block(e: u8, codes: [u8; 32]) -> Vec<u8> {
        let mut b = vec![e];
        b.extend((0..16).map(|j| codes[j] | codes[16 + j] << 4));
        b
    }

    #[test]
    fn mxfp4_hand_block() {
        // e = 126: scale 2^-2. Value j < 16 is code j, value 16 + j code 15 − j.
        let codes: [u8; 32] = std::array::from_fn(|j| if j < 16 { j as u8 } else { 31 - j as u8 });
        let w = mxfp4_block(126, codes);
        // The 16 code values sum to 0 (each meets its negative): x_q = 1, then 2, gives 0.
        let x = BlockQ8_0 { d: 0.5, qs: std::array::from_fn(|j| if j < 16 { 1 } else { 2 }) };
        assert_eq!(dot_mxfp4_q8_0(&w, &[x]), 0.0);
        // x_q with the sign of its code (codes 8-15 negative): Σ|values| = 72 per half, so
        // 72·1 + 72·2 = 216, · 0.5 · 0.25 = 27.
        let x = BlockQ8_0 { d: 0.5, qs: std::array::from_fn(|j| if codes[j] >= 8 { -1 } else { 1 } * if j < 16 { 1 } else { 2 }) };
        assert_eq!(dot_mxfp4_q8_0(&w, &[x]), 27.0);
    }

    /// Blocks go in pairs, even and odd into two sets of lanes: four blocks each putting 1 in
    /// lane 0, the first scaled by 2^24, keep 2^24 + 2 (even: 2^24 + 1 → 2^24, odd: 1 + 1 = 2)
    /// where one running sum loses all three ones.
    #[test]
    fn mxfp4_pairs_accumulate_apart() {
        let w: Vec<u8> = (0..4).flat_map(|_| mxfp4_block(128, std::array::from_fn(|j| u8::from(j == 0)))).collect();
        let mut x = [BlockQ8_0 { d: 1.0, qs: std::array::from_fn(|j| i8::from(j == 0)) }; 4];
        x[0].d = 16_777_216.0;
        assert_eq!(dot_mxfp4_q8_0(&w, &x), 16_777_218.0);
    }

    /// An odd last block is added with one FMA: −2^14 from the pair, then (1 + 2^-10) · 16385
    /// = 16401 + 2^-10, a tie that a separate product would round to 16401 (even), leaving 17.
    #[test]
    fn mxfp4_odd_tail_is_fused() {
        let mut w = mxfp4_block(128, std::array::from_fn(|j| u8::from(j == 0)));
        w.extend(mxfp4_block(128, [0; 32]));
        // Values 12 (code 7) at 0..=10, 1 (code 1) at 11: 10·12·127 + 12·95 + 5 = 16385.
        w.extend(mxfp4_block(128, std::array::from_fn(|j| if j <= 10 { 7 } else { u8::from(j == 11) })));
        let x0 = BlockQ8_0 { d: 1024.0, qs: std::array::from_fn(|j| if j == 0 { -16 } else { 0 }) };
        let x1 = BlockQ8_0 { d: 1.0, qs: [1; 32] };
        let mut q2 = [0i8; 32];
        q2[..10].fill(127);
        (q2[10], q2[11]) = (95, 5);
        let x2 = BlockQ8_0 { d: 1.0 + 2f32.powi(-10), qs: q2 };
        assert_eq!(dot_mxfp4_q8_0(&w, &[x0, x1, x2]), 17.0 + 2f32.powi(-10));
    }

    /// q6_K's unsigned quants minus 32·Σ bsums·scale equal the signed formula (q − 32) per value:
    /// with both scales 1 every lane and every sum is an exact integer.
    #[test]
    fn q6_k_offset_matches_signed_quants() {
        let mut b = vec![0u8; BLOCK_Q6_K_BYTES];
        for (i, v) in b.iter_mut().enumerate() {
            *v = (i * 37 % 251) as u8;
        }
        for s in 0..16 {
            b[Q6_K_SCALES + s] = (s as i8 * 3 - 20) as u8;
        }
        b[Q6_K_D..Q6_K_D + 2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        let qs: [i8; QK_K] = std::array::from_fn(|i| ((i * 11) % 17) as i8 - 8);
        let bsums = std::array::from_fn(|g| qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum());
        let y = BlockQ8K { d: 1.0, qs, bsums };
        let tt = brink_kernels::quant::TensorType::from_ggml_id(crate::gguf::GgmlType::Q6_K.id()).unwrap();
        let wd = tt.dequantize_row(&b).unwrap();
        let exact: f64 = wd.iter().zip(&qs).map(|(&w, &q)| w as f64 * q as f64).sum();
        assert_eq!(dot_q6_k_q8_k(&b, &[y]) as f64, exact);
    }

    /// A q4_K block with all quants 0 and every min 1: the dot is −dmin·d_x·Σ x_q, exactly when
    /// d_x is a power of two.
    #[test]
    fn q4_k_mins_meet_the_block_sums() {
        let mut b = vec![0u8; BLOCK_Q4_K_BYTES];
        b[Q4_K_D..Q4_K_D + 2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b[Q4_K_DMIN..Q4_K_DMIN + 2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        // mins of sub-blocks 0..4 in bytes 4..8 (low six bits); 4..8 in the high nibbles of 8..12.
        for j in 0..4 {
            b[Q4_K_SCALES + 4 + j] = 1;
            b[Q4_K_SCALES + 8 + j] = 1 << 4;
        }
        let qs: [i8; QK_K] = std::array::from_fn(|i| (i % 7) as i8 * 9 - 27);
        let bsums = std::array::from_fn(|g| qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum());
        let y = BlockQ8K { d: 0.25, qs, bsums };
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        assert_eq!(dot_q4_k_q8_k(&b, &[y]), -(0.5 * 0.25) * sum as f32);
        // q5_K with no high bits set is the same block as far as the dot goes.
        let mut b5 = vec![0u8; BLOCK_Q5_K_BYTES];
        b5[..Q5_K_QH].copy_from_slice(&b[..Q4_K_QS]);
        assert_eq!(dot_q5_k_q8_k(&b5, &[y]), -(0.5 * 0.25) * sum as f32);
    }
}
