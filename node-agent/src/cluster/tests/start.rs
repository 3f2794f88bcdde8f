//! Start-up: the first start creates the SparkNode (owned by its Node) and the Lease and writes
//! the status; a missing CRD, RBAC and an unreachable API each end start-up with their sentence.

use serde_json::json;

use super::*;

const LIST: &str = "/apis/brink.dev/v1alpha1/sparknodes?&limit=1";

#[tokio::test]
async fn first_start_creates_the_spark_node_and_the_lease() {
    let (agent, mut api) = agent();
    let task = tokio::spawn(async move { agent.start().await });
    api.expect("GET", LIST, 200, json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SparkNodeList", "metadata": {}, "items": []})).await;
    api.expect(
        "GET",
        "/api/v1/nodes/n1",
        200,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "node-uid-1"}}),
    )
    .await;
    let created = api
        .expect("PATCH", "/apis/brink.dev/v1alpha1/sparknodes/n1?&force=true&fieldManager=brink-agent", 200, spark_node(&[], None))
        .await;
    assert_eq!(created.content_type.as_deref(), Some(APPLY));
    assert_eq!(
        created.body["metadata"],
        json!({"name": "n1", "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "node-uid-1"}]})
    );
    // An empty spec, so that the object reads back as a SparkNode; no field of it is the agent's.
    assert!(created.body.get("status").is_none() && created.body["spec"] == json!({}), "the agent does not own the spec: {}", created.body);
    api.expect(
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/brink/leases/brink-node-n1",
        404,
        status(404, "NotFound", "leases.coordination.k8s.io \"brink-node-n1\" not found"),
    )
    .await;
    let lease = api.expect("POST", "/apis/coordination.k8s.io/v1/namespaces/brink/leases?", 201, json!({})).await;
    assert_eq!(lease.body["metadata"]["name"], "brink-node-n1");
    assert_eq!(lease.body["spec"]["holderIdentity"], "n1");
    assert_eq!(lease.body["spec"]["leaseDurationSeconds"], 40);
    assert_eq!(lease.body["spec"]["renewTime"], "2027-01-15T08:00:00.000000Z");
    let st = api
        .expect("PATCH", "/apis/brink.dev/v1alpha1/sparknodes/n1/status?&force=true&fieldManager=brink-agent", 200, spark_node(&[], None))
        .await;
    assert_eq!(st.content_type.as_deref(), Some(APPLY));
    let s = &st.body["status"];
    assert_eq!(st.body["kind"], "SparkNode");
    assert_eq!(s["noGpuReason"], "no CUDA driver (libcuda.so) on this machine");
    assert!(s.get("device").is_none());
    assert_eq!(s["agentVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["fingerprint"]["gpuName"], "cpu");
    assert_eq!(s["lastHeartbeatTime"], NOW_TEXT);
    assert_eq!(
        s["capacity"],
        json!({"unifiedMemory": {"total": 128u64 << 30, "available": 100u64 << 30}, "residentReplicaBytes": 0, "reservedBytes": 4u64 << 30})
    );
    let ready = condition(s, "Ready");
    assert_eq!((ready["status"].as_str(), ready["reason"].as_str()), (Some("True"), Some("AgentRunning")));
    assert_eq!(condition(s, "Qualified")["status"], "Unknown");
    assert_eq!(condition(s, "Progressing")["reason"], "Idle");
    finish(task).await.unwrap();
}

#[tokio::test]
async fn missing_crds_say_how_to_install_them() {
    let (agent, mut api) = agent();
    let task = tokio::spawn(async move { agent.start().await });
    api.expect("GET", LIST, 404, status(404, "NotFound", "the server could not find the requested resource")).await;
    let err = finish(task).await.unwrap_err().to_string();
    assert_eq!(
        err,
        "the brink.dev CRDs are not installed: run `brink-operator crds | kubectl apply -f -` (the API server at https://k8s.test:6443 has no sparknodes)"
    );
}

#[tokio::test]
async fn rbac_names_the_verb_and_resource() {
    let (agent, mut api) = agent();
    let task = tokio::spawn(async move { agent.start().await });
    api.expect("GET", LIST, 200, json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SparkNodeList", "metadata": {}, "items": []})).await;
    api.expect(
        "GET",
        "/api/v1/nodes/n1",
        403,
        status(403, "Forbidden", "nodes \"n1\" is forbidden: User \"system:serviceaccount:brink:agent\" cannot get resource \"nodes\""),
    )
    .await;
    let err = finish(task).await.unwrap_err().to_string();
    assert!(err.starts_with("forbidden: the agent may not get nodes (RBAC: grant the agent's service account `get` on `nodes`"), "{err}");
    assert!(err.contains("system:serviceaccount:brink:agent"), "{err}");
}

#[tokio::test]
async fn an_unreachable_api_names_the_url() {
    let (agent, mut api) = agent();
    let task = tokio::spawn(async move { agent.start().await });
    api.fail_transport("GET", LIST).await;
    let err = finish(task).await.unwrap_err().to_string();
    assert!(err.starts_with("cannot reach the Kubernetes API at https://k8s.test:6443 (list sparknodes): "), "{err}");
    assert!(err.contains("Connection refused"), "{err}");
}

#[tokio::test]
async fn a_missing_node_is_named() {
    let (agent, mut api) = agent();
    let task = tokio::spawn(async move { agent.start().await });
    api.expect("GET", LIST, 200, json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SparkNodeList", "metadata": {}, "items": []})).await;
    api.expect("GET", "/api/v1/nodes/n1", 404, status(404, "NotFound", "nodes \"n1\" not found")).await;
    let err = finish(task).await.unwrap_err().to_string();
    assert!(err.starts_with("Node n1 does not exist: --node-name"), "{err}");
}

#[tokio::test]
async fn stopping_sets_ready_false() {
    let (agent, mut api) = agent();
    let task = tokio::spawn(async move { agent.stop().await });
    let st = api
        .expect("PATCH", "/apis/brink.dev/v1alpha1/sparknodes/n1/status?&force=true&fieldManager=brink-agent", 200, spark_node(&[], None))
        .await;
    let ready = condition(&st.body["status"], "Ready");
    assert_eq!((ready["status"].as_str(), ready["reason"].as_str()), (Some("False"), Some("AgentStopping")));
    finish(task).await.unwrap();
}

#[tokio::test]
async fn a_restart_keeps_the_results_that_still_hold() {
    let (agent, mut api) = agent();
    let task = tokio::spawn(async move { agent.start().await });
    api.expect("GET", LIST, 200, json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SparkNodeList", "metadata": {}, "items": []})).await;
    api.expect(
        "GET",
        "/api/v1/nodes/n1",
        200,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "node-uid-1"}}),
    )
    .await;
    // Written by this agent before it restarted: one result still current, one from before a driver upgrade.
    let previous = json!({
        "agentVersion": env!("CARGO_PKG_VERSION"),
        "kernelSourcesHash": "ab".repeat(32),
        "qualifications": [shape_result("kept", None), shape_result("stale", Some("575.1"))],
    });
    api.expect(
        "PATCH",
        "/apis/brink.dev/v1alpha1/sparknodes/n1?&force=true&fieldManager=brink-agent",
        200,
        spark_node(&[], Some(previous)),
    )
    .await;
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "brink-node-n1", "namespace": "brink", "resourceVersion": "3"},
        "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": "2027-01-15T07:59:00.000000Z"}
    });
    api.expect("GET", "/apis/coordination.k8s.io/v1/namespaces/brink/leases/brink-node-n1", 200, lease.clone()).await;
    api.expect("PUT", "/apis/coordination.k8s.io/v1/namespaces/brink/leases/brink-node-n1?", 200, lease).await;
    let st = api
        .expect("PATCH", "/apis/brink.dev/v1alpha1/sparknodes/n1/status?&force=true&fieldManager=brink-agent", 200, spark_node(&[], None))
        .await;
    let classes: Vec<&str> =
        st.body["status"]["qualifications"].as_array().unwrap().iter().map(|q| q["shapeClass"].as_str().unwrap()).collect();
    assert_eq!(classes, ["kept"]);
    assert_eq!(condition(&st.body["status"], "Qualified")["reason"], "Qualified");
    finish(task).await.unwrap();
}
