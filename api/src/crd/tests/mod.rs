//! The generated CRDs: names, scope, subresources, printer columns, a schema the API server
//! accepts as structural, the CEL rules evaluated on good and bad objects, and the camelCase
//! wire form of a full example of each kind.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::cel::Validator;
use serde_json::{Value, json};

use super::*;

mod sweep;

fn crd(kind: &str) -> CustomResourceDefinition {
    crds().into_iter().find(|c| c.spec.names.kind == kind).unwrap_or_else(|| panic!("no CRD of kind {kind}"))
}

fn schema(kind: &str) -> Value {
    let crd = crd(kind);
    let s = crd.spec.versions[0].schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()).expect("openAPIV3Schema");
    serde_json::to_value(s).unwrap()
}

/// The sub-schema at a dotted property path (`spec.serving.kvFraction`); `[]` steps into items.
fn at<'a>(schema: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(schema, |s, step| match step {
        "[]" => s.get("items").unwrap_or_else(|| panic!("{path}: no items at {step}")),
        name => s.pointer(&format!("/properties/{name}")).unwrap_or_else(|| panic!("{path}: no property {name}")),
    })
}

fn rules(s: &Value) -> Vec<String> {
    s.get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(|rs| rs.iter().map(|r| r["rule"].as_str().unwrap_or_default().to_string()).collect())
        .unwrap_or_default()
}

/// Runs the CRD's CEL rules on `object` (and `old` for transition rules); the messages of the
/// rules that failed.
fn cel(kind: &str, object: &Value, old: Option<&Value>) -> Vec<String> {
    match Validator::new().validate(&schema(kind), object, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.into_vec().into_iter().map(|e| e.message).collect(),
    }
}

#[test]
fn seven_crds_in_the_brink_group() {
    let all = crds();
    let kinds: Vec<_> = all.iter().map(|c| c.spec.names.kind.as_str()).collect();
    assert_eq!(kinds, ["SparkNode", "Model", "ModelDeployment", "ModelReplica", "RegressionSweep", "SweepRun", "SweepResult"]);
    let expected = [
        ("SparkNode", "sparknodes", "Cluster", Some("snode")),
        ("Model", "models", "Namespaced", None),
        ("ModelDeployment", "modeldeployments", "Namespaced", Some("mdep")),
        ("ModelReplica", "modelreplicas", "Namespaced", Some("mrep")),
        ("RegressionSweep", "regressionsweeps", "Namespaced", Some("rsweep")),
        ("SweepRun", "sweepruns", "Namespaced", Some("srun")),
        ("SweepResult", "sweepresults", "Namespaced", Some("sres")),
    ];
    assert_eq!(all.len(), expected.len());
    for (c, (kind, plural, scope, short)) in all.iter().zip(expected) {
        assert_eq!(c.spec.group, GROUP);
        assert_eq!(c.spec.names.kind, kind);
        assert_eq!(c.spec.names.plural, plural);
        assert_eq!(c.metadata.name.as_deref(), Some(format!("{plural}.{GROUP}").as_str()));
        assert_eq!(c.spec.scope, scope, "{kind}");
        assert_eq!(c.spec.names.short_names.as_ref().and_then(|s| s.first()).map(String::as_str), short, "{kind}");
        assert_eq!(c.spec.names.categories.as_deref(), Some(&["brink".to_string()][..]), "{kind}");
        assert_eq!(c.spec.versions.len(), 1);
        let v = &c.spec.versions[0];
        assert_eq!(v.name, VERSION);
        assert!(v.served && v.storage, "{kind}");
        let sub = v.subresources.as_ref().unwrap_or_else(|| panic!("{kind}: no subresources"));
        assert!(sub.status.is_some(), "{kind}: status subresource");
        assert_eq!(sub.scale.is_some(), kind == "ModelDeployment", "{kind}: scale subresource only on ModelDeployment");
    }
}

#[test]
fn model_deployment_scale_subresource() {
    let c = crd("ModelDeployment");
    let scale = c.spec.versions[0].subresources.as_ref().and_then(|s| s.scale.as_ref()).expect("scale");
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(scale.label_selector_path.as_deref(), Some(".status.selector"));
    // The API server requires both replica paths to be int32 integers.
    let s = schema("ModelDeployment");
    assert_eq!(at(&s, "spec.replicas")["type"], "integer");
    assert_eq!(at(&s, "spec.replicas")["format"], "int32");
    assert_eq!(at(&s, "status.replicas")["format"], "int32");
    assert_eq!(at(&s, "status.selector")["type"], "string");
}

#[test]
fn printer_columns() {
    let expected: [(&str, &[&str]); 4] = [
        ("SparkNode", &["GPU", "CC", "Agent", "Ready", "Qualified", "Heartbeat", "Age"]),
        ("Model", &["Arch", "Shape", "Size", "Ready", "Age"]),
        ("ModelDeployment", &["Model", "Desired", "Ready", "Engine", "Kind", "Nodes", "Rollout", "Age"]),
        ("ModelReplica", &["Deployment", "Node", "Workers", "Phase", "Endpoint", "Restarts", "Age"]),
    ];
    for (kind, names) in expected {
        let c = crd(kind);
        let cols = c.spec.versions[0].additional_printer_columns.clone().unwrap_or_default();
        let got: Vec<_> = cols.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(got, names, "{kind}");
        // Every column's path exists in the schema (a typo shows an empty column, silently).
        let s = schema(kind);
        for col in &cols {
            let path = col.json_path.trim_start_matches('.');
            if path.starts_with("metadata.") {
                continue;
            }
            let path = path.split("[?").next().unwrap_or(path);
            let node = at(&s, path);
            let ty = if path.ends_with("conditions") { "array" } else { col.type_.as_str() };
            let schema_ty = node["type"].as_str().unwrap_or_default();
            let matches = match ty {
                "date" => schema_ty == "string",
                // kubectl prints a list's items in a string column (a gang's workers).
                "string" => schema_ty == "string" || schema_ty == "array",
                other => schema_ty == other,
            };
            assert!(matches, "{kind} column {}: {} is {schema_ty}, column says {}", col.name, col.json_path, col.type_);
        }
    }
}

/// Walks a schema and returns every violation of the API server's structural-schema rules
/// (what `kubectl apply` of the CRD would be refused for): no `$ref`; a `type` on every node
/// that is not int-or-string or preserve-unknown; inside `oneOf`/`anyOf`/`allOf`/`not` no
/// `type`, `description`, `default`, `nullable` or `additionalProperties`, and no property the
/// parent does not also declare.
fn structural_violations(s: &Value, path: &str, in_junctor: bool, out: &mut Vec<String>) {
    let Some(obj) = s.as_object() else { return };
    if obj.contains_key("$ref") {
        out.push(format!("{path}: $ref"));
    }
    let free = obj.contains_key("x-kubernetes-int-or-string") || obj.contains_key("x-kubernetes-preserve-unknown-fields");
    if in_junctor {
        for banned in ["type", "description", "default", "nullable", "additionalProperties"] {
            if obj.contains_key(banned) {
                out.push(format!("{path}: {banned} inside a junctor"));
            }
        }
    } else if !obj.contains_key("type") && !free {
        out.push(format!("{path}: no type"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            structural_violations(sub, &format!("{path}.{name}"), in_junctor, out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = obj.get(key).filter(|v| v.is_object()) {
            structural_violations(sub, &format!("{path}.{key}"), in_junctor, out);
        }
    }
    for j in ["oneOf", "anyOf", "allOf"] {
        for (i, branch) in obj.get(j).and_then(Value::as_array).into_iter().flatten().enumerate() {
            structural_violations(branch, &format!("{path}.{j}[{i}]"), true, out);
            for name in branch.get("properties").and_then(Value::as_object).into_iter().flatten().map(|(k, _)| k) {
                if obj.get("properties").and_then(|p| p.get(name)).is_none() {
                    out.push(format!("{path}.{j}[{i}]: property {name} not declared by the parent"));
                }
            }
        }
    }
}

#[test]
fn schemas_are_structural() {
    for c in crds() {
        let kind = c.spec.names.kind.clone();
        let mut out = Vec::new();
        structural_violations(&schema(&kind), &kind, false, &mut out);
        assert!(out.is_empty(), "{kind}: {out:#?}");
    }
    // The checker itself finds what it must.
    let mut out = Vec::new();
    let bad = json!({"type": "object", "properties": {"a": {"properties": {}}, "b": {"$ref": "#/x", "type": "string"}},
        "oneOf": [{"type": "object", "properties": {"c": {}}}]});
    structural_violations(&bad, "bad", false, &mut out);
    assert_eq!(out.len(), 4, "{out:#?}");
}

#[test]
fn validation_attributes_reach_the_schema() {
    let m = schema("Model");
    assert_eq!(at(&m, "spec.sha256")["pattern"], "^[0-9a-f]{64}$");
    assert_eq!(at(&m, "spec.parts.[].sha256")["pattern"], "^[0-9a-f]{64}$");
    assert_eq!(at(&m, "spec.sha256")["maxLength"].as_f64(), Some(64.0));
    assert_eq!(at(&m, "spec.parts")["minItems"].as_f64(), Some(2.0));
    assert_eq!(at(&m, "spec.format")["enum"], json!(["gguf"]));
    assert!(at(&m, "spec.source.https.url")["pattern"].as_str().unwrap().starts_with("^https://"));
    assert_eq!(at(&m, "status.cache")["x-kubernetes-list-type"], "map");
    assert_eq!(at(&m, "status.cache")["x-kubernetes-list-map-keys"], json!(["node"]));

    let d = schema("ModelDeployment");
    assert_eq!(at(&d, "spec.replicas")["minimum"].as_f64(), Some(0.0));
    assert_eq!(at(&d, "spec.serving.concurrency")["minimum"].as_f64(), Some(1.0));
    assert_eq!(at(&d, "spec.serving.concurrency")["maximum"].as_f64(), Some(4096.0));
    assert_eq!(at(&d, "spec.serving.maxBatchTokens")["minimum"].as_f64(), Some(1.0));
    let kv = at(&d, "spec.serving.kvFraction");
    assert_eq!((kv["minimum"].as_f64(), kv["exclusiveMinimum"].as_bool(), kv["maximum"].as_f64()), (Some(0.0), Some(true), Some(1.0)));
    assert_eq!(at(&d, "spec.onSelfTestFailure")["enum"], json!(["Clamp", "Refuse"]));
    assert_eq!(at(&d, "spec.placement.spread")["enum"], json!(["PerNode", "BestEffort"]));
    assert_eq!(at(&d, "spec.rollout.strategy")["enum"], json!(["Canary", "AllAtOnce"]));
    assert_eq!(at(&d, "spec.rollout.progressDeadlineSeconds")["minimum"].as_f64(), Some(30.0));

    let r = schema("ModelReplica");
    let phases = json!(["Pending", "Downloading", "Loading", "SelfTesting", "Serving", "Failed", "Stalled"]);
    assert_eq!(at(&r, "status.phase")["enum"], phases);

    for kind in ["SparkNode", "Model", "ModelDeployment", "ModelReplica"] {
        let conds = at(&schema(kind), "status.conditions").clone();
        assert_eq!(conds["x-kubernetes-list-type"], "map", "{kind}");
        assert_eq!(conds["x-kubernetes-list-map-keys"], json!(["type"]), "{kind}");
        let required = conds["items"]["required"].as_array().cloned().unwrap_or_default();
        for field in ["type", "status", "reason", "message", "lastTransitionTime"] {
            assert!(required.contains(&json!(field)), "{kind}: condition.{field} required");
        }
        assert!(conds["items"]["properties"].get("observedGeneration").is_some(), "{kind}");
    }
    let n = schema("SparkNode");
    assert_eq!(at(&n, "status.qualifications")["x-kubernetes-list-map-keys"], json!(["shapeClass"]));
    assert_eq!(at(&n, "status.qualifications.[].failingCases")["maxItems"].as_f64(), Some(MAX_FAILING_CASES as f64));
}

#[test]
fn every_verdict_fits_the_flat_verdict_schema() {
    use crate::Verdict;
    let n = schema("SparkNode");
    let q = at(&n, "status.qualifications.[].qualification");
    for field in ["verdict", "kernelVerdict", "modelVerdict"] {
        let flat = at(q, field);
        let props = flat["properties"].as_object().expect("properties");
        let states = flat["properties"]["state"]["enum"].as_array().expect("state enum");
        for v in [
            Verdict::Qualified { max_tokens: 1 },
            Verdict::Clamped { max_tokens: 1, first_failure: 2 },
            Verdict::Disqualified { reason: "r".into() },
            Verdict::NotQualified { reason: "r".into() },
        ] {
            let json = serde_json::to_value(&v).unwrap();
            for (key, value) in json.as_object().unwrap() {
                assert!(props.contains_key(key), "{field}: {key} of {json} missing from {flat:#}");
                if key == "state" {
                    assert!(states.contains(value), "{field}: state {value} not in {states:?}");
                }
            }
        }
        assert_eq!(flat["required"], json!(["state"]), "{field}");
    }
}

#[test]
fn cel_rules_sit_where_they_apply() {
    let m = schema("Model");
    let spec_rules = rules(at(&m, "spec"));
    assert!(spec_rules.contains(&"self == oldSelf".to_string()), "{spec_rules:?}");
    assert!(spec_rules.contains(&"has(self.sha256) != has(self.parts)".to_string()), "{spec_rules:?}");
    assert_eq!(rules(at(&m, "spec.source")), ["(has(self.https) ? 1 : 0) + (has(self.nodePath) ? 1 : 0) + (has(self.pvc) ? 1 : 0) == 1"]);
    let d = schema("ModelDeployment");
    assert_eq!(rules(at(&d, "spec.serving")), ["self.prefillChunk <= self.maxBatchTokens"]);
    assert_eq!(
        rules(at(&d, "spec")),
        ["(has(self.engine.kind) && self.engine.kind != 'brink') || !has(self.nodesPerReplica) || self.nodesPerReplica == 1"]
    );
    let r = schema("ModelReplica");
    assert_eq!(
        rules(at(&r, "spec")),
        [
            "self.node == oldSelf.node",
            "has(self.gang) == has(oldSelf.gang) && (!has(self.gang) || self.gang.workers == oldSelf.gang.workers)"
        ]
    );
    // The replica's serving limits carry the same rule as the deployment's.
    assert_eq!(rules(at(&r, "spec.serving")), ["self.prefillChunk <= self.maxBatchTokens"]);
}

/// Every node of a schema that carries CEL rules, with its path.
fn nodes_with_rules<'a>(s: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
    if s.get("x-kubernetes-validations").is_some() {
        out.push((path.clone(), s));
    }
    for (name, sub) in s.get("properties").and_then(Value::as_object).into_iter().flatten() {
        nodes_with_rules(sub, format!("{path}.{name}"), out);
    }
    if let Some(items) = s.get("items") {
        nodes_with_rules(items, format!("{path}[]"), out);
    }
}

/// kube-cel's static analysis of each rule where it sits: variables valid in a CRD rule, and a
/// cost estimate within the API server's budget (which needs bounds: maxLength, maxItems), so
/// that the API server does not refuse the CRD for a rule it estimates too expensive.
#[test]
fn cel_rules_pass_static_analysis() {
    use kube::core::cel::{ScopeContext, analyze_rule, compile_schema};
    let mut checked = 0;
    for c in crds() {
        let kind = c.spec.names.kind.clone();
        let s = schema(&kind);
        let mut nodes = Vec::new();
        nodes_with_rules(&s, kind.clone(), &mut nodes);
        for (path, node) in nodes {
            let compiled = compile_schema(node);
            assert!(!compiled.has_errors(), "{path}: {:?}", compiled.compilation_errors());
            for rule in rules(node) {
                let warnings = analyze_rule(&rule, &compiled, ScopeContext::CrdValidation);
                assert!(warnings.is_empty(), "{path}: {rule}: {warnings:#?}");
                checked += 1;
            }
        }
    }
    assert_eq!(
        checked, 12,
        "rules: Model spec 3 + source 1, ModelDeployment spec 1 + serving 1, ModelReplica spec 2 + serving 1, RegressionSweep spec 1, SweepRun spec 1, SweepResult spec 1"
    );
}

fn model_json() -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "Model",
        "metadata": {"name": "qwen3-30b-a3b", "namespace": "serving"},
        "spec": {
            "source": {"https": {"url": "https://models.example.com/qwen3-30b-a3b-q4_k_m.gguf", "credentialsSecretRef": {"name": "hf-token"}}},
            "sha256": "0f".repeat(32),
            "format": "gguf"
        },
        "status": {
            "architecture": "qwen3moe", "experts": 128, "topK": 8, "sizeBytes": 18_556_688_736_u64,
            "quantTypes": ["Q4_K", "Q6_K", "F32"], "shapeClass": "qwen3moe-h2048-e128-top8-ffn768",
            "cache": [{"node": "spark-01", "phase": "Downloading", "bytesDone": 1_073_741_824_u64, "bytesTotal": 18_556_688_736_u64,
                       "updatedAt": "2026-11-30T20:00:00Z"}],
            "conditions": [{"type": "Ready", "status": "False", "reason": "Downloading", "message": "1 of 1 nodes downloading",
                            "observedGeneration": 1, "lastTransitionTime": "2026-11-30T19:59:00Z"}]
        }
    })
}

fn deployment_json() -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "qwen3", "namespace": "serving"},
        "spec": {
            "modelRef": {"name": "qwen3-30b-a3b"},
            "replicas": 3,
            "engine": {"image": "ghcr.io/brink/agent:0.2.0", "version": "0.2.0"},
            "serving": {"context": 32_768, "maxBatchTokens": 16_384, "prefillChunk": 4096, "concurrency": 16, "kvFraction": 0.9},
            "placement": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB10"}, "spread": "PerNode", "requireQualified": true,
                          "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
                                          {"key": "brink.dev/maintenance", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
                          "priorityClassName": "inference-high"},
            "onSelfTestFailure": "Refuse",
            "rollout": {"strategy": "Canary", "progressDeadlineSeconds": 600}
        },
        "status": {
            "observedGeneration": 4, "replicas": 3, "readyReplicas": 2, "updatedReplicas": 1, "selector": "brink.dev/deployment=qwen3",
            "rollout": {"phase": "Canary", "revision": "5d2c", "previousRevision": "9a71", "canaryReplica": "qwen3-x7k2"},
            "conditions": [{"type": "Progressing", "status": "True", "reason": "CanaryStarted", "message": "qwen3-x7k2 on spark-02",
                            "observedGeneration": 4, "lastTransitionTime": "2026-11-30T20:01:00Z"}]
        }
    })
}

fn replica_json() -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "ModelReplica",
        "metadata": {"name": "qwen3-x7k2", "namespace": "serving"},
        "spec": {
            "deployment": "qwen3", "node": "spark-02", "model": "qwen3-30b-a3b", "revision": "5d2c",
            "engine": {"image": "ghcr.io/brink/agent:0.2.0", "version": "0.2.0"},
            "serving": {"context": 32_768, "maxBatchTokens": 8191, "prefillChunk": 4096, "concurrency": 16, "kvFraction": 0.9}
        },
        "status": {
            "observedGeneration": 1, "phase": "Serving", "endpoint": "10.0.3.7:8080",
            "download": {"bytesDone": 18_556_688_736_u64, "bytesTotal": 18_556_688_736_u64},
            "envelope": {"validated": true, "validatedTokens": 8191, "firstFailure": 8192, "maxBatchTokens": 8191, "prefillChunk": 4096},
            "throughput": {"prefillTokensPerSecond": 5210.5, "decodeTokensPerSecond": 61.25},
            "restarts": 1,
            "lastStall": {"at": "2026-11-30T20:05:00Z", "stage": "kernel moe_gemm", "batchTokens": 12_288, "sequences": 3,
                          "message": "no layer progress for 30 s"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Serving", "message": "",
                            "lastTransitionTime": "2026-11-30T20:06:00Z"}]
        }
    })
}

fn spark_node_json() -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "SparkNode",
        "metadata": {"name": "spark-02"},
        "spec": {"shapeClasses": ["qwen3moe-h2048-e128-top8-ffn768"]},
        "status": {
            "device": {"ordinal": 0, "name": "NVIDIA GB10", "uuid": "GPU-5f1b2c3d-0000-1111-2222-333344445555", "computeCapability": "12.1",
                       "smCount": 48, "totalMemBytes": 128_849_018_880_u64, "freeMemBytes": 100_000_000_000_u64, "maxGridDim": [2_147_483_647_u32, 65_535, 65_535],
                       "driverVersion": "580.95.05", "cudaVersion": "13.0", "nvrtcVersion": "13.0", "integrated": true,
                       "unifiedMemory": {"total": 128_849_018_880_u64, "available": 110_000_000_000_u64}},
            "agentVersion": "0.2.0", "kernelSourcesHash": "ab".repeat(32),
            "fingerprint": {"gpuName": "NVIDIA GB10", "computeCapability": "12.1", "driverVersion": "580.95.05", "cudaVersion": "13.0",
                            "nvrtcVersion": "13.0", "agentVersion": "0.2.0", "kernelSourcesHash": "ab".repeat(32)},
            "qualifications": [{
                "shapeClass": "qwen3moe-h2048-e128-top8-ffn768",
                "qualification": {
                    "schema": 1,
                    "fingerprint": {"gpuName": "NVIDIA GB10", "computeCapability": "12.1", "driverVersion": "580.95.05", "cudaVersion": "13.0",
                                    "nvrtcVersion": "13.0", "agentVersion": "0.2.0", "kernelSourcesHash": "ab".repeat(32),
                                    "shapeClass": "qwen3moe-h2048-e128-top8-ffn768",
                                    "serving": {"maxBatchTokens": 16_384, "prefillChunk": 4096, "context": 32_768, "fullWindowKv": false}},
                    "digest": "cd".repeat(32),
                    "verdict": {"state": "clamped", "maxTokens": 8191, "firstFailure": 8192},
                    "summary": {"derived": 412, "executed": 400, "passed": 398, "failed": 2, "hung": 0, "skipped": 12, "negativeControlsMissed": 0},
                    "qualifiedAt": "2026-11-30T19:44:52Z"
                },
                "envelope": {"validated": true, "validatedTokens": 8191, "firstFailure": 8192, "maxBatchTokens": 8191, "prefillChunk": 4096},
                "failingCases": [{"id": "moe_gemm-8192", "kernel": "moe_gemm", "tokens": 8192, "detail": "max rel err 3.1e-1 > 2e-2"}]
            }],
            "capacity": {"unifiedMemory": {"total": 128_849_018_880_u64, "available": 110_000_000_000_u64},
                         "residentReplicaBytes": 24_000_000_000_u64, "reservedBytes": 8_589_934_592_u64},
            "replicas": [{"namespace": "serving", "name": "qwen3-x7k2", "model": "qwen3-30b-a3b", "memoryBytes": 24_000_000_000_u64}],
            "lastHeartbeatTime": "2026-11-30T20:06:30Z",
            "conditions": [{"type": "Qualified", "status": "True", "reason": "Clamped", "message": "served up to 8191 tokens",
                            "observedGeneration": 2, "lastTransitionTime": "2026-11-30T19:44:52Z"}]
        }
    })
}

/// JSON -> typed -> JSON gives back the same document: every field has its camelCase name and
/// nothing is dropped or renamed on the way.
fn round_trip<K: serde::de::DeserializeOwned + serde::Serialize>(example: Value) -> K {
    let typed: K = serde_json::from_value(example.clone()).unwrap_or_else(|e| panic!("{e}: {example:#}"));
    assert_eq!(serde_json::to_value(&typed).unwrap(), example);
    typed
}

#[test]
fn full_examples_round_trip_in_camel_case() {
    let m: Model = round_trip(model_json());
    assert_eq!(m.status.as_ref().and_then(|s| s.top_k), Some(8));
    let d: ModelDeployment = round_trip(deployment_json());
    assert_eq!(d.spec.on_self_test_failure, OnSelfTestFailure::Refuse);
    assert_eq!(d.spec.serving.params().max_batch_tokens, 16_384);
    assert_eq!(d.spec.placement.tolerations.len(), 2);
    assert_eq!(d.spec.placement.priority_class_name.as_deref(), Some("inference-high"));
    let r: ModelReplica = round_trip(replica_json());
    assert_eq!(r.status.as_ref().map(|s| s.phase), Some(ReplicaPhase::Serving));
    let n: SparkNode = round_trip(spark_node_json());
    let status = n.status.expect("status");
    let q = &status.qualifications[0].qualification;
    assert!(matches!(q.verdict, crate::Verdict::Clamped { max_tokens: 8191, first_failure: 8192 }));
    assert!(status.fingerprint.expect("fingerprint").covers(&q.fingerprint));
    // The examples pass every CEL rule of their CRD (so the rules compile and evaluate).
    for (kind, example) in [
        ("Model", model_json()),
        ("ModelDeployment", deployment_json()),
        ("ModelReplica", replica_json()),
        ("SparkNode", spark_node_json()),
    ] {
        assert_eq!(cel(kind, &example, None), Vec::<String>::new(), "{kind}");
    }
}

#[test]
fn defaults_fill_a_minimal_deployment() {
    let d: ModelDeployment = serde_json::from_value(json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "m"},
        "spec": {"modelRef": {"name": "m"}, "engine": {"image": "i", "version": "v"},
                 "serving": {"context": 4096, "maxBatchTokens": 2048, "prefillChunk": 512, "concurrency": 4, "kvFraction": 0.5}}
    }))
    .unwrap();
    assert_eq!(d.spec.replicas, 1);
    assert_eq!(d.spec.on_self_test_failure, OnSelfTestFailure::Clamp);
    assert_eq!(
        d.spec.placement,
        Placement {
            node_selector: Default::default(),
            spread: Spread::BestEffort,
            require_qualified: true,
            tolerations: vec![],
            priority_class_name: None
        }
    );
    assert_eq!(d.spec.rollout, Rollout { strategy: RolloutStrategy::Canary, progress_deadline_seconds: 900 });
    // The API server fills omitted fields from the schema's defaults: they must say the same.
    let s = schema("ModelDeployment");
    assert_eq!(at(&s, "spec.placement")["default"], json!({"spread": "BestEffort", "requireQualified": true}));
    assert_eq!(at(&s, "spec.placement.requireQualified")["default"], json!(true));
    assert_eq!(at(&s, "spec.replicas")["default"], json!(1));
    assert_eq!(at(&s, "spec.onSelfTestFailure")["default"], json!("Clamp"));
    assert_eq!(at(&s, "spec.rollout")["default"], json!({"strategy": "Canary", "progressDeadlineSeconds": 900}));
    // The gateway's names for a deployment: the Model's name unless servedModelNames lists others.
    assert_eq!(d.spec.served_names(), ["m"]);
    let mut named = d.spec.clone();
    named.served_model_names = vec!["m".into(), "chat".into()];
    assert_eq!(named.served_names(), ["m", "chat"]);
    assert_eq!(serde_json::to_value(&d.spec).unwrap().get("servedModelNames"), None, "an empty list is left out");
    let names = at(&s, "spec.servedModelNames");
    assert_eq!((names["maxItems"].as_u64(), names["items"]["minLength"].as_u64()), (Some(16), Some(1)), "{names}");
}

fn with(mut v: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    let p = v.pointer_mut(parent).unwrap_or_else(|| panic!("no {parent}"));
    match value {
        Value::Null => {
            p.as_object_mut().expect("object").remove(key);
        }
        value => {
            p[key] = value;
        }
    }
    v
}

#[test]
fn cel_rejects_bad_model_specs() {
    let good = model_json();
    let https = good["spec"]["source"]["https"].clone();
    let one = |msgs: Vec<String>, needle: &str| {
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(msgs[0].contains(needle), "{msgs:?}");
    };
    // Sources: none, two, three.
    one(cel("Model", &with(good.clone(), "/spec/source/https", Value::Null), None), "exactly one of https, nodePath, pvc");
    let two = with(good.clone(), "/spec/source/nodePath", json!({"path": "/models/q.gguf"}));
    one(cel("Model", &two, None), "exactly one of https, nodePath, pvc");
    let three = with(two.clone(), "/spec/source/pvc", json!({"claimName": "models", "path": "q.gguf"}));
    one(cel("Model", &three, None), "exactly one of https, nodePath, pvc");
    // Each single source alone passes.
    for source in
        [json!({"https": https}), json!({"nodePath": {"path": "/m/q.gguf"}}), json!({"pvc": {"claimName": "c", "path": "q.gguf"}})]
    {
        assert!(cel("Model", &with(good.clone(), "/spec/source", source.clone()), None).is_empty(), "{source}");
    }
    // sha256 xor parts.
    let parts =
        json!([{"file": "q-00001-of-00002.gguf", "sha256": "1".repeat(64)}, {"file": "q-00002-of-00002.gguf", "sha256": "2".repeat(64)}]);
    let both = with(good.clone(), "/spec/parts", parts.clone());
    assert!(cel("Model", &both, None).iter().any(|m| m.contains("not both")), "{:?}", cel("Model", &both, None));
    one(cel("Model", &with(good.clone(), "/spec/sha256", Value::Null), None), "not both");
    // A split model over https names a directory.
    let split = with(with(good.clone(), "/spec/sha256", Value::Null), "/spec/parts", parts);
    one(cel("Model", &split, None), "ends with '/'");
    let split_dir = with(split, "/spec/source/https/url", json!("https://models.example.com/qwen3/"));
    assert!(cel("Model", &split_dir, None).is_empty());
    // The spec is immutable; status is not.
    let immutable =
        "a Model's source is immutable: create a new Model and point the deployment's modelRef at it, so a rollout can roll back";
    let changed = with(good.clone(), "/spec/sha256", json!("e".repeat(64)));
    assert_eq!(cel("Model", &changed, Some(&good)), [immutable]);
    let moved = with(good.clone(), "/spec/source/https/url", json!("https://models.example.com/other.gguf"));
    assert_eq!(cel("Model", &moved, Some(&good)), [immutable]);
    let to_node = with(with(good.clone(), "/spec/source/https", Value::Null), "/spec/source/nodePath", json!({"path": "/m/q.gguf"}));
    assert_eq!(cel("Model", &to_node, Some(&good)), [immutable]);
    // The same spec again (an apply that changes nothing) passes; on create there is no old object.
    assert!(cel("Model", &good, Some(&good)).is_empty());
    assert!(cel("Model", &changed, None).is_empty());
    let status_only = with(good.clone(), "/status/sizeBytes", json!(1));
    assert!(cel("Model", &status_only, Some(&good)).is_empty());
}

#[test]
fn cel_rejects_a_prefill_chunk_above_the_batch() {
    let good = deployment_json();
    for (chunk, ok) in [(16_383, true), (16_384, true), (16_385, false)] {
        let d = with(good.clone(), "/spec/serving/prefillChunk", json!(chunk));
        let msgs = cel("ModelDeployment", &d, None);
        assert_eq!(msgs.is_empty(), ok, "prefillChunk {chunk}: {msgs:?}");
        if !ok {
            assert!(msgs[0].contains("serving.prefillChunk must not exceed serving.maxBatchTokens"), "{msgs:?}");
        }
    }
    let r = with(replica_json(), "/spec/serving/prefillChunk", json!(8192));
    assert_eq!(cel("ModelReplica", &r, None).len(), 1);
}

#[test]
fn cel_allows_several_nodes_per_replica_only_off_brink() {
    let good = deployment_json();
    // (engine kind, nodesPerReplica) -> accepted
    let cases = [
        (None, None, true),
        (None, Some(1), true),
        (None, Some(2), false),
        (Some("brink"), Some(2), false),
        (Some("brink"), Some(1), true),
        (Some("vllm"), Some(2), true),
        (Some("sglang"), Some(4), true),
        (Some("llamacpp"), Some(2), true),
        (Some("vllm"), None, true),
    ];
    for (kind, nodes, ok) in cases {
        let mut d = good.clone();
        if let Some(k) = kind {
            d = with(d, "/spec/engine/kind", json!(k));
        }
        if let Some(n) = nodes {
            d = with(d, "/spec/nodesPerReplica", json!(n));
        }
        let msgs = cel("ModelDeployment", &d, None);
        assert_eq!(msgs.is_empty(), ok, "kind {kind:?} nodes {nodes:?}: {msgs:?}");
        if !ok {
            assert!(msgs[0].contains("spec.nodesPerReplica must be 1 for engine kind brink"), "{msgs:?}");
        }
    }
    // The wire form of a gang deployment reads back into the types.
    let gang = with(
        with(with(good.clone(), "/spec/engine/kind", json!("vllm")), "/spec/nodesPerReplica", json!(2)),
        "/spec/gang",
        json!({"socketInterface": "enp1s0f1np1", "ibHca": "rocep1s0f1"}),
    );
    let d: ModelDeployment = serde_json::from_value(gang).expect("a gang deployment");
    assert_eq!((d.spec.engine.kind, d.spec.nodes_per_replica), (EngineKind::Vllm, 2));
    let g = d.spec.gang.expect("gang settings");
    assert_eq!((g.fabric_label.as_str(), g.socket_interface.as_deref()), (FABRIC_LABEL, Some("enp1s0f1np1")));
    // Without the new fields a deployment is brink on one node, and writes none of them back.
    let plain: ModelDeployment = serde_json::from_value(good).expect("deployment");
    assert_eq!((plain.spec.engine.kind, plain.spec.nodes_per_replica, plain.spec.gang), (EngineKind::Brink, 1, None));
    let back = serde_json::to_value(&plain.spec.engine).expect("json");
    assert_eq!(back, json!({"image": "ghcr.io/brink/agent:0.2.0", "version": "0.2.0"}));
}

#[test]
fn cel_keeps_a_gang_on_its_nodes() {
    let gang = json!({"workers": ["spark-03"], "fabric": "cx7-a", "rdma": true});
    let old = with(replica_json(), "/spec/gang", gang.clone());
    let moved = with(old.clone(), "/spec/gang/workers", json!(["spark-04"]));
    let msgs = cel("ModelReplica", &moved, Some(&old));
    assert!(msgs.len() == 1 && msgs[0].contains("a gang is bound to its nodes"), "{msgs:?}");
    let dropped = with(old.clone(), "/spec/gang", Value::Null);
    assert_eq!(cel("ModelReplica", &dropped, Some(&old)).len(), 1);
    assert!(cel("ModelReplica", &old, Some(&old)).is_empty());
    let plain = replica_json();
    assert!(cel("ModelReplica", &plain, Some(&plain)).is_empty());
    let r: ModelReplica = serde_json::from_value(old).expect("a gang replica");
    assert_eq!(r.spec.nodes(), ["spark-02", "spark-03"]);
}

#[test]
fn cel_keeps_a_replica_on_its_node() {
    let old = replica_json();
    let moved = with(old.clone(), "/spec/node", json!("spark-03"));
    let msgs = cel("ModelReplica", &moved, Some(&old));
    assert!(msgs.len() == 1 && msgs[0].contains("bound to its node"), "{msgs:?}");
    // Other spec fields may change (a clamp after re-qualification).
    let reclamped = with(old.clone(), "/spec/serving/maxBatchTokens", json!(6000));
    assert!(cel("ModelReplica", &reclamped, Some(&old)).is_empty());
    // On create there is no old object: transition rules do not apply.
    assert!(cel("ModelReplica", &moved, None).is_empty());
}

#[test]
fn replica_phases_move_forward_or_fail() {
    use ReplicaPhase::*;
    let all = [Pending, Downloading, Loading, SelfTesting, Serving, Failed, Stalled];
    // The allowed moves, spelled out: any other pair is refused.
    let allowed = |a: ReplicaPhase, b: ReplicaPhase| -> bool {
        let order = [Pending, Downloading, Loading, SelfTesting, Serving];
        let pos = |p| order.iter().position(|q| *q == p);
        a == b
            || matches!(b, Failed | Stalled)
            || matches!((a, b), (Stalled, Loading) | (Stalled, Pending) | (Failed, Pending))
            || matches!((pos(a), pos(b)), (Some(x), Some(y)) if y > x)
    };
    let mut refused = 0;
    for a in all {
        for b in all {
            assert_eq!(a.may_move_to(b), allowed(a, b), "{a:?} -> {b:?}");
            refused += usize::from(!a.may_move_to(b));
        }
    }
    // 10 backward start-up moves, Failed to a start-up phase past Pending (4), Stalled to
    // Downloading, SelfTesting or Serving (3).
    assert_eq!(refused, 17);
    assert!(Pending.may_move_to(Loading), "a cached model skips Downloading");
    assert!(!Serving.may_move_to(Loading), "a serving replica reloads only after a stall");
    assert!(!Failed.may_move_to(Serving));
}

#[test]
fn failing_cases_keep_the_smallest_failures() {
    use crate::selftest::{CaseReport, CaseResult, DeviceSummary, NegativeControls, SelfTestReport, Verdict};
    let case = |id: &str, tokens: u64, result: CaseResult| CaseReport {
        id: id.into(),
        kernel: "moe_gemm".into(),
        tokens,
        batch: vec![tokens],
        reasons: vec![],
        expect: "pass".into(),
        result,
        detail: format!("{id} detail"),
        max_rel_err: None,
        tolerance: None,
        compared: 0,
        kernel_ms: None,
        wall_ms: 1.0,
    };
    let mut cases: Vec<_> = (0..40).map(|i| case(&format!("f{i}"), 10_000 - i * 10, CaseResult::Failed)).collect();
    cases.push(case("h", 9000, CaseResult::Hung));
    cases.push(case("p", 1, CaseResult::Passed));
    cases.push(case("s", 2, CaseResult::Skipped));
    let report = SelfTestReport {
        schema: 1,
        agent_version: "0.2.0".into(),
        kernel_sources_hash: "ab".repeat(32),
        device: DeviceSummary {
            gpu: true,
            name: "NVIDIA GB10".into(),
            compute_capability: "12.1".into(),
            sm_count: 48,
            total_mem_bytes: 1,
            free_mem_bytes: 1,
            driver_cuda_version: None,
            nvrtc_version: None,
            max_grid_dim: [1, 1, 1],
            max_shared_mem_per_block_optin: 1,
            no_gpu_reason: None,
        },
        shape_class: "s".into(),
        derived: 43,
        executed: 42,
        passed: 1,
        failed: 40,
        hung: 1,
        skipped: 1,
        negative_controls: NegativeControls::default(),
        verdict: Verdict::Disqualified { reason: "r".into() },
        phases: vec![],
        cases,
    };
    let kept = failing_cases(&report, MAX_FAILING_CASES);
    assert_eq!(kept.len(), MAX_FAILING_CASES);
    assert_eq!(kept[0].id, "h", "the hung case at 9000 tokens is the smallest");
    assert_eq!(kept[1].tokens, 9610);
    assert!(kept.windows(2).all(|w| w[0].tokens <= w[1].tokens));
    assert!(kept.iter().all(|c| c.id != "p" && c.id != "s"));
    assert_eq!(failing_cases(&report, 100).len(), 41);
}

#[test]
fn node_fingerprint_marks_stale_qualifications() {
    let n: SparkNode = serde_json::from_value(spark_node_json()).unwrap();
    let status = n.status.unwrap();
    let node = status.fingerprint.unwrap();
    let fp = status.qualifications[0].qualification.fingerprint.clone();
    assert!(node.covers(&fp));
    // Serving limits and shape class are per qualification, not the node's.
    let mut other_class = fp.clone();
    other_class.shape_class = "qwen3moe-h4096-e128-top8-ffn1536".into();
    other_class.serving.max_batch_tokens = 1;
    assert!(node.covers(&other_class));
    type Edit = fn(&mut crate::Fingerprint);
    let edits: [Edit; 7] = [
        |f| f.gpu_name = "NVIDIA H200".into(),
        |f| f.compute_capability = "9.0".into(),
        |f| f.driver_version = None,
        |f| f.cuda_version = "13.1".into(),
        |f| f.nvrtc_version = Some("13.1".into()),
        |f| f.agent_version = "0.3.0".into(),
        |f| f.kernel_sources_hash = "cd".repeat(32),
    ];
    for edit in edits {
        let mut changed = fp.clone();
        edit(&mut changed);
        assert!(!node.covers(&changed), "{changed:?}");
    }
}
