//! The RegressionSweep and SweepRun controllers against a mocked API server: each scenario lists
//! the exact requests one reconcile sends (method, path, query, body essentials).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{
    Judgement, NodeProgress, NodeRunState, RegressionSweep, RegressionSweepStatus, ResultState, RunPhase, SweepResult, SweepResultSpec,
    SweepResultStatus, SweepRun, SweepRunStatus, SweepVerdict, result_name,
};
use brink_operator::controllers::sweep::{self, SweepCaches, SweepContext, run_spec, time_of};
use brink_operator::controllers::sweep_run;
use brink_operator::decide::sweep::schedule::run_name;
use common::*;
use kube::Resource;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

const SWEEPS: &str = "/apis/brink.dev/v1alpha1/namespaces/llm/regressionsweeps";
const RUNS: &str = "/apis/brink.dev/v1alpha1/namespaces/llm/sweepruns";
const RESULTS: &str = "/apis/brink.dev/v1alpha1/namespaces/llm/sweepresults";

/// An hourly sweep of the nodes labelled `pool=a`, created two days before now, last fired
/// `last_fired_ago_s` before now.
fn nightly(last_fired_ago_s: Option<i64>, policy: &str) -> RegressionSweep {
    let mut s: RegressionSweep = serde_json::from_value(json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "RegressionSweep",
        "metadata": {
            "name": "nightly", "namespace": NS, "uid": "uid-sweep", "generation": 2, "resourceVersion": "7",
            "creationTimestamp": time_of(NOW_S - 2 * 86_400),
        },
        "spec": {
            "schedule": "0 * * * *",
            "concurrencyPolicy": policy,
            "nodeSelector": { "pool": "a" },
            "maxConcurrentNodes": 3,
            "modelRef": { "name": "qwen" },
            "workload": { "promptTokens": [128], "concurrency": [1], "generatedTokens": [32] },
        },
    }))
    .expect("sweep");
    s.status = last_fired_ago_s.map(|ago| RegressionSweepStatus { last_schedule_time: Some(time_of(NOW_S - ago)), ..Default::default() });
    s
}

fn labelled(name: &str, pool: &str) -> k8s_openapi::api::core::v1::Node {
    let mut n = node(name);
    n.metadata.labels = Some(BTreeMap::from([("pool".to_string(), pool.to_string())]));
    n
}

/// Three nodes in pool `a` (spark-1..3, qualified, fresh heartbeats), one in pool `b`, and one
/// in pool `a` without an agent.
fn fleet() -> World {
    let mut w = World::qualified_fleet(4);
    w.nodes =
        vec![labelled("spark-1", "a"), labelled("spark-2", "a"), labelled("spark-3", "a"), labelled("spark-4", "b"), labelled("bare", "a")];
    w
}

fn sweep_context(world: &World, runs: Vec<SweepRun>, results: Vec<SweepResult>) -> (Arc<SweepContext>, Handle) {
    let (base, handle) = context(world);
    (Arc::new(SweepContext { base, sweeps: SweepCaches { runs: store_of(runs), results: store_of(results) } }), handle)
}

/// A run of `nightly` scheduled `ago_s` before now over `nodes`, with its status.
fn run(ago_s: i64, nodes: &[&str], status: Option<SweepRunStatus>) -> SweepRun {
    let sweep = nightly(None, "Forbid");
    let scheduled = NOW_S - ago_s;
    let name = run_name("nightly", scheduled);
    let mut r = SweepRun::new(&name, run_spec(&sweep, scheduled, nodes.iter().map(|n| n.to_string()).collect(), &[]));
    r.metadata.namespace = Some(NS.into());
    r.metadata.uid = Some(format!("uid-{name}"));
    r.metadata.resource_version = Some("3".into());
    r.metadata.owner_references = sweep.controller_owner_ref(&()).map(|o| vec![o]);
    r.status = status;
    r
}

fn running(nodes: &[&str], started_ago_s: i64) -> SweepRunStatus {
    SweepRunStatus {
        phase: RunPhase::Running,
        start_time: Some(time_of(NOW_S - started_ago_s)),
        nodes: nodes
            .iter()
            .map(|n| NodeProgress {
                node: n.to_string(),
                state: NodeRunState::Running,
                started_at: Some(time_of(NOW_S - started_ago_s)),
                verdict: None,
                message: None,
            })
            .collect(),
        ..SweepRunStatus::default()
    }
}

fn complete(verdict: SweepVerdict) -> SweepRunStatus {
    SweepRunStatus { phase: RunPhase::Complete, verdict: Some(verdict), completion_time: Some(time_of(NOW_S - 3000)), ..Default::default() }
}

/// `node`'s result in `run`: Done, one grid point at `tokens_per_s`.
fn result(run: &SweepRun, node: &str, tokens_per_s: f64, judgement: Option<Judgement>) -> SweepResult {
    let run_name = run.metadata.name.clone().unwrap_or_default();
    let name = result_name(&run_name, node);
    let mut r = SweepResult::new(&name, SweepResultSpec { run: run_name, node: node.into() });
    r.metadata.namespace = Some(NS.into());
    r.metadata.uid = Some(format!("uid-{name}"));
    r.metadata.owner_references = run.controller_owner_ref(&()).map(|o| vec![o]);
    r.status = Some(SweepResultStatus {
        state: ResultState::Done,
        fingerprint: Some(sweep_fingerprint()),
        points: vec![point_figures(tokens_per_s)],
        judgement,
        ..SweepResultStatus::default()
    });
    r
}

fn pass(baseline: Option<&str>) -> Judgement {
    Judgement { verdict: SweepVerdict::Pass, baseline_run: baseline.map(String::from), findings: Vec::new() }
}

fn status_apply(path: String, kind: &'static str, check: impl Fn(&Value) + Send + 'static, onto: Value) -> Expect {
    Expect::new("PATCH", path)
        .query("fieldManager", "brink-operator")
        .query("force", "true")
        .check(move |b| {
            assert_eq!(b["kind"], kind, "{b}");
            check(b)
        })
        .reply(Reply::EchoOnto(onto))
}

fn requeue(s: u64) -> String {
    format!("{:?}", Action::requeue(Duration::from_secs(s)))
}

#[tokio::test]
async fn a_due_firing_creates_the_run_over_the_selected_nodes() {
    // Hourly; fired an hour ago; now is on the hour: one firing due, none missed.
    let sweep = nightly(Some(3600), "Forbid");
    let (ctx, handle) = sweep_context(&fleet(), Vec::new(), Vec::new());
    let name = run_name("nightly", NOW_S);
    let expected_name = name.clone();
    let onto = serde_json::to_value(&sweep).expect("JSON");
    let script = vec![
        Expect::new("POST", RUNS).query("fieldManager", "brink-operator").check(move |b| {
            assert_eq!(b["metadata"]["name"], expected_name.as_str());
            assert_eq!(b["metadata"]["ownerReferences"][0]["uid"], "uid-sweep");
            assert_eq!(b["metadata"]["ownerReferences"][0]["kind"], "RegressionSweep");
            assert_eq!(b["metadata"]["ownerReferences"][0]["controller"], true);
            assert_eq!(b["spec"]["sweep"], "nightly");
            assert_eq!(b["spec"]["model"], "qwen");
            // pool=a with an agent, sorted: spark-4 is in pool b, `bare` has no SparkNode.
            assert_eq!(b["spec"]["nodes"], json!(["spark-1", "spark-2", "spark-3"]));
            assert_eq!(b["spec"]["scheduledTime"], "2026-12-01T00:00:00Z");
            assert_eq!(b["spec"]["maxConcurrentNodes"], 3);
            assert_eq!(b["spec"]["workload"]["promptTokens"], json!([128]));
        }),
        Expect::event("RunCreated", "nightly").check(|b| {
            assert_eq!(b["note"], "run nightly-29934720 over 3 node(s) for 2026-12-01T00:00:00Z");
        }),
        status_apply(
            format!("{SWEEPS}/nightly/status"),
            "RegressionSweep",
            move |b| {
                let s = &b["status"];
                assert_eq!(s["lastScheduleTime"], "2026-12-01T00:00:00Z");
                assert_eq!(s["active"], json!([name.as_str()]));
                assert_eq!(s["lastRun"], name.as_str());
                assert_eq!(s["observedGeneration"], 2);
                assert!(s.get("lastVerdict").is_none(), "{s}");
                assert_eq!(cond(b, "Progressing")["reason"], "RunActive");
                assert_eq!(cond(b, "Degraded")["status"], "False");
            },
            onto,
        ),
    ];
    let (action, seen) = scenario(handle, script, sweep::reconcile(Arc::new(sweep), ctx)).await;
    // The next firing is an hour away.
    assert_eq!(format!("{:?}", action.expect("reconcile")), requeue(3600));
    assert_eq!(seen.len(), 3);
}

#[tokio::test]
async fn forbid_with_an_active_run_creates_nothing_and_says_why() {
    let sweep = nightly(Some(3600), "Forbid");
    let active = run(3600, &["spark-1"], Some(running(&["spark-1"], 3000)));
    let active_name = active.metadata.name.clone().unwrap_or_default();
    let (ctx, handle) = sweep_context(&fleet(), vec![active], Vec::new());
    let onto = serde_json::to_value(&sweep).expect("JSON");
    let note = format!("a firing is due but concurrencyPolicy is Forbid and {active_name} still active");
    let script = vec![
        Expect::event("FiringSkipped", "nightly").check(move |b| {
            assert_eq!(b["type"], "Warning");
            assert_eq!(b["note"], note.as_str());
        }),
        status_apply(
            format!("{SWEEPS}/nightly/status"),
            "RegressionSweep",
            move |b| {
                let s = &b["status"];
                // Not started: the last schedule time stays the previous firing's.
                assert_eq!(s["lastScheduleTime"], "2026-11-30T23:00:00Z");
                assert_eq!(s["active"], json!([active_name.as_str()]));
            },
            onto,
        ),
    ];
    let (action, seen) = scenario(handle, script, sweep::reconcile(Arc::new(sweep), ctx)).await;
    // Retried at the resync until the active run ends.
    assert_eq!(format!("{:?}", action.expect("reconcile")), requeue(20));
    assert!(seen.iter().all(|s| s.method != "POST" || !s.path.ends_with("sweepruns")), "no run may be created");
}

#[tokio::test]
async fn a_node_whose_result_is_in_is_judged_against_its_last_passing_run() {
    // An earlier passing run where spark-1 made 100 tokens/s; now it makes 80 (tolerance 10%).
    let earlier = run(7200, &["spark-1", "spark-2"], Some(complete(SweepVerdict::Pass)));
    let now = run(600, &["spark-1", "spark-2"], Some(running(&["spark-1", "spark-2"], 500)));
    let results = vec![
        result(&earlier, "spark-1", 100.0, Some(pass(None))),
        result(&earlier, "spark-2", 100.0, Some(pass(None))),
        result(&now, "spark-1", 80.0, None),
    ];
    let judged = serde_json::to_value(&results[2]).expect("JSON");
    let earlier_name = earlier.metadata.name.clone().unwrap_or_default();
    let now_name = now.metadata.name.clone().unwrap_or_default();
    let (ctx, handle) = sweep_context(&fleet(), vec![earlier, now.clone()], results);
    let base = earlier_name.clone();
    let script = vec![
        status_apply(
            format!("{RESULTS}/{}/status", result_name(&now_name, "spark-1")),
            "SweepResult",
            move |b| {
                // Only the judgement: the agent owns the rest of the status.
                assert_eq!(b["status"].as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()), Some(vec!["judgement".to_string()]));
                let j = &b["status"]["judgement"];
                assert_eq!(j["verdict"], "Regressed");
                assert_eq!(j["baselineRun"], base.as_str());
                assert_eq!(j["findings"].as_array().map(Vec::len), Some(1), "{j}");
                assert_eq!(j["findings"][0]["metric"], "outputTokensPerS");
                assert_eq!(j["findings"][0]["changePercent"], -20.0);
            },
            judged,
        ),
        status_apply(
            format!("{RUNS}/{now_name}/status"),
            "SweepRun",
            |b| {
                let s = &b["status"];
                assert_eq!(s["phase"], "Running");
                assert_eq!(s["nodes"][0]["node"], "spark-1");
                assert_eq!(s["nodes"][0]["state"], "Done");
                assert_eq!(s["nodes"][0]["verdict"], "Regressed");
                assert_eq!(s["nodes"][1]["state"], "Running");
                assert!(s["nodes"][1].get("verdict").is_none(), "{s}");
                assert!(s.get("verdict").is_none(), "no run verdict before every node is final: {s}");
                assert_eq!(s["counts"]["regressed"], 1);
                assert_eq!(s["message"], "1 of 2 nodes final");
            },
            serde_json::to_value(&now).expect("JSON"),
        ),
    ];
    let (action, _) = scenario(handle, script, sweep_run::reconcile(Arc::new(now), ctx)).await;
    // spark-2 started 500 s ago with a 3600 s timeout: the resync comes first.
    assert_eq!(format!("{:?}", action.expect("reconcile")), requeue(20));
}

#[tokio::test]
async fn a_complete_run_flags_the_outlier_and_writes_its_summary() {
    let now = run(600, &["spark-1", "spark-2", "spark-3"], Some(running(&["spark-1", "spark-2", "spark-3"], 500)));
    let now_name = now.metadata.name.clone().unwrap_or_default();
    // Judged already (no baselines); spark-3 is half as fast as its two identical peers.
    let results = vec![
        result(&now, "spark-1", 100.0, Some(pass(None))),
        result(&now, "spark-2", 100.0, Some(pass(None))),
        result(&now, "spark-3", 50.0, Some(pass(None))),
    ];
    let judged = serde_json::to_value(&results[2]).expect("JSON");
    let (ctx, handle) = sweep_context(&fleet(), vec![now.clone()], results);
    let spark3 = result_name(&now_name, "spark-3");
    let spark3_for_event = spark3.clone();
    let script = vec![
        status_apply(
            format!("{RESULTS}/{spark3}/status"),
            "SweepResult",
            |b| {
                let j = &b["status"]["judgement"];
                assert_eq!(j["verdict"], "Outlier");
                assert_eq!(j["findings"][0]["reference"], 100.0);
                assert_eq!(j["findings"][0]["value"], 50.0);
                assert_eq!(j["findings"][0]["changePercent"], -50.0);
            },
            judged,
        ),
        status_apply(
            format!("{RUNS}/{now_name}/status"),
            "SweepRun",
            |b| {
                let s = &b["status"];
                assert_eq!(s["phase"], "Complete");
                assert_eq!(s["verdict"], "Outlier");
                assert_eq!(s["completionTime"], "2026-12-01T00:00:00Z");
                assert_eq!(
                    s["counts"],
                    json!({ "nodes": 3, "passed": 2, "regressed": 0, "outliers": 1, "failed": 0, "hung": 0, "lost": 0, "skipped": 0 })
                );
                assert_eq!(s["message"], "2 passed, 1 outlier of 3 nodes");
                assert_eq!(s["findings"].as_array().map(Vec::len), Some(1), "{s}");
                assert_eq!(s["findings"][0]["node"], "spark-3");
                assert_eq!(s["nodes"][2]["verdict"], "Outlier");
            },
            serde_json::to_value(&now).expect("JSON"),
        ),
        Expect::new("POST", format!("/apis/events.k8s.io/v1/namespaces/{NS}/events")).check(move |b| {
            assert_eq!(b["reason"], "Outlier");
            assert_eq!(b["type"], "Warning");
            assert_eq!(b["related"]["name"], spark3_for_event.as_str());
            let note = b["note"].as_str().unwrap_or_default();
            assert!(note.starts_with("node spark-3: p128xc1xg32: outputTokensPerS 50.0000 is -50.0% from the median 100.0000"), "{note}");
        }),
        Expect::new("POST", format!("/apis/events.k8s.io/v1/namespaces/{NS}/events")).check(|b| {
            assert_eq!(b["reason"], "RunComplete");
            assert_eq!(b["note"], "Outlier: 2 passed, 1 outlier of 3 nodes");
        }),
    ];
    let (action, _) = scenario(handle, script, sweep_run::reconcile(Arc::new(now), ctx)).await;
    assert_eq!(format!("{:?}", action.expect("reconcile")), format!("{:?}", Action::await_change()));
}

#[tokio::test]
async fn replace_cancels_the_active_run_before_starting_the_new_one() {
    let sweep = nightly(Some(3600), "Replace");
    let active = run(3600, &["spark-1"], Some(running(&["spark-1"], 3000)));
    let old = active.metadata.name.clone().unwrap_or_default();
    let (ctx, handle) = sweep_context(&fleet(), vec![active.clone()], Vec::new());
    let new = run_name("nightly", NOW_S);
    let (old_c, new_c) = (old.clone(), new.clone());
    let script = vec![
        status_apply(
            format!("{RUNS}/{old}/status"),
            "SweepRun",
            |b| {
                assert_eq!(b["status"]["phase"], "Cancelled");
                assert_eq!(b["status"]["completionTime"], "2026-12-01T00:00:00Z");
                assert_eq!(b["status"]["message"], "replaced by a newer firing of nightly (concurrencyPolicy Replace)");
                // The whole status, nodes included: an apply without them would remove them.
                assert_eq!(b["status"]["nodes"][0]["node"], "spark-1");
                assert_eq!(b["status"]["startTime"], "2026-11-30T23:10:00Z");
            },
            serde_json::to_value(&active).expect("JSON"),
        ),
        Expect::event("RunCancelled", "nightly"),
        Expect::new("POST", RUNS).check(move |b| assert_eq!(b["metadata"]["name"], new_c.as_str())),
        Expect::event("RunCreated", "nightly"),
        status_apply(
            format!("{SWEEPS}/nightly/status"),
            "RegressionSweep",
            move |b| {
                // The cancelled run is no longer active.
                assert_eq!(b["status"]["active"], json!([new.as_str()]));
                assert_ne!(b["status"]["active"][0], old_c.as_str());
            },
            serde_json::to_value(&sweep).expect("JSON"),
        ),
    ];
    let (action, _) = scenario(handle, script, sweep::reconcile(Arc::new(sweep), ctx)).await;
    assert_eq!(format!("{:?}", action.expect("reconcile")), requeue(3600));
}

#[tokio::test]
async fn history_prunes_old_passing_runs_but_keeps_a_baseline() {
    // Fired on the hour just now (nothing due); one passing run kept.
    let mut sweep = nightly(Some(0), "Forbid");
    sweep.spec.successful_runs_history_limit = 1;
    let oldest = run(3 * 3600, &["spark-1"], Some(complete(SweepVerdict::Pass)));
    let middle = run(2 * 3600, &["spark-1"], Some(complete(SweepVerdict::Pass)));
    let newest = run(0, &["spark-1"], Some(complete(SweepVerdict::Pass)));
    let [oldest_n, middle_n, newest_n] = [&oldest, &middle, &newest].map(|r| r.metadata.name.clone().unwrap_or_default());
    // The newest run's spark-1 was judged against the oldest run: that one stays.
    let results = vec![result(&newest, "spark-1", 100.0, Some(pass(Some(&oldest_n))))];
    let (ctx, handle) = sweep_context(&fleet(), vec![oldest, middle, newest], results);
    let script = vec![
        Expect::new("DELETE", format!("{RUNS}/{middle_n}"))
            .check(|b| assert_eq!(b["propagationPolicy"], "Background"))
            .reply(Reply::Json(json!({ "apiVersion": "v1", "kind": "Status", "status": "Success", "code": 200 }))),
        status_apply(
            format!("{SWEEPS}/nightly/status"),
            "RegressionSweep",
            move |b| {
                let s = &b["status"];
                assert_eq!(s["lastRun"], newest_n.as_str());
                assert_eq!(s["lastVerdict"], "Pass");
                assert_eq!(s["lastSuccessfulTime"], "2026-11-30T23:10:00Z");
                assert!(s.get("active").is_none(), "{s}");
                assert_eq!(cond(b, "Progressing")["reason"], "Idle");
            },
            serde_json::to_value(&sweep).expect("JSON"),
        ),
    ];
    let (action, seen) = scenario(handle, script, sweep::reconcile(Arc::new(sweep), ctx)).await;
    assert_eq!(format!("{:?}", action.expect("reconcile")), requeue(3600));
    assert!(!seen.iter().any(|s| s.path.ends_with(&oldest_n)), "the baseline run must stay");
}

#[test]
fn nodes_are_selected_by_label_and_agent_and_sorted() {
    let w = fleet();
    let nodes: Vec<Arc<_>> = w.nodes.iter().rev().cloned().map(Arc::new).collect();
    let sparks: Vec<Arc<_>> = w.spark_nodes.iter().cloned().map(Arc::new).collect();
    let a = BTreeMap::from([("pool".to_string(), "a".to_string())]);
    assert_eq!(sweep::select_nodes(&a, &nodes, &sparks), ["spark-1", "spark-2", "spark-3"]);
    let b = BTreeMap::from([("pool".to_string(), "b".to_string())]);
    assert_eq!(sweep::select_nodes(&b, &nodes, &sparks), ["spark-4"]);
    assert_eq!(sweep::select_nodes(&BTreeMap::new(), &nodes, &sparks), ["spark-1", "spark-2", "spark-3", "spark-4"]);
}

/// A sweep over a deployment (`deploymentRef`) measures the nodes that run its replicas (a
/// gang's leader node), and its own replicas there neither drain nor skip the node.
#[test]
fn a_sweep_over_a_deployment_measures_the_nodes_of_its_replicas() {
    let replica = |name: &str, deployment: &str, node: &str, workers: &[&str], deleting: bool| -> Arc<brink_api::crd::ModelReplica> {
        let mut r = json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
            "metadata": { "name": name, "namespace": NS },
            "spec": {
                "deployment": deployment, "node": node, "model": "qwen", "revision": "r1",
                "engine": { "image": "vllm/vllm-openai:v0.11.0", "version": "0.11.0", "kind": "vllm" },
                "serving": { "context": 4096, "maxBatchTokens": 8192, "prefillChunk": 2048, "concurrency": 4, "kvFraction": 0.5 }
            }
        });
        if !workers.is_empty() {
            r["spec"]["gang"] = json!({ "workers": workers, "fabric": "cx7-a", "rdma": false });
        }
        if deleting {
            r["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        }
        Arc::new(serde_json::from_value(r).expect("replica"))
    };
    let replicas = vec![
        replica("lc-0", "lc", "spark-1", &[], false),
        replica("lc-1", "lc", "spark-2", &["spark-3"], false),
        replica("lc-2", "lc", "spark-4", &[], true),
        replica("other-0", "other", "spark-3", &[], false),
    ];
    let selected: Vec<String> = ["spark-1", "spark-2", "spark-3", "spark-4"].map(String::from).to_vec();
    assert_eq!(sweep::deployment_nodes(selected.clone(), Some(NS), "lc", &replicas), ["spark-1", "spark-2"]);
    assert_eq!(sweep::deployment_nodes(selected.clone(), Some(NS), "other", &replicas), ["spark-3"]);
    assert!(sweep::deployment_nodes(selected.clone(), Some("elsewhere"), "lc", &replicas).is_empty());
    assert!(sweep::deployment_nodes(selected, Some(NS), "none", &replicas).is_empty());

    let mut s = nightly(None, "Forbid");
    assert_eq!(run_spec(&s, NOW_S, vec![], &[]).deployment, None, "no deploymentRef: brink's engine on each node");
    s.spec.deployment_ref = Some(brink_api::crd::DeploymentRef { name: "lc".into() });
    let spec = run_spec(&s, NOW_S, vec!["spark-1".into(), "spark-2".into()], &[]);
    assert_eq!(spec.deployment.as_deref(), Some("lc"));
    assert_eq!(serde_json::to_value(&spec).expect("JSON")["deployment"], "lc");

    // spark-3 holds lc-1's worker and other-0: only other-0 is load to drain for a sweep of lc.
    assert_eq!(sweep_run::resident_replicas(&replicas, "spark-3", None), 2);
    assert_eq!(sweep_run::resident_replicas(&replicas, "spark-3", Some((NS, "lc"))), 1);
    assert_eq!(sweep_run::resident_replicas(&replicas, "spark-2", Some((NS, "lc"))), 0);
    assert_eq!(sweep_run::resident_replicas(&replicas, "spark-2", Some(("elsewhere", "lc"))), 1, "another namespace's lc");
    assert_eq!(sweep_run::resident_replicas(&replicas, "spark-4", None), 0, "a replica being deleted is not resident");
}

#[test]
fn outlier_findings_are_replaced_not_repeated() {
    let outlier = |v: f64| brink_api::crd::Finding {
        node: "spark-3".into(),
        verdict: SweepVerdict::Outlier,
        point: Some(SWEEP_POINT),
        metric: Some("outputTokensPerS".into()),
        value: Some(v),
        reference: Some(100.0),
        change_percent: Some(v - 100.0),
        message: format!("{v}"),
    };
    let j = sweep_run::with_outliers(&pass(Some("r0")), &[outlier(50.0)]);
    assert_eq!((j.verdict, j.findings.len(), j.baseline_run.as_deref()), (SweepVerdict::Outlier, 1, Some("r0")));
    let again = sweep_run::with_outliers(&j, &[outlier(60.0)]);
    assert_eq!(again.findings.len(), 1);
    assert_eq!(again.findings[0].value, Some(60.0));
    // No longer an outlier: back to the verdict of the other findings.
    assert_eq!(sweep_run::with_outliers(&again, &[]).verdict, SweepVerdict::Pass);
}

mod flow {
    //! The real controllers (`controllers::run`) against the in-memory API double: the test plays
    //! the agents (heartbeat Leases, SweepResults) and reads what the controllers leave.

    use super::*;
    use brink_kube_double::KubeDouble;
    use brink_operator::controllers::{self, Config, FixedClock, Metrics, Shared};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;
    use kube::Api;
    use kube::api::{Patch, PatchParams, PostParams};

    /// Polls `read` until it returns something, at most 10 s.
    async fn eventually<T>(what: &str, mut read: impl FnMut() -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(v) = read() {
                return v;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn renewed(node: &str, at_s: i64) -> Lease {
        let mut l = lease(node, 0);
        l.metadata.uid = None;
        l.metadata.resource_version = None;
        if let Some(spec) = l.spec.as_mut() {
            spec.renew_time = Some(MicroTime(Timestamp::from_second(at_s).expect("time")));
        }
        l
    }

    fn fresh<K: Resource<DynamicType = ()>>(mut o: K) -> K {
        // The double assigns uids and versions as a create would.
        o.meta_mut().uid = None;
        o.meta_mut().resource_version = None;
        o
    }

    /// The agent's write: the result object (spec), then its measurements (status), as `brink-agent`.
    async fn agent_writes(client: &kube::Client, r: SweepResult) {
        let api: Api<SweepResult> = Api::namespaced(client.clone(), NS);
        let name = r.metadata.name.clone().expect("name");
        let status = r.status.clone().expect("status");
        let mut spec_only = fresh(r);
        spec_only.status = None;
        spec_only.metadata.owner_references = None;
        api.create(&PostParams::default(), &spec_only).await.expect("create the result");
        let patch = json!({ "apiVersion": "brink.dev/v1alpha1", "kind": "SweepResult", "metadata": { "name": name }, "status": status });
        api.patch_status(&name, &PatchParams::apply("brink-agent"), &Patch::Apply(&patch)).await.expect("write the figures");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sweep_over_four_nodes_with_a_regression_an_outlier_and_a_lost_node() {
        let double = KubeDouble::new();
        let nodes = ["spark-1", "spark-2", "spark-3", "spark-4"];
        // spark-1..3's agents keep renewing through the run: their renewal at +195 s is seeded up
        // front, because a lease patch racing the clock's jump to +200 s could let the operator
        // see a stale heartbeat and lose a live node. spark-4's last renewal is 5 s before now.
        for n in nodes {
            double.seed(&fresh(labelled(n, "a"))).expect("node");
            double.seed(&fresh(qualified(n))).expect("spark node");
            let renew_s = if n == "spark-4" { NOW_S - 5 } else { NOW_S + 195 };
            double.seed(&renewed(n, renew_s)).expect("lease");
        }
        // The previous run: spark-1 made 120 tokens/s and spark-2 100, both passed; spark-3 and
        // spark-4 are new to the sweep (no baseline).
        let previous = run(3600, &["spark-1", "spark-2"], Some(complete(SweepVerdict::Pass)));
        let previous_name = previous.metadata.name.clone().expect("name");
        let mut previous_seeded = fresh(previous.clone());
        previous_seeded.metadata.owner_references = None;
        double.seed(&previous_seeded).expect("previous run");
        for (node, tps) in [("spark-1", 120.0), ("spark-2", 100.0)] {
            let mut r = fresh(result(&previous, node, tps, Some(pass(None))));
            r.metadata.owner_references = None;
            double.seed(&r).expect("previous result");
        }
        let mut sweep = fresh(nightly(Some(3600), "Forbid"));
        sweep.metadata.creation_timestamp = None;
        sweep.spec.max_concurrent_nodes = 4;
        double.seed(&sweep).expect("sweep");

        let clock = Arc::new(FixedClock::new(now()));
        let shared = Shared {
            client: double.client(),
            metrics: Arc::new(Metrics::new().expect("metrics")),
            clock: clock.clone(),
            config: Config { lease_namespace: LEASE_NS.into(), ..Config::default() },
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let operator = tokio::spawn(controllers::run(Arc::new(shared), async move {
            let _ = stopped.await;
        }));

        // The firing due now becomes a run over the four nodes, all started at once.
        let name = run_name("nightly", NOW_S);
        let started = eventually("the run to start its four nodes", || {
            let r: SweepRun = double.get(Some(NS), &name)?;
            let s = r.status.clone()?;
            (s.nodes.len() == 4 && s.nodes.iter().all(|n| n.state == NodeRunState::Running)).then_some(r)
        })
        .await;
        assert_eq!(started.spec.nodes, nodes);

        // 200 s later: three agents renewed 5 s ago, spark-4's heartbeat has been gone 165 s.
        clock.set(Timestamp::from_second(NOW_S + 200).expect("time"));
        // spark-1 fell from 120 to 100 tokens/s (-16.7%, tolerance 10%); spark-3 makes 60 where
        // its identical peers make 100 (-40% from the median, tolerance 15%).
        let client = double.client();
        for (node, tps) in [("spark-1", 100.0), ("spark-2", 100.0), ("spark-3", 60.0)] {
            agent_writes(&client, result(&started, node, tps, None)).await;
        }

        let done = eventually("the run to complete", || {
            let r: SweepRun = double.get(Some(NS), &name)?;
            r.status.clone().filter(|s| s.phase == RunPhase::Complete)
        })
        .await;
        assert_eq!(done.verdict, Some(SweepVerdict::Lost));
        let c = done.counts;
        assert_eq!((c.nodes, c.passed, c.regressed, c.outliers, c.lost, c.failed, c.hung), (4, 1, 1, 1, 1, 0, 0), "{c:?}");
        let states: Vec<(&str, NodeRunState, Option<SweepVerdict>)> =
            done.nodes.iter().map(|n| (n.node.as_str(), n.state, n.verdict)).collect();
        assert_eq!(
            states,
            [
                ("spark-1", NodeRunState::Done, Some(SweepVerdict::Regressed)),
                ("spark-2", NodeRunState::Done, Some(SweepVerdict::Pass)),
                ("spark-3", NodeRunState::Done, Some(SweepVerdict::Outlier)),
                ("spark-4", NodeRunState::Lost, Some(SweepVerdict::Lost)),
            ]
        );
        assert_eq!(done.message.as_deref(), Some("1 passed, 1 outlier, 1 regressed, 1 lost of 4 nodes"));

        // The judgements on the results, by the operator, beside the agent's figures.
        let judged = |node: &str| -> Judgement {
            let r: SweepResult = double.get(Some(NS), &result_name(&name, node)).expect("result");
            let s = r.status.expect("status");
            assert_eq!(s.points.len(), 1, "the agent's figures stay");
            s.judgement.expect("judgement")
        };
        let j1 = judged("spark-1");
        assert_eq!((j1.verdict, j1.baseline_run.as_deref()), (SweepVerdict::Regressed, Some(previous_name.as_str())));
        let change = j1.findings[0].change_percent.expect("change");
        assert!((change - (100.0 / 120.0 - 1.0) * 100.0).abs() < 1e-9, "{change}");
        assert_eq!(judged("spark-2").verdict, SweepVerdict::Pass);
        // spark-4 never wrote a result: the operator wrote one that says what happened.
        let lost: SweepResult = double.get(Some(NS), &result_name(&name, "spark-4")).expect("a result for the lost node");
        let ls = lost.status.expect("status");
        assert_eq!((ls.state, ls.judgement.map(|j| j.verdict)), (ResultState::Failed, Some(SweepVerdict::Lost)));
        assert_eq!(ls.error.as_deref(), Some("the node or its heartbeat went away mid-sweep"));
        assert_eq!(lost.metadata.owner_references.expect("owner")[0].name, name);
        let j3 = judged("spark-3");
        assert_eq!((j3.verdict, j3.baseline_run), (SweepVerdict::Outlier, None));

        // The sweep reports the run's verdict.
        eventually("the sweep's last verdict", || {
            let s: RegressionSweep = double.get(Some(NS), "nightly")?;
            s.status.filter(|st| st.last_verdict == Some(SweepVerdict::Lost) && st.active.is_empty())
        })
        .await;
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(30), operator).await.expect("the controllers drain").expect("join");
    }
}
