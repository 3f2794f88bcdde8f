//! A model downloaded once and reused, through the in-memory API double:
//! two deployments' replicas on node n1 use the same Model; the agent's model cache fetches it
//! from a local HTTP server once, both replicas' node sees it Ready, and a later round asks the
//! server for nothing and writes nothing to the Model.

use std::sync::Mutex;

use brink_api::DeviceReport;
use brink_api::crd::{CachePhase, Model, ModelReplica, SparkNode};
use brink_engine::synth::{Preset, SynthSpec};
use brink_kube_double::KubeDouble;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;
use crate::model_cache::{CacheConfig, ModelCache};

/// What the file server saw: one `(Range header, body bytes sent)` per request.
type Requests = Arc<Mutex<Vec<(Option<String>, u64)>>>;

/// Serves `bytes` at `/m.gguf` (whole, or the `Range: bytes=a-` / `a-b` asked for) and counts
/// every request and the bytes it sent.
async fn counting_server(bytes: Vec<u8>) -> (String, Requests) {
    let bytes = Arc::new(bytes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Requests::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (bytes, log) = (bytes.clone(), log.clone());
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                let mut line = String::new();
                stream.read_line(&mut line).await.unwrap();
                let mut range = None;
                loop {
                    let mut h = String::new();
                    if stream.read_line(&mut h).await.unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = h.split_once(':')
                        && name.eq_ignore_ascii_case("range")
                    {
                        range = Some(value.trim().to_string());
                    }
                }
                let len = bytes.len();
                let (a, b) = range
                    .as_deref()
                    .and_then(|r| r.strip_prefix("bytes="))
                    .and_then(|r| r.split_once('-'))
                    .and_then(|(a, b)| {
                        Some((a.parse::<usize>().ok()?, if b.is_empty() { len - 1 } else { b.parse::<usize>().ok()?.min(len - 1) }))
                    })
                    .unwrap_or((0, len - 1));
                let s = stream.get_mut();
                if line.split_whitespace().nth(1) != Some("/m.gguf") {
                    let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                    return;
                }
                let head = if range.is_some() {
                    format!(
                        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{len}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        b - a + 1
                    )
                } else {
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n")
                };
                let _ = s.write_all(head.as_bytes()).await;
                let sent = if s.write_all(&bytes[a..=b]).await.is_ok() { (b - a + 1) as u64 } else { 0 };
                log.lock().unwrap().push((range, sent));
                let _ = s.shutdown().await;
            });
        }
    });
    (base, seen)
}

/// A replica of `deployment` on `node` using Model `m`.
fn replica(name: &str, deployment: &str, node: &str) -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
        "metadata": { "name": name, "namespace": "ai" },
        "spec": {
            "deployment": deployment, "node": node, "model": "m", "revision": "r1",
            "engine": { "image": "brink:1", "version": "0.1.0" },
            "serving": { "context": 4096, "maxBatchTokens": 8192, "prefillChunk": 2048, "concurrency": 4, "kvFraction": 0.5 }
        }
    })
}

#[tokio::test]
async fn two_deployments_on_one_node_share_one_download_and_a_later_round_fetches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("src.gguf");
    brink_engine::synth::generate(&SynthSpec::from_preset(Preset::Tiny), &file, |_, _| {}).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    let size = bytes.len() as u64;
    let sha: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    let (base, served) = counting_server(bytes).await;

    let double = KubeDouble::new();
    double
        .seed_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "Model",
            "metadata": { "name": "m", "namespace": "ai" },
            "spec": { "source": { "https": { "url": format!("{base}/m.gguf") } }, "sha256": sha, "format": "gguf" }
        }))
        .unwrap();
    double
        .seed_value(json!({ "apiVersion": "brink.dev/v1alpha1", "kind": "SparkNode", "metadata": { "name": "n1" }, "spec": {} }))
        .unwrap();
    // Two deployments, one replica each, both on n1; one more on n2 (another agent's).
    for (name, dep, node) in [("chat-0", "chat", "n1"), ("code-0", "code", "n1"), ("chat-1", "chat", "n2")] {
        double.seed_value(replica(name, dep, node)).unwrap();
    }

    let probes = Probes { now: Arc::new(|| Timestamp::from_second(NOW).unwrap()), memory: Arc::new(|| Some(memory())) };
    let state = NodeState::new(DeviceReport::none("no CUDA driver (libcuda.so) on this machine"), node_fingerprint(), None);
    let agent = Arc::new(Agent::new(double.client(), settings(std::path::Path::new("/mnt/pvc")), probes, state));
    let cache = ModelCache::open(CacheConfig::new(dir.path().join("cache"), 1 << 30)).unwrap();

    agent.sync_models(&cache).await.unwrap();
    // One full GET: the two replicas' shared Model came down once.
    assert_eq!(*served.lock().unwrap(), [(None, size)], "one whole-file request for two replicas");
    let entries = cache.entries().unwrap();
    assert_eq!((entries.len(), entries[0].sha256.as_str()), (1, sha.as_str()));
    let model: Model = double.get(Some("ai"), "m").unwrap();
    let status = model.status.clone().unwrap();
    let ours: Vec<(&str, CachePhase, u64)> = status.cache.iter().map(|e| (e.node.as_str(), e.phase, e.bytes_done)).collect();
    assert_eq!(ours, [("n1", CachePhase::Ready, size)]);
    assert_eq!(status.size_bytes, Some(size));
    // Both replicas are on n1's list with the model; neither shows a download in progress.
    let node: SparkNode = double.get(None, "n1").unwrap();
    let hosted: Vec<(String, String)> = node.status.unwrap().replicas.iter().map(|r| (r.name.clone(), r.model.clone())).collect();
    assert_eq!(hosted, [("chat-0".to_string(), "m".to_string()), ("code-0".to_string(), "m".to_string())]);
    for name in ["chat-0", "code-0"] {
        let r: ModelReplica = double.get(Some("ai"), name).unwrap();
        assert_eq!(r.status.and_then(|s| s.download), None, "{name}: the download is over");
    }

    // A later round: the cache holds it and the Model says Ready on n1. No request to the
    // file server, no write to the Model.
    let model_rv = model.resource_version();
    agent.sync_models(&cache).await.unwrap();
    agent.sync_models(&cache).await.unwrap();
    assert_eq!(served.lock().unwrap().len(), 1, "a cached model is not fetched again");
    assert_eq!(double.get::<Model>(Some("ai"), "m").unwrap().resource_version(), model_rv);
    let node: SparkNode = double.get(None, "n1").unwrap();
    let memory: Vec<u64> = node.status.unwrap().replicas.iter().map(|r| r.memory_bytes).collect();
    assert_eq!(memory, [size, size], "each replica's memory now counts the model's size");
}
