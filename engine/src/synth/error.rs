//! What can go wrong generating a synthetic model: every error names the shape field (with its
//! `gen-model` flag), the tensor or the file concerned.

use std::path::PathBuf;

use brink_kernels::quant::TensorType;

use crate::gguf::GgufError;

use super::scheme::QuantScheme;

/// A field of a model shape; `flag` is its `brink-agent gen-model` option.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShapeField {
    Layers,
    Hidden,
    Experts,
    TopK,
    ExpertFfn,
    Heads,
    KvHeads,
    HeadDim,
    Vocab,
    Context,
    RopeTheta,
    RmsEps,
    /// gpt-oss only.
    SlidingWindow,
    YarnFactor,
    YarnOriginalContext,
}

impl ShapeField {
    pub fn flag(self) -> &'static str {
        match self {
            ShapeField::Layers => "--layers",
            ShapeField::Hidden => "--hidden",
            ShapeField::Experts => "--experts",
            ShapeField::TopK => "--top-k",
            ShapeField::ExpertFfn => "--expert-ffn",
            ShapeField::Heads => "--heads",
            ShapeField::KvHeads => "--kv-heads",
            ShapeField::HeadDim => "--head-dim",
            ShapeField::Vocab => "--vocab",
            ShapeField::Context => "--context",
            ShapeField::RopeTheta => "--rope-theta",
            ShapeField::RmsEps => "--rms-eps",
            ShapeField::SlidingWindow => "--sliding-window",
            ShapeField::YarnFactor => "--yarn-factor",
            ShapeField::YarnOriginalContext => "--yarn-original-context",
        }
    }
}

impl std::fmt::Display for ShapeField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.flag())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown architecture {0:?}: expected qwen3moe or gpt-oss")]
    UnknownArch(String),
    #[error("unknown {arch} preset {name:?}: expected one of {}", .known.join(", "))]
    UnknownPreset { arch: &'static str, name: String, known: Vec<&'static str> },
    #[error("unknown type {0:?}: expected one of f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K, mxfp4, k-mix, mxfp4-moe")]
    UnknownType(String),
    #[error("{field} {value}: {problem}")]
    BadShape { field: ShapeField, value: String, problem: String },
    /// A tensor whose rows cannot be cut into the type's blocks (K-quants need rows of 256).
    #[error(
        "--type {scheme} cannot store tensor {tensor:?} {dims:?} as {ty}: its rows of {row} values ({fields}) are not whole {block}-value blocks"
    )]
    Unstorable { tensor: String, dims: Vec<u64>, scheme: QuantScheme, ty: TensorType, row: u64, block: usize, fields: String },
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{}: {during}: {source}", .path.display())]
    Io { path: PathBuf, during: &'static str, source: std::io::Error },
}

impl SynthError {
    pub(crate) fn bad_shape(field: ShapeField, value: impl ToString, problem: impl Into<String>) -> Self {
        SynthError::BadShape { field, value: value.to_string(), problem: problem.into() }
    }
}
