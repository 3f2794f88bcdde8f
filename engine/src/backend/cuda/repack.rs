//! MXFP4 blocks rewritten as Q8_0 blocks on the host, exactly: the layout MXFP4 experts take
//! while the device has room for twice their bytes (`weights::Mxfp4`; the Q8_0 kernels ran them
//! faster than the native MXFP4 ones on an H100, perf-notes entry 16). Every MXFP4 value the
//! models hold is a Q8_0 value too.
//!
//! An MXFP4 value is `KVALUES[code] · 2^(e − 128)` ([`mxfp4`]), an integer of at most 12 in
//! magnitude times a power of two; a Q8_0 value is `f16(d) · q` with `q` an int8. So a block
//! becomes `q = v · 2^s`, `d = 2^(e − 128 − s)` for the smallest shift `s ≥ 0` that brings
//! `d` within f16's powers of two (2^-24, its least subnormal, to 2^15) while every `|q|` stays
//! at most 127; common factors of two in the codes are first moved into `d` (values all even
//! reach one exponent lower). Both dequantizers then compute the same exact f32 product, bit
//! for bit (+0 for codes 0 and 8 alike). An all-zero block becomes `d = 0` whatever its
//! exponent. A block no shift fits (values below 2^-24, or above 127 · 2^15) is refused,
//! never rounded.

use std::fmt;

use brink_kernels::quant::mxfp4::{BLOCK_MXFP4_BYTES, KVALUES};
use brink_kernels::quant::{BLOCK_Q8_0_BYTES, QK};
use rayon::prelude::*;

/// Why a tensor's MXFP4 bytes could not be repacked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RepackError {
    /// Not a whole number of blocks.
    Length { bytes: usize },
    /// The first block (in file order) whose values no Q8_0 block holds exactly.
    Inexact { block: u64, exponent: u8 },
}

impl fmt::Display for RepackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RepackError::Length { bytes } => {
                write!(f, "{bytes} bytes of mxfp4 are not a whole number of {BLOCK_MXFP4_BYTES}-byte blocks")
            }
            RepackError::Inexact { block, exponent } => write!(
                f,
                "mxfp4 block {block} (exponent byte {exponent}, scale 2^{}) has values no q8_0 block holds exactly \
                 (an f16 power-of-two scale 2^-24..2^15 times an int8); refusing to round them",
                exponent as i32 - 128
            ),
        }
    }
}

/// Blocks repacked per parallel task.
const CHUNK_BLOCKS: usize = 1 << 14;

/// The Q8_0 bytes holding exactly the values of the MXFP4 `bytes` (whole blocks, any number of
/// rows: blocks never straddle rows), twice their size (34 bytes per 32 values, not 17).
pub(crate) fn mxfp4_to_q8_0(bytes: &[u8]) -> Result<Vec<u8>, RepackError> {
    let (blocks, rest) = bytes.as_chunks::<BLOCK_MXFP4_BYTES>();
    if !rest.is_empty() {
        return Err(RepackError::Length { bytes: bytes.len() });
    }
    let mut out = vec![0u8; blocks.len() * BLOCK_Q8_0_BYTES];
    let (q8, _) = out.as_chunks_mut::<BLOCK_Q8_0_BYTES>();
    // Collected in order, so that the error names the first bad block whatever the threads do.
    let results: Vec<Result<(), RepackError>> = blocks
        .par_chunks(CHUNK_BLOCKS)
        .zip(q8.par_chunks_mut(CHUNK_BLOCKS))
        .enumerate()
        .map(|(c, (src, dst))| {
            for (i, (b, o)) in src.iter().zip(dst).enumerate() {
                repack_block(b, o).ok_or(RepackError::Inexact { block: (c * CHUNK_BLOCKS + i) as u64, exponent: b[0] })?;
            }
            Ok(())
        })
        .collect();
    results.into_iter().collect::<Result<(), _>>()?;
    Ok(out)
}

/// One block, or `None` if no Q8_0 block holds its values exactly.
fn repack_block(b: &[u8; BLOCK_MXFP4_BYTES], out: &mut [u8; BLOCK_Q8_0_BYTES]) -> Option<()> {
    // Value j < 16 is the low nibble of byte j, value 16 + j its high nibble.
    let v: [i16; QK] = std::array::from_fn(|j| {
        let byte = b[1 + j % (QK / 2)];
        KVALUES[(if j < QK / 2 { byte & 0x0f } else { byte >> 4 }) as usize] as i16
    });
    let bits = v.iter().fold(0u16, |a, &x| a | x.unsigned_abs());
    if bits == 0 {
        out.fill(0);
        return Some(());
    }
    // Values are (v >> tz) · 2^m, with |v >> tz| <= max.
    let tz = bits.trailing_zeros() as i32;
    let max = v.iter().map(|x| x.unsigned_abs()).max()? >> tz;
    let m = b[0] as i32 - 128 + tz;
    let s = (m - 15).max(0);
    if s > (127 / max).ilog2() as i32 || m - s < -24 {
        return None;
    }
    out[..2].copy_from_slice(&f16_pow2(m - s).to_le_bytes());
    for (q, &x) in out[2..].iter_mut().zip(&v) {
        *q = (((x >> tz) << s) as i8) as u8;
    }
    Some(())
}

/// The f16 bits of 2^k, k in -24..=15 (subnormal below -14).
fn f16_pow2(k: i32) -> u16 {
    debug_assert!((-24..=15).contains(&k));
    if k >= -14 { ((k + 15) as u16) << 10 } else { 1 << (k + 24) }
}

#[cfg(test)]
mod tests {
    use brink_kernels::quant::TensorType;
    use brink_kernels::quant::mxfp4::e8m0_to_f32_half;

    use super::*;

    /// A block of exponent `e` and codes `codes` (value order).
    fn block(e: u8, codes: [u8; QK]) -> Vec<u8> {
        let mut b = vec![e];
        b.extend((0..QK / 2).map(|j| codes[j] | codes[j + QK / 2] << 4));
        b
    }

    /// Deterministic codes: a splitmix-style hash of (seed, j).
    fn codes(seed: u64) -> [u8; QK] {
        std::array::from_fn(|j| {
            let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (j as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 31)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z >> 59) as u8 & 0x0f
        })
    }

    fn dequant(tt: TensorType, bytes: &[u8]) -> Vec<u32> {
        let mut out = vec![f32::NAN; tt.value_count(bytes.len()).unwrap()];
        tt.dequantize_into(bytes, &mut out).unwrap();
        out.iter().map(|x| x.to_bits()).collect()
    }

    /// Both dequantizers give the same f32 bits for `mx`, repacked.
    fn assert_exact(mx: &[u8]) {
        let q8 = mxfp4_to_q8_0(mx).unwrap();
        assert_eq!(q8.len(), mx.len() / BLOCK_MXFP4_BYTES * BLOCK_Q8_0_BYTES);
        assert_eq!(dequant(TensorType::Q8_0, &q8), dequant(TensorType::MXFP4, mx));
    }

    #[test]
    fn random_blocks_repack_bit_for_bit() {
        // Every exponent where any block fits, whatever its codes (2^-24 .. 2^15 as the scale,
        // 2^16 .. 2^18 through the shift), several blocks each, as one tensor.
        let mx: Vec<u8> = (104..=146u8).flat_map(|e| (0..8).flat_map(move |s| block(e, codes(e as u64 * 8 + s)))).collect();
        assert_exact(&mx);
        // And the code table itself: code j at value j, at the scale 1.
        assert_exact(&block(128, std::array::from_fn(|j| (j % 16) as u8)));
    }

    #[test]
    fn the_shift_carries_the_top_exponents() {
        // e − 128 = 16..18: q = kvalue · 2^(e − 143), d = 2^15, so 12 · 2^18 is 96 · 2^15.
        for e in 144..=146u8 {
            let mx = block(e, std::array::from_fn(|j| [7, 15, 1, 9, 8][j % 5]));
            assert_exact(&mx);
            let q8 = mxfp4_to_q8_0(&mx).unwrap();
            assert_eq!(u16::from_le_bytes([q8[0], q8[1]]), 0x7800, "d = 2^15");
            assert_eq!(q8[2] as i8, 12 << (e - 143));
            assert_eq!(q8[3] as i8, -(12 << (e - 143)));
            assert_eq!(q8[6] as i8, 0, "code 8 (−0) is 0");
            assert_eq!(f32::from_bits(dequant(TensorType::Q8_0, &q8)[0]), 12.0 * e8m0_to_f32_half(e));
        }
        // Small codes reach higher still: 1 · 2^21 is 64 · 2^15.
        assert_exact(&block(149, std::array::from_fn(|j| [1, 9][j % 2])));
        // Even codes reach lower: 2 · 2^-25 is 1 · 2^-24, the least f16 subnormal.
        let low = block(103, std::array::from_fn(|j| [2, 0, 10][j % 3]));
        assert_exact(&low);
        let q8 = mxfp4_to_q8_0(&low).unwrap();
        assert_eq!(u16::from_le_bytes([q8[0], q8[1]]), 0x0001, "d = 2^-24");
    }

    #[test]
    fn zero_blocks_repack_to_zero_at_any_exponent() {
        for e in [0u8, 1, 50, 128, 200, 255] {
            // Codes 0 and 8 are +0 and −0; both dequantize to +0.
            let mx = block(e, std::array::from_fn(|j| if j % 2 == 0 { 0 } else { 8 }));
            let q8 = mxfp4_to_q8_0(&mx).unwrap();
            assert_eq!(q8, vec![0u8; BLOCK_Q8_0_BYTES], "e = {e}");
            assert_eq!(dequant(TensorType::Q8_0, &q8), dequant(TensorType::MXFP4, &mx), "e = {e}");
        }
    }

    #[test]
    fn blocks_out_of_range_are_refused_naming_block_and_exponent() {
        let ok = block(128, codes(1));
        for (e, code) in [(147u8, 7u8), (150, 1), (102, 1), (103, 3), (0, 1), (255, 15)] {
            let mut mx = [ok.clone(), ok.clone(), ok.clone()].concat();
            let mut c = [0u8; QK];
            c[31] = code;
            mx.extend(block(e, c));
            mx.extend(block(255, c)); // a later bad block: the first is named
            let err = mxfp4_to_q8_0(&mx).unwrap_err();
            assert_eq!(err, RepackError::Inexact { block: 3, exponent: e }, "e = {e}, code {code}");
            let msg = err.to_string();
            assert!(msg.contains("block 3") && msg.contains(&format!("exponent byte {e}")), "{msg}");
        }
    }

    #[test]
    fn a_partial_block_is_an_error() {
        let mut mx = block(128, codes(2));
        mx.push(0);
        assert_eq!(mxfp4_to_q8_0(&mx), Err(RepackError::Length { bytes: 18 }));
        assert!(mxfp4_to_q8_0(&mx[..16]).unwrap_err().to_string().contains("16 bytes"));
        assert_eq!(mxfp4_to_q8_0(&[]), Ok(vec![]));
    }

    #[test]
    fn errors_are_found_across_parallel_chunks() {
        // A bad block in the second chunk is named by its index in the tensor.
        let good = block(128, codes(3));
        let mut mx: Vec<u8> = (0..CHUNK_BLOCKS + 5).flat_map(|_| good.iter().copied()).collect();
        let bad = (CHUNK_BLOCKS + 2) * BLOCK_MXFP4_BYTES;
        mx[bad..bad + BLOCK_MXFP4_BYTES].copy_from_slice(&block(160, codes(4)));
        assert_eq!(mxfp4_to_q8_0(&mx), Err(RepackError::Inexact { block: CHUNK_BLOCKS as u64 + 2, exponent: 160 }));
    }
}
