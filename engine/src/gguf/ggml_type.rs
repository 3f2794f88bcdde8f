//! ggml tensor types: their ids in GGUF files, block sizes and bytes per block.
//!
//! The table mirrors `enum ggml_type` in ggml.h and the block structs of ggml-common.h. The reader
//! needs every type's size to validate a file's layout even when the engine cannot compute with
//! that type; which types the engine computes with is decided by the backends.

use super::error::ShapeProblem;

/// A ggml tensor element type.
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

/// Weights per K-quant super-block.
const QK_K: u64 = 256;

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

/// (id, name as ggml prints it, elements per block, bytes per block)
struct Spec(u32, &'static str, u64, u64);

impl GgmlType {
    pub const ALL: [GgmlType; 34] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
    ];

    fn spec(self) -> Spec {
        use GgmlType::*;
        match self {
            F32 => Spec(0, "f32", 1, 4),
            F16 => Spec(1, "f16", 1, 2),
            Q4_0 => Spec(2, "q4_0", 32, 2 + 16),
            Q4_1 => Spec(3, "q4_1", 32, 2 + 2 + 16),
            Q5_0 => Spec(6, "q5_0", 32, 2 + 4 + 16),
            Q5_1 => Spec(7, "q5_1", 32, 2 + 2 + 4 + 16),
            Q8_0 => Spec(8, "q8_0", 32, 2 + 32),
            // ggml's block_q8_1 has f16 d and s (36 bytes); gguf-py still says 4 + 4 + 32.
            Q8_1 => Spec(9, "q8_1", 32, 2 + 2 + 32),
            Q2_K => Spec(10, "q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
            Q3_K => Spec(11, "q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
            Q4_K => Spec(12, "q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
            Q5_K => Spec(13, "q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
            Q6_K => Spec(14, "q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
            Q8_K => Spec(15, "q8_K", QK_K, 4 + QK_K + QK_K / 8),
            IQ2_XXS => Spec(16, "iq2_xxs", QK_K, 2 + QK_K / 4),
            IQ2_XS => Spec(17, "iq2_xs", QK_K, 2 + QK_K / 4 + QK_K / 32),
            IQ3_XXS => Spec(18, "iq3_xxs", QK_K, 2 + QK_K / 4 + QK_K / 8),
            IQ1_S => Spec(19, "iq1_s", QK_K, 2 + QK_K / 8 + QK_K / 16),
            IQ4_NL => Spec(20, "iq4_nl", 32, 2 + 16),
            IQ3_S => Spec(21, "iq3_s", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
            IQ2_S => Spec(22, "iq2_s", QK_K, 2 + QK_K / 4 + QK_K / 16),
            IQ4_XS => Spec(23, "iq4_xs", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
            I8 => Spec(24, "i8", 1, 1),
            I16 => Spec(25, "i16", 1, 2),
            I32 => Spec(26, "i32", 1, 4),
            I64 => Spec(27, "i64", 1, 8),
            F64 => Spec(28, "f64", 1, 8),
            IQ1_M => Spec(29, "iq1_m", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
            BF16 => Spec(30, "bf16", 1, 2),
            TQ1_0 => Spec(34, "tq1_0", QK_K, 2 + 4 * 13),
            TQ2_0 => Spec(35, "tq2_0", QK_K, 2 + 64),
            MXFP4 => Spec(39, "mxfp4", 32, 1 + 16),
            NVFP4 => Spec(40, "nvfp4", 64, 4 + 32),
            Q1_0 => Spec(41, "q1_0", 128, 2 + 16),
        }
    }

    /// The type's id in GGUF tensor infos (`enum ggml_type`).
    pub fn id(self) -> u32 {
        self.spec().0
    }

    /// The name ggml prints (`ggml_type_name`), e.g. `q4_K`.
    pub fn name(self) -> &'static str {
        self.spec().1
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> u64 {
        self.spec().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        self.spec().3
    }

    pub fn from_id(id: u32) -> Option<GgmlType> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The old name of an id ggml has removed, for a helpful error message.
    pub fn removed_name(id: u32) -> Option<&'static str> {
        REMOVED.iter().find(|(removed, _)| *removed == id).map(|(_, name)| *name)
    }

    /// Bytes of a tensor with these dimensions (ggml order: `dims[0]` is the row length).
    ///
    /// Enforces what ggml needs to address the tensor: 1 to 4 dimensions, none zero, at most
    /// `i64::MAX` elements, and rows made of whole blocks.
    pub fn tensor_bytes(self, dims: &[u64]) -> Result<u64, ShapeProblem> {
        if dims.is_empty() || dims.len() > 4 {
            return Err(ShapeProblem::DimCount(dims.len() as u32));
        }
        let mut elements: u64 = 1;
        for (index, &d) in dims.iter().enumerate() {
            if d == 0 {
                return Err(ShapeProblem::ZeroDim { index });
            }
            elements = elements.checked_mul(d).filter(|&e| e <= i64::MAX as u64).ok_or(ShapeProblem::TooManyElements)?;
        }
        let block = self.block_size();
        if !dims[0].is_multiple_of(block) {
            return Err(ShapeProblem::PartialBlock { ne0: dims[0], ty: self.name(), block });
        }
        // elements / block * block_bytes <= elements * 4.5 for every type, but stay checked.
        (elements / block).checked_mul(self.block_bytes()).ok_or(ShapeProblem::TooManyElements)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
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
        ];
        for (t, id, block, bytes) in expect {
            assert_eq!((t.id(), t.block_size(), t.block_bytes()), (id, block, bytes), "{t}");
        }
    }

    #[test]
    fn tensor_bytes_checks_shape() {
        assert_eq!(GgmlType::Q4_K.tensor_bytes(&[512, 3]), Ok(2 * 3 * 144));
        assert_eq!(GgmlType::F32.tensor_bytes(&[]), Err(ShapeProblem::DimCount(0)));
        assert_eq!(GgmlType::F32.tensor_bytes(&[1, 1, 1, 1, 1]), Err(ShapeProblem::DimCount(5)));
        assert_eq!(GgmlType::F32.tensor_bytes(&[4, 0]), Err(ShapeProblem::ZeroDim { index: 1 }));
        assert!(matches!(GgmlType::Q8_0.tensor_bytes(&[48]), Err(ShapeProblem::PartialBlock { ne0: 48, .. })));
        assert_eq!(GgmlType::F32.tensor_bytes(&[1 << 32, 1 << 31]), Err(ShapeProblem::TooManyElements));
        assert_eq!(GgmlType::F64.tensor_bytes(&[1 << 62]), Err(ShapeProblem::TooManyElements));
    }
}
