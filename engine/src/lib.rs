//! brink-engine: the MoE inference engine every node hosts.
//!
//! Today: [`gguf`], our own GGUF reader and writer (v2/v3, split files, validated layouts,
//! positioned reads that never hold the model twice). The qwen3moe graph, tokenizer and the CPU
//! and CUDA backends follow; they build on the kernels of `brink-kernels`.

pub mod chat_template;
pub mod gguf;
pub mod tokenizer;
