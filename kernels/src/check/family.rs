//! The self-test's view of a kernel family: each module under `ops/` implements
//! [`KernelFamily`] once, and `selftest::case` registers it in one line; the self-test then
//! runs and plans every case through the trait.

use crate::cuda::{Gpu, GpuError};
use crate::launch::{Launch, PlanError};
use crate::limits::DeviceLimits;

use super::{Outcome, Staged};

pub trait KernelFamily {
    /// The problem of one case (shape, weight type, routing, ...), without the token count.
    type Case;
    /// A deliberately broken kernel whose failure (launch error or hang) the self-test expects.
    const NEGATIVE_CONTROL: bool = false;

    /// Runs the case at `tokens` on the GPU and compares it with the CPU twin.
    fn run(gpu: &Gpu, tokens: u64, case: &Self::Case) -> Result<Outcome, GpuError>;

    /// The GPU half of [`Self::run`]: launches, timing and downloads, leaving the CPU twin and
    /// the comparison as a [`Staged::Check`] the self-test runs on other cores while the device
    /// goes on with the next case. Families whose twin is cheap keep the default (everything in
    /// [`Self::run`]); `run` must equal `stage(..)?.finish()`.
    fn stage(gpu: &Gpu, tokens: u64, case: &Self::Case) -> Result<Staged, GpuError> {
        Self::run(gpu, tokens, case).map(Staged::Done)
    }

    /// The launches the case makes at `tokens`, planned against `limits` (no GPU needed). A
    /// negative control gives the plans of its fixed twin: its broken geometry is not a plan.
    fn plans(tokens: u64, case: &Self::Case, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError>;
}
