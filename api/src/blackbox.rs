//! The black-box qualification's report (`brink-agent qualify --url`): prompts of the critical
//! lengths sent to a running engine through its OpenAI-compatible API, each with a deadline,
//! judged with the kernel self-test's case and verdict types.
//!
//! A case's `tokens` is its longest prompt (what a clamp limits: the longest prompt admitted);
//! its `batch` holds the prompt lengths sent together; `compared` the requests it sent.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::qualification::ReportSummary;
use crate::selftest::{CaseReport, CaseResult, Phase, Verdict};

/// Bumped when a field changes meaning; readers refuse reports of another schema.
pub const BLACKBOX_SCHEMA: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlackBoxReport {
    pub schema: u32,
    /// `brink-agent` version that produced the report.
    pub agent_version: String,
    /// The engine's base URL.
    pub url: String,
    /// The model name requested.
    pub model: String,
    /// The shape class the critical lengths were derived for (e.g. `qwen3moe-h2048-e128-top8-ffn768`).
    pub shape_class: String,
    pub top_k: u32,
    pub limits: EngineLimits,
    /// How prompts were sized: the engine's tokenizer endpoint, or calibration from its usage counts.
    pub sizing: String,
    /// How answers were checked for non-finite output (`logprobs`, or the text and token counts only).
    pub finite_check: String,
    /// Prompt tokens per second of the calibration request the first deadline derives from.
    pub calibration_tokens_per_s: Option<f64>,
    pub derived: u64,
    pub executed: u64,
    pub passed: u64,
    pub failed: u64,
    pub hung: u64,
    pub skipped: u64,
    /// Requests whose prompt the engine counted at another length than it was built for.
    pub length_mismatches: u64,
    /// Set when the engine stopped answering after a failure (the case, and what the health check saw).
    pub engine_died: Option<String>,
    pub verdict: Verdict,
    pub phases: Vec<Phase>,
    pub cases: Vec<CaseReport>,
}

/// The engine limits the lengths were derived from, and where the context came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineLimits {
    /// Tokens per sequence (prompt and generated).
    pub context: u64,
    /// e.g. `--context`, `GET /engine`, `GET /v1/models (max_model_len)`, `GET /props (n_ctx)`.
    pub context_source: String,
    pub max_batch_tokens: u64,
    pub prefill_chunk: u64,
}

impl BlackBoxReport {
    /// Fills the counters from the cases (the verdict is the caller's).
    pub fn count(&mut self) {
        let count = |r: CaseResult| self.cases.iter().filter(|c| c.result == r).count() as u64;
        self.derived = self.cases.len() as u64;
        self.skipped = count(CaseResult::Skipped);
        self.executed = self.derived - self.skipped;
        self.passed = count(CaseResult::Passed);
        self.failed = count(CaseResult::Failed);
        self.hung = count(CaseResult::Hung);
    }

    /// The engine may serve: everything passed, or it passed clamped.
    pub fn ok(&self) -> bool {
        matches!(self.verdict, Verdict::Qualified { .. } | Verdict::Clamped { .. })
    }

    /// The longest prompt the verdict admits; `None` when it refuses.
    pub fn max_prompt_tokens(&self) -> Option<u64> {
        match self.verdict {
            Verdict::Qualified { max_tokens } | Verdict::Clamped { max_tokens, .. } => Some(max_tokens),
            _ => None,
        }
    }
}

impl From<&BlackBoxReport> for ReportSummary {
    /// The black-box qualification has no negative controls in the run (its stand-ins are tests).
    fn from(r: &BlackBoxReport) -> ReportSummary {
        ReportSummary {
            derived: r.derived,
            executed: r.executed,
            passed: r.passed,
            failed: r.failed,
            hung: r.hung,
            skipped: r.skipped,
            negative_controls_missed: 0,
        }
    }
}
