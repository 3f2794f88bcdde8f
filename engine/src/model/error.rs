//! Errors of model loading and execution: each names the file, key, tensor or backend at fault.

use std::path::PathBuf;

use crate::gguf::{GgmlType, GgufError};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{}: general.architecture is {arch:?}, which brink does not support (supported: {})", .path.display(), .supported.join(", "))]
    UnsupportedArchitecture { path: PathBuf, arch: String, supported: Vec<&'static str> },
    #[error("{}: metadata key {key:?} is {value}: {why}", .path.display())]
    BadHyperparameter { path: PathBuf, key: String, value: String, why: String },
    #[error("{}: tensor {tensor:?} has shape {found:?} (ggml order), expected {expected:?}", .path.display())]
    TensorShape { path: PathBuf, tensor: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("{}: tensor {tensor:?} is {ty}, which the {backend} backend cannot compute with as {role} (supported: {})", .path.display(), .supported.join(", "))]
    UnsupportedTensorType {
        path: PathBuf,
        tensor: String,
        ty: GgmlType,
        backend: &'static str,
        role: &'static str,
        supported: Vec<&'static str>,
    },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("request: {0}")]
    Request(String),
}

/// A failure inside a backend: a CUDA error (naming the kernel, grid, block and shape), an
/// allocation that does not fit, or an input the backend cannot run.
#[derive(Debug, thiserror::Error)]
#[error("{backend} backend: {message}")]
pub struct BackendError {
    pub backend: &'static str,
    pub message: String,
}

impl BackendError {
    pub fn new(backend: &'static str, message: impl Into<String>) -> Self {
        BackendError { backend, message: message.into() }
    }
}
