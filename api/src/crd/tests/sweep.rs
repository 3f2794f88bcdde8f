//! The sweep kinds: full examples round-trip in camelCase and pass their CEL rules, defaults fill
//! a minimal sweep (and the schema says the same), the rules refuse what they are for, and the
//! grid enumerates its points in a fixed order.

use super::*;

fn sweep_json() -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "RegressionSweep",
        "metadata": {"name": "nightly", "namespace": "serving"},
        "spec": {
            "schedule": "0 2 * * *",
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 3600,
            "suspend": false,
            "successfulRunsHistoryLimit": 14,
            "failedRunsHistoryLimit": 7,
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB10"},
            "maxConcurrentNodes": 4,
            "drainReplicas": true,
            "modelRef": {"name": "qwen3-30b-a3b"},
            "workload": {"promptTokens": [512, 8192], "concurrency": [1, 8], "generatedTokens": [128], "requestsPerPoint": 16},
            "selfTest": {"enabled": true, "negativeControls": true},
            "baseline": {"policy": "LastPassing", "tolerance": {"throughputPercent": 10, "latencyPercent": 20}, "outlierTolerancePercent": 15},
            "nodeTimeoutSeconds": 3600
        },
        "status": {
            "observedGeneration": 1,
            "lastScheduleTime": "2026-12-01T02:00:00Z",
            "lastSuccessfulTime": "2026-11-30T02:41:10Z",
            "active": ["nightly-29409240"],
            "lastRun": "nightly-29409240",
            "lastVerdict": "Regressed",
            "conditions": [{"type": "Degraded", "status": "True", "reason": "Regressed", "message": "spark-07: outputTokensPerS -18.2%",
                            "observedGeneration": 1, "lastTransitionTime": "2026-11-30T02:41:10Z"}]
        }
    })
}

fn run_json() -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "SweepRun",
        "metadata": {"name": "nightly-29409240", "namespace": "serving"},
        "spec": {
            "sweep": "nightly",
            "scheduledTime": "2026-12-01T02:00:00Z",
            "model": "qwen3-30b-a3b",
            "nodes": ["spark-01", "spark-02", "spark-07"],
            "workload": {"promptTokens": [512], "concurrency": [1], "generatedTokens": [128], "requestsPerPoint": 16},
            "selfTest": {"enabled": true, "negativeControls": false},
            "baseline": {"policy": "Pinned", "pinnedRun": "nightly-29400600", "tolerance": {"throughputPercent": 10, "latencyPercent": 20},
                         "outlierTolerancePercent": 15},
            "maxConcurrentNodes": 2,
            "drainReplicas": true,
            "nodeTimeoutSeconds": 3600,
            "extraCases": [{"tokens": 8193, "sequences": 3, "source": "serving/qwen3-x7k2 prefill chunk"}]
        },
        "status": {
            "phase": "Complete",
            "startTime": "2026-12-01T02:00:03Z",
            "completionTime": "2026-12-01T02:41:10Z",
            "nodes": [
                {"node": "spark-01", "state": "Done", "startedAt": "2026-12-01T02:00:05Z", "verdict": "Pass"},
                {"node": "spark-02", "state": "Lost", "startedAt": "2026-12-01T02:00:05Z", "verdict": "Lost",
                 "message": "heartbeat expired 95 s ago"},
                {"node": "spark-07", "state": "Done", "startedAt": "2026-12-01T02:20:00Z", "verdict": "Regressed"}
            ],
            "verdict": "Lost",
            "counts": {"nodes": 3, "passed": 1, "regressed": 1, "outliers": 0, "failed": 0, "hung": 0, "lost": 1, "skipped": 0},
            "baselineRun": "nightly-29400600",
            "findings": [{"node": "spark-07", "verdict": "Regressed",
                          "point": {"promptTokens": 512, "concurrency": 1, "generatedTokens": 128},
                          "metric": "outputTokensPerS", "value": 57.5, "reference": 70.3, "changePercent": -18.2,
                          "message": "outputTokensPerS 57.5 against 70.3 (-18.2%, tolerance 10%)"}],
            "message": "1 regressed, 1 lost of 3 nodes"
        }
    })
}

fn result_json() -> Value {
    json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "SweepResult",
        "metadata": {"name": "nightly-29409240-spark-07", "namespace": "serving"},
        "spec": {"run": "nightly-29409240", "node": "spark-07"},
        "status": {
            "state": "Done",
            "fingerprint": {"gpuName": "NVIDIA GB10", "computeCapability": "12.1", "driverVersion": "580.95.05", "cudaVersion": "13.0",
                            "nvrtcVersion": "13.0", "agentVersion": "0.1.0", "kernelSourcesHash": "ab".repeat(32)},
            "startedAt": "2026-12-01T02:20:00Z",
            "finishedAt": "2026-12-01T02:41:00Z",
            "selfTest": {"summary": {"derived": 1802, "executed": 1505, "passed": 1505, "failed": 0, "hung": 0, "skipped": 297,
                                     "negativeControlsMissed": 0},
                         "negativeControlsRan": false},
            "points": [{"point": {"promptTokens": 512, "concurrency": 1, "generatedTokens": 128}, "requests": 16, "failed": 0,
                        "timedOut": 0, "outputTokensPerS": 57.5, "ttftP50S": 0.22, "ttftP99S": 0.31, "itlP50S": 0.0174, "itlP99S": 0.02}],
            "judgement": {"verdict": "Regressed", "baselineRun": "nightly-29400600",
                          "findings": [{"node": "spark-07", "verdict": "Regressed", "metric": "outputTokensPerS", "value": 57.5,
                                        "reference": 70.3, "changePercent": -18.2, "message": "outputTokensPerS -18.2%"}]}
        }
    })
}

#[test]
fn sweep_examples_round_trip_and_pass_their_rules() {
    let s: RegressionSweep = round_trip(sweep_json());
    assert_eq!(s.spec.concurrency_policy, ConcurrencyPolicy::Forbid);
    assert_eq!(s.spec.workload.points().len(), 4);
    let r: SweepRun = round_trip(run_json());
    assert_eq!(r.status.as_ref().and_then(|s| s.verdict), Some(SweepVerdict::Lost));
    let res: SweepResult = round_trip(result_json());
    assert_eq!(res.status.and_then(|s| s.judgement).map(|j| j.verdict), Some(SweepVerdict::Regressed));
    assert_eq!(result_name("nightly-29409240", "spark-07"), "nightly-29409240-spark-07");
    for (kind, example) in [("RegressionSweep", sweep_json()), ("SweepRun", run_json()), ("SweepResult", result_json())] {
        assert_eq!(cel(kind, &example, None), Vec::<String>::new(), "{kind}");
    }
}

#[test]
fn defaults_fill_a_minimal_sweep() {
    let minimal = json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "RegressionSweep", "metadata": {"name": "s"},
        "spec": {"schedule": "@daily", "modelRef": {"name": "m"},
                 "workload": {"promptTokens": [128], "concurrency": [1], "generatedTokens": [16]}}
    });
    let s: RegressionSweep = serde_json::from_value(minimal).unwrap();
    let spec = &s.spec;
    assert_eq!(
        (spec.concurrency_policy, spec.starting_deadline_seconds, spec.suspend, spec.max_concurrent_nodes, spec.drain_replicas),
        (ConcurrencyPolicy::Forbid, None, false, 1, true)
    );
    assert_eq!((spec.successful_runs_history_limit, spec.failed_runs_history_limit, spec.node_timeout_seconds), (10, 5, 3600));
    assert_eq!(spec.self_test, SweepSelfTest { enabled: true, negative_controls: true });
    assert_eq!(spec.baseline, BaselinePolicy::default());
    assert_eq!(spec.baseline.tolerance, Tolerance { throughput_percent: 10, latency_percent: 20 });
    assert_eq!(spec.workload.requests_per_point, 16);
    // The API server applies the schema's defaults: they must agree with serde's.
    let schema = schema("RegressionSweep");
    assert_eq!(at(&schema, "spec.concurrencyPolicy")["default"], json!("Forbid"));
    assert_eq!(at(&schema, "spec.drainReplicas")["default"], json!(true));
    assert_eq!(at(&schema, "spec.maxConcurrentNodes")["default"], json!(1));
    assert_eq!(at(&schema, "spec.baseline.outlierTolerancePercent")["default"], json!(15));
}

#[test]
fn cel_refuses_a_pinned_baseline_without_a_run_and_edits_of_a_run() {
    let pinned = with(sweep_json(), "/spec/baseline/policy", json!("Pinned"));
    let msgs = cel("RegressionSweep", &pinned, None);
    assert!(msgs.len() == 1 && msgs[0].contains("needs baseline.pinnedRun"), "{msgs:?}");
    let named = with(pinned, "/spec/baseline/pinnedRun", json!("nightly-1"));
    assert!(cel("RegressionSweep", &named, None).is_empty());

    let old = run_json();
    let edited = with(old.clone(), "/spec/nodes", json!(["spark-01"]));
    assert!(cel("SweepRun", &edited, Some(&old)).iter().any(|m| m.contains("fixed when it is created")));
    let status_only = with(old.clone(), "/status/phase", json!("Running"));
    assert!(cel("SweepRun", &status_only, Some(&old)).is_empty());

    let old = result_json();
    let moved = with(old.clone(), "/spec/node", json!("spark-08"));
    assert_eq!(cel("SweepResult", &moved, Some(&old)).len(), 1);
}

#[test]
fn schema_bounds_keep_grids_and_limits_sane() {
    let s = schema("RegressionSweep");
    assert_eq!(at(&s, "spec.workload.promptTokens")["maxItems"], json!(16));
    assert_eq!(at(&s, "spec.workload.promptTokens.[]")["minimum"].as_f64(), Some(1.0));
    assert_eq!(at(&s, "spec.workload.concurrency.[]")["maximum"].as_f64(), Some(1024.0));
    assert_eq!(at(&s, "spec.maxConcurrentNodes")["minimum"].as_f64(), Some(1.0));
    assert_eq!(at(&s, "spec.nodeTimeoutSeconds")["minimum"].as_f64(), Some(60.0));
    let r = schema("SweepRun");
    assert_eq!(at(&r, "status.findings")["maxItems"], json!(MAX_FINDINGS));
    assert_eq!(at(&r, "status.nodes")["x-kubernetes-list-type"], json!("map"));
    assert_eq!(at(&r, "status.nodes")["x-kubernetes-list-map-keys"], json!(["node"]));
}

#[test]
fn grid_points_come_in_a_fixed_order_and_verdicts_rank_by_severity() {
    let g = WorkloadGrid { prompt_tokens: vec![1, 2], concurrency: vec![1, 4], generated_tokens: vec![8], requests_per_point: 4 };
    let names: Vec<String> = g.points().iter().map(|p| p.to_string()).collect();
    assert_eq!(names, ["p1xc1xg8", "p1xc4xg8", "p2xc1xg8", "p2xc4xg8"]);
    use SweepVerdict::*;
    let mut v = vec![Lost, Pass, Hung, Outlier, Failed, Regressed];
    v.sort();
    assert_eq!(v, [Pass, Outlier, Regressed, Failed, Hung, Lost]);
    assert_eq!([Pass, Regressed].into_iter().max(), Some(Regressed));
}
