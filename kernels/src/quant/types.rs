//! The one table of tensor types, keyed by ggml's type id (`enum ggml_type` in ggml.h, block
//! structs of ggml-common.h): id, name, block size and bytes, and what brink computes with the
//! type. Everything else derives from it: [`GgmlType`] (every type a GGUF file may hold, so the
//! reader can validate layouts it does not compute with), [`super::TensorType`] (the types with
//! a CPU dequantization), [`super::WeightType`] (the types the kernels dot with q8_1
//! activations), their codes in the kernels (the ggml id), and the `#define`s prepended to
//! every CUDA source ([`cuda_header`]).
//!
//! Adding a quantized type is one row here (with its CPU dequantization and q8_1 dot, the
//! twins of the device code), and its unpack in `cuda/common.cuh` (`wq_int`, `wq_scale`,
//! `block_partial`).

use std::fmt::Write as _;

use super::{BlockQ8_1, QK, float, kquants, mxfp4};

/// A ggml tensor element type, in the table's order (ids ascending).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// Dequantizes whole blocks into `out` (lengths checked by the caller).
pub type DequantizeFn = fn(&[u8], &mut [f32]);
/// One weight row dotted with q8_1 activation blocks (whole blocks, matching lengths).
pub type DotFn = fn(&[u8], &[BlockQ8_1]) -> f32;

/// What brink computes with a type.
#[derive(Clone, Copy, Debug)]
pub enum Compute {
    /// Nothing: the reader knows its layout, the backends refuse it by name.
    ReadOnly,
    /// Converted to f32 where it is used (norms, embeddings, the CPU matmuls): the float types
    /// (a quantized type with a CPU dequantization but no device unpack would be one too).
    Float { dequantize: DequantizeFn },
    /// Also a kernel weight format: the kernels dot it with q8_1 rows. `dot` is the CPU twin of
    /// the device formula.
    Weight { dequantize: DequantizeFn, dot: DotFn },
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct TypeRow {
    pub ty: GgmlType,
    /// The id in GGUF tensor infos, and the type's code in the kernels.
    pub id: u32,
    /// ggml's name (`ggml_type_name`), e.g. `q4_K`.
    pub name: &'static str,
    /// Values per block (1 for plain types).
    pub block_size: usize,
    pub block_bytes: usize,
    pub compute: Compute,
}

const QK_K: usize = kquants::QK_K;

const fn read_only(ty: GgmlType, id: u32, name: &'static str, block_size: usize, block_bytes: usize) -> TypeRow {
    TypeRow { ty, id, name, block_size, block_bytes, compute: Compute::ReadOnly }
}

const fn float_type(ty: GgmlType, id: u32, name: &'static str, bytes: usize, dequantize: DequantizeFn) -> TypeRow {
    TypeRow { compute: Compute::Float { dequantize }, ..read_only(ty, id, name, 1, bytes) }
}

const fn weight_format(ty: GgmlType, id: u32, name: &'static str, block: (usize, usize), dequantize: DequantizeFn, dot: DotFn) -> TypeRow {
    TypeRow { compute: Compute::Weight { dequantize, dot }, ..read_only(ty, id, name, block.0, block.1) }
}

use GgmlType as T;

/// Every ggml type. ggml's block_q8_1 has f16 d and s (36 bytes; gguf-py still says 4 + 4 + 32).
pub const TYPES: [TypeRow; 34] = [
    float_type(T::F32, 0, "f32", float::F32_BYTES, float::dequantize_f32_into),
    float_type(T::F16, 1, "f16", float::F16_BYTES, float::dequantize_f16_into),
    weight_format(T::Q4_0, 2, "q4_0", (QK, super::BLOCK_Q4_0_BYTES), super::dequantize_q4_0_into, super::dot_q4_0_q8_1),
    read_only(T::Q4_1, 3, "q4_1", 32, 2 + 2 + 16),
    read_only(T::Q5_0, 6, "q5_0", 32, 2 + 4 + 16),
    read_only(T::Q5_1, 7, "q5_1", 32, 2 + 2 + 4 + 16),
    weight_format(T::Q8_0, 8, "q8_0", (QK, super::BLOCK_Q8_0_BYTES), super::dequantize_q8_0_into, super::dot_q8_0_q8_1),
    read_only(T::Q8_1, 9, "q8_1", 32, 2 + 2 + 32),
    read_only(T::Q2_K, 10, "q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
    read_only(T::Q3_K, 11, "q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
    weight_format(T::Q4_K, 12, "q4_K", (QK_K, kquants::BLOCK_Q4_K_BYTES), kquants::dequantize_row_q4_k, kquants::dot_q4_k_q8_1),
    weight_format(T::Q5_K, 13, "q5_K", (QK_K, kquants::BLOCK_Q5_K_BYTES), kquants::dequantize_row_q5_k, kquants::dot_q5_k_q8_1),
    weight_format(T::Q6_K, 14, "q6_K", (QK_K, kquants::BLOCK_Q6_K_BYTES), kquants::dequantize_row_q6_k, kquants::dot_q6_k_q8_1),
    read_only(T::Q8_K, 15, "q8_K", QK_K, 4 + QK_K + QK_K / 8),
    read_only(T::IQ2_XXS, 16, "iq2_xxs", QK_K, 2 + QK_K / 4),
    read_only(T::IQ2_XS, 17, "iq2_xs", QK_K, 2 + QK_K / 4 + QK_K / 32),
    read_only(T::IQ3_XXS, 18, "iq3_xxs", QK_K, 2 + QK_K / 4 + QK_K / 8),
    read_only(T::IQ1_S, 19, "iq1_s", QK_K, 2 + QK_K / 8 + QK_K / 16),
    read_only(T::IQ4_NL, 20, "iq4_nl", 32, 2 + 16),
    read_only(T::IQ3_S, 21, "iq3_s", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
    read_only(T::IQ2_S, 22, "iq2_s", QK_K, 2 + QK_K / 4 + QK_K / 16),
    read_only(T::IQ4_XS, 23, "iq4_xs", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
    read_only(T::I8, 24, "i8", 1, 1),
    read_only(T::I16, 25, "i16", 1, 2),
    read_only(T::I32, 26, "i32", 1, 4),
    read_only(T::I64, 27, "i64", 1, 8),
    read_only(T::F64, 28, "f64", 1, 8),
    read_only(T::IQ1_M, 29, "iq1_m", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
    float_type(T::BF16, 30, "bf16", float::BF16_BYTES, float::dequantize_bf16_into),
    read_only(T::TQ1_0, 34, "tq1_0", QK_K, 2 + 4 * 13),
    read_only(T::TQ2_0, 35, "tq2_0", QK_K, 2 + 64),
    weight_format(T::MXFP4, 39, "mxfp4", (QK, mxfp4::BLOCK_MXFP4_BYTES), mxfp4::dequantize_mxfp4_into, mxfp4::dot_mxfp4_q8_1),
    read_only(T::NVFP4, 40, "nvfp4", 64, 4 + 32),
    read_only(T::Q1_0, 41, "q1_0", 128, 2 + 16),
];

/// The table at one address, for `&'static` rows.
static TABLE: [TypeRow; TYPES.len()] = TYPES;

/// Ids that ggml once used and has since removed; files with them must be re-converted.
const REMOVED: [(u32, &str); 8] = [
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

// The enum's order is the table's: `GgmlType::row` indexes by discriminant.
const _: () = {
    let mut i = 0;
    while i < TYPES.len() {
        assert!(TYPES[i].ty as usize == i, "TYPES is out of GgmlType's order");
        i += 1;
    }
};

/// The types of the table that `keep` selects, as a fixed array (for the `ALL` constants).
pub(crate) const fn count(keep: Keep) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < TYPES.len() {
        n += keep.selects(&TYPES[i]) as usize;
        i += 1;
    }
    n
}

pub(crate) const fn select<const N: usize>(keep: Keep) -> [GgmlType; N] {
    let mut out = [GgmlType::F32; N];
    let (mut i, mut n) = (0, 0);
    while i < TYPES.len() {
        if keep.selects(&TYPES[i]) {
            out[n] = TYPES[i].ty;
            n += 1;
        }
        i += 1;
    }
    out
}

/// Which rows an `ALL` constant holds.
#[derive(Clone, Copy)]
pub(crate) enum Keep {
    /// Float or weight: a CPU dequantization.
    Computed,
    /// The kernel weight formats (of one block size, when given).
    Weights { block_size: Option<usize> },
    /// The kernel weight formats among ggml's legacy quants (q4_0 .. q8_1, ids 2 to 9: 32 values
    /// and an f16 scale a block). MXFP4 is 32 wide too but not one of them.
    Legacy,
}

impl Keep {
    const fn selects(self, r: &TypeRow) -> bool {
        match (self, r.compute) {
            (Keep::Computed, Compute::Float { .. } | Compute::Weight { .. }) => true,
            (Keep::Weights { block_size: None }, Compute::Weight { .. }) => true,
            (Keep::Weights { block_size: Some(b) }, Compute::Weight { .. }) => r.block_size == b,
            (Keep::Legacy, Compute::Weight { .. }) => r.block_size == QK && r.id >= 2 && r.id <= 9,
            _ => false,
        }
    }
}

impl GgmlType {
    pub const ALL: [GgmlType; TYPES.len()] = {
        let mut out = [GgmlType::F32; TYPES.len()];
        let mut i = 0;
        while i < TYPES.len() {
            out[i] = TYPES[i].ty;
            i += 1;
        }
        out
    };

    pub fn row(self) -> &'static TypeRow {
        &TABLE[self as usize]
    }

    /// The type's id in GGUF tensor infos (`enum ggml_type`).
    pub fn id(self) -> u32 {
        self.row().id
    }

    /// The name ggml prints (`ggml_type_name`), e.g. `q4_K`.
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> u64 {
        self.row().block_size as u64
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        self.row().block_bytes as u64
    }

    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().find(|r| r.id == id).map(|r| r.ty)
    }

    /// The old name of an id ggml has removed, for a helpful error message.
    pub fn removed_name(id: u32) -> Option<&'static str> {
        REMOVED.iter().find(|(removed, _)| *removed == id).map(|(_, name)| *name)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The type constants every CUDA source is compiled with (prepended before `common.cuh`):
/// `TTYPE_<NAME>` for each computed type and `WTYPE_<NAME>` for each weight format, both the
/// ggml id; `WEIGHT_ROW_BYTES_CASES(k)`, the `switch` cases giving a row's bytes per weight
/// format with constant divisors; and `DISPATCH_WTYPE(wtype, ...)`, which runs its statement
/// with `WT` bound to each weight format as a compile-time constant and traps on any other code.
pub fn cuda_header() -> String {
    let mut out = String::from("// Generated from the tensor type table (kernels/src/quant/types.rs).\n");
    let weights: Vec<&TypeRow> = TYPES.iter().filter(|r| matches!(r.compute, Compute::Weight { .. })).collect();
    for r in TYPES.iter().filter(|r| !matches!(r.compute, Compute::ReadOnly)) {
        let _ = writeln!(out, "#define TTYPE_{} {}", r.name.to_uppercase(), r.id);
    }
    for r in &weights {
        let _ = writeln!(out, "#define WTYPE_{} {}", r.name.to_uppercase(), r.id);
    }
    out += "#define WEIGHT_ROW_BYTES_CASES(k)";
    for r in &weights {
        let _ = write!(out, " \\\n    case WTYPE_{}: return (u64)((k) / {}) * {};", r.name.to_uppercase(), r.block_size, r.block_bytes);
    }
    out += "\n#define DISPATCH_WTYPE(wtype, ...) \\\n    switch (wtype) {";
    for r in &weights {
        let _ = write!(out, " \\\n        case WTYPE_{0}: {{ constexpr int WT = WTYPE_{0}; __VA_ARGS__; }} break;", r.name.to_uppercase());
    }
    out += " \\\n        default: __trap(); \\\n    }\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert!(GgmlType::removed_name(t.id()).is_none());
        }
        assert!(TYPES.windows(2).all(|w| w[0].id < w[1].id), "ids ascending");
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::removed_name(4), Some("Q4_2"));
    }

    #[test]
    fn sizes_match_ggml() {
        let expect = [
            (GgmlType::F32, 0, 1, 4),
            (GgmlType::F16, 1, 1, 2),
            (GgmlType::Q4_0, 2, 32, 18),
            (GgmlType::Q4_1, 3, 32, 20),
            (GgmlType::Q5_0, 6, 32, 22),
            (GgmlType::Q5_1, 7, 32, 24),
            (GgmlType::Q8_0, 8, 32, 34),
            (GgmlType::Q8_1, 9, 32, 36),
            (GgmlType::Q2_K, 10, 256, 84),
            (GgmlType::Q3_K, 11, 256, 110),
            (GgmlType::Q4_K, 12, 256, 144),
            (GgmlType::Q5_K, 13, 256, 176),
            (GgmlType::Q6_K, 14, 256, 210),
            (GgmlType::Q8_K, 15, 256, 292),
            (GgmlType::BF16, 30, 1, 2),
            (GgmlType::MXFP4, 39, 32, 17),
        ];
        for (t, id, block, bytes) in expect {
            assert_eq!((t.id(), t.block_size(), t.block_bytes()), (id, block, bytes), "{t}");
        }
    }

    #[test]
    fn the_cuda_header_defines_every_computed_type_and_dispatches_every_weight_format() {
        let h = cuda_header();
        assert!(h.contains("#define TTYPE_F32 0\n") && h.contains("#define TTYPE_BF16 30\n"), "{h}");
        assert!(!h.contains("TTYPE_Q4_1"), "read-only types have no code: {h}");
        for (name, id, per_block, bytes) in
            [("Q4_0", 2, 32, 18), ("Q8_0", 8, 32, 34), ("Q4_K", 12, 256, 144), ("Q6_K", 14, 256, 210), ("MXFP4", 39, 32, 17)]
        {
            assert!(h.contains(&format!("#define WTYPE_{name} {id}\n")), "{name}: {h}");
            assert!(h.contains(&format!("case WTYPE_{name}: return (u64)((k) / {per_block}) * {bytes};")), "{name}: {h}");
            assert!(h.contains(&format!("case WTYPE_{name}: {{ constexpr int WT = WTYPE_{name}; __VA_ARGS__; }} break;")), "{name}: {h}");
        }
        assert!(!h.contains("WTYPE_F32") && !h.contains("WTYPE_BF16"), "floats are not weight formats: {h}");
        assert!(h.contains("#define TTYPE_MXFP4 39\n") && h.contains("#define WTYPE_MXFP4 39\n"), "{h}");
        // Every line of a macro but its last continues.
        for block in h.split("#define").filter(|b| b.contains('\n')) {
            let lines: Vec<&str> = block.trim_end().lines().collect();
            assert!(lines[..lines.len() - 1].iter().all(|l| l.ends_with('\\')), "{block}");
        }
    }
}
