//! The serving scheduler's pure logic: no I/O and no engine calls, so every decision is
//! testable on its own. The server wires it to [`crate::Engine::step`].
//!
//! - [`kv_blocks`]: the KV cache as fixed-size blocks with per-sequence tables and prefix reuse.
//! - [`plan`]: the step planner (decode first, then FIFO prefill chunks under a token budget).
//! - [`scheduler`]: sequences, admission control, preemption and cancellation around the two.
//! - [`quarantine`]: the batch shape that was running at a stall, and how to avoid recreating it.

pub mod kv_blocks;
pub mod plan;
pub mod quarantine;
pub mod scheduler;

/// A sequence's id, chosen by the caller (one per request).
pub type SeqId = u64;

pub use kv_blocks::{Alloc, KvBlocks, KvError, KvStats};
pub use plan::{LimitsError, PlannedChunk, SeqLimits, SeqView, StepLimits, StepPlan, plan_step};
pub use quarantine::{Quarantine, ShapeChunk, StallShape, Verdict};
pub use scheduler::{Admitted, Emitted, Finish, Rejection, Request, SchedConfig, SchedError, Scheduler};
