//! What running one self-test case on the GPU found: the [`Outcome`], and for a kernel that
//! ran, the [`Check`] of its output against the CPU twin; and [`Staged`], a case split into its
//! GPU half and its host half ([`HostCheck`]).

use serde::{Deserialize, Serialize};

use super::compare::RelErr;
use crate::cuda::{GpuError, LaunchError};

/// What executing a case on the GPU found (before it is judged against `Expect`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// The kernel ran; here is how its output compared.
    Ran(Check),
    /// The driver rejected a launch (or, in diagnostic mode, it faulted).
    LaunchError(LaunchError),
    /// The plan refused the shape before anything was launched.
    PlanRejected { error: String },
    /// Any other CUDA failure (allocation, copy).
    Error { error: String },
}

/// Comparison of a GPU output with the CPU reference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// max |gpu − ref| / max |ref| over the compared values.
    pub max_rel_err: f64,
    pub tolerance: f64,
    /// Values compared against the reference (all of them, or sampled rows for big outputs).
    pub compared: u64,
    /// Output items still holding the poison after the kernel (must be 0).
    pub unwritten: u64,
    /// Guard words past the end of the output that were overwritten (must be 0).
    pub past_end: u64,
    /// Exact mismatches of integer outputs (ids, offsets), if the kernel has any.
    pub int_mismatches: u64,
    /// Kernel time in milliseconds (launch to synchronise), data generation excluded.
    pub kernel_ms: f64,
    /// First problem found, for the report.
    pub note: String,
}

impl Check {
    /// The check of a float output compared through `err`, with the poison scan's
    /// `(unwritten, past_end)`.
    pub fn of_floats(err: &RelErr, tolerance: f64, (unwritten, past_end): (u64, u64), kernel_ms: f64) -> Check {
        Check {
            max_rel_err: err.value(),
            tolerance,
            compared: err.compared,
            unwritten,
            past_end,
            int_mismatches: 0,
            kernel_ms,
            note: err.describe(),
        }
    }

    pub fn passed(&self) -> bool {
        self.max_rel_err <= self.tolerance
            && self.max_rel_err.is_finite()
            && self.unwritten == 0
            && self.past_end == 0
            && self.int_mismatches == 0
    }
}

/// The host half of a case whose GPU half is done: the CPU twin and the comparison, over host
/// data only (everything it needs from the device was downloaded before it was made), so it
/// can run on other cores while the device runs the next case.
pub type HostCheck = Box<dyn FnOnce() -> Outcome + Send + 'static>;

/// What the GPU half of a case left: the outcome already, or the host check still to run.
pub enum Staged {
    Done(Outcome),
    Check(HostCheck),
}

impl Staged {
    /// Runs the host check, if one is left (on the caller's thread).
    pub fn finish(self) -> Outcome {
        match self {
            Staged::Done(o) => o,
            Staged::Check(f) => f(),
        }
    }
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Staged::Done(o) => f.debug_tuple("Done").field(o).finish(),
            Staged::Check(_) => f.write_str("Check(..)"),
        }
    }
}

impl GpuError {
    /// How a failed case reads in the report.
    pub fn into_outcome(self) -> Outcome {
        match self {
            GpuError::Launch(e) => Outcome::LaunchError(*e),
            GpuError::Plan(e) => Outcome::PlanRejected { error: e.to_string() },
            other => Outcome::Error { error: other.to_string() },
        }
    }
}
