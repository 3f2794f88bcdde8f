//! The `SweepRun` controller: moves a run through its nodes with [`progress::advance`] (node
//! liveness from the heartbeat Leases, resident replicas from the `ModelReplica` cache), judges
//! each node's `SweepResult` once it is in ([`judge`] against [`baseline_run`] from the sweep's
//! earlier runs) and writes its `status.judgement`, and once every node is final flags fleet
//! outliers ([`outliers`]) and writes the run's summary, with Events for every node that did
//! not pass.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{
    BaselineKind, Finding, Judgement, ModelReplica, NodeProgress, NodeRunState, ResultState, RunPhase, SweepResult, SweepResultSpec,
    SweepResultStatus, SweepRun, SweepRunStatus, SweepVerdict, result_name,
};
use brink_api::sweep::baseline::{PastResult, baseline_run};
use brink_api::sweep::judge::{NodeInput, judge, worst};
use brink_api::sweep::outliers::{NodeFigures, outliers};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, instrument, warn};

use super::context::{Context, FIELD_MANAGER};
use super::error::{Error, Result, api_code};
use super::events::publish;
use super::names::heartbeat_lease;
use super::sweep::{SweepContext, error_policy, is_active, runs_of, time_of};
use crate::decide::sweep::progress::{self, NodeNow, NodeStep, RunLimits};
use crate::decide::sweep::series::{JudgedNode, SweepSeries, series};
use crate::decide::sweep::summary::{self, NodeOutcome};

pub const CONTROLLER: &str = "sweeprun";

/// Lease duration assumed for a Lease that does not say (the agent's default).
const DEFAULT_LEASE_S: u64 = 40;

/// The node exists and its heartbeat does not say it is gone (an expiry within the grace is
/// tolerated, as for serving replicas).
pub fn node_alive(ctx: &Context, node: &str, now_s: u64) -> bool {
    if ctx.caches.nodes.get(&ObjectRef::<Node>::new(node)).is_none() {
        return false;
    }
    let lease = ctx.caches.leases.get(&ObjectRef::<Lease>::new(&heartbeat_lease(node)).within(&ctx.config.lease_namespace));
    let spec = lease.as_ref().and_then(|l| l.spec.clone()).unwrap_or_default();
    let renew_s = spec.renew_time.and_then(|t| u64::try_from(t.0.as_second()).ok());
    let duration = spec.lease_duration_seconds.and_then(|d| u64::try_from(d).ok()).unwrap_or(DEFAULT_LEASE_S);
    let policy = ctx.config.heartbeat;
    !ctx.heartbeats.observe(node, renew_s, duration, now_s, &policy).assess(now_s, &policy).evicts()
}

/// Serving replicas bound to `node` and not on their way out, except those of `measured`
/// (`(namespace, deployment)`: the deployment the run measures through its API, whose replicas
/// are what the sweep runs against, not load to drain).
pub fn resident_replicas(replicas: &[Arc<ModelReplica>], node: &str, measured: Option<(&str, &str)>) -> u32 {
    let n = replicas
        .iter()
        .filter(|r| r.spec.nodes().contains(&node) && r.metadata.deletion_timestamp.is_none())
        .filter(|r| measured.is_none_or(|(ns, d)| r.namespace().as_deref() != Some(ns) || r.spec.deployment != d))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The GPU model and compute capability: what "identical hardware" compares.
pub fn hardware_key(result: &SweepResultStatus) -> Option<String> {
    let fp = result.fingerprint.as_ref()?;
    Some(format!("{} (compute capability {})", fp.gpu_name, fp.compute_capability))
}

/// Adds the run's outlier findings for a node to its judgement: earlier outlier findings are
/// replaced (a retried completion computes them again), the verdict is the worst of all.
pub fn with_outliers(j: &Judgement, found: &[Finding]) -> Judgement {
    let mut findings: Vec<Finding> = j.findings.iter().filter(|f| f.verdict != SweepVerdict::Outlier).cloned().collect();
    findings.extend(found.iter().cloned());
    Judgement { verdict: worst(&findings), baseline_run: j.baseline_run.clone(), findings }
}

/// The run's status: per-node progress and, once every node is final, the summary.
pub fn run_status(
    prev: &SweepRunStatus,
    steps: &[NodeStep],
    judgements: &BTreeMap<String, Judgement>,
    baseline: Option<String>,
    now: &Time,
) -> SweepRunStatus {
    let complete = progress::complete(steps);
    let prev_message = |node: &str| prev.nodes.iter().find(|p| p.node == node).and_then(|p| p.message.clone());
    let nodes: Vec<NodeProgress> = steps
        .iter()
        .map(|s| NodeProgress {
            node: s.node.clone(),
            state: s.state,
            started_at: s.started_s.map(time_of),
            verdict: judgements.get(&s.node).map(|j| j.verdict),
            message: s.message.clone().or_else(|| prev_message(&s.node)),
        })
        .collect();
    let outcomes: Vec<NodeOutcome> = nodes.iter().map(|n| NodeOutcome { state: n.state, verdict: n.verdict }).collect();
    let counts = summary::counts(&outcomes);
    let started = steps.iter().any(|s| s.state != NodeRunState::Waiting);
    let mut status = SweepRunStatus {
        phase: if complete {
            RunPhase::Complete
        } else if started {
            RunPhase::Running
        } else {
            RunPhase::Pending
        },
        start_time: prev.start_time.clone().or_else(|| started.then(|| now.clone())),
        completion_time: None,
        nodes,
        verdict: None,
        counts,
        baseline_run: baseline,
        findings: Vec::new(),
        message: None,
        conditions: prev.conditions.clone(),
    };
    if complete {
        status.completion_time = Some(prev.completion_time.clone().unwrap_or_else(|| now.clone()));
        status.verdict = summary::verdict(&outcomes);
        status.findings = summary::top_findings(judgements.values().flat_map(|j| j.findings.iter().cloned()).collect());
        status.message = Some(summary::message(&counts));
    } else {
        let done = steps.iter().filter(|s| s.state.is_final()).count();
        status.message = Some(format!("{done} of {} nodes final", steps.len()));
    }
    status
}

/// The one baseline run shown on the run: the pinned one, or the one every judged node shares.
fn shared_baseline(run: &SweepRun, judgements: &BTreeMap<String, Judgement>) -> Option<String> {
    if run.spec.baseline.policy == BaselineKind::Pinned {
        return run.spec.baseline.pinned_run.clone();
    }
    let mut runs = judgements.values().map(|j| j.baseline_run.clone());
    let first = runs.next()??;
    runs.all(|b| b.as_deref() == Some(first.as_str())).then_some(first)
}

#[instrument(skip_all, fields(namespace = run.namespace().unwrap_or_default(), run = run.name_any()))]
pub async fn reconcile(run: Arc<SweepRun>, ctx: Arc<SweepContext>) -> Result<Action> {
    let _timer = ctx.base.metrics.reconcile(CONTROLLER);
    let result = reconcile_inner(&run, &ctx).await;
    if let Err(e) = &result {
        ctx.base.metrics.error(CONTROLLER, e.kind());
        publish(&ctx.base, &run.object_ref(&()), None, EventType::Warning, "ReconcileFailed", "Reconcile", e.to_string()).await;
    }
    result
}

/// The run's `brink_sweep_*` series from its judgements and the figures of its results and
/// their baselines (read from the cache).
pub fn run_series(sctx: &SweepContext, ns: &str, run: &str, judgements: &BTreeMap<String, Judgement>) -> SweepSeries {
    let result = |run: &str, node: &str| sctx.sweeps.results.get(&ObjectRef::new(&result_name(run, node)).within(ns));
    // Per node: its judgement, its result and its baseline's result.
    type Held<'a> = (&'a str, &'a Judgement, Option<Arc<SweepResult>>, Option<Arc<SweepResult>>);
    let held: Vec<Held<'_>> = judgements
        .iter()
        .map(|(node, j)| (node.as_str(), j, result(run, node), j.baseline_run.as_deref().and_then(|b| result(b, node))))
        .collect();
    let status = |r: &Option<Arc<SweepResult>>| r.as_ref().and_then(|r| r.status.clone());
    let figures: Vec<(Option<String>, Option<SweepResultStatus>, Option<SweepResultStatus>)> =
        held.iter().map(|(_, _, r, b)| (status(r).as_ref().and_then(hardware_key), status(r), status(b))).collect();
    let nodes: Vec<JudgedNode<'_>> = held
        .iter()
        .zip(&figures)
        .map(|((node, j, _, _), (key, mine, base))| JudgedNode {
            node,
            judgement: j,
            figures: key.as_deref().zip(mine.as_ref().map(|s| s.points.as_slice())),
            baseline: base.as_ref().map_or(&[], |s| s.points.as_slice()),
        })
        .collect();
    series(&nodes)
}

/// After a restart the sweep gauges are empty until a run completes: a complete run that is
/// its sweep's latest shows its series again (counters are not replayed).
fn show_if_latest(run: &SweepRun, sctx: &SweepContext) {
    let (Some(ns), Some(status)) = (run.namespace(), run.status.as_ref()) else { return };
    let name = run.name_any();
    let metrics = &sctx.base.metrics;
    if status.phase != RunPhase::Complete || metrics.latest_sweep_run(&ns, &run.spec.sweep).as_deref() == Some(name.as_str()) {
        return;
    }
    let latest = runs_of(&sctx.sweeps.runs, &ns, &run.spec.sweep)
        .into_iter()
        .filter(|r| r.status.as_ref().is_some_and(|s| s.phase == RunPhase::Complete))
        .max_by_key(|r| r.status.as_ref().and_then(|s| s.completion_time.as_ref()).map(|t| t.0.as_second()));
    if latest.is_none_or(|l| l.name_any() != name) {
        return;
    }
    let judgements: BTreeMap<String, Judgement> = run
        .spec
        .nodes
        .iter()
        .filter_map(|node| {
            let r = sctx.sweeps.results.get(&ObjectRef::new(&result_name(&name, node)).within(&ns))?;
            Some((node.clone(), r.status.as_ref()?.judgement.clone()?))
        })
        .collect();
    let completed_s = status.completion_time.as_ref().map_or(0, |t| t.0.as_second());
    metrics.sweep_run_latest(&ns, &run.spec.sweep, &name, completed_s, run_series(sctx, &ns, &name, &judgements));
}

async fn reconcile_inner(run: &SweepRun, sctx: &SweepContext) -> Result<Action> {
    if !is_active(run) {
        show_if_latest(run, sctx);
        return Ok(Action::await_change());
    }
    let ctx = &sctx.base;
    let ns = run.namespace().ok_or_else(|| Error::MissingField { kind: "SweepRun", name: run.name_any(), field: "metadata.namespace" })?;
    let name = run.name_any();
    let now = Time(ctx.clock.now());
    let now_s = now.0.as_second();
    let prev = run.status.clone().unwrap_or_default();
    let result_of = |run_name: &str, node: &str| sctx.sweeps.results.get(&ObjectRef::new(&result_name(run_name, node)).within(&ns));

    let replicas = ctx.caches.replicas.state();
    let inputs: Vec<NodeNow> = run
        .spec
        .nodes
        .iter()
        .map(|node| {
            let was = prev.nodes.iter().find(|p| p.node == *node);
            NodeNow {
                node: node.clone(),
                state: was.map_or(NodeRunState::Waiting, |p| p.state),
                started_s: was.and_then(|p| p.started_at.as_ref()).map(|t| t.0.as_second()),
                alive: node_alive(ctx, node, u64::try_from(now_s).unwrap_or(0)),
                resident_replicas: resident_replicas(&replicas, node, run.spec.deployment.as_deref().map(|d| (ns.as_str(), d))),
                result: result_of(&name, node).and_then(|r| r.status.as_ref().map(|s| s.state)),
            }
        })
        .collect();
    let limits = RunLimits {
        max_concurrent_nodes: run.spec.max_concurrent_nodes,
        drain_replicas: run.spec.drain_replicas,
        node_timeout_s: run.spec.node_timeout_seconds,
    };
    let steps = progress::advance(&inputs, limits, now_s);

    // Earlier runs' judged results: what the baselines are chosen from.
    let scheduled_s = run.spec.scheduled_time.0.as_second();
    let earlier: Vec<Arc<SweepRun>> =
        runs_of(&sctx.sweeps.runs, &ns, &run.spec.sweep).into_iter().filter(|r| r.name_any() != name).collect();
    let history: Vec<PastResult> = earlier
        .iter()
        .flat_map(|r| {
            let run_name = r.name_any();
            let at = r.spec.scheduled_time.0.as_second();
            r.spec.nodes.iter().map(move |node| (run_name.clone(), at, node.clone()))
        })
        .filter_map(|(run_name, at, node)| {
            let verdict = result_of(&run_name, &node)?.status.as_ref()?.judgement.as_ref().map(|j| j.verdict);
            Some(PastResult { run: run_name, scheduled_s: at, node, verdict })
        })
        .collect();

    let mut judgements: BTreeMap<String, Judgement> = BTreeMap::new();
    for step in steps.iter().filter(|s| s.state.is_final() && s.state != NodeRunState::Skipped) {
        let result = result_of(&name, &step.node);
        let status = result.as_ref().and_then(|r| r.status.as_ref());
        if let Some(j) = status.and_then(|s| s.judgement.clone()) {
            judgements.insert(step.node.clone(), j);
            continue;
        }
        let base_run = baseline_run(run.spec.baseline.policy, run.spec.baseline.pinned_run.as_deref(), &step.node, scheduled_s, &history)
            .map(String::from);
        let base = base_run.as_deref().and_then(|b| result_of(b, &step.node));
        let message = step.message.clone().or_else(|| prev.nodes.iter().find(|p| p.node == step.node).and_then(|p| p.message.clone()));
        let (verdict, findings) = judge(&NodeInput {
            node: &step.node,
            state: step.state,
            message: message.as_deref(),
            result: status,
            baseline: base.as_ref().and_then(|b| b.status.as_ref()),
            tolerance: run.spec.baseline.tolerance,
        });
        let j = Judgement { verdict, baseline_run: base_run, findings };
        if result.is_some() {
            write_judgement(ctx, &ns, &result_name(&name, &step.node), &j).await?;
        } else {
            // Lost or timed out before its agent wrote anything: the result says so itself.
            let why = message.as_deref().unwrap_or("the node ended without a result");
            record_missing(ctx, run, &ns, &step.node, why, &j).await?;
        }
        judgements.insert(step.node.clone(), j);
    }

    let complete = progress::complete(&steps);
    let mut newly_flagged = Vec::new();
    if complete {
        let results: Vec<(String, Arc<SweepResult>)> = steps
            .iter()
            .filter(|s| s.state == NodeRunState::Done)
            .filter_map(|s| Some((s.node.clone(), result_of(&name, &s.node)?)))
            .collect();
        let keyed: Vec<(String, &[brink_api::crd::PointFigures], String)> = results
            .iter()
            .filter_map(|(node, r)| {
                let st = r.status.as_ref()?;
                Some((node.clone(), st.points.as_slice(), hardware_key(st)?))
            })
            .collect();
        let figures: Vec<NodeFigures<'_>> =
            keyed.iter().map(|(node, points, hw)| NodeFigures { node: node.as_str(), hardware: hw.as_str(), points }).collect();
        let found = outliers(&figures, run.spec.baseline.outlier_tolerance_percent);
        for (node, j) in judgements.iter_mut() {
            let mine: Vec<Finding> = found.iter().filter(|f| f.node == *node).cloned().collect();
            let had = j.findings.iter().any(|f| f.verdict == SweepVerdict::Outlier);
            if mine.is_empty() && !had {
                continue;
            }
            let next = with_outliers(j, &mine);
            if next != *j {
                write_judgement(ctx, &ns, &result_name(&name, node), &next).await?;
                *j = next;
            }
            if !mine.is_empty() {
                newly_flagged.push(node.clone());
            }
        }
    }

    let status = run_status(&prev, &steps, &judgements, shared_baseline(run, &judgements), &now);
    if status != prev {
        let patch = json!({
            "apiVersion": "brink.dev/v1alpha1",
            "kind": "SweepRun",
            "metadata": { "name": name },
            "status": status,
        });
        Api::<SweepRun>::namespaced(ctx.client.clone(), &ns)
            .patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
            .await
            .map_err(|e| Error::kube(format!("writing the status of SweepRun {ns}/{name}"), e))?;
    }

    if complete {
        let completed_s = status.completion_time.as_ref().map_or(now_s, |t| t.0.as_second());
        let series = run_series(sctx, &ns, &name, &judgements);
        ctx.metrics.sweep_run_completed(&ns, &run.spec.sweep, &name, status.verdict, completed_s, series);
        announce(ctx, run, &ns, &status, &judgements).await;
        info!(verdict = ?status.verdict, outliers = newly_flagged.len(), "sweep run complete");
        return Ok(Action::await_change());
    }
    // Heartbeats expire without any event: look again within the resync, or at the next timeout.
    let resync = Duration::from_secs(ctx.config.resync_seconds.max(1));
    let deadline = progress::next_deadline_s(&steps, limits).map(|t| Duration::from_secs(u64::try_from(t - now_s).unwrap_or(0).max(1)));
    Ok(Action::requeue(deadline.map_or(resync, |d| d.min(resync))))
}

/// Applies `status.judgement` of one result, and only that field: the agent owns the rest.
async fn write_judgement(ctx: &Context, ns: &str, result: &str, j: &Judgement) -> Result<()> {
    let patch = json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "SweepResult",
        "metadata": { "name": result },
        "status": { "judgement": j },
    });
    Api::<SweepResult>::namespaced(ctx.client.clone(), ns)
        .patch_status(result, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(|e| Error::kube(format!("writing the judgement of SweepResult {ns}/{result}"), e))?;
    Ok(())
}

/// Creates the result of a node that never wrote one (owned by the run, like the agents'), then
/// its status: `Failed`, why, and the judgement. A result that appears meanwhile is the agent's:
/// it is left alone and judged on the next reconcile.
async fn record_missing(ctx: &Context, run: &SweepRun, ns: &str, node: &str, why: &str, j: &Judgement) -> Result<()> {
    let run_name = run.name_any();
    let name = result_name(&run_name, node);
    let mut r = SweepResult::new(&name, SweepResultSpec { run: run_name, node: node.to_string() });
    r.metadata.namespace = Some(ns.to_string());
    r.metadata.owner_references = run.controller_owner_ref(&()).map(|o| vec![o]);
    let api: Api<SweepResult> = Api::namespaced(ctx.client.clone(), ns);
    match api.create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() }, &r).await {
        Ok(_) => {}
        Err(e) if api_code(&e) == Some(409) => return Ok(()),
        Err(e) => return Err(Error::kube(format!("creating SweepResult {ns}/{name} for a node without one"), e)),
    }
    let patch = json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "SweepResult",
        "metadata": { "name": name },
        "status": { "state": ResultState::Failed, "error": why, "judgement": j },
    });
    api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(|e| Error::kube(format!("writing the status of SweepResult {ns}/{name}"), e))?;
    Ok(())
}

fn result_ref(ns: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("brink.dev/v1alpha1".into()),
        kind: Some("SweepResult".into()),
        namespace: Some(ns.into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

/// One Warning per node that did not pass (its worst finding), then the run's verdict.
async fn announce(ctx: &Context, run: &SweepRun, ns: &str, status: &SweepRunStatus, judgements: &BTreeMap<String, Judgement>) {
    let on = run.object_ref(&());
    for (node, j) in judgements.iter().filter(|(_, j)| !j.verdict.passed()) {
        let worst_first = summary::top_findings(j.findings.clone());
        let what = worst_first.first().map_or_else(|| "no finding recorded".to_string(), |f| f.message.clone());
        let reason = format!("{:?}", j.verdict);
        let related = Some(result_ref(ns, &result_name(&run.name_any(), node)));
        publish(ctx, &on, related, EventType::Warning, &reason, "Judge", format!("node {node}: {what}")).await;
    }
    let verdict = status.verdict.map_or_else(|| "no verdict".to_string(), |v| format!("{v:?}"));
    let type_ = if status.verdict.is_none_or(SweepVerdict::passed) { EventType::Normal } else { EventType::Warning };
    let note = format!("{verdict}: {}", status.message.clone().unwrap_or_default());
    publish(ctx, &on, None, type_, "RunComplete", "Judge", note).await;
}

/// The `SweepRun` controller; a result's change requeues its run.
pub(super) async fn controller(sctx: Arc<SweepContext>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let c = sctx.base.client.clone();
    let wc = watcher::Config::default().any_semantic();
    Controller::new(Api::<SweepRun>::all(c.clone()), wc.clone())
        .watches(Api::<SweepResult>::all(c), wc, |r: SweepResult| {
            r.namespace().map(|ns| ObjectRef::<SweepRun>::new(&r.spec.run).within(&ns))
        })
        .graceful_shutdown_on(shutdown)
        .run(|r, c| super::traced(CONTROLLER, reconcile, r, c), error_policy, sctx)
        .for_each(|r| {
            if let Err(e) = r {
                warn!(error = %e, "sweep run controller");
            }
            futures::future::ready(())
        })
        .await;
    info!("sweep run controller stopped");
}
