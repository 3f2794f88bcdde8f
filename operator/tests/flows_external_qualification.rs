//! An external engine's qualification verdict, end to end through the in-memory API server with
//! the real controllers: a llama.cpp replica's Pod carries the qualification sidecar, which
//! writes its verdict where brink's own replicas write theirs (the node's state directory); the
//! node's agent publishes it in the `ModelReplica`'s status (simulated here with the agent's
//! field manager and the report `brink-agent qualify --url --replica-report` writes). A clamp
//! (the engine admits prompts only up to 7,068 tokens of the 32,768 asked for) shows on the
//! replica's status and as the deployment's `Clamped` condition naming the replica and the
//! admitted count; a pass leaves no `Clamped` condition.

mod common;
#[allow(dead_code)]
mod flows;

use brink_api::crd::{EngineKind, ModelDeployment, ModelReplica, QualificationMethod};
use common::NS;
use flows::{Fleet, NodeSetup, Snapshot};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// A llama.cpp deployment of one replica on one node.
async fn deploy_llamacpp(fleet: &Fleet) -> ModelDeployment {
    let mut dep = common::deployment(1);
    dep.metadata.uid = None;
    dep.metadata.resource_version = None;
    dep.metadata.generation = None;
    dep.spec.engine.kind = EngineKind::Llamacpp;
    dep.spec.engine.image = "ghcr.io/ggml-org/llama.cpp:server-b6500".into();
    dep.spec.engine.version = "b6500".into();
    fleet.deployments().create(&Default::default(), &dep).await.expect("create ModelDeployment")
}

/// The report the sidecar's `brink-agent qualify --url ... --replica-report FILE` writes
/// (`qualify::replica::black_box_report`), as the node's agent publishes it.
fn black_box(state: &str, message: &str, admitted: Option<u64>, first_failure: Option<u64>) -> serde_json::Value {
    let mut q = json!({
        "shapeClass": "qwen3moe-h2048-e128-top8-ffn768",
        "modelTestState": state,
        "modelTestMessage": format!("black-box qualification of qwen at http://127.0.0.1:8080: {message}"),
        "reused": false,
        "modelTestSeconds": 41.5,
        "method": "blackBox",
    });
    if let Some(a) = admitted {
        q["admittedPromptTokens"] = json!(a);
    }
    if let Some(f) = first_failure {
        q["firstFailureTokens"] = json!(f);
        q["failingCases"] = json!([{ "id": format!("single/t{f}"), "kernel": "blackbox/single", "tokens": f, "detail": "HTTP 500" }]);
    }
    q
}

/// What the node's agent does with the report the sidecar left on its node.
async fn agent_publishes(fleet: &Fleet, node: &str, replica: &str, report: serde_json::Value) {
    let api: Api<ModelReplica> = Api::namespaced(fleet.double.client(), NS);
    let body = json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica", "metadata": { "name": replica, "namespace": NS },
        "status": { "qualification": report },
    });
    let pp = PatchParams::apply(&format!("brink-agent-{node}-replicas")).force();
    api.patch_status(replica, &pp, &Patch::Apply(&body)).await.expect("agent publishes the replica report");
}

fn clamped(s: &Snapshot) -> Option<(String, String, String)> {
    s.condition("Clamped").map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(start_paused = true)]
async fn a_clamped_external_engine_shows_on_the_replica_and_the_deployment_and_a_pass_clears_it() {
    let fleet = Fleet::start(&[NodeSetup { name: "spark-1", qualified: true }]);
    deploy_llamacpp(&fleet).await;
    let pod = fleet.until("the replica's Pod", 60, |s: &Snapshot| s.pods.first().cloned()).await;
    let replica = pod.metadata.labels.as_ref().and_then(|l| l.get("brink.dev/replica").cloned()).expect("replica label");

    // The sidecar writes its verdict under the node's state directory, which it mounts.
    let spec = pod.spec.as_ref().expect("spec");
    let sidecar = spec.containers.iter().find(|c| c.name == "qualify").expect("the qualification sidecar");
    let script = sidecar.command.clone().unwrap_or_default().join(" ");
    let report_path = format!("/var/lib/brink/node/replicas/{NS}/{replica}.json");
    assert!(script.contains(&format!("--replica-report {report_path}")), "{script}");
    let mounts = sidecar.volume_mounts.clone().unwrap_or_default();
    let node_state = mounts.iter().find(|m| m.mount_path == "/var/lib/brink/node").expect("node state mounted in the sidecar");
    let volume = spec.volumes.iter().flatten().find(|v| v.name == node_state.name).expect("node state volume");
    assert!(volume.host_path.is_some(), "{volume:?}");

    // Clamp: every prompt from 7,069 tokens on gets a 500; shorter ones pass. The sidecar marks
    // the Pod qualified (it passed clamped) and the kubelet reports it Ready.
    agent_publishes(
        &fleet,
        "spark-1",
        &replica,
        black_box("clamped", "CLAMPED to 7068 tokens (first failure at 7069)", Some(7068), Some(7069)),
    )
    .await;
    fleet.mark_ready(&pod.metadata.name.clone().expect("Pod name")).await;
    let (status, reason, message) = fleet
        .until("the deployment says the replica is clamped", 60, |s: &Snapshot| {
            clamped(s).filter(|c| c.0 == "True" && s.counts() == Some((1, 1)))
        })
        .await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "PromptsBelowContext"));
    assert!(
        message.contains(&format!("{replica} admits prompts up to 7068 tokens of the requested context 32768"))
            && message.contains("first failure at 7069"),
        "{message}"
    );
    let snap = fleet.snapshot().await;
    let q = snap.replicas[0].status.as_ref().and_then(|s| s.qualification.clone()).expect("the replica's qualification");
    assert_eq!(
        (q.model_test_state.as_str(), q.method, q.admitted_prompt_tokens, q.first_failure_tokens, q.held.as_deref()),
        ("clamped", Some(QualificationMethod::BlackBox), Some(7068), Some(7069), None)
    );
    assert_eq!(q.failing_cases[0].tokens, 7069);
    // Clamped is not a failure: the replica serves and the deployment is not degraded by it.
    assert_eq!(snap.condition("Ready").map(|c| c.status.as_str()), Some("True"));
    assert_eq!(snap.condition("Degraded").map(|c| c.status.as_str()), Some("False"));

    // The engine is fixed and qualified again: it passes over the whole context, and the
    // deployment no longer says Clamped.
    agent_publishes(&fleet, "spark-1", &replica, black_box("qualified", "QUALIFIED up to 32768 tokens", Some(32_768), None)).await;
    fleet.until("no Clamped condition after a pass", 60, |s: &Snapshot| clamped(s).is_none().then_some(())).await;
    let snap = fleet.snapshot().await;
    let q = snap.replicas[0].status.as_ref().and_then(|s| s.qualification.clone()).expect("the replica's qualification");
    assert_eq!((q.model_test_state.as_str(), q.admitted_prompt_tokens), ("qualified", Some(32_768)));
    fleet.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_passing_external_engine_never_gets_a_clamped_condition() {
    let fleet = Fleet::start(&[NodeSetup { name: "spark-1", qualified: true }]);
    deploy_llamacpp(&fleet).await;
    let pod = fleet.until("the replica's Pod", 60, |s: &Snapshot| s.pods.first().cloned()).await;
    let replica = pod.metadata.labels.as_ref().and_then(|l| l.get("brink.dev/replica").cloned()).expect("replica label");
    agent_publishes(&fleet, "spark-1", &replica, black_box("qualified", "QUALIFIED up to 32768 tokens", Some(32_768), None)).await;
    fleet.mark_ready(&pod.metadata.name.clone().expect("Pod name")).await;
    fleet.until("the replica serves", 60, |s: &Snapshot| s.settled(1, 1, "True").then_some(())).await;
    fleet.let_pass(30).await;
    let snap = fleet.snapshot().await;
    assert!(clamped(&snap).is_none(), "{}", snap.describe());
    let q = snap.replicas[0].status.as_ref().and_then(|s| s.qualification.clone()).expect("the replica's qualification");
    assert_eq!((q.model_test_state.as_str(), q.method), ("qualified", Some(QualificationMethod::BlackBox)));
    fleet.stop().await;
}
