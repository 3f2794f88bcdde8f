//! Model facts written by several agents against the in-memory API double, whose server-side
//! apply keeps ownership per field manager as the API server does: the first agent's facts are
//! written; a second agent with an older list loses the race with 409 and leaves them; an agent
//! that lists them writes nothing; and an apply of a cache entry alone (an eviction) keeps the
//! facts, where an apply without them would have removed them.

use brink_api::DeviceReport;
use brink_api::crd::{CachePhase, Model};
use brink_kube_double::KubeDouble;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::*;
use crate::cluster::agent::node_manager;
use crate::cluster::cache_plan;
use crate::model_cache::{CacheConfig, ModelCache};

fn agent_on(double: &KubeDouble, node: &str) -> Arc<Agent> {
    let probes = Probes { now: Arc::new(|| Timestamp::from_second(NOW).unwrap()), memory: Arc::new(|| Some(memory())) };
    let state = NodeState::new(DeviceReport::none("no CUDA driver (libcuda.so) on this machine"), node_fingerprint(), None);
    let settings = Settings { node: node.into(), ..settings(std::path::Path::new("/mnt/pvc")) };
    Arc::new(Agent::new(double.client(), settings, probes, state))
}

/// The managers that own `.status.<field>` of the stored Model.
fn owners(double: &KubeDouble, field: &str) -> Vec<String> {
    let m = double.get_value("brink.dev", "models", Some("ai"), "m").unwrap();
    let mut out: Vec<String> = m["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["fieldsV1"]["f:status"].get(format!("f:{field}")).is_some())
        .map(|e| e["manager"].as_str().unwrap().to_string())
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn agents_share_the_facts_without_conflict_and_keep_them_through_an_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("src.gguf");
    brink_engine::synth::generate(&brink_engine::synth::SynthSpec::from_preset(brink_engine::synth::Preset::Tiny), &path, |_, _| {})
        .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let size = bytes.len() as u64;
    let sha: String = <sha2::Sha256 as sha2::Digest>::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    let (base, _served) = super::facts::range_server(bytes).await;
    let url = format!("{base}/m.gguf");

    let double = KubeDouble::new();
    double
        .seed_value(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "ai"}, "data": {"token": "dG9r"}
        }))
        .unwrap();
    double
        .seed_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "Model",
            "metadata": { "name": "m", "namespace": "ai" },
            "spec": { "source": { "https": { "url": url, "credentialsSecretRef": { "name": "hf" } } }, "sha256": sha, "format": "gguf" }
        }))
        .unwrap();
    let models: Api<Model> = Api::all(double.client());
    let listed_before = models.list(&ListParams::default()).await.unwrap().items;

    let (n1, n2) = (agent_on(&double, "n1"), agent_on(&double, "n2"));
    let cache1 = ModelCache::open(CacheConfig::new(dir.path().join("c1"), 1 << 30)).unwrap();
    let cache2 = ModelCache::open(CacheConfig::new(dir.path().join("c2"), 1 << 30)).unwrap();
    n1.sync_models(&cache1).await.unwrap();
    let written: Model = double.get(Some("ai"), "m").unwrap();
    let status = written.status.clone().unwrap();
    assert_eq!((status.size_bytes, status.kv_bytes_per_token), (Some(size), Some(1024)));
    assert!(status.cache.is_empty(), "n1 holds no copy");
    assert_eq!(owners(&double, "kvBytesPerToken"), ["brink-agent-n1"]);

    // n2 read the Model before n1 wrote: its conditional apply is refused, and not an error.
    let fetched = Default::default();
    n2.fill_facts(&cache2, &listed_before, &fetched).await.unwrap();
    assert_eq!(owners(&double, "kvBytesPerToken"), ["brink-agent-n1"], "n2's stale apply was refused");
    // n2 lists the facts: nothing to write.
    let rv = double.get::<Model>(Some("ai"), "m").unwrap().resource_version();
    n2.sync_models(&cache2).await.unwrap();
    assert_eq!(double.get::<Model>(Some("ai"), "m").unwrap().resource_version(), rv);

    // The same facts applied by another manager (n2 downloaded the model) are shared, not 409.
    let pp = |node: &str| PatchParams::apply(&node_manager(node)).force();
    let facts = crate::model_cache::header::read(&path).unwrap();
    let at = Time(Timestamp::from_second(NOW).unwrap());
    let ready = cache_plan::entry("n2", CachePhase::Ready, size, Some(size), None, at.clone());
    let now = double.get::<Model>(Some("ai"), "m").unwrap();
    let body = cache_plan::model_status(&now, ready, Some((&facts, size)));
    let api: Api<Model> = Api::namespaced(double.client(), "ai");
    // Without force: a different value would be 409 naming n1; the same value is shared.
    api.patch_status("m", &PatchParams::apply(&node_manager("n2")), &Patch::Apply(&body)).await.expect("same values: shared, no conflict");
    assert_eq!(owners(&double, "kvBytesPerToken"), ["brink-agent-n1", "brink-agent-n2"]);

    // n2 evicts it: its apply carries the facts it co-owns, so they stay even without n1's.
    let now = double.get::<Model>(Some("ai"), "m").unwrap();
    let evicted = cache_plan::entry("n2", CachePhase::Evicted, 0, None, Some("evicted".into()), at);
    api.patch_status("m", &pp("n2"), &Patch::Apply(&cache_plan::model_status(&now, evicted.clone(), None))).await.unwrap();
    let after: Model = double.get(Some("ai"), "m").unwrap();
    assert_eq!(after.status.as_ref().unwrap().kv_bytes_per_token, Some(1024));
    assert_eq!(after.status.as_ref().unwrap().cache[0].phase, CachePhase::Evicted);
    // The contrast: had n1 been the only owner and applied its entry alone, the facts would go.
    let only = |status: serde_json::Value| json!({"apiVersion": "brink.dev/v1alpha1", "kind": "Model", "metadata": {"name": "m", "namespace": "ai"}, "status": status});
    api.patch_status("m", &pp("n1"), &Patch::Apply(&only(json!({})))).await.unwrap();
    api.patch_status("m", &pp("n2"), &Patch::Apply(&only(json!({"cache": [evicted]})))).await.unwrap();
    let gone: Model = double.get(Some("ai"), "m").unwrap();
    assert_eq!(gone.status.unwrap().kv_bytes_per_token, None, "server-side apply drops fields their last owner leaves out");
}
