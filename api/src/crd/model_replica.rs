//! `ModelReplica`: one replica of a deployment bound to one node. The operator writes the spec
//! and owns the replica Pod through it; the Pod's agent writes the status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::model_deployment::{EngineBuild, GangSettings, Serving};
use crate::qualification::Envelope;

#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "brink.dev",
    version = "v1alpha1",
    kind = "ModelReplica",
    namespaced,
    status = "ModelReplicaStatus",
    derive = "PartialEq",
    shortname = "mrep",
    category = "brink",
    doc = "One replica of a ModelDeployment, bound to one node; owns its replica Pod.",
    printcolumn(name = "Deployment", type_ = "string", json_path = ".spec.deployment"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "Workers", type_ = "string", json_path = ".spec.gang.workers", priority = 1),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoint", priority = 1),
    printcolumn(name = "Restarts", type_ = "integer", json_path = ".status.restarts"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("self.node == oldSelf.node").message("a replica is bound to its node: create a new replica to move it"))]
#[x_kube(validation = Rule::new("has(self.gang) == has(oldSelf.gang) && (!has(self.gang) || self.gang.workers == oldSelf.gang.workers)").message("a gang is bound to its nodes: create a new replica to move it"))]
#[serde(rename_all = "camelCase")]
pub struct ModelReplicaSpec {
    /// The owning `ModelDeployment` (same namespace).
    #[schemars(length(min = 1, max = 253))]
    pub deployment: String,
    /// The Kubernetes `Node` (and `SparkNode`) the replica runs on (a gang's leader, rank 0).
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
    /// The `Model` (same namespace).
    #[schemars(length(min = 1, max = 253))]
    pub model: String,
    /// Hash of the model and engine build: what a rollout compares.
    #[schemars(length(min = 1, max = 128))]
    pub revision: String,
    pub engine: EngineBuild,
    /// The limits this replica serves under: the deployment's, clamped to the node's envelope.
    pub serving: Serving,
    /// Set for a replica over several nodes: its workers and their fabric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<ReplicaGang>,
}

/// The members of a gang beyond its leader (`spec.node`), as placed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaGang {
    /// The workers' nodes, rank 1 first.
    #[schemars(length(min = 1, max = 63))]
    pub workers: Vec<String>,
    /// The fabric the members share (the value of the deployment's fabric label).
    #[schemars(length(min = 1, max = 63))]
    pub fabric: String,
    /// Every member's node carries `brink.dev/rdma: "true"`: the Pods get the RDMA devices.
    #[serde(default)]
    pub rdma: bool,
    /// The deployment's interface settings when the gang was placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<GangSettings>,
}

impl ModelReplicaSpec {
    /// Every node the replica runs on, leader first.
    pub fn nodes(&self) -> Vec<&str> {
        std::iter::once(self.node.as_str()).chain(self.gang.iter().flat_map(|g| g.workers.iter().map(String::as_str))).collect()
    }
}

#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelReplicaStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub phase: ReplicaPhase,
    /// `host:port` of the engine's HTTP server, once serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Model download progress on the node, while `Downloading`.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "progress_or_empty")]
    #[schemars(with = "Option<DownloadProgress>")]
    pub download: Option<DownloadProgress>,
    /// The envelope the replica's own self-test validated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope: Option<Envelope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<Throughput>,
    /// Engine restarts since the replica was created.
    #[serde(default)]
    pub restarts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stall: Option<StallReport>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The operator's record of replica Pods that failed on a healthy node and were replaced
    /// (with an exponential backoff); cleared once a Pod has served for a while.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_failures: Option<PodFailures>,
    /// What the replica proved before `/ready` (its own model-level threshold test, or the
    /// node's result for the same key and fingerprint, and backend truth), as its Pod reported
    /// it to the node's agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qualification: Option<ReplicaQualification>,
}

/// What a replica Pod proved before `/ready`: written by its `serve` on the node, published by
/// the node's agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaQualification {
    /// The model's shape key tested.
    pub shape_class: String,
    /// The model-level verdict's state: `qualified`, `clamped`, `disqualified`, `notQualified`
    /// or `proofIncomplete`.
    pub model_test_state: String,
    /// The verdict in a line.
    pub model_test_message: String,
    /// The node's earlier result for the same key and fingerprint was reused (no test ran in
    /// this Pod).
    #[serde(default)]
    pub reused: bool,
    /// The failed and hung model-level cases, smallest count first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub failing_cases: Vec<super::FailingCase>,
    /// Seconds the model-level test took in this Pod (model load included); absent when reused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_test_seconds: Option<f64>,
    /// Why `/ready` is held, while it is (the replica is not Ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// The last ready check of an engine: the hold, else backend truth checked from outside the
    /// engine (backend, device, the driver's process list): `passed: ...` or `failed: ...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_check: Option<String>,
    /// Seconds from the start of the Pod's `serve` to its first ready answer (model load and
    /// the model-level test included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_to_ready: Option<f64>,
    /// Which test gave the verdict: `modelTest` (brink's own `serve`, before `/ready`) or
    /// `blackBox` (another engine's qualification sidecar, `brink-agent qualify --url` over the
    /// engine's HTTP API). Absent in reports of agents that predate it (`modelTest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<QualificationMethod>,
    /// The longest prompt (tokens) the verdict admits: the tested context when it passed,
    /// under the first failure when it passed clamped; absent when refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_prompt_tokens: Option<u64>,
    /// The shortest failing prompt (tokens) of a clamped verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure_tokens: Option<u64>,
}

/// Which test a replica's qualification report comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum QualificationMethod {
    /// brink's `serve`: the model-level threshold test in the Pod, before `/ready`.
    ModelTest,
    /// The qualification sidecar of another engine: `brink-agent qualify --url` against the
    /// engine's HTTP API; the Pod is Ready only once it passed (or passed clamped).
    BlackBox,
}

impl ReplicaQualification {
    /// The verdict admits only prompts shorter than the context: `clamped`.
    pub fn is_clamped(&self) -> bool {
        self.model_test_state == "clamped"
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodFailures {
    /// Failed Pods in a row (the backoff doubles with each).
    pub count: u32,
    pub last_failure_time: Time,
    /// The uid of the Pod that failed last: a failure is counted once per Pod.
    pub pod_uid: String,
    /// Why it failed (the Pod's reason and message, or the container's waiting reason).
    pub message: String,
}

/// Pending → Downloading → Loading → SelfTesting → Serving, or Failed / Stalled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ReplicaPhase {
    #[default]
    Pending,
    Downloading,
    Loading,
    SelfTesting,
    Serving,
    /// Gave up (a failed self-test under `Refuse`, a checksum that never matches).
    Failed,
    /// Work was pending and the engine's progress heartbeat stopped.
    Stalled,
}

impl ReplicaPhase {
    /// Whether the agent may report `next` after `self`. Start-up only moves forward (a cached
    /// model skips `Downloading`); any phase may fail or stall; a stalled engine restarts into
    /// `Loading`; a failed replica is retried from `Pending`. A report that breaks this is a bug
    /// or a stale writer, and the operator ignores it instead of acting on it.
    pub fn may_move_to(self, next: ReplicaPhase) -> bool {
        use ReplicaPhase::*;
        let rank = |p: ReplicaPhase| match p {
            Pending => Some(0),
            Downloading => Some(1),
            Loading => Some(2),
            SelfTesting => Some(3),
            Serving => Some(4),
            Failed | Stalled => None,
        };
        match (self, next) {
            (a, b) if a == b => true,
            (_, Failed | Stalled) => true,
            (Stalled, Loading | Pending) => true,
            (Failed, Pending) => true,
            (a, b) => matches!((rank(a), rank(b)), (Some(x), Some(y)) if y > x),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DownloadProgress {
    pub bytes_done: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
}

/// `download: {}` reads as no download. The agent ends a download by applying its status
/// without `download`; server-side apply then removes `bytesDone`, and structured-merge-diff
/// (since v4.7) may keep the emptied map, which would otherwise make the whole replica
/// unreadable (found by the agent's model-reuse flow through the API double).
fn progress_or_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<DownloadProgress>, D::Error> {
    match Option::<serde_json::Value>::deserialize(d)? {
        None => Ok(None),
        Some(serde_json::Value::Object(m)) if m.is_empty() => Ok(None),
        Some(v) => serde_json::from_value(v).map(Some).map_err(serde::de::Error::custom),
    }
}

/// Measured by the agent over its last window of requests.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Throughput {
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
}

/// The evidence kept when the progress heartbeat stopped, before the restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StallReport {
    pub at: Time,
    /// Where it stopped: `request`, `chunk`, `layer` or `kernel`, with its name or index.
    pub stage: String,
    /// Tokens in the batch that was in flight.
    pub batch_tokens: u64,
    /// Sequences in that batch.
    pub sequences: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod download_tests {
    use super::*;

    #[test]
    fn an_emptied_download_reads_as_none() {
        let read = |v: serde_json::Value| serde_json::from_value::<ModelReplicaStatus>(v).map(|s| s.download);
        assert_eq!(read(serde_json::json!({ "download": {} })).unwrap(), None);
        assert_eq!(read(serde_json::json!({})).unwrap(), None);
        assert_eq!(read(serde_json::json!({ "download": null })).unwrap(), None);
        let some = read(serde_json::json!({ "download": { "bytesDone": 5, "bytesTotal": 9 } })).unwrap();
        assert_eq!(some, Some(DownloadProgress { bytes_done: 5, bytes_total: Some(9) }));
        // A malformed progress is still an error, not silently dropped.
        assert!(read(serde_json::json!({ "download": { "bytesTotal": 9 } })).is_err());
    }
}
