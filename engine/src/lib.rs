//! brink-engine: the MoE inference engine every node hosts.
//!
//! - [`gguf`]: our own GGUF reader and writer (v2/v3, split files, validated layouts,
//!   positioned reads that never hold the model twice).
//! - [`model`]: hyperparameters, host tensors, errors; [`arch`]: one file per architecture
//!   (`qwen3moe`), registered by `general.architecture`, each a graph over [`backend::Backend`].
//! - [`backend`]: the op interface and the backends (`cpu`, the reference, on [`ggml_cpu`]: the
//!   arithmetic of ggml's CPU backend, mirrored; `cuda`, on the kernels).
//! - [`engine`]: a loaded model with its KV cache: prefill, decode, generation;
//!   [`sampler`]: greedy / temperature / top-k / top-p.
//! - [`wire`]: the OpenAI and Anthropic wire formats (requests, responses, SSE, tool calls, stop
//!   strings, errors) as pure logic for the HTTP server.
//! - [`sched`]: the serving scheduler's pure logic: paged KV blocks with prefix reuse, the step
//!   planner, admission control, the poison quarantine.
//! - [`monitor`]: the progress board the watchdog reads, and test-only fault injection.
//! - [`qualify`]: the model-level threshold test (critical counts through the whole model).

pub mod arch;
pub mod backend;
pub mod chat_template;
pub mod engine;
pub mod ggml_cpu;
pub mod gguf;
pub mod model;
pub mod monitor;
pub mod parity;
pub mod qualify;
pub mod sampler;
pub mod sched;
pub mod server;
pub mod synth;
pub mod test_switches;
pub mod tokenizer;
pub mod wire;

pub use engine::{AnyEngine, BackendKind, Engine, EngineOptions, GenerateParams, Generation, LoadReport, StepItem, StopReason, open};
