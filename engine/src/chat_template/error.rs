//! Errors of chat templates: reading one from a model, compiling it, rendering it, and the
//! messages given to it.

use crate::gguf::GgufError;

#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// `tokenizer.chat_template` or a key it needs has the wrong type or value.
    #[error(transparent)]
    Metadata(#[from] GgufError),
    #[error("{path}: metadata key {key:?}: token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenId { path: String, key: &'static str, id: u32, vocab_size: usize },
    /// The template does not compile (with minijinja's line and reason).
    #[error("chat template syntax error: {message}")]
    Syntax { message: String },
    /// The template refused the conversation with `raise_exception(message)`.
    #[error("the chat template refused the conversation: {message}")]
    Raised { message: String },
    /// Rendering failed (an undefined attribute, a wrong type, ...).
    #[error("rendering the chat template failed: {message}")]
    Render { message: String },
    /// A message is not what chat templates accept.
    #[error("message {index}: {problem}")]
    Message { index: usize, problem: String },
    #[error("tools: {problem}")]
    Tools { problem: String },
}
