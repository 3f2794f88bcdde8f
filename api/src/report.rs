//! The qualification report of `brink-agent up`: what a person reads at a glance (rendered as a
//! table by the agent) and what the agent writes as JSON for tools and, in the fleet, for the
//! operator. Everything in it was measured in the run, or reused from the cache under an
//! unchanged fingerprint (`reused`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::device::DeviceReport;
use crate::qualification::{Envelope, Fingerprint, ReportSummary};
use crate::selftest::{Phase, Verdict};

/// Bumped when a field changes meaning.
pub const REPORT_SCHEMA: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QualificationReport {
    pub schema: u32,
    pub agent_version: String,
    pub device: DeviceReport,
    /// `cpu` or `cuda`: the backend the engine was started on.
    pub backend: String,
    pub model: ModelSummary,
    pub fingerprint: Fingerprint,
    /// What the cache decided, in a line (reuse, or why qualifying again).
    pub cache: String,
    /// True when the self-tests were not run because the cached result's fingerprint matched.
    pub reused: bool,
    /// The kernel threshold self-test.
    pub kernels: SuiteResult,
    /// The model-level threshold test (prefills at the derived counts through the whole model).
    pub model_test: SuiteResult,
    /// Both suites together: the qualification of the shape class on this node.
    pub verdict: Verdict,
    /// The limits the engine serves under; `None` when it may not serve.
    pub envelope: Option<Envelope>,
    pub bench: Option<BenchSummary>,
    pub backend_truth: BackendCheck,
    /// The node may serve this model: the verdict allows it and backend truth passed.
    pub ok: bool,
    /// Why not, when `ok` is false.
    pub refusal: Option<String>,
    pub phases: Vec<Phase>,
    /// Where it serves (`http://host:port`), once serving.
    pub url: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSummary {
    pub path: String,
    /// True for the built-in demo model (generated on first use).
    pub demo: bool,
    pub arch: String,
    pub shape_class: String,
    pub layers: u64,
    pub experts: u64,
    pub top_k: u64,
    pub context: u64,
}

/// One suite's counts and verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SuiteResult {
    pub summary: ReportSummary,
    pub verdict: Verdict,
}

/// The short benchmark through the server's HTTP API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BenchSummary {
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    /// Prompt tokens over the time to first token, one stream (median request).
    pub prefill_tokens_per_s: f64,
    /// One over the time per output token, one stream: (median e2e − median TTFT) / (tokens − 1).
    pub decode_tokens_per_s: f64,
    pub ttft_p50_s: f64,
    pub itl_p50_s: f64,
    /// Output tokens/s of all streams together at `concurrency`.
    pub concurrency: u64,
    pub aggregate_output_tokens_per_s: f64,
    pub requests: u64,
    pub failed: u64,
}

/// Backend truth as judged from outside the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum BackendCheck {
    Pass {
        detail: String,
    },
    Fail {
        reasons: Vec<String>,
    },
    /// Nothing failed, but the GPU claim could not be confirmed through the driver.
    Unverified {
        reason: String,
    },
    /// Not checked (the run stopped before it).
    NotRun {
        reason: String,
    },
}

impl BackendCheck {
    pub fn passed(&self) -> bool {
        matches!(self, BackendCheck::Pass { .. })
    }
}
