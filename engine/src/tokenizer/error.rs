//! The tokenizer's error type: every metadata problem names the file, the key and, for arrays,
//! the element index, so a broken model file can be fixed by looking at it.

use std::path::PathBuf;

use crate::gguf::GgufError;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A key is missing or has the wrong type (the GGUF error names the file and the key).
    #[error(transparent)]
    Metadata(#[from] GgufError),
    /// A key is present with the right type, but its value is unusable.
    #[error("{}: metadata key \"{key}{}\": {problem}", .path.display(), index_suffix(.index))]
    Invalid { path: PathBuf, key: &'static str, index: Option<usize>, problem: String },
    /// A tokenizer model or pre-tokenizer this engine does not implement.
    #[error("{}: metadata key {key:?}: unsupported value {value:?}; supported: {}", .path.display(), .supported.join(", "))]
    Unsupported { path: PathBuf, key: &'static str, value: String, supported: Vec<&'static str> },
    /// The `tokenizers` library refused the converted vocabulary or failed on a text.
    #[error("{context}: {message}")]
    Library { context: String, message: String },
    /// A token id past the end of the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: u32, vocab_size: usize },
}

fn index_suffix(index: &Option<usize>) -> String {
    index.map(|i| format!("[{i}]")).unwrap_or_default()
}

impl TokenizerError {
    pub(crate) fn library(context: impl Into<String>, error: impl std::fmt::Display) -> Self {
        TokenizerError::Library { context: context.into(), message: error.to_string() }
    }
}
