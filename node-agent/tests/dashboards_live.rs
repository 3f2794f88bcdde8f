//! The Grafana dashboards (`dashboards/*.json`) against what brink really exports.
//!
//! - Static (no Prometheus): each file is valid Grafana dashboard JSON (schemaVersion, uid,
//!   title, unique panel ids, gridPos on the 24-column grid, the `datasource` variable used by
//!   every panel and target, every `$variable` defined), and every series an expression reads
//!   is a row of docs/metrics.md.
//! - Live: the API double over HTTP, `brink-operator run` and `brink-agent run` against it, a
//!   replica (`brink-agent up`, CPU backend, demo model, its self-test) that answers a few
//!   requests through `brink-gateway` in front of it (one streamed), a RegressionSweep whose run
//!   the test plays the agents of (a regression and an outlier), and a real Prometheus scraping
//!   the four with the target labels the chart's ServiceMonitors set. Every target of every panel, its variables filled in, must parse and
//!   return data; the failure names dashboard, panel and expression, and the series that had
//!   no data.

mod common;
mod dashboards_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use dashboards_support::{dashboards, documented_series, metric_names, panel_targets, substitute, validate_dashboard};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

#[test]
fn dashboards_are_valid_grafana_json_over_documented_series() {
    let dashes = dashboards(&repo().join("dashboards")).unwrap_or_else(|e| panic!("{e}"));
    let names: BTreeSet<&str> = dashes.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "deployments.json",
            "fleet-overview.json",
            "gateway.json",
            "node-drilldown.json",
            "selftest-matrix.json",
            "sweep-trends.json"
        ])
    );
    let docs = std::fs::read_to_string(repo().join("docs/metrics.md")).expect("docs/metrics.md");
    let documented = documented_series(&docs);
    let mut problems = Vec::new();
    let mut uids = BTreeMap::new();
    let mut targets = 0;
    for (file, d) in &dashes {
        problems.extend(validate_dashboard(d).into_iter().map(|p| format!("{file}: {p}")));
        if let Some(uid) = d["uid"].as_str()
            && let Some(other) = uids.insert(uid.to_string(), file.clone())
        {
            problems.push(format!("{file}: uid {uid:?} is also {other}'s"));
        }
        for t in panel_targets(d) {
            targets += 1;
            for m in metric_names(&t.expr) {
                let base = ["_bucket", "_count", "_sum"].iter().find_map(|s| m.strip_suffix(s)).unwrap_or(&m);
                if !documented.contains(&m) && !documented.contains(base) {
                    problems.push(format!("{file}: panel {:?}: series {m} is not in docs/metrics.md ({})", t.panel, t.expr));
                }
            }
        }
    }
    assert!(targets >= 50, "only {targets} panel targets");
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

mod live {
    //! The live check: processes, the API double, Prometheus.

    use super::*;
    use std::io::Write;
    use std::net::{SocketAddr, TcpListener};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use brink_api::crd::{
        Capacity, GridPoint, Judgement, NodeFingerprint, PointFigures, RegressionSweep, ResultState, RunPhase, ShapeQualification,
        SparkNode, SparkNodeSpec, SparkNodeStatus, SweepResult, SweepResultSpec, SweepResultStatus, SweepRun, SweepRunSpec, SweepRunStatus,
        SweepVerdict, result_name,
    };
    use brink_api::{Envelope, Fingerprint, QUALIFICATION_SCHEMA, Qualification, ReportSummary, ServingParams, UnifiedMemory, Verdict};
    use brink_kube_double::KubeDouble;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::Api;
    use kube::api::{ListParams, Patch, PatchParams, PostParams};
    use serde_json::{Value, json};

    use crate::common::http;

    const CLUSTER: &str = "dash-test";
    const AGENT_NODE: &str = "dash-node";
    const SWEEP_NODES: [&str; 3] = ["spark-1", "spark-2", "spark-3"];
    const SYSTEM_NS: &str = "brink-system";
    const NS: &str = "serving";
    const MODEL: &str = "demo";
    /// The name the replica serves its model under, which clients (and so the gateway's
    /// `model` label) use.
    const GATEWAY_MODEL: &str = "brink";
    const DEPLOYMENT: &str = "chat";
    const SWEEP: &str = "nightly";
    const CLASS: &str = "qwen3moe-h2048-e128-top8-ffn768";
    const POINT: GridPoint = GridPoint { prompt_tokens: 128, concurrency: 1, generated_tokens: 32 };

    /// A child process killed (and reaped) when the test ends, its output in a log file.
    struct Proc {
        name: &'static str,
        child: Child,
        log: PathBuf,
    }

    impl Proc {
        fn spawn(name: &'static str, mut cmd: Command, dir: &Path) -> Proc {
            let log = dir.join(format!("{name}.log"));
            let file = std::fs::File::create(&log).expect("log file");
            let err = file.try_clone().expect("log file");
            let child = cmd.stdout(file).stderr(err).spawn().unwrap_or_else(|e| panic!("starting {name} ({:?}): {e}", cmd.get_program()));
            Proc { name, child, log }
        }

        fn log_tail(&self) -> String {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            format!(
                "--- {} (last 25 lines of {}) ---\n{}",
                self.name,
                self.log.display(),
                lines[lines.len().saturating_sub(25)..].join("\n")
            )
        }

        fn exited(&mut self) -> Option<String> {
            self.child.try_wait().ok().flatten().map(|s| format!("{} exited ({s})\n{}", self.name, self.log_tail()))
        }
    }

    impl Drop for Proc {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn free_addr() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port")
    }

    /// Polls `check` every 250 ms until it returns `Some`, or `None` after `limit`.
    fn wait_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
        let t0 = Instant::now();
        loop {
            if let Some(v) = check() {
                return Some(v);
            }
            if t0.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn now_s() -> i64 {
        Timestamp::now().as_second()
    }

    fn time_of(s: i64) -> Time {
        Time(Timestamp::from_second(s).expect("a valid time"))
    }

    fn fingerprint() -> NodeFingerprint {
        NodeFingerprint {
            gpu_name: "NVIDIA GB10".into(),
            compute_capability: "12.1".into(),
            driver_version: Some("580.95.05".into()),
            cuda_version: "13.0".into(),
            nvrtc_version: None,
            agent_version: "0.2.0".into(),
            kernel_sources_hash: "cafe".into(),
        }
    }

    /// A qualified SparkNode for a node the test plays the agent of, with its Node and Lease.
    fn seed_sweep_node(double: &KubeDouble, name: &str) {
        double
            .seed_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"pool": "a"}}, "spec": {}}))
            .expect("node");
        let node_fp = fingerprint();
        let fp = Fingerprint {
            gpu_name: node_fp.gpu_name.clone(),
            compute_capability: node_fp.compute_capability.clone(),
            driver_version: node_fp.driver_version.clone(),
            cuda_version: node_fp.cuda_version.clone(),
            nvrtc_version: node_fp.nvrtc_version.clone(),
            agent_version: node_fp.agent_version.clone(),
            kernel_sources_hash: node_fp.kernel_sources_hash.clone(),
            shape_class: CLASS.into(),
            serving: ServingParams { max_batch_tokens: 8192, prefill_chunk: 2048, context: 32_768, full_window_kv: false },
        };
        let qualification = ShapeQualification {
            shape_class: CLASS.into(),
            qualification: Qualification {
                schema: QUALIFICATION_SCHEMA,
                digest: fp.digest(),
                fingerprint: fp,
                verdict: Verdict::Qualified { max_tokens: 16_384 },
                summary: ReportSummary::default(),
                qualified_at: "2026-11-30T23:00:00Z".into(),
                model_summary: None,
                kernel_verdict: None,
                model_verdict: None,
            },
            envelope: Some(Envelope {
                validated: true,
                validated_tokens: Some(16_384),
                first_failure: None,
                max_batch_tokens: 16_384,
                prefill_chunk: 2048,
            }),
            failing_cases: Vec::new(),
        };
        let mut spark = SparkNode::new(name, SparkNodeSpec { shape_classes: vec![CLASS.into()] });
        spark.status = Some(SparkNodeStatus {
            agent_version: node_fp.agent_version.clone(),
            kernel_sources_hash: node_fp.kernel_sources_hash.clone(),
            fingerprint: Some(node_fp),
            capacity: Some(Capacity {
                unified_memory: UnifiedMemory { total: 128 << 30, available: 120 << 30 },
                resident_replica_bytes: 0,
                reserved_bytes: 0,
            }),
            qualifications: vec![qualification],
            last_heartbeat_time: Some(time_of(now_s())),
            ..SparkNodeStatus::default()
        });
        double.seed(&spark).expect("spark node");
        double
            .seed_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": format!("brink-node-{name}"), "namespace": SYSTEM_NS},
                // Long enough that the played agents stay up for the whole test.
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 3600, "renewTime": Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}
            }))
            .expect("lease");
    }

    fn figures(tokens_per_s: f64, ttft_s: f64) -> PointFigures {
        PointFigures {
            point: POINT,
            requests: 8,
            failed: 0,
            timed_out: 0,
            output_tokens_per_s: Some(tokens_per_s),
            ttft_p50_s: Some(ttft_s),
            ttft_p99_s: Some(ttft_s * 2.0),
            itl_p50_s: Some(0.02),
            itl_p99_s: Some(0.03),
            error: None,
        }
    }

    fn result(run: &str, node: &str, tokens_per_s: f64, ttft_s: f64, judgement: Option<Judgement>) -> SweepResult {
        let mut r = SweepResult::new(&result_name(run, node), SweepResultSpec { run: run.into(), node: node.into() });
        r.metadata.namespace = Some(NS.into());
        r.status = Some(SweepResultStatus {
            state: ResultState::Done,
            fingerprint: Some(fingerprint()),
            points: vec![figures(tokens_per_s, ttft_s)],
            judgement,
            ..SweepResultStatus::default()
        });
        r
    }

    /// The Model, the ModelDeployment, the sweep (created 3 h ago, hourly, last fired 2 h ago so
    /// the last full hour is due now) and its previous run, passed, with its figures: the baseline.
    fn seed_workload(double: &KubeDouble, now: i64) {
        double
            .seed_value(json!({
                "apiVersion": "brink.dev/v1alpha1", "kind": "Model", "metadata": {"name": MODEL, "namespace": NS},
                "spec": {"source": {"https": {"url": "https://models.invalid/demo.gguf"}}, "sha256": "ab".repeat(32), "format": "gguf"},
                "status": {"shapeClass": CLASS, "sizeBytes": 20u64 << 30, "kvBytesPerToken": 98304}
            }))
            .expect("model");
        double
            .seed_value(json!({
                "apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": DEPLOYMENT, "namespace": NS},
                "spec": {
                    "modelRef": {"name": MODEL}, "replicas": 1, "engine": {"image": "ghcr.io/brink/agent:0.2.0", "version": "0.2.0"},
                    // Only the real agent's node: it is asked to qualify the class (and, with no
                    // GPU, cannot), so the replica stays unplaced and the swept nodes hold no
                    // replica (a sweep would first drain it, and outlast the test).
                    "placement": {"nodeSelector": {"pool": "serve"}},
                    "serving": {"context": 32768, "maxBatchTokens": 8192, "prefillChunk": 2048, "concurrency": 4, "kvFraction": 0.9}
                }
            }))
            .expect("deployment");
        let hour = now - now.rem_euclid(3600);
        let previous_at = hour - 3600;
        double.set_wall_clock(now - 3 * 3600);
        let sweep = double
            .seed_value(json!({
                "apiVersion": "brink.dev/v1alpha1", "kind": "RegressionSweep", "metadata": {"name": SWEEP, "namespace": NS},
                "spec": {
                    "schedule": "0 * * * *", "concurrencyPolicy": "Forbid", "nodeSelector": {"pool": "a"}, "maxConcurrentNodes": 3,
                    "modelRef": {"name": MODEL}, "workload": {"promptTokens": [128], "concurrency": [1], "generatedTokens": [32]}
                },
                "status": {"lastScheduleTime": time_of(previous_at)}
            }))
            .expect("sweep");
        double.set_wall_clock(now);
        let sweep: RegressionSweep = serde_json::from_value(sweep).expect("the stored sweep");
        let s = &sweep.spec;
        let previous = format!("{SWEEP}-{}", previous_at.div_euclid(60));
        let spec = SweepRunSpec {
            sweep: SWEEP.into(),
            scheduled_time: time_of(previous_at),
            model: MODEL.into(),
            nodes: SWEEP_NODES.iter().map(|n| n.to_string()).collect(),
            deployment: None,
            workload: s.workload.clone(),
            self_test: s.self_test,
            baseline: s.baseline.clone(),
            max_concurrent_nodes: s.max_concurrent_nodes,
            drain_replicas: s.drain_replicas,
            node_timeout_seconds: s.node_timeout_seconds,
            extra_cases: Vec::new(),
        };
        let mut run = SweepRun::new(&previous, spec);
        run.metadata.namespace = Some(NS.into());
        run.status = Some(SweepRunStatus {
            phase: RunPhase::Complete,
            verdict: Some(SweepVerdict::Pass),
            start_time: Some(time_of(previous_at)),
            completion_time: Some(time_of(previous_at + 600)),
            ..SweepRunStatus::default()
        });
        double.seed(&run).expect("previous run");
        let pass = Judgement { verdict: SweepVerdict::Pass, baseline_run: None, findings: Vec::new() };
        for node in SWEEP_NODES {
            double
                .seed(&result(&previous, node, if node == "spark-1" { 120.0 } else { 100.0 }, 0.1, Some(pass.clone())))
                .expect("previous result");
        }
    }

    /// Plays the sweep nodes' agents: once the operator started the due run, each writes its
    /// figures (spark-1 regressed from 120 to 100 tokens/s; spark-3 an outlier at 60 where its
    /// peers make 100). Returns the run once the operator completed it.
    fn play_the_sweep(rt: &tokio::runtime::Runtime, client: &kube::Client, procs: &mut [Proc]) -> Result<SweepRun, String> {
        let runs: Api<SweepRun> = Api::namespaced(client.clone(), NS);
        let started = wait_for(Duration::from_secs(60), || {
            let list = rt.block_on(runs.list(&ListParams::default())).ok()?;
            list.items
                .into_iter()
                .find(|r| r.status.as_ref().is_some_and(|s| s.phase == RunPhase::Running && s.nodes.len() == SWEEP_NODES.len()))
        });
        let Some(started) = started else {
            let dead: Vec<String> = procs.iter_mut().filter_map(Proc::exited).collect();
            return Err(format!("the operator started no run of RegressionSweep {NS}/{SWEEP} within 60 s\n{}", dead.join("\n")));
        };
        let name = started.metadata.name.clone().unwrap_or_default();
        let results: Api<SweepResult> = Api::namespaced(client.clone(), NS);
        for (node, tps, ttft) in [("spark-1", 100.0, 0.1), ("spark-2", 100.0, 0.1), ("spark-3", 60.0, 0.3)] {
            let r = result(&name, node, tps, ttft, None);
            let status = r.status.clone();
            let mut spec_only = r;
            spec_only.status = None;
            rt.block_on(results.create(&PostParams::default(), &spec_only)).map_err(|e| format!("creating {node}'s SweepResult: {e}"))?;
            let patch = json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SweepResult", "metadata": {"name": result_name(&name, node)}, "status": status});
            rt.block_on(results.patch_status(&result_name(&name, node), &PatchParams::apply("brink-agent"), &Patch::Apply(&patch)))
                .map_err(|e| format!("writing {node}'s figures: {e}"))?;
        }
        wait_for(Duration::from_secs(60), || {
            let r = rt.block_on(runs.get(&name)).ok()?;
            r.status.as_ref().is_some_and(|s| s.phase == RunPhase::Complete).then_some(r)
        })
        .ok_or_else(|| {
            let now = rt.block_on(runs.get(&name)).ok().and_then(|r| r.status).and_then(|s| serde_json::to_string(&s).ok());
            let verdicts: Vec<String> = rt
                .block_on(results.list(&ListParams::default()))
                .map(|l| {
                    l.items
                        .iter()
                        .map(|r| format!("{}: {:?}", r.spec.node, r.status.as_ref().and_then(|s| s.judgement.as_ref()).map(|j| j.verdict)))
                        .collect()
                })
                .unwrap_or_default();
            format!("SweepRun {NS}/{name} did not complete within 60 s of its results; its status: {now:?}; results: {verdicts:?}")
        })
    }

    /// Starts `brink-agent up` on the CPU with the demo model; returns it and its address.
    fn start_replica(dir: &Path) -> Result<(Proc, String), String> {
        let mut cmd = crate::common::agent();
        // The default backend (auto: the CPU here) also derives the kernel suite's cases.
        cmd.args(["up", "--port", "0", "--state-dir"]).arg(dir.join("replica-state"));
        let mut proc = Proc::spawn("replica (brink-agent up)", cmd, dir);
        let addr = wait_for(Duration::from_secs(150), || {
            let log = std::fs::read_to_string(&proc.log).ok()?;
            log.split("SERVING at http://").nth(1).map(|rest| rest.split_whitespace().next().unwrap_or_default().to_string())
        });
        match addr {
            Some(a) => Ok((proc, a)),
            None => Err(proc.exited().unwrap_or_else(|| format!("brink-agent up printed no SERVING line in 150 s\n{}", proc.log_tail()))),
        }
    }

    /// Starts `brink-gateway` in front of the replica; returns it and its address once it lists
    /// the replica's model.
    fn start_gateway(bin: &Path, replica: &str, dir: &Path) -> Result<(Proc, SocketAddr), String> {
        let addr = free_addr();
        let mut cmd = Command::new(bin);
        cmd.args(["--listen", &addr.to_string(), "--upstream", &format!("http://{replica}"), "--poll-interval-ms", "200"]);
        let mut proc = Proc::spawn("brink-gateway", cmd, dir);
        let listed = wait_for(Duration::from_secs(30), || {
            let (status, body) = http(&addr.to_string(), "GET", "/v1/models", "");
            (status == 200 && body.contains(GATEWAY_MODEL)).then_some(())
        });
        match listed {
            Some(()) => Ok((proc, addr)),
            None => Err(proc.exited().unwrap_or_else(|| format!("brink-gateway never listed {GATEWAY_MODEL}\n{}", proc.log_tail()))),
        }
    }

    fn prometheus_config(operator: SocketAddr, agent: SocketAddr, replica: &str, gateway: SocketAddr) -> String {
        // The target labels the chart's ServiceMonitors set (the operator's Pod runs on some
        // node too). The operator's own series carry `namespace`/`node` of the objects they
        // describe: `honor_labels` keeps them instead of `exported_node`/`exported_namespace`.
        format!(
            r#"global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: brink-operator
    honor_labels: true
    static_configs:
      - targets: ['{operator}']
        labels: {{cluster: {CLUSTER}, namespace: {SYSTEM_NS}, node: control-plane-1}}
  - job_name: brink-agent
    static_configs:
      - targets: ['{agent}']
        labels: {{cluster: {CLUSTER}, namespace: {SYSTEM_NS}, node: {AGENT_NODE}}}
  - job_name: brink-replica
    static_configs:
      - targets: ['{replica}']
        labels: {{cluster: {CLUSTER}, namespace: {NS}, node: {AGENT_NODE}, model: {MODEL}, deployment: {DEPLOYMENT}}}
  - job_name: brink-gateway
    honor_labels: true
    static_configs:
      - targets: ['{gateway}']
        labels: {{cluster: {CLUSTER}, namespace: {SYSTEM_NS}, node: {AGENT_NODE}}}
"#
        )
    }

    /// `/api/v1/query`: `Ok(result array)` on success, else the error Prometheus gave.
    fn query(prom: &str, expr: &str) -> Result<Vec<Value>, String> {
        let path = format!("/api/v1/query?query={}", urlencode(expr));
        let (status, body) = http(prom, "GET", &path, "");
        let v: Value = serde_json::from_str(&body).map_err(|_| format!("HTTP {status}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!("{}: {}", v["errorType"].as_str().unwrap_or("error"), v["error"].as_str().unwrap_or(&body)));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    fn urlencode(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    }

    #[test]
    fn every_panel_parses_and_returns_data_from_a_real_prometheus() {
        let Some(prometheus) = which("prometheus") else {
            assert!(
                std::env::var("BRINK_REQUIRE_PROMETHEUS").as_deref() != Ok("1"),
                "BRINK_REQUIRE_PROMETHEUS=1 but no `prometheus` on PATH (Debian: apt-get install -y --no-install-recommends prometheus)"
            );
            eprintln!("skipped: no `prometheus` on PATH (BRINK_REQUIRE_PROMETHEUS=1 makes this a failure)");
            return;
        };
        let operator_bin =
            Path::new(env!("CARGO_BIN_EXE_brink-agent")).with_file_name(format!("brink-operator{}", std::env::consts::EXE_SUFFIX));
        let gateway_bin =
            Path::new(env!("CARGO_BIN_EXE_brink-agent")).with_file_name(format!("brink-gateway{}", std::env::consts::EXE_SUFFIX));
        assert!(
            gateway_bin.exists(),
            "{} is missing: build it first with `cargo build -p brink-gateway --profile test` (scripts/test builds the workspace first)",
            gateway_bin.display()
        );
        assert!(
            operator_bin.exists(),
            "{} is missing: build it first with `cargo build -p brink-operator --profile test` (scripts/test runs `cargo build --workspace --all-targets --profile test` before the tests)",
            operator_bin.display()
        );
        let t0 = Instant::now();
        let dir = tempfile::tempdir().expect("tempdir");
        let dir = dir.path();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");

        // The API server, with what the agents and the operator find there.
        let double = KubeDouble::new();
        let now = now_s();
        double.set_wall_clock(now);
        let (api_addr, _server) = rt.block_on(double.serve_http("127.0.0.1:0".parse().expect("addr"))).expect("serving the double");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, brink_kube_double::kubeconfig(&format!("http://{api_addr}"), SYSTEM_NS)).expect("kubeconfig");
        double
            .seed_value(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": AGENT_NODE, "labels": {"pool": "serve"}}, "spec": {}}),
            )
            .expect("node");
        for n in SWEEP_NODES {
            seed_sweep_node(&double, n);
        }
        seed_workload(&double, now);

        let mut failures: Vec<String> = Vec::new();
        let operator_addr = free_addr();
        let mut operator = Command::new(&operator_bin);
        operator
            .args(["run", "--leader-elect=false", "--lease-namespace", SYSTEM_NS, "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--metrics-addr", &operator_addr.to_string()])
            .env("RUST_LOG", "info");
        let mut procs = vec![Proc::spawn("brink-operator run", operator, dir)];
        let agent_addr = free_addr();
        let mut agent = crate::common::agent();
        agent
            .args(["run", "--state-dir"])
            .arg(dir.join("agent-state"))
            .args(["--listen", &agent_addr.to_string()])
            .env("KUBECONFIG", &kubeconfig)
            .env("NODE_NAME", AGENT_NODE)
            .env("POD_NAMESPACE", SYSTEM_NS)
            .env("CUDA_VISIBLE_DEVICES", "")
            .env_remove("KUBERNETES_SERVICE_HOST");
        procs.push(Proc::spawn("brink-agent run", agent, dir));

        // The replica qualifies on the CPU while the operator and the agent start.
        // The requests go through the gateway (one streamed: its time to first token).
        let replica = start_replica(dir);
        let (replica_addr, gateway_addr) = match replica {
            Ok((p, addr)) => {
                procs.push(p);
                let gateway_addr = match start_gateway(&gateway_bin, &addr, dir) {
                    Ok((g, gateway_addr)) => {
                        procs.push(g);
                        gateway_addr
                    }
                    Err(e) => {
                        failures.push(e);
                        free_addr()
                    }
                };
                for (prompt, stream) in [("Say hi", false), ("Count to three", true), ("Say hi", false)] {
                    let body = format!(
                        r#"{{"model":"{GATEWAY_MODEL}","messages":[{{"role":"user","content":"{prompt}"}}],"max_tokens":4,"temperature":0,"stream":{stream}}}"#
                    );
                    let (status, answer) = http(&gateway_addr.to_string(), "POST", "/v1/chat/completions", &body);
                    if status != 200 {
                        failures.push(format!("the gateway answered {status} to a chat completion: {answer}"));
                    }
                }
                (addr, gateway_addr)
            }
            Err(e) => {
                failures.push(e);
                (free_addr().to_string(), free_addr())
            }
        };
        // Readiness of the operator and the agent, as their probes read it.
        for (what, addr, path) in [("brink-operator", operator_addr, "/healthz"), ("brink-agent run", agent_addr, "/ready")] {
            if wait_for(Duration::from_secs(30), || (http(&addr.to_string(), "GET", path, "").0 == 200).then_some(())).is_none() {
                let logs: Vec<String> = procs.iter_mut().map(|p| p.exited().unwrap_or_else(|| p.log_tail())).collect();
                failures.push(format!("{what}: GET {path} on {addr} never answered 200\n{}", logs.join("\n")));
            }
        }
        // kube's client spawns its buffer task on the runtime it is built in.
        let client = {
            let _in_runtime = rt.enter();
            double.client()
        };
        match play_the_sweep(&rt, &client, &mut procs) {
            Ok(run) => eprintln!("sweep run {} complete: {:?}", run.metadata.name.unwrap_or_default(), run.status.and_then(|s| s.verdict)),
            Err(e) => failures.push(e),
        }

        // Prometheus scrapes the four until each target has at least three samples.
        let prom_addr = free_addr().to_string();
        let config = dir.join("prometheus.yml");
        std::fs::File::create(&config)
            .and_then(|mut f| f.write_all(prometheus_config(operator_addr, agent_addr, &replica_addr, gateway_addr).as_bytes()))
            .expect("prometheus.yml");
        let mut prom_cmd = Command::new(&prometheus);
        prom_cmd
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={prom_addr}"))
            .stdin(Stdio::null());
        let mut prom = Proc::spawn("prometheus", prom_cmd, dir);
        let scraped = wait_for(Duration::from_secs(30), || {
            let r = query(&prom_addr, "count_over_time(up[5m]) >= 3 and up == 1").ok()?;
            let jobs: BTreeSet<String> = r.iter().filter_map(|s| s["metric"]["job"].as_str().map(str::to_string)).collect();
            (jobs.len() == 4).then_some(())
        });
        if scraped.is_none() {
            let targets = http(&prom_addr, "GET", "/api/v1/targets", "").1;
            failures.push(format!(
                "Prometheus did not scrape all four targets up three times in 30 s: {targets}\n{}",
                prom.exited().unwrap_or_else(|| prom.log_tail())
            ));
        }

        let values = BTreeMap::from([
            ("cluster", CLUSTER.to_string()),
            ("node", format!("{AGENT_NODE}|{}", SWEEP_NODES.join("|"))),
            // The replicas' `model` is the Model's name, the gateway's the name clients ask for.
            ("model", format!("{MODEL}|{GATEWAY_MODEL}")),
            ("sweep", SWEEP.to_string()),
            ("__rate_interval", "1m".to_string()),
            ("__range", "5m".to_string()),
        ]);
        let dashes = dashboards(&repo().join("dashboards")).unwrap_or_else(|e| panic!("{e}"));
        let (mut checked, mut without_gpu) = (0, Vec::new());
        let mut missing_series = BTreeSet::new();
        for (file, d) in &dashes {
            for t in panel_targets(d) {
                let expr = match substitute(&t.expr, &values) {
                    Ok(e) => e,
                    Err(e) => {
                        failures.push(format!("{file} / {:?}: {e}: {}", t.panel, t.expr));
                        continue;
                    }
                };
                checked += 1;
                match query(&prom_addr, &expr) {
                    Err(e) => failures.push(format!("{file} / {:?}: the query failed: {e}\n    {expr}", t.panel)),
                    Ok(r) if !r.is_empty() => {}
                    Ok(_) => {
                        let names = metric_names(&expr);
                        let absent: Vec<String> = names
                            .iter()
                            .filter(|m| query(&prom_addr, &format!("count({{__name__=\"{m}\"}})")).map(|r| r.is_empty()).unwrap_or(true))
                            .cloned()
                            .collect();
                        // GPU sensors come from NVML: on a machine without a driver they are
                        // absent by design (docs/metrics.md), so only their parsing is checked.
                        if !absent.is_empty() && absent.iter().all(|m| m.starts_with("brink_gpu_")) {
                            without_gpu.push(format!("{file} / {:?}", t.panel));
                            continue;
                        }
                        missing_series.extend(absent.iter().cloned());
                        failures.push(format!("{file} / {:?}: no data (series with no samples: {absent:?})\n    {expr}", t.panel));
                    }
                }
            }
        }
        eprintln!(
            "checked {checked} panel targets in {:.0?}; {} GPU-only targets parsed but have no data without NVML: {without_gpu:?}",
            t0.elapsed(),
            without_gpu.len()
        );
        if !failures.is_empty() {
            let logs: Vec<String> = procs.iter().map(Proc::log_tail).collect();
            panic!(
                "{} failures (series with no data anywhere: {missing_series:?}):\n{}\n\n{}",
                failures.len(),
                failures.join("\n"),
                logs.join("\n")
            );
        }
        drop(prom);
    }

    fn which(program: &str) -> Option<PathBuf> {
        std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(program)).find(|p| p.is_file())
    }
}
