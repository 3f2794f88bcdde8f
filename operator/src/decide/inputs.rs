//! What the decisions read: plain views of nodes and deployments, mapped by the controllers
//! from `SparkNode`, `Node`, the heartbeat `Lease`, `ModelDeployment` and `ModelReplica`. Kept
//! small so that the decisions can be tested with literal values and no API types.

use std::collections::BTreeMap;
use std::fmt;

use brink_api::Verdict;
use brink_api::crd::{KV_WINDOW_PREFILL_CHUNK, kv_window_bytes_at_chunk};

use super::heartbeat::HeartbeatHistory;

/// A taint's effect, as in `Node.spec.taints[].effect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaintEffect {
    /// New replicas may not go there; existing ones are replaced too (see `lifecycle`).
    NoSchedule,
    /// A preference only: the node is used last, never refused.
    PreferNoSchedule,
    /// Evicts: no new replicas, existing ones replaced.
    NoExecute,
}

impl TaintEffect {
    /// Whether an untolerated taint of this effect keeps replicas off the node.
    pub fn blocks(self) -> bool {
        !matches!(self, TaintEffect::PreferNoSchedule)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Taint {
    pub key: String,
    pub value: Option<String>,
    pub effect: TaintEffect,
}

impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={v}:{:?}", self.key, self.effect),
            None => write!(f, "{}:{:?}", self.key, self.effect),
        }
    }
}

/// A deployment's toleration. `None` fields match anything, like an empty key with
/// `operator: Exists` (key), `operator: Exists` (value) and an empty effect in Kubernetes;
/// `operator: Equal` is `value: Some` (an absent value is `Some("")`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Toleration {
    pub key: Option<String>,
    pub value: Option<String>,
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    pub fn tolerates(&self, taint: &Taint) -> bool {
        let key = self.key.as_ref().is_none_or(|k| *k == taint.key);
        // A taint without a value has the empty value, as Kubernetes compares them.
        let value = self.value.as_deref().is_none_or(|v| v == taint.value.as_deref().unwrap_or(""));
        let effect = self.effect.is_none_or(|e| e == taint.effect);
        key && value && effect
    }
}

/// A node's qualification for one shape class, from `SparkNode.status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClassQualification {
    /// A result under the node's current fingerprint.
    Done(Verdict),
    /// The agent is qualifying the class now.
    InProgress,
    /// The result's fingerprint no longer matches the node (driver, engine, ...): re-qualifying.
    Stale { changed: String },
}

/// A replica bound to a node (of any deployment), with the memory its Pod requests. Counted
/// from its binding, not from the node's measured use, so that a replica placed but not yet
/// loaded already holds its memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resident {
    pub replica: String,
    /// The owning deployment's key (`namespace/name`).
    pub deployment: String,
    pub memory_bytes: u64,
    /// A gang member (host networking: its ports are the node's, so no second gang member of
    /// any deployment goes there).
    pub gang_member: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    /// `Node.spec.unschedulable` (cordoned or draining).
    pub unschedulable: bool,
    pub taints: Vec<Taint>,
    pub labels: BTreeMap<String, String>,
    pub heartbeat: HeartbeatHistory,
    /// Shape class -> qualification; a class absent here was never qualified on the node.
    pub classes: BTreeMap<String, ClassQualification>,
    /// Unified memory replicas may use: what the agent reports available with its replicas'
    /// memory added back (residents are subtracted by their requests below).
    pub allocatable_bytes: u64,
    pub residents: Vec<Resident>,
    /// The `SweepRun` (`namespace/name`) sweeping the node with `drainReplicas`: while it
    /// drains or runs there, the node takes no replicas and its replicas move away.
    pub sweep: Option<String>,
}

impl NodeView {
    /// Memory the residents' requests hold (saturating: a node cannot hold more than u64).
    pub fn committed_bytes(&self) -> u64 {
        self.residents.iter().fold(0u64, |acc, r| acc.saturating_add(r.memory_bytes))
    }

    /// Replicas of `deployment` bound here.
    pub fn replicas_of(&self, deployment: &str) -> u64 {
        self.residents.iter().filter(|r| r.deployment == deployment).count() as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnSelfTestFailure {
    /// Serve on a node whose envelope is below the request, with batch and chunk clamped.
    Clamp,
    /// Use only nodes whose envelope covers the requested limits.
    Refuse,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spread {
    /// At most one replica of the deployment per node.
    OnePerNode,
    /// Fewest replicas of the deployment first, sharing a node when no other fits.
    Prefer,
}

/// The unified memory one replica needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryNeed {
    /// Precomputed by the caller.
    Bytes(u64),
    /// Model weights plus the KV cache for `concurrency` sequences of `context` tokens: per
    /// sequence, `kv_bytes_per_token` (the full-attention layers) per token plus
    /// `kv_window_bytes_per_sequence` (the sliding-window layers' rings, whatever the context,
    /// as the Model status gives them: at the engine's default prefill chunk; the view's
    /// `prefill_chunk` scales them, see [`DeploymentView::memory_bytes`]).
    Model { model_bytes: u64, kv_bytes_per_token: u64, kv_window_bytes_per_sequence: u64, context: u64, concurrency: u64 },
}

/// Replicas one deployment may ask for: far above any fleet of these nodes, low enough that a
/// typo cannot keep a reconcile busy placing billions.
pub const MAX_REPLICAS: u64 = 10_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeploymentView {
    /// `namespace/name`: matched against [`Resident::deployment`].
    pub key: String,
    pub shape_class: String,
    pub memory: MemoryNeed,
    /// Memory kept free on a node after this deployment's replica is placed there.
    pub reserve_bytes: u64,
    pub max_batch_tokens: u64,
    pub prefill_chunk: u64,
    /// Replicas wanted (`spec.replicas`, the `/scale` subresource).
    pub replicas: u64,
    /// Labels a node must carry, every one with the same value.
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub spread: Spread,
    /// Only nodes with a self-test result that executed cases (qualified or clamped). When
    /// false, a node whose self-test ran nothing (no GPU) or that was never qualified serves
    /// unclamped; a disqualified, stale or in-progress class is refused either way.
    pub require_qualified: bool,
    pub on_self_test_failure: OnSelfTestFailure,
    /// `Some` when a replica spans several nodes (`nodesPerReplica` above 1).
    pub gang: Option<GangNeed>,
}

/// What a gang needs of its nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangNeed {
    /// Members per gang (at least 2).
    pub nodes: u64,
    /// The node label whose value names the fabric every member must share.
    pub fabric_label: String,
}

/// The most members one gang may have (the CRD's bound on `nodesPerReplica`).
pub const MAX_GANG_NODES: u64 = 64;

impl DeploymentView {
    /// Nodes one replica takes.
    pub fn nodes_per_replica(&self) -> u64 {
        self.gang.as_ref().map_or(1, |g| g.nodes)
    }

    /// The memory each member of a replica requests: the replica's memory spread evenly over
    /// its nodes (tensor parallelism splits weights and KV cache), rounded up.
    pub fn member_memory_bytes(&self) -> Result<u64, DecideError> {
        Ok(self.memory_bytes()?.div_ceil(self.nodes_per_replica().max(1)))
    }

    /// The memory one replica requests, or which field makes it unrepresentable. The window KV
    /// bytes are scaled to this deployment's prefill chunk (a larger chunk, a larger ring); the
    /// chunk a node's envelope clamps to is never larger, so the request still covers it.
    pub fn memory_bytes(&self) -> Result<u64, DecideError> {
        match self.memory {
            MemoryNeed::Bytes(b) => Ok(b),
            MemoryNeed::Model { model_bytes, kv_bytes_per_token, kv_window_bytes_per_sequence, context, concurrency } => {
                kv_window_bytes_at_chunk(kv_window_bytes_per_sequence, Some(self.prefill_chunk))
                    .and_then(|window| kv_bytes_per_token.checked_mul(context)?.checked_add(window))
                    .and_then(|kv| kv.checked_mul(concurrency))
                    .and_then(|kv| kv.checked_add(model_bytes))
                    .ok_or_else(|| DecideError::MemoryOverflow {
                        deployment: self.key.clone(),
                        detail: format!(
                            "model {model_bytes} B + (KV {kv_bytes_per_token} B/token x context {context} + window KV \
                             {kv_window_bytes_per_sequence} B at prefill chunk {KV_WINDOW_PREFILL_CHUNK}, scaled to {}) x concurrency \
                             {concurrency} exceeds 2^64 bytes",
                            self.prefill_chunk
                        ),
                    })
            }
        }
    }

    /// Rejects serving limits no node could honour.
    pub fn validate(&self) -> Result<(), DecideError> {
        let bad = |field: &'static str, why: String| Err(DecideError::InvalidServing { deployment: self.key.clone(), field, why });
        if self.max_batch_tokens == 0 {
            return bad("serving.maxBatchTokens", "must be at least 1".into());
        }
        if self.prefill_chunk == 0 {
            return bad("serving.prefillChunk", "must be at least 1".into());
        }
        if self.prefill_chunk > self.max_batch_tokens {
            return bad(
                "serving.prefillChunk",
                format!("{} exceeds serving.maxBatchTokens {}: a chunk is part of one batch", self.prefill_chunk, self.max_batch_tokens),
            );
        }
        if let MemoryNeed::Model { context: 0, .. } = self.memory {
            return bad("serving.context", "must be at least 1".into());
        }
        if let MemoryNeed::Model { concurrency: 0, .. } = self.memory {
            return bad("serving.concurrency", "must be at least 1".into());
        }
        if let Some(g) = &self.gang
            && !(2..=MAX_GANG_NODES).contains(&g.nodes)
        {
            return bad("nodesPerReplica", format!("{} members per gang: a gang has 2 to {MAX_GANG_NODES}", g.nodes));
        }
        if self.replicas > MAX_REPLICAS {
            return bad("replicas", format!("{} exceeds the limit of {MAX_REPLICAS}", self.replicas));
        }
        // A replica that needs no memory would fit any number of times: the model has bytes.
        match self.memory_bytes()? {
            0 => bad("memory", "a replica needs 0 bytes: the model's size is missing".into()),
            _ => Ok(()),
        }
    }

    pub fn tolerates(&self, taint: &Taint) -> bool {
        self.tolerations.iter().any(|t| t.tolerates(taint))
    }
}

/// Input the decisions cannot act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecideError {
    DuplicateNode(String),
    DuplicateReplica(String),
    /// More new replicas asked of one placement than [`MAX_REPLICAS`].
    TooManyReplicas {
        deployment: String,
        count: u64,
    },
    MemoryOverflow {
        deployment: String,
        detail: String,
    },
    InvalidServing {
        deployment: String,
        field: &'static str,
        why: String,
    },
}

impl fmt::Display for DecideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecideError::DuplicateNode(n) => write!(f, "node {n} listed twice"),
            DecideError::DuplicateReplica(r) => write!(f, "replica {r} listed twice"),
            DecideError::TooManyReplicas { deployment, count } => {
                write!(f, "ModelDeployment {deployment}: {count} new replicas asked of one placement (limit {MAX_REPLICAS})")
            }
            DecideError::MemoryOverflow { deployment, detail } => write!(f, "ModelDeployment {deployment}: memory need: {detail}"),
            DecideError::InvalidServing { deployment, field, why } => write!(f, "ModelDeployment {deployment}: spec.{field}: {why}"),
        }
    }
}

impl std::error::Error for DecideError {}

/// Nodes sorted by name, or the first name listed twice: every decision walks nodes in this
/// order, so that its result does not depend on the order the caches returned them in.
pub(crate) fn sorted_nodes(nodes: &[NodeView]) -> Result<Vec<&NodeView>, DecideError> {
    let mut sorted: Vec<&NodeView> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = sorted.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(DecideError::DuplicateNode(w[0].name.clone()));
    }
    Ok(sorted)
}
