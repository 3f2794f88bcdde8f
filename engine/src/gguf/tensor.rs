//! What a GGUF file says about one tensor, after validation.

use super::ggml_type::GgmlType;

/// One tensor of a (possibly split) GGUF model. Produced by the reader once its shape, type,
/// alignment and byte range have been checked against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub(crate) name: Box<str>,
    /// ggml order (`ne`): `dims[0]` is the row length; unused trailing dims are 1.
    pub(crate) dims: [u64; 4],
    pub(crate) n_dims: u8,
    pub(crate) ggml_type: GgmlType,
    pub(crate) offset: u64,
    pub(crate) file_offset: u64,
    pub(crate) size: u64,
    pub(crate) part: u32,
    pub(crate) info_offset: u64,
}

impl TensorInfo {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Dimensions in ggml order (`ne[0]` first: the row length).
    pub fn dims(&self) -> &[u64] {
        &self.dims[..self.n_dims as usize]
    }

    /// All four ggml dimensions, trailing ones set to 1.
    pub fn ne(&self) -> [u64; 4] {
        self.dims
    }

    pub fn n_elements(&self) -> u64 {
        // Validated by the reader to fit in i64.
        self.dims.iter().product()
    }

    /// Elements per row (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims[0]
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        self.dims[0] / self.ggml_type.block_size() * self.ggml_type.block_bytes()
    }

    pub fn n_rows(&self) -> u64 {
        self.n_elements() / self.dims[0]
    }

    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Offset of the data from the start of its file's data section (as stored in the file).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Absolute byte offset of the data in its file.
    pub fn file_offset(&self) -> u64 {
        self.file_offset
    }

    /// Bytes of data.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Index of the file (split part) holding the data, into `GgufFile::parts()`.
    pub fn part(&self) -> usize {
        self.part as usize
    }

    /// Byte offset of this tensor's info record in the header.
    pub fn info_offset(&self) -> u64 {
        self.info_offset
    }
}
