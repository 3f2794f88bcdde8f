//! Server-side apply: ownership per field manager, list-map entries merged per manager, conflicts.

use brink_api::crd::SparkNode;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::{api_error, cond, conditions, double_with_apis, managers, node};

fn apply_status(conds: Vec<Value>) -> Value {
    json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SparkNode", "status": {"conditions": conds}})
}

async fn apply_as(nodes: &Api<SparkNode>, manager: &str, force: bool, body: Value) -> kube::Result<SparkNode> {
    let mut pp = PatchParams::apply(manager);
    pp.force = force;
    nodes.patch_status("spark-01", &pp, &Patch::Apply(body)).await
}

fn raw(n: &SparkNode) -> Value {
    serde_json::to_value(n).unwrap()
}

#[tokio::test]
async fn two_managers_share_status_conditions_entry_by_entry() {
    let (_d, _, nodes) = double_with_apis();
    nodes.create(&PostParams::default(), &node("spark-01")).await.unwrap();

    let a = apply_as(&nodes, "brink-agent", false, apply_status(vec![cond("Ready", "True"), cond("Qualified", "True")])).await.unwrap();
    assert_eq!(conditions(&raw(&a)), ["Ready=True", "Qualified=True"]);
    let b = apply_as(&nodes, "brink-operator", false, apply_status(vec![cond("Degraded", "False")])).await.unwrap();
    assert_eq!(conditions(&raw(&b)), ["Ready=True", "Qualified=True", "Degraded=False"], "the operator's entry joins the agent's");
    let mf = managers(&raw(&b));
    assert!(mf.contains(&"brink-agent/Apply/status".to_string()) && mf.contains(&"brink-operator/Apply/status".to_string()), "{mf:?}");
    // Each manager's fieldsV1 names only its own entries.
    let entry = |v: &Value, m: &str| {
        v["metadata"]["managedFields"].as_array().unwrap().iter().find(|e| e["manager"] == m).unwrap()["fieldsV1"]["f:status"]["f:conditions"].clone()
    };
    let agent_fields = entry(&raw(&b), "brink-agent");
    assert!(
        agent_fields.get("k:{\"type\":\"Ready\"}").is_some() && agent_fields.get("k:{\"type\":\"Degraded\"}").is_none(),
        "{agent_fields}"
    );

    // The agent re-applies without Qualified: only that entry goes, the operator's stays.
    let c = apply_as(&nodes, "brink-agent", false, apply_status(vec![cond("Ready", "True")])).await.unwrap();
    assert_eq!(conditions(&raw(&c)), ["Ready=True", "Degraded=False"]);

    // The operator setting the agent's Ready: a conflict naming the agent and the field.
    let err =
        api_error(apply_as(&nodes, "brink-operator", false, apply_status(vec![cond("Degraded", "False"), cond("Ready", "False")])).await);
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(err.message.contains("conflict with \"brink-agent\""), "{}", err.message);
    assert!(err.message.contains(".status.conditions[type=\"Ready\"].status"), "{}", err.message);
    assert_eq!(conditions(&raw(&nodes.get("spark-01").await.unwrap())), ["Ready=True", "Degraded=False"], "a conflict changes nothing");

    // Applying the same value as the agent is shared ownership, not a conflict.
    apply_as(&nodes, "brink-operator", false, apply_status(vec![cond("Degraded", "False"), cond("Ready", "True")])).await.unwrap();

    // Forced: the operator takes Ready over; the agent's later apply of its old value conflicts now.
    let f = apply_as(&nodes, "brink-operator", true, apply_status(vec![cond("Degraded", "False"), cond("Ready", "False")])).await.unwrap();
    assert_eq!(conditions(&raw(&f)), ["Ready=False", "Degraded=False"]);
    let err = api_error(apply_as(&nodes, "brink-agent", false, apply_status(vec![cond("Ready", "True")])).await);
    assert!(err.message.contains("conflict with \"brink-operator\""), "{}", err.message);
}

#[tokio::test]
async fn qualifications_merge_by_shape_class_across_managers() {
    let (d, _, nodes) = double_with_apis();
    nodes.create(&PostParams::default(), &node("spark-01")).await.unwrap();
    let raw_nodes: Api<DynamicObject> = Api::all_with(d.client(), &ApiResource::erase::<SparkNode>(&()));
    let q = |class: &str, state: &str| json!({"shapeClass": class, "qualification": {"verdict": {"state": state}}});
    let body = |qs: Vec<Value>| json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SparkNode", "status": {"qualifications": qs}});
    let apply = |m: &'static str, b: Value| {
        let raw_nodes = raw_nodes.clone();
        async move { raw_nodes.patch_status("spark-01", &PatchParams::apply(m), &Patch::Apply(b)).await.unwrap() }
    };
    apply("qualifier-a", body(vec![q("moe-30b", "qualified")])).await;
    let n = apply("qualifier-b", body(vec![q("moe-235b", "failed")])).await;
    let classes: Vec<_> =
        n.data["status"]["qualifications"].as_array().unwrap().iter().map(|q| q["shapeClass"].as_str().unwrap().to_string()).collect();
    assert_eq!(classes, ["moe-30b", "moe-235b"]);
    let n = apply("qualifier-a", body(vec![])).await;
    assert_eq!(n.data["status"]["qualifications"].as_array().unwrap().len(), 1);
    assert_eq!(n.data["status"]["qualifications"][0]["shapeClass"], "moe-235b");
}

#[tokio::test]
async fn apply_creates_and_removes_fields_the_manager_dropped() {
    let (_d, deps, _) = double_with_apis();
    let mut body = crate::deployment_json("ssa", 2);
    body["metadata"]["labels"] = json!({"team": "inference", "tier": "gpu"});
    let created = deps.patch("ssa", &PatchParams::apply("deployer"), &Patch::Apply(&body)).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.labels().len(), 2);
    assert_eq!(managers(&serde_json::to_value(&created).unwrap()), ["deployer/Apply"]);

    body["metadata"]["labels"] = json!({"team": "inference"});
    let again = deps.patch("ssa", &PatchParams::apply("deployer"), &Patch::Apply(&body)).await.unwrap();
    assert_eq!(again.labels().keys().collect::<Vec<_>>(), ["team"], "the dropped label is removed");
    assert_eq!(again.metadata.generation, Some(1), "labels are metadata");

    // Another writer's merge patch (an Update) takes the fields it changed: the deployer's next
    // apply of its own replicas value conflicts with it, and the other writer's label survives.
    let pp = PatchParams { field_manager: Some("kubectl-edit".into()), ..Default::default() };
    deps.patch("ssa", &pp, &Patch::Merge(json!({"metadata": {"labels": {"owner": "ops"}}, "spec": {"replicas": 4}}))).await.unwrap();
    let err = api_error(deps.patch("ssa", &PatchParams::apply("deployer"), &Patch::Apply(&body)).await);
    assert!(err.message.contains("conflict with \"kubectl-edit\"") && err.message.contains(".spec.replicas"), "{}", err.message);
    let forced = deps.patch("ssa", &PatchParams::apply("deployer").force(), &Patch::Apply(&body)).await.unwrap();
    assert_eq!(forced.spec.replicas, 2);
    assert_eq!(forced.labels().get("owner").map(String::as_str), Some("ops"));
    assert_eq!(forced.metadata.generation, Some(3), "two spec changes since creation");
}
