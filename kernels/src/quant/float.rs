//! Float tensor types (F32, F16, BF16): little-endian elements, one per "block".
//!
//! The conversions are ggml's: f16 widens exactly (a NaN comes back quiet, as ggml's CPU and
//! CUDA conversions and the `half` crate give it), bf16 is its 16 bits placed above 16 zero
//! bits (`ggml_compute_bf16_to_fp32`, NaN payloads untouched). Callers pass whole elements:
//! `out` takes one value per 2 (or 4) bytes and any surplus on either side is left alone.

use half::f16;

pub const F32_BYTES: usize = 4;
pub const F16_BYTES: usize = 2;
pub const BF16_BYTES: usize = 2;

pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

pub fn dequantize_f32_into(bytes: &[u8], out: &mut [f32]) {
    let (elements, _) = bytes.as_chunks::<F32_BYTES>();
    for (o, e) in out.iter_mut().zip(elements) {
        *o = f32::from_le_bytes(*e);
    }
}

pub fn dequantize_f16_into(bytes: &[u8], out: &mut [f32]) {
    let (elements, _) = bytes.as_chunks::<F16_BYTES>();
    for (o, e) in out.iter_mut().zip(elements) {
        *o = f16::from_le_bytes(*e).to_f32();
    }
}

pub fn dequantize_bf16_into(bytes: &[u8], out: &mut [f32]) {
    let (elements, _) = bytes.as_chunks::<BF16_BYTES>();
    for (o, e) in out.iter_mut().zip(elements) {
        *o = bf16_to_f32(u16::from_le_bytes(*e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_row(bits: &[u16]) -> Vec<f32> {
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let mut out = vec![f32::NAN; bits.len()];
        dequantize_f16_into(&bytes, &mut out);
        out
    }

    #[test]
    fn f16_known_values() {
        // 1, -2, the largest finite, the smallest subnormal (2^-24), -0, +inf.
        let x = f16_row(&[0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00]);
        assert_eq!(x[..4], [1.0, -2.0, 65504.0, 2f32.powi(-24)]);
        assert_eq!(x[4].to_bits(), 0x8000_0000);
        assert_eq!(x[5], f32::INFINITY);
    }

    #[test]
    fn f16_nan_comes_back_quiet_with_its_payload() {
        // A signalling f16 NaN (quiet bit 0x0200 clear), payload 0x0155.
        let x = f16_row(&[0x7D55]);
        assert_eq!(x[0].to_bits(), 0x7F80_0000 | 0x0040_0000 | (0x0155 << 13));
    }

    #[test]
    fn bf16_known_values_and_untouched_nan() {
        let bits: [u16; 4] = [0x3F80, 0x4049, 0xFF80, 0x7F81];
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let mut out = [0.0; 4];
        dequantize_bf16_into(&bytes, &mut out);
        assert_eq!(out[..3], [1.0, 3.140625, f32::NEG_INFINITY]);
        // A signalling NaN stays signalling: ggml shifts, it does not convert.
        assert_eq!(out[3].to_bits(), 0x7F81_0000);
    }

    #[test]
    fn f32_is_little_endian() {
        let mut bytes = 1.5f32.to_le_bytes().to_vec();
        bytes.extend((-0.25f32).to_le_bytes());
        let mut out = [0.0; 2];
        dequantize_f32_into(&bytes, &mut out);
        assert_eq!(out, [1.5, -0.25]);
    }
}
