//! Fidelity tests of the API double: each checks a behaviour of the real API server that a naive
//! double (a map that returns what it was given) gets wrong, through an unmodified `kube::Client`.

mod delete;
mod faults;
mod kinds;
mod ssa;
mod watch;
mod writes;

use brink_api::crd::{ModelDeployment, SparkNode};
use brink_kube_double::KubeDouble;
use kube::Api;
use kube::core::Status;
use serde_json::{Value, json};

pub const NS: &str = "serving";

/// The API error of a failed call; fails the test when the call succeeded or failed otherwise.
pub fn api_error<T: std::fmt::Debug>(r: kube::Result<T>) -> Box<Status> {
    match r {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub fn deployment_json(name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "modelRef": {"name": "qwen3-30b-a3b"},
            "replicas": replicas,
            "engine": {"image": "ghcr.io/brink/agent:0.2.0", "version": "0.2.0"},
            "serving": {"context": 32_768, "maxBatchTokens": 16_384, "prefillChunk": 4096, "concurrency": 16, "kvFraction": 0.9}
        }
    })
}

pub fn deployment(name: &str, replicas: i64) -> ModelDeployment {
    serde_json::from_value(deployment_json(name, replicas)).expect("a valid ModelDeployment")
}

pub fn node(name: &str) -> SparkNode {
    serde_json::from_value(json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SparkNode", "metadata": {"name": name}, "spec": {}}))
        .expect("a valid SparkNode")
}

/// A condition as `metav1.Condition` serialises.
pub fn cond(type_: &str, status: &str) -> Value {
    json!({"type": type_, "status": status, "reason": "Test", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

pub fn double_with_apis() -> (KubeDouble, Api<ModelDeployment>, Api<SparkNode>) {
    let d = KubeDouble::new();
    let c = d.client();
    (d, Api::namespaced(c.clone(), NS), Api::all(c))
}

/// `type=status` of each condition of an object, in order.
pub fn conditions(v: &Value) -> Vec<String> {
    v.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().map(|c| format!("{}={}", c["type"].as_str().unwrap_or("?"), c["status"].as_str().unwrap_or("?"))).collect())
        .unwrap_or_default()
}

/// The managers with an entry in `managedFields`, as `manager/operation[/subresource]`.
pub fn managers(v: &Value) -> Vec<String> {
    v.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|es| {
            es.iter()
                .map(|e| {
                    let mut s = format!("{}/{}", e["manager"].as_str().unwrap_or("?"), e["operation"].as_str().unwrap_or("?"));
                    if let Some(sub) = e["subresource"].as_str() {
                        s.push('/');
                        s.push_str(sub);
                    }
                    s
                })
                .collect()
        })
        .unwrap_or_default()
}
