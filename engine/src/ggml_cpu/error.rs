//! Errors of the CPU backend's checked entry points: the weights come from model files, so a
//! type the CPU cannot multiply or a tensor whose bytes do not match its shape is reported with
//! the numbers, never a panic.

use super::vec_dot::WeightKind;
use crate::gguf::GgmlType;

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum CpuError {
    #[error("tensor type {0} is not supported by the CPU backend: it multiplies {kinds}", kinds = multiplied())]
    UnsupportedType(GgmlType),
    #[error("{ty} weight matrix of {rows} x {cols}: a row of {cols} values is not a whole number of {block}-value blocks")]
    PartialBlock { ty: GgmlType, rows: usize, cols: usize, block: usize },
    #[error("{ty} weight matrix of {rows} x {cols} needs {expected} bytes, the data has {got}")]
    DataLength { ty: GgmlType, rows: usize, cols: usize, expected: u64, got: usize },
    #[error("{n} stacked {ty} matrices of {rows} x {cols} need {expected} bytes, the data has {got}")]
    StackLength { ty: GgmlType, n: usize, rows: usize, cols: usize, expected: u64, got: usize },
    #[error("MoE router with top_k {top_k} over {n_expert} experts: top_k must be 1 to n_expert")]
    MoeShape { n_expert: usize, top_k: usize },
    #[error("token id {id} is past the embedding table's {rows} rows")]
    TokenId { id: u32, rows: usize },
    #[error("{ty} weight matrix of {rows} x {cols} is empty")]
    Empty { ty: GgmlType, rows: usize, cols: usize },
}

/// `f32, f16, …` of the types the CPU multiplies.
fn multiplied() -> String {
    WeightKind::ALL.map(|k| k.ggml_type().name()).join(", ")
}
