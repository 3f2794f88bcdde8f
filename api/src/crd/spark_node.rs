//! `SparkNode`: one DGX Spark as the fleet sees it. Cluster-scoped and owned by its `Node`; the
//! node's agent writes the status (device, builds, qualification per shape class, capacity,
//! hosted replicas, heartbeat), the operator writes which shape classes to qualify.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use crate::device::{DeviceInfo, UnifiedMemory};
use crate::qualification::{Envelope, Fingerprint, Qualification};
use crate::selftest::{CaseResult, SelfTestReport};

/// Failing cases kept per shape class: enough to say why, far below the object size limit.
pub const MAX_FAILING_CASES: usize = 16;

#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "brink.dev",
    version = "v1alpha1",
    kind = "SparkNode",
    status = "SparkNodeStatus",
    derive = "PartialEq",
    shortname = "snode",
    category = "brink",
    doc = "A DGX Spark node: its GPU, builds, qualification per model shape class, capacity and replicas.",
    printcolumn(name = "GPU", type_ = "string", json_path = ".status.device.name"),
    printcolumn(name = "CC", type_ = "string", json_path = ".status.device.computeCapability"),
    printcolumn(name = "Agent", type_ = "string", json_path = ".status.agentVersion"),
    printcolumn(name = "Ready", type_ = "string", json_path = r#".status.conditions[?(@.type=="Ready")].status"#),
    printcolumn(name = "Qualified", type_ = "string", json_path = r#".status.conditions[?(@.type=="Qualified")].status"#),
    printcolumn(name = "Heartbeat", type_ = "date", json_path = ".status.lastHeartbeatTime"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct SparkNodeSpec {
    /// Shape keys the operator asks this node to qualify (for the deployments that want it):
    /// each a model's readable shape label and the hash of its whole kernel shape (every
    /// dimension and weight type), as the `Model`'s status names it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub shape_classes: Vec<String>,
}

#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SparkNodeStatus {
    /// `None` when no CUDA device is usable (`noGpuReason` says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_gpu_reason: Option<String>,
    #[serde(default)]
    pub agent_version: String,
    /// SHA-256 over every kernel source of the agent build.
    #[serde(default)]
    pub kernel_sources_hash: String,
    /// The node's part of every qualification fingerprint; a qualification whose fingerprint
    /// disagrees with it is stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<NodeFingerprint>,
    /// One result per model shape class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["shapeClass".into()]))]
    pub qualifications: Vec<ShapeQualification>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    /// Replicas resident on the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<HostedReplica>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The fingerprint fields that belong to the node, not to a shape class or serving limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeFingerprint {
    pub gpu_name: String,
    pub compute_capability: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    pub cuda_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvrtc_version: Option<String>,
    pub agent_version: String,
    pub kernel_sources_hash: String,
}

impl NodeFingerprint {
    pub fn of(fp: &Fingerprint) -> NodeFingerprint {
        NodeFingerprint {
            gpu_name: fp.gpu_name.clone(),
            compute_capability: fp.compute_capability.clone(),
            driver_version: fp.driver_version.clone(),
            cuda_version: fp.cuda_version.clone(),
            nvrtc_version: fp.nvrtc_version.clone(),
            agent_version: fp.agent_version.clone(),
            kernel_sources_hash: fp.kernel_sources_hash.clone(),
        }
    }

    /// Whether a qualification taken under `fp` still holds on this node (a driver upgrade or a
    /// new agent build makes every cached result stale).
    pub fn covers(&self, fp: &Fingerprint) -> bool {
        *self == NodeFingerprint::of(fp)
    }
}

/// The self-test result for one model shape class.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShapeQualification {
    /// The shape key qualified (label and hash of the whole kernel shape).
    pub shape_class: String,
    #[schemars(schema_with = "qualification_schema")]
    pub qualification: Qualification,
    /// The limits the node serves this class under (clamped below the first failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope: Option<Envelope>,
    /// The failing or hung cases with the fewest tokens (at most 16).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub failing_cases: Vec<FailingCase>,
}

// `Verdict` is an internally tagged enum: as JSON Schema a `oneOf` whose branches give `state`
// different values, which a structural CRD schema cannot express (and kube's schema rewriter
// refuses). In the CRD each verdict is this flat object instead: the same JSON, with the
// variant's fields optional. The doc comment below is the CRD's description.
/// The self-test's verdict: `state`, and the fields that state has.
#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Only its schema is used.
pub(crate) struct FlatVerdict {
    state: VerdictState,
    /// `qualified`, `clamped`: the largest count validated.
    max_tokens: Option<u64>,
    /// `clamped`: the smallest failing count.
    first_failure: Option<u64>,
    /// `disqualified`, `notQualified`: why.
    reason: Option<String>,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
enum VerdictState {
    Qualified,
    Clamped,
    Disqualified,
    NotQualified,
}

/// [`Qualification`]'s schema with its verdicts replaced by [`FlatVerdict`].
fn qualification_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = Qualification::json_schema(generator);
    let flat = generator.subschema_for::<FlatVerdict>().to_value();
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for field in ["verdict", "kernelVerdict", "modelVerdict"] {
            if let Some(slot) = props.get_mut(field) {
                *slot = flat.clone();
            }
        }
    }
    schema
}

/// One case that failed or hung, in a line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailingCase {
    pub id: String,
    pub kernel: String,
    pub tokens: u64,
    pub detail: String,
}

/// The failed and hung cases of `report` (and negative controls it missed), smallest token count first, at most `limit` of them:
/// the smallest failures are the ones that say where the envelope ends.
pub fn failing_cases(report: &SelfTestReport, limit: usize) -> Vec<FailingCase> {
    let mut failing: Vec<FailingCase> = report
        .cases
        .iter()
        .filter(|c| matches!(c.result, CaseResult::Failed | CaseResult::Hung | CaseResult::Missed))
        .map(|c| FailingCase { id: c.id.clone(), kernel: c.kernel.clone(), tokens: c.tokens, detail: c.detail.clone() })
        .collect();
    failing.sort_by(|a, b| (a.tokens, &a.id).cmp(&(b.tokens, &b.id)));
    failing.truncate(limit);
    failing
}

/// Memory the scheduler may place replicas into (GB10: host memory shared with the GPU, read
/// from the OS because NVML reports it as unsupported).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    pub unified_memory: UnifiedMemory,
    /// Bytes requested by the replicas resident on the node.
    #[serde(default)]
    pub resident_replica_bytes: u64,
    /// Bytes kept free for the OS and the agent.
    #[serde(default)]
    pub reserved_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedReplica {
    pub namespace: String,
    pub name: String,
    pub model: String,
    /// Memory requested for model plus KV.
    pub memory_bytes: u64,
}
