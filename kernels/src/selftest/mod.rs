//! The threshold self-test: derive the critical cases ([`catalogue`]), run each on the GPU
//! against the CPU twin in a child process with a deadline ([`runner`], [`worker`]), and
//! report derived vs. executed ([`report`]).

pub mod case;
pub mod catalogue;
pub mod deadline;
pub mod report;
pub mod runner;
pub mod session;
pub mod verify;
pub mod worker;

use crate::cuda::{Gpu, GpuError};
use crate::launch::{Launch, PlanError};
use crate::limits::DeviceLimits;
use crate::ops::attention;
use crate::ops::{
    add, dense_f32, embed, latent_proj, linear, moe_align, moe_combine, moe_gemm, moe_gemv, output_head, quantize, rmsnorm, rope, router,
    sampling, swiglu,
};
use case::{Case, OpCase, Outcome};

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

/// Runs one case on the GPU (in the worker process).
pub fn execute(gpu: &Gpu, case: &Case) -> Outcome {
    let t = case.tokens;
    let r = match &case.params {
        OpCase::Router(c) => router::run_case(gpu, t, c),
        OpCase::MoeAlign(c) => moe_align::run_case(gpu, t, c),
        OpCase::Quantize(c) => quantize::run_case(gpu, t, c),
        OpCase::MoeGemv(c) => moe_gemv::run_case(gpu, t, c),
        OpCase::MoeGemm(c) => moe_gemm::run_case(gpu, t, c),
        OpCase::MoeCombine(c) => moe_combine::run_case(gpu, t, c),
        OpCase::LatentProj(c) => latent_proj::run_case(gpu, t, c),
        OpCase::Embed(c) => embed::run_case(gpu, t, c),
        OpCase::RmsNorm(c) => rmsnorm::run_case(gpu, t, c),
        OpCase::Rope(c) => rope::run_case(gpu, t, c),
        OpCase::OutputHead(c) => output_head::run_case(gpu, t, c),
        OpCase::Sampling(c) => sampling::run_case(gpu, t, c),
        OpCase::Attention(c) => attention::run_case(gpu, t, c),
        OpCase::Linear(c) => linear::run_case(gpu, t, c),
        OpCase::Swiglu(c) => swiglu::run_case(gpu, t, c),
        OpCase::Add(c) => add::run_case(gpu, t, c),
        OpCase::DenseF32(c) => dense_f32::run_case(gpu, t, c),
        OpCase::NegGemvGridZ(c) => moe_gemv::run_negative_gridz(gpu, t, c),
        OpCase::NegLatentTailSkip(c) => latent_proj::run_negative_tailskip(gpu, t, c),
    };
    r.unwrap_or_else(GpuError::into_outcome)
}

/// The launches a case makes, planned against `limits` (no GPU needed). Negative controls
/// return the plan of their fixed twin: their broken geometry is not a plan.
pub fn plans(case: &Case, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    let t = case.tokens;
    match &case.params {
        OpCase::Router(c) => router::plans(t, c, limits),
        OpCase::MoeAlign(c) => moe_align::plans(t, c, limits),
        OpCase::Quantize(c) => quantize::plans(t, c, limits),
        OpCase::MoeGemv(c) | OpCase::NegGemvGridZ(c) => moe_gemv::plans(t, c, limits),
        OpCase::MoeGemm(c) => moe_gemm::plans(t, c, limits),
        OpCase::MoeCombine(c) => moe_combine::plans(t, c, limits),
        OpCase::LatentProj(c) | OpCase::NegLatentTailSkip(c) => latent_proj::plans(t, c, limits),
        OpCase::Embed(c) => embed::plans(t, c, limits),
        OpCase::RmsNorm(c) => rmsnorm::plans(t, c, limits),
        OpCase::Rope(c) => rope::plans(t, c, limits),
        OpCase::OutputHead(c) => output_head::plans(t, c, limits),
        OpCase::Sampling(c) => sampling::plans(t, c, limits),
        OpCase::Attention(c) => attention::plans(t, c, limits),
        OpCase::Linear(c) => linear::plans(t, c, limits),
        OpCase::Swiglu(c) => swiglu::plans(t, c, limits),
        OpCase::Add(c) => add::plans(t, c, limits),
        OpCase::DenseF32(c) => dense_f32::plans(t, c, limits),
    }
}
