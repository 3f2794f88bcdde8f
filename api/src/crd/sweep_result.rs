//! `SweepResult`: one node's results for one `SweepRun`, owned by the run. Kept per node so that a
//! run over a thousand nodes stays far below the object size limit. The node's agent writes the
//! measurements (field manager `brink-agent`); the operator adds its judgement (`judgement`,
//! field manager `brink-operator`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::regression_sweep::{GridPoint, SweepVerdict};
use super::spark_node::{FailingCase, NodeFingerprint};
use super::sweep_run::Finding;
use crate::qualification::ReportSummary;

#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "brink.dev",
    version = "v1alpha1",
    kind = "SweepResult",
    namespaced,
    status = "SweepResultStatus",
    derive = "PartialEq",
    shortname = "sres",
    category = "brink",
    doc = "One node's self-test and benchmark results in one SweepRun, and their verdict.",
    printcolumn(name = "Run", type_ = "string", json_path = ".spec.run"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Verdict", type_ = "string", json_path = ".status.judgement.verdict"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("a SweepResult's spec names its run and node and does not change"))]
#[serde(rename_all = "camelCase")]
pub struct SweepResultSpec {
    #[schemars(length(min = 1, max = 253))]
    pub run: String,
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
}

/// The name of `node`'s result in `run`.
pub fn result_name(run: &str, node: &str) -> String {
    format!("{run}-{node}")
}

#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepResultStatus {
    #[serde(default)]
    pub state: ResultState,
    /// What the measurements were taken on (identical hardware is judged together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<NodeFingerprint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_test: Option<SelfTestOutcome>,
    /// One entry per grid point, in the grid's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    pub points: Vec<PointFigures>,
    /// Why the node could not finish (the engine did not start, the model is missing, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The operator's verdict on the figures above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judgement: Option<Judgement>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ResultState {
    #[default]
    Running,
    /// Every step ran (whatever the figures say).
    Done,
    /// The node could not finish; `error` says why.
    Failed,
}

/// The threshold self-test's outcome on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelfTestOutcome {
    pub summary: ReportSummary,
    /// The failing, hung and missed cases with the fewest tokens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub failing_cases: Vec<FailingCase>,
    /// Whether the negative controls ran (only with no replica resident).
    pub negative_controls_ran: bool,
}

/// A grid point's figures on one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PointFigures {
    pub point: GridPoint,
    /// Requests that completed.
    pub requests: u64,
    /// Requests that failed or were rejected.
    pub failed: u64,
    /// Requests still unanswered when the point's deadline passed (a hang).
    #[serde(default)]
    pub timed_out: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_p50_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_p99_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_p50_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_p99_s: Option<f64>,
    /// The first failure's kind (status code or error), when any request failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The operator's verdict on one node's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Judgement {
    pub verdict: SweepVerdict,
    /// The `SweepRun` whose result for this node was the baseline (none: the first run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_run: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub findings: Vec<Finding>,
}
