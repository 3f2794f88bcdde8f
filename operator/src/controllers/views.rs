//! API objects into the decisions' views, pure: `SparkNode` + `Node` + heartbeat into a
//! `NodeView`, `ModelDeployment` + `Model` into a `DeploymentView`, `ModelReplica` into a
//! `ReplicaView` and a `Resident`. No client, no clock: the callers pass what they read.

use std::collections::BTreeMap;

use brink_api::Fingerprint;
use brink_api::crd::{self as crd, Model, ModelDeployment, ModelReplica, NodeRunState, ReplicaPhase, RunPhase, SparkNode, SweepRun};
use k8s_openapi::api::core::v1::{Node, Toleration as K8sToleration};
use kube::ResourceExt;

use crate::decide::{
    ClassQualification, DeploymentView, GangMembers, GangNeed, HeartbeatHistory, MemoryNeed, NodeView, OnSelfTestFailure, ReplicaView,
    Resident, Spread, Taint, TaintEffect, Toleration,
};

/// Annotation on a `ModelReplica`: the memory its Pod requests, written when it is placed, so
/// that residents are counted from their binding before the agent reports them.
pub const MEMORY_ANNOTATION: &str = "brink.dev/memory-bytes";

/// `namespace/name`, the key decisions match deployments by.
pub fn deployment_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A taint's effect; an effect this operator does not know keeps replicas off (it blocks).
fn effect(s: &str) -> TaintEffect {
    match s {
        "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
        "NoExecute" => TaintEffect::NoExecute,
        _ => TaintEffect::NoSchedule,
    }
}

/// A Pod toleration as the decisions compare it, or `None` for one that tolerates nothing here:
/// an operator or effect Kubernetes does not define, or `Equal` with an empty key (the API
/// server refuses a Pod with either).
pub fn toleration(t: &K8sToleration) -> Option<Toleration> {
    let key = t.key.clone().filter(|k| !k.is_empty());
    let effect = match t.effect.as_deref().unwrap_or("") {
        "" => None,
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => return None,
    };
    match t.operator.as_deref().unwrap_or("Equal") {
        // Exists: any value; with no key, any taint.
        "Exists" => Some(Toleration { key, value: None, effect }),
        "Equal" if key.is_some() => Some(Toleration { key, value: Some(t.value.clone().unwrap_or_default()), effect }),
        _ => None,
    }
}

/// The node's qualification of each class it reported or was asked to qualify.
fn classes(spark: &SparkNode) -> BTreeMap<String, ClassQualification> {
    let mut out = BTreeMap::new();
    // Asked for and not reported yet: the agent is on it (not asked again).
    for class in &spark.spec.shape_classes {
        out.insert(class.clone(), ClassQualification::InProgress);
    }
    let Some(status) = &spark.status else { return out };
    for q in &status.qualifications {
        let state = match &status.fingerprint {
            Some(node) if !node.covers(&q.qualification.fingerprint) => {
                let now = Fingerprint {
                    gpu_name: node.gpu_name.clone(),
                    compute_capability: node.compute_capability.clone(),
                    driver_version: node.driver_version.clone(),
                    cuda_version: node.cuda_version.clone(),
                    nvrtc_version: node.nvrtc_version.clone(),
                    agent_version: node.agent_version.clone(),
                    kernel_sources_hash: node.kernel_sources_hash.clone(),
                    ..q.qualification.fingerprint.clone()
                };
                let changed: Vec<String> = q.qualification.fingerprint.changed_fields(&now).iter().map(ToString::to_string).collect();
                ClassQualification::Stale { changed: changed.join(", ") }
            }
            _ => ClassQualification::Done(q.qualification.verdict.clone()),
        };
        out.insert(q.shape_class.clone(), state);
    }
    out
}

/// The memory a replica's Pod requests, from its annotation (0 when absent or unreadable: a
/// replica created by hand is not counted rather than refused).
pub fn replica_memory(replica: &ModelReplica) -> u64 {
    replica.annotations().get(MEMORY_ANNOTATION).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// A replica as a resident of its node.
pub fn resident(replica: &ModelReplica) -> Resident {
    Resident {
        replica: replica.name_any(),
        deployment: deployment_key(&replica.namespace().unwrap_or_default(), &replica.spec.deployment),
        memory_bytes: replica_memory(replica),
        gang_member: replica.spec.gang.is_some(),
    }
}

/// One node as the decisions see it. `spark` is `None` for a Node with no agent yet: it has
/// no classes and no memory, and its heartbeat history says whether a Lease exists.
pub fn node_view(node: &Node, spark: Option<&SparkNode>, heartbeat: HeartbeatHistory, replicas: &[&ModelReplica]) -> NodeView {
    let spec = node.spec.clone().unwrap_or_default();
    let taints = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| Taint { key: t.key, value: t.value.filter(|v| !v.is_empty()), effect: effect(&t.effect) })
        .collect();
    let allocatable_bytes = spark
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.capacity)
        .map(|c| c.unified_memory.available.saturating_add(c.resident_replica_bytes).saturating_sub(c.reserved_bytes))
        .unwrap_or(0);
    let name = node.name_any();
    NodeView {
        unschedulable: spec.unschedulable.unwrap_or(false),
        taints,
        labels: node.labels().clone(),
        heartbeat,
        classes: spark.map(classes).unwrap_or_default(),
        allocatable_bytes,
        // A gang's members each hold a member's memory on their node.
        residents: replicas.iter().filter(|r| r.spec.nodes().contains(&name.as_str())).map(|r| resident(r)).collect(),
        sweep: None,
        name,
    }
}

/// Nodes that a running `SweepRun` with `drainReplicas` is draining or sweeping, each with its
/// run (`namespace/name`; the first by that key when two runs hold one node). A node waiting for
/// its slot keeps serving, and one that is done serves again at once.
pub fn sweeping_nodes(runs: &[&SweepRun]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut runs: Vec<(String, &SweepRun)> =
        runs.iter().map(|r| (deployment_key(&r.namespace().unwrap_or_default(), &r.name_any()), *r)).collect();
    runs.sort_by(|a, b| a.0.cmp(&b.0));
    for (key, run) in runs {
        let Some(status) = run.status.as_ref().filter(|s| s.phase == RunPhase::Running && run.spec.drain_replicas) else { continue };
        for n in status.nodes.iter().filter(|n| matches!(n.state, NodeRunState::Draining | NodeRunState::Running)) {
            out.entry(n.node.clone()).or_insert_with(|| key.clone());
        }
    }
    out
}

/// Serving and not on its way out.
pub fn replica_view(replica: &ModelReplica) -> ReplicaView {
    let serving = replica.status.as_ref().is_some_and(|s| s.phase == ReplicaPhase::Serving);
    ReplicaView {
        name: replica.name_any(),
        node: replica.spec.node.clone(),
        healthy: serving && replica.metadata.deletion_timestamp.is_none(),
        gang: replica.spec.gang.as_ref().map(|g| GangMembers { workers: g.workers.clone(), fabric: g.fabric.clone() }),
    }
}

/// The `Model` facts a deployment cannot be placed without, or which are missing.
pub struct ModelFacts {
    pub shape_class: String,
    pub size_bytes: u64,
    pub kv_bytes_per_token: u64,
    /// 0 when the status has none (no windowed layers, or written when `kv_bytes_per_token`
    /// still counted them).
    pub kv_window_bytes_per_sequence: u64,
}

pub fn model_facts(model: &Model) -> Result<ModelFacts, String> {
    let status = model.status.clone().unwrap_or_default();
    let mut missing = Vec::new();
    if status.shape_class.as_deref().is_none_or(str::is_empty) {
        missing.push("shapeClass");
    }
    if status.size_bytes.is_none_or(|s| s == 0) {
        missing.push("sizeBytes");
    }
    // Only a model of windowed layers alone has no per-token KV bytes.
    let window = status.kv_window_bytes_per_sequence.unwrap_or_default();
    if status.kv_bytes_per_token.is_none_or(|s| s == 0 && window == 0) {
        missing.push("kvBytesPerToken");
    }
    if !missing.is_empty() {
        return Err(format!(
            "Model {} has no status.{} yet (an agent fills them from the GGUF header once a node holds the file)",
            model.name_any(),
            missing.join(", status.")
        ));
    }
    Ok(ModelFacts {
        shape_class: status.shape_class.unwrap_or_default(),
        size_bytes: status.size_bytes.unwrap_or_default(),
        kv_bytes_per_token: status.kv_bytes_per_token.unwrap_or_default(),
        kv_window_bytes_per_sequence: window,
    })
}

pub fn deployment_view(dep: &ModelDeployment, facts: &ModelFacts, reserve_bytes: u64) -> DeploymentView {
    let s = &dep.spec;
    DeploymentView {
        key: deployment_key(&dep.namespace().unwrap_or_default(), &dep.name_any()),
        shape_class: facts.shape_class.clone(),
        memory: MemoryNeed::Model {
            model_bytes: facts.size_bytes,
            kv_bytes_per_token: facts.kv_bytes_per_token,
            kv_window_bytes_per_sequence: facts.kv_window_bytes_per_sequence,
            context: s.serving.context,
            concurrency: u64::from(s.serving.concurrency),
        },
        reserve_bytes,
        max_batch_tokens: s.serving.max_batch_tokens,
        prefill_chunk: s.serving.prefill_chunk,
        replicas: u64::try_from(s.replicas).unwrap_or(0),
        node_selector: s.placement.node_selector.clone(),
        tolerations: s.placement.tolerations.iter().filter_map(toleration).collect(),
        spread: match s.placement.spread {
            crd::Spread::PerNode => Spread::OnePerNode,
            crd::Spread::BestEffort => Spread::Prefer,
        },
        require_qualified: s.placement.require_qualified,
        on_self_test_failure: match s.on_self_test_failure {
            crd::OnSelfTestFailure::Clamp => OnSelfTestFailure::Clamp,
            crd::OnSelfTestFailure::Refuse => OnSelfTestFailure::Refuse,
        },
        gang: (s.nodes_per_replica > 1).then(|| GangNeed {
            nodes: u64::from(s.nodes_per_replica),
            fabric_label: s.gang.as_ref().map_or_else(|| crd::FABRIC_LABEL.to_string(), |g| g.fabric_label.clone()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use brink_api::crd::{Capacity, NodeFingerprint, ShapeQualification, SparkNodeSpec, SparkNodeStatus};
    use brink_api::{QUALIFICATION_SCHEMA, Qualification, ReportSummary, ServingParams, UnifiedMemory, Verdict};
    use k8s_openapi::api::core::v1::{NodeSpec, Taint as K8sTaint};

    use super::*;

    const GIB: u64 = 1 << 30;

    fn fingerprint(driver: &str) -> Fingerprint {
        Fingerprint {
            gpu_name: "NVIDIA GB10".into(),
            compute_capability: "12.1".into(),
            driver_version: Some(driver.into()),
            cuda_version: "13.0".into(),
            nvrtc_version: None,
            agent_version: "0.2.0".into(),
            kernel_sources_hash: "h".into(),
            shape_class: "c1".into(),
            serving: ServingParams { max_batch_tokens: 8192, prefill_chunk: 2048, context: 4096, full_window_kv: false },
        }
    }

    fn spark(node_driver: &str, qualified_under: &str) -> SparkNode {
        let fp = fingerprint(qualified_under);
        let mut s = SparkNode::new("n1", SparkNodeSpec { shape_classes: vec!["c1".into(), "c2".into()] });
        s.status = Some(SparkNodeStatus {
            fingerprint: Some(NodeFingerprint::of(&fingerprint(node_driver))),
            qualifications: vec![ShapeQualification {
                shape_class: "c1".into(),
                qualification: Qualification {
                    schema: QUALIFICATION_SCHEMA,
                    digest: fp.digest(),
                    fingerprint: fp,
                    verdict: Verdict::Clamped { max_tokens: 4096, first_failure: 8192 },
                    summary: ReportSummary::default(),
                    qualified_at: "2026-11-30T00:00:00Z".into(),
                    model_summary: None,
                    kernel_verdict: None,
                    model_verdict: None,
                },
                envelope: None,
                failing_cases: vec![],
            }],
            capacity: Some(Capacity {
                unified_memory: UnifiedMemory { total: 128 * GIB, available: 90 * GIB },
                resident_replica_bytes: 30 * GIB,
                reserved_bytes: 8 * GIB,
            }),
            ..SparkNodeStatus::default()
        });
        s
    }

    fn node() -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.spec = Some(NodeSpec {
            unschedulable: Some(true),
            taints: Some(vec![
                K8sTaint { key: "gpu".into(), value: Some(String::new()), effect: "NoExecute".into(), ..K8sTaint::default() },
                K8sTaint { key: "soft".into(), value: Some("x".into()), effect: "PreferNoSchedule".into(), ..K8sTaint::default() },
                K8sTaint { key: "odd".into(), value: None, effect: "SomethingNew".into(), ..K8sTaint::default() },
            ]),
            ..NodeSpec::default()
        });
        n
    }

    #[test]
    fn a_node_maps_cordon_taints_memory_and_classes() {
        let v = node_view(&node(), Some(&spark("580", "580")), HeartbeatHistory::new(40), &[]);
        assert!(v.unschedulable);
        assert_eq!(
            v.taints,
            [
                Taint { key: "gpu".into(), value: None, effect: TaintEffect::NoExecute },
                Taint { key: "soft".into(), value: Some("x".into()), effect: TaintEffect::PreferNoSchedule },
                // An effect this operator does not know blocks rather than being ignored.
                Taint { key: "odd".into(), value: None, effect: TaintEffect::NoSchedule },
            ]
        );
        // Available plus the residents' memory, minus the node's reserve.
        assert_eq!(v.allocatable_bytes, (90 + 30 - 8) * GIB);
        assert_eq!(v.classes["c1"], ClassQualification::Done(Verdict::Clamped { max_tokens: 4096, first_failure: 8192 }));
        // Asked for and not reported yet.
        assert_eq!(v.classes["c2"], ClassQualification::InProgress);
    }

    #[test]
    fn tolerations_map_with_kubernetes_operators() {
        let t = |key: Option<&str>, op: Option<&str>, value: Option<&str>, effect: Option<&str>| K8sToleration {
            key: key.map(Into::into),
            operator: op.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        };
        let want = |key: Option<&str>, value: Option<&str>, effect: Option<TaintEffect>| {
            Some(Toleration { key: key.map(Into::into), value: value.map(Into::into), effect })
        };
        let cases = [
            // Equal is the default operator; no value is the empty value.
            (t(Some("gpu"), None, Some("a"), Some("NoSchedule")), want(Some("gpu"), Some("a"), Some(TaintEffect::NoSchedule))),
            (t(Some("gpu"), Some("Equal"), None, None), want(Some("gpu"), Some(""), None)),
            // Exists ignores the value; with no key it tolerates every taint.
            (t(Some("gpu"), Some("Exists"), None, Some("NoExecute")), want(Some("gpu"), None, Some(TaintEffect::NoExecute))),
            (t(None, Some("Exists"), None, None), want(None, None, None)),
            (t(Some(""), Some("Exists"), None, Some("")), want(None, None, None)),
            (
                t(Some("soft"), Some("Exists"), None, Some("PreferNoSchedule")),
                want(Some("soft"), None, Some(TaintEffect::PreferNoSchedule)),
            ),
            // What the API server refuses tolerates nothing.
            (t(None, Some("Equal"), Some("x"), None), None),
            (t(Some("gpu"), Some("Lt"), Some("3"), None), None),
            (t(Some("gpu"), Some("Exists"), None, Some("Sometimes")), None),
        ];
        for (k8s, expected) in cases {
            assert_eq!(toleration(&k8s), expected, "{k8s:?}");
        }
        // Against a taint with no value (as node_view maps an empty one).
        let bare = Taint { key: "gpu".into(), value: None, effect: TaintEffect::NoExecute };
        assert!(toleration(&t(Some("gpu"), None, None, None)).is_some_and(|t| t.tolerates(&bare)));
        assert!(!toleration(&t(Some("gpu"), None, Some("x"), None)).is_some_and(|t| t.tolerates(&bare)));
        assert!(toleration(&t(Some("gpu"), Some("Exists"), None, Some("NoExecute"))).is_some_and(|t| t.tolerates(&bare)));
        assert!(!toleration(&t(Some("gpu"), Some("Exists"), None, Some("NoSchedule"))).is_some_and(|t| t.tolerates(&bare)));
    }

    #[test]
    fn nodes_a_running_draining_run_holds() {
        let run = |name: &str, phase: &str, drain: bool, nodes: &[(&str, &str)]| -> SweepRun {
            let progress: Vec<serde_json::Value> = nodes.iter().map(|(n, s)| serde_json::json!({ "node": n, "state": s })).collect();
            serde_json::from_value(serde_json::json!({
                "apiVersion": "brink.dev/v1alpha1", "kind": "SweepRun",
                "metadata": { "name": name, "namespace": "ai" },
                "spec": { "sweep": "nightly", "scheduledTime": "2026-12-01T00:00:00Z", "model": "m", "nodes": [],
                          "workload": { "promptTokens": [512], "concurrency": [1], "generatedTokens": [64] },
                          "selfTest": {}, "baseline": {}, "maxConcurrentNodes": 2, "drainReplicas": drain, "nodeTimeoutSeconds": 600 },
                "status": { "phase": phase, "nodes": progress }
            }))
            .expect("SweepRun")
        };
        let all = [
            ("n1", "Waiting"),
            ("n2", "Draining"),
            ("n3", "Running"),
            ("n4", "Done"),
            ("n5", "TimedOut"),
            ("n6", "Lost"),
            ("n7", "Skipped"),
        ];
        let a = run("b-run", "Running", true, &all);
        // Only Draining and Running hold a node; another run on n3 sorts after `ai/b-run`.
        let b = run("c-run", "Running", true, &[("n3", "Running"), ("n8", "Draining")]);
        let got = sweeping_nodes(&[&b, &a]);
        let want: BTreeMap<String, String> =
            [("n2", "ai/b-run"), ("n3", "ai/b-run"), ("n8", "ai/c-run")].iter().map(|(n, r)| (n.to_string(), r.to_string())).collect();
        assert_eq!(got, want);
        // Not draining, not running (complete, cancelled, pending): no node is held.
        for (phase, drain) in [("Running", false), ("Complete", true), ("Cancelled", true), ("Pending", true)] {
            assert!(sweeping_nodes(&[&run("x", phase, drain, &all)]).is_empty(), "{phase} drain={drain}");
        }
    }

    #[test]
    fn a_result_under_another_fingerprint_is_stale_and_says_what_changed() {
        let v = node_view(&node(), Some(&spark("590", "580")), HeartbeatHistory::new(40), &[]);
        match &v.classes["c1"] {
            ClassQualification::Stale { changed } => assert!(changed.contains("580") && changed.contains("590"), "{changed}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn model_facts_read_the_window_bytes_as_zero_when_absent() {
        let model = |status: serde_json::Value| -> Model {
            let m = serde_json::json!({
                "apiVersion": "brink.dev/v1alpha1",
                "kind": "Model",
                "metadata": {"name": "m", "namespace": "ai"},
                "spec": {"source": {}},
                "status": status,
            });
            serde_json::from_value(m).unwrap()
        };
        let facts = |status| model_facts(&model(status)).map(|f| (f.kv_bytes_per_token, f.kv_window_bytes_per_sequence));
        let base = serde_json::json!({"shapeClass": "c", "sizeBytes": 10});
        let with = |kv: serde_json::Value| {
            let mut s = base.clone();
            s.as_object_mut().unwrap().extend(kv.as_object().unwrap().clone());
            s
        };
        // Written by an agent that counted every layer per token, or a model without windows.
        assert_eq!(facts(with(serde_json::json!({"kvBytesPerToken": 98_304}))), Ok((98_304, 0)));
        // gpt-oss-20b: 12 full layers per token, 12 rings per sequence.
        let oss = serde_json::json!({"kvBytesPerToken": 24_576, "kvWindowBytesPerSequence": 53_477_376});
        assert_eq!(facts(with(oss)), Ok((24_576, 53_477_376)));
        // Windowed layers alone: no per-token part, still sized.
        assert_eq!(facts(with(serde_json::json!({"kvBytesPerToken": 0, "kvWindowBytesPerSequence": 5}))), Ok((0, 5)));
        for missing in [serde_json::json!({"kvBytesPerToken": 0}), serde_json::json!({"kvWindowBytesPerSequence": 5})] {
            let err = facts(with(missing.clone())).unwrap_err();
            assert!(err.contains("status.kvBytesPerToken"), "{missing}: {err}");
        }
    }

    #[test]
    fn the_deployments_prefill_chunk_sizes_the_window_kv() {
        let dep = |chunk: u64| -> ModelDeployment {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment",
                "metadata": {"name": "oss", "namespace": "ai"},
                "spec": {"modelRef": {"name": "oss"}, "engine": {"image": "brink:1", "version": "1"},
                         "serving": {"context": 131_072, "maxBatchTokens": 8192, "prefillChunk": chunk, "concurrency": 4, "kvFraction": 0.9}},
            }))
            .unwrap()
        };
        // gpt-oss-20b: 12 full layers of 2 KiB a position, 12 rings of 2,176 positions at 2048.
        let window = 12 * 2048 * 2176;
        let facts = ModelFacts {
            shape_class: "c".into(),
            size_bytes: 13 * GIB,
            kv_bytes_per_token: 24 << 10,
            kv_window_bytes_per_sequence: window,
        };
        let need = |chunk| deployment_view(&dep(chunk), &facts, 0).memory_bytes().unwrap();
        let at_2048 = 13 * GIB + 4 * ((24 << 10) * 131_072 + window);
        // A smaller chunk keeps the published rings (an upper bound); 8192 asks four of them.
        assert_eq!([need(1), need(2048), need(2049), need(8192)], [at_2048, at_2048, at_2048 + 4 * window, at_2048 + 12 * window]);
    }

    #[test]
    fn a_node_without_agent_has_no_memory_and_no_classes() {
        let v = node_view(&node(), None, HeartbeatHistory::new(40), &[]);
        assert_eq!((v.allocatable_bytes, v.classes.len()), (0, 0));
    }

    #[test]
    fn residents_are_counted_from_their_annotation() {
        let mut r = ModelReplica::new(
            "qwen-0",
            brink_api::crd::ModelReplicaSpec {
                deployment: "qwen".into(),
                node: "n1".into(),
                model: "qwen".into(),
                revision: "r".into(),
                engine: brink_api::crd::EngineBuild { image: "i".into(), version: "v".into(), ..Default::default() },
                serving: brink_api::crd::Serving { context: 1, max_batch_tokens: 1, prefill_chunk: 1, concurrency: 1, kv_fraction: 1.0 },
                gang: None,
            },
        );
        r.metadata.namespace = Some("ns".into());
        r.metadata.annotations = Some([(MEMORY_ANNOTATION.to_string(), (3 * GIB).to_string())].into());
        let mut elsewhere = r.clone();
        elsewhere.spec.node = "n2".into();
        let v = node_view(&node(), None, HeartbeatHistory::new(40), &[&r, &elsewhere]);
        assert_eq!(
            v.residents,
            [Resident { replica: "qwen-0".into(), deployment: "ns/qwen".into(), memory_bytes: 3 * GIB, gang_member: false }]
        );
        // A gang's worker holds a member's memory on its own node.
        let mut gang = r.clone();
        gang.spec.node = "n2".into();
        gang.spec.gang = Some(brink_api::crd::ReplicaGang { workers: vec!["n1".into()], fabric: "f".into(), rdma: false, network: None });
        let v = node_view(&node(), None, HeartbeatHistory::new(40), &[&gang]);
        assert_eq!(
            v.residents,
            [Resident { replica: "qwen-0".into(), deployment: "ns/qwen".into(), memory_bytes: 3 * GIB, gang_member: true }]
        );
        r.metadata.annotations = Some([(MEMORY_ANNOTATION.to_string(), "lots".to_string())].into());
        assert_eq!(replica_memory(&r), 0);
    }
}
