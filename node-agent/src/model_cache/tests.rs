//! The cache against a real HTTP server on a local port, serving synthetic GGUF models.
//!
//! The server is a few lines over a tokio listener rather than axum: the tests need exact
//! control of the wire (a connection closed after N body bytes, a server that ignores Range),
//! and it counts the body bytes it sends.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brink_engine::synth::{Preset, SynthSpec};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::*;

/// One request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    #[allow(dead_code)] // Shown through Debug when an assertion on `seen()` fails.
    path: String,
    range: Option<String>,
    status: u16,
}

#[derive(Default)]
struct Behaviour {
    files: HashMap<String, Vec<u8>>,
    /// Answer every request with 200 and the whole file.
    ignore_range: bool,
    /// Close the first response's connection after this many body bytes.
    drop_first_after: Option<usize>,
    /// `Authorization` value required, when set.
    require_auth: Option<String>,
    seen: Vec<Seen>,
    body_bytes_sent: u64,
}

struct Server {
    base: String,
    state: Arc<Mutex<Behaviour>>,
}

impl Server {
    async fn start(behaviour: Behaviour) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(behaviour));
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_one(stream, shared.clone()));
            }
        });
        Server { base, state }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base)
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    fn body_bytes_sent(&self) -> u64 {
        self.state.lock().unwrap().body_bytes_sent
    }
}

/// Reads one request and answers it, then closes the connection.
async fn serve_one(stream: tokio::net::TcpStream, state: Arc<Mutex<Behaviour>>) {
    let mut stream = BufReader::new(stream);
    let mut request_line = String::new();
    if stream.read_line(&mut request_line).await.unwrap_or(0) == 0 {
        return;
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.trim_end().split_once(':') {
            match name.to_ascii_lowercase().as_str() {
                "range" => range = Some(value.trim().to_string()),
                "authorization" => auth = Some(value.trim().to_string()),
                _ => {}
            }
        }
    }
    // Decide the answer under the lock, then write without it.
    let (head, body) = {
        let mut s = state.lock().unwrap();
        let first = s.seen.is_empty();
        let (status, head, body): (u16, String, Vec<u8>) = match (s.files.get(&path), &s.require_auth) {
            (_, Some(want)) if auth.as_ref() != Some(want) => (401, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n".into(), vec![]),
            (None, _) => (404, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n".into(), vec![]),
            (Some(file), _) => {
                // `bytes=START-` or `bytes=START-END` (the header probe's bounded ranges).
                let asked = range.as_deref().and_then(|r| {
                    let (a, b) = r.strip_prefix("bytes=")?.split_once('-')?;
                    let end = if b.is_empty() { None } else { Some(b.parse::<usize>().ok()?) };
                    Some((a.parse::<usize>().ok()?, end))
                });
                let start = asked.map(|(a, _)| a);
                let last = |len: usize| asked.and_then(|(_, b)| b).map_or(len - 1, |b| b.min(len - 1));
                match start {
                    Some(start) if !s.ignore_range && start >= file.len() => (
                        416,
                        format!("HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{}\r\nContent-Length: 0\r\n", file.len()),
                        vec![],
                    ),
                    Some(start) if !s.ignore_range => {
                        let end = last(file.len());
                        let head = format!(
                            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{end}/{}\r\nContent-Length: {}\r\n",
                            file.len(),
                            end + 1 - start
                        );
                        (206, head, file[start..=end].to_vec())
                    }
                    _ => (200, format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n", file.len()), file.clone()),
                }
            }
        };
        // The promised length stays in the head: the client sees a body cut short.
        let body = match s.drop_first_after {
            Some(n) if first && body.len() > n => body[..n].to_vec(),
            _ => body,
        };
        s.seen.push(Seen { path, range, status });
        s.body_bytes_sent += body.len() as u64;
        (format!("{head}Connection: close\r\n\r\n"), body)
    };
    let stream = stream.get_mut();
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&body).await;
    let _ = stream.shutdown().await;
}

/// A tiny synthetic model (seed changes the bytes, not the size) and its sha256.
fn tiny_model(dir: &Path, seed: u64) -> (Vec<u8>, String) {
    let spec = SynthSpec { seed, ..SynthSpec::from_preset(Preset::Tiny) };
    let path = dir.join(format!("tiny-{seed}.gguf"));
    brink_engine::synth::generate(&spec, &path, |_, _| {}).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let sha = download::hex(&Sha256::digest(&bytes));
    (bytes, sha)
}

fn config(root: &Path, budget: u64) -> CacheConfig {
    CacheConfig { retry_delay: Duration::from_millis(10), read_timeout: Duration::from_secs(10), ..CacheConfig::new(root, budget) }
}

fn http(server: &Server, path: &str, sha: &str) -> ModelSource {
    ModelSource::Http { parts: vec![HttpPart { url: server.url(path), sha256: sha.to_string() }], credentials: None }
}

async fn ensure(cache: &ModelCache, source: &ModelSource, in_use: &[&str]) -> Result<CachedModel, CacheError> {
    let in_use: HashSet<String> = in_use.iter().map(|s| s.to_string()).collect();
    cache.ensure(source, &in_use, &mut |_, _| {}).await
}

/// Sets each model's last use, oldest first, so the LRU order does not depend on timing.
fn set_last_used(root: &Path, order: &[&str]) {
    let mut index = Index::load(root).unwrap();
    for (i, sha) in order.iter().enumerate() {
        index.get_mut(sha).unwrap().last_used_ms = 1_000 + i as u64;
    }
    index.save(root).unwrap();
}

fn partial_files(root: &Path) -> usize {
    std::fs::read_dir(root.join("partial")).unwrap().count()
}

#[tokio::test]
async fn an_interrupted_transfer_resumes_with_range_and_the_header_facts_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 0);
    let size = model.len() as u64;
    let cut = model.len() / 3;
    let server = Server::start(Behaviour {
        files: HashMap::from([("m.gguf".to_string(), model.clone())]),
        drop_first_after: Some(cut),
        ..Behaviour::default()
    })
    .await;
    let cache = ModelCache::open(config(&dir.path().join("cache"), 10 * size)).unwrap();
    let mut updates = Vec::new();
    let got = cache.ensure(&http(&server, "m.gguf", &sha), &HashSet::new(), &mut |part, p| updates.push((part, p))).await.unwrap();

    let seen = server.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!((seen[0].status, seen[0].range.as_deref()), (200, None));
    assert_eq!((seen[1].status, seen[1].range.clone()), (206, Some(format!("bytes={cut}-"))));
    assert!(server.body_bytes_sent() < 2 * size, "{} bytes sent for a {size}-byte file", server.body_bytes_sent());
    assert_eq!(server.body_bytes_sent(), size, "the resume sent only the missing bytes");

    assert_eq!(got.path, dir.path().join("cache/models").join(format!("{sha}.gguf")));
    assert_eq!(std::fs::read(&got.path).unwrap(), model);
    assert_eq!((got.sha256.as_str(), got.size, got.fetched), (sha.as_str(), size, true));
    assert_eq!(partial_files(cache.root()), 0);
    assert!(updates.windows(2).all(|w| w[0].1.bytes <= w[1].1.bytes), "progress never goes back without a restart");
    assert_eq!(updates.last().unwrap(), &(0, Progress { bytes: size, total: size }));

    let shape = Preset::Tiny.shape();
    assert_eq!(got.facts.arch, "qwen3moe");
    assert_eq!((got.facts.experts, got.facts.top_k), (u64::from(shape.experts), u64::from(shape.top_k)));
    // The qualification key: the label, then the hash of the file's whole kernel shape.
    let label = format!("qwen3moe-h{}-e{}-top{}-ffn{}", shape.hidden, shape.experts, shape.top_k, shape.expert_ffn);
    let file = brink_engine::gguf::GgufFile::open(&got.path).unwrap();
    assert_eq!(got.facts.shape_class, brink_engine::arch::config(&file).unwrap().shape_class());
    assert!(got.facts.shape_class.starts_with(&format!("{label}-")), "{}", got.facts.shape_class);
    // The tiny preset's default scheme: Q8_0 matrices, f32 norms.
    assert_eq!(got.facts.quant_types, ["f32", "q8_0"]);

    let index = Index::load(cache.root()).unwrap();
    let entry = index.get(&sha).unwrap();
    assert_eq!((entry.size, entry.source.clone(), entry.header.as_ref().ok()), (size, vec![server.url("m.gguf")], Some(&got.facts)));

    // Cached: no request, not fetched again.
    let again = ensure(&cache, &http(&server, "m.gguf", &sha.to_uppercase()), &[]).await.unwrap();
    assert_eq!(server.seen().len(), 2);
    assert_eq!((again.fetched, again.facts), (false, got.facts));
}

#[tokio::test]
async fn a_server_that_ignores_range_restarts_the_file_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 1);
    let half = model.len() / 2;
    let server = Server::start(Behaviour {
        files: HashMap::from([("m.gguf".to_string(), model.clone())]),
        drop_first_after: Some(half),
        ignore_range: true,
        ..Behaviour::default()
    })
    .await;
    let cache = ModelCache::open(config(&dir.path().join("cache"), 10 * model.len() as u64)).unwrap();
    let mut restarted = false;
    let mut last = 0;
    let got = cache
        .ensure(&http(&server, "m.gguf", &sha), &HashSet::new(), &mut |_, p| {
            restarted |= p.bytes < last;
            last = p.bytes;
        })
        .await
        .unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!((seen[1].status, seen[1].range.clone()), (200, Some(format!("bytes={half}-"))));
    assert!(restarted, "progress went back to 0 with the restart");
    assert_eq!(server.body_bytes_sent(), (half + model.len()) as u64);
    assert_eq!(std::fs::read(&got.path).unwrap(), model);
}

#[tokio::test]
async fn a_partial_left_by_an_earlier_run_is_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 2);
    let server = Server::start(Behaviour { files: HashMap::from([("m.gguf".to_string(), model.clone())]), ..Behaviour::default() }).await;
    let root = dir.path().join("cache");
    let cache = ModelCache::open(config(&root, 10 * model.len() as u64)).unwrap();
    let have = model.len() * 3 / 4;
    std::fs::write(root.join("partial").join(format!("{sha}.part")), &model[..have]).unwrap();
    let got = ensure(&cache, &http(&server, "m.gguf", &sha), &[]).await.unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!((seen[0].status, seen[0].range.clone()), (206, Some(format!("bytes={have}-"))));
    assert_eq!(server.body_bytes_sent(), (model.len() - have) as u64);
    assert_eq!(std::fs::read(&got.path).unwrap(), model);

    // A complete partial (a crash before the move): the server's 416 confirms the size.
    let (model2, sha2) = tiny_model(dir.path(), 3);
    server.state.lock().unwrap().files.insert("m2.gguf".into(), model2.clone());
    std::fs::write(root.join("partial").join(format!("{sha2}.part")), &model2).unwrap();
    let got = ensure(&cache, &http(&server, "m2.gguf", &sha2), &[]).await.unwrap();
    assert_eq!(server.seen().last().unwrap().status, 416);
    assert_eq!(std::fs::read(&got.path).unwrap(), model2);
}

#[tokio::test]
async fn a_wrong_checksum_is_a_clear_error_and_the_file_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (model, actual) = tiny_model(dir.path(), 0);
    let server = Server::start(Behaviour { files: HashMap::from([("m.gguf".to_string(), model.clone())]), ..Behaviour::default() }).await;
    let cache = ModelCache::open(config(&dir.path().join("cache"), 10 * model.len() as u64)).unwrap();
    let wrong = "0".repeat(64);
    let err = ensure(&cache, &http(&server, "m.gguf", &wrong), &[]).await.unwrap_err();
    assert!(matches!(err, CacheError::Checksum { .. }), "{err:?}");
    let msg = err.to_string();
    for part in [server.url("m.gguf").as_str(), &wrong, &actual, "checksum mismatch"] {
        assert!(msg.contains(part), "{msg} lacks {part}");
    }
    assert_eq!(partial_files(cache.root()), 0);
    assert_eq!(std::fs::read_dir(cache.root().join("models")).unwrap().count(), 0);
    assert!(cache.entries().unwrap().is_empty());
}

/// Three models of one size under a budget for two and a half.
async fn three_models(dir: &Path) -> (Server, Vec<String>, u64) {
    let mut files = HashMap::new();
    let mut shas = Vec::new();
    let mut size = 0;
    for seed in 0..3 {
        let (bytes, sha) = tiny_model(dir, seed);
        size = bytes.len() as u64;
        files.insert(format!("{seed}.gguf"), bytes);
        shas.push(sha);
    }
    (Server::start(Behaviour { files, ..Behaviour::default() }).await, shas, size)
}

#[tokio::test]
async fn a_full_budget_evicts_the_least_recently_used_unused_model() {
    let dir = tempfile::tempdir().unwrap();
    let (server, shas, size) = three_models(dir.path()).await;
    let root = dir.path().join("cache");
    let cache = ModelCache::open(CacheConfig { reserve_bytes: size / 4, ..config(&root, 2 * size + size / 2) }).unwrap();
    let a = ensure(&cache, &http(&server, "0.gguf", &shas[0]), &[]).await.unwrap();
    ensure(&cache, &http(&server, "1.gguf", &shas[1]), &[]).await.unwrap();
    set_last_used(&root, &[&shas[1], &shas[0]]); // model 1 is the older
    ensure(&cache, &http(&server, "2.gguf", &shas[2]), &[]).await.unwrap();
    let kept: HashSet<String> = cache.entries().unwrap().into_iter().map(|e| e.sha256).collect();
    assert_eq!(kept, HashSet::from([shas[0].clone(), shas[2].clone()]));
    assert!(!root.join("models").join(format!("{}.gguf", shas[1])).exists());
    assert!(a.path.exists());
}

#[tokio::test]
async fn a_model_in_use_is_never_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let (server, shas, size) = three_models(dir.path()).await;
    let root = dir.path().join("cache");
    let cache = ModelCache::open(config(&root, 2 * size + size / 2)).unwrap();
    ensure(&cache, &http(&server, "0.gguf", &shas[0]), &[]).await.unwrap();
    ensure(&cache, &http(&server, "1.gguf", &shas[1]), &[]).await.unwrap();
    set_last_used(&root, &[&shas[0], &shas[1]]); // model 0 is the older, but in use
    ensure(&cache, &http(&server, "2.gguf", &shas[2]), &[&shas[0]]).await.unwrap();
    let kept: HashSet<String> = cache.entries().unwrap().into_iter().map(|e| e.sha256).collect();
    assert_eq!(kept, HashSet::from([shas[0].clone(), shas[2].clone()]));
}

#[tokio::test]
async fn a_budget_too_small_even_after_eviction_evicts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (server, shas, size) = three_models(dir.path()).await;
    let root = dir.path().join("cache");
    let cache = ModelCache::open(config(&root, 2 * size + size / 2)).unwrap();
    ensure(&cache, &http(&server, "0.gguf", &shas[0]), &[]).await.unwrap();
    ensure(&cache, &http(&server, "1.gguf", &shas[1]), &[]).await.unwrap();
    let requests = server.seen().len();
    // Model 1 unused, model 0 in use: evicting 1 alone would not make room, so nothing goes.
    let tight = ModelCache::open(config(&root, 2 * size - 1)).unwrap();
    let err = ensure(&tight, &http(&server, "2.gguf", &shas[2]), &[&shas[0]]).await.unwrap_err();
    let CacheError::NoRoom(no_room) = &err else { panic!("{err:?}") };
    assert_eq!((no_room.need, no_room.in_use, no_room.room), (size, size, size - 1));
    assert!(err.to_string().contains("nothing was evicted"), "{err}");
    assert_eq!(cache.entries().unwrap().len(), 2);
    assert_eq!(server.seen().len(), requests + 1, "one request to learn the size, no retries");
    assert_eq!(partial_files(&root), 0, "no byte written");

    // A budget below one model: an error before anything is evicted.
    let tiny = ModelCache::open(config(&root, size - 1)).unwrap();
    assert!(matches!(ensure(&tiny, &http(&server, "2.gguf", &shas[2]), &[]).await, Err(CacheError::NoRoom(_))));
    assert_eq!(cache.entries().unwrap().len(), 2);
}

#[tokio::test]
async fn credentials_are_sent_and_a_refusal_names_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 0);
    let server = Server::start(Behaviour {
        files: HashMap::from([("m.gguf".to_string(), model.clone())]),
        require_auth: Some("Bearer s3cret".into()),
        ..Behaviour::default()
    })
    .await;
    let cache = ModelCache::open(config(&dir.path().join("cache"), 10 * model.len() as u64)).unwrap();
    let err = ensure(&cache, &http(&server, "m.gguf", &sha), &[]).await.unwrap_err();
    assert_eq!(err.to_string(), format!("{}: the server answered 401", server.url("m.gguf")));
    let with = ModelSource::Http {
        parts: vec![HttpPart { url: server.url("m.gguf"), sha256: sha.clone() }],
        credentials: Some(Credentials::Bearer("s3cret".into())),
    };
    assert_eq!(std::fs::read(ensure(&cache, &with, &[]).await.unwrap().path).unwrap(), model);
}

#[tokio::test]
async fn a_server_that_keeps_dropping_is_an_error_after_the_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 0);
    let server = Server::start(Behaviour { files: HashMap::from([("m.gguf".to_string(), model.clone())]), ..Behaviour::default() }).await;
    let cache = ModelCache::open(CacheConfig { attempts: 3, ..config(&dir.path().join("cache"), 10 * model.len() as u64) }).unwrap();
    let err = ensure(&cache, &http(&server, "missing.gguf", &sha), &[]).await.unwrap_err();
    assert_eq!(err.to_string(), format!("{}: the server answered 404", server.url("missing.gguf")));
    // Nothing listens on a closed port: every attempt fails to connect.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/m.gguf", l.local_addr().unwrap())
    };
    let src = ModelSource::Http { parts: vec![HttpPart { url: closed.clone(), sha256: sha }], credentials: None };
    let err = ensure(&cache, &src, &[]).await.unwrap_err();
    assert!(matches!(err, CacheError::Interrupted { attempts: 3, at: 0, .. }), "{err:?}");
    assert!(err.to_string().starts_with(&closed), "{err}");
}

#[tokio::test]
async fn a_local_file_is_verified_and_used_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let (_, sha) = tiny_model(dir.path(), 0);
    let path = dir.path().join("tiny-0.gguf");
    let cache = ModelCache::open(config(&dir.path().join("cache"), 1)).unwrap();
    let got = ensure(&cache, &ModelSource::Local { path: path.clone(), sha256: sha.clone() }, &[]).await.unwrap();
    assert_eq!((got.path.as_path(), got.fetched, got.facts.experts), (path.as_path(), false, 16));
    assert!(cache.entries().unwrap().is_empty(), "not the cache's to evict");
    let err = ensure(&cache, &ModelSource::Local { path: path.clone(), sha256: "1".repeat(64) }, &[]).await.unwrap_err();
    assert!(matches!(err, CacheError::LocalChecksum { .. }) && err.to_string().contains(&sha), "{err}");
}

#[tokio::test]
async fn a_file_that_is_not_a_model_is_kept_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let junk = b"not a gguf file at all".to_vec();
    let sha = download::hex(&Sha256::digest(&junk));
    let server = Server::start(Behaviour { files: HashMap::from([("j.gguf".to_string(), junk)]), ..Behaviour::default() }).await;
    let cache = ModelCache::open(config(&dir.path().join("cache"), 1 << 20)).unwrap();
    let err = ensure(&cache, &http(&server, "j.gguf", &sha), &[]).await.unwrap_err();
    assert!(matches!(err, CacheError::Header { .. }), "{err:?}");
    assert!(err.to_string().contains(&sha), "names the file: {err}");
    // Downloaded once: the second call answers from the index.
    assert!(matches!(ensure(&cache, &http(&server, "j.gguf", &sha), &[]).await, Err(CacheError::Header { .. })));
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_split_model_is_fetched_part_by_part_and_named_for_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, _) = tiny_model(dir.path(), 0);
    // The same tensors written as two parts, with the writer the synthesiser planned.
    let file = brink_engine::gguf::GgufFile::open(dir.path().join("tiny-0.gguf")).unwrap();
    let plan = SynthSpec::from_preset(Preset::Tiny).plan().unwrap();
    let data: Vec<&[u8]> = plan
        .writer
        .tensors()
        .iter()
        .map(|t| {
            let info = file.tensor(&t.name).unwrap();
            &whole[info.file_offset() as usize..(info.file_offset() + info.size()) as usize]
        })
        .collect();
    let paths = plan.writer.write_split_files(&dir.path().join("split"), 2, &data).unwrap();
    let mut files = HashMap::new();
    let mut parts = Vec::new();
    let mut size = 0;
    for (i, path) in paths.iter().enumerate() {
        let bytes = std::fs::read(path).unwrap();
        size += bytes.len() as u64;
        parts.push(HttpPart { url: String::new(), sha256: download::hex(&Sha256::digest(&bytes)) });
        files.insert(format!("p{i}.gguf"), bytes);
    }
    let server = Server::start(Behaviour { files, ..Behaviour::default() }).await;
    for (i, part) in parts.iter_mut().enumerate() {
        part.url = server.url(&format!("p{i}.gguf"));
    }
    let cache = ModelCache::open(config(&dir.path().join("cache"), 10 * size)).unwrap();
    let mut parts_seen = HashSet::new();
    let source = ModelSource::Http { parts: parts.clone(), credentials: None };
    let got = cache
        .ensure(&source, &HashSet::new(), &mut |part, _| {
            parts_seen.insert(part);
        })
        .await
        .unwrap();
    let key = &parts[0].sha256;
    let models = cache.root().join("models");
    assert_eq!(got.path, models.join(format!("{key}-00001-of-00002.gguf")));
    assert_eq!(std::fs::read(models.join(format!("{key}-00002-of-00002.gguf"))).unwrap(), std::fs::read(&paths[1]).unwrap());
    assert_eq!((got.size, got.facts.experts, parts_seen), (size, 16, HashSet::from([0, 1])));
    assert_eq!(cache.entries().unwrap()[0].files.len(), 2);
}

#[tokio::test]
async fn one_model_is_downloaded_by_one_task_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 0);
    let server = Server::start(Behaviour { files: HashMap::from([("m.gguf".to_string(), model.clone())]), ..Behaviour::default() }).await;
    let cache = ModelCache::open(config(&dir.path().join("cache"), 10 * model.len() as u64)).unwrap();
    let source = http(&server, "m.gguf", &sha);
    let (first, second) = tokio::join!(ensure(&cache, &source, &[]), ensure(&cache, &source, &[]));
    let busy = [&first, &second].iter().filter(|r| matches!(r, Err(CacheError::Busy { .. }))).count();
    assert_eq!((busy, first.is_ok() || second.is_ok()), (1, true), "{first:?} {second:?}");
    // The claim is released: a third call finds the model cached.
    assert!(!ensure(&cache, &source, &[]).await.unwrap().fetched);
}

#[tokio::test]
async fn https_speaks_tls_and_a_bad_url_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(Behaviour::default()).await;
    let cache = ModelCache::open(CacheConfig { attempts: 2, ..config(&dir.path().join("cache"), 1 << 20) }).unwrap();
    let sha = "a".repeat(64);
    let source = |url: String| ModelSource::Http { parts: vec![HttpPart { url, sha256: sha.clone() }], credentials: None };
    // TLS to a plain-HTTP server: the handshake runs (TLS is built in) and fails, retried.
    let https = server.url("m.gguf").replace("http://", "https://");
    let err = ensure(&cache, &source(https.clone()), &[]).await.unwrap_err();
    assert!(matches!(err, CacheError::Interrupted { attempts: 2, .. }), "{err:?}");
    assert!(err.to_string().starts_with(&https), "{err}");
    for bad in ["not a url", "ftp://example.invalid/m.gguf"] {
        let err = ensure(&cache, &source(bad.to_string()), &[]).await.unwrap_err();
        assert!(matches!(err, CacheError::Http { .. }), "{bad}: {err:?}");
        assert!(err.to_string().starts_with(bad), "{err}");
    }
}

#[tokio::test]
async fn abandoned_partials_count_against_the_budget_until_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 0);
    let size = model.len() as u64;
    let server = Server::start(Behaviour { files: HashMap::from([("m.gguf".to_string(), model.clone())]), ..Behaviour::default() }).await;
    let root = dir.path().join("cache");
    let cache = ModelCache::open(config(&root, size + size / 2)).unwrap();
    let abandoned = "b".repeat(64);
    std::fs::write(root.join("partial").join(format!("{abandoned}.part")), vec![0u8; (size / 2 + 1) as usize]).unwrap();
    std::fs::write(root.join("partial").join(format!("{sha}.part")), &model[..10]).unwrap();
    let err = ensure(&cache, &http(&server, "m.gguf", &sha), &[]).await.unwrap_err();
    let CacheError::NoRoom(no_room) = &err else { panic!("{err:?}") };
    assert_eq!(no_room.other_used, size / 2 + 1, "the partial being resumed is not counted twice");
    assert_eq!(cache.prune_partials(&HashSet::from([sha.clone()])).unwrap(), size / 2 + 1);
    assert_eq!(partial_files(&root), 1, "the wanted partial is kept");
    let got = ensure(&cache, &http(&server, "m.gguf", &sha), &[]).await.unwrap();
    assert_eq!(server.seen().last().unwrap().range, Some("bytes=10-".to_string()));
    assert_eq!(std::fs::read(got.path).unwrap(), model);
}

/// Header probes: the policy for small synthetic models, so the prefix must grow.
fn probe_config(root: &Path) -> CacheConfig {
    CacheConfig { header_range: RangePolicy { first_bytes: 128, cap_bytes: 1 << 20 }, ..config(root, 1 << 30) }
}

#[tokio::test]
async fn a_split_models_facts_are_read_from_each_parts_header_by_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, _) = tiny_model(dir.path(), 0);
    let file = brink_engine::gguf::GgufFile::open(dir.path().join("tiny-0.gguf")).unwrap();
    let plan = SynthSpec::from_preset(Preset::Tiny).plan().unwrap();
    let data: Vec<&[u8]> = plan
        .writer
        .tensors()
        .iter()
        .map(|t| {
            let info = file.tensor(&t.name).unwrap();
            &whole[info.file_offset() as usize..(info.file_offset() + info.size()) as usize]
        })
        .collect();
    let paths = plan.writer.write_split_files(&dir.path().join("split"), 2, &data).unwrap();
    let (mut files, mut parts, mut size) = (HashMap::new(), Vec::new(), 0);
    for (i, path) in paths.iter().enumerate() {
        let bytes = std::fs::read(path).unwrap();
        size += bytes.len() as u64;
        parts.push(HttpPart { url: String::new(), sha256: download::hex(&Sha256::digest(&bytes)) });
        files.insert(format!("p{i}.gguf"), bytes);
    }
    let server = Server::start(Behaviour { files, ..Behaviour::default() }).await;
    for (i, part) in parts.iter_mut().enumerate() {
        part.url = server.url(&format!("p{i}.gguf"));
    }
    let cache = ModelCache::open(probe_config(&dir.path().join("cache"))).unwrap();
    let got = cache.probe(&ModelSource::Http { parts: parts.clone(), credentials: None }).await.unwrap();
    // The facts the engine's reader gives for the parts on disk, and every part's bytes.
    assert_eq!(got, ModelFacts { facts: header::read(&paths[0]).unwrap(), size });
    assert_eq!(got.facts.kv_bytes_per_token, Some(2 * 2 * 64 * 2 * 2));
    let seen = server.seen();
    assert!(seen.iter().all(|s| s.status == 206 && s.range.as_deref().is_some_and(|r| !r.ends_with('-'))), "{seen:?}");
    assert!(seen.iter().any(|s| s.path == "p1.gguf"), "the second part's header is read too: {seen:?}");
    assert!(server.body_bytes_sent() < size / 2, "{} of {size} bytes", server.body_bytes_sent());
    assert!(!cache.root().join("probe").join(&parts[0].sha256).exists(), "the scratch files are removed");
    assert!(cache.entries().unwrap().is_empty());
    // Scratch files a stopped agent left are removed when the cache opens.
    let left = cache.root().join("probe").join("ab".repeat(32));
    std::fs::create_dir_all(&left).unwrap();
    std::fs::write(left.join("x.gguf"), b"GGUF").unwrap();
    drop(cache);
    let _reopened = ModelCache::open(probe_config(&dir.path().join("cache"))).unwrap();
    assert!(!dir.path().join("cache/probe").exists());
}

#[tokio::test]
async fn a_probe_never_downloads_from_a_server_without_ranges_and_names_a_non_gguf_file() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 0);
    let mut files = HashMap::from([("m.gguf".to_string(), model)]);
    let server = Server::start(Behaviour { files: files.clone(), ignore_range: true, ..Behaviour::default() }).await;
    let cache = ModelCache::open(probe_config(&dir.path().join("cache"))).unwrap();
    let e = cache.probe(&http(&server, "m.gguf", &sha)).await.unwrap_err();
    assert!(matches!(e, CacheError::NoRanges { .. }), "{e}");
    assert!(e.to_string().contains(&server.url("m.gguf")) && e.to_string().contains("ignores Range"), "{e}");
    assert_eq!(server.seen().len(), 1, "no second request");

    files.insert("text.gguf".into(), b"this is not a model, but it is long enough to be asked for in ranges".repeat(10));
    let server = Server::start(Behaviour { files, ..Behaviour::default() }).await;
    let e = cache.probe(&http(&server, "text.gguf", &sha)).await.unwrap_err().to_string();
    assert!(e.contains(&server.url("text.gguf")) && e.contains("at byte 0") && e.contains("not a GGUF file"), "{e}");
    let missing = cache.probe(&http(&server, "gone.gguf", &sha)).await.unwrap_err().to_string();
    assert!(missing.contains("answered 404"), "{missing}");
}

#[tokio::test]
async fn an_entry_indexed_before_kv_bytes_per_token_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 0);
    let server = Server::start(Behaviour { files: HashMap::from([("m.gguf".to_string(), model)]), ..Behaviour::default() }).await;
    let root = dir.path().join("cache");
    let cache = ModelCache::open(config(&root, 1 << 30)).unwrap();
    let want = ensure(&cache, &http(&server, "m.gguf", &sha), &[]).await.unwrap().facts;
    assert_eq!(want.kv_bytes_per_token, Some(1024));
    // The index as an older agent wrote it: no kv_bytes_per_token in the facts.
    let path = root.join(index::INDEX_FILE);
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    json["entries"][0]["header"]["Ok"].as_object_mut().unwrap().remove("kv_bytes_per_token").unwrap();
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    assert_eq!(cache.entries().unwrap()[0].header.as_ref().unwrap().kv_bytes_per_token, None);
    let got = cache.indexed_facts(&sha).unwrap().unwrap();
    assert_eq!(got.facts, want);
    assert_eq!(cache.entries().unwrap()[0].header.as_ref().unwrap().kv_bytes_per_token, Some(1024), "saved");
    assert!(cache.indexed_facts(&"0".repeat(64)).unwrap().is_none());
}

#[tokio::test]
async fn an_entry_indexed_before_kv_window_bytes_per_sequence_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 0);
    let server = Server::start(Behaviour { files: HashMap::from([("m.gguf".to_string(), model)]), ..Behaviour::default() }).await;
    let root = dir.path().join("cache");
    let cache = ModelCache::open(config(&root, 1 << 30)).unwrap();
    let want = ensure(&cache, &http(&server, "m.gguf", &sha), &[]).await.unwrap().facts;
    assert_eq!((want.kv_bytes_per_token, want.kv_window_bytes_per_sequence), (Some(1024), Some(0)));
    // The index as an agent wrote it whose KV bytes per token counted every layer, windowed or
    // not: no window field, and a per-token figure that may be too large.
    let path = root.join(index::INDEX_FILE);
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let facts = json["entries"][0]["header"]["Ok"].as_object_mut().unwrap();
    facts.remove("kv_window_bytes_per_sequence").unwrap();
    facts.insert("kv_bytes_per_token".into(), serde_json::json!(2048));
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    assert_eq!(cache.entries().unwrap()[0].header.as_ref().unwrap().kv_window_bytes_per_sequence, None);
    assert_eq!(cache.indexed_facts(&sha).unwrap().unwrap().facts, want);
    let saved = cache.entries().unwrap()[0].header.clone().unwrap();
    assert_eq!((saved.kv_bytes_per_token, saved.kv_window_bytes_per_sequence), (Some(1024), Some(0)), "saved");
}

#[test]
fn a_gpt_oss_header_gives_the_full_layers_per_token_and_the_rings_per_sequence() {
    use brink_engine::synth::{GptOssPreset, gpt_oss};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-gpt-oss.gguf");
    let spec = gpt_oss::GptOssSpec::from_preset(GptOssPreset::Tiny);
    gpt_oss::generate(&spec, &path, |_, _| {}).unwrap();
    let facts = header::read(&path).unwrap();
    // Two layers of 2 KV heads of 64 dims: one position of one layer is 2 x (64 + 64) x 2 =
    // 512 bytes. Layer 0 is windowed (128 tokens): a ring of ceil((2048 + 127) / 16) = 136
    // blocks of 16 at the default prefill chunk; layer 1 is full.
    assert_eq!(spec.shape.sliding_window, 128);
    assert_eq!((facts.kv_bytes_per_token, facts.kv_window_bytes_per_sequence), (Some(512), Some(512 * 2176)));
}

#[tokio::test]
async fn a_range_cut_short_is_continued_from_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (model, sha) = tiny_model(dir.path(), 0);
    let files = HashMap::from([("m.gguf".to_string(), model)]);
    let server = Server::start(Behaviour { files, drop_first_after: Some(50), ..Behaviour::default() }).await;
    let cache = ModelCache::open(probe_config(&dir.path().join("cache"))).unwrap();
    let got = cache.probe(&http(&server, "m.gguf", &sha)).await.unwrap();
    assert_eq!(got.facts, header::read(&dir.path().join("tiny-0.gguf")).unwrap());
    let ranges: Vec<String> = server.seen().into_iter().filter_map(|s| s.range).collect();
    // The cut range is finished first (the first request's size), then the prefix doubles.
    assert_eq!(ranges[..3], ["bytes=0-127", "bytes=50-127", "bytes=128-255"], "{ranges:?}");
}
