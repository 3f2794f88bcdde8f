//! Black-box threshold qualification (`brink-agent qualify --url`): any running engine with an
//! OpenAI-compatible API (vLLM, SGLang, llama.cpp's server, brink's own `serve`) is sent prompts
//! of exactly the lengths where engines break, derived from the model's shape and the engine's
//! limits, each with a deadline, and gets the kernel self-test's verdict: pass, clamp (the
//! longest prompt admitted lies under the first failure), or refuse.
//!
//! Pure parts: [`plan`] (which prompts), [`prompt`] (texts of exact token counts), [`verdict`]
//! (answers to case results, the bisection, the verdict), [`render`] (the table). I/O:
//! [`client`] (hyper, one connection per request) and [`session`] (one run).

pub mod client;
pub mod plan;
pub mod prompt;
pub mod render;
pub mod session;
pub mod verdict;

pub use session::{Options, run};
