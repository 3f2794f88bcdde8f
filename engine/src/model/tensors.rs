//! Weights as read from the file: one [`HostTensor`] per GGUF tensor, shape-checked against
//! what the architecture expects before a byte is read.

use crate::gguf::{GgmlType, GgufFile};

use super::error::ModelError;

/// A tensor's type, shape and raw bytes (the file's block layout, unchanged).
#[derive(Clone, Debug)]
pub struct HostTensor {
    pub name: String,
    pub ggml_type: GgmlType,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub bytes: Vec<u8>,
}

/// How a weight's ggml dimensions read as stacked matrices: rows of `ne[0]` values, `ne[1]`
/// rows, `ne[2]` matrices (the experts of an expert tensor). Shared by the host tensors and
/// every backend's weights.
pub trait MatrixDims {
    /// ggml order: `dims()[0]` is the row length.
    fn dims(&self) -> &[u64];

    /// Length of one row (`ne[0]`).
    fn row_len(&self) -> usize {
        self.dims()[0] as usize
    }

    /// Rows of one matrix (`ne[1]`, 1 for vectors).
    fn rows(&self) -> usize {
        self.dims().get(1).copied().unwrap_or(1) as usize
    }

    /// Matrices stacked along `ne[2]` (1 unless an expert tensor).
    fn matrices(&self) -> usize {
        self.dims().get(2).copied().unwrap_or(1) as usize
    }
}

impl MatrixDims for HostTensor {
    fn dims(&self) -> &[u64] {
        &self.dims
    }
}

impl HostTensor {
    pub fn row_bytes(&self) -> usize {
        (self.dims[0] / self.ggml_type.block_size() * self.ggml_type.block_bytes()) as usize
    }

    /// The tensor as f32 values: only for the F32 vectors (norm weights) the graph reads directly.
    pub fn f32_values(&self) -> Option<Vec<f32>> {
        (self.ggml_type == GgmlType::F32)
            .then(|| self.bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }
}

/// Reads tensors by name, checking each one's shape first.
pub struct TensorReader<'a> {
    pub file: &'a GgufFile,
    /// Bytes read so far (for the load report).
    pub bytes_read: u64,
}

impl<'a> TensorReader<'a> {
    pub fn new(file: &'a GgufFile) -> Self {
        TensorReader { file, bytes_read: 0 }
    }

    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    /// Reads tensor `name`, which must have exactly the dimensions `dims` (ggml order).
    pub fn read(&mut self, name: &str, dims: &[u64]) -> Result<HostTensor, ModelError> {
        let info = self.file.require_tensor(name)?;
        if info.dims() != dims {
            return Err(ModelError::TensorShape {
                path: self.file.path().to_path_buf(),
                tensor: name.to_string(),
                expected: dims.to_vec(),
                found: info.dims().to_vec(),
            });
        }
        let bytes = self.file.read_tensor(info)?;
        self.bytes_read += bytes.len() as u64;
        Ok(HostTensor { name: name.to_string(), ggml_type: info.ggml_type(), dims: dims.to_vec(), bytes })
    }
}
