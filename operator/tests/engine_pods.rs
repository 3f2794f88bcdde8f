//! The replica Pods for every engine and gang role, as the operator renders them, validated
//! offline against Kubernetes 1.37's own Pod and Service schemas (PyPI `kubernetes-validate`,
//! strict: an unknown or mistyped field fails), together with the LeaderWorkerSet's Pod
//! templates. A deliberately broken Pod must fail, so a validator that accepts anything is
//! noticed. Skipped with a message when the package is missing, unless BRINK_REQUIRE_PY=1.

mod common;

use std::process::Command;

use brink_api::crd::{EngineKind, GangSettings, ModelReplica, ReplicaGang};
use brink_operator::controllers::{Config, lws, member_pod, pod};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::{Value, json};

fn have_kubernetes_validate() -> bool {
    let ok = Command::new("python3").args(["-c", "import kubernetes_validate, yaml"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with `kubernetes-validate` (pip install 'kubernetes-validate==1.37.0') is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the replica Pod validation: {msg}");
    }
    ok
}

fn config() -> Config {
    Config { agent_image: Some("ghcr.io/brink/brink:0.2.0".into()), ..Config::default() }
}

fn replica(kind: EngineKind, workers: &[&str], rdma: bool) -> ModelReplica {
    let mut r = common::replica("qwen-0", "spark-1", None);
    r.spec.engine.kind = kind;
    r.spec.engine.image = "engine:1".into();
    r.spec.engine.args = vec!["--extra".into()];
    r.metadata.annotations = Some([("brink.dev/memory-bytes".to_string(), (16u64 << 30).to_string())].into());
    if !workers.is_empty() {
        r.spec.gang = Some(ReplicaGang {
            workers: workers.iter().map(|w| w.to_string()).collect(),
            fabric: "cx7-a".into(),
            rdma,
            network: Some(GangSettings {
                socket_interface: Some("enp1s0f1np1".into()),
                ucx_net_devices: Some("enp1s0f1np1".into()),
                ib_hca: Some("rocep1s0f1".into()),
                ..GangSettings::default()
            }),
        });
    }
    r
}

/// Every object the operator renders for the engine cases, named for the report.
fn rendered() -> Vec<(String, Value)> {
    let model = common::model();
    let cfg = config();
    let mut out = Vec::new();
    let cases = [
        ("brink", replica(EngineKind::Brink, &[], false)),
        ("vllm", replica(EngineKind::Vllm, &[], false)),
        ("sglang", replica(EngineKind::Sglang, &[], false)),
        ("llamacpp", replica(EngineKind::Llamacpp, &[], false)),
        ("vllm gang (RDMA)", replica(EngineKind::Vllm, &["spark-2"], true)),
        ("sglang gang of 3", replica(EngineKind::Sglang, &["spark-2", "spark-3"], false)),
        ("llamacpp gang (RPC)", replica(EngineKind::Llamacpp, &["spark-2"], false)),
    ];
    for (name, r) in cases {
        for p in pod::desired_pods(&r, &model, &cfg).unwrap_or_else(|e| panic!("{name}: {e}")) {
            out.push((format!("{name}: Pod {}", p.name_any()), serde_json::to_value(&p).expect("Pod JSON")));
        }
        if r.spec.gang.is_some() {
            let svc = member_pod::gang_service(&r, &cfg).expect("gang Service");
            out.push((format!("{name}: Service {}", svc.name_any()), serde_json::to_value(&svc).expect("Service JSON")));
            let set = lws::desired_lws(&r, &model, &cfg).expect("LeaderWorkerSet");
            for role in ["leaderTemplate", "workerTemplate"] {
                let t = &set["spec"]["leaderWorkerTemplate"][role];
                let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("{role}-x"), "labels": t["metadata"]["labels"], "annotations": t["metadata"]["annotations"]}, "spec": t["spec"]});
                out.push((format!("{name}: LeaderWorkerSet {role}"), pod));
            }
        }
    }
    out
}

fn validate(docs: &[(String, Value)]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("objects.json");
    std::fs::write(
        &path,
        serde_json::to_vec(&docs.iter().map(|(n, d)| json!({"name": n, "object": d})).collect::<Vec<_>>()).expect("JSON"),
    )
    .expect("write");
    let script = r#"
import json, sys, kubernetes_validate
bad = 0
for d in json.load(open(sys.argv[1])):
    try:
        kubernetes_validate.validate(d["object"], "1.37.0", True)
        print("ok  ", d["name"])
    except kubernetes_validate.ValidationError as e:
        bad += 1
        print("FAIL", d["name"], ":", e.message, "at", ".".join(map(str, e.path)))
sys.exit(1 if bad else 0)
"#;
    let out = Command::new("python3").args(["-c", script]).arg(&path).output().expect("run python3");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn replica_pods_of_every_engine_and_gang_role_pass_kubernetes_validate() {
    if !have_kubernetes_validate() {
        return;
    }
    let docs = rendered();
    // 4 single Pods, 2 + 3 + 2 gang members, 3 Services and 6 templates.
    assert_eq!(docs.len(), 4 + 7 + 3 + 6, "{:?}", docs.iter().map(|d| &d.0).collect::<Vec<_>>());
    let (ok, report) = validate(&docs);
    eprint!("{report}");
    assert!(ok, "kubernetes-validate refused a rendered object:\n{report}");
    assert_eq!(report.lines().filter(|l| l.starts_with("ok  ")).count(), docs.len(), "{report}");

    // Negative control: the same leader with a mistyped field must be refused.
    let (_, leader) = docs.iter().find(|(n, _)| n == "vllm gang (RDMA): Pod qwen-0").expect("leader");
    let mut broken = leader.clone();
    broken["spec"]["containers"][0]["ports"][0]["containerPort"] = json!("eight thousand");
    let (ok, report) = validate(&[("broken".into(), broken)]);
    assert!(!ok && report.contains("FAIL broken"), "a broken Pod passed: {report}");
}

#[test]
fn a_gang_member_has_what_nccl_needs_for_roce() {
    let model = common::model();
    let pods: Vec<Pod> = pod::desired_pods(&replica(EngineKind::Vllm, &["spark-2"], true), &model, &config()).expect("pods");
    for p in &pods {
        let spec = p.spec.as_ref().expect("spec");
        let engine = &spec.containers[0];
        let caps = engine.security_context.as_ref().and_then(|s| s.capabilities.as_ref()).and_then(|c| c.add.clone());
        assert_eq!(caps, Some(vec!["IPC_LOCK".to_string()]), "{}", p.name_any());
        let mounts: Vec<&str> = engine.volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
        assert!(mounts.contains(&"/dev/infiniband") && mounts.contains(&"/dev/shm"), "{mounts:?}");
        let env: Vec<(String, String)> = engine.env.iter().flatten().filter_map(|e| Some((e.name.clone(), e.value.clone()?))).collect();
        for (k, v) in [
            ("NCCL_SOCKET_IFNAME", "enp1s0f1np1"),
            ("GLOO_SOCKET_IFNAME", "enp1s0f1np1"),
            ("UCX_NET_DEVICES", "enp1s0f1np1"),
            ("NCCL_IB_HCA", "rocep1s0f1"),
        ] {
            assert!(env.contains(&(k.to_string(), v.to_string())), "{}: {k}", p.name_any());
        }
        assert_eq!(spec.node_name.as_deref(), Some(if p.name_any() == "qwen-0" { "spark-1" } else { "spark-2" }));
    }
    // Without RDMA on every member: no devices, no capability (NCCL uses its sockets).
    let plain = pod::desired_pods(&replica(EngineKind::Vllm, &["spark-2"], false), &model, &config()).expect("pods");
    assert!(plain.iter().all(|p| p.spec.as_ref().is_some_and(|s| s.containers[0].security_context.is_none())));
    // The leader documents its liveness and readiness; it carries the deployment label, the worker not.
    let leader = &pods[0];
    let notes = leader.annotations();
    assert!(notes["brink.dev/liveness"].contains("vllm:num_requests_running + vllm:num_requests_waiting"), "{notes:?}");
    assert!(notes["brink.dev/readiness"].contains("brink-agent qualify"), "{notes:?}");
    assert!(leader.labels().contains_key("brink.dev/deployment") && !pods[1].labels().contains_key("brink.dev/deployment"));
    // An operator without brink-agent's image cannot render the sidecar: a clear error.
    let err = pod::desired_pods(&replica(EngineKind::Llamacpp, &[], false), &model, &Config::default()).expect_err("no agent image");
    assert!(err.to_string().contains("--agent-image"), "{err}");
}
