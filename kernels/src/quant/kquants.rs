//! K-quant super-blocks (`block_q4_K`, `block_q5_K`, `block_q6_K` of ggml-common.h): 256
//! weights per super-block, with sub-block scales quantized inside the block.
//!
//! Dequantization is ggml-quants.c's `dequantize_row_q{4,5,6}_K` operation for operation: the
//! same f32 products and differences in the same order (Rust never fuses them into an FMA), so
//! the values are bit-identical with gguf-py's numpy dequantizers.
//!
//! The dot products with q8_1 activations follow ggml-cuda's `vec_dot_q{4,5,6}_K_q8_1`
//! (vecdotq.cuh), not ggml's CPU path (which quantizes activations to q8_K): the GPU kernels
//! take q8_1 rows, and these are their CPU twins. A super-block meets 8 consecutive q8_1
//! blocks; the integer sums, the f16 scales and the per-sub-block formula are the CUDA ones.
//! CUDA splits a super-block over 16 (q4_K, q5_K) or 32 (q6_K) lanes and sums the lanes'
//! partials, so the GPU's f32 rounding order differs from this sequential sum.

use super::{BlockQ8_1, QK};

/// Weights per super-block.
pub const QK_K: usize = 256;
/// Bytes of the packed six-bit scales and mins of q4_K and q5_K.
pub const K_SCALE_SIZE: usize = 12;
/// q8_1 activation blocks one super-block is dotted with.
pub const Q8_1_PER_SUPER_BLOCK: usize = QK_K / QK;

/// `block_q4_K`: d (f16), dmin (f16), scales[12], qs[128]. Sub-blocks of 32 weights: sub-blocks
/// 2j and 2j+1 are the low and the high nibbles of qs[32j .. 32j + 32]. x = d·sc·q − dmin·m.
pub const BLOCK_Q4_K_BYTES: usize = 2 + 2 + K_SCALE_SIZE + QK_K / 2;
pub const Q4_K_D: usize = 0;
pub const Q4_K_DMIN: usize = 2;
pub const Q4_K_SCALES: usize = 4;
pub const Q4_K_QS: usize = Q4_K_SCALES + K_SCALE_SIZE;

/// `block_q5_K`: d, dmin, scales[12] as in q4_K, then qh[32], qs[128]: bit s of qh[l] is the
/// fifth bit (+16) of weight l of sub-block s. x = d·sc·q − dmin·m with q in 0..32.
pub const BLOCK_Q5_K_BYTES: usize = 2 + 2 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2;
pub const Q5_K_D: usize = 0;
pub const Q5_K_DMIN: usize = 2;
pub const Q5_K_SCALES: usize = 4;
pub const Q5_K_QH: usize = Q5_K_SCALES + K_SCALE_SIZE;
pub const Q5_K_QS: usize = Q5_K_QH + QK_K / 8;

/// `block_q6_K`: ql[128], qh[64], scales[16] (i8, one per 16 weights), d (f16) last.
/// x = d·sc·(q − 32), q six bits: a nibble of ql and two bits of qh.
pub const BLOCK_Q6_K_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
pub const Q6_K_QL: usize = 0;
pub const Q6_K_QH: usize = Q6_K_QL + QK_K / 2;
pub const Q6_K_SCALES: usize = Q6_K_QH + QK_K / 4;
pub const Q6_K_D: usize = Q6_K_SCALES + QK_K / 16;

fn f16_at(b: &[u8], at: usize) -> f32 {
    super::f16_bits_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Six-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes (ggml's
/// `get_scale_min_k4`): sub-blocks 0..4 keep theirs in the low six bits of bytes j and j + 4;
/// sub-blocks 4..8 keep the low nibbles in byte j + 4 and the top two bits in the spare top
/// bits of bytes j − 4 (scale) and j (min).
pub fn get_scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    }
}

/// The header of a q4_K or q5_K block (their first 16 bytes are laid out alike).
struct ScaledMin<'a> {
    d: f32,
    dmin: f32,
    scales: &'a [u8],
}

impl<'a> ScaledMin<'a> {
    fn read(b: &'a [u8]) -> Self {
        ScaledMin { d: f16_at(b, Q4_K_D), dmin: f16_at(b, Q4_K_DMIN), scales: &b[Q4_K_SCALES..Q4_K_SCALES + K_SCALE_SIZE] }
    }

    /// (d·sc, dmin·m) of sub-block `j`, rounded to f32 as ggml rounds them.
    fn sub_block(&self, j: usize) -> (f32, f32) {
        let (sc, m) = get_scale_min_k4(j, self.scales);
        (self.d * sc as f32, self.dmin * m as f32)
    }
}

pub fn dequantize_block_q4_k(b: &[u8; BLOCK_Q4_K_BYTES], y: &mut [f32; QK_K]) {
    let h = ScaledMin::read(b);
    let qs = &b[Q4_K_QS..];
    for (j, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (d1, m1) = h.sub_block(2 * j);
        let (d2, m2) = h.sub_block(2 * j + 1);
        let (lo, hi) = y.split_at_mut(32);
        for l in 0..32 {
            lo[l] = d1 * (q[l] & 0x0f) as f32 - m1;
            hi[l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

pub fn dequantize_block_q5_k(b: &[u8; BLOCK_Q5_K_BYTES], y: &mut [f32; QK_K]) {
    let h = ScaledMin::read(b);
    let qh = &b[Q5_K_QH..Q5_K_QS];
    let qs = &b[Q5_K_QS..];
    for (j, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (d1, m1) = h.sub_block(2 * j);
        let (d2, m2) = h.sub_block(2 * j + 1);
        let (u1, u2) = (1u8 << (2 * j), 1u8 << (2 * j + 1));
        let (lo, hi) = y.split_at_mut(32);
        for l in 0..32 {
            lo[l] = d1 * ((q[l] & 0x0f) + if qh[l] & u1 != 0 { 16 } else { 0 }) as f32 - m1;
            hi[l] = d2 * ((q[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 }) as f32 - m2;
        }
    }
}

pub fn dequantize_block_q6_k(b: &[u8; BLOCK_Q6_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, Q6_K_D);
    // Two halves of 128 weights; in each, ql byte l holds weights l (low nibble) and l + 64
    // (high), ql byte l + 32 weights l + 32 and l + 96; qh byte l their top two bits, in that order.
    for (n, y) in y.chunks_exact_mut(128).enumerate() {
        let ql = &b[Q6_K_QL + 64 * n..Q6_K_QL + 64 * n + 64];
        let qh = &b[Q6_K_QH + 32 * n..Q6_K_QH + 32 * n + 32];
        let sc = &b[Q6_K_SCALES + 8 * n..Q6_K_SCALES + 8 * n + 8];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] as i8 as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

/// Dequantizes the whole super-blocks of `row` into `out` (as many as both hold; callers check
/// the lengths: [`super::TensorType::dequantize_into`]).
pub fn dequantize_row_q4_k(row: &[u8], out: &mut [f32]) {
    let (blocks, _) = row.as_chunks::<BLOCK_Q4_K_BYTES>();
    for (b, y) in blocks.iter().zip(out.as_chunks_mut::<QK_K>().0) {
        dequantize_block_q4_k(b, y);
    }
}

pub fn dequantize_row_q5_k(row: &[u8], out: &mut [f32]) {
    let (blocks, _) = row.as_chunks::<BLOCK_Q5_K_BYTES>();
    for (b, y) in blocks.iter().zip(out.as_chunks_mut::<QK_K>().0) {
        dequantize_block_q5_k(b, y);
    }
}

pub fn dequantize_row_q6_k(row: &[u8], out: &mut [f32]) {
    let (blocks, _) = row.as_chunks::<BLOCK_Q6_K_BYTES>();
    for (b, y) in blocks.iter().zip(out.as_chunks_mut::<QK_K>().0) {
        dequantize_block_q6_k(b, y);
    }
}

/// Quant of weight `l` (0..32) of sub-block `s` (0..8) of a q4_K or q5_K block's qs.
#[cfg(test)]
fn nibble(qs: &[u8], s: usize, l: usize) -> i32 {
    ((qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0f) as i32
}

fn sum_q8(x: &BlockQ8_1) -> i32 {
    x.qs.iter().map(|&q| q as i32).sum()
}

/// The shared tail of `vec_dot_q{4,5}_K_q8_1_impl_vmmq`: per sub-block s,
/// sumf_d += d8·(Σ q·u · sc) and sumf_m += d8·(Σ u · m), then d·sumf_d − dmin·sumf_m. The min
/// uses the exact integer Σ u (CUDA's dp4a with 0x01010101), not the q8_1 block's f16 s.
/// `quants[s]` holds sub-block s's 32 quants (unpacked once per super-block, so each integer
/// dot runs over two 32-byte arrays).
fn dot_scaled_min(h: &ScaledMin, x: &[BlockQ8_1; Q8_1_PER_SUPER_BLOCK], quants: &[[u8; QK]; Q8_1_PER_SUPER_BLOCK]) -> f32 {
    let (mut sumf_d, mut sumf_m) = (0.0f32, 0.0f32);
    for (s, (xs, q)) in x.iter().zip(quants).enumerate() {
        let (sc, m) = get_scale_min_k4(s, h.scales);
        let mut dot = 0i32;
        for (&w, &u) in q.iter().zip(&xs.qs) {
            dot += w as i32 * u as i32;
        }
        let d8 = super::f16_to_f32(xs.d);
        sumf_d += d8 * (dot * sc as i32) as f32;
        sumf_m += d8 * (sum_q8(xs) * m as i32) as f32;
    }
    h.d * sumf_d - h.dmin * sumf_m
}

/// The 32 four-bit quants of every sub-block of a q4_K or q5_K block's qs ([`nibble`]'s).
fn nibbles(qs: &[u8]) -> [[u8; QK]; Q8_1_PER_SUPER_BLOCK] {
    let mut out = [[0u8; QK]; Q8_1_PER_SUPER_BLOCK];
    for (pair, q) in out.chunks_exact_mut(2).zip(qs.as_chunks::<QK>().0) {
        for l in 0..QK {
            pair[0][l] = q[l] & 0x0f;
            pair[1][l] = q[l] >> 4;
        }
    }
    out
}

/// One q4_K super-block · 8 q8_1 blocks: the formula of `vec_dot_q4_K_q8_1`.
pub fn dot_block_q4_k_q8_1(b: &[u8; BLOCK_Q4_K_BYTES], x: &[BlockQ8_1; Q8_1_PER_SUPER_BLOCK]) -> f32 {
    dot_scaled_min(&ScaledMin::read(b), x, &nibbles(&b[Q4_K_QS..]))
}

/// One q5_K super-block · 8 q8_1 blocks: the formula of `vec_dot_q5_K_q8_1`.
pub fn dot_block_q5_k_q8_1(b: &[u8; BLOCK_Q5_K_BYTES], x: &[BlockQ8_1; Q8_1_PER_SUPER_BLOCK]) -> f32 {
    let qh: &[u8; QK] = b[Q5_K_QH..Q5_K_QS].try_into().expect("a q5_K block holds 32 high-bit bytes");
    let mut quants = nibbles(&b[Q5_K_QS..]);
    for (s, q) in quants.iter_mut().enumerate() {
        for (w, &h) in q.iter_mut().zip(qh) {
            *w |= ((h >> s) & 1) << 4;
        }
    }
    dot_scaled_min(&ScaledMin::read(b), x, &quants)
}

/// Six-bit quant of weight `e` (0..256) of a q6_K block, minus 32.
fn q6_k_quant(b: &[u8; BLOCK_Q6_K_BYTES], e: usize) -> i32 {
    let (n, quarter, l) = (e / 128, e % 128 / 32, e % 32);
    let low = (b[Q6_K_QL + 64 * n + 32 * (quarter % 2) + l] >> (4 * (quarter / 2))) & 0x0f;
    let high = (b[Q6_K_QH + 32 * n + l] >> (2 * quarter)) & 3;
    (low | (high << 4)) as i32 - 32
}

/// One q6_K super-block · 8 q8_1 blocks: the formula of `vec_dot_q6_K_q8_1`: per group of 16
/// weights (one i8 scale each; group g is weights 16g .. 16g + 16), sumf += d8·(Σ q·u · sc),
/// then d·sumf.
pub fn dot_block_q6_k_q8_1(b: &[u8; BLOCK_Q6_K_BYTES], x: &[BlockQ8_1; Q8_1_PER_SUPER_BLOCK]) -> f32 {
    // Every quant unpacked once (`q6_k_quant`'s), then each group's integer dot over arrays.
    let mut quants = [0i8; QK_K];
    for (e, q) in quants.iter_mut().enumerate() {
        *q = q6_k_quant(b, e) as i8;
    }
    let mut sumf = 0.0f32;
    for (g, w) in quants.as_chunks::<16>().0.iter().enumerate() {
        let xs = &x[g / 2];
        let half = 16 * (g % 2);
        let mut dot = 0i32;
        for (&w, &u) in w.iter().zip(&xs.qs[half..half + 16]) {
            dot += w as i32 * u as i32;
        }
        let sc = b[Q6_K_SCALES + g] as i8 as i32;
        sumf += super::f16_to_f32(xs.d) * (dot * sc) as f32;
    }
    f16_at(b, Q6_K_D) * sumf
}

/// Row dot products over whole super-blocks (and the q8_1 blocks beside them); callers check
/// the lengths ([`super::TensorType::dot_q8_1`]).
pub fn dot_q4_k_q8_1(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
    let (xs, _) = x.as_chunks::<Q8_1_PER_SUPER_BLOCK>();
    w_row.as_chunks::<BLOCK_Q4_K_BYTES>().0.iter().zip(xs).map(|(b, x)| dot_block_q4_k_q8_1(b, x)).sum()
}

pub fn dot_q5_k_q8_1(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
    let (xs, _) = x.as_chunks::<Q8_1_PER_SUPER_BLOCK>();
    w_row.as_chunks::<BLOCK_Q5_K_BYTES>().0.iter().zip(xs).map(|(b, x)| dot_block_q5_k_q8_1(b, x)).sum()
}

pub fn dot_q6_k_q8_1(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
    let (xs, _) = x.as_chunks::<Q8_1_PER_SUPER_BLOCK>();
    w_row.as_chunks::<BLOCK_Q6_K_BYTES>().0.iter().zip(xs).map(|(b, x)| dot_block_q6_k_q8_1(b, x)).sum()
}

/// The kernels' f32 value of 32-wide block `s` (0..8) of a K-quant super-block against one
/// q8_1 block (common.cuh `block_partial`, each rounding spelled there with an _rn intrinsic):
/// q4_K/q5_K `d·(d8·(Σq·u·sc)) − dmin·(d8·(Σu·m))`, q6_K `d·(d8·(lo·sc₀) + d8·(hi·sc₁))` over
/// the two 16-weight halves. The same terms as the twins, grouped per block instead of per
/// super-block; tests use it to bound what that and the GPU's summation order cost.
#[cfg(test)]
pub(crate) fn device_block_partial(wtype: super::WeightType, block: &[u8], s: usize, x: &BlockQ8_1) -> f32 {
    use super::WeightType;
    let d8 = x.d.to_f32();
    let dot = |quant: &dyn Fn(usize) -> i32, range: std::ops::Range<usize>| -> i32 { range.map(|l| quant(l) * x.qs[l] as i32).sum() };
    match wtype {
        WeightType::Q6K => {
            let b: &[u8; BLOCK_Q6_K_BYTES] = block.try_into().expect("a q6_K block");
            let quant = |l: usize| q6_k_quant(b, 32 * s + l);
            let (sc0, sc1) = (b[Q6_K_SCALES + 2 * s] as i8 as i32, b[Q6_K_SCALES + 2 * s + 1] as i8 as i32);
            f16_at(b, Q6_K_D) * (d8 * (dot(&quant, 0..16) * sc0) as f32 + d8 * (dot(&quant, 16..32) * sc1) as f32)
        }
        WeightType::Q4K | WeightType::Q5K => {
            let h = ScaledMin::read(block);
            let qs = &block[if wtype == WeightType::Q4K { Q4_K_QS } else { Q5_K_QS }..];
            let qh = &block[Q5_K_QH..Q5_K_QS];
            let high = |l: usize| if wtype == WeightType::Q5K { (((qh[l] >> s) & 1) as i32) << 4 } else { 0 };
            let quant = |l: usize| nibble(qs, s, l) | high(l);
            let (sc, m) = get_scale_min_k4(s, h.scales);
            h.d * (d8 * (dot(&quant, 0..32) * sc as i32) as f32) - h.dmin * (d8 * (sum_q8(x) * m as i32) as f32)
        }
        _ => panic!("{wtype} is not a K-quant"),
    }
}

/// A K-quant row dotted with q8_1 activations in the kernels' order: block b's
/// [`device_block_partial`] added into partial `b % lanes`, then the partials in the xor
/// butterfly of a warp (`lanes` = 32: the GEMVs) or alone (`lanes` = 1: a GEMM thread's
/// sequential sum).
#[cfg(test)]
pub(crate) fn device_order_dot(wtype: super::WeightType, w_row: &[u8], x: &[BlockQ8_1], lanes: usize) -> f32 {
    let bb = wtype.block_bytes();
    let mut part = vec![0.0f32; lanes];
    for (b, xb) in x.iter().enumerate() {
        let block = &w_row[b / Q8_1_PER_SUPER_BLOCK * bb..][..bb];
        part[b % lanes] += device_block_partial(wtype, block, b % Q8_1_PER_SUPER_BLOCK, xb);
    }
    let mut o = lanes / 2;
    while o > 0 {
        let prev = part.clone();
        for (l, v) in part.iter_mut().enumerate() {
            *v += prev[l ^ o];
        }
        o /= 2;
    }
    part[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_q8_1, quantize_row_q8_1};
    use crate::testdata::{hash2, uniform_pm1};
    use half::f16;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    /// ggml's packing of 8 six-bit scales and mins (`quantize_row_q4_K_ref`): the inverse of
    /// `get_scale_min_k4`, written as ggml writes it.
    fn pack_scales(sc: [u8; 8], m: [u8; 8]) -> [u8; K_SCALE_SIZE] {
        let mut q = [0u8; K_SCALE_SIZE];
        for j in 0..8 {
            if j < 4 {
                q[j] = sc[j];
                q[j + 4] = m[j];
            } else {
                q[j + 4] = (sc[j] & 0x0f) | ((m[j] & 0x0f) << 4);
                q[j - 4] |= (sc[j] >> 4) << 6;
                q[j] |= (m[j] >> 4) << 6;
            }
        }
        q
    }

    #[test]
    fn scale_min_unpacks_what_ggml_packs() {
        for v in 0..64u8 {
            for j in 0..8 {
                let mut sc: [u8; 8] = std::array::from_fn(|i| (hash2(v as u64, i as u64) % 64) as u8);
                let mut m: [u8; 8] = std::array::from_fn(|i| (hash2(v as u64, 8 + i as u64) % 64) as u8);
                sc[j] = v;
                m[j] = 63 - v;
                let packed = pack_scales(sc, m);
                for i in 0..8 {
                    assert_eq!(get_scale_min_k4(i, &packed), (sc[i], m[i]), "value {v} at {j}, sub-block {i}");
                }
            }
        }
    }

    // The hand-made q4_K/q5_K header: d = 0.5, dmin = 0.25, scales 1 2 3 4 17 33 49 63,
    // mins 0 1 2 3 20 40 60 5 (every sub-block from 4 on has high bits in the spare bits).
    const SC: [u8; 8] = [1, 2, 3, 4, 17, 33, 49, 63];
    const MIN: [u8; 8] = [0, 1, 2, 3, 20, 40, 60, 5];
    const PACKED: [u8; 12] = [0x41, 0x82, 0xC3, 0xC4, 0x40, 0x81, 0xC2, 0x03, 0x41, 0x81, 0xC1, 0x5F];

    fn hand_header() -> Vec<u8> {
        assert_eq!(pack_scales(SC, MIN), PACKED, "the packed bytes were worked out by hand");
        let mut b = f16_bytes(0.5).to_vec();
        b.extend(f16_bytes(0.25));
        b.extend(PACKED);
        b
    }

    /// qs byte i: low nibble i % 16, high nibble 15 − i % 16.
    fn hand_qs() -> impl Iterator<Item = u8> {
        (0..128u8).map(|i| (i % 16) | ((15 - i % 16) << 4))
    }

    #[test]
    fn q4_k_known_block() {
        let mut b = hand_header();
        b.extend(hand_qs());
        let mut y = [f32::NAN; QK_K];
        dequantize_block_q4_k(b.as_slice().try_into().unwrap(), &mut y);
        // x = 0.5 · sc · q − 0.25 · m; weight e is in sub-block e / 32, byte 32·(s/2) + e % 32.
        assert_eq!(y[0], 0.0); // s0, q 0
        assert_eq!(y[31], 7.5); // s0, q 15
        assert_eq!(y[32], 14.75); // s1 (high nibble of byte 0), q 15: 15 − 0.25
        assert_eq!(y[140], 97.0); // s4, byte 76, q 12: 0.5·17·12 − 0.25·20
        assert_eq!(y[200], 181.0); // s6, byte 104, q 8: 0.5·49·8 − 15
        assert_eq!(y[255], -1.25); // s7, high nibble of byte 127 = 0: −0.25·5
    }

    #[test]
    fn q5_k_known_block() {
        let mut b = hand_header();
        // qh[l] = 1 << (l % 8): weight l of sub-block s gets +16 exactly when l % 8 == s.
        b.extend((0..32u32).map(|l| 1u8 << (l % 8)));
        b.extend(hand_qs());
        let mut y = [f32::NAN; QK_K];
        dequantize_block_q5_k(b.as_slice().try_into().unwrap(), &mut y);
        assert_eq!(y[0], 8.0); // s0 l0: q 0 + 16
        assert_eq!(y[31], 7.5); // s0 l31: no fifth bit
        assert_eq!(y[32], 14.75); // s1 l0: bit 1 of qh[0] clear
        assert_eq!(y[33], 29.75); // s1 l1: q 14 + 16: 0.5·2·30 − 0.25
        assert_eq!(y[206], 720.0); // s6 l14: q 14 + 16: 0.5·49·30 − 15
        assert_eq!(y[255], 502.75); // s7 l31: q 0 + 16: 0.5·63·16 − 1.25
    }

    #[test]
    fn q6_k_known_block() {
        let mut b: Vec<u8> = hand_qs().collect(); // ql
        b.extend([0xE4u8; 64]); // qh: top bits 0, 1, 2, 3 for the four quarters of each half
        b.extend((0..16i8).map(|g| (g - 8) as u8)); // scale of group g (16 weights): g − 8
        b.extend(f16_bytes(0.5));
        let mut y = [f32::NAN; QK_K];
        dequantize_block_q6_k(b.as_slice().try_into().unwrap(), &mut y);
        // Quarter 0: q = l%16 − 32; 1: l%16 − 16; 2: 15 − l%16; 3: 31 − l%16 (l = e % 32).
        assert_eq!(y[0], 128.0); // q −32, scale −8
        assert_eq!(y[47], 3.0); // quarter 1, l 15: q −1, scale −6
        assert_eq!(y[69], -20.0); // quarter 2, l 5: q 10, scale −4
        assert_eq!(y[127], -8.0); // quarter 3, l 31: q 16, scale −1
        assert_eq!(y[228], 81.0); // second half, quarter 3, l 4: q 27, scale 6
        assert_eq!(y[255], 56.0); // q 16, scale 7
    }

    /// A block of random bytes whose f16 fields (at `f16s`) hold finite values from `f16_of`.
    fn random_block<const N: usize>(seed: u64, f16s: &[usize], f16_of: impl Fn(u64) -> f16) -> [u8; N] {
        let mut b: [u8; N] = std::array::from_fn(|i| hash2(seed, i as u64) as u8);
        for (k, &at) in f16s.iter().enumerate() {
            b[at..at + 2].copy_from_slice(&f16_of(hash2(seed, (N + k) as u64)).to_le_bytes());
        }
        b
    }

    /// Any finite f16, subnormals included.
    fn any_finite_f16(h: u64) -> f16 {
        let bits = (h & 0xffff) as u16;
        let bits = if bits & 0x7c00 == 0x7c00 { bits & !0x4000 } else { bits };
        f16::from_bits(bits)
    }

    /// Scales of the size real models have: 2^-12 .. 2^-4, either sign.
    fn model_f16(h: u64) -> f16 {
        let mag = (1.0 + (h & 0xff) as f32 / 256.0) * 2f32.powi(-12 + ((h >> 8) % 9) as i32);
        f16::from_f32(if h >> 20 & 1 == 1 { -mag } else { mag })
    }

    // Per-weight definitions of the three layouts, written from the block descriptions (not the
    // loop structure of ggml's dequantizers), with ggml's rounding: (d·sc)·q − dmin·m.
    fn q4_k_weight(b: &[u8], e: usize) -> f32 {
        let (s, l) = (e / 32, e % 32);
        let byte = b[Q4_K_QS + 32 * (s / 2) + l];
        let q = if s % 2 == 0 { byte & 0x0f } else { byte >> 4 };
        let (sc, m) = get_scale_min_k4(s, &b[Q4_K_SCALES..Q4_K_QS]);
        f16_at(b, Q4_K_D) * sc as f32 * q as f32 - f16_at(b, Q4_K_DMIN) * m as f32
    }

    fn q5_k_weight(b: &[u8], e: usize) -> f32 {
        let (s, l) = (e / 32, e % 32);
        let byte = b[Q5_K_QS + 32 * (s / 2) + l];
        let low = if s % 2 == 0 { byte & 0x0f } else { byte >> 4 };
        let q = low as u32 + 16 * ((b[Q5_K_QH + l] as u32 >> s) & 1);
        let (sc, m) = get_scale_min_k4(s, &b[Q5_K_SCALES..Q5_K_QH]);
        f16_at(b, Q5_K_D) * sc as f32 * q as f32 - f16_at(b, Q5_K_DMIN) * m as f32
    }

    fn q6_k_weight(b: &[u8], e: usize) -> f32 {
        // Halves of 128; in a half, quarter k of 32 weights takes nibble k / 2 of ql byte
        // 32·(k % 2) + l and bits 2k, 2k + 1 of qh byte l.
        let (n, k, l) = (e / 128, e % 128 / 32, e % 32);
        let nib = (b[Q6_K_QL + 64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0f;
        let top = (b[Q6_K_QH + 32 * n + l] >> (2 * k)) & 3;
        let q = (nib | (top << 4)) as i32 - 32;
        f16_at(b, Q6_K_D) * b[Q6_K_SCALES + e / 16] as i8 as f32 * q as f32
    }

    #[test]
    fn dequantize_matches_per_weight_formula_bit_for_bit() {
        let mut y = [0.0f32; QK_K];
        for seed in 0..500u64 {
            let b4: [u8; BLOCK_Q4_K_BYTES] = random_block(seed, &[Q4_K_D, Q4_K_DMIN], any_finite_f16);
            dequantize_block_q4_k(&b4, &mut y);
            for (e, v) in y.iter().enumerate() {
                assert_eq!(v.to_bits(), q4_k_weight(&b4, e).to_bits(), "q4_K seed {seed} weight {e}");
            }
            let b5: [u8; BLOCK_Q5_K_BYTES] = random_block(seed, &[Q5_K_D, Q5_K_DMIN], any_finite_f16);
            dequantize_block_q5_k(&b5, &mut y);
            for (e, v) in y.iter().enumerate() {
                assert_eq!(v.to_bits(), q5_k_weight(&b5, e).to_bits(), "q5_K seed {seed} weight {e}");
            }
            let b6: [u8; BLOCK_Q6_K_BYTES] = random_block(seed, &[Q6_K_D], any_finite_f16);
            dequantize_block_q6_k(&b6, &mut y);
            for (e, v) in y.iter().enumerate() {
                assert_eq!(v.to_bits(), q6_k_weight(&b6, e).to_bits(), "q6_K seed {seed} weight {e}");
            }
        }
    }

    #[test]
    fn rows_dequantize_block_after_block() {
        let blocks: Vec<[u8; BLOCK_Q6_K_BYTES]> = (0..3).map(|s| random_block(s, &[Q6_K_D], model_f16)).collect();
        let row: Vec<u8> = blocks.concat();
        let mut out = vec![0.0; 3 * QK_K];
        dequantize_row_q6_k(&row, &mut out);
        for (b, y) in blocks.iter().zip(out.chunks_exact(QK_K)) {
            let mut one = [0.0; QK_K];
            dequantize_block_q6_k(b, &mut one);
            assert_eq!(y, one);
        }
    }

    /// A row of `nb` super-blocks and its q8_1 activations (uniform in [-1, 1), quantized).
    fn dot_case<const N: usize>(seed: u64, nb: usize, f16s: &[usize]) -> (Vec<u8>, Vec<BlockQ8_1>) {
        let w: Vec<u8> = (0..nb as u64).flat_map(|i| random_block::<N>(seed * 1000 + i, f16s, model_f16)).collect();
        let x: Vec<f32> = (0..(nb * QK_K) as u64).map(|i| uniform_pm1(seed + 7, i)).collect();
        (w, quantize_row_q8_1(&x))
    }

    fn f64_dot(w: &[f32], x: &[f32]) -> (f64, f64) {
        w.iter().zip(x).fold((0.0, 0.0), |(s, a), (&w, &x)| (s + w as f64 * x as f64, a + (w as f64 * x as f64).abs()))
    }

    /// The block formula against the dequantize-then-f64 dot. Every dequantized weight and
    /// activation is exact in f32 up to one rounding of d·sc·q − dmin·m, and the formula rounds
    /// each of its ~20 f32 steps per super-block (plus one per super-block of the row sum), so it
    /// must agree within (24 + super-blocks)·2^-24 of the magnitude Σ(|d·sc·q| + |dmin·m|)·|x|.
    /// The two parts can cancel, so they are taken apart by zeroing each field of `split` in
    /// turn (dmin, then d); q6_K has no min and splits nothing.
    fn check_dot<const N: usize>(
        name: &str,
        f16s: &[usize],
        split: &[usize],
        dequantize: fn(&[u8], &mut [f32]),
        dot: fn(&[u8], &[BlockQ8_1]) -> f32,
    ) {
        let mut worst = 0.0f64;
        for seed in 0..40u64 {
            let nb = 1 + seed as usize % 8;
            let (w, xq) = dot_case::<N>(seed, nb, f16s);
            let x = dequantize_q8_1(&xq);
            let mut wd = vec![0.0; nb * QK_K];
            dequantize(&w, &mut wd);
            let (exact, mut magnitude) = f64_dot(&wd, &x);
            if !split.is_empty() {
                magnitude = 0.0;
            }
            for zeroed in split {
                let mut part = w.clone();
                for b in part.chunks_exact_mut(N) {
                    b[*zeroed..*zeroed + 2].fill(0);
                }
                dequantize(&part, &mut wd);
                magnitude += f64_dot(&wd, &x).1;
            }
            let got = dot(&w, &xq) as f64;
            let bound = (24 + nb) as f64 * 2f64.powi(-24) * magnitude;
            assert!((got - exact).abs() <= bound, "{name} seed {seed}: {got} vs {exact} (bound {bound})");
            worst = worst.max((got - exact).abs() / bound);
        }
        eprintln!("{name}: worst error {worst:.3} of the bound");
    }

    #[test]
    fn dots_match_dequantized_f64_dot() {
        let (q4, q5) = ([Q4_K_D, Q4_K_DMIN], [Q5_K_D, Q5_K_DMIN]);
        check_dot::<BLOCK_Q4_K_BYTES>("q4_K", &q4, &q4, dequantize_row_q4_k, dot_q4_k_q8_1);
        check_dot::<BLOCK_Q5_K_BYTES>("q5_K", &q5, &q5, dequantize_row_q5_k, dot_q5_k_q8_1);
        check_dot::<BLOCK_Q6_K_BYTES>("q6_K", &[Q6_K_D], &[], dequantize_row_q6_k, dot_q6_k_q8_1);
    }

    /// What the kernels' grouping and order cost against the twins, on the self-test's weight
    /// rows and activations at the model's widths: 64 outputs, relative to the largest (as the
    /// self-test measures). The ops' tolerance is 1e-4; this must stay two orders below.
    #[test]
    fn device_order_costs_little_against_the_twins() {
        use crate::quant::WeightType;
        use crate::testdata::{q8_1_row, weight_row};
        for wtype in WeightType::K_QUANTS {
            for k in [768usize, 2048, 4096] {
                for lanes in [1, 32] {
                    let (mut worst, mut scale) = (0f64, 0f64);
                    for row in 0..64u64 {
                        let w = weight_row(3, row, k, wtype);
                        let x = q8_1_row(4, row % 5, k / QK);
                        let twin = wtype.dot_q8_1(&w, &x) as f64;
                        worst = worst.max((device_order_dot(wtype, &w, &x, lanes) as f64 - twin).abs());
                        scale = scale.max(twin.abs());
                    }
                    eprintln!("{wtype} k={k} lanes={lanes}: {:.2e} of the largest output", worst / scale);
                    assert!(worst <= 1e-6 * scale, "{wtype} k={k} lanes={lanes}: {worst} vs {scale}");
                }
            }
        }
    }
}
