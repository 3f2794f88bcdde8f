//! Activation rows in the format ggml's CPU dot products take them (`vec_dot_type`): q8_0 for
//! q4_0/q8_0 weights, q8_K for the K-quants, f16/bf16 for f16/bf16 weights, f32 for f32.
//!
//! Rounding, as llama.cpp's CPU backend does it:
//! - **q8_0** (`quantize_row_q8_0`): d = amax / 127 stored as f16, q = x · id rounded half to
//!   even. The reference C (`quantize_row_q8_0_ref`) uses `roundf` (half away from zero) and
//!   id = 1 / d, but the SIMD versions llama.cpp actually runs differ from it: x86 AVX/AVX2
//!   (`_mm256_round_ps(_MM_ROUND_NEAREST)`, id = 127 / amax) and aarch64 NEON (`vcvtnq_s32_f32`,
//!   id = 1 / d) both round half to even, and disagree only on id by at most one ulp. We take
//!   half-to-even and x86's id = 127 / amax: the parity runs against llama.cpp on x86-64.
//! - **q8_K** (`quantize_row_q8_K_ref`, used on x86 and ARM alike): the element of largest
//!   magnitude (the first one on ties) sets iscale = −127 / max, q = nearest_int(iscale · x)
//!   (half to even: ggml adds 1.5·2^23), capped at 127, d = 1 / iscale kept as f32, and bsums =
//!   the sums of each 16 quants. An all-zero block has d = 0 and zero quants.
//! - **f16 / bf16**: round to nearest even (F16C `_mm256_cvtps_ph(x, 0)`, `GGML_FP32_TO_BF16`);
//!   we keep the rounded value as f32, exact, since the dots widen both sides to f32 anyway.

use half::f16;
use rayon::prelude::*;

/// Values per q8_0 block.
pub const QK8_0: usize = 32;
/// Values per q8_K block (and per K-quant super-block).
pub const QK_K: usize = 256;

/// Below this many values a batch of rows is quantized on the calling thread.
const PARALLEL_MIN_VALUES: usize = 1 << 15;

/// One q8_0 activation block; `d` is the f16 scale widened to f32 (exactly).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f32,
    pub qs: [i8; QK8_0],
}

/// One q8_K activation block (`block_q8_K`): f32 d, 256 quants, sums of each 16.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

/// The activation format a weight type is multiplied with (`type_traits_cpu[..].vec_dot_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VecDotType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q8K,
}

impl VecDotType {
    /// Values per block: a row's length must be a multiple of it.
    pub fn block_size(self) -> usize {
        match self {
            VecDotType::F32 | VecDotType::F16 | VecDotType::BF16 => 1,
            VecDotType::Q8_0 => QK8_0,
            VecDotType::Q8K => QK_K,
        }
    }
}

/// An f16 widened to f32, exactly (a NaN stays a NaN, its payload kept). Branch-free and
/// inline: the quantized dots widen a scale per block, the f16 dots every value, and a call or
/// a branch there stops LLVM from vectorising the loop around it.
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    // Exponent and mantissa moved under f32's: 2^(e−127)·1.m (or a subnormal); times 2^112 that
    // is 2^(e−15)·1.m exactly, the normals and subnormals of f16 alike.
    let shifted = ((bits & 0x7fff) as u32) << 13;
    let finite = f32::from_bits(shifted) * f32::from_bits(0x7780_0000); // 2^112
    let special = f32::from_bits(shifted | 0x7f80_0000); // inf, or NaN with the payload
    let magnitude = if bits & 0x7c00 == 0x7c00 { special } else { finite };
    f32::from_bits(magnitude.to_bits() | (((bits & 0x8000) as u32) << 16))
}

/// Round to nearest, ties to even: for |v| < 2^22 ggml's `nearest_int` trick (add and subtract
/// 1.5·2^23), since `f32::round_ties_even` is a libm call on x86-64 without SSE4.1.
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    if v.abs() < 4_194_304.0 { (v + MAGIC) - MAGIC } else { v.round_ties_even() }
}

/// `x` rounded to f16 (nearest, ties to even), as f32.
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `x` rounded to bf16 as `GGML_FP32_TO_BF16` does (nearest, ties to even; a NaN made quiet), as f32.
pub fn round_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    let top = if bits & 0x7fff_ffff > 0x7f80_0000 { (bits >> 16) | 64 } else { (bits + (0x7fff + ((bits >> 16) & 1))) >> 16 };
    f32::from_bits(top << 16)
}

/// Quantizes 32 values to q8_0 (x86 AVX2 arithmetic, see the module docs).
pub fn quantize_block_q8_0(x: &[f32; QK8_0]) -> BlockQ8_0 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    // `as i8` saturates like the AVX2 packs; |x · id| <= 127 up to rounding anyway.
    let qs = std::array::from_fn(|j| round_even(x[j] * id) as i8);
    BlockQ8_0 { d: round_f16(d), qs }
}

/// Quantizes 256 values to q8_K (`quantize_row_q8_K_ref`).
pub fn quantize_block_q8_k(x: &[f32; QK_K]) -> BlockQ8K {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        return BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
    }
    let iscale = -127.0 / max;
    let qs: [i8; QK_K] = std::array::from_fn(|j| (round_even(iscale * x[j]) as i32).min(127) as i8);
    let bsums = std::array::from_fn(|g| qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum());
    BlockQ8K { d: 1.0 / iscale, qs, bsums }
}

/// Quantizes a row (a whole number of blocks) into `out` (one block per 32 values).
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    let (blocks, rest) = x.as_chunks::<QK8_0>();
    assert!(rest.is_empty() && blocks.len() == out.len(), "q8_0 row of {} values into {} blocks", x.len(), out.len());
    for (o, b) in out.iter_mut().zip(blocks) {
        *o = quantize_block_q8_0(b);
    }
}

/// Quantizes a row (a whole number of blocks) into `out` (one block per 256 values).
pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    let (blocks, rest) = x.as_chunks::<QK_K>();
    assert!(rest.is_empty() && blocks.len() == out.len(), "q8_K row of {} values into {} blocks", x.len(), out.len());
    for (o, b) in out.iter_mut().zip(blocks) {
        *o = quantize_block_q8_k(b);
    }
}

/// One activation row in its vec_dot format.
#[derive(Clone, Copy, Debug)]
pub enum ActRow<'a> {
    /// f32, or f16/bf16 values already rounded and widened to f32.
    Float(&'a [f32]),
    Q8_0(&'a [BlockQ8_0]),
    Q8K(&'a [BlockQ8K]),
}

#[derive(Clone, Debug)]
enum ActData {
    Float(Vec<f32>),
    Q8_0(Vec<BlockQ8_0>),
    Q8K(Vec<BlockQ8K>),
}

/// Rows of activations converted once to one vec_dot format, so that several weight matrices of
/// the same format (q/k/v; gate/up; every expert a token is routed to) reuse one conversion, as
/// ggml converts `src1` once per matmul.
#[derive(Clone, Debug)]
pub struct QuantizedActs {
    kind: VecDotType,
    cols: usize,
    rows: usize,
    data: ActData,
}

impl QuantizedActs {
    /// Converts `rows` rows of `cols` values (`x.len() == rows * cols`) to `kind`.
    ///
    /// # Panics
    /// If the lengths disagree or `cols` is not a multiple of the format's block size: callers
    /// pass the `cols` of a checked [`super::WeightMatrix`].
    pub fn new(kind: VecDotType, x: &[f32], cols: usize, rows: usize) -> Self {
        assert_eq!(x.len(), rows * cols, "activations: {} values for {rows} rows of {cols}", x.len());
        assert!(cols > 0 && cols.is_multiple_of(kind.block_size()), "activations: rows of {cols} values for {kind:?} blocks");
        let serial = x.len() < PARALLEL_MIN_VALUES;
        let data = match kind {
            VecDotType::F32 => ActData::Float(x.to_vec()),
            VecDotType::F16 => ActData::Float(map_values(x, serial, round_f16)),
            VecDotType::BF16 => ActData::Float(map_values(x, serial, round_bf16)),
            VecDotType::Q8_0 => {
                let mut out = vec![BlockQ8_0 { d: 0.0, qs: [0; QK8_0] }; x.len() / QK8_0];
                quantize_rows(x, cols, &mut out, cols / QK8_0, serial, quantize_row_q8_0);
                ActData::Q8_0(out)
            }
            VecDotType::Q8K => {
                let mut out = vec![BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] }; x.len() / QK_K];
                quantize_rows(x, cols, &mut out, cols / QK_K, serial, quantize_row_q8_k);
                ActData::Q8K(out)
            }
        };
        QuantizedActs { kind, cols, rows, data }
    }

    pub fn kind(&self) -> VecDotType {
        self.kind
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Row `i` (panics past the end, like slice indexing).
    pub fn row(&self, i: usize) -> ActRow<'_> {
        assert!(i < self.rows, "activation row {i} of {}", self.rows);
        match &self.data {
            ActData::Float(v) => ActRow::Float(&v[i * self.cols..(i + 1) * self.cols]),
            ActData::Q8_0(v) => {
                let n = self.cols / QK8_0;
                ActRow::Q8_0(&v[i * n..(i + 1) * n])
            }
            ActData::Q8K(v) => {
                let n = self.cols / QK_K;
                ActRow::Q8K(&v[i * n..(i + 1) * n])
            }
        }
    }
}

fn map_values(x: &[f32], serial: bool, f: fn(f32) -> f32) -> Vec<f32> {
    if serial { x.iter().map(|&v| f(v)).collect() } else { x.par_iter().map(|&v| f(v)).collect() }
}

fn quantize_rows<B: Send>(x: &[f32], cols: usize, out: &mut [B], blocks_per_row: usize, serial: bool, f: fn(&[f32], &mut [B])) {
    if serial {
        x.chunks_exact(cols).zip(out.chunks_exact_mut(blocks_per_row)).for_each(|(x, o)| f(x, o));
    } else {
        x.par_chunks_exact(cols).zip(out.par_chunks_exact_mut(blocks_per_row)).for_each(|(x, o)| f(x, o));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_kernels::testdata::uniform_pm1;

    fn row(seed: u64, n: usize, scale: f32) -> Vec<f32> {
        (0..n as u64).map(|i| uniform_pm1(seed, i) * scale).collect()
    }

    #[test]
    fn q8_0_rounds_half_to_even_with_x86_scale() {
        // amax 127 gives id = 1 exactly, so x · id is x: the halves show the rounding.
        let mut x = [0.0f32; QK8_0];
        x[0] = 127.0;
        x[1..7].copy_from_slice(&[0.5, 1.5, 2.5, -0.5, -1.5, -2.5]);
        x[7] = 126.5;
        let b = quantize_block_q8_0(&x);
        assert_eq!(b.d, 1.0);
        assert_eq!(b.qs[..8], [127, 0, 2, 2, 0, -2, -2, 126]);
    }

    #[test]
    fn q8_0_matches_formula_and_bounds() {
        for seed in 0..200 {
            let x = row(seed, QK8_0, [1.0, 1e-3, 300.0][seed as usize % 3]);
            let b = quantize_block_q8_0(x.as_slice().try_into().unwrap());
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(b.d, f16::from_f32(amax / 127.0).to_f32());
            for (q, v) in b.qs.iter().zip(&x) {
                let exact = *v as f64 * 127.0 / amax as f64;
                // id = 127 / amax is rounded once and x · id once: |q − exact| <= 1/2 + 2·2^-24·127.
                assert!((*q as f64 - exact).abs() <= 0.5 + 1.6e-5, "seed {seed}: {q} for {exact}");
            }
            assert!(b.qs.iter().any(|&q| q.abs() == 127));
        }
        let zero = quantize_block_q8_0(&[0.0; QK8_0]);
        assert_eq!((zero.d, zero.qs), (0.0, [0; QK8_0]));
    }

    #[test]
    fn q8_k_follows_ggml_reference() {
        for seed in 0..100 {
            let mut x = row(seed, QK_K, 2.0);
            // Half the blocks have their largest magnitude positive: d comes out negative.
            if seed % 2 == 0 {
                x[17] = 3.0;
            } else {
                x[200] = -3.0;
            }
            let b = quantize_block_q8_k(x.as_slice().try_into().unwrap());
            let iscale = if seed % 2 == 0 { -127.0f32 / 3.0 } else { 127.0f32 / 3.0 };
            assert_eq!(b.d, 1.0 / iscale);
            for (j, (&q, &v)) in b.qs.iter().zip(&x).enumerate() {
                let p = iscale * v;
                assert!((q as f32 - p).abs() <= 0.5, "seed {seed} value {j}: {q} for {p}");
                if (p - p.trunc()).abs() == 0.5 {
                    assert_eq!(q as i32 % 2, 0, "half rounds to even");
                }
            }
            assert_eq!(b.qs[if seed % 2 == 0 { 17 } else { 200 }], -127);
            for g in 0..16 {
                assert_eq!(b.bsums[g], b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum::<i16>());
            }
        }
        let zero = quantize_block_q8_k(&[0.0; QK_K]);
        assert_eq!((zero.d, zero.qs, zero.bsums), (0.0, [0; QK_K], [0; 16]));
    }

    #[test]
    fn q8_k_first_largest_magnitude_wins_a_tie() {
        let mut x = [0.25f32; QK_K];
        x[3] = -2.0;
        x[9] = 2.0;
        let b = quantize_block_q8_k(&x);
        assert_eq!(b.d, 1.0 / (127.0f32 / 2.0));
        assert_eq!((b.qs[3], b.qs[9]), (-127, 127));
    }

    #[test]
    fn f16_widening_is_exact_for_every_value() {
        for bits in 0..=u16::MAX {
            let (ours, theirs) = (f16_to_f32(bits), f16::from_bits(bits).to_f32());
            assert!(ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()), "{bits:#06x}");
        }
    }

    #[test]
    fn round_even_is_round_ties_even() {
        for i in -2_000_000..2_000_000 {
            let v = i as f32 * 0.25;
            assert_eq!(round_even(v), v.round_ties_even(), "{v}");
        }
        for v in [4_194_303.5f32, -4_194_303.5, 4_194_304.5, 6_000_000.5, 1e9, -1e30, f32::INFINITY] {
            assert_eq!(round_even(v), v.round_ties_even(), "{v}");
        }
        assert!(round_even(f32::NAN).is_nan());
    }

    #[test]
    fn bf16_rounding_is_ggmls() {
        // 1 + 2^-8 is halfway between two bf16 values: ties to the even one (1.0); a hair above rounds up.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 1.0 + 2f32.powi(-7));
        assert_eq!(round_bf16(-3.0), -3.0);
        assert!(round_bf16(f32::from_bits(0x7f80_0001)).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn quantized_acts_rows_match_per_row_quantization() {
        let (cols, rows) = (512, 3);
        let x = row(9, cols * rows, 1.5);
        for kind in [VecDotType::F32, VecDotType::F16, VecDotType::BF16, VecDotType::Q8_0, VecDotType::Q8K] {
            let acts = QuantizedActs::new(kind, &x, cols, rows);
            assert_eq!((acts.kind(), acts.cols(), acts.rows()), (kind, cols, rows));
            for r in 0..rows {
                let xr = &x[r * cols..(r + 1) * cols];
                match acts.row(r) {
                    ActRow::Float(v) => {
                        let f: fn(f32) -> f32 = match kind {
                            VecDotType::F16 => round_f16,
                            VecDotType::BF16 => round_bf16,
                            _ => |v| v,
                        };
                        assert!(v.iter().zip(xr).all(|(a, b)| a.to_bits() == f(*b).to_bits()), "{kind:?}");
                    }
                    ActRow::Q8_0(b) => {
                        assert_eq!(b.len(), cols / QK8_0);
                        assert_eq!(b[1], quantize_block_q8_0(xr[QK8_0..2 * QK8_0].try_into().unwrap()));
                    }
                    ActRow::Q8K(b) => {
                        assert_eq!(b.len(), cols / QK_K);
                        assert_eq!(b[1], quantize_block_q8_k(xr[QK_K..].try_into().unwrap()));
                    }
                }
            }
        }
    }

    #[test]
    fn large_batches_quantize_the_same_in_parallel() {
        let cols = 2048;
        let x = row(4, cols * 20, 0.7);
        let acts = QuantizedActs::new(VecDotType::Q8_0, &x, cols, 20);
        let ActRow::Q8_0(last) = acts.row(19) else { unreachable!() };
        let mut expect = vec![BlockQ8_0 { d: 0.0, qs: [0; QK8_0] }; cols / QK8_0];
        quantize_row_q8_0(&x[19 * cols..], &mut expect);
        assert_eq!(last, expect.as_slice());
    }
}
