//! `ModelDeployment`: what a user asks for: a model, how many replicas, which engine build, the
//! serving limits, where replicas may go and what to do when a node's self-test falls short.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use crate::qualification::ServingParams;

#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "brink.dev",
    version = "v1alpha1",
    kind = "ModelDeployment",
    namespaced,
    status = "ModelDeploymentStatus",
    derive = "PartialEq",
    shortname = "mdep",
    category = "brink",
    doc = "A model served by a set of replicas, each on one qualified DGX Spark node.",
    scale(spec_replicas_path = ".spec.replicas", status_replicas_path = ".status.replicas", label_selector_path = ".status.selector"),
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.modelRef.name"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Engine", type_ = "string", json_path = ".spec.engine.version"),
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.engine.kind", priority = 1),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".spec.nodesPerReplica", priority = 1),
    printcolumn(name = "Rollout", type_ = "string", json_path = ".status.rollout.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
// An absent engine kind is brink (the default), so only an explicit other kind spans nodes.
#[x_kube(validation = Rule::new("(has(self.engine.kind) && self.engine.kind != 'brink') || !has(self.nodesPerReplica) || self.nodesPerReplica == 1").message("spec.nodesPerReplica must be 1 for engine kind brink: brink's engine runs on one node; use vllm, sglang or llamacpp for a replica over several nodes"))]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentSpec {
    pub model_ref: ModelRef,
    /// The names clients send as `model` to reach this deployment through the gateway (its
    /// requests are passed to the replicas under the Model's name, which they serve). Empty:
    /// the Model's name only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 256), regex(pattern = r"^[^\s]+$")))]
    pub served_model_names: Vec<String>,
    /// How many replicas to run; the `/scale` subresource reads and writes it.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    pub engine: EngineBuild,
    pub serving: Serving,
    /// Nodes one replica runs on: above 1, a replica is a gang (a leader and workers on nodes
    /// of one fabric, placed all together or not at all). 1 for engine kind `brink`.
    #[serde(default = "default_nodes_per_replica", skip_serializing_if = "is_one_node")]
    #[schemars(range(min = 1, max = 64))]
    pub nodes_per_replica: u32,
    /// How the members of a gang find each other: the fabric label and the interfaces NCCL,
    /// Gloo and UCX use (only read when `nodesPerReplica` is above 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangSettings>,
    #[serde(default)]
    pub placement: Placement,
    #[serde(default)]
    pub on_self_test_failure: OnSelfTestFailure,
    #[serde(default)]
    pub rollout: Rollout,
}

impl ModelDeploymentSpec {
    /// The names the gateway routes to this deployment: `servedModelNames`, or the Model's name.
    pub fn served_names(&self) -> Vec<String> {
        if self.served_model_names.is_empty() { vec![self.model_ref.name.clone()] } else { self.served_model_names.clone() }
    }
}

fn default_replicas() -> i32 {
    1
}

/// A one-node replica is left out on the wire, as in a spec that never named it.
fn is_one_node(n: &u32) -> bool {
    *n == 1
}

fn default_nodes_per_replica() -> u32 {
    1
}

/// The node label that names a node's fabric unless a deployment names another.
pub const FABRIC_LABEL: &str = "brink.dev/fabric";
/// A node label saying that the node's fabric has RDMA devices (`/dev/infiniband`) for RoCE.
pub const RDMA_LABEL: &str = "brink.dev/rdma";

/// The members of a gang: which nodes share a link, and the interfaces the engine's
/// collective libraries use over it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GangSettings {
    /// The node label whose value names a node's fabric: a gang's members all carry it with one
    /// value. `brink.dev/fabric` (set by the admin) or a topology label the cluster has.
    #[serde(default = "default_fabric_label")]
    #[schemars(
        length(min = 1, max = 317),
        regex(pattern = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    )]
    pub fabric_label: String,
    /// The network interface of the fabric link (`NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME`),
    /// e.g. `enp1s0f1np1` on a DGX Spark's ConnectX-7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[^\s=]+$"))]
    pub socket_interface: Option<String>,
    /// `UCX_NET_DEVICES` (e.g. `enp1s0f1np1`, or `mlx5_0:1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[^\s=]+$"))]
    pub ucx_net_devices: Option<String>,
    /// `NCCL_IB_HCA`: the RDMA devices NCCL uses (e.g. `rocep1s0f1,roceP2p1s0f1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[^\s=]+$"))]
    pub ib_hca: Option<String>,
}

fn default_fabric_label() -> String {
    FABRIC_LABEL.to_string()
}

impl Default for GangSettings {
    fn default() -> GangSettings {
        GangSettings { fabric_label: default_fabric_label(), socket_interface: None, ucx_net_devices: None, ib_hca: None }
    }
}

/// A `Model` in the deployment's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelRef {
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
}

/// The engine build replicas run: a change of any field is rolled out canary-first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineBuild {
    /// Container image of the engine: `brink-agent` for kind `brink` (e.g.
    /// `ghcr.io/brink/agent:0.2.0@sha256:...`), the engine's own image otherwise (e.g.
    /// `vllm/vllm-openai:v0.11.0`).
    #[schemars(length(min = 1, max = 512), regex(pattern = r"^\S+$"))]
    pub image: String,
    /// The engine version inside the image (for `brink`: part of every qualification fingerprint).
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^\S+$"))]
    pub version: String,
    /// Which engine the image runs; the serving parameters are mapped to its flags.
    #[serde(default, skip_serializing_if = "EngineKind::is_brink")]
    pub kind: EngineKind,
    /// Extra arguments appended to the engine's command line (after the mapped ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub args: Vec<String>,
    /// The engine's HTTP port (default: the operator's serve port for `brink`, 8000 for
    /// `vllm`, 30000 for `sglang`, 8080 for `llamacpp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 65535))]
    pub port: Option<u16>,
}

/// An engine a replica runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// `brink-agent serve`: one node, qualified by the node's own self-test.
    #[default]
    Brink,
    /// vLLM's OpenAI-compatible server (`vllm serve`; over Ray across nodes).
    Vllm,
    /// SGLang (`python3 -m sglang.launch_server`; its own launcher across nodes).
    Sglang,
    /// llama.cpp's `llama-server` (its RPC backend across nodes).
    Llamacpp,
}

impl EngineKind {
    pub fn is_brink(&self) -> bool {
        *self == EngineKind::Brink
    }

    /// The name in the API (`spec.engine.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Brink => "brink",
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Llamacpp => "llamacpp",
        }
    }
}

/// Serving limits a replica starts with (clamped to the node's validated envelope under `Clamp`).
#[derive(KubeSchema, Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[x_kube(validation = Rule::new("self.prefillChunk <= self.maxBatchTokens").message("serving.prefillChunk must not exceed serving.maxBatchTokens"))]
#[serde(rename_all = "camelCase")]
pub struct Serving {
    /// Context length: tokens per sequence.
    #[schemars(range(min = 1, max = 16_777_216))]
    pub context: u64,
    /// Most tokens in one engine step (all sequences together).
    #[schemars(range(min = 1, max = 16_777_216))]
    pub max_batch_tokens: u64,
    /// Most prompt tokens of one sequence prefilled in one step.
    #[schemars(range(min = 1, max = 16_777_216))]
    pub prefill_chunk: u64,
    /// Sequences served at once.
    #[schemars(range(min = 1, max = 4096))]
    pub concurrency: u32,
    /// Share of the memory left after the weights that the KV cache may take, in (0, 1].
    #[schemars(extend("minimum" = 0.0, "exclusiveMinimum" = true, "maximum" = 1.0))]
    pub kv_fraction: f64,
}

impl Serving {
    /// The parameters a qualification fingerprint is keyed by.
    pub fn params(&self) -> ServingParams {
        ServingParams {
            max_batch_tokens: self.max_batch_tokens,
            prefill_chunk: self.prefill_chunk,
            context: self.context,
            full_window_kv: false,
        }
    }
}

/// Where replicas may go.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Labels a node must carry (as a Pod's `nodeSelector`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub spread: Spread,
    /// Only nodes whose `SparkNode` reports the model's shape class qualified (or clamped) take a
    /// replica. Off only for experiments: an unqualified node may serve wrong tokens.
    #[serde(default = "default_true")]
    pub require_qualified: bool,
    /// Taints the replicas tolerate, as a Pod's `tolerations` (copied into each replica Pod): a
    /// node with a `NoSchedule` or `NoExecute` taint takes replicas only when one of these
    /// tolerates it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tolerations: Vec<Toleration>,
    /// The replica Pods' `priorityClassName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub priority_class_name: Option<String>,
}

fn default_true() -> bool {
    true
}

// Written out: a derived Default would turn `requireQualified` off for a deployment that omits
// `placement` (and the CRD schema's default, which the API server applies, comes from here).
impl Default for Placement {
    fn default() -> Placement {
        Placement {
            node_selector: BTreeMap::new(),
            spread: Spread::default(),
            require_qualified: true,
            tolerations: Vec::new(),
            priority_class_name: None,
        }
    }
}

/// How replicas of one deployment share nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Spread {
    /// At most one replica per node: a replica that finds no free node stays Pending and says so.
    PerNode,
    /// Distinct nodes while there are any; then nodes are shared.
    #[default]
    BestEffort,
}

/// What a node whose self-test validated less than `serving.maxBatchTokens` gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OnSelfTestFailure {
    /// Serve with batch and chunk clamped to the validated envelope (long prompts go in chunks).
    #[default]
    Clamp,
    /// Do not place a replica there.
    Refuse,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    #[serde(default)]
    pub strategy: RolloutStrategy,
    /// How long the canary may take to serve and pass its threshold test before it is rolled back.
    #[serde(default = "default_progress_deadline")]
    #[schemars(range(min = 30, max = 86_400))]
    pub progress_deadline_seconds: u32,
}

fn default_progress_deadline() -> u32 {
    900
}

impl Default for Rollout {
    fn default() -> Rollout {
        Rollout { strategy: RolloutStrategy::default(), progress_deadline_seconds: default_progress_deadline() }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RolloutStrategy {
    /// One node first; the rest only once that replica serves and passes its threshold test.
    #[default]
    Canary,
    /// Every replica at once (a deployment with one replica, or a fleet being rebuilt).
    AllAtOnce,
}

#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Replicas that exist (the `/scale` subresource's status).
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    /// Replicas on the current model and engine build.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Label selector of the replica Pods, serialised (`/scale` needs it for autoscalers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    pub phase: RolloutPhase,
    /// Hash of the model and engine build being rolled out.
    pub revision: String,
    /// The revision replicas fall back to when the canary fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_revision: Option<String>,
    /// The `ModelReplica` that carries the canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_replica: Option<String>,
    /// Why the rollout is where it is (e.g. the canary's failing threshold case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RolloutPhase {
    Canary,
    Progressing,
    Complete,
    RolledBack,
}
