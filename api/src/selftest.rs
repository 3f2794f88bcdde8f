//! The kernel self-test report: derived vs. executed cases, their results, the negative
//! controls, the verdict for the shape class, and the wall time of each phase.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Bumped when a field changes meaning; readers refuse reports of another schema.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelfTestReport {
    pub schema: u32,
    /// `brink-agent` version that produced the report.
    pub agent_version: String,
    /// SHA-256 over every kernel source: part of the qualification fingerprint.
    pub kernel_sources_hash: String,
    pub device: DeviceSummary,
    /// The model shape class qualified (e.g. `qwen3moe-h2048-e128-top8-ffn768`).
    pub shape_class: String,
    /// Cases derived from the launch plans and the serving envelope (negative controls included).
    pub derived: u64,
    /// Cases actually run on the GPU.
    pub executed: u64,
    pub passed: u64,
    pub failed: u64,
    pub hung: u64,
    pub skipped: u64,
    pub negative_controls: NegativeControls,
    pub verdict: Verdict,
    pub phases: Vec<Phase>,
    pub cases: Vec<CaseReport>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSummary {
    /// False when no CUDA device was usable: plans and thresholds were checked on the CPU only.
    pub gpu: bool,
    pub name: String,
    /// e.g. `9.0`, `12.1`.
    pub compute_capability: String,
    pub sm_count: u32,
    pub total_mem_bytes: u64,
    pub free_mem_bytes: u64,
    /// e.g. `13.0` (the driver's CUDA version).
    pub driver_cuda_version: Option<String>,
    pub nvrtc_version: Option<String>,
    pub max_grid_dim: [u32; 3],
    pub max_shared_mem_per_block_optin: u32,
    /// Why there is no GPU, when `gpu` is false.
    pub no_gpu_reason: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NegativeControls {
    /// Cases of deliberately broken kernels that must be flagged.
    pub expected: u64,
    pub flagged: u64,
    /// Broken kernels the self-test did not catch: the self-test itself is not trustworthy.
    pub missed: u64,
    /// Why they did not run (e.g. a replica is resident), if they did not.
    pub not_run_reason: Option<String>,
    /// Digest of the fingerprint this run is under, when the caller keeps proofs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// An earlier run's proof the caller found for this run (counted only when its
    /// fingerprint is this run's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earlier_proof: Option<ControlsProof>,
}

/// What the self-test says about serving this shape class on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
// Fields camelCase like every other brink wire type (`rename_all` alone renames only the
// variants); the snake_case aliases still read qualification caches written before that.
#[serde(tag = "state", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Verdict {
    /// Every executed case passed; `maxTokens` is the largest count executed.
    Qualified {
        #[serde(alias = "max_tokens")]
        max_tokens: u64,
    },
    /// Every failure lies above every pass: serve with batch and chunk clamped to `maxTokens`.
    Clamped {
        #[serde(alias = "max_tokens")]
        max_tokens: u64,
        #[serde(alias = "first_failure")]
        first_failure: u64,
    },
    /// A failure below a passing count (a tail bug) or a self-test that cannot fail.
    Disqualified { reason: String },
    /// Nothing was executed (no GPU): plans and thresholds were checked on the CPU.
    NotQualified { reason: String },
    /// The cases would qualify or clamp, but the negative controls were not shown flagged on
    /// this device under this fingerprint (in this run or an earlier one): a self-test never
    /// shown able to fail proves nothing. Placement treats it as not qualified.
    ProofIncomplete { reason: String },
}

/// The negative controls a qualification must show flagged (the kernel name of their cases):
/// each a deliberately broken kernel the self-test has to catch.
pub const REQUIRED_CONTROLS: [&str; 2] = ["neg_gemv_gridz", "neg_latent_tailskip"];

/// That the negative controls were flagged on a device, kept with the fingerprint they were
/// flagged under (on the node's state), so a later run under the same fingerprint (e.g. with
/// a replica resident, when no broken kernel may run) still counts them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlsProof {
    /// Digest of the fingerprint they were flagged under (`Fingerprint::digest`).
    pub fingerprint: String,
    /// The control kernels flagged (of [`REQUIRED_CONTROLS`]).
    pub flagged: Vec<String>,
    /// When (RFC 3339).
    pub at: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Phase {
    pub name: String,
    pub seconds: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum CaseResult {
    Passed,
    Failed,
    /// Killed at its deadline.
    Hung,
    Skipped,
    /// Plans checked against device limits on the CPU (no GPU to run it).
    Planned,
    /// A negative control caught as expected.
    Flagged,
    /// A negative control that was not caught.
    Missed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaseReport {
    pub id: String,
    pub kernel: String,
    pub tokens: u64,
    /// Sequences making up the batch.
    pub batch: Vec<u64>,
    pub reasons: Vec<String>,
    /// `pass`, `launch_error`, `hang`.
    pub expect: String,
    pub result: CaseResult,
    /// What happened, in a line: the error, the mismatch, the skip reason.
    pub detail: String,
    pub max_rel_err: Option<f64>,
    pub tolerance: Option<f64>,
    pub compared: u64,
    pub kernel_ms: Option<f64>,
    /// Wall time from sending the case to its result (or the kill).
    pub wall_ms: f64,
}

impl SelfTestReport {
    pub fn ok(&self) -> bool {
        matches!(self.verdict, Verdict::Qualified { .. } | Verdict::Clamped { .. })
    }
}

/// The design's rule over executed cases, shared by the kernel and the model-level tests:
/// qualified when nothing failed (up to the largest passing count); clamped under the first
/// failure when every failure lies above every pass; disqualified when a failure (or hang) lies
/// below a passing count, or at one token (chunking cannot avoid either). Cases of negative
/// controls (kernel `neg_*`) and cases that did not run are not counted.
pub fn threshold_verdict(cases: &[CaseReport]) -> Verdict {
    let fixed = || cases.iter().filter(|c| !c.kernel.starts_with("neg_"));
    let max_pass = fixed().filter(|c| c.result == CaseResult::Passed).map(|c| c.tokens).max();
    let first_fail = fixed().filter(|c| matches!(c.result, CaseResult::Failed | CaseResult::Hung)).min_by_key(|c| c.tokens);
    match (first_fail, max_pass) {
        (None, max) => Verdict::Qualified { max_tokens: max.unwrap_or(0) },
        (Some(f), Some(p)) if p > f.tokens => Verdict::Disqualified {
            reason: format!("{} fails at {} tokens but {} tokens pass: chunking cannot avoid it ({})", f.kernel, f.tokens, p, f.detail),
        },
        (Some(f), _) if f.tokens <= 1 => {
            Verdict::Disqualified { reason: format!("{} fails at {} tokens ({})", f.kernel, f.tokens, f.detail) }
        }
        (Some(f), _) => Verdict::Clamped { max_tokens: f.tokens - 1, first_failure: f.tokens },
    }
}
