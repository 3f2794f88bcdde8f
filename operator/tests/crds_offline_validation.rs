//! The CRDs that `brink-operator crds` prints, checked offline by scripts/crd_check.py: each is
//! a valid CustomResourceDefinition for Kubernetes 1.37 (PyPI `kubernetes-validate`), and
//! example objects are accepted or rejected by each CRD's openAPIV3Schema as intended (the
//! patterns, ranges and enums; the CEL rules are evaluated by brink-api's tests).
//!
//! Needs python3 with `kubernetes-validate==1.37.0` (it brings `jsonschema` and PyYAML).
//! Skipped with a message when missing, unless BRINK_REQUIRE_PY=1 (as scripts/test sets).

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

fn have_python_packages() -> bool {
    let ok =
        Command::new("python3").args(["-c", "import kubernetes_validate, jsonschema, yaml"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with `kubernetes-validate` (pip install 'kubernetes-validate==1.37.0') is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the offline CRD validation: {msg}");
    }
    ok
}

fn model() -> Value {
    json!({"apiVersion": "brink.dev/v1alpha1", "kind": "Model", "metadata": {"name": "q", "namespace": "n"},
           "spec": {"source": {"https": {"url": "https://example.com/q.gguf", "credentialsSecretRef": {"name": "token"}}},
                    "sha256": "a".repeat(64), "format": "gguf"}})
}

fn pvc_model() -> Value {
    with(model(), "/spec/source", json!({"pvc": {"claimName": "models", "path": "qwen/q.gguf"}}))
}

fn deployment() -> Value {
    json!({"apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "d", "namespace": "n"},
           "spec": {"modelRef": {"name": "q"}, "replicas": 2, "engine": {"image": "ghcr.io/brink/agent:0.2.0", "version": "0.2.0"},
                    "serving": {"context": 32768, "maxBatchTokens": 16384, "prefillChunk": 4096, "concurrency": 8, "kvFraction": 1.0},
                    "placement": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB10"}, "spread": "PerNode", "requireQualified": true},
                    "onSelfTestFailure": "Clamp", "rollout": {"strategy": "Canary", "progressDeadlineSeconds": 600}}})
}

fn gang_deployment() -> Value {
    let d = with(
        deployment(),
        "/spec/engine",
        json!({"kind": "vllm", "image": "vllm/vllm-openai:v0.11.0", "version": "0.11.0",
                                                      "port": 8000, "args": ["--enforce-eager"]}),
    );
    let d = with(d, "/spec/nodesPerReplica", json!(2));
    with(
        d,
        "/spec/gang",
        json!({"fabricLabel": "brink.dev/fabric", "socketInterface": "enp1s0f1np1", "ucxNetDevices": "enp1s0f1np1",
                                 "ibHca": "rocep1s0f1,roceP2p1s0f1"}),
    )
}

fn replica() -> Value {
    json!({"apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica", "metadata": {"name": "r", "namespace": "n"},
           "spec": {"deployment": "d", "node": "spark-01", "model": "q", "revision": "5d2c",
                    "engine": {"image": "ghcr.io/brink/agent:0.2.0", "version": "0.2.0"},
                    "serving": {"context": 32768, "maxBatchTokens": 8191, "prefillChunk": 4096, "concurrency": 8, "kvFraction": 0.5}},
           "status": {"phase": "SelfTesting", "restarts": 0}})
}

fn spark_node() -> Value {
    json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SparkNode", "metadata": {"name": "spark-01"},
           "spec": {"shapeClasses": ["qwen3moe-h2048-e128-top8-ffn768"]},
           "status": {"agentVersion": "0.2.0", "kernelSourcesHash": "ab".repeat(32),
                      "qualifications": [{"shapeClass": "qwen3moe-h2048-e128-top8-ffn768",
                        "qualification": {"schema": 1, "digest": "cd".repeat(32), "qualifiedAt": "2026-11-30T19:44:52Z",
                          "fingerprint": {"gpuName": "NVIDIA GB10", "computeCapability": "12.1", "driverVersion": "580.95.05",
                                          "cudaVersion": "13.0", "nvrtcVersion": "13.0", "agentVersion": "0.2.0",
                                          "kernelSourcesHash": "ab".repeat(32), "shapeClass": "qwen3moe-h2048-e128-top8-ffn768",
                                          "serving": {"maxBatchTokens": 16384, "prefillChunk": 4096, "context": 32768}},
                          "verdict": {"state": "clamped", "maxTokens": 8191, "firstFailure": 8192},
                          "summary": {"derived": 10, "executed": 10, "passed": 9, "failed": 1, "hung": 0, "skipped": 0,
                                      "negativeControlsMissed": 0}}}],
                      "conditions": [{"type": "Ready", "status": "True", "reason": "Heartbeat", "message": "",
                                      "lastTransitionTime": "2026-11-30T19:44:52Z"}]}})
}

fn sweep() -> Value {
    json!({"apiVersion": "brink.dev/v1alpha1", "kind": "RegressionSweep", "metadata": {"name": "nightly", "namespace": "n"},
           "spec": {"schedule": "0 2 * * *", "concurrencyPolicy": "Forbid", "startingDeadlineSeconds": 3600,
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB10"}, "maxConcurrentNodes": 2, "modelRef": {"name": "q"},
                    "workload": {"promptTokens": [512, 8192], "concurrency": [1, 8], "generatedTokens": [128]},
                    "baseline": {"policy": "LastPassing", "tolerance": {"throughputPercent": 10, "latencyPercent": 20}}}})
}

fn sweep_result() -> Value {
    json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SweepResult", "metadata": {"name": "nightly-1-spark-01", "namespace": "n"},
           "spec": {"run": "nightly-1", "node": "spark-01"},
           "status": {"state": "Done", "points": [{"point": {"promptTokens": 512, "concurrency": 1, "generatedTokens": 128},
                                                    "requests": 16, "failed": 0, "outputTokensPerS": 70.4, "ttftP50S": 0.22}],
                      "judgement": {"verdict": "Pass"}}})
}

/// `base` with the value at a JSON pointer replaced (`Value::Null` removes it).
fn with(mut v: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    let p = v.pointer_mut(parent).unwrap_or_else(|| panic!("no {parent}"));
    match value {
        Value::Null => {
            p.as_object_mut().expect("object").remove(key);
        }
        value => match key.parse::<usize>() {
            Ok(i) if p.is_array() => p[i] = value,
            _ => p[key] = value,
        },
    }
    v
}

fn examples() -> Vec<Value> {
    let ok = |name: &str, object: Value| json!({"kind": object["kind"], "valid": true, "name": name, "object": object});
    // Rejected, and for the change at `pointer`: the script checks the error's path.
    let bad = |name: &str, base: Value, pointer: &str, value: Value| {
        let field = pointer.trim_start_matches('/').replace('/', ".");
        json!({"kind": base["kind"], "valid": false, "name": name, "field": field, "object": with(base, pointer, value)})
    };
    vec![
        ok("full", model()),
        ok("pvc source", pvc_model()),
        ok("full", deployment()),
        ok(
            "minimal",
            with(with(with(deployment(), "/spec/placement", Value::Null), "/spec/rollout", Value::Null), "/spec/replicas", Value::Null),
        ),
        ok("full", replica()),
        ok("vLLM gang of two", gang_deployment()),
        ok(
            "gang replica",
            with(
                replica(),
                "/spec/gang",
                json!({"workers": ["spark-02"], "fabric": "cx7-a", "rdma": true,
                                                                 "network": {"fabricLabel": "brink.dev/fabric", "socketInterface": "enp1s0f1np1"}}),
            ),
        ),
        bad("engine kind tgi", gang_deployment(), "/spec/engine/kind", json!("tgi")),
        bad("engine kind in capitals", gang_deployment(), "/spec/engine/kind", json!("VLLM")),
        bad("nodesPerReplica 0", gang_deployment(), "/spec/nodesPerReplica", json!(0)),
        bad("nodesPerReplica 65", gang_deployment(), "/spec/nodesPerReplica", json!(65)),
        bad("engine port 80", gang_deployment(), "/spec/engine/port", json!(80)),
        bad("interface with a space", gang_deployment(), "/spec/gang/socketInterface", json!("enp1s0 f1")),
        bad("fabric label with spaces", gang_deployment(), "/spec/gang/fabricLabel", json!("my fabric")),
        bad(
            "gang without workers",
            with(replica(), "/spec/gang", json!({"workers": [], "fabric": "cx7-a"})),
            "/spec/gang/workers",
            json!([]),
        ),
        ok("full", spark_node()),
        bad("sha256 of 63 digits", model(), "/spec/sha256", json!("a".repeat(63))),
        bad("sha256 in upper case", model(), "/spec/sha256", json!("A".repeat(64))),
        bad("http url", model(), "/spec/source/https/url", json!("http://example.com/q.gguf")),
        bad("pvc path escaping the volume", pvc_model(), "/spec/source/pvc/path", json!("../etc/passwd")),
        bad(
            "relative node path",
            with(model(), "/spec/source", json!({"nodePath": {"path": "/m/q.gguf"}})),
            "/spec/source/nodePath/path",
            json!("m/q.gguf"),
        ),
        bad("format safetensors", model(), "/spec/format", json!("safetensors")),
        bad("no source", model(), "/spec/source", Value::Null),
        bad("negative replicas", deployment(), "/spec/replicas", json!(-1)),
        bad("kvFraction 0", deployment(), "/spec/serving/kvFraction", json!(0.0)),
        bad("kvFraction above 1", deployment(), "/spec/serving/kvFraction", json!(1.5)),
        bad("concurrency 0", deployment(), "/spec/serving/concurrency", json!(0)),
        bad("maxBatchTokens 0", deployment(), "/spec/serving/maxBatchTokens", json!(0)),
        bad("onSelfTestFailure Maybe", deployment(), "/spec/onSelfTestFailure", json!("Maybe")),
        bad("spread Everywhere", deployment(), "/spec/placement/spread", json!("Everywhere")),
        bad("progress deadline 5 s", deployment(), "/spec/rollout/progressDeadlineSeconds", json!(5)),
        bad("model name with capitals", deployment(), "/spec/modelRef/name", json!("Qwen3")),
        bad("no engine", deployment(), "/spec/engine", Value::Null),
        bad("phase Running", replica(), "/status/phase", json!("Running")),
        bad("no node", replica(), "/spec/node", Value::Null),
        bad("verdict state passed", spark_node(), "/status/qualifications/0/qualification/verdict/state", json!("passed")),
        bad("condition without reason", spark_node(), "/status/conditions/0/reason", Value::Null),
        ok("full", sweep()),
        ok("full", sweep_result()),
        bad("concurrency policy Sometimes", sweep(), "/spec/concurrencyPolicy", json!("Sometimes")),
        bad("empty grid", sweep(), "/spec/workload/promptTokens", json!([])),
        bad("prompt of 0 tokens", sweep(), "/spec/workload/promptTokens/0", json!(0)),
        bad("no model", sweep(), "/spec/modelRef", Value::Null),
        bad("zero nodes at once", sweep(), "/spec/maxConcurrentNodes", json!(0)),
        bad("verdict Fine", sweep_result(), "/status/judgement/verdict", json!("Fine")),
    ]
}

#[test]
fn crds_pass_kubernetes_validate_and_their_schemas_sort_examples() {
    if !have_python_packages() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_brink-operator")).arg("crds").output().expect("run brink-operator crds");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dir = tempfile::tempdir().expect("temp dir");
    let crds = dir.path().join("crds.yaml");
    let examples_path = dir.path().join("examples.json");
    std::fs::write(&crds, &out.stdout).expect("write crds.yaml");
    let examples = examples();
    std::fs::write(&examples_path, serde_json::to_vec(&examples).expect("JSON")).expect("write examples.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/crd_check.py");
    let check = Command::new("python3").arg(script).arg(&crds).arg(&examples_path).output().expect("run python3");
    let report = String::from_utf8_lossy(&check.stdout);
    eprint!("{report}");
    assert!(check.status.success(), "crd_check.py failed:\n{report}{}", String::from_utf8_lossy(&check.stderr));
    // Every CRD and every example was looked at (a script that skipped them would also exit 0).
    assert_eq!(report.lines().filter(|l| l.starts_with("ok   CRD ")).count(), brink_api::crd::crds().len(), "{report}");
    assert_eq!(report.lines().filter(|l| l.starts_with("ok   ") && !l.starts_with("ok   CRD ")).count(), examples.len(), "{report}");
}
