//! The model-level threshold test's report: whole forward passes of the real model at the
//! critical token counts (single prompts, four sequences, prefill mixed with decode), each
//! compared with the same sequences computed alone, each with a deadline.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::qualification::ServingParams;
use crate::selftest::{CaseReport, CaseResult, Phase, Verdict, threshold_verdict};

/// Bumped when a field changes meaning; readers refuse reports of another schema.
pub const MODEL_TEST_SCHEMA: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelTestReport {
    pub schema: u32,
    pub agent_version: String,
    /// The model file tested.
    pub model: String,
    /// Its shape class (empty when the model could not be loaded).
    pub shape_class: String,
    /// Backend the forward passes ran on (`cpu`, `cuda`).
    pub backend: String,
    /// The serving envelope the counts were derived for.
    pub serving: ServingParams,
    /// Counts above this were derived but not run (`None`: no cap).
    pub max_tokens: Option<u64>,
    /// Device limits the counts were derived against (the device's own, or a recorded one).
    pub limits: String,
    /// Throughput of the calibration prefill (reference chunking) the deadlines derive from.
    pub calibration_tokens_per_s: Option<f64>,
    /// Largest accepted normalised max abs difference of the last-position logits.
    pub tolerance: f64,
    /// Distinct critical token counts a forward pass can reach (<= max batch tokens).
    pub counts_derived: u64,
    /// Critical counts of the kernel catalogue above max batch tokens: no step runs them.
    pub counts_unreachable: u64,
    /// Cases (count x batch composition).
    pub derived: u64,
    pub executed: u64,
    pub passed: u64,
    pub failed: u64,
    pub hung: u64,
    pub skipped: u64,
    pub verdict: Verdict,
    pub phases: Vec<Phase>,
    pub cases: Vec<CaseReport>,
    /// Rows of the steps under test, over the cases that compared (reports before these fields
    /// read 0).
    #[serde(default)]
    pub step_tokens: u64,
    /// Tokens of the decode sequences' prompts, cached before their steps.
    #[serde(default)]
    pub setup_tokens: u64,
    /// Tokens run for the expected logits: each shared prompt stream once, plus any sequence
    /// computed alone.
    #[serde(default)]
    pub reference_tokens: u64,
}

impl ModelTestReport {
    /// Fills the counters and the verdict from the cases (the kernel self-test's rule).
    pub fn summarise(&mut self) {
        let count = |r: CaseResult| self.cases.iter().filter(|c| c.result == r).count() as u64;
        self.derived = self.cases.len() as u64;
        self.skipped = count(CaseResult::Skipped);
        self.executed = self.derived - self.skipped;
        self.passed = count(CaseResult::Passed);
        self.failed = count(CaseResult::Failed);
        self.hung = count(CaseResult::Hung);
        self.verdict = if self.executed == 0 {
            Verdict::NotQualified { reason: "no model-level case was executed".into() }
        } else {
            threshold_verdict(&self.cases)
        };
    }

    pub fn ok(&self) -> bool {
        matches!(self.verdict, Verdict::Qualified { .. } | Verdict::Clamped { .. })
    }
}

/// `brink-agent selftest --model FILE --json`: the kernel self-test for the model's shape class
/// and the model-level test of the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelfTestWithModel {
    pub kernels: crate::selftest::SelfTestReport,
    pub model: ModelTestReport,
}
