//! Deletion: finalizers hold an object with a deletionTimestamp; ownerReferences cascade.

use brink_api::crd::{ModelDeployment, ModelReplica};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::{NS, api_error, deployment, double_with_apis};

#[tokio::test]
async fn finalizers_hold_the_object_until_they_are_removed() {
    let (d, deps, _) = double_with_apis();
    let mut dep = deployment("fin", 1);
    dep.metadata.finalizers = Some(vec!["brink.dev/replicas".into()]);
    deps.create(&PostParams::default(), &dep).await.unwrap();

    deps.delete("fin", &DeleteParams::default()).await.unwrap();
    let held = deps.get("fin").await.expect("still there while a finalizer remains");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.finalizers(), ["brink.dev/replicas"]);
    // Deleting again changes nothing.
    deps.delete("fin", &DeleteParams::default()).await.unwrap();

    deps.patch("fin", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    assert_eq!(api_error(deps.get("fin").await).code, 404, "gone once the last finalizer is removed");
    assert!(d.get::<ModelDeployment>(Some(NS), "fin").is_none());
}

fn owner_ref(owner: &ModelDeployment) -> Value {
    json!({"apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment", "name": owner.name_any(), "uid": owner.uid().unwrap(), "controller": true})
}

fn replica_json(name: &str, owner: Value) -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
        "metadata": {"name": name, "namespace": NS, "ownerReferences": [owner]},
        "spec": {
            "deployment": "qwen3", "node": "spark-02", "model": "qwen3-30b-a3b", "revision": "5d2c",
            "engine": {"image": "ghcr.io/brink/agent:0.2.0", "version": "0.2.0"},
            "serving": {"context": 32_768, "maxBatchTokens": 8191, "prefillChunk": 4096, "concurrency": 16, "kvFraction": 0.9}
        }
    })
}

#[tokio::test]
async fn deleting_an_owner_collects_its_dependents() {
    let (d, deps, _) = double_with_apis();
    let client = d.client();
    let reps: Api<ModelReplica> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let cms: Api<ConfigMap> = Api::namespaced(client, NS);

    let owner = deps.create(&PostParams::default(), &deployment("qwen3", 2)).await.unwrap();
    let other = deps.create(&PostParams::default(), &deployment("other", 1)).await.unwrap();
    let rep =
        reps.create(&PostParams::default(), &serde_json::from_value(replica_json("qwen3-a", owner_ref(&owner))).unwrap()).await.unwrap();
    // A grandchild: the replica's Pod, owned by the replica.
    let rep_ref = json!({"apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica", "name": rep.name_any(), "uid": rep.uid().unwrap()});
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "qwen3-a-pod", "ownerReferences": [rep_ref]}})).unwrap(),
    )
    .await
    .unwrap();
    // Owned by both deployments: survives, losing the dangling reference.
    let shared: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "shared", "ownerReferences": [owner_ref(&owner), owner_ref(&other)]}})).unwrap();
    cms.create(&PostParams::default(), &shared).await.unwrap();
    // Unrelated.
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "unrelated"}})).unwrap()).await.unwrap();

    deps.delete("qwen3", &DeleteParams::background()).await.unwrap();
    assert_eq!(api_error(reps.get("qwen3-a").await).code, 404, "the replica is collected");
    assert_eq!(api_error(pods.get("qwen3-a-pod").await).code, 404, "and its pod, transitively");
    let shared = cms.get("shared").await.unwrap();
    let refs: Vec<_> = shared.owner_references().iter().map(|r| r.name.clone()).collect();
    assert_eq!(refs, ["other"]);
    cms.get("unrelated").await.unwrap();
}

#[tokio::test]
async fn orphan_propagation_keeps_dependents_without_the_reference() {
    let (d, deps, _) = double_with_apis();
    let reps: Api<ModelReplica> = Api::namespaced(d.client(), NS);
    let owner = deps.create(&PostParams::default(), &deployment("qwen3", 1)).await.unwrap();
    reps.create(&PostParams::default(), &serde_json::from_value(replica_json("kept", owner_ref(&owner))).unwrap()).await.unwrap();
    deps.delete("qwen3", &DeleteParams::orphan()).await.unwrap();
    let kept = reps.get("kept").await.unwrap();
    assert!(kept.owner_references().is_empty());
}

#[tokio::test]
async fn delete_preconditions_are_checked() {
    let (_d, deps, _) = double_with_apis();
    let created = deps.create(&PostParams::default(), &deployment("pre", 1)).await.unwrap();
    let dp = DeleteParams {
        preconditions: Some(Preconditions { uid: Some("not-the-uid".into()), resource_version: None }),
        ..Default::default()
    };
    let err = api_error(deps.delete("pre", &dp).await);
    assert_eq!(err.code, 409);
    assert!(err.message.contains("Precondition failed: UID"), "{}", err.message);
    let dp = DeleteParams {
        preconditions: Some(Preconditions { uid: created.uid(), resource_version: created.resource_version() }),
        ..Default::default()
    };
    deps.delete("pre", &dp).await.unwrap();
    assert_eq!(api_error(deps.get("pre").await).code, 404);
    let _ = ModelDeployment::kind(&());
}

#[tokio::test]
async fn delete_collection_by_label_and_dry_run_deletes_nothing() {
    let d = brink_kube_double::KubeDouble::new();
    let cms: Api<ConfigMap> = Api::namespaced(d.client(), NS);
    for (name, tier) in [("a", "gpu"), ("b", "gpu"), ("c", "cpu")] {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"tier": tier}}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let dry = DeleteParams { dry_run: true, ..Default::default() };
    cms.delete("a", &dry).await.unwrap();
    cms.get("a").await.expect("a dry-run delete keeps the object");
    cms.delete_collection(&DeleteParams::default(), &kube::api::ListParams::default().labels("tier=gpu")).await.unwrap();
    let left: Vec<String> = cms.list(&Default::default()).await.unwrap().items.iter().map(|c| c.name_any()).collect();
    assert_eq!(left, ["c"]);
}

#[tokio::test]
async fn foreground_deletion_waits_for_dependents() {
    let (d, deps, _) = double_with_apis();
    let reps: Api<ModelReplica> = Api::namespaced(d.client(), NS);
    let owner = deps.create(&PostParams::default(), &deployment("qwen3", 2)).await.unwrap();
    let mut held = replica_json("held", owner_ref(&owner));
    held["metadata"]["finalizers"] = json!(["brink.dev/drain"]);
    reps.create(&PostParams::default(), &serde_json::from_value(held).unwrap()).await.unwrap();
    reps.create(&PostParams::default(), &serde_json::from_value(replica_json("free", owner_ref(&owner))).unwrap()).await.unwrap();

    deps.delete("qwen3", &DeleteParams::foreground()).await.unwrap();
    // The free replica went first; the held one is marked; the owner waits for it.
    assert_eq!(api_error(reps.get("free").await).code, 404);
    assert!(reps.get("held").await.unwrap().metadata.deletion_timestamp.is_some());
    let waiting = deps.get("qwen3").await.expect("the owner waits for its dependents");
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert_eq!(waiting.finalizers(), ["foregroundDeletion"]);

    // The last dependent goes; the owner follows.
    reps.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    assert_eq!(api_error(reps.get("held").await).code, 404);
    assert_eq!(api_error(deps.get("qwen3").await).code, 404);
}

#[tokio::test]
async fn orphaning_an_owner_held_by_a_finalizer_lets_dependents_go_at_once() {
    let (d, deps, _) = double_with_apis();
    let reps: Api<ModelReplica> = Api::namespaced(d.client(), NS);
    let mut owner = deployment("qwen3", 1);
    owner.metadata.finalizers = Some(vec!["brink.dev/replicas".into()]);
    let owner = deps.create(&PostParams::default(), &owner).await.unwrap();
    reps.create(&PostParams::default(), &serde_json::from_value(replica_json("r", owner_ref(&owner))).unwrap()).await.unwrap();
    deps.delete("qwen3", &DeleteParams::orphan()).await.unwrap();
    assert!(reps.get("r").await.unwrap().owner_references().is_empty());
    deps.patch("qwen3", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    reps.get("r").await.expect("an orphan outlives its former owner");
}
