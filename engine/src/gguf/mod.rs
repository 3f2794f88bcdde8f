//! GGUF, the model file format of llama.cpp: a reader and a writer of our own.
//!
//! - [`GgufFile::open`] reads a model in one file or split into llama.cpp-style parts
//!   (`model-00001-of-00003.gguf`), validating versions 2 and 3, every metadata value type,
//!   the alignment, and every tensor's shape, type, offset and size against the file's length.
//!   A truncated, corrupt or hostile file gives a [`GgufError`] naming the file, the byte offset
//!   and the problem; counts are bounded by the bytes left in the file before anything is
//!   allocated for them.
//! - Tensor data is read with positioned reads into a caller's buffer
//!   ([`GgufFile::read_tensor_into`]) or viewed through a memory map ([`GgufFile::map`]).
//! - [`GgufWriter`] writes files (and split files) for tests and the synthetic model generator.
//!
//! Layout (little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 metadata count,
//! metadata (string key, u32 value type, value), tensor infos (string name, u32 n_dims, u64 dims
//! in ggml order, u32 ggml type, u64 offset into the data section), padding to the alignment,
//! the data section.

mod cursor;
mod encode;
mod error;
mod file;
mod ggml_type;
mod layout;
mod load;
mod metadata;
mod reader;
mod split;
mod tensor;
mod value;
mod writer;

pub use error::{ErrorKind, GgufError, KeyProblem, ShapeProblem, SplitProblem};
pub use file::{GgufFile, GgufPart};
pub use ggml_type::{GgmlType, tensor_bytes};
pub use load::MappedGguf;
pub use metadata::{Entry, Metadata};
pub use reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, PartHeader, read_header};
pub use split::{SPLIT_COUNT_KEY, SPLIT_NO_KEY, SPLIT_TENSORS_COUNT_KEY, SplitInfo, parse_split_path, split_path};
pub use tensor::TensorInfo;
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, PlannedTensor, SplitPart, TensorDataWriter};
