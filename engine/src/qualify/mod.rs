//! The model-level threshold test: whole forward passes of the loaded model at the kernel
//! catalogue's critical token counts, as single prompts, four sequences and a prefill mixed
//! with decode, each compared with the same sequences computed alone and each with a deadline.
//!
//! - [`shape`]: the model's configuration as the kernels' shape class.
//! - [`cases`]: which cases, their deadlines and the KV pool they need (pure).
//! - [`plan`]: which reference chunks each case runs and which rows are kept for later cases
//!   (pure): every case's sequences are prefixes of shared token streams, each computed once.
//! - [`exec`]: one case on a loaded engine; [`worker`]: the child process that runs them.
//! - [`session`]: the parent: starts the worker, runs every case with its deadline (a hang kills
//!   and restarts the worker), builds the `ModelTestReport`; [`render`]: its table.

pub mod cases;
pub mod exec;
pub mod plan;
pub mod render;
pub mod session;
pub mod shape;
pub mod worker;

pub use session::{Options, Progress, run};
pub use shape::kernel_shape;
