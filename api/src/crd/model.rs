//! `Model`: a GGUF artefact: where it comes from and its checksum (the user's spec), and what its
//! header says and which nodes hold it (the agents' status).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;

/// A file name inside a directory: each segment starts with a letter, digit or `_`, so `..`
/// and absolute paths cannot escape the source's directory or the cache.
const RELATIVE_PATH: &str = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$";

#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "brink.dev",
    version = "v1alpha1",
    kind = "Model",
    namespaced,
    status = "ModelStatus",
    derive = "PartialEq",
    category = "brink",
    doc = "A GGUF model file (or split set of files): its source and checksum, and what its header says.",
    printcolumn(name = "Arch", type_ = "string", json_path = ".status.architecture"),
    printcolumn(name = "Shape", type_ = "string", json_path = ".status.shapeClass"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".status.sizeBytes"),
    printcolumn(name = "Ready", type_ = "string", json_path = r#".status.conditions[?(@.type=="Ready")].status"#),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(
    // Content never changes under a name: a changed model is a new Model and a new modelRef, so a
    // rollout's previous revision still names the bytes it served and rolls back exactly (and the
    // agents' caches, keyed by checksum, stay valid).
    validation = Rule::new("self == oldSelf").message("a Model's source is immutable: create a new Model and point the deployment's modelRef at it, so a rollout can roll back"),
    validation = Rule::new("has(self.sha256) != has(self.parts)").message("set sha256 for a single file, or parts (each with its sha256) for a split GGUF, not both"),
    validation = Rule::new("!has(self.parts) || !has(self.source.https) || self.source.https.url.endsWith('/')").message("for a split GGUF, source.https.url names the directory of the parts and ends with '/'")
)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    pub source: ModelSource,
    /// SHA-256 of the file, 64 lower-case hex digits (a single-file model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // maxLength as well as the pattern: the API server's CEL cost estimate (spec == oldSelf) needs bounds.
    #[schemars(length(min = 64, max = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: Option<String>,
    #[serde(default)]
    pub format: ModelFormat,
    /// The parts of a split GGUF (`*-00001-of-0000N.gguf`), in order, each with its checksum;
    /// the source then names their directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 256))]
    pub parts: Option<Vec<ModelPart>>,
}

/// Where the file comes from: exactly one of `https`, `nodePath`, `pvc`.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[x_kube(validation = Rule::new("(has(self.https) ? 1 : 0) + (has(self.nodePath) ? 1 : 0) + (has(self.pvc) ? 1 : 0) == 1")
    .message("source must set exactly one of https, nodePath, pvc"))]
#[serde(rename_all = "camelCase")]
pub struct ModelSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<HttpsSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_path: Option<NodePathSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcSource>,
}

/// Downloaded by the agent, resumed after an interruption.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpsSource {
    #[schemars(length(max = 2048), regex(pattern = r"^https://[^\s/]+(/\S*)?$"))]
    pub url: String,
    /// A Secret in the Model's namespace: key `token` (sent as a bearer token) or keys
    /// `username` and `password` (basic authentication).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
}

/// A file (or, for parts, a directory) already on every node that may serve the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePathSource {
    /// Absolute path on the node.
    #[schemars(length(max = 4096), regex(pattern = r"^/\S*$"))]
    pub path: String,
}

/// A file (or directory of parts) on a PersistentVolumeClaim in the Model's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvcSource {
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub claim_name: String,
    /// Path inside the volume (relative; no `..`).
    #[schemars(length(max = 4096), regex(pattern = RELATIVE_PATH))]
    pub path: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ModelFormat {
    #[default]
    #[serde(rename = "gguf")]
    Gguf,
}

/// One file of a split GGUF.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelPart {
    /// File name relative to the source's directory.
    #[schemars(length(max = 1024), regex(pattern = RELATIVE_PATH))]
    pub file: String,
    // maxLength as well as the pattern: the API server's CEL cost estimate (spec == oldSelf) needs bounds.
    #[schemars(length(min = 64, max = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
}

/// Read from the GGUF header by the first agent that has the file; cache progress per node.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelStatus {
    /// `general.architecture` (e.g. `qwen3moe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<u32>,
    /// Experts used per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Bytes of all files together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// The tensor types present (e.g. `Q4_K`, `Q8_0`, `F32`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quant_types: Vec<String>,
    /// The shape key nodes qualify for: the readable label and the hash of the model's whole
    /// kernel shape (dimensions, heads, vocabulary, context, weight type of each tensor), e.g.
    /// `qwen3moe-h2048-e128-top8-ffn768-0123456789abcdef`. Two models share a qualification
    /// exactly when their keys are equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape_class: Option<String>,
    /// KV cache bytes one token takes in the full-attention layers (K and V, at the engine's
    /// cache type). A replica's memory request holds, per sequence (`serving.concurrency`),
    /// this times `serving.context` plus `kvWindowBytesPerSequence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_bytes_per_token: Option<u64>,
    /// KV cache bytes the sliding-window layers take per sequence, whatever the context: the
    /// engine keeps only a ring of the window plus a prefill chunk there (sized at the engine's
    /// default chunk of 2048 tokens). 0 for models without such layers; absent when written by
    /// an agent that counted every layer in `kvBytesPerToken`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_window_bytes_per_sequence: Option<u64>,
    /// One entry per node that holds or fetches the file (written by that node's agent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["node".into()]))]
    pub cache: Vec<NodeCache>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The prefill chunk `kvWindowBytesPerSequence` is sized at: the engine's default, which
/// node-agent/src/model_cache/kv_size.rs sizes the rings with and checks against the engine.
pub const KV_WINDOW_PREFILL_CHUNK: u64 = 2048;

/// The sliding-window layers' KV bytes per sequence for a replica prefilling `prefill_chunk`
/// tokens at a time (None: the engine's default), from `published`
/// (`kvWindowBytesPerSequence`, sized at [`KV_WINDOW_PREFILL_CHUNK`]); never fewer than the
/// engine allocates. None on overflow.
///
/// The engine's ring holds `ceil((chunk + window - 1) / block)` blocks (engine/src/backend,
/// `ring_blocks`). For `chunk <= k x 2048` that is at most `k` rings at 2048, since
/// `chunk + window - 1 <= k x (2048 + window - 1)` and `ceil(k x) <= k ceil(x)`: so the
/// published figure times `ceil(chunk / 2048)`. A smaller chunk makes a smaller ring, so the
/// factor is never below 1. No cap by the context (a ring is never longer than it): the status
/// gives the ring's bytes, not its length (that depends on the window), so the windowed
/// layers' bytes per position, and a cap from them, cannot be recovered exactly.
pub fn kv_window_bytes_at_chunk(published: u64, prefill_chunk: Option<u64>) -> Option<u64> {
    let rings = prefill_chunk.unwrap_or(KV_WINDOW_PREFILL_CHUNK).div_ceil(KV_WINDOW_PREFILL_CHUNK).max(1);
    published.checked_mul(rings)
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCache {
    pub node: String,
    pub phase: CachePhase,
    #[serde(default)]
    pub bytes_done: u64,
    /// Unknown until the server says (no `Content-Length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
    /// Why it failed or was evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Time>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CachePhase {
    Pending,
    Downloading,
    Verifying,
    Ready,
    Failed,
    Evicted,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_bytes_scale_with_the_rings_a_prefill_chunk_needs() {
        // gpt-oss-20b: 12 windowed layers of 2 KiB a position, a ring of 2,176 positions.
        let oss = 12 * 2048 * 2176;
        for (chunk, rings) in [
            // Smaller chunks make smaller rings: the published figure stays an upper bound.
            (Some(1), 1),
            (Some(2047), 1),
            (Some(2048), 1),
            (None, 1),
            (Some(2049), 2),
            (Some(4096), 2),
            (Some(8192), 4),
            (Some(8193), 5),
        ] {
            assert_eq!(kv_window_bytes_at_chunk(oss, chunk), Some(oss * rings), "chunk {chunk:?}");
        }
        // A chunk of 8192 needs ceil((8192 + 127) / 16) = 520 blocks, 8,320 positions: under
        // the 4 x 2,176 the estimate asks.
        assert!(12 * 2048 * 8320 <= kv_window_bytes_at_chunk(oss, Some(8192)).unwrap());
        assert_eq!(kv_window_bytes_at_chunk(0, Some(1 << 24)), Some(0), "no windowed layers");
        assert_eq!(kv_window_bytes_at_chunk(u64::MAX, Some(2048)), Some(u64::MAX));
        assert_eq!(kv_window_bytes_at_chunk(u64::MAX, Some(2049)), None, "overflow");
        assert_eq!(kv_window_bytes_at_chunk(1, Some(u64::MAX)), Some(u64::MAX.div_ceil(2048)));
    }
}
