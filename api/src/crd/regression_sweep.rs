//! `RegressionSweep`: a nightly (or any cron) check of the fleet. Each firing becomes a `SweepRun`
//! over the selected nodes; each node's agent runs the threshold self-test and a benchmark grid
//! and writes a `SweepResult`; the operator judges every node against its baseline and against
//! the fleet median of identical hardware.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::model_deployment::ModelRef;

#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "brink.dev",
    version = "v1alpha1",
    kind = "RegressionSweep",
    namespaced,
    status = "RegressionSweepStatus",
    derive = "PartialEq",
    shortname = "rsweep",
    category = "brink",
    doc = "A scheduled regression sweep: the self-test and a benchmark grid on a set of nodes, judged against baselines and the fleet.",
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(name = "Last Run", type_ = "string", json_path = ".status.lastRun"),
    printcolumn(name = "Verdict", type_ = "string", json_path = ".status.lastVerdict"),
    printcolumn(name = "Last Schedule", type_ = "date", json_path = ".status.lastScheduleTime"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(
    validation = Rule::new("self.baseline.policy != 'Pinned' || has(self.baseline.pinnedRun)").message("baseline.policy Pinned needs baseline.pinnedRun (the SweepRun to compare with)")
)]
#[serde(rename_all = "camelCase")]
pub struct RegressionSweepSpec {
    /// Cron schedule, evaluated in UTC: five fields (minute hour day-of-month month day-of-week)
    /// or a macro (`@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`).
    #[schemars(length(min = 1, max = 128))]
    pub schedule: String,
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
    /// A firing missed by more than this many seconds (operator down, previous run still active
    /// under `Forbid`) is skipped instead of started late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86_400))]
    pub starting_deadline_seconds: Option<u32>,
    /// No new runs while true; an active run continues.
    #[serde(default)]
    pub suspend: bool,
    /// Finished runs kept whose verdict was `Pass` (the baseline run is always kept).
    #[serde(default = "default_successful_history")]
    #[schemars(range(min = 0, max = 100))]
    pub successful_runs_history_limit: u32,
    /// Finished runs kept whose verdict was anything else.
    #[serde(default = "default_failed_history")]
    #[schemars(range(min = 0, max = 100))]
    pub failed_runs_history_limit: u32,
    /// Labels a node must carry to be swept (its Kubernetes `Node` labels).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Nodes swept at the same time.
    #[serde(default = "default_max_concurrent_nodes")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_concurrent_nodes: u32,
    /// Move a node's serving replicas away before sweeping it (a sweep must not measure against
    /// live traffic). When false, nodes with resident replicas are skipped and say so.
    #[serde(default = "default_true")]
    pub drain_replicas: bool,
    pub model_ref: ModelRef,
    /// Sweep this `ModelDeployment`'s replicas (same namespace) through their engine's HTTP API
    /// instead of brink's engine started on the node: a deployment on another engine (vLLM,
    /// SGLang, llama.cpp). Each selected node that runs one of its replicas (a gang's leader
    /// node) measures that replica, as `brink-agent sweep --url` does: the black-box
    /// qualification in the self-test's place, then the grid at the replica's serving limits.
    /// The deployment's own replicas are what is measured, so they are neither drained nor a
    /// reason to skip the node; `modelRef` names the deployment's Model (its shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_ref: Option<DeploymentRef>,
    pub workload: WorkloadGrid,
    #[serde(default)]
    pub self_test: SweepSelfTest,
    #[serde(default)]
    pub baseline: BaselinePolicy,
    /// A node that has not written its result this long after it started is recorded as timed out.
    #[serde(default = "default_node_timeout")]
    #[schemars(range(min = 60, max = 86_400))]
    pub node_timeout_seconds: u32,
}

/// A `ModelDeployment` by name, in the sweep's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeploymentRef {
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
}

fn default_successful_history() -> u32 {
    10
}
fn default_failed_history() -> u32 {
    5
}
fn default_max_concurrent_nodes() -> u32 {
    1
}
fn default_true() -> bool {
    true
}
fn default_node_timeout() -> u32 {
    3600
}

/// What a firing does while an earlier run is still active (CronJob semantics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConcurrencyPolicy {
    /// Start the new run beside the active one.
    Allow,
    /// Skip the firing (it is retried until its starting deadline passes).
    #[default]
    Forbid,
    /// Stop the active run and start the new one.
    Replace,
}

/// The benchmark grid every node runs: each prompt length x concurrency x generated tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadGrid {
    #[schemars(length(min = 1, max = 16), inner(range(min = 1, max = 1_048_576)))]
    pub prompt_tokens: Vec<u32>,
    #[schemars(length(min = 1, max = 16), inner(range(min = 1, max = 1024)))]
    pub concurrency: Vec<u32>,
    #[schemars(length(min = 1, max = 16), inner(range(min = 1, max = 65_536)))]
    pub generated_tokens: Vec<u32>,
    /// Requests per grid point (at least the concurrency: each stream sends one or more).
    #[serde(default = "default_requests_per_point")]
    #[schemars(range(min = 1, max = 10_000))]
    pub requests_per_point: u32,
}

fn default_requests_per_point() -> u32 {
    16
}

impl WorkloadGrid {
    /// The grid points in a fixed order (prompt, then concurrency, then generated tokens).
    pub fn points(&self) -> Vec<GridPoint> {
        let mut points = Vec::new();
        for &prompt_tokens in &self.prompt_tokens {
            for &concurrency in &self.concurrency {
                for &generated_tokens in &self.generated_tokens {
                    points.push(GridPoint { prompt_tokens, concurrency, generated_tokens });
                }
            }
        }
        points
    }
}

/// One point of a workload grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GridPoint {
    pub prompt_tokens: u32,
    pub concurrency: u32,
    pub generated_tokens: u32,
}

impl std::fmt::Display for GridPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "p{}xc{}xg{}", self.prompt_tokens, self.concurrency, self.generated_tokens)
    }
}

/// The threshold self-test part of a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SweepSelfTest {
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The deliberate hangs; they run only on a node with no resident replica.
    #[serde(default = "default_true")]
    pub negative_controls: bool,
}

impl Default for SweepSelfTest {
    fn default() -> SweepSelfTest {
        SweepSelfTest { enabled: true, negative_controls: true }
    }
}

/// What each node is compared with, and how much worse counts as a regression.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BaselinePolicy {
    #[serde(default)]
    pub policy: BaselineKind,
    /// The `SweepRun` compared with under `Pinned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pinned_run: Option<String>,
    #[serde(default)]
    pub tolerance: Tolerance,
    /// A node further than this from the median of identical nodes in the same run is an outlier.
    #[serde(default = "default_outlier_tolerance")]
    #[schemars(range(min = 1, max = 1000))]
    pub outlier_tolerance_percent: u32,
}

fn default_outlier_tolerance() -> u32 {
    15
}

impl Default for BaselinePolicy {
    fn default() -> BaselinePolicy {
        BaselinePolicy {
            policy: BaselineKind::default(),
            pinned_run: None,
            tolerance: Tolerance::default(),
            outlier_tolerance_percent: default_outlier_tolerance(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum BaselineKind {
    /// Each node's own result in the latest run where it passed.
    #[default]
    LastPassing,
    /// Each node's result in `pinnedRun`.
    Pinned,
}

/// Allowed change against the baseline, in percent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tolerance {
    /// Tokens/s may fall this much.
    #[serde(default = "default_throughput_tolerance")]
    #[schemars(range(min = 0, max = 1000))]
    pub throughput_percent: u32,
    /// Time to first token and inter-token latency may rise this much.
    #[serde(default = "default_latency_tolerance")]
    #[schemars(range(min = 0, max = 1000))]
    pub latency_percent: u32,
}

fn default_throughput_tolerance() -> u32 {
    10
}
fn default_latency_tolerance() -> u32 {
    20
}

impl Default for Tolerance {
    fn default() -> Tolerance {
        Tolerance { throughput_percent: default_throughput_tolerance(), latency_percent: default_latency_tolerance() }
    }
}

#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegressionSweepStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The scheduled time of the latest firing that started a run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// When the latest run that passed finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<Time>,
    /// Runs not yet complete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_verdict: Option<SweepVerdict>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// A verdict, for a grid point, a node or a whole run: the worst of its parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SweepVerdict {
    /// Within tolerance of the baseline (or no baseline yet) and not an outlier.
    Pass,
    /// Drifted from the fleet median of identical nodes beyond the outlier tolerance.
    Outlier,
    /// Worse than the baseline beyond the tolerance.
    Regressed,
    /// A self-test case failed or requests failed.
    Failed,
    /// A case or the benchmark hung, or the node did not finish in time.
    Hung,
    /// The node went away mid-sweep (its heartbeat expired or its agent stopped answering).
    Lost,
}

impl SweepVerdict {
    /// Every verdict but `Pass` is news a person should read.
    pub fn passed(self) -> bool {
        self == SweepVerdict::Pass
    }
}
