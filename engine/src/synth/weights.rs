//! Random tensor data drawn directly in each type's block format (not floats quantized
//! afterwards): every block gets its own scale, sub-block scales and mins where the type has them,
//! and uniformly random quants, so the bytes exercise every field a dequantizer or dot product
//! reads. Values are zero-mean with a requested standard deviation (within a few percent; the
//! per-block scales vary around it by design).
//!
//! Block layouts are ggml's (see `brink_kernels::quant` and `kquants`); the tests decode the
//! blocks with those dequantizers.

use brink_kernels::quant::TensorType;
use brink_kernels::quant::kquants::{
    BLOCK_Q4_K_BYTES, BLOCK_Q5_K_BYTES, BLOCK_Q6_K_BYTES, K_SCALE_SIZE, Q4_K_DMIN, Q4_K_QS, Q4_K_SCALES, Q5_K_QH, Q5_K_QS, Q6_K_D, Q6_K_QH,
    Q6_K_SCALES,
};
use brink_kernels::quant::mxfp4::BLOCK_MXFP4_BYTES;
use brink_kernels::quant::{BLOCK_Q4_0_BYTES, BLOCK_Q8_0_BYTES};
use half::{bf16, f16};

use super::rng::Rng;

/// Every block's scale is the tensor's scale times a factor uniform in [0.5, 1.5): E[factor²] is
/// 13/12, which the base scales divide out.
const JITTER_RMS: f32 = 1.040_833; // sqrt(13 / 12)

fn jitter(rng: &mut Rng) -> f32 {
    0.5 + rng.unit()
}

/// Standard deviations of the integer quants as drawn below (centred where the type has mins).
/// q8_0: uniform in -127..=127.
const Q8_0_Q_STD: f32 = 73.611; // sqrt((255² − 1) / 12)
/// q4_0: a nibble uniform in 0..16 with 0 moved to 8, so q − 8 is symmetric in -7..=7.
const Q4_0_Q_STD: f32 = 4.183; // sqrt(2 · (1² + … + 7²) / 16)
/// q4_K: a nibble uniform in 0..16, centred by the min at 7.5.
const Q4_K_Q_STD: f32 = 4.610; // sqrt((16² − 1) / 12)
/// q5_K: five bits uniform in 0..32, centred at 15.5.
const Q5_K_Q_STD: f32 = 9.233; // sqrt((32² − 1) / 12)
/// q6_K: six bits uniform in 0..64, minus 32.
const Q6_K_Q_STD: f32 = 18.473; // sqrt((64² − 1) / 12)

/// Six-bit sub-block scales of q4_K/q5_K are drawn in this range (their RMS divides out).
const K_SC_MIN: u32 = 32;
const K_SC_MAX: u32 = 63;
const K_SC_RMS: f32 = 48.384; // sqrt(47.5² + (32² − 1) / 12)
/// q6_K's signed eight-bit scales: a random sign and a magnitude in this range.
const Q6_SC_MIN: u32 = 64;
const Q6_SC_MAX: u32 = 127;
const Q6_SC_RMS: f32 = 97.267; // sqrt(95.5² + (64² − 1) / 12)

/// The types [`fill_weights`] generates (a scheme names no other).
pub const FILLABLE: [TensorType; 9] = [
    TensorType::F32,
    TensorType::F16,
    TensorType::BF16,
    TensorType::Q8_0,
    TensorType::Q4_0,
    TensorType::Q4_K,
    TensorType::Q5_K,
    TensorType::Q6_K,
    TensorType::MXFP4,
];

/// Fills `out` (a whole number of `ty` blocks, `ty` one of [`FILLABLE`]) with zero-mean values
/// of standard deviation `std`.
pub fn fill_weights(ty: TensorType, std: f32, rng: &mut Rng, out: &mut [u8]) {
    debug_assert!(out.len().is_multiple_of(ty.block_bytes()), "{ty}: {} bytes", out.len());
    // Uniform in [-a, a) has standard deviation a / sqrt(3).
    let half_width = std * 3f32.sqrt();
    match ty {
        TensorType::F32 => fill_floats::<4>(out, || (rng.symmetric() * half_width).to_le_bytes()),
        TensorType::F16 => fill_floats::<2>(out, || f16::from_f32(rng.symmetric() * half_width).to_le_bytes()),
        TensorType::BF16 => fill_floats::<2>(out, || bf16::from_f32(rng.symmetric() * half_width).to_le_bytes()),
        TensorType::Q8_0 => out.chunks_exact_mut(BLOCK_Q8_0_BYTES).for_each(|b| q8_0_block(b, std, rng)),
        TensorType::Q4_0 => out.chunks_exact_mut(BLOCK_Q4_0_BYTES).for_each(|b| q4_0_block(b, std, rng)),
        TensorType::Q4_K => out.chunks_exact_mut(BLOCK_Q4_K_BYTES).for_each(|b| q4_k_block(b, std, rng)),
        TensorType::Q5_K => out.chunks_exact_mut(BLOCK_Q5_K_BYTES).for_each(|b| q5_k_block(b, std, rng)),
        TensorType::Q6_K => out.chunks_exact_mut(BLOCK_Q6_K_BYTES).for_each(|b| q6_k_block(b, std, rng)),
        TensorType::MXFP4 => out.chunks_exact_mut(BLOCK_MXFP4_BYTES).for_each(|b| mxfp4_block(b, std, rng)),
        other => unreachable!("{other} is not FILLABLE: schemes are parsed against it"),
    }
}

/// Fills `out` (f32 bytes) with values uniform in `center ± spread`: norm weights.
pub fn fill_around(center: f32, spread: f32, rng: &mut Rng, out: &mut [u8]) {
    fill_floats::<4>(out, || (center + rng.symmetric() * spread).to_le_bytes());
}

fn fill_floats<const N: usize>(out: &mut [u8], mut value: impl FnMut() -> [u8; N]) {
    for c in out.chunks_exact_mut(N) {
        c.copy_from_slice(&value());
    }
}

fn random_bytes(rng: &mut Rng, out: &mut [u8]) {
    for c in out.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
}

fn put_f16(b: &mut [u8], at: usize, v: f32) -> f32 {
    let h = f16::from_f32(v);
    b[at..at + 2].copy_from_slice(&h.to_le_bytes());
    h.to_f32()
}

/// `block_q8_0`: d, then 32 quants uniform in -127..=127.
fn q8_0_block(b: &mut [u8], std: f32, rng: &mut Rng) {
    put_f16(b, 0, std / (Q8_0_Q_STD * JITTER_RMS) * jitter(rng));
    random_bytes(rng, &mut b[2..]);
    for q in &mut b[2..] {
        // 0..=255 onto -127..=127, symmetric (both ends get one byte value fewer than the middle).
        *q = (((u32::from(*q) * 255) >> 8) as i32 - 127) as i8 as u8;
    }
}

/// `block_q4_0`: d, then 32 nibbles; a zero nibble (−8, which has no +8 twin) becomes 8 (0).
fn q4_0_block(b: &mut [u8], std: f32, rng: &mut Rng) {
    put_f16(b, 0, std / (Q4_0_Q_STD * JITTER_RMS) * jitter(rng));
    random_bytes(rng, &mut b[2..]);
    for q in &mut b[2..] {
        let (mut lo, mut hi) = (*q & 0x0f, *q >> 4);
        if lo == 0 {
            lo = 8;
        }
        if hi == 0 {
            hi = 8;
        }
        *q = lo | (hi << 4);
    }
}

/// RMS of MXFP4's code values (`KVALUES`, doubled): sqrt(2 · (1 + 4 + 9 + 16 + 36 + 64 + 144) / 16).
const MXFP4_Q_RMS: f32 = 5.852;

/// `block_mxfp4`: an E8M0 exponent, then 32 random codes. The scale is a power of two: a block
/// takes the one just below `t = std / MXFP4_Q_RMS` or twice it, the lower with the probability
/// that makes the mean square scale t², so the values' spread is `std` on average.
fn mxfp4_block(b: &mut [u8], std: f32, rng: &mut Rng) {
    let t = std / MXFP4_Q_RMS;
    let below = t.log2().floor();
    let lo = below.exp2();
    // p·lo² + (1 − p)·(2·lo)² = t², with lo <= t < 2·lo, so p is in (0, 1].
    let p_lo = (4.0 * lo * lo - t * t) / (3.0 * lo * lo);
    // e8m0_to_f32_half(e) = 2^(e - 128) multiplies the code values (twice the E2M1 values).
    let e = 128.0 + below + if rng.unit() < p_lo { 0.0 } else { 1.0 };
    b[0] = e.clamp(1.0, 254.0) as u8;
    random_bytes(rng, &mut b[1..]);
}

/// Packs eight six-bit scales and mins into ggml's 12 bytes (the inverse of `get_scale_min_k4`):
/// sub-blocks 0..4 in the low six bits of bytes j (scale) and j + 4 (min); sub-blocks 4..8 as
/// nibbles in byte j + 4 with their top two bits in the spare top bits of bytes j − 4 and j.
fn pack_scales_mins(sc: &[u8; 8], m: &[u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut out = [0u8; K_SCALE_SIZE];
    for j in 0..4 {
        out[j] = sc[j] & 63;
        out[j + 4] = m[j] & 63;
    }
    for j in 4..8 {
        out[j + 4] = (sc[j] & 0x0f) | ((m[j] & 0x0f) << 4);
        out[j - 4] |= (sc[j] >> 4) << 6;
        out[j] |= (m[j] >> 4) << 6;
    }
    out
}

/// The header shared by q4_K and q5_K: d, dmin and the packed scales and mins. Each sub-block's
/// min (dmin·m) is set to `center`·d·sc, the middle of its quants' range, so values are centred
/// on 0 (x = d·sc·q − dmin·m).
fn k_header(b: &mut [u8], std: f32, q_std: f32, center: f32, rng: &mut Rng) {
    let d = put_f16(b, 0, std / (q_std * K_SC_RMS * JITTER_RMS) * jitter(rng));
    // dmin = ceil(center + 0.5)·d (8·d for q4_K, 16·d for q5_K, exact in f16) keeps
    // m = center·sc·d / dmin within six bits for every scale up to 63.
    let dmin_over_d = (center + 0.5).ceil();
    put_f16(b, Q4_K_DMIN, d * dmin_over_d);
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        sc[j] = rng.range(K_SC_MIN, K_SC_MAX) as u8;
        m[j] = (center * f32::from(sc[j]) / dmin_over_d).round() as u8;
    }
    b[Q4_K_SCALES..Q4_K_SCALES + K_SCALE_SIZE].copy_from_slice(&pack_scales_mins(&sc, &m));
}

/// `block_q4_K`: d, dmin, scales and mins, 256 nibbles.
fn q4_k_block(b: &mut [u8], std: f32, rng: &mut Rng) {
    k_header(b, std, Q4_K_Q_STD, 7.5, rng);
    random_bytes(rng, &mut b[Q4_K_QS..]);
}

/// `block_q5_K`: as q4_K plus a fifth bit per weight in qh.
fn q5_k_block(b: &mut [u8], std: f32, rng: &mut Rng) {
    k_header(b, std, Q5_K_Q_STD, 15.5, rng);
    random_bytes(rng, &mut b[Q5_K_QH..Q5_K_QS]);
    random_bytes(rng, &mut b[Q5_K_QS..]);
}

/// `block_q6_K`: 256 six-bit quants (ql, qh), sixteen signed scales, d last.
fn q6_k_block(b: &mut [u8], std: f32, rng: &mut Rng) {
    random_bytes(rng, &mut b[..Q6_K_SCALES]);
    debug_assert_eq!(Q6_K_QH, 128);
    for s in &mut b[Q6_K_SCALES..Q6_K_D] {
        let magnitude = rng.range(Q6_SC_MIN, Q6_SC_MAX) as i8;
        *s = if rng.next_u64() & 1 == 0 { magnitude } else { -magnitude } as u8;
    }
    put_f16(b, Q6_K_D, std / (Q6_K_Q_STD * Q6_SC_RMS * JITTER_RMS) * jitter(rng));
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_kernels::quant::kquants::get_scale_min_k4;

    #[test]
    fn scale_packing_inverts_get_scale_min_k4() {
        let mut rng = Rng::new(3);
        for _ in 0..200 {
            let sc: [u8; 8] = std::array::from_fn(|_| rng.range(0, 63) as u8);
            let m: [u8; 8] = std::array::from_fn(|_| rng.range(0, 63) as u8);
            let packed = pack_scales_mins(&sc, &m);
            for j in 0..8 {
                assert_eq!(get_scale_min_k4(j, &packed), (sc[j], m[j]), "sub-block {j}");
            }
        }
    }
}
