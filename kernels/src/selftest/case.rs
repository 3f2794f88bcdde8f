//! One self-test case: a kernel, a token count (and the batch it stands for), the parameters
//! of its problem, why the count is critical, and what must happen.

use serde::{Deserialize, Serialize};

use crate::ops;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// Stable id, e.g. `moe_gemm/q4_0/k8/t8192/max-padding`.
    pub id: String,
    /// Kernel family (`moe_gemm`, ...) or negative control (`neg_gemv_gridz`, ...).
    pub kernel: String,
    pub tokens: u64,
    /// The sequences whose tokens make up this batch (one entry: a single prompt).
    pub batch: Vec<u64>,
    /// Why this count is critical (derived from the launch plan and the serving envelope).
    pub reasons: Vec<String>,
    pub params: OpCase,
    pub expect: Expect,
    pub deadline_ms: u64,
    /// Device memory the case allocates, for the memory budget.
    pub device_bytes: u64,
}

/// The problem of each kernel family; each op module executes its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OpCase {
    Router(ops::router::RouterCase),
    MoeAlign(ops::moe_align::AlignCase),
    Quantize(ops::quantize::QuantizeCase),
    MoeGemv(ops::moe_gemv::GemvCase),
    MoeGemm(ops::moe_gemm::GemmCase),
    MoeCombine(ops::moe_combine::CombineCase),
    LatentProj(ops::latent_proj::LatentCase),
    Embed(ops::embed::EmbedCase),
    RmsNorm(ops::rmsnorm::RmsNormCase),
    Rope(ops::rope::RopeCase),
    OutputHead(ops::output_head::HeadCase),
    Sampling(ops::sampling::SamplingCase),
    Attention(ops::attention::AttentionCase),
    Linear(ops::linear::LinearCase),
    Swiglu(ops::swiglu::SwigluCase),
    Add(ops::add::AddCase),
    DenseF32(ops::dense_f32::DenseF32Case),
    /// Negative control: the routed GEMV with tokens x top_k on grid.z.
    NegGemvGridZ(ops::moe_gemv::GemvCase),
    /// Negative control: the latent epilogue whose tail lanes `continue` past the shuffles.
    NegLatentTailSkip(ops::latent_proj::LatentCase),
}

/// What a case must produce.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "expect", rename_all = "snake_case")]
pub enum Expect {
    /// Matches the CPU reference within tolerance, every element written, nothing past the end.
    Pass,
    /// The launch of `kernel` is rejected (a negative control above its limit).
    LaunchError { kernel: String },
    /// The kernel never finishes and is killed at the deadline (a negative control).
    Hang,
}

/// What executing a case on the GPU found (before it is judged against `Expect`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// The kernel ran; here is how its output compared.
    Ran(Check),
    /// The driver rejected a launch (or, in diagnostic mode, it faulted).
    LaunchError(crate::cuda::LaunchError),
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
    pub fn of_floats(err: &crate::selftest::verify::RelErr, tolerance: f64, (unwritten, past_end): (u64, u64), kernel_ms: f64) -> Check {
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
