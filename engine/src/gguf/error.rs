//! The one error type of the GGUF reader and writer.
//!
//! Every error names the file it is about and, where there is one, the byte offset of the field
//! that was wrong, so a user can look at the file and see the problem.

use std::path::{Path, PathBuf};

/// An error about one GGUF file: which file, where in it, and what was wrong.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {kind}", .path.display(), at(.offset))]
pub struct GgufError {
    pub path: PathBuf,
    /// Byte offset of the field that was wrong, when the problem has a place in the file.
    pub offset: Option<u64>,
    pub kind: ErrorKind,
}

fn at(offset: &Option<u64>) -> String {
    offset.map(|o| format!(" at byte {o}")).unwrap_or_default()
}

impl GgufError {
    pub fn new(path: &Path, offset: Option<u64>, kind: ErrorKind) -> Self {
        GgufError { path: path.to_path_buf(), offset, kind }
    }

    pub fn at(path: &Path, offset: u64, kind: ErrorKind) -> Self {
        Self::new(path, Some(offset), kind)
    }

    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
}

/// What was wrong.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    #[error("I/O error while {during}: {source}")]
    Io { during: &'static str, source: std::io::Error },
    #[error("the file ends at byte {file_len}, but {what} needs {needed} bytes from here")]
    Truncated { what: &'static str, needed: u64, file_len: u64 },
    #[error("not a GGUF file: the first four bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version} (versions 2 and 3 are supported)")]
    UnsupportedVersion { version: u32 },
    #[error("the file is big-endian (version field reads {raw:#010x}); only little-endian GGUF files are supported")]
    BigEndian { raw: u32 },
    #[error("{what} count {count} is impossible: the {remaining} bytes left in the file hold at most {max}")]
    CountTooLarge { what: &'static str, count: u64, remaining: u64, max: u64 },
    #[error("unknown metadata value type id {id}")]
    UnknownValueType { id: u32 },
    #[error("metadata arrays nested deeper than {max} levels")]
    ArrayTooDeep { max: usize },
    #[error("bool value must be 0 or 1, found {byte}")]
    InvalidBool { byte: u8 },
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str },
    #[error("{what} is empty")]
    EmptyString { what: &'static str },
    #[error("duplicate metadata key {key:?}")]
    DuplicateKey { key: String },
    #[error("duplicate tensor name {name:?}")]
    DuplicateTensor { name: String },
    #[error("general.alignment must be a non-zero power of two that fits in u32, found {found}")]
    BadAlignment { found: String },
    #[error("tensor {tensor:?} has unknown ggml type id {id}{}", removed_note(.removed))]
    UnknownTensorType { tensor: String, id: u32, removed: Option<&'static str> },
    #[error("tensor {tensor:?}: {problem}")]
    BadShape { tensor: String, problem: ShapeProblem },
    #[error("tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor { tensor: String, offset: u64, alignment: u64 },
    #[error(
        "tensor {tensor:?}: data at offset {offset} + {size} bytes (from data section start {data_start}) runs past the end of the file at byte {file_len}"
    )]
    TensorPastEnd { tensor: String, offset: u64, size: u64, data_start: u64, file_len: u64 },
    #[error("tensors {first:?} (bytes {first_start}..{first_end}) and {second:?} (bytes {second_start}..) overlap")]
    OverlappingTensors { first: String, first_start: u64, first_end: u64, second: String, second_start: u64 },
    #[error("no tensor named {name:?}")]
    MissingTensor { name: String },
    #[error("metadata key {key:?}: {problem}")]
    Metadata { key: String, problem: KeyProblem },
    #[error("split model: {0}")]
    Split(SplitProblem),
    #[error("tensor {tensor:?}: {found} bytes given, expected {expected}")]
    DataSize { tensor: String, expected: u64, found: u64 },
    #[error("tensor {tensor:?}: bytes {start}..{start}+{len} lie outside its {size} bytes")]
    RangeOutsideTensor { tensor: String, start: u64, len: u64, size: u64 },
    #[error("tensor {tensor:?}: its data ({start}..{end}) is not inside part {part} ({part_len} bytes) of this file")]
    ForeignTensor { tensor: String, part: u32, start: u64, end: u64, part_len: u64 },
    #[error("writer: {problem}")]
    Writer { problem: String },
}

fn removed_note(removed: &Option<&'static str>) -> String {
    removed.map(|name| format!(" ({name}, removed from ggml: re-convert the model)")).unwrap_or_default()
}

/// Why a tensor's shape was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeProblem {
    #[error("{0} dimensions (1 to 4 are allowed)")]
    DimCount(u32),
    #[error("dimension {index} is 0")]
    ZeroDim { index: usize },
    #[error("element count overflows a signed 64-bit integer")]
    TooManyElements,
    #[error("row length {ne0} is not a multiple of the {ty} block size {block}")]
    PartialBlock { ne0: u64, ty: &'static str, block: u64 },
}

/// Why a typed metadata getter refused a key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyProblem {
    #[error("missing")]
    Missing,
    #[error("expected {expected}, found {found}")]
    WrongType { expected: &'static str, found: String },
    #[error("value {value} does not fit in {expected}")]
    OutOfRange { expected: &'static str, value: String },
}

/// Why the parts of a split model do not form one model.
#[derive(Debug, thiserror::Error)]
pub enum SplitProblem {
    #[error("split.count is {count} but the file name does not end in -NNNNN-of-NNNNN.gguf, so the other parts cannot be found")]
    UnnamedSplit { count: u32 },
    #[error("the file name says part {name_no} of {name_count}, its metadata says part {no} of {count}")]
    NameDisagrees { name_no: u32, name_count: u32, no: u32, count: u32 },
    #[error("split.no {no} is not below split.count {count}")]
    BadNumbering { no: u32, count: u32 },
    #[error("split.count is present but split.no is missing")]
    MissingNumber,
    #[error("part {part} of {count} cannot be opened: {source}")]
    MissingPart { part: u32, count: u32, source: std::io::Error },
    #[error("{key} is {found}, expected {expected} (from the other parts)")]
    PartMismatch { key: &'static str, expected: String, found: String },
    #[error("split.tensors.count is {declared} but the parts hold {found} tensors")]
    TensorCount { declared: u64, found: u64 },
}
