//! The model cache in cluster mode: a Model used by a replica on this node is downloaded from a
//! local HTTP server (with the bearer token from its credentials Secret), verified, and its
//! status written (this node's cache entry, the header facts; the replica's download progress
//! and then its removal). A second round finds it cached and writes nothing.

use std::sync::Mutex;

use brink_engine::synth::{Preset, SynthSpec};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;
use crate::model_cache::{CacheConfig, ModelCache};

/// Serves `files` (by path) to requests carrying `Authorization: Bearer tok`; logs them.
async fn file_server(files: Vec<(&'static str, Vec<u8>)>) -> (String, Arc<Mutex<Vec<String>>>) {
    let files: Arc<std::collections::HashMap<&'static str, Vec<u8>>> = Arc::new(files.into_iter().collect());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (files, log) = (files.clone(), log.clone());
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                let mut line = String::new();
                stream.read_line(&mut line).await.unwrap();
                let mut auth = String::new();
                loop {
                    let mut h = String::new();
                    if stream.read_line(&mut h).await.unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some(v) = h.strip_prefix("authorization:").or_else(|| h.strip_prefix("Authorization:")) {
                        auth = v.trim().to_string();
                    }
                }
                log.lock().unwrap().push(format!("{} {auth}", line.trim()));
                let s = stream.get_mut();
                if auth != "Bearer tok" {
                    let _ = s.write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                    return;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("/");
                let Some(bytes) = files.get(path) else {
                    let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                    return;
                };
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", bytes.len());
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(bytes).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (base, seen)
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({ "apiVersion": "brink.dev/v1alpha1", "kind": kind, "metadata": {}, "items": items })
}

fn replica(name: &str, node: &str) -> Value {
    replica_of(name, node, "m")
}

fn replica_of(name: &str, node: &str, model: &str) -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
        "metadata": { "name": name, "namespace": "ai" },
        "spec": {
            "deployment": "d", "node": node, "model": model, "revision": "r1",
            "engine": { "image": "brink:1", "version": "0.1.0" },
            "serving": { "context": 4096, "maxBatchTokens": 8192, "prefillChunk": 2048, "concurrency": 4, "kvFraction": 0.5 }
        }
    })
}

fn model(url: &str, sha: &str, status: Option<Value>) -> Value {
    model_named("m", url, sha, status)
}

fn model_named(name: &str, url: &str, sha: &str, status: Option<Value>) -> Value {
    let mut m = json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "Model",
        "metadata": { "name": name, "namespace": "ai" },
        "spec": { "source": { "https": { "url": url, "credentialsSecretRef": { "name": "hf" } } }, "sha256": sha, "format": "gguf" }
    });
    if let Some(s) = status {
        m["status"] = s;
    }
    m
}

const REPLICAS: &str = "/apis/brink.dev/v1alpha1/modelreplicas?";
const MODELS: &str = "/apis/brink.dev/v1alpha1/models?";
const MODEL_STATUS: &str = "/apis/brink.dev/v1alpha1/namespaces/ai/models/m/status?&force=true&fieldManager=brink-agent-n1";
const R1_STATUS: &str = "/apis/brink.dev/v1alpha1/namespaces/ai/modelreplicas/r1/status?&force=true&fieldManager=brink-agent-n1";

#[tokio::test]
async fn a_model_is_downloaded_verified_and_its_status_written() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("src.gguf");
    brink_engine::synth::generate(&SynthSpec::from_preset(Preset::Tiny), &file, |_, _| {}).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    let size = bytes.len() as u64;
    let sha: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    let (base, seen) = file_server(vec![("/m.gguf", bytes)]).await;
    let url = format!("{base}/m.gguf");
    let cache = Arc::new(ModelCache::open(CacheConfig::new(dir.path().join("cache"), 1 << 30)).unwrap());

    let (agent, mut api) = agent();
    let (a, c) = (agent.clone(), cache.clone());
    let task = tokio::spawn(async move { a.sync_models(&c).await });
    api.expect("GET", REPLICAS, 200, list("ModelReplicaList", vec![replica("r1", "n1"), replica("r2", "n2")])).await;
    api.expect("GET", MODELS, 200, list("ModelList", vec![model(&url, &sha, None)])).await;
    // The replica on this node is listed in the SparkNode.
    let node = api
        .expect("PATCH", "/apis/brink.dev/v1alpha1/sparknodes/n1/status?&force=true&fieldManager=brink-agent", 200, spark_node(&[], None))
        .await;
    assert_eq!(node.body["status"]["replicas"], json!([{"namespace": "ai", "name": "r1", "model": "m", "memoryBytes": 0}]));
    api.expect(
        "GET",
        "/api/v1/namespaces/ai/secrets/hf",
        200,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "ai"}, "data": {"token": "dG9r"}}),
    )
    .await;
    let start = api.expect("PATCH", MODEL_STATUS, 200, model(&url, &sha, None)).await;
    assert_eq!(start.content_type.as_deref(), Some(APPLY));
    assert_eq!(start.body["metadata"], json!({"name": "m", "namespace": "ai"}));
    assert_eq!(start.body["status"], json!({"cache": [{"node": "n1", "phase": "Downloading", "bytesDone": 0, "updatedAt": NOW_TEXT}]}));
    let r1 = api.expect("PATCH", R1_STATUS, 200, replica("r1", "n1")).await;
    assert_eq!(r1.body["status"], json!({"download": {"bytesDone": 0}}));
    let ready = api.expect("PATCH", MODEL_STATUS, 200, model(&url, &sha, None)).await;
    let s = &ready.body["status"];
    assert_eq!(s["cache"], json!([{"node": "n1", "phase": "Ready", "bytesDone": size, "bytesTotal": size, "updatedAt": NOW_TEXT}]));
    assert_eq!(s["architecture"], "qwen3moe");
    assert_eq!(s["sizeBytes"], size);
    assert!(s["shapeClass"].as_str().unwrap().starts_with("qwen3moe-h"), "{s}");
    assert!(s["experts"].as_u64().unwrap() > 0 && s["topK"].as_u64().unwrap() > 0, "{s}");
    assert!(!s["quantTypes"].as_array().unwrap().is_empty(), "{s}");
    // Tiny: 2 layers x 2 KV heads x 64 dims x (K and V) x 2 bytes (f16).
    assert_eq!(s["kvBytesPerToken"], 1024);
    let s = s.clone();
    let r1 = api.expect("PATCH", R1_STATUS, 200, replica("r1", "n1")).await;
    assert_eq!(r1.body["status"], json!({}), "the finished download's progress is removed");
    finish(task).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert!(seen.lock().unwrap()[0].starts_with("GET /m.gguf"));
    let entries = cache.entries().unwrap();
    assert_eq!((entries.len(), entries[0].sha256.as_str()), (1, sha.as_str()));

    // Second round: the Model says Ready on n1, with the facts, and the cache holds it: no
    // download, no Model writes.
    let mut ready_status = s.clone();
    ready_status["cache"] = json!([{"node": "n1", "phase": "Ready", "bytesDone": size, "bytesTotal": size}]);
    let (a, c) = (agent.clone(), cache.clone());
    let task = tokio::spawn(async move { a.sync_models(&c).await });
    api.expect("GET", REPLICAS, 200, list("ModelReplicaList", vec![replica("r1", "n1")])).await;
    api.expect("GET", MODELS, 200, list("ModelList", vec![model(&url, &sha, Some(ready_status.clone()))])).await;
    // The Model's size is known now: the replica's memory in the SparkNode says it.
    let node = api
        .expect("PATCH", "/apis/brink.dev/v1alpha1/sparknodes/n1/status?&force=true&fieldManager=brink-agent", 200, spark_node(&[], None))
        .await;
    assert_eq!(node.body["status"]["replicas"][0]["memoryBytes"], size);
    finish(task).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1, "a cached model is not downloaded again");

    // Third round: the status lost kvBytesPerToken (written by an older agent): the facts come
    // from the cache, with no request to the file server; this node's entry is kept.
    let mut old_status = ready_status.clone();
    old_status.as_object_mut().unwrap().remove("kvBytesPerToken");
    let (a, c) = (agent.clone(), cache.clone());
    let task = tokio::spawn(async move { a.sync_models(&c).await });
    api.expect("GET", REPLICAS, 200, list("ModelReplicaList", vec![replica("r1", "n1")])).await;
    api.expect("GET", MODELS, 200, list("ModelList", vec![model(&url, &sha, Some(old_status))])).await;
    let facts = api.expect("PATCH", MODEL_STATUS, 200, model(&url, &sha, None)).await;
    finish(task).await.unwrap();
    assert_eq!(facts.body["status"], ready_status, "the facts with kvBytesPerToken and this node's entry");
    assert_eq!(seen.lock().unwrap().len(), 1, "facts from the cache need no request");
}

#[tokio::test]
async fn a_wrong_checksum_is_written_as_failed() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _seen) = file_server(vec![("/m.gguf", b"not the model".to_vec())]).await;
    let url = format!("{base}/m.gguf");
    let sha = "0".repeat(64);
    let cache = Arc::new(ModelCache::open(CacheConfig::new(dir.path().join("cache"), 1 << 30)).unwrap());
    let (agent, mut api) = agent();
    let (a, c) = (agent.clone(), cache.clone());
    let task = tokio::spawn(async move { a.sync_models(&c).await });
    api.expect("GET", REPLICAS, 200, list("ModelReplicaList", vec![replica("r1", "n1")])).await;
    api.expect("GET", MODELS, 200, list("ModelList", vec![model(&url, &sha, None)])).await;
    api.expect("PATCH", "/apis/brink.dev/v1alpha1/sparknodes/n1/status?&force=true&fieldManager=brink-agent", 200, spark_node(&[], None))
        .await;
    api.expect(
        "GET",
        "/api/v1/namespaces/ai/secrets/hf",
        200,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"}, "data": {"token": "dG9r"}}),
    )
    .await;
    api.expect("PATCH", MODEL_STATUS, 200, model(&url, &sha, None)).await;
    api.expect("PATCH", R1_STATUS, 200, replica("r1", "n1")).await;
    let failed = api.expect("PATCH", MODEL_STATUS, 200, model(&url, &sha, None)).await;
    let entry = &failed.body["status"]["cache"][0];
    assert_eq!(entry["phase"], "Failed");
    assert!(entry["message"].as_str().unwrap().contains("checksum mismatch"), "{entry}");
    assert!(failed.body["status"].get("architecture").is_none());
    api.expect("PATCH", R1_STATUS, 200, replica("r1", "n1")).await;
    finish(task).await.unwrap();
}

/// A synthetic model (the seed changes its bytes, not its size) and its sha256.
fn synth(dir: &std::path::Path, seed: u64) -> (Vec<u8>, String) {
    let path = dir.join(format!("m{seed}.gguf"));
    brink_engine::synth::generate(&SynthSpec { seed, ..SynthSpec::from_preset(Preset::Tiny) }, &path, |_, _| {}).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let sha = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    (bytes, sha)
}

#[tokio::test]
async fn a_full_budget_evicts_the_unused_model_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (old, old_sha) = synth(dir.path(), 1);
    let (new, new_sha) = synth(dir.path(), 2);
    let size = old.len() as u64;
    let (base, _seen) = file_server(vec![("/old.gguf", old), ("/new.gguf", new)]).await;
    // Room for one model only.
    let cache = Arc::new(ModelCache::open(CacheConfig::new(dir.path().join("cache"), size + size / 2)).unwrap());
    let src = crate::model_cache::ModelSource::Http {
        parts: vec![crate::model_cache::HttpPart { url: format!("{base}/old.gguf"), sha256: old_sha.clone() }],
        credentials: Some(crate::model_cache::Credentials::Bearer("tok".into())),
    };
    cache.ensure(&src, &Default::default(), &mut |_, _| {}).await.unwrap();

    let facts = cache.entries().unwrap()[0].header.clone().unwrap();
    let mut ready = serde_json::to_value(crate::cluster::cache_plan::header_status(&facts, size)).unwrap();
    ready["cache"] = json!([{"node": "n1", "phase": "Ready", "bytesDone": size, "bytesTotal": size}]);
    let (agent, mut api) = agent();
    let (a, c) = (agent.clone(), cache.clone());
    let task = tokio::spawn(async move { a.sync_models(&c).await });
    api.expect("GET", REPLICAS, 200, list("ModelReplicaList", vec![replica_of("r1", "n1", "new")])).await;
    let models = vec![
        model_named("old", &format!("{base}/old.gguf"), &old_sha, Some(ready)),
        model_named("new", &format!("{base}/new.gguf"), &new_sha, None),
    ];
    api.expect("GET", MODELS, 200, list("ModelList", models)).await;
    api.expect("PATCH", "/apis/brink.dev/v1alpha1/sparknodes/n1/status?&force=true&fieldManager=brink-agent", 200, spark_node(&[], None))
        .await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"}, "data": {"token": "dG9r"}});
    api.expect("GET", "/api/v1/namespaces/ai/secrets/hf", 200, secret).await;
    let new_status = "/apis/brink.dev/v1alpha1/namespaces/ai/models/new/status?&force=true&fieldManager=brink-agent-n1";
    let r1_status = "/apis/brink.dev/v1alpha1/namespaces/ai/modelreplicas/r1/status?&force=true&fieldManager=brink-agent-n1";
    api.expect("PATCH", new_status, 200, model_named("new", "https://h/new.gguf", &new_sha, None)).await;
    api.expect("PATCH", r1_status, 200, replica_of("r1", "n1", "new")).await;
    let done = api.expect("PATCH", new_status, 200, model_named("new", "https://h/new.gguf", &new_sha, None)).await;
    assert_eq!(done.body["status"]["cache"][0]["phase"], "Ready");
    api.expect("PATCH", r1_status, 200, replica_of("r1", "n1", "new")).await;
    let evicted = api
        .expect(
            "PATCH",
            "/apis/brink.dev/v1alpha1/namespaces/ai/models/old/status?&force=true&fieldManager=brink-agent-n1",
            200,
            model_named("old", "https://h/old.gguf", &old_sha, None),
        )
        .await;
    let entry = &evicted.body["status"]["cache"][0];
    assert_eq!((entry["node"].as_str(), entry["phase"].as_str()), (Some("n1"), Some("Evicted")), "{entry}");
    assert!(entry["message"].as_str().unwrap().starts_with("evicted to make room"), "{entry}");
    // The facts stay with the Model when its last copy goes: placement needs them.
    assert_eq!(evicted.body["status"]["shapeClass"], facts.shape_class);
    assert_eq!(evicted.body["status"]["kvBytesPerToken"], json!(facts.kv_bytes_per_token));
    finish(task).await.unwrap();
    let keys: Vec<String> = cache.entries().unwrap().into_iter().map(|e| e.sha256).collect();
    assert_eq!(keys, vec![new_sha]);
}
