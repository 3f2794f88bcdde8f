//! One self-test case: a kernel, a token count (and the batch it stands for), the parameters
//! of its problem, why the count is critical, and what must happen.

use serde::{Deserialize, Serialize};

use crate::check::{KernelFamily, Outcome, Staged};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Launch, PlanError};
use crate::limits::DeviceLimits;
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

/// Every kernel family the self-test runs, one line each: the case's tag (`op` in JSON, snake
/// case) and the family's [`KernelFamily`] in its `ops` module. [`OpCase`] holds a case of any
/// of them; running and planning go through the family's trait.
macro_rules! families {
    ($($(#[$doc:meta])* $variant:ident => $family:ty,)*) => {
        /// The problem of one case, of one of the registered families.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "op", rename_all = "snake_case")]
        pub enum OpCase {
            $($(#[$doc])* $variant(<$family as KernelFamily>::Case),)*
        }

        impl OpCase {
            /// Runs the case at `tokens` on the GPU ([`KernelFamily::run`]).
            pub fn run(&self, gpu: &Gpu, tokens: u64) -> Result<Outcome, GpuError> {
                match self {
                    $(OpCase::$variant(c) => <$family as KernelFamily>::run(gpu, tokens, c),)*
                }
            }

            /// The GPU half of the case at `tokens` ([`KernelFamily::stage`]).
            pub fn stage(&self, gpu: &Gpu, tokens: u64) -> Result<Staged, GpuError> {
                match self {
                    $(OpCase::$variant(c) => <$family as KernelFamily>::stage(gpu, tokens, c),)*
                }
            }

            /// The case's launches at `tokens` ([`KernelFamily::plans`]).
            pub fn plans(&self, tokens: u64, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
                match self {
                    $(OpCase::$variant(c) => <$family as KernelFamily>::plans(tokens, c, limits),)*
                }
            }

            pub fn is_negative_control(&self) -> bool {
                match self {
                    $(OpCase::$variant(_) => <$family as KernelFamily>::NEGATIVE_CONTROL,)*
                }
            }
        }
    };
}

families! {
    Router => ops::router::Family,
    MoeAlign => ops::moe_align::Family,
    Quantize => ops::quantize::Family,
    MoeGemv => ops::moe_gemv::Family,
    /// Decode gate/up GEMVs with SwiGLU and q8_1 in the epilogue.
    MoeGemvSwiglu => ops::moe_gemv_fused::GateUpFamily,
    /// Decode down GEMV with the weighted combine over the slots in the epilogue.
    MoeGemvCombine => ops::moe_gemv_fused::CombineFamily,
    MoeGemm => ops::moe_gemm::Family,
    MoeCombine => ops::moe_combine::Family,
    LatentProj => ops::latent_proj::Family,
    Embed => ops::embed::Family,
    RmsNorm => ops::rmsnorm::Family,
    /// The hidden norm that also writes its q8_1 quantization (decode's quantize launches skipped).
    RmsNormQ8_1 => ops::rmsnorm_q8_1::Family,
    Rope => ops::rope::Family,
    /// Qwen3's per-head Q/K norm fused with NEOX RoPE (one launch per tensor instead of two).
    NormRope => ops::norm_rope::Family,
    OutputHead => ops::output_head::Family,
    Sampling => ops::sampling::Family,
    Attention => ops::attention::Family,
    Linear => ops::linear::Family,
    /// q, k and v of one input: one launch at decode (`output_head_gemv3`), `linear`'s above.
    Qkv => ops::qkv::Family,
    Swiglu => ops::swiglu::Family,
    Add => ops::add::Family,
    /// gpt-oss's biases: `x += bias` per row (projections, router), or the picked expert's per pair.
    Bias => ops::bias::Family,
    DenseF32 => ops::dense_f32::Family,
    /// Negative control: the routed GEMV with tokens x top_k on grid.z.
    NegGemvGridZ => ops::moe_gemv::NegGridZ,
    /// Negative control: the latent epilogue whose tail lanes `continue` past the shuffles.
    NegLatentTailSkip => ops::latent_proj::NegTailSkip,
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
