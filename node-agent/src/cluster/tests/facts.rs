//! Model facts for placement before any replica exists: a Model no replica uses gets its
//! header facts (shape class, size, KV bytes per token) from `Range` requests to its https
//! source (the test server counts the bytes it serves: never the whole file), or from its local
//! file read in place; a source that fails is not asked again before the retry time.

use std::sync::Mutex;

use brink_engine::synth::{Preset, SynthSpec};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;
use crate::model_cache::{CacheConfig, ModelCache, RangePolicy};

/// What the server saw: each request's `Range` header (None: a request without one) and the
/// body bytes it sent in all.
#[derive(Default)]
pub(super) struct Served {
    ranges: Vec<Option<String>>,
    body_bytes: u64,
}

/// Serves `bytes` at `/m.gguf` to `Authorization: Bearer tok`, honouring `Range: bytes=a-b`.
pub(super) async fn range_server(bytes: Vec<u8>) -> (String, Arc<Mutex<Served>>) {
    let bytes = Arc::new(bytes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = Arc::new(Mutex::new(Served::default()));
    let log = served.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (bytes, log) = (bytes.clone(), log.clone());
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                let mut line = String::new();
                stream.read_line(&mut line).await.unwrap();
                let (mut auth, mut range) = (String::new(), None);
                loop {
                    let mut h = String::new();
                    if stream.read_line(&mut h).await.unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    let (name, value) = h.split_once(':').unwrap_or((&h, ""));
                    match name.to_ascii_lowercase().as_str() {
                        "authorization" => auth = value.trim().to_string(),
                        "range" => range = Some(value.trim().to_string()),
                        _ => {}
                    }
                }
                log.lock().unwrap().ranges.push(range.clone());
                let s = stream.get_mut();
                if auth != "Bearer tok" || line.split_whitespace().nth(1) != Some("/m.gguf") {
                    let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                    return;
                }
                let len = bytes.len() as u64;
                let asked = range.as_deref().and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.split_once('-')).and_then(|(a, b)| {
                    let a: u64 = a.parse().ok()?;
                    let b: u64 = if b.is_empty() { len - 1 } else { b.parse::<u64>().ok()?.min(len - 1) };
                    (a <= b).then_some((a, b))
                });
                let (head, body) = match asked {
                    Some((a, b)) => (
                        format!(
                            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{len}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            b - a + 1
                        ),
                        &bytes[a as usize..=b as usize],
                    ),
                    None => (format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"), &bytes[..]),
                };
                let _ = s.write_all(head.as_bytes()).await;
                if s.write_all(body).await.is_ok() {
                    log.lock().unwrap().body_bytes += body.len() as u64;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    (base, served)
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({ "apiVersion": "brink.dev/v1alpha1", "kind": kind, "metadata": {}, "items": items })
}

fn model(source: Value, sha: &str) -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "Model",
        "metadata": { "name": "m", "namespace": "ai" },
        "spec": { "source": source, "sha256": sha, "format": "gguf" }
    })
}

fn https(url: &str) -> Value {
    json!({ "https": { "url": url, "credentialsSecretRef": { "name": "hf" } } })
}

/// A synthetic Qwen3-MoE model file (Tiny: 2 layers, 2 KV heads of 64 dims), its bytes and sha256.
fn synth(dir: &std::path::Path) -> (std::path::PathBuf, Vec<u8>, String) {
    let path = dir.join("src.gguf");
    brink_engine::synth::generate(&SynthSpec::from_preset(Preset::Tiny), &path, |_, _| {}).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let sha = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    (path, bytes, sha)
}

const REPLICAS: &str = "/apis/brink.dev/v1alpha1/modelreplicas?";
const MODELS: &str = "/apis/brink.dev/v1alpha1/models?";
const SECRET: &str = "/api/v1/namespaces/ai/secrets/hf";
const MODEL_STATUS: &str = "/apis/brink.dev/v1alpha1/namespaces/ai/models/m/status?&force=true&fieldManager=brink-agent-n1";

fn secret() -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "ai"}, "data": {"token": "dG9r"}})
}

/// The facts the engine's reader gives for the whole file (the download path's facts).
fn expected(path: &std::path::Path, size: u64) -> Value {
    let facts = crate::model_cache::header::read(path).unwrap();
    serde_json::to_value(crate::cluster::cache_plan::header_status(&facts, size)).unwrap()
}

#[tokio::test]
async fn an_unused_https_model_gets_its_facts_from_ranged_reads_only() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes, sha) = synth(dir.path());
    let size = bytes.len() as u64;
    let (base, served) = range_server(bytes).await;
    let url = format!("{base}/m.gguf");
    // A small first range, so the prefix must grow over several requests.
    let config = CacheConfig {
        header_range: RangePolicy { first_bytes: 256, cap_bytes: 1 << 20 },
        ..CacheConfig::new(dir.path().join("cache"), 1 << 30)
    };
    let cache = Arc::new(ModelCache::open(config).unwrap());

    let (agent, mut api) = agent();
    let (a, c) = (agent.clone(), cache.clone());
    let task = tokio::spawn(async move { a.sync_models(&c).await });
    api.expect("GET", REPLICAS, 200, list("ModelReplicaList", vec![])).await;
    api.expect("GET", MODELS, 200, list("ModelList", vec![model(https(&url), &sha)])).await;
    api.expect("GET", SECRET, 200, secret()).await;
    let written = api.expect("PATCH", MODEL_STATUS, 200, model(https(&url), &sha)).await;
    assert_eq!(written.content_type.as_deref(), Some(APPLY));
    finish(task).await.unwrap();

    let s = &written.body["status"];
    // Tiny: 2 layers x 2 KV heads x 64 dims x (K and V) x 2 bytes (f16).
    assert_eq!(s["kvBytesPerToken"], 2 * 2 * 64 * 2 * 2);
    assert_eq!(s["sizeBytes"], size);
    assert_eq!(s, &expected(&path, size), "the same facts a download reads");
    assert!(s.get("cache").is_none(), "this node holds no copy, so it writes no cache entry: {s}");

    let served = served.lock().unwrap();
    assert!(served.ranges.len() >= 3, "the prefix grows from 256 bytes: {:?}", served.ranges);
    assert!(served.ranges.iter().all(|r| r.is_some()), "every request is ranged: {:?}", served.ranges);
    assert_eq!(served.ranges[0].as_deref(), Some("bytes=0-255"));
    let data_start = brink_engine::gguf::GgufFile::open(&path).unwrap().parts()[0].data_start();
    assert!(served.body_bytes < 2 * data_start, "{} bytes served for a {data_start}-byte header", served.body_bytes);
    assert!(served.body_bytes < size / 2, "{} of {size} bytes served: not a download", served.body_bytes);
    // Nothing kept: no cached model, no partial download, no scratch files.
    assert!(cache.entries().unwrap().is_empty());
    assert_eq!(std::fs::read_dir(dir.path().join("cache/partial")).unwrap().count(), 0);
    assert!(!dir.path().join("cache/probe").join(&sha).exists());
}

#[tokio::test]
async fn a_header_past_the_cap_fails_clearly_and_waits_before_another_try() {
    let dir = tempfile::tempdir().unwrap();
    let (_path, bytes, sha) = synth(dir.path());
    let (base, served) = range_server(bytes).await;
    let url = format!("{base}/m.gguf");
    let config = CacheConfig {
        header_range: RangePolicy { first_bytes: 64, cap_bytes: 128 },
        ..CacheConfig::new(dir.path().join("cache"), 1 << 30)
    };
    let cache = Arc::new(ModelCache::open(config).unwrap());

    // The cache's own error names the URL and the cap.
    let src = crate::model_cache::ModelSource::Http {
        parts: vec![crate::model_cache::HttpPart { url: url.clone(), sha256: sha.clone() }],
        credentials: Some(crate::model_cache::Credentials::Bearer("tok".into())),
    };
    let e = cache.probe(&src).await.unwrap_err().to_string();
    assert!(e.contains(&url) && e.contains("first 128 bytes"), "{e}");
    assert_eq!(served.lock().unwrap().body_bytes, 128);

    let (agent, mut api) = agent();
    for round in 0..2 {
        let (a, c) = (agent.clone(), cache.clone());
        let task = tokio::spawn(async move { a.sync_models(&c).await });
        api.expect("GET", REPLICAS, 200, list("ModelReplicaList", vec![])).await;
        api.expect("GET", MODELS, 200, list("ModelList", vec![model(https(&url), &sha)])).await;
        if round == 0 {
            // Read and failed: no status is written (another node may read it, and the
            // round itself succeeds).
            api.expect("GET", SECRET, 200, secret()).await;
        }
        // The second round, at the same time, asks nothing: not before the retry time.
        finish(task).await.unwrap();
    }
    assert_eq!(served.lock().unwrap().body_bytes, 256);
}

#[tokio::test]
async fn an_unused_local_model_is_read_in_place_and_a_missing_one_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes, sha) = synth(dir.path());
    let size = bytes.len() as u64;
    let cache = Arc::new(ModelCache::open(CacheConfig::new(dir.path().join("cache"), 1 << 30)).unwrap());
    let here = json!({ "nodePath": { "path": path.to_str().unwrap() } });
    let elsewhere = json!({ "nodePath": { "path": dir.path().join("not-on-this-node.gguf").to_str().unwrap() } });
    let mut other = model(elsewhere, &sha);
    other["metadata"]["name"] = json!("other");

    let (agent, mut api) = agent();
    let (a, c) = (agent.clone(), cache.clone());
    let task = tokio::spawn(async move { a.sync_models(&c).await });
    api.expect("GET", REPLICAS, 200, list("ModelReplicaList", vec![])).await;
    api.expect("GET", MODELS, 200, list("ModelList", vec![model(here.clone(), &sha), other])).await;
    let written = api.expect("PATCH", MODEL_STATUS, 200, model(here, &sha)).await;
    finish(task).await.unwrap();
    assert_eq!(written.body["status"], expected(&path, size));
    assert!(cache.entries().unwrap().is_empty(), "a local file is not copied into the cache");
}

#[tokio::test]
async fn a_second_agent_with_an_older_list_gets_409_and_decides_again() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes, sha) = synth(dir.path());
    let size = bytes.len() as u64;
    let (base, served) = range_server(bytes).await;
    let url = format!("{base}/m.gguf");
    let cache = Arc::new(ModelCache::open(CacheConfig::new(dir.path().join("cache"), 1 << 30)).unwrap());
    let mut listed = model(https(&url), &sha);
    listed["metadata"]["resourceVersion"] = json!("7");

    let (agent, mut api) = agent();
    let (a, c) = (agent.clone(), cache.clone());
    let task = tokio::spawn(async move { a.sync_models(&c).await });
    api.expect("GET", REPLICAS, 200, list("ModelReplicaList", vec![])).await;
    api.expect("GET", MODELS, 200, list("ModelList", vec![listed.clone()])).await;
    api.expect("GET", SECRET, 200, secret()).await;
    // Another node's agent wrote the facts after this one listed the Model.
    let conflict = status(409, "Conflict", "the object has been modified; please apply your changes to the latest version");
    let sent = api.expect("PATCH", MODEL_STATUS, 409, conflict).await;
    assert_eq!(sent.body["metadata"]["resourceVersion"], "7", "the apply is conditional on what was listed");
    finish(task).await.expect("a lost race is not an error");
    let requests = served.lock().unwrap().ranges.len();

    // The next round lists the Model with the other agent's facts: nothing to read or write.
    let mut written = listed.clone();
    written["metadata"]["resourceVersion"] = json!("8");
    written["status"] = expected(&path, size);
    let (a, c) = (agent.clone(), cache.clone());
    let task = tokio::spawn(async move { a.sync_models(&c).await });
    api.expect("GET", REPLICAS, 200, list("ModelReplicaList", vec![])).await;
    api.expect("GET", MODELS, 200, list("ModelList", vec![written])).await;
    finish(task).await.unwrap();
    assert_eq!(served.lock().unwrap().ranges.len(), requests, "no header read for a Model that has its facts");
}
