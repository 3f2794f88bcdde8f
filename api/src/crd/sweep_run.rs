//! `SweepRun`: one firing of a `RegressionSweep`, owned by it. The operator writes both spec (a
//! snapshot of the sweep at firing time, so editing the sweep does not change a run under way)
//! and status (per-node progress, the run's verdict, regressions and outliers).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::regression_sweep::{BaselinePolicy, GridPoint, SweepSelfTest, SweepVerdict, WorkloadGrid};

/// Findings kept in a run's status (the per-node `SweepResult`s hold everything).
pub const MAX_FINDINGS: usize = 32;

#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "brink.dev",
    version = "v1alpha1",
    kind = "SweepRun",
    namespaced,
    status = "SweepRunStatus",
    derive = "PartialEq",
    shortname = "srun",
    category = "brink",
    doc = "One execution of a RegressionSweep over a set of nodes, with its verdict against the baselines and the fleet.",
    printcolumn(name = "Sweep", type_ = "string", json_path = ".spec.sweep"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Verdict", type_ = "string", json_path = ".status.verdict"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.counts.nodes"),
    printcolumn(name = "Regressed", type_ = "integer", json_path = ".status.counts.regressed"),
    printcolumn(name = "Outliers", type_ = "integer", json_path = ".status.counts.outliers"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.counts.failed"),
    printcolumn(name = "Scheduled", type_ = "date", json_path = ".spec.scheduledTime")
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("a SweepRun's spec is fixed when it is created"))]
#[serde(rename_all = "camelCase")]
pub struct SweepRunSpec {
    /// The `RegressionSweep` that fired.
    #[schemars(length(min = 1, max = 253))]
    pub sweep: String,
    /// The cron time this run stands for (not when it started).
    pub scheduled_time: Time,
    /// The `Model` (same namespace).
    #[schemars(length(min = 1, max = 253))]
    pub model: String,
    /// The nodes selected at firing time.
    #[schemars(length(max = 5000))]
    pub nodes: Vec<String>,
    /// The `ModelDeployment` (same namespace) whose replicas are measured through their
    /// engine's API, one per node (the sweep's `deploymentRef`); absent: brink's engine on each node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub deployment: Option<String>,
    pub workload: WorkloadGrid,
    pub self_test: SweepSelfTest,
    pub baseline: BaselinePolicy,
    pub max_concurrent_nodes: u32,
    pub drain_replicas: bool,
    pub node_timeout_seconds: u32,
    /// Extra self-test cases: batch shapes that stalled in serving since the sweep last ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub extra_cases: Vec<ExtraCase>,
}

/// A batch shape seen stalling in serving, replayed by the next sweep's self-test.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtraCase {
    /// Tokens in the stalled forward pass.
    pub tokens: u64,
    /// Sequences in it.
    pub sequences: u32,
    /// Where it was seen (`namespace/replica`, stage).
    pub source: String,
}

#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepRunStatus {
    #[serde(default)]
    pub phase: RunPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// One entry per node of the spec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["node".into()]))]
    pub nodes: Vec<NodeProgress>,
    /// The worst node verdict, once complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<SweepVerdict>,
    #[serde(default)]
    pub counts: RunCounts,
    /// The baseline each node was judged against, when the policy names one run for all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_run: Option<String>,
    /// The most important findings (regressions, failures, outliers), worst first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub findings: Vec<Finding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RunPhase {
    #[default]
    Pending,
    Running,
    /// Every node has a result (or was recorded as timed out, lost or skipped).
    Complete,
    /// Stopped by a newer run under `Replace`, or by the sweep's deletion.
    Cancelled,
}

/// Where one node is in the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeProgress {
    pub node: String,
    pub state: NodeRunState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<SweepVerdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NodeRunState {
    /// Waiting for a slot (`maxConcurrentNodes`).
    Waiting,
    /// Its serving replicas are being moved away.
    Draining,
    /// The node's agent is running the self-test and the grid.
    Running,
    /// Its `SweepResult` is in and judged.
    Done,
    /// No result within `nodeTimeoutSeconds` of its start.
    TimedOut,
    /// Its heartbeat expired mid-sweep, or the node was deleted.
    Lost,
    /// Not swept (replicas resident and `drainReplicas` false; not schedulable at start).
    Skipped,
}

impl NodeRunState {
    /// Nothing more will happen for the node in this run.
    pub fn is_final(self) -> bool {
        matches!(self, NodeRunState::Done | NodeRunState::TimedOut | NodeRunState::Lost | NodeRunState::Skipped)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCounts {
    pub nodes: u32,
    pub passed: u32,
    pub regressed: u32,
    pub outliers: u32,
    pub failed: u32,
    pub hung: u32,
    pub lost: u32,
    pub skipped: u32,
}

/// One thing a person should read about a run: a node, what, and by how much.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub node: String,
    pub verdict: SweepVerdict,
    /// The grid point, for benchmark findings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point: Option<GridPoint>,
    /// `outputTokensPerS`, `ttftP50S`, `itlP50S`, or the failing self-test case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// The node's value and what it was compared with (baseline or fleet median).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<f64>,
    /// Change against the reference, in percent (negative: lower).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_percent: Option<f64>,
    pub message: String,
}
