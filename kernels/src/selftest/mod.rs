//! The threshold self-test: derive the critical cases ([`catalogue`]), run each on the GPU
//! against the CPU twin in a child process with a deadline ([`runner`], [`worker`]), and
//! report derived vs. executed ([`report`]).

pub mod case;
pub mod catalogue;
pub mod deadline;
pub mod report;
pub mod runner;
pub mod session;
pub mod worker;

#[cfg(test)]
mod host_bench;

use crate::check::{Outcome, Staged};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Launch, PlanError};
use crate::limits::DeviceLimits;
use case::Case;

/// Runs one case on the GPU (in the worker process).
pub fn execute(gpu: &Gpu, case: &Case) -> Outcome {
    case.params.run(gpu, case.tokens).unwrap_or_else(GpuError::into_outcome)
}

/// The GPU half of one case (in the worker process): what is left is host work only.
pub fn stage(gpu: &Gpu, case: &Case) -> Staged {
    case.params.stage(gpu, case.tokens).unwrap_or_else(|e| Staged::Done(e.into_outcome()))
}

/// The launches a case makes, planned against `limits` (no GPU needed). Negative controls
/// return the plan of their fixed twin: their broken geometry is not a plan.
pub fn plans(case: &Case, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    case.params.plans(case.tokens, limits)
}
