//! GGUF block formats used by the kernels, and their CPU twins.
//!
//! Layouts match ggml exactly (`block_q8_0`, `block_q4_0`, `block_q8_1`): 32 weights per block,
//! an f16 scale first. The dot products below are the CPU references of the GPU dot products:
//! the same integer sums, the same f16 scales, the same formula per block.
//!
//! The tensor types are one table keyed by ggml's id ([`types`]); [`TensorType`] is its rows the
//! engine computes: the float types ([`float`]), q4_0 and q8_0 (here), the K-quant
//! super-blocks ([`kquants`]) and mxfp4 ([`mxfp4`]: 32 values, an E8M0 exponent), with
//! length-checked dequantization (multi-threaded for whole tensors) and the dot products with
//! q8_1 rows.

pub mod float;
pub mod kquants;
pub mod mxfp4;
pub mod types;

use half::f16;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

pub use types::GgmlType;
use types::{Compute, Keep, TypeRow};

/// Weights per quantization block.
pub const QK: usize = 32;

/// Weight formats the routed path and the dense projections take: the table's weight rows
/// ([`types::TYPES`]), the 32-wide blocks (legacy q8_0/q4_0 and mxfp4) and the 256-wide K-quant
/// super-blocks (`kquants`). Every kernel taking a `WeightType` dots a weight row with q8_1 activation rows
/// in 32-wide blocks; a K-quant super-block meets 8 consecutive q8_1 blocks.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightType(GgmlType);

const fn weight_types<const N: usize>(ts: [GgmlType; N]) -> [WeightType; N] {
    let mut out = [WeightType(GgmlType::Q8_0); N];
    let mut i = 0;
    while i < N {
        out[i] = WeightType(ts[i]);
        i += 1;
    }
    out
}

const WEIGHTS: Keep = Keep::Weights { block_size: None };
const LEGACY: Keep = Keep::Legacy;
const K_QUANTS: Keep = Keep::Weights { block_size: Some(kquants::QK_K) };

impl WeightType {
    pub const Q8_0: WeightType = WeightType(GgmlType::Q8_0);
    pub const Q4_0: WeightType = WeightType(GgmlType::Q4_0);
    pub const Q4K: WeightType = WeightType(GgmlType::Q4_K);
    pub const Q5K: WeightType = WeightType(GgmlType::Q5_K);
    pub const Q6K: WeightType = WeightType(GgmlType::Q6_K);
    pub const MXFP4: WeightType = WeightType(GgmlType::MXFP4);

    /// Every weight format, by ggml id.
    pub const ALL: [WeightType; types::count(WEIGHTS)] = weight_types(types::select(WEIGHTS));
    /// ggml's "legacy" quants, q8_0 and q4_0: 32 values and an f16 scale a block. The routed
    /// GEMM's routings, the latent projection and the big counts run these (their index
    /// arithmetic is every format's).
    pub const LEGACY: [WeightType; types::count(LEGACY)] = weight_types(types::select(LEGACY));
    /// The 256-wide super-block formats.
    pub const K_QUANTS: [WeightType; types::count(K_QUANTS)] = weight_types(types::select(K_QUANTS));

    /// The weight format of a ggml type, if the kernels take it.
    pub fn of(ty: GgmlType) -> Option<WeightType> {
        matches!(ty.row().compute, Compute::Weight { .. }).then_some(WeightType(ty))
    }

    pub fn ggml(self) -> GgmlType {
        self.0
    }

    fn row(self) -> &'static TypeRow {
        self.0.row()
    }

    pub fn block_bytes(self) -> usize {
        self.row().block_bytes
    }

    /// Weights per block: 32, or 256 for the K-quants. A row's width must be a multiple of it.
    pub fn block_size(self) -> usize {
        self.row().block_size
    }

    pub fn is_k_quant(self) -> bool {
        self.block_size() == kquants::QK_K
    }

    /// One of [`Self::LEGACY`] (q8_0, q4_0).
    pub fn is_legacy(self) -> bool {
        Self::LEGACY.contains(&self)
    }

    /// The `WTYPE_*` constant the kernels take to select the weight format: the ggml id (the
    /// `#define`s are generated from the same table, [`types::cuda_header`]).
    pub fn code(self) -> i32 {
        self.row().id as i32
    }

    /// ggml's name (`q4_K`, not `q4_k`).
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// Blocks in one row of `k` weights (`k` a multiple of [`Self::block_size`]).
    pub fn blocks_per_row(self, k: usize) -> usize {
        k / self.block_size()
    }

    /// Bytes of one row of `k` weights (`k` a multiple of [`Self::block_size`]).
    pub fn row_bytes(self, k: usize) -> usize {
        self.blocks_per_row(k) * self.block_bytes()
    }

    /// Why a row of `k` weights of this type cannot be taken, if it cannot (plans turn this
    /// into a typed error naming the kernel and the shape).
    pub fn check_row_width(self, k: u64) -> Option<String> {
        let b = self.block_size() as u64;
        (k == 0 || !k.is_multiple_of(b) || k > i32::MAX as u64)
            .then(|| format!("K = {k} must be a positive multiple of {b} ({self} blocks) below 2^31"))
    }

    /// Dot product of one quantized weight row with one q8_1 activation row: the CPU twin of
    /// the kernels' block formulas (for the K-quants, ggml-cuda's `vec_dot_q{4,5,6}_K_q8_1`).
    /// Whole blocks only; callers hold matching lengths.
    pub fn dot_q8_1(self, w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
        match self.row().compute {
            Compute::Weight { dot, .. } => dot(w_row, x),
            Compute::Float { .. } | Compute::ReadOnly => unreachable!("a WeightType is a weight row of the table"),
        }
    }

    /// Dequantizes one row of weights to f32 (whole blocks).
    pub fn dequantize_row(self, w_row: &[u8]) -> Vec<f32> {
        let mut out = vec![0.0; w_row.len() / self.block_bytes() * self.block_size()];
        TensorType::from(self).dequantize_blocks(w_row, &mut out);
        out
    }
}

impl std::fmt::Display for WeightType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Debug for WeightType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for WeightType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for WeightType {
    /// ggml's names, in any case.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        WeightType::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(&name)).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown weight type {name:?}: expected one of {}",
                names(&WeightType::ALL.map(WeightType::ggml))
            ))
        })
    }
}

/// `a, b, c` of the types' names.
fn names(ts: &[GgmlType]) -> String {
    ts.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
}

/// `block_q8_0`: f16 d, 32 x i8. x = d * q.
pub const BLOCK_Q8_0_BYTES: usize = 2 + QK;
/// `block_q4_0`: f16 d, 16 bytes of nibbles; element j < 16 is the low nibble of byte j,
/// element j >= 16 the high nibble of byte j - 16. x = d * (q - 8).
pub const BLOCK_Q4_0_BYTES: usize = 2 + QK / 2;
/// `block_q8_1` (activations): f16 d, f16 s = d * sum(q), 32 x i8.
pub const BLOCK_Q8_1_BYTES: usize = 4 + QK;

/// Bytes of `rows` q8_1 rows of `width` values (a multiple of [`QK`]).
pub fn q8_1_bytes(rows: u64, width: u32) -> u64 {
    rows * (width as u64 / QK as u64) * BLOCK_Q8_1_BYTES as u64
}

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
    f16_bits_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// The f32 of the f16 with these bits, exactly `f16::from_bits(bits).to_f32()`: a table holding
/// that conversion of every bit pattern, read without the CPU feature check each `to_f32` call
/// makes. The dots below convert two or three scales per 32 weights, millions of times a case.
#[inline]
pub(crate) fn f16_bits_to_f32(bits: u16) -> f32 {
    static TABLE: std::sync::LazyLock<Box<[f32]>> =
        std::sync::LazyLock::new(|| (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect());
    TABLE[bits as usize]
}

/// `f16_bits_to_f32` of an f16 value.
#[inline]
pub(crate) fn f16_to_f32(x: f16) -> f32 {
    f16_bits_to_f32(x.to_bits())
}

pub fn dequantize_q8_0(row: &[u8]) -> Vec<f32> {
    let mut out = vec![0.0; row.len() / BLOCK_Q8_0_BYTES * QK];
    dequantize_q8_0_into(row, &mut out);
    out
}

/// Dequantizes the whole blocks of `row` into `out` (as many as both hold).
pub fn dequantize_q8_0_into(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(BLOCK_Q8_0_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[2..]) {
            *y = d * (q as i8) as f32;
        }
    }
}

pub fn dequantize_q4_0(row: &[u8]) -> Vec<f32> {
    let mut out = vec![0.0; row.len() / BLOCK_Q4_0_BYTES * QK];
    dequantize_q4_0_into(row, &mut out);
    out
}

/// Dequantizes the whole blocks of `row` into `out` (as many as both hold).
pub fn dequantize_q4_0_into(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(BLOCK_Q4_0_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        let (lo, hi) = y.split_at_mut(QK / 2);
        for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(&b[2..]) {
            *lo = d * ((q & 0x0f) as i32 - 8) as f32;
            *hi = d * ((q >> 4) as i32 - 8) as f32;
        }
    }
}

pub fn dequantize_q8_1(x: &[BlockQ8_1]) -> Vec<f32> {
    x.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d.to_f32() * q as f32)).collect()
}

/// Σ_blocks d_w · d_x · Σ q_w q_x, the formula of the `dot_q8_0_q8_1` device function.
pub fn dot_q8_0_q8_1(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
    let mut acc = 0.0f32;
    for (b, xb) in w_row.as_chunks::<BLOCK_Q8_0_BYTES>().0.iter().zip(x) {
        let qs: &[u8; QK] = b[2..].try_into().expect("a q8_0 block holds 32 quants");
        let mut isum = 0i32;
        for (&w, &q) in qs.iter().zip(&xb.qs) {
            isum += (w as i8) as i32 * q as i32;
        }
        acc += f16_at(b, 0) * f16_to_f32(xb.d) * isum as f32;
    }
    acc
}

/// Σ_blocks d_w · (d_x · Σ q_w q_x − 8 s_x) with q_w in 0..15, the formula of the
/// `dot_q4_0_q8_1` device function (the −8 offset folded into the activation sum).
pub fn dot_q4_0_q8_1(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
    let mut acc = 0.0f32;
    for (b, xb) in w_row.as_chunks::<BLOCK_Q4_0_BYTES>().0.iter().zip(x) {
        let qs: &[u8; QK / 2] = b[2..].try_into().expect("a q4_0 block holds 16 quant bytes");
        let (lo, hi) = xb.qs.split_at(QK / 2);
        let mut isum = 0i32;
        for ((&q, &l), &h) in qs.iter().zip(lo).zip(hi) {
            isum += (q & 0x0f) as i32 * l as i32;
            isum += (q >> 4) as i32 * h as i32;
        }
        acc += f16_at(b, 0) * (f16_to_f32(xb.d) * isum as f32 - 8.0 * f16_to_f32(xb.s));
    }
    acc
}

/// Every tensor type the engine computes, as GGUF stores it: the table's rows with a CPU
/// dequantization ([`types::TYPES`]). The constants keep ggml's spelling (`Q4_K`), the one every
/// GGUF tool prints.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorType(GgmlType);

const fn tensor_types<const N: usize>(ts: [GgmlType; N]) -> [TensorType; N] {
    let mut out = [TensorType(GgmlType::F32); N];
    let mut i = 0;
    while i < N {
        out[i] = TensorType(ts[i]);
        i += 1;
    }
    out
}

/// Bad lengths or types given to the dequantizers and dot products: the bytes come from model
/// files, so every mismatch is an error naming the type and the numbers, never a panic.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    #[error("tensor type {name} (ggml type {id}) is not supported: brink computes {}", names(&TensorType::ALL.map(TensorType::ggml)))]
    UnsupportedType { id: u32, name: &'static str },
    #[error("unknown tensor type {0:?}: expected one of {known}", known = names(&TensorType::ALL.map(TensorType::ggml)))]
    UnknownName(String),
    #[error("{ty}: {bytes} bytes are not a whole number of {block_bytes}-byte blocks")]
    PartialBlock { ty: TensorType, bytes: usize, block_bytes: usize },
    #[error("{ty}: {values} values are not a whole number of {block_size}-value blocks")]
    PartialValues { ty: TensorType, values: u64, block_size: usize },
    #[error("{ty}: {values} values do not make whole rows of {row_len}")]
    PartialRow { ty: TensorType, values: usize, row_len: usize },
    #[error("{ty}: {values} values take more than 2^64 bytes")]
    TooLarge { ty: TensorType, values: u64 },
    #[error("{ty}: the bytes hold {values} values but the output has room for {out}")]
    OutputLength { ty: TensorType, values: usize, out: usize },
    #[error("{0} weights have no q8_1 dot product: the kernels' weight formats are {known}", known = names(&WeightType::ALL.map(WeightType::ggml)))]
    NoQ8_1Dot(TensorType),
    #[error("{ty}: a weight row of {weights} values against {activations} q8_1 activation values")]
    DotLength { ty: TensorType, weights: usize, activations: usize },
}

/// Below this many values a tensor is dequantized on the calling thread: splitting it would
/// cost more than it saves.
const PARALLEL_MIN_VALUES: usize = 1 << 16;

#[allow(non_upper_case_globals)]
impl TensorType {
    pub const F32: TensorType = TensorType(GgmlType::F32);
    pub const F16: TensorType = TensorType(GgmlType::F16);
    pub const BF16: TensorType = TensorType(GgmlType::BF16);
    pub const Q4_0: TensorType = TensorType(GgmlType::Q4_0);
    pub const Q8_0: TensorType = TensorType(GgmlType::Q8_0);
    pub const Q4_K: TensorType = TensorType(GgmlType::Q4_K);
    pub const Q5_K: TensorType = TensorType(GgmlType::Q5_K);
    pub const Q6_K: TensorType = TensorType(GgmlType::Q6_K);
    pub const MXFP4: TensorType = TensorType(GgmlType::MXFP4);

    /// Every computed type, by ggml id.
    pub const ALL: [TensorType; types::count(Keep::Computed)] = tensor_types(types::select(Keep::Computed));

    /// The computed type of a ggml type, if brink computes with it.
    pub fn of(ty: GgmlType) -> Option<TensorType> {
        (!matches!(ty.row().compute, Compute::ReadOnly)).then_some(TensorType(ty))
    }

    pub fn ggml(self) -> GgmlType {
        self.0
    }

    fn row(self) -> &'static TypeRow {
        self.0.row()
    }

    /// The `ggml_type` id a GGUF tensor info carries.
    pub fn ggml_id(self) -> u32 {
        self.row().id
    }

    pub fn from_ggml_id(id: u32) -> Result<TensorType, QuantError> {
        let ty = GgmlType::from_id(id);
        ty.and_then(TensorType::of).ok_or(QuantError::UnsupportedType { id, name: ty.map_or("unknown", GgmlType::name) })
    }

    /// ggml's name of the type (`q4_K`, not `q4_k`).
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// Values per block (1 for the float types).
    pub fn block_size(self) -> usize {
        self.row().block_size
    }

    pub fn block_bytes(self) -> usize {
        self.row().block_bytes
    }

    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// The kernels' weight format for this type: every quantized type; the float types are not
    /// dotted with q8_1 activations.
    pub fn weight_type(self) -> Option<WeightType> {
        WeightType::of(self.0)
    }

    /// Bytes of `values` values (a whole number of blocks), without overflow: sizes come from
    /// tensor shapes in model files.
    pub fn byte_size(self, values: u64) -> Result<u64, QuantError> {
        let block_size = self.block_size();
        if !values.is_multiple_of(block_size as u64) {
            return Err(QuantError::PartialValues { ty: self, values, block_size });
        }
        (values / block_size as u64).checked_mul(self.block_bytes() as u64).ok_or(QuantError::TooLarge { ty: self, values })
    }

    /// Values held by `bytes` (a whole number of blocks).
    pub fn value_count(self, bytes: usize) -> Result<usize, QuantError> {
        let block_bytes = self.block_bytes();
        if !bytes.is_multiple_of(block_bytes) {
            return Err(QuantError::PartialBlock { ty: self, bytes, block_bytes });
        }
        (bytes / block_bytes).checked_mul(self.block_size()).ok_or(QuantError::TooLarge { ty: self, values: u64::MAX })
    }

    pub fn dequantize_row(self, bytes: &[u8]) -> Result<Vec<f32>, QuantError> {
        let mut out = vec![0.0; self.value_count(bytes.len())?];
        self.dequantize_blocks(bytes, &mut out);
        Ok(out)
    }

    /// Dequantizes `bytes` into `out`, which must hold exactly their values.
    pub fn dequantize_into(self, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
        self.check_output(bytes, out)?;
        self.dequantize_blocks(bytes, out);
        Ok(())
    }

    /// Dequantizes a tensor of rows of `row_len` values into `out`, on rayon's threads when it
    /// is large (whole rows per task, so each task stays within its rows' blocks).
    pub fn dequantize_rows(self, bytes: &[u8], row_len: usize, out: &mut [f32]) -> Result<(), QuantError> {
        let values = self.check_output(bytes, out)?;
        let block_size = self.block_size();
        if row_len == 0 || !row_len.is_multiple_of(block_size) {
            return Err(QuantError::PartialValues { ty: self, values: row_len as u64, block_size });
        }
        if !values.is_multiple_of(row_len) {
            return Err(QuantError::PartialRow { ty: self, values, row_len });
        }
        if values <= PARALLEL_MIN_VALUES {
            self.dequantize_blocks(bytes, out);
            return Ok(());
        }
        let rows_per_task = (PARALLEL_MIN_VALUES / row_len).max(1);
        let task_bytes = rows_per_task * (row_len / block_size) * self.block_bytes();
        out.par_chunks_mut(rows_per_task * row_len).zip(bytes.par_chunks(task_bytes)).for_each(|(o, b)| self.dequantize_blocks(b, o));
        Ok(())
    }

    /// Dot product of one weight row with one q8_1 activation row: the CPU twin of the GPU's
    /// per-type block formula. Quantized types only.
    pub fn dot_q8_1(self, w_row: &[u8], x: &[BlockQ8_1]) -> Result<f32, QuantError> {
        let Compute::Weight { dot, .. } = self.row().compute else { return Err(QuantError::NoQ8_1Dot(self)) };
        let weights = self.value_count(w_row.len())?;
        if weights != x.len() * QK {
            return Err(QuantError::DotLength { ty: self, weights, activations: x.len() * QK });
        }
        Ok(dot(w_row, x))
    }

    fn check_output(self, bytes: &[u8], out: &[f32]) -> Result<usize, QuantError> {
        let values = self.value_count(bytes.len())?;
        if values != out.len() {
            return Err(QuantError::OutputLength { ty: self, values, out: out.len() });
        }
        Ok(values)
    }

    /// The whole blocks of `bytes` into `out` (lengths already checked).
    fn dequantize_blocks(self, bytes: &[u8], out: &mut [f32]) {
        match self.row().compute {
            Compute::Float { dequantize } | Compute::Weight { dequantize, .. } => dequantize(bytes, out),
            Compute::ReadOnly => unreachable!("a TensorType is a computed row of the table"),
        }
    }
}

impl From<WeightType> for TensorType {
    fn from(w: WeightType) -> Self {
        TensorType(w.ggml())
    }
}

impl std::str::FromStr for TensorType {
    type Err = QuantError;

    /// ggml's names, in any case (`q4_K`, `Q4_K`, `q4_k`).
    fn from_str(s: &str) -> Result<Self, QuantError> {
        Self::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s)).ok_or_else(|| QuantError::UnknownName(s.to_string()))
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Debug for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for TensorType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for TensorType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dots as they were written before their loops ran over fixed arrays and their scales
    /// through the conversion table: the plain formulas, per element, with half's `to_f32`.
    mod plain {
        use super::super::kquants::*;
        use super::super::*;

        pub type Dot = fn(&[u8], &[BlockQ8_1]) -> f32;

        /// Every weight type with its plain formula.
        pub const FORMULAS: [(WeightType, Dot); 6] = [
            (WeightType::Q8_0, q8_0),
            (WeightType::Q4_0, q4_0),
            (WeightType::Q4K, q4_k),
            (WeightType::Q5K, q5_k),
            (WeightType::Q6K, q6_k),
            (WeightType::MXFP4, mxfp4),
        ];

        fn f16_at(b: &[u8], at: usize) -> f32 {
            f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
        }

        pub fn q8_0(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
            let mut acc = 0.0f32;
            for (b, xb) in w_row.chunks_exact(BLOCK_Q8_0_BYTES).zip(x) {
                let isum: i32 = b[2..].iter().zip(&xb.qs).map(|(&w, &q)| (w as i8) as i32 * q as i32).sum();
                acc += f16_at(b, 0) * xb.d.to_f32() * isum as f32;
            }
            acc
        }

        pub fn q4_0(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
            let mut acc = 0.0f32;
            for (b, xb) in w_row.chunks_exact(BLOCK_Q4_0_BYTES).zip(x) {
                let mut isum = 0i32;
                for (j, &q) in b[2..].iter().enumerate() {
                    isum += (q & 0x0f) as i32 * xb.qs[j] as i32;
                    isum += (q >> 4) as i32 * xb.qs[j + QK / 2] as i32;
                }
                acc += f16_at(b, 0) * (xb.d.to_f32() * isum as f32 - 8.0 * xb.s.to_f32());
            }
            acc
        }

        pub fn mxfp4(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
            use super::super::mxfp4::{KVALUES, e8m0_to_f32_half};
            let mut acc = 0.0f32;
            for (b, xb) in w_row.chunks_exact(1 + QK / 2).zip(x) {
                let code = |l: usize| (b[1 + l % 16] >> (4 * (l / 16))) & 0x0f;
                let isum: i32 = (0..QK).map(|l| KVALUES[code(l) as usize] as i32 * xb.qs[l] as i32).sum();
                acc += e8m0_to_f32_half(b[0]) * xb.d.to_f32() * isum as f32;
            }
            acc
        }

        fn nibble(qs: &[u8], s: usize, l: usize) -> i32 {
            ((qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0f) as i32
        }

        fn scaled_min(b: &[u8], x: &[BlockQ8_1], quant: impl Fn(usize, usize) -> i32) -> f32 {
            let (d, dmin, scales) = (f16_at(b, Q4_K_D), f16_at(b, Q4_K_DMIN), &b[Q4_K_SCALES..Q4_K_SCALES + K_SCALE_SIZE]);
            let (mut sumf_d, mut sumf_m) = (0.0f32, 0.0f32);
            for (s, xs) in x.iter().enumerate() {
                let (sc, m) = get_scale_min_k4(s, scales);
                let dot: i32 = xs.qs.iter().enumerate().map(|(l, &u)| quant(s, l) * u as i32).sum();
                let d8 = xs.d.to_f32();
                sumf_d += d8 * (dot * sc as i32) as f32;
                sumf_m += d8 * (xs.qs.iter().map(|&q| q as i32).sum::<i32>() * m as i32) as f32;
            }
            d * sumf_d - dmin * sumf_m
        }

        fn q6_k_quant(b: &[u8], e: usize) -> i32 {
            let (n, quarter, l) = (e / 128, e % 128 / 32, e % 32);
            let low = (b[Q6_K_QL + 64 * n + 32 * (quarter % 2) + l] >> (4 * (quarter / 2))) & 0x0f;
            let high = (b[Q6_K_QH + 32 * n + l] >> (2 * quarter)) & 3;
            (low | (high << 4)) as i32 - 32
        }

        fn super_blocks(w_row: &[u8], bytes: usize, x: &[BlockQ8_1], f: impl Fn(&[u8], &[BlockQ8_1]) -> f32) -> f32 {
            w_row.chunks_exact(bytes).zip(x.chunks_exact(Q8_1_PER_SUPER_BLOCK)).map(|(b, x)| f(b, x)).sum()
        }

        pub fn q4_k(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
            super_blocks(w_row, BLOCK_Q4_K_BYTES, x, |b, x| scaled_min(b, x, |s, l| nibble(&b[Q4_K_QS..], s, l)))
        }

        pub fn q5_k(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
            super_blocks(w_row, BLOCK_Q5_K_BYTES, x, |b, x| {
                let (qh, qs) = (&b[Q5_K_QH..Q5_K_QS], &b[Q5_K_QS..]);
                scaled_min(b, x, |s, l| nibble(qs, s, l) | ((((qh[l] >> s) & 1) as i32) << 4))
            })
        }

        pub fn q6_k(w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
            super_blocks(w_row, BLOCK_Q6_K_BYTES, x, |b, x| {
                let mut sumf = 0.0f32;
                for g in 0..QK_K / 16 {
                    let xs = &x[g / 2];
                    let half = 16 * (g % 2);
                    let dot: i32 = (0..16).map(|t| q6_k_quant(b, 16 * g + t) * xs.qs[half + t] as i32).sum();
                    sumf += xs.d.to_f32() * (dot * b[Q6_K_SCALES + g] as i8 as i32) as f32;
                }
                f16_at(b, Q6_K_D) * sumf
            })
        }
    }

    /// The dots' speed against the plain formulas (`-- --ignored --nocapture dot_speed`).
    #[test]
    #[ignore = "a bench"]
    fn dot_speed() {
        use crate::testdata::{q8_1_row, weight_row};
        let plain = plain::FORMULAS;
        let k = 2048;
        let x = q8_1_row(1, 0, k / QK);
        for (wtype, formula) in plain {
            let rows: Vec<Vec<u8>> = (0..512).map(|r| weight_row(2, r, k, wtype)).collect();
            let time = |f: &dyn Fn(&[u8], &[BlockQ8_1]) -> f32| {
                let t = std::time::Instant::now();
                let mut acc = 0.0f32;
                for _ in 0..8 {
                    acc += rows.iter().map(|r| f(r, &x)).sum::<f32>();
                }
                (t.elapsed().as_secs_f64() * 1e9 / (8.0 * 512.0 * k as f64), acc)
            };
            let (new, a) = time(&|w, x| wtype.dot_q8_1(w, x));
            let (old, b) = time(&|w, x| formula(w, x));
            eprintln!("{wtype}: {new:.2} ns/weight (plain {old:.2}) {}", a == b);
        }
    }

    /// The table's conversion is half's, for every bit pattern (NaNs keep their payload).
    #[test]
    fn f16_table_is_halfs_conversion() {
        for bits in 0..=u16::MAX {
            assert_eq!(f16_bits_to_f32(bits).to_bits(), f16::from_bits(bits).to_f32().to_bits(), "{bits:#06x}");
        }
    }

    /// Every weight type's dot equals the plain formula bit for bit: on the self-test's generated
    /// rows and on rows of random bytes (any scale, subnormal, infinite or NaN).
    #[test]
    fn dots_equal_the_plain_formulas_bit_for_bit() {
        use crate::testdata::{hash2, q8_1_row, weight_row};
        let plain = plain::FORMULAS;
        assert_eq!(plain.len(), WeightType::ALL.len(), "a weight type without a plain formula here");
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for (wtype, formula) in plain {
            let k = 1024;
            for seed in 0..24u64 {
                let x = q8_1_row(seed + 100, seed, k / QK);
                let generated = weight_row(seed, seed * 7, k, wtype);
                let random: Vec<u8> = (0..generated.len() as u64).map(|i| hash2(seed + 1000, i) as u8).collect();
                let mut x_random = x.clone();
                for (i, b) in x_random.iter_mut().enumerate() {
                    b.d = f16::from_bits(hash2(seed + 2000, i as u64) as u16);
                    b.s = f16::from_bits(hash2(seed + 3000, i as u64) as u16);
                }
                for (w, x) in [(&generated, &x), (&random, &x), (&random, &x_random)] {
                    let (got, want) = (wtype.dot_q8_1(w, x), formula(w, x));
                    assert!(same(got, want), "{wtype} seed {seed}: {got} vs {want}");
                }
            }
        }
    }

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

#[cfg(test)]
mod tensor_type_tests {
    use super::*;
    use crate::testdata::hash2;

    #[test]
    fn ids_and_sizes_are_ggmls() {
        // (type, ggml id, values per block, bytes per block) from ggml.h and ggml-common.h.
        let table = [
            (TensorType::F32, 0, 1, 4),
            (TensorType::F16, 1, 1, 2),
            (TensorType::BF16, 30, 1, 2),
            (TensorType::Q4_0, 2, 32, 18),
            (TensorType::Q8_0, 8, 32, 34),
            (TensorType::Q4_K, 12, 256, 144),
            (TensorType::Q5_K, 13, 256, 176),
            (TensorType::Q6_K, 14, 256, 210),
            (TensorType::MXFP4, 39, 32, 17),
        ];
        for (t, id, block_size, block_bytes) in table {
            assert_eq!((t.ggml_id(), t.block_size(), t.block_bytes()), (id, block_size, block_bytes), "{t}");
            assert_eq!(TensorType::from_ggml_id(id), Ok(t));
            assert_eq!(t.name().parse::<TensorType>(), Ok(t));
            assert_eq!(t.name().to_uppercase().parse::<TensorType>(), Ok(t));
            assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{}\"", t.name()));
        }
        assert_eq!(serde_json::from_str::<TensorType>("\"q6_k\"").unwrap(), TensorType::Q6_K);
    }

    #[test]
    fn unsupported_types_are_named() {
        let e = TensorType::from_ggml_id(3).unwrap_err();
        assert_eq!(e, QuantError::UnsupportedType { id: 3, name: "q4_1" });
        assert!(e.to_string().contains("q4_1 (ggml type 3) is not supported"), "{e}");
        assert_eq!(TensorType::from_ggml_id(4), Err(QuantError::UnsupportedType { id: 4, name: "unknown" }));
        assert!(matches!("q3_K".parse::<TensorType>(), Err(QuantError::UnknownName(n)) if n == "q3_K"));
    }

    #[test]
    fn sizes_are_checked_not_overflowed() {
        assert_eq!(TensorType::Q4_K.byte_size(512), Ok(288));
        assert_eq!(TensorType::BF16.byte_size(3), Ok(6));
        assert_eq!(TensorType::Q8_0.byte_size(48), Err(QuantError::PartialValues { ty: TensorType::Q8_0, values: 48, block_size: 32 }));
        assert_eq!(TensorType::F32.byte_size(u64::MAX / 2), Err(QuantError::TooLarge { ty: TensorType::F32, values: u64::MAX / 2 }));
        assert_eq!(TensorType::Q6_K.value_count(420), Ok(512));
        assert_eq!(TensorType::Q6_K.value_count(421), Err(QuantError::PartialBlock { ty: TensorType::Q6_K, bytes: 421, block_bytes: 210 }));
    }

    #[test]
    fn bad_lengths_are_errors() {
        let t = TensorType::Q5_K;
        assert_eq!(t.dequantize_row(&[0; 177]), Err(QuantError::PartialBlock { ty: t, bytes: 177, block_bytes: 176 }));
        let mut out = vec![0.0; 255];
        assert_eq!(t.dequantize_into(&[0; 176], &mut out), Err(QuantError::OutputLength { ty: t, values: 256, out: 255 }));
        let mut out = vec![0.0; 768];
        assert_eq!(t.dequantize_rows(&[0; 528], 128, &mut out), Err(QuantError::PartialValues { ty: t, values: 128, block_size: 256 }));
        assert_eq!(t.dequantize_rows(&[0; 528], 512, &mut out), Err(QuantError::PartialRow { ty: t, values: 768, row_len: 512 }));
        assert!(t.dequantize_rows(&[0; 528], 0, &mut out).is_err());
        let x = vec![quantize_block_q8_1(&[0.5; QK]); 7];
        assert_eq!(t.dot_q8_1(&[0; 176], &x), Err(QuantError::DotLength { ty: t, weights: 256, activations: 224 }));
        assert_eq!(TensorType::F16.dot_q8_1(&[0; 64], &x[..1]), Err(QuantError::NoQ8_1Dot(TensorType::F16)));
        assert_eq!(
            TensorType::MXFP4.dot_q8_1(&[0; 17], &x[..2]),
            Err(QuantError::DotLength { ty: TensorType::MXFP4, weights: 32, activations: 64 })
        );
    }

    fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
        (0..n as u64).map(|i| hash2(seed, i) as u8).collect()
    }

    #[test]
    fn q8_0_and_q4_0_go_through_the_existing_twins() {
        let w8 = random_bytes(1, 4 * BLOCK_Q8_0_BYTES);
        let w4 = random_bytes(2, 4 * BLOCK_Q4_0_BYTES);
        assert_eq!(TensorType::Q8_0.dequantize_row(&w8).unwrap(), WeightType::Q8_0.dequantize_row(&w8));
        assert_eq!(TensorType::Q4_0.dequantize_row(&w4).unwrap(), WeightType::Q4_0.dequantize_row(&w4));
        let x = quantize_row_q8_1(&(0..128).map(|i| (i as f32 - 60.0) / 64.0).collect::<Vec<_>>());
        assert_eq!(TensorType::Q8_0.dot_q8_1(&w8, &x), Ok(dot_q8_0_q8_1(&w8, &x)));
        assert_eq!(TensorType::Q4_0.dot_q8_1(&w4, &x), Ok(dot_q4_0_q8_1(&w4, &x)));
        assert_eq!(TensorType::from(WeightType::Q4_0).weight_type(), Some(WeightType::Q4_0));
    }

    /// A tensor big enough to be split between threads dequantizes to exactly what one pass
    /// over all its bytes gives (the row split must not shift a block).
    #[test]
    fn parallel_rows_equal_one_serial_pass() {
        for t in TensorType::ALL {
            let row_len = 3 * 256;
            let rows = 200; // 153,600 values: over the parallel threshold, rows not a power of two
            let bytes = random_bytes(t.ggml_id() as u64, t.byte_size((rows * row_len) as u64).unwrap() as usize);
            let serial = t.dequantize_row(&bytes).unwrap();
            let mut parallel = vec![f32::NAN; rows * row_len];
            t.dequantize_rows(&bytes, row_len, &mut parallel).unwrap();
            // Bits, not values: random scales include NaNs, and NaN != NaN.
            let same = serial.iter().zip(&parallel).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{t}: the parallel dequantization differs from the serial one");
        }
    }
}

/// The kernels' view of the weight formats, repeated on the CPU: `common.cuh`'s `wq_int` and
/// `wq_scale` transcribed line by line (little-endian int loads, shifts, masks, `__vsubss4`)
/// must rebuild every weight of every format exactly as the dequantizers do, and the `WTYPE_*`
/// codes must be the Rust ones.
#[cfg(test)]
mod device_view_tests {
    use super::*;
    use crate::testdata::weight_row;

    fn int_at(b: &[u8], at: usize) -> i32 {
        i32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// `__vsubss4(a, b)`: per-byte saturating signed subtraction.
    fn vsubss4(a: i32, b: i32) -> i32 {
        let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
        i32::from_le_bytes(std::array::from_fn(|i| (a[i] as i8).saturating_sub(b[i] as i8) as u8))
    }

    /// `__byte_perm(x, y, s)`: byte m of the result is byte `s >> 4m & 7` of the 8 bytes x, y.
    fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
        let pool = (u64::from(y) << 32) | u64::from(x);
        (0..4).map(|m| ((pool >> (8 * ((s >> (4 * m)) & 7))) & 0xff) << (8 * m)).fold(0u64, |a, v| a | v) as u32
    }

    /// `mxfp4_ints(w, i)`: the values of the low and the high nibbles of qs[4i .. 4i + 4].
    fn mxfp4_ints(qs: &[u8], i: usize) -> (i32, i32) {
        let q = u32::from_le_bytes([qs[4 * i], qs[4 * i + 1], qs[4 * i + 2], qs[4 * i + 3]]);
        let sel = 0x3210_3210 | ((q & 0x8888_8888) >> 1);
        let tmp: [u32; 2] = std::array::from_fn(|h| {
            let shift = 16 * h;
            let lo = byte_perm(0x0302_0100, 0x0c08_0604, q >> shift);
            let hi = byte_perm(0xfdfe_ff00, 0xf4f8_fafc, q >> shift);
            byte_perm(lo, hi, sel >> shift)
        });
        (byte_perm(tmp[0], tmp[1], 0x6420) as i32, byte_perm(tmp[0], tmp[1], 0x7531) as i32)
    }

    /// `wq_int<WT>(row, b, j)`.
    fn wq_int(t: WeightType, row: &[u8], b: usize, j: usize) -> i32 {
        let s = b & 7;
        let blk = &row[if t.is_k_quant() { b >> 3 } else { b } * t.block_bytes()..];
        match t {
            WeightType::Q8_0 => int_at(blk, 2 + 4 * j),
            WeightType::Q4_0 => (int_at(blk, 2 + 4 * (j & 3)) >> (4 * (j >> 2))) & 0x0f0f0f0f,
            WeightType::Q4K => (int_at(blk, kquants::Q4_K_QS + 32 * (s >> 1) + 4 * j) >> (4 * (s & 1))) & 0x0f0f0f0f,
            WeightType::Q5K => {
                let lo = (int_at(blk, kquants::Q5_K_QS + 32 * (s >> 1) + 4 * j) >> (4 * (s & 1))) & 0x0f0f0f0f;
                lo | (((int_at(blk, kquants::Q5_K_QH + 4 * j) >> s) & 0x01010101) << 4)
            }
            WeightType::Q6K => {
                let (h, q) = (s >> 2, s & 3);
                let lo = (int_at(blk, kquants::Q6_K_QL + 64 * h + 32 * (q & 1) + 4 * j) >> (4 * (q >> 1))) & 0x0f0f0f0f;
                let hi = ((int_at(blk, kquants::Q6_K_QH + 32 * h + 4 * j) >> (2 * q)) & 0x03030303) << 4;
                vsubss4(lo | hi, 0x20202020)
            }
            WeightType::MXFP4 => {
                let (lo, hi) = mxfp4_ints(&blk[1..], j & 3);
                if j < 4 { lo } else { hi }
            }
            other => panic!("no unpack of {other} here"),
        }
    }

    /// `wq_scale<WT>(row, b)`: (d, dmin, sc, m).
    fn wq_scale(t: WeightType, row: &[u8], b: usize) -> (f32, f32, i32, i32) {
        let blk = &row[if t.is_k_quant() { b >> 3 } else { b } * t.block_bytes()..];
        match t {
            WeightType::Q8_0 | WeightType::Q4_0 => (f16_at(blk, 0), 0.0, 0, 0),
            WeightType::Q4K | WeightType::Q5K => {
                let (sc, m) = kquants::get_scale_min_k4(b & 7, &blk[kquants::Q4_K_SCALES..kquants::Q4_K_QS]);
                (f16_at(blk, kquants::Q4_K_D), f16_at(blk, kquants::Q4_K_DMIN), sc as i32, m as i32)
            }
            WeightType::Q6K => {
                let sc = |g: usize| blk[kquants::Q6_K_SCALES + g] as i8 as i32;
                (f16_at(blk, kquants::Q6_K_D), 0.0, sc(2 * (b & 7)), sc(2 * (b & 7) + 1))
            }
            WeightType::MXFP4 => {
                // `__int_as_float(e < 2 ? 0x00200000 << e : (e - 1) << 23)`
                let e = blk[0] as u32;
                (f32::from_bits(if e < 2 { 0x0020_0000 << e } else { (e - 1) << 23 }), 0.0, 0, 0)
            }
            other => panic!("no scales of {other} here"),
        }
    }

    /// Weight `l` (0..32) of 32-wide block b from the device's view, rounded as the
    /// dequantizers round it.
    fn weight(t: WeightType, row: &[u8], b: usize, l: usize) -> f32 {
        let q = wq_int(t, row, b, l / 4).to_le_bytes()[l % 4] as i8 as f32;
        let (d, dmin, sc, m) = wq_scale(t, row, b);
        match t {
            WeightType::Q8_0 | WeightType::MXFP4 => d * q,
            WeightType::Q4_0 => d * (q - 8.0),
            WeightType::Q4K | WeightType::Q5K => d * sc as f32 * q - dmin * m as f32,
            WeightType::Q6K => d * (if l < 16 { sc } else { m }) as f32 * q,
            other => panic!("no formula of {other} here"),
        }
    }

    #[test]
    fn unpacking_rebuilds_every_weight_of_every_format() {
        for t in WeightType::ALL {
            let k = 4 * t.block_size();
            for r in 0..20 {
                let row = weight_row(0x5eed, r, k, t);
                let want = t.dequantize_row(&row);
                for (e, w) in want.iter().enumerate() {
                    let got = weight(t, &row, e / QK, e % QK);
                    assert_eq!(got.to_bits(), w.to_bits(), "{t} row {r} weight {e}: {got} vs {w}");
                }
            }
        }
    }

    /// The byte permutations give every code its value in every byte position and either half,
    /// code 8 (−0) as 0, and the scale every exponent's `e8m0_to_f32_half`, subnormals included.
    #[test]
    fn mxfp4_unpack_is_exact_for_every_code_and_exponent() {
        for pos in 0..4 {
            for lo in 0..16u8 {
                for hi in 0..16u8 {
                    // Position `pos` holds (lo, hi); the other bytes a different pair each.
                    let qs: Vec<u8> =
                        (0..16).map(|i| if i % 4 == pos { lo | hi << 4 } else { (i as u8 * 5 + lo) & 0x0f | (hi ^ 9) << 4 }).collect();
                    for i in 0..4 {
                        let (l, h) = mxfp4_ints(&qs, i);
                        for m in 0..4 {
                            let byte = qs[4 * i + m];
                            assert_eq!(l.to_le_bytes()[m] as i8, mxfp4::KVALUES[(byte & 15) as usize], "{byte:#04x}");
                            assert_eq!(h.to_le_bytes()[m] as i8, mxfp4::KVALUES[(byte >> 4) as usize], "{byte:#04x}");
                        }
                    }
                }
            }
        }
        let mut blk = vec![0u8; mxfp4::BLOCK_MXFP4_BYTES];
        for e in 0..=255u8 {
            blk[0] = e;
            assert_eq!(wq_scale(WeightType::MXFP4, &blk, 0).0.to_bits(), mxfp4::e8m0_to_f32_half(e).to_bits(), "e = {e}");
        }
    }

    #[test]
    fn codes_match_the_cuda_defines() {
        let source = crate::sources::GEMM_TILE.full_source();
        for t in WeightType::ALL {
            let name = format!("#define WTYPE_{} ", t.name().to_uppercase());
            let line = source.lines().find(|l| l.starts_with(&name)).unwrap_or_else(|| panic!("{name} not in the sources"));
            assert_eq!(line[name.len()..].trim().parse::<i32>().unwrap(), t.code(), "{line}");
            assert_eq!(t.code() as u32, t.ggml().id(), "{t}: the kernels' code is the ggml id");
        }
        // No hand-kept copy of a code: the only definitions are the generated ones.
        let common = include_str!("../../cuda/common.cuh");
        assert!(!common.contains("#define WTYPE_") && !common.contains("#define TTYPE_"), "common.cuh defines a type code by hand");
    }

    #[test]
    fn weight_types_map_to_tensor_types_and_names() {
        for t in WeightType::ALL {
            let tt = TensorType::from(t);
            assert_eq!(tt.weight_type(), Some(t));
            assert_eq!((t.block_size(), t.block_bytes(), t.name()), (tt.block_size(), tt.block_bytes(), tt.name()));
            assert_eq!(t.is_k_quant(), t.block_size() == 256);
            assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{}\"", t.name()));
            assert_eq!(serde_json::from_str::<WeightType>(&format!("\"{}\"", t.name().to_lowercase())).unwrap(), t);
        }
        for tt in [TensorType::F32, TensorType::F16, TensorType::BF16] {
            assert_eq!(tt.weight_type(), None);
        }
        assert_eq!(WeightType::Q6K.row_bytes(2048), 8 * 210);
        assert_eq!(WeightType::Q4K.check_row_width(2048), None);
        assert!(WeightType::Q4K.check_row_width(2048 + 32).unwrap().contains("multiple of 256"));
        assert!(WeightType::Q8_0.check_row_width(0).is_some() && WeightType::Q8_0.check_row_width(96).is_none());
    }
}
