//! Discovery in a cluster, against the API double over HTTP (a real kube client, watches and
//! all): the gateway routes to the replicas of the deployments it finds, under their
//! `servedModelNames`; a replica that becomes Ready is taken, one whose EndpointSlice entry
//! turns not ready is left, and a deleted deployment's model goes from the list.

mod common;

use std::time::Instant;

use brink_api::crd::{ModelDeployment, ModelReplica};
use brink_kube_double::KubeDouble;
use common::*;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value as Json, json};

const NS: &str = "serving";

fn serving() -> Json {
    json!({"context": 4096, "maxBatchTokens": 4096, "prefillChunk": 1024, "concurrency": 4, "kvFraction": 0.9})
}

fn deployment(name: &str, model: &str, names: &[&str]) -> Json {
    json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"modelRef": {"name": model}, "servedModelNames": names, "replicas": 1,
                 "engine": {"image": "i", "version": "0.1.0"}, "serving": serving()}
    })
}

fn replica(name: &str, dep: &str, model: &str) -> Json {
    json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"deployment": dep, "node": "spark-01", "model": model, "revision": "r1",
                 "engine": {"image": "i", "version": "0.1.0"}, "serving": serving()}
    })
}

fn replica_status(name: &str, phase: &str, endpoint: &str, ready: &str) -> Json {
    json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica", "metadata": {"name": name, "namespace": NS},
        "status": {"phase": phase, "endpoint": endpoint, "conditions": [
            {"type": "Ready", "status": ready, "reason": "Test", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    })
}

/// One slice per replica (its port), as the Service's slices list Pods by address and port.
fn slice(name: &str, port: u16, ready: bool) -> Json {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": "chat"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}]
    })
}

fn endpoint(stub: &Stub) -> String {
    stub.url.trim_start_matches("http://").to_string()
}

fn port(stub: &Stub) -> u16 {
    endpoint(stub).rsplit_once(':').unwrap().1.parse().unwrap()
}

/// Server-side apply of `body` to the object (or its status), as the operator and agents write.
macro_rules! apply {
    (status $api:expr, $name:expr, $body:expr) => {
        $api.patch_status($name, &PatchParams::apply("test").force(), &Patch::Apply($body))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", $name))
    };
    ($api:expr, $name:expr, $body:expr) => {
        $api.patch($name, &PatchParams::apply("test").force(), &Patch::Apply($body)).await.unwrap_or_else(|e| panic!("{}: {e}", $name))
    };
}

/// Sends `model` requests until one is answered by `stub` (bounded by the harness deadline).
async fn wait_answered_by(gw: &Gateway, model: &str, stub: &str) {
    let t0 = Instant::now();
    loop {
        let r = post(&format!("{}/v1/chat/completions", gw.url), &chat(model, "hi")).await;
        if r.status == 200 && r.json()["answered_by"] == stub {
            return;
        }
        assert!(t0.elapsed() < DEADLINE, "{model} never reached {stub}: last answer {} {}", r.status, r.body);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_follow_the_cluster() {
    let double = KubeDouble::new();
    let (_, server) = double.serve_http("127.0.0.1:0".parse().unwrap()).await.unwrap();
    // A workspace build links two rustls providers; rustls will not choose (as the binary does).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut kc = kube::Config::new(server.url().parse().unwrap());
    kc.default_namespace = NS.into();
    let client = Client::try_from(kc).unwrap();
    let deps: Api<ModelDeployment> = Api::namespaced(client.clone(), NS);
    let reps: Api<ModelReplica> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);

    let a = Stub::start("A", &["qwen", "brink"]).await;
    let b = Stub::start("B", &["qwen", "brink"]).await;
    let c = Stub::start("C", &["coder", "brink"]).await;
    apply!(deps, "chat", &deployment("chat", "qwen", &["qwen", "chat"]));
    apply!(deps, "code", &deployment("code", "coder", &[]));
    for (name, dep, model) in [("chat-0", "chat", "qwen"), ("chat-1", "chat", "qwen"), ("code-0", "code", "coder")] {
        apply!(reps, name, &replica(name, dep, model));
    }
    apply!(status reps, "chat-0", &replica_status("chat-0", "Serving", &endpoint(&a), "True"));
    apply!(status reps, "chat-1", &replica_status("chat-1", "Loading", &endpoint(&b), "False"));
    apply!(status reps, "code-0", &replica_status("code-0", "Serving", &endpoint(&c), "True"));
    apply!(slices, "chat-a", &slice("chat-a", port(&a), true));
    apply!(slices, "chat-b", &slice("chat-b", port(&b), false));

    let mut config = brink_gateway::Config::new(Vec::new());
    config.poll_interval = std::time::Duration::from_millis(100);
    // Ties in load go to the first replica (chat-0): which one answers says what is known.
    config.affinity_prefix_chars = 0;
    config.kubernetes = true;
    config.namespaces = vec![NS.into()];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(brink_gateway::serve_on_kubernetes(listener, config, client, async move {
        let _ = stopped.await;
    }));
    let gw = Gateway::from_url(url, stop);

    // The deployments' names, not the replicas' own lists (no `brink`): chat's two, code's model.
    wait_models(&gw, &[], &["qwen", "chat", "coder"]).await;
    let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("chat", "hi")).await;
    assert_eq!((r.status, r.json()["answered_by"].clone()), (200, json!("A")), "{}", r.body);
    // The alias reached the replica under the name it serves.
    assert_eq!(a.hits().last().unwrap().model, "qwen");
    let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("coder", "hi")).await;
    assert_eq!((r.status, r.json()["answered_by"].clone()), (200, json!("C")), "{}", r.body);
    assert_eq!(c.hits().last().unwrap().model, "coder");
    assert!(b.hits().is_empty(), "a Loading replica got a request");

    // chat-1 becomes Ready (its status and its Pod's slice), then chat-0's Pod turns unready.
    apply!(status reps, "chat-1", &replica_status("chat-1", "Serving", &endpoint(&b), "True"));
    apply!(slices, "chat-b", &slice("chat-b", port(&b), true));
    apply!(slices, "chat-a", &slice("chat-a", port(&a), false));
    wait_answered_by(&gw, "qwen", "B").await;
    let hits_a = a.hits().len();
    for _ in 0..5 {
        let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("chat", "hi")).await;
        assert_eq!((r.status, r.json()["answered_by"].clone()), (200, json!("B")), "{}", r.body);
    }
    assert_eq!(a.hits().len(), hits_a, "an unready replica got requests");

    // The replica's own status going out of Serving takes it out too (its slice stays ready).
    apply!(slices, "chat-a", &slice("chat-a", port(&a), true));
    wait_answered_by(&gw, "qwen", "A").await;
    apply!(status reps, "chat-0", &replica_status("chat-0", "Stalled", &endpoint(&a), "False"));
    wait_answered_by(&gw, "qwen", "B").await;

    // A deleted deployment: its model leaves the list and is unknown.
    deps.delete("code", &DeleteParams::default()).await.unwrap();
    wait_models(&gw, &[], &["qwen", "chat"]).await;
    let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("coder", "hi")).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "model_not_found");

    drop(gw);
    tokio::time::timeout(DEADLINE, served).await.expect("the gateway did not stop").unwrap().unwrap();
}
