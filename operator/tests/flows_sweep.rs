//! Whole flows of the sweep controllers: the real controllers
//! (`controllers::run`) against the in-memory API server, the test playing the node agents
//! (heartbeats, `SweepResult`s) and the user (suspend, resume), over hours of schedule.
//!
//! Time: the controllers read a fixed clock that the test moves hour by hour (the API server's
//! wall clock agrees at the start); tokio's clock is paused, so requeues fire as soon as nothing
//! else runs. Each move renews every heartbeat first, then pokes the sweep (an annotation), so
//! the sweep controller looks at the new time at once.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{
    RegressionSweep, ResultState, RunPhase, SweepResult, SweepResultSpec, SweepResultStatus, SweepRun, SweepVerdict, result_name,
};
use brink_kube_double::KubeDouble;
use brink_operator::controllers::sweep::time_of;
use brink_operator::controllers::{self, Config, FixedClock, Metrics, Shared};
use brink_operator::decide::sweep::schedule::run_name;
use common::{LEASE_NS, NOW_S, NS, point_figures, sweep_fingerprint};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

const NODES: [&str; 3] = ["spark-1", "spark-2", "spark-3"];
const HOUR: i64 = 3600;
/// Real time any one wait may take.
const REAL_LIMIT: Duration = Duration::from_secs(20);

/// An hourly sweep of the three nodes, created a day before now; `extra` is merged into its spec.
fn sweep(extra: Value) -> RegressionSweep {
    let mut spec = json!({
        "schedule": "0 * * * *",
        "nodeSelector": { "pool": "a" },
        "maxConcurrentNodes": 3,
        "nodeTimeoutSeconds": 7200,
        "modelRef": { "name": "qwen" },
        "workload": { "promptTokens": [128], "concurrency": [1], "generatedTokens": [32] },
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "RegressionSweep",
        "metadata": { "name": "nightly", "namespace": NS },
        "spec": spec,
    }))
    .expect("a sweep")
}

fn micro(at_s: i64) -> MicroTime {
    MicroTime(Timestamp::from_second(at_s).expect("valid time"))
}

struct Sweeps {
    double: KubeDouble,
    clock: Arc<FixedClock>,
    metrics: Arc<Metrics>,
    now_s: i64,
    pokes: u32,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sweeps {
    /// Seeds three labelled, qualified nodes with fresh heartbeats and `sweep` (created a day
    /// ago, with `status` when given), then starts the controllers at [`NOW_S`].
    fn start(sweep: RegressionSweep, status: Option<Value>) -> Sweeps {
        let double = KubeDouble::new();
        double.set_wall_clock(NOW_S - 86_400);
        for n in NODES {
            let mut node: Node = common::node(n);
            node.metadata.labels = Some(BTreeMap::from([("pool".to_string(), "a".to_string())]));
            double.seed(&fresh(node)).expect("seed Node");
            double.seed(&fresh(common::qualified(n))).expect("seed SparkNode");
            double.seed(&fresh(common::lease(n, 0))).expect("seed Lease");
        }
        let mut value = serde_json::to_value(&sweep).expect("sweep as JSON");
        if let Some(s) = status {
            value["status"] = s;
        }
        double.seed_value(value).expect("seed the sweep");
        double.set_wall_clock(NOW_S);
        let clock = Arc::new(FixedClock::new(Timestamp::from_second(NOW_S).expect("valid time")));
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let shared = Arc::new(Shared {
            client: double.client(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            config: Config { lease_namespace: LEASE_NS.into(), ..Config::default() },
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(controllers::run(shared, async move {
            let _ = stopped.await;
        }));
        Sweeps { double, clock, metrics, now_s: NOW_S, pokes: 0, stop: Some(stop), task }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(60), &mut self.task).await.expect("controllers drain").expect("controllers task");
    }

    fn sweeps(&self) -> Api<RegressionSweep> {
        Api::namespaced(self.double.client(), NS)
    }

    /// Moves the controllers' clock to `at_s`: every agent renews its heartbeat at that time
    /// first, then the sweep is poked so that its controller looks at once.
    async fn advance(&mut self, at_s: i64) {
        let leases: Api<Lease> = Api::namespaced(self.double.client(), LEASE_NS);
        for n in NODES {
            let patch = json!({ "spec": { "renewTime": micro(at_s) } });
            leases.patch(&format!("brink-node-{n}"), &PatchParams::default(), &Patch::Merge(&patch)).await.expect("renew");
        }
        self.clock.set(Timestamp::from_second(at_s).expect("valid time"));
        self.now_s = at_s;
        self.poke().await;
    }

    /// Touches the sweep (an annotation): its controller reconciles it now.
    async fn poke(&mut self) {
        self.pokes += 1;
        let patch = json!({ "metadata": { "annotations": { "test.brink.dev/poke": self.pokes.to_string() } } });
        self.sweeps().patch("nightly", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("poke the sweep");
    }

    /// The user flips `spec.suspend`.
    async fn suspend(&mut self, suspend: bool) {
        let patch = json!({ "spec": { "suspend": suspend } });
        self.sweeps().patch("nightly", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("suspend or resume");
    }

    /// The sweep's runs: name → phase, oldest first by name (names carry the schedule time).
    async fn runs(&self) -> BTreeMap<String, RunPhase> {
        let api: Api<SweepRun> = Api::namespaced(self.double.client(), NS);
        let runs = api.list(&ListParams::default()).await.expect("list SweepRuns").items;
        runs.iter().map(|r| (r.name_any(), r.status.as_ref().map(|s| s.phase).unwrap_or_default())).collect()
    }

    /// Reasons of the Events about the sweep.
    async fn events(&self) -> Vec<String> {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.double.client(), NS);
        let events = api.list(&ListParams::default()).await.expect("list Events").items;
        events
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("nightly"))
            .filter_map(|e| e.reason.clone())
            .collect()
    }

    /// Waits until `probe` finds what it wants in the runs, for at most `within_s` seconds of
    /// tokio's (paused) clock and [`REAL_LIMIT`] of real time.
    async fn until<T>(&self, what: &str, within_s: u64, mut probe: impl FnMut(&BTreeMap<String, RunPhase>) -> Option<T>) -> T {
        let started = tokio::time::Instant::now();
        let real = std::time::Instant::now();
        loop {
            let runs = self.runs().await;
            if let Some(v) = probe(&runs) {
                return v;
            }
            if started.elapsed() > Duration::from_secs(within_s) || real.elapsed() > REAL_LIMIT {
                let writes: Vec<String> = self.double.request_lines().into_iter().filter(|l| !l.starts_with("GET")).collect();
                let tail = &writes[writes.len().saturating_sub(25)..];
                panic!("{what}: not reached; runs {runs:?}\nlatest writes:\n{}", tail.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every node's agent writes its result for `run` (spec as `brink-agent` creates it, then
    /// its figures), `tokens_per_s[i]` for node i.
    async fn agents_finish(&self, run: &str, tokens_per_s: [f64; 3]) {
        let api: Api<SweepResult> = Api::namespaced(self.double.client(), NS);
        let owner = self.double.get::<SweepRun>(Some(NS), run).and_then(|r| r.controller_owner_ref(&())).expect("the run's owner ref");
        for (node, tps) in NODES.iter().zip(tokens_per_s) {
            let name = result_name(run, node);
            let mut r = SweepResult::new(&name, SweepResultSpec { run: run.into(), node: node.to_string() });
            r.metadata.namespace = Some(NS.into());
            r.metadata.owner_references = Some(vec![owner.clone()]);
            api.create(&PostParams { field_manager: Some("brink-agent".into()), ..PostParams::default() }, &r)
                .await
                .expect("create result");
            let status = SweepResultStatus {
                state: ResultState::Done,
                fingerprint: Some(sweep_fingerprint()),
                points: vec![point_figures(tps)],
                ..SweepResultStatus::default()
            };
            let patch =
                json!({ "apiVersion": "brink.dev/v1alpha1", "kind": "SweepResult", "metadata": { "name": name }, "status": status });
            api.patch_status(&name, &PatchParams::apply("brink-agent"), &Patch::Apply(&patch)).await.expect("write the figures");
        }
    }

    /// One firing at `at_s`: the run starts over the three nodes, the agents report, the run
    /// completes; returns its verdict.
    async fn fire_and_finish(&mut self, at_s: i64, tokens_per_s: [f64; 3]) -> Option<SweepVerdict> {
        self.advance(at_s).await;
        let name = run_name("nightly", at_s);
        self.until(&format!("{name} running"), 120, |runs| (runs.get(&name) == Some(&RunPhase::Running)).then_some(())).await;
        self.agents_finish(&name, tokens_per_s).await;
        self.until(&format!("{name} complete"), 120, |runs| (runs.get(&name) == Some(&RunPhase::Complete)).then_some(())).await;
        self.double.get::<SweepRun>(Some(NS), &name).and_then(|r| r.status?.verdict)
    }
}

impl Drop for Sweeps {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An object as a client would create it: no server-set metadata.
fn fresh<K: Resource>(mut obj: K) -> K {
    let meta = obj.meta_mut();
    meta.uid = None;
    meta.resource_version = None;
    meta.generation = None;
    obj
}

/// `GET /metrics` from the operator's HTTP endpoint, served on a free local port.
async fn scrape(metrics: Arc<Metrics>) -> String {
    let listener = controllers::server::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(controllers::server::serve(listener, metrics, async move {
        let _ = stopped.await;
    }));
    // A plain blocking client on its own thread (the runtime keeps serving meanwhile).
    let body = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(addr).expect("connect");
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n").expect("request");
        let mut body = String::new();
        conn.read_to_string(&mut body).expect("response");
        body
    })
    .await
    .expect("the scrape");
    let _ = stop.send(());
    server.await.expect("server task").expect("server");
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    body
}

fn names(at: &[i64]) -> Vec<String> {
    at.iter().map(|t| run_name("nightly", *t)).collect()
}

/// History pruning: five hourly runs that all pass, with room for two passing runs.
/// The two newest stay, and so does the run they were judged against (the newest one's
/// baseline is the run before it, whose baseline is the one before that: the run beyond the
/// limit that the kept runs still compare with). Older ones go, although each is some pruned
/// run's baseline.
#[tokio::test(start_paused = true)]
async fn history_keeps_the_newest_runs_and_their_baseline() {
    let mut f = Sweeps::start(sweep(json!({ "successfulRunsHistoryLimit": 2, "failedRunsHistoryLimit": 1 })), None);
    let times: Vec<i64> = (0..5).map(|i| NOW_S + i * HOUR).collect();
    for &t in &times {
        assert_eq!(f.fire_and_finish(t, [100.0, 101.0, 99.0]).await, Some(SweepVerdict::Pass));
    }
    // Each node's result of the newest run was judged against the run before.
    let last = run_name("nightly", times[4]);
    for n in NODES {
        let r: SweepResult = f.double.get(Some(NS), &result_name(&last, n)).expect("result");
        let j = r.status.and_then(|s| s.judgement).expect("judged");
        assert_eq!(j.baseline_run, Some(run_name("nightly", times[3])), "{n}");
    }
    // Runs 3 and 4 are the newest two; run 3's results compare with run 2, so it stays too.
    let want = names(&times[2..]);
    let kept = f
        .until("the two oldest runs pruned", 300, |runs| {
            let all: Vec<String> = runs.keys().cloned().collect();
            (all == want).then_some(all)
        })
        .await;
    assert_eq!(kept, want);
    // The sweep's status: no run active, the last one Pass.
    let s = f.sweeps().get("nightly").await.expect("sweep").status.expect("status");
    assert_eq!((s.active.len(), s.last_verdict, s.last_run.as_deref()), (0, Some(SweepVerdict::Pass), Some(last.as_str())));
    f.stop().await;
}

/// A run beyond the limits that the sweep pins as its baseline is never pruned, and a failed
/// run counts against the failed-runs limit only.
#[tokio::test(start_paused = true)]
async fn history_never_prunes_the_pinned_baseline() {
    let pinned = run_name("nightly", NOW_S);
    let spec = json!({
        "successfulRunsHistoryLimit": 1,
        "failedRunsHistoryLimit": 1,
        "baseline": { "policy": "Pinned", "pinnedRun": pinned },
    });
    let mut f = Sweeps::start(sweep(spec), None);
    let times: Vec<i64> = (0..4).map(|i| NOW_S + i * HOUR).collect();
    // Runs 0, 1 and 3 pass; in run 2 spark-1 falls 30% below the pinned run: Regressed.
    let mut verdicts = Vec::new();
    for (i, &t) in times.iter().enumerate() {
        let tps = if i == 2 { [70.0, 100.0, 100.0] } else { [100.0, 100.0, 100.0] };
        verdicts.push(f.fire_and_finish(t, tps).await);
    }
    let pass = Some(SweepVerdict::Pass);
    assert_eq!(verdicts, [pass, pass, Some(SweepVerdict::Regressed), pass]);
    // Kept: the newest passing run (3), the newest other run (2), the pinned run (0). Pruned: 1.
    let want = names(&[times[0], times[2], times[3]]);
    f.until("run 1 pruned", 300, |runs| (runs.keys().cloned().collect::<Vec<_>>() == want).then_some(())).await;
    // `/metrics`, scraped over HTTP: the counters of all four runs, the gauges of the latest
    // (run 3: every node at 100 against the pinned 100), and the fleet.
    let text = scrape(f.metrics.clone()).await;
    let point = "concurrency=\"1\",gen_tokens=\"32\",metric=\"outputTokensPerS\",namespace=\"llm\"";
    for want in [
        "brink_sweep_runs_total{namespace=\"llm\",sweep=\"nightly\",verdict=\"Pass\"} 3".to_string(),
        "brink_sweep_runs_total{namespace=\"llm\",sweep=\"nightly\",verdict=\"Regressed\"} 1".to_string(),
        "brink_sweep_regressions_total{metric=\"outputTokensPerS\",namespace=\"llm\",node=\"spark-1\",sweep=\"nightly\"} 1".to_string(),
        // 70 where its peers made 100: also a fleet outlier in run 2.
        "brink_sweep_outliers_total{metric=\"outputTokensPerS\",namespace=\"llm\",node=\"spark-1\",sweep=\"nightly\"} 1".to_string(),
        "brink_sweep_node_verdict{namespace=\"llm\",node=\"spark-1\",sweep=\"nightly\",verdict=\"Pass\"} 1".to_string(),
        format!("brink_sweep_figure{{{point},node=\"spark-1\",prompt_tokens=\"128\",sweep=\"nightly\"}} 100"),
        format!("brink_sweep_baseline_figure{{{point},node=\"spark-1\",prompt_tokens=\"128\",sweep=\"nightly\"}} 100"),
        format!("brink_sweep_fleet_median{{{point},prompt_tokens=\"128\",sweep=\"nightly\"}} 100"),
        format!("brink_sweep_last_completion_timestamp_seconds{{namespace=\"llm\",sweep=\"nightly\"}} {}", times[3]),
        "brink_fleet_node_up{node=\"spark-2\"} 1".to_string(),
        format!("brink_fleet_node_qualified{{node=\"spark-3\",shape_class=\"{}\",state=\"qualified\"}} 1", common::CLASS),
        "brink_fleet_node_replicas{node=\"spark-1\"} 0".to_string(),
    ] {
        assert!(text.contains(&want), "{want} missing:\n{text}");
    }
    // Run 3 passed everywhere: no node shows another verdict any more.
    assert!(
        !text.contains("brink_sweep_node_verdict{namespace=\"llm\",node=\"spark-1\",sweep=\"nightly\",verdict=\"Regressed\"}"),
        "{text}"
    );
    f.stop().await;
}

/// Suspend and resume: a suspended sweep fires nothing across three schedule times;
/// resumed two minutes after the third, it fires once, for that latest missed time (within
/// `startingDeadlineSeconds`), not once per missed time.
#[tokio::test(start_paused = true)]
async fn a_resumed_sweep_fires_once_for_the_latest_missed_time() {
    let status = json!({ "lastScheduleTime": time_of(NOW_S - HOUR) });
    let mut f = Sweeps::start(sweep(json!({ "suspend": true, "startingDeadlineSeconds": 600 })), Some(status));
    // NOW_S itself is a schedule time: suspended, nothing fires, at it or at the next three.
    for i in 0..4 {
        f.advance(NOW_S + i * HOUR + 5).await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(f.runs().await.is_empty(), "a suspended sweep fired at hour {i}: {:?}", f.runs().await);
    }
    let cond = f.sweeps().get("nightly").await.expect("sweep").status.expect("status");
    let progressing = cond.conditions.iter().find(|c| c.type_ == "Progressing").expect("Progressing");
    assert_eq!(progressing.reason, "Suspended");

    // Resumed at 3 h + 2 min: one run, for 3 h.
    f.advance(NOW_S + 3 * HOUR + 120).await;
    f.suspend(false).await;
    let want = run_name("nightly", NOW_S + 3 * HOUR);
    let runs = f.until("one run after the resume", 120, |runs| (!runs.is_empty()).then(|| runs.clone())).await;
    assert_eq!(runs.keys().cloned().collect::<Vec<_>>(), std::slice::from_ref(&want));
    // Requeues and resyncs come and go within the hour: still that one run.
    f.poke().await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(f.runs().await.keys().cloned().collect::<Vec<_>>(), [want]);
    let s = f.sweeps().get("nightly").await.expect("sweep").status.expect("status");
    assert_eq!(s.last_schedule_time, Some(time_of(NOW_S + 3 * HOUR)));
    // The older times lie beyond the deadline: not even counted as missed.
    assert_eq!(f.events().await, ["RunCreated"]);
    f.stop().await;
}

/// Resumed after the deadline of the latest missed time (2 h, 15 min late): nothing fires until
/// the next time.
#[tokio::test(start_paused = true)]
async fn a_sweep_resumed_past_the_starting_deadline_waits_for_the_next_time() {
    let status = json!({ "lastScheduleTime": time_of(NOW_S - HOUR) });
    let mut f = Sweeps::start(sweep(json!({ "suspend": true, "startingDeadlineSeconds": 600 })), Some(status));
    f.advance(NOW_S + 2 * HOUR + 900).await;
    f.suspend(false).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(f.runs().await.is_empty(), "{:?}", f.runs().await);
    // The next schedule time fires as usual.
    f.advance(NOW_S + 3 * HOUR).await;
    let want = run_name("nightly", NOW_S + 3 * HOUR);
    f.until("the next firing", 120, |runs| runs.contains_key(&want).then_some(())).await;
    assert_eq!(f.runs().await.len(), 1);
    f.stop().await;
}

/// The run fired at `NOW_S` whose agents never report, then the next schedule time.
async fn run_still_going_at_the_next_time(policy: &str) -> (Sweeps, String, String) {
    let mut f = Sweeps::start(sweep(json!({ "concurrencyPolicy": policy })), None);
    let first = run_name("nightly", NOW_S);
    f.advance(NOW_S).await;
    f.until("the first run running", 120, |runs| (runs.get(&first) == Some(&RunPhase::Running)).then_some(())).await;
    f.advance(NOW_S + HOUR).await;
    (f, first, run_name("nightly", NOW_S + HOUR))
}

/// Forbid: with the previous run still going, the next firing starts nothing and
/// says why; once that run completes, the held firing starts (it is still within its deadline:
/// none is set).
#[tokio::test(start_paused = true)]
async fn forbid_holds_the_firing_while_a_run_is_going() {
    let (mut f, first, second) = run_still_going_at_the_next_time("Forbid").await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(f.runs().await, BTreeMap::from([(first.clone(), RunPhase::Running)]));
    assert!(f.events().await.iter().any(|r| r == "FiringSkipped"), "{:?}", f.events().await);
    f.agents_finish(&first, [100.0, 100.0, 100.0]).await;
    f.until("the held firing starts once the first run completes", 300, |runs| {
        (runs.get(&first) == Some(&RunPhase::Complete) && runs.contains_key(&second)).then_some(())
    })
    .await;
    f.poke().await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(f.runs().await.len(), 2);
    f.stop().await;
}

/// Replace: the next firing cancels the run still going and starts its own.
#[tokio::test(start_paused = true)]
async fn replace_cancels_the_run_still_going() {
    let (f, first, second) = run_still_going_at_the_next_time("Replace").await;
    let runs = f
        .until("the first run cancelled and the second started", 120, |runs| {
            (runs.get(&first) == Some(&RunPhase::Cancelled) && runs.get(&second).is_some_and(|p| *p != RunPhase::Cancelled))
                .then(|| runs.clone())
        })
        .await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    let cancelled: SweepRun = f.double.get(Some(NS), &first).expect("first run");
    assert!(cancelled.status.and_then(|s| s.message).is_some_and(|m| m.contains("Replace")), "the cancelled run says why");
    assert!(f.events().await.iter().any(|r| r == "RunCancelled"), "{:?}", f.events().await);
    let s = f.sweeps().get("nightly").await.expect("sweep").status.expect("status");
    assert_eq!(s.active, [second]);
    f.stop().await;
}
