//! The model-cache decisions of cluster mode (pure): which `Model`s this node must hold (those
//! its `ModelReplica`s use), what the cache takes as their source, and the status documents the
//! agent applies (its node's entry in the `Model`'s cache list and the header facts; a
//! replica's download progress). Applied with the field manager `brink-agent-<node>`: the
//! `Model`'s `status.cache` is a list-map keyed by `node`, so each node's agent owns its entry
//! and agents on different nodes never clobber each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use brink_api::crd::{CachePhase, DownloadProgress, HostedReplica, Model, ModelReplica, ModelStatus, NodeCache};
use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::model_cache::{Credentials, HeaderFacts, HttpPart, ModelSource};

/// A Model this node must hold, with the replicas on this node that use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub namespace: String,
    pub model: String,
    pub replicas: Vec<String>,
}

/// The replicas bound to `node`, as the SparkNode lists them. `sizes`: a Model's size in bytes
/// by `namespace/name`, where its status says it (the weights; the KV cache is the replica
/// Pod's memory request, which the operator computes).
pub fn hosted(node: &str, replicas: &[ModelReplica], sizes: &BTreeMap<String, u64>) -> Vec<HostedReplica> {
    let mut out: Vec<HostedReplica> = replicas
        .iter()
        .filter(|r| r.spec.nodes().contains(&node) && r.metadata.deletion_timestamp.is_none())
        .map(|r| {
            let namespace = r.namespace().unwrap_or_default();
            let memory_bytes = sizes.get(&format!("{namespace}/{}", r.spec.model)).copied().unwrap_or(0);
            HostedReplica { namespace, name: r.name_any(), model: r.spec.model.clone(), memory_bytes }
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// The Models the replicas on `node` use, by namespace and name, each once.
pub fn wanted(node: &str, replicas: &[ModelReplica]) -> Vec<Wanted> {
    let mut by_model: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for r in replicas.iter().filter(|r| r.spec.nodes().contains(&node) && r.metadata.deletion_timestamp.is_none()) {
        by_model.entry((r.namespace().unwrap_or_default(), r.spec.model.clone())).or_default().push(r.name_any());
    }
    by_model
        .into_iter()
        .map(|((namespace, model), mut replicas)| {
            replicas.sort();
            Wanted { namespace, model, replicas }
        })
        .collect()
}

/// Models to fetch so that the classes waiting for one can be qualified (the self-test takes a
/// class's full shape from a model's header): per class, the first Model by namespace and name
/// whose status names that class, unless a Model of the class is already wanted. A node the
/// operator asks to qualify a class before placing a replica there would otherwise wait forever.
pub fn for_qualification(waiting: &[String], models: &[Model], wanted: &[Wanted]) -> Vec<Wanted> {
    let class_of = |ns: &str, name: &str| {
        models
            .iter()
            .find(|m| m.namespace().as_deref() == Some(ns) && m.name_any() == name)
            .and_then(|m| m.status.as_ref()?.shape_class.clone())
    };
    let covered: Vec<String> = wanted.iter().filter_map(|w| class_of(&w.namespace, &w.model)).collect();
    let mut sorted: Vec<&Model> = models.iter().collect();
    sorted.sort_by_key(|m| (m.namespace(), m.name_any()));
    let mut out = Vec::new();
    for class in waiting.iter().filter(|c| !covered.contains(c)) {
        let first = sorted.iter().find(|m| m.status.as_ref().and_then(|s| s.shape_class.as_ref()) == Some(class));
        if let Some(m) = first {
            let w = Wanted { namespace: m.namespace().unwrap_or_default(), model: m.name_any(), replicas: Vec::new() };
            if !out.contains(&w) {
                out.push(w);
            }
        }
    }
    out
}

/// The verified local model files (node path, PVC) on `node`, by the shape class their Model's
/// status names: those whose cache entry for this node says Ready.
pub fn local_models(node: &str, models: &[Model], pvc_root: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    for m in models {
        let Some(class) = m.status.as_ref().and_then(|s| s.shape_class.clone()) else { continue };
        if !our_entry(m, node).is_some_and(|e| e.phase == CachePhase::Ready) {
            continue;
        }
        if let Ok(ModelSource::Local { path, .. }) = source(m, None, pvc_root) {
            out.entry(class).or_insert(path);
        }
    }
    out
}

/// The cache key of `model` (its single file's sha256, or its first part's), lowercase.
pub fn key(model: &Model) -> Option<String> {
    match (&model.spec.sha256, &model.spec.parts) {
        (Some(sha), _) => Some(sha.to_ascii_lowercase()),
        (None, Some(parts)) => parts.first().map(|p| p.sha256.to_ascii_lowercase()),
        (None, None) => None,
    }
}

/// The Secret a Model's https source names, if any.
pub fn secret_name(model: &Model) -> Option<&str> {
    model.spec.source.https.as_ref()?.credentials_secret_ref.as_ref().map(|s| s.name.as_str())
}

/// What the cache downloads or verifies for `model`. A PVC is read where the DaemonSet mounts
/// it: `<pvc_root>/<claimName>/<path>`.
pub fn source(model: &Model, credentials: Option<Credentials>, pvc_root: &Path) -> Result<ModelSource, SourceError> {
    let name = format!("Model {}/{}", model.namespace().unwrap_or_default(), model.name_any());
    let spec = &model.spec;
    if let Some(https) = &spec.source.https {
        let parts = match (&spec.sha256, &spec.parts) {
            (Some(sha), None) => vec![HttpPart { url: https.url.clone(), sha256: sha.clone() }],
            (None, Some(parts)) => {
                let dir = if https.url.ends_with('/') { https.url.clone() } else { format!("{}/", https.url) };
                parts.iter().map(|p| HttpPart { url: format!("{dir}{}", p.file), sha256: p.sha256.clone() }).collect()
            }
            _ => return Err(SourceError::ShaOrParts { model: name }),
        };
        return Ok(ModelSource::Http { parts, credentials });
    }
    let path = match (&spec.source.node_path, &spec.source.pvc) {
        (Some(p), None) => Path::new(&p.path).to_path_buf(),
        (None, Some(pvc)) => pvc_root.join(&pvc.claim_name).join(&pvc.path),
        _ => return Err(SourceError::SourceKind { model: name }),
    };
    match (&spec.sha256, &spec.parts) {
        (Some(sha), None) => Ok(ModelSource::Local { path, sha256: sha.clone() }),
        (None, Some(_)) => Err(SourceError::SplitLocal { model: name }),
        _ => Err(SourceError::ShaOrParts { model: name }),
    }
}

/// A Model whose spec the cache cannot act on (`model`: "Model NAMESPACE/NAME").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("{model}: spec must set exactly one of sha256 and parts")]
    ShaOrParts { model: String },
    #[error("{model}: spec.source must set exactly one of https, nodePath, pvc")]
    SourceKind { model: String },
    #[error(
        "{model}: a split GGUF (parts) from a node path or PVC is not supported by the cache yet: serve it over https, or merge the parts"
    )]
    SplitLocal { model: String },
}

/// A credentials Secret (`secret`: "NAMESPACE/NAME") the cache cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error("Secret {secret}: key `{key}` is not UTF-8")]
    NotUtf8 { secret: String, key: &'static str },
    #[error("Secret {secret}: expected key `token`, or keys `username` and `password`")]
    NoKeys { secret: String },
}

/// Credentials from the Secret's data: `token` (bearer), or `username` and `password` (basic).
pub fn credentials(secret: &str, data: &BTreeMap<String, ByteString>) -> Result<Credentials, CredentialsError> {
    let text = |key: &'static str| -> Result<Option<String>, CredentialsError> {
        data.get(key)
            .map(|b| String::from_utf8(b.0.clone()).map(|s| s.trim_end_matches(['\r', '\n']).to_string()))
            .transpose()
            .map_err(|_| CredentialsError::NotUtf8 { secret: secret.to_string(), key })
    };
    match (text("token")?, text("username")?, text("password")?) {
        (Some(token), _, _) if !token.is_empty() => Ok(Credentials::Bearer(token)),
        (_, Some(user), Some(password)) => Ok(Credentials::Basic { user, password }),
        _ => Err(CredentialsError::NoKeys { secret: secret.to_string() }),
    }
}

/// This node's cache entry.
pub fn entry(node: &str, phase: CachePhase, bytes_done: u64, bytes_total: Option<u64>, message: Option<String>, now: Time) -> NodeCache {
    NodeCache { node: node.into(), phase, bytes_done, bytes_total, message, updated_at: Some(now) }
}

/// The server-side-apply body for `model`'s status from this node: its cache entry, and the
/// header facts (see [`facts_to_apply`]).
pub fn model_status(model: &Model, entry: NodeCache, facts: Option<(&HeaderFacts, u64)>) -> Value {
    status_body(model, vec![entry], facts_to_apply(model, facts))
}

/// The body that writes header facts this node read without caching the model (a Model no
/// replica here uses): the facts, and this node's cache entry unchanged when it has one (an
/// apply that left it out would remove it), applied only if the Model is still at the
/// resourceVersion it was read at. None when the status already holds these facts complete,
/// or other ones (nothing to write).
pub fn facts_status(model: &Model, node: &str, facts: &HeaderFacts, size: u64) -> Option<Value> {
    let ours = header_status(facts, size);
    let theirs = model.status.clone().unwrap_or_default();
    if !agrees(&theirs, &ours) || (!lacks_facts(model) && same_kv(&theirs, &ours)) {
        return None;
    }
    let mut body = status_body(model, our_entry(model, node).cloned().into_iter().collect(), Some(ours));
    // A precondition: two agents that both saw no facts cannot both force theirs; the second
    // gets 409 and reads the status again.
    if let Some(rv) = &model.metadata.resource_version {
        body["metadata"]["resourceVersion"] = json!(rv);
    }
    Some(body)
}

/// The header facts this node's apply carries. Ours, when this node read them and the status
/// holds none or agrees (agents that agree co-own the facts; one that read something else does
/// not overwrite them). Otherwise the facts the status holds, unchanged: server-side apply
/// removes a field when the only manager that set it applies without it, so every apply of a
/// node that once wrote the facts (an eviction's, a progress tick's) must carry them, or the
/// Model would lose the facts placement needs when the last node that wrote them evicts it.
pub fn facts_to_apply(model: &Model, facts: Option<(&HeaderFacts, u64)>) -> Option<ModelStatus> {
    let theirs = model.status.clone().unwrap_or_default();
    if let Some((facts, size)) = facts {
        let ours = header_status(facts, size);
        if agrees(&theirs, &ours) {
            return Some(ours);
        }
    }
    let held = theirs.architecture.is_some()
        || theirs.shape_class.is_some()
        || theirs.size_bytes.is_some()
        || theirs.kv_bytes_per_token.is_some()
        || theirs.kv_window_bytes_per_sequence.is_some()
        || theirs.experts.is_some()
        || theirs.top_k.is_some()
        || !theirs.quant_types.is_empty();
    held.then(|| ModelStatus { cache: Vec::new(), conditions: Vec::new(), ..theirs })
}

/// Whether `ours` may be written over `theirs`: the status holds no facts, or the same ones (a
/// status written before `kvBytesPerToken` or `kvWindowBytesPerSequence` existed agrees on the
/// rest, and gains both: its `kvBytesPerToken` counted the windowed layers too).
fn agrees(theirs: &ModelStatus, ours: &ModelStatus) -> bool {
    let empty = theirs.architecture.is_none() && theirs.shape_class.is_none();
    let same = theirs.architecture == ours.architecture
        && theirs.experts == ours.experts
        && theirs.top_k == ours.top_k
        && theirs.size_bytes == ours.size_bytes
        && theirs.quant_types == ours.quant_types
        && theirs.shape_class == ours.shape_class
        && (theirs.kv_bytes_per_token.is_none() || theirs.kv_window_bytes_per_sequence.is_none() || same_kv(theirs, ours));
    empty || same
}

/// Whether both KV size facts are equal.
fn same_kv(theirs: &ModelStatus, ours: &ModelStatus) -> bool {
    theirs.kv_bytes_per_token == ours.kv_bytes_per_token && theirs.kv_window_bytes_per_sequence == ours.kv_window_bytes_per_sequence
}

fn status_body(model: &Model, cache: Vec<NodeCache>, facts: Option<ModelStatus>) -> Value {
    let mut status = serde_json::Map::new();
    if !cache.is_empty() {
        status.insert("cache".into(), json!(cache));
    }
    if let Some(Ok(Value::Object(fields))) = facts.map(|f| serde_json::to_value(&f)) {
        status.extend(fields);
    }
    json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "Model",
        "metadata": { "name": model.name_any(), "namespace": model.namespace() },
        "status": status,
    })
}

/// Whether `model`'s status lacks a fact the operator needs before it places a replica of it
/// (operator/src/controllers/views.rs): the shape class, a non-zero size and a KV size (bytes
/// per token, which only a model of windowed layers alone may have at 0).
pub fn lacks_facts(model: &Model) -> bool {
    let Some(s) = &model.status else { return true };
    let no_kv = s.kv_bytes_per_token.is_none_or(|b| b == 0) && s.kv_window_bytes_per_sequence.is_none_or(|b| b == 0);
    s.shape_class.as_deref().is_none_or(str::is_empty) || s.size_bytes.is_none_or(|b| b == 0) || s.kv_bytes_per_token.is_none() || no_kv
}

/// Whether `model`'s KV size was written before `kvWindowBytesPerSequence` existed: its
/// `kvBytesPerToken` counted windowed layers at every position, too much for gpt-oss.
fn kv_predates_windows(model: &Model) -> bool {
    model.status.as_ref().is_some_and(|s| s.kv_bytes_per_token.is_some() && s.kv_window_bytes_per_sequence.is_none())
}

/// The Models whose facts this node should read this round, by namespace and name: those that
/// lack a fact or hold a KV size from before windows counted, are not being deleted, and were
/// not fetched this round (`fetched`, by namespace and name: a fetch writes the facts itself,
/// or has just failed and says why in its entry).
pub fn facts_needed<'a>(models: &'a [Model], fetched: &BTreeSet<(String, String)>) -> Vec<&'a Model> {
    let mut out: Vec<&Model> = models
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none() && (lacks_facts(m) || kv_predates_windows(m)))
        .filter(|m| !fetched.contains(&(m.namespace().unwrap_or_default(), m.name_any())))
        .collect();
    out.sort_by_key(|m| (m.namespace(), m.name_any()));
    out
}

/// Whether a Model whose facts could not be read at `failed` (for the same cache key) is due
/// another try at `now`: reading a header is cheap, but a broken URL should not be asked every
/// round by every node.
pub fn probe_due(failed: Option<&(String, Time)>, key: &str, now: &Time, retry_after: std::time::Duration) -> bool {
    match failed {
        None => true,
        Some((k, _)) if k != key => true,
        Some((_, at)) => {
            let elapsed = now.0.duration_since(at.0);
            elapsed.as_secs_f64() >= retry_after.as_secs_f64()
        }
    }
}

/// The Model status fields the GGUF header gives (quant types in ggml's upper-case spelling).
pub fn header_status(facts: &HeaderFacts, size: u64) -> ModelStatus {
    ModelStatus {
        architecture: Some(facts.arch.clone()),
        experts: u32::try_from(facts.experts).ok(),
        top_k: u32::try_from(facts.top_k).ok(),
        size_bytes: Some(size),
        quant_types: facts.quant_types.iter().map(|t| t.to_ascii_uppercase()).collect(),
        shape_class: Some(facts.shape_class.clone()),
        kv_bytes_per_token: facts.kv_bytes_per_token,
        kv_window_bytes_per_sequence: facts.kv_window_bytes_per_sequence,
        cache: Vec::new(),
        conditions: Vec::new(),
    }
}

/// The server-side-apply body for a replica's `status.download` (None: the download is over,
/// and applying without the field removes it).
pub fn replica_download(namespace: &str, name: &str, download: Option<DownloadProgress>) -> Value {
    let status = match download {
        Some(d) => json!({ "download": d }),
        None => json!({}),
    };
    json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "ModelReplica",
        "metadata": { "name": name, "namespace": namespace },
        "status": status,
    })
}

/// A model's download progress from the cache's per-part reports. Parts download one after
/// another, so every part before the one reporting is complete; the total is known once every
/// part has said its size.
pub struct PartTally {
    totals: Vec<Option<u64>>,
}

impl PartTally {
    pub fn new(parts: usize) -> PartTally {
        PartTally { totals: vec![None; parts.max(1)] }
    }

    pub fn update(&mut self, part: usize, p: crate::model_cache::Progress) -> DownloadProgress {
        if self.totals.len() <= part {
            self.totals.resize(part + 1, None);
        }
        self.totals[part] = Some(p.total);
        let before: u64 = self.totals[..part].iter().map(|t| t.unwrap_or(0)).sum();
        let total = self.totals.iter().try_fold(0u64, |sum, t| t.map(|t| sum.saturating_add(t)));
        DownloadProgress { bytes_done: before.saturating_add(p.bytes), bytes_total: total }
    }
}

/// This node's entry in `model`'s status, if any.
pub fn our_entry<'a>(model: &'a Model, node: &str) -> Option<&'a NodeCache> {
    model.status.as_ref()?.cache.iter().find(|c| c.node == node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::crd::{
        EngineBuild, HttpsSource, ModelFormat, ModelPart, ModelReplicaSpec, ModelSource as Src, ModelSpec, NodePathSource, PvcSource,
        SecretRef, Serving,
    };

    pub fn replica(ns: &str, name: &str, node: &str, model: &str) -> ModelReplica {
        let mut r = ModelReplica::new(
            name,
            ModelReplicaSpec {
                deployment: "d".into(),
                node: node.into(),
                model: model.into(),
                revision: "r1".into(),
                engine: EngineBuild { image: "brink:1".into(), version: "0.1.0".into(), ..Default::default() },
                serving: Serving { context: 4096, max_batch_tokens: 8192, prefill_chunk: 2048, concurrency: 4, kv_fraction: 0.5 },
                gang: None,
            },
        );
        r.metadata.namespace = Some(ns.into());
        r
    }

    fn model(source: Src, sha: Option<&str>, parts: Option<Vec<ModelPart>>) -> Model {
        let mut m = Model::new("m", ModelSpec { source, sha256: sha.map(Into::into), format: ModelFormat::Gguf, parts });
        m.metadata.namespace = Some("ai".into());
        m
    }

    fn https(url: &str) -> Src {
        Src {
            https: Some(HttpsSource { url: url.into(), credentials_secret_ref: Some(SecretRef { name: "hf".into() }) }),
            node_path: None,
            pvc: None,
        }
    }

    #[test]
    fn wanted_models_are_those_of_this_nodes_replicas() {
        let rs = vec![
            replica("ai", "r2", "n1", "qwen"),
            replica("ai", "r1", "n1", "qwen"),
            replica("ai", "r3", "n2", "qwen"),
            replica("ml", "r1", "n1", "qwen"),
            replica("ai", "r4", "n1", "other"),
        ];
        let w = wanted("n1", &rs);
        let got: Vec<(&str, &str, Vec<&str>)> =
            w.iter().map(|w| (w.namespace.as_str(), w.model.as_str(), w.replicas.iter().map(|s| s.as_str()).collect())).collect();
        assert_eq!(got, vec![("ai", "other", vec!["r4"]), ("ai", "qwen", vec!["r1", "r2"]), ("ml", "qwen", vec!["r1"])]);
        assert!(wanted("n3", &rs).is_empty());
        let sizes = BTreeMap::from([("ai/qwen".to_string(), 100u64)]);
        let h = hosted("n1", &rs, &sizes);
        assert_eq!(
            h.iter().map(|h| (h.namespace.as_str(), h.name.as_str(), h.memory_bytes)).collect::<Vec<_>>(),
            vec![("ai", "r1", 100), ("ai", "r2", 100), ("ai", "r4", 0), ("ml", "r1", 0)]
        );
    }

    #[test]
    fn models_are_fetched_for_waiting_classes() {
        let sha = "ab".repeat(32);
        let of_class = |ns: &str, name: &str, class: Option<&str>| {
            let mut m = model(https("https://h/m.gguf"), Some(&sha), None);
            m.metadata.namespace = Some(ns.into());
            m.metadata.name = Some(name.into());
            m.status = class.map(|c| ModelStatus { shape_class: Some(c.into()), ..ModelStatus::default() });
            m
        };
        let models = vec![
            of_class("ml", "b", Some("c1")),
            of_class("ai", "z", Some("c1")),
            of_class("ai", "y", Some("c2")),
            of_class("ai", "x", None),
        ];
        let w = |ns: &str, m: &str| Wanted { namespace: ns.into(), model: m.into(), replicas: Vec::new() };
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // (name, waiting classes, already wanted, want)
        type Case = (&'static str, Vec<String>, Vec<Wanted>, Vec<Wanted>);
        let cases: Vec<Case> = vec![
            ("nothing waits", s(&[]), vec![], vec![]),
            ("first model of the class by namespace/name", s(&["c1"]), vec![], vec![w("ai", "z")]),
            ("two classes", s(&["c2", "c1"]), vec![], vec![w("ai", "y"), w("ai", "z")]),
            ("a replica's model already covers the class", s(&["c1"]), vec![w("ml", "b")], vec![]),
            ("no model names the class yet", s(&["c9"]), vec![], vec![]),
        ];
        for (name, waiting, wanted, want) in cases {
            assert_eq!(for_qualification(&waiting, &models, &wanted), want, "{name}");
        }
    }

    #[test]
    fn progress_over_parts() {
        use crate::model_cache::Progress;
        let p = |bytes, total| Progress { bytes, total };
        let d = |done, total| DownloadProgress { bytes_done: done, bytes_total: total };
        let mut one = PartTally::new(1);
        assert_eq!(one.update(0, p(0, 100)), d(0, Some(100)));
        assert_eq!(one.update(0, p(60, 100)), d(60, Some(100)));
        let mut three = PartTally::new(3);
        // (part, bytes, part size, want done, want total)
        let steps: [(usize, u64, u64, u64, Option<u64>); 5] = [
            (0, 10, 100, 10, None),
            (0, 100, 100, 100, None),
            (1, 5, 50, 105, None),
            (2, 0, 30, 150, Some(180)),
            (2, 30, 30, 180, Some(180)),
        ];
        for (part, bytes, size, done, total) in steps {
            assert_eq!(three.update(part, p(bytes, size)), d(done, total), "part {part} at {bytes}");
        }
    }

    #[test]
    fn local_files_by_class() {
        let sha = "ab".repeat(32);
        let status = |class: &str, node: &str, phase: CachePhase| ModelStatus {
            shape_class: Some(class.into()),
            cache: vec![NodeCache { node: node.into(), phase, bytes_done: 0, bytes_total: None, message: None, updated_at: None }],
            ..ModelStatus::default()
        };
        let local = |name: &str, path: &str, st: Option<ModelStatus>| {
            let mut m = model(Src { https: None, node_path: Some(NodePathSource { path: path.into() }), pvc: None }, Some(&sha), None);
            m.metadata.name = Some(name.into());
            m.status = st;
            m
        };
        let mut remote = model(https("https://h/m.gguf"), Some(&sha), None);
        remote.status = Some(status("c3", "n1", CachePhase::Ready));
        let models = vec![
            local("a", "/m/a.gguf", Some(status("c1", "n1", CachePhase::Ready))),
            local("b", "/m/b.gguf", Some(status("c2", "n1", CachePhase::Failed))),
            local("c", "/m/c.gguf", Some(status("c2", "n2", CachePhase::Ready))),
            local("d", "/m/d.gguf", None),
            remote,
        ];
        let got = local_models("n1", &models, Path::new("/pvc"));
        assert_eq!(got, BTreeMap::from([("c1".to_string(), PathBuf::from("/m/a.gguf"))]));
    }

    #[test]
    fn sources() {
        let sha = "ab".repeat(32);
        let root = Path::new("/mnt/pvc");
        let one = model(https("https://h/m.gguf"), Some(&sha), None);
        assert_eq!(key(&one), Some(sha.clone()));
        assert_eq!(secret_name(&one), Some("hf"));
        let creds = Some(Credentials::Bearer("t".into()));
        assert_eq!(
            source(&one, creds.clone(), root).unwrap(),
            ModelSource::Http { parts: vec![HttpPart { url: "https://h/m.gguf".into(), sha256: sha.clone() }], credentials: creds }
        );
        let parts = vec![
            ModelPart { file: "m-00001-of-00002.gguf".into(), sha256: "CD".repeat(32) },
            ModelPart { file: "m-00002-of-00002.gguf".into(), sha256: sha.clone() },
        ];
        let split = model(https("https://h/dir"), None, Some(parts.clone()));
        assert_eq!(key(&split), Some("cd".repeat(32)));
        let ModelSource::Http { parts: got, .. } = source(&split, None, root).unwrap() else { panic!() };
        assert_eq!(
            got.iter().map(|p| p.url.as_str()).collect::<Vec<_>>(),
            ["https://h/dir/m-00001-of-00002.gguf", "https://h/dir/m-00002-of-00002.gguf"]
        );
        let node =
            model(Src { https: None, node_path: Some(NodePathSource { path: "/models/q.gguf".into() }), pvc: None }, Some(&sha), None);
        assert_eq!(source(&node, None, root).unwrap(), ModelSource::Local { path: "/models/q.gguf".into(), sha256: sha.clone() });
        let pvc = model(
            Src { https: None, node_path: None, pvc: Some(PvcSource { claim_name: "weights".into(), path: "q/m.gguf".into() }) },
            Some(&sha),
            None,
        );
        assert_eq!(source(&pvc, None, root).unwrap(), ModelSource::Local { path: "/mnt/pvc/weights/q/m.gguf".into(), sha256: sha.clone() });
        let split_local =
            model(Src { https: None, node_path: Some(NodePathSource { path: "/models".into() }), pvc: None }, None, Some(parts));
        assert!(source(&split_local, None, root).unwrap_err().to_string().contains("Model ai/m: a split GGUF"));
        let neither = model(Src { https: None, node_path: None, pvc: None }, Some(&sha), None);
        assert!(source(&neither, None, root).unwrap_err().to_string().contains("exactly one of https, nodePath, pvc"));
    }

    #[test]
    fn secret_keys() {
        let data = |kv: &[(&str, &[u8])]| kv.iter().map(|(k, v)| (k.to_string(), ByteString(v.to_vec()))).collect::<BTreeMap<_, _>>();
        assert_eq!(credentials("s", &data(&[("token", b"abc\n")])).unwrap(), Credentials::Bearer("abc".into()));
        assert_eq!(
            credentials("s", &data(&[("username", b"u"), ("password", b"p")])).unwrap(),
            Credentials::Basic { user: "u".into(), password: "p".into() }
        );
        assert!(credentials("s", &data(&[("username", b"u")])).unwrap_err().to_string().contains("Secret s: expected key `token`"));
        assert!(credentials("s", &data(&[("token", &[0xff, 0xfe])])).unwrap_err().to_string().contains("`token` is not UTF-8"));
    }

    fn facts() -> HeaderFacts {
        HeaderFacts {
            arch: "qwen3moe".into(),
            experts: 16,
            top_k: 4,
            shape_class: "qwen3moe-h256-e16-top4-ffn256-0123456789abcdef".into(),
            shape_label: Some("qwen3moe-h256-e16-top4-ffn256".into()),
            quant_types: vec!["f32".into(), "q8_0".into()],
            kv_bytes_per_token: Some(8192),
            kv_window_bytes_per_sequence: Some(0),
        }
    }

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
    }

    #[test]
    fn facts_are_written_when_empty_or_equal_only() {
        let facts = facts();
        let e = entry("n1", CachePhase::Ready, 10, Some(10), None, at(1_800_000_000));
        let mut m = model(https("https://h/m.gguf"), Some(&"ab".repeat(32)), None);
        let body = model_status(&m, e.clone(), Some((&facts, 10)));
        assert_eq!(body["status"]["architecture"], "qwen3moe");
        assert_eq!(body["status"]["quantTypes"], json!(["F32", "Q8_0"]));
        assert_eq!(body["status"]["kvBytesPerToken"], 8192);
        assert_eq!(body["status"]["sizeBytes"], 10);
        assert_eq!(body["status"]["cache"][0]["node"], "n1");
        assert_eq!(body["status"]["cache"][0]["phase"], "Ready");
        assert_eq!(body["metadata"], json!({"name": "m", "namespace": "ai"}));
        // Nothing read and nothing held: no facts.
        assert_eq!(model_status(&m, e.clone(), None)["status"].as_object().unwrap().keys().collect::<Vec<_>>(), ["cache"]);
        // Equal facts from another node: co-owned.
        m.status = Some(header_status(&facts, 10));
        assert_eq!(model_status(&m, e.clone(), Some((&facts, 10)))["status"]["experts"], 16);
        // Written before kvBytesPerToken existed: the rest agrees, so the KV size is added.
        m.status = Some(ModelStatus { kv_bytes_per_token: None, ..header_status(&facts, 10) });
        assert_eq!(model_status(&m, e.clone(), Some((&facts, 10)))["status"]["kvBytesPerToken"], 8192);
        // Written before kvWindowBytesPerSequence existed (its KV size counted windowed layers
        // too): the rest agrees, so both KV facts are replaced.
        m.status = Some(ModelStatus { kv_bytes_per_token: Some(16_384), kv_window_bytes_per_sequence: None, ..header_status(&facts, 10) });
        let s = &model_status(&m, e.clone(), Some((&facts, 10)))["status"];
        assert_eq!((&s["kvBytesPerToken"], &s["kvWindowBytesPerSequence"]), (&json!(8192), &json!(0)));
        // Another window size from a current agent: not forced over it.
        let other_window = ModelStatus { kv_window_bytes_per_sequence: Some(1), ..header_status(&facts, 10) };
        m.status = Some(other_window);
        assert_eq!(model_status(&m, e.clone(), Some((&facts, 10)))["status"]["kvWindowBytesPerSequence"], 1);
        // Different facts: this node's are not forced over them; the status's are carried as they are.
        m.status = Some(ModelStatus { architecture: Some("other".into()), ..ModelStatus::default() });
        let body = model_status(&m, e.clone(), Some((&facts, 10)));
        assert_eq!(body["status"]["architecture"], "other", "{body}");
        assert!(body["status"].get("shapeClass").is_none() && body["status"].get("kvBytesPerToken").is_none(), "{body}");
        let other_kv = ModelStatus { kv_bytes_per_token: Some(1), ..header_status(&facts, 10) };
        m.status = Some(other_kv.clone());
        assert_eq!(model_status(&m, e.clone(), Some((&facts, 10)))["status"]["kvBytesPerToken"], 1);
        assert_eq!(replica_download("ai", "r1", None)["status"], json!({}));
        assert_eq!(
            replica_download("ai", "r1", Some(DownloadProgress { bytes_done: 5, bytes_total: Some(9) }))["status"],
            json!({"download": {"bytesDone": 5, "bytesTotal": 9}})
        );
    }

    #[test]
    fn an_apply_without_facts_keeps_the_facts_the_status_holds() {
        // Server-side apply drops fields their only manager leaves out: the eviction of the last
        // node that wrote the facts must not take them from the Model.
        let mut m = model(https("https://h/m.gguf"), Some(&"ab".repeat(32)), None);
        let mut held = header_status(&facts(), 10);
        held.cache = vec![entry("n2", CachePhase::Ready, 10, Some(10), None, at(1))];
        held.conditions = vec![];
        m.status = Some(held);
        let evicted = entry("n1", CachePhase::Evicted, 0, None, Some("evicted".into()), at(2));
        let body = model_status(&m, evicted, None);
        let s = &body["status"];
        assert_eq!(
            (s["shapeClass"].as_str(), s["sizeBytes"].as_u64(), s["kvBytesPerToken"].as_u64()),
            (Some(facts().shape_class.as_str()), Some(10), Some(8192))
        );
        // Only this node's entry: another node's is that node's to write.
        assert_eq!(s["cache"].as_array().unwrap().len(), 1);
        assert_eq!(s["cache"][0]["node"], "n1");
    }

    #[test]
    fn facts_read_without_the_model_are_written_only_where_they_add_something() {
        let facts = facts();
        let mut m = model(https("https://h/m.gguf"), Some(&"ab".repeat(32)), None);
        // (case, status, writes, carries this node's entry)
        let ours = entry("n1", CachePhase::Failed, 0, None, Some("no room".into()), at(1));
        let theirs = entry("n2", CachePhase::Ready, 10, Some(10), None, at(1));
        let with = |st: ModelStatus, cache: Vec<NodeCache>| Some(ModelStatus { cache, ..st });
        let cases: Vec<(&str, Option<ModelStatus>, bool, bool)> = vec![
            ("no status", None, true, false),
            ("a cache entry of another node only", with(ModelStatus::default(), vec![theirs.clone()]), true, false),
            ("this node's failed entry is kept", with(ModelStatus::default(), vec![ours.clone(), theirs.clone()]), true, true),
            ("complete and equal: nothing to add", with(header_status(&facts, 10), vec![]), false, false),
            ("equal but no KV size", with(ModelStatus { kv_bytes_per_token: None, ..header_status(&facts, 10) }, vec![]), true, false),
            (
                "equal but a KV size from before windows counted",
                with(
                    ModelStatus { kv_bytes_per_token: Some(16_384), kv_window_bytes_per_sequence: None, ..header_status(&facts, 10) },
                    vec![],
                ),
                true,
                false,
            ),
            ("other facts", with(header_status(&facts, 11), vec![]), false, false),
        ];
        m.metadata.resource_version = Some("41".into());
        for (case, status, writes, keeps_entry) in cases {
            m.status = status;
            let body = facts_status(&m, "n1", &facts, 10);
            assert_eq!(body.is_some(), writes, "{case}");
            let Some(body) = body else { continue };
            assert_eq!(body["status"]["kvBytesPerToken"], 8192, "{case}");
            assert_eq!(body["status"]["kvWindowBytesPerSequence"], 0, "{case}");
            assert_eq!(body["metadata"], json!({"name": "m", "namespace": "ai", "resourceVersion": "41"}), "{case}");
            assert_eq!(body["status"]["shapeClass"], facts.shape_class, "{case}");
            let cache = body["status"].get("cache");
            if keeps_entry {
                assert_eq!(cache, Some(&json!([ours])), "{case}");
            } else {
                assert!(cache.is_none(), "{case}: {body}");
            }
        }
    }

    #[test]
    fn which_models_need_facts() {
        let sha = "ab".repeat(32);
        let named = |ns: &str, name: &str, status: Option<ModelStatus>| {
            let mut m = model(https("https://h/m.gguf"), Some(&sha), None);
            m.metadata.namespace = Some(ns.into());
            m.metadata.name = Some(name.into());
            m.status = status;
            m
        };
        let full = header_status(&facts(), 10);
        let mut deleted = named("ai", "gone", None);
        deleted.metadata.deletion_timestamp = Some(at(5));
        let models = vec![
            named("ai", "z-none", None),
            named("ai", "complete", Some(full.clone())),
            named("ai", "no-kv", Some(ModelStatus { kv_bytes_per_token: None, ..full.clone() })),
            named("ai", "zero-kv", Some(ModelStatus { kv_bytes_per_token: Some(0), ..full.clone() })),
            named("ai", "no-window", Some(ModelStatus { kv_window_bytes_per_sequence: None, ..full.clone() })),
            named(
                "ai",
                "windows-only",
                Some(ModelStatus { kv_bytes_per_token: Some(0), kv_window_bytes_per_sequence: Some(1 << 20), ..full.clone() }),
            ),
            named("ai", "zero-size", Some(ModelStatus { size_bytes: Some(0), ..full.clone() })),
            named("ai", "empty-class", Some(ModelStatus { shape_class: Some(String::new()), ..full.clone() })),
            named(
                "ai",
                "cache-only",
                Some(ModelStatus { cache: vec![entry("n2", CachePhase::Downloading, 1, None, None, at(1))], ..ModelStatus::default() }),
            ),
            named("ai", "fetched", None),
            named("ml", "a", None),
            deleted,
        ];
        let fetched = BTreeSet::from([("ai".to_string(), "fetched".to_string())]);
        let got: Vec<String> =
            facts_needed(&models, &fetched).iter().map(|m| format!("{}/{}", m.namespace().unwrap(), m.name_any())).collect();
        assert_eq!(got, ["ai/cache-only", "ai/empty-class", "ai/no-kv", "ai/no-window", "ai/z-none", "ai/zero-kv", "ai/zero-size", "ml/a"]);
        assert!(!lacks_facts(&models[1]));
        // A status from before windows counted is complete: placement goes on with it meanwhile.
        assert!(!lacks_facts(&models[4]) && !lacks_facts(&models[5]));
    }

    #[test]
    fn a_failed_read_waits_before_the_next() {
        let wait = std::time::Duration::from_secs(600);
        let failed = ("k1".to_string(), at(1000));
        assert!(probe_due(None, "k1", &at(1000), wait));
        assert!(!probe_due(Some(&failed), "k1", &at(1000), wait));
        assert!(!probe_due(Some(&failed), "k1", &at(1599), wait));
        assert!(probe_due(Some(&failed), "k1", &at(1600), wait));
        assert!(probe_due(Some(&failed), "k2", &at(1001), wait), "a new file (spec changed) is read at once");
        assert!(!probe_due(Some(&failed), "k1", &at(10), wait), "a clock that went back waits");
    }
}
