//! The `RegressionSweep` controller: asks [`schedule::decide`] whether a firing is due, creates
//! the `SweepRun` it stands for (a snapshot of the sweep and the nodes its selector picks now),
//! cancels runs under `Replace`, prunes old runs with [`history::prune`] (never a baseline), and
//! writes the sweep's status. Events say why a due firing did not start. [`run`] starts this
//! controller and the `SweepRun` one ([`super::sweep_run`]) with the caches they share.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{
    ConditionStatus, ConditionType, ModelReplica, RegressionSweep, RegressionSweepStatus, RunPhase, SparkNode, SweepResult, SweepRun,
    SweepRunSpec, SweepRunStatus, SweepVerdict, condition, set_condition,
};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, instrument, warn};

use super::context::{Context, FIELD_MANAGER};
use super::error::{Error, Result, api_code};
use super::events::publish;
use crate::decide::sweep::history::{self, FinishedRun};
use crate::decide::sweep::schedule::{self, Schedule, ScheduleInput, Skip};
use crate::decide::sweep::summary;

pub const CONTROLLER: &str = "regressionsweep";

/// Extra self-test cases a run takes from the stalls seen in serving (the CRD's limit).
const MAX_EXTRA_CASES: usize = 64;
/// How often a sweep is looked at when its schedule names no future time (30 February).
const IDLE_RECHECK: Duration = Duration::from_secs(3600);

/// The caches of the sweep kinds, beside the operator's [`super::Caches`].
#[derive(Clone)]
pub struct SweepCaches {
    pub runs: Store<SweepRun>,
    pub results: Store<SweepResult>,
}

/// What the sweep reconciles share: the operator's context and the sweep caches.
pub struct SweepContext {
    pub base: Arc<Context>,
    pub sweeps: SweepCaches,
}

fn secs(t: &Time) -> i64 {
    t.0.as_second()
}

/// A Kubernetes time from Unix seconds (the epoch for one out of range).
pub fn time_of(s: i64) -> Time {
    Time(Timestamp::from_second(s).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The sweep's runs in `namespace`, oldest schedule first.
pub fn runs_of(runs: &Store<SweepRun>, namespace: &str, sweep: &str) -> Vec<Arc<SweepRun>> {
    let mut out: Vec<Arc<SweepRun>> =
        runs.state().into_iter().filter(|r| r.namespace().as_deref() == Some(namespace) && r.spec.sweep == sweep).collect();
    out.sort_by_key(|r| (secs(&r.spec.scheduled_time), r.name_any()));
    out
}

fn phase(run: &SweepRun) -> RunPhase {
    run.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// A run that is neither complete nor cancelled.
pub fn is_active(run: &SweepRun) -> bool {
    !matches!(phase(run), RunPhase::Complete | RunPhase::Cancelled)
}

/// Nodes a sweep selects: those with an agent (a `SparkNode`) whose `Node` carries every label
/// of the selector, sorted by name.
pub fn select_nodes(selector: &BTreeMap<String, String>, nodes: &[Arc<Node>], spark_nodes: &[Arc<SparkNode>]) -> Vec<String> {
    let agents: BTreeSet<String> = spark_nodes.iter().map(|s| s.name_any()).collect();
    let mut out: Vec<String> = nodes
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .filter(|n| selector.iter().all(|(k, v)| n.labels().get(k) == Some(v)))
        .map(|n| n.name_any())
        .filter(|n| agents.contains(n))
        .collect();
    out.sort();
    out
}

/// Of `selected`, the nodes a sweep of `deployment`'s replicas measures: those where one of its
/// replicas (namespace `ns`, not being deleted) has its node (a gang's leader node: its engine's
/// API is served there).
pub fn deployment_nodes(selected: Vec<String>, ns: Option<&str>, deployment: &str, replicas: &[Arc<ModelReplica>]) -> Vec<String> {
    let hosts: BTreeSet<&str> = replicas
        .iter()
        .filter(|r| r.namespace().as_deref() == ns && r.spec.deployment == deployment && r.metadata.deletion_timestamp.is_none())
        .map(|r| r.spec.node.as_str())
        .collect();
    selected.into_iter().filter(|n| hosts.contains(n.as_str())).collect()
}

/// The run a firing at `scheduled_s` creates: the sweep's settings as they are now, the
/// selected nodes, and the stall shapes seen in serving since the previous firing.
pub fn run_spec(sweep: &RegressionSweep, scheduled_s: i64, nodes: Vec<String>, replicas: &[Arc<ModelReplica>]) -> SweepRunSpec {
    let s = &sweep.spec;
    let ns = sweep.namespace();
    let since = sweep.status.as_ref().and_then(|st| st.last_schedule_time.as_ref()).map_or(i64::MIN, secs);
    let stalls: Vec<(String, brink_api::crd::StallReport)> = replicas
        .iter()
        .filter(|r| r.namespace() == ns)
        .filter_map(|r| {
            let stall = r.status.as_ref()?.last_stall.clone()?;
            Some((format!("{}/{}", r.namespace().unwrap_or_default(), r.name_any()), stall))
        })
        .collect();
    SweepRunSpec {
        sweep: sweep.name_any(),
        scheduled_time: time_of(scheduled_s),
        model: s.model_ref.name.clone(),
        nodes,
        deployment: s.deployment_ref.as_ref().map(|d| d.name.clone()),
        workload: s.workload.clone(),
        self_test: s.self_test,
        baseline: s.baseline.clone(),
        max_concurrent_nodes: s.max_concurrent_nodes,
        drain_replicas: s.drain_replicas,
        node_timeout_seconds: s.node_timeout_seconds,
        extra_cases: summary::stall_cases(&stalls, since, MAX_EXTRA_CASES),
    }
}

/// The runs still compared with: every node's `baselineRun` in the sweep's results, and the
/// pinned run.
pub fn baselines(sweep: &RegressionSweep, runs: &[Arc<SweepRun>], results: &[Arc<SweepResult>]) -> BTreeSet<String> {
    let ns = sweep.namespace();
    let ours: BTreeSet<String> = runs.iter().map(|r| r.name_any()).collect();
    let mut out: BTreeSet<String> = results
        .iter()
        .filter(|r| r.namespace() == ns && ours.contains(&r.spec.run))
        .filter_map(|r| r.status.as_ref()?.judgement.as_ref()?.baseline_run.clone())
        .collect();
    out.extend(sweep.spec.baseline.pinned_run.clone());
    out
}

/// The runs to delete: finished runs beyond the history limits, except the baselines of the
/// runs that stay (and the pinned run). Only the kept runs' baselines count: with LastPassing
/// every run's results name the run before, and protecting the baselines of runs that are
/// themselves pruned would keep that whole chain, so nothing would ever be pruned.
pub fn prune_runs(sweep: &RegressionSweep, runs: &[Arc<SweepRun>], results: &[Arc<SweepResult>]) -> Vec<String> {
    let (keep_passed, keep_other) = (sweep.spec.successful_runs_history_limit, sweep.spec.failed_runs_history_limit);
    let done = finished(runs);
    let pinned: BTreeSet<String> = sweep.spec.baseline.pinned_run.iter().cloned().collect();
    let beyond = history::prune(&done, keep_passed, keep_other, &pinned);
    let kept: Vec<Arc<SweepRun>> = runs.iter().filter(|r| !beyond.contains(&r.name_any())).cloned().collect();
    history::prune(&done, keep_passed, keep_other, &baselines(sweep, &kept, results))
}

/// Finished runs as the pruning sees them. A run without a verdict (cancelled, or nothing
/// swept) counts against the failed-runs limit: it is not a passing run.
pub fn finished(runs: &[Arc<SweepRun>]) -> Vec<FinishedRun> {
    runs.iter()
        .filter(|r| !is_active(r))
        .map(|r| FinishedRun {
            name: r.name_any(),
            scheduled_s: secs(&r.spec.scheduled_time),
            verdict: r.status.as_ref().and_then(|s| s.verdict).unwrap_or(SweepVerdict::Failed),
        })
        .collect()
}

/// The sweep's status from its runs after this reconcile's writes.
pub fn sweep_status(
    sweep: &RegressionSweep,
    runs: &[Arc<SweepRun>],
    last_schedule_s: Option<i64>,
    invalid: Option<&str>,
    now: Time,
) -> Result<RegressionSweepStatus> {
    let mut status = sweep.status.clone().unwrap_or_default();
    let generation = sweep.metadata.generation;
    status.observed_generation = generation;
    status.last_schedule_time = last_schedule_s.map(time_of);
    status.active = runs.iter().filter(|r| is_active(r)).map(|r| r.name_any()).collect();
    status.last_run = runs.last().map(|r| r.name_any());
    let done = |r: &&Arc<SweepRun>| phase(r) == RunPhase::Complete;
    let latest_done = runs.iter().rev().find(done);
    status.last_verdict = latest_done.and_then(|r| r.status.as_ref()?.verdict);
    if let Some(t) = runs
        .iter()
        .rev()
        .filter(done)
        .find(|r| r.status.as_ref().and_then(|s| s.verdict) == Some(SweepVerdict::Pass))
        .and_then(|r| r.status.as_ref()?.completion_time.clone())
    {
        status.last_successful_time = Some(t);
    }
    let (progressing, reason, message) = match (&status.active[..], sweep.spec.suspend) {
        ([], true) => (false, "Suspended", "spec.suspend is true: no new runs".to_string()),
        ([], false) => (false, "Idle", "no run active".to_string()),
        (active, _) => (true, "RunActive", format!("active: {}", active.join(", "))),
    };
    set_condition(
        &mut status.conditions,
        condition(ConditionType::Progressing, ConditionStatus::from(progressing), reason, message, generation, now.clone())?,
    );
    let degraded = match (invalid, latest_done.and_then(|r| r.status.as_ref())) {
        (Some(why), _) => (true, "InvalidSchedule", why.to_string()),
        (None, Some(s)) if s.verdict.is_some_and(|v| !v.passed()) => {
            (true, "LastRunNotPassed", format!("{}: {}", latest_done.map(|r| r.name_any()).unwrap_or_default(), message_of(s)))
        }
        _ => (false, "AsExpected", "the latest complete run passed (or none has completed)".to_string()),
    };
    set_condition(
        &mut status.conditions,
        condition(ConditionType::Degraded, ConditionStatus::from(degraded.0), degraded.1, degraded.2, generation, now)?,
    );
    Ok(status)
}

fn message_of(s: &SweepRunStatus) -> String {
    s.message.clone().unwrap_or_else(|| summary::message(&s.counts))
}

#[instrument(skip_all, fields(namespace = sweep.namespace().unwrap_or_default(), sweep = sweep.name_any()))]
pub async fn reconcile(sweep: Arc<RegressionSweep>, ctx: Arc<SweepContext>) -> Result<Action> {
    let _timer = ctx.base.metrics.reconcile(CONTROLLER);
    let result = reconcile_inner(&sweep, &ctx).await;
    if let Err(e) = &result {
        ctx.base.metrics.error(CONTROLLER, e.kind());
        publish(&ctx.base, &sweep.object_ref(&()), None, EventType::Warning, "ReconcileFailed", "Reconcile", e.to_string()).await;
    }
    result
}

async fn reconcile_inner(sweep: &RegressionSweep, sctx: &SweepContext) -> Result<Action> {
    let ctx = &sctx.base;
    let ns = sweep.namespace().ok_or_else(|| Error::MissingField {
        kind: "RegressionSweep",
        name: sweep.name_any(),
        field: "metadata.namespace",
    })?;
    let name = sweep.name_any();
    let now = ctx.clock.now();
    let now_s = now.as_second();
    let on = sweep.object_ref(&());
    let mut runs = runs_of(&sctx.sweeps.runs, &ns, &name);
    let mut last_schedule_s = sweep.status.as_ref().and_then(|s| s.last_schedule_time.as_ref()).map(secs);

    let parsed = Schedule::parse(&sweep.spec.schedule);
    let mut requeue = IDLE_RECHECK;
    if let Ok(sched) = &parsed {
        let active: Vec<String> = runs.iter().filter(|r| is_active(r)).map(|r| r.name_any()).collect();
        let input = ScheduleInput {
            schedule: sched,
            policy: sweep.spec.concurrency_policy,
            starting_deadline_s: sweep.spec.starting_deadline_seconds,
            suspend: sweep.spec.suspend,
            created_s: sweep.metadata.creation_timestamp.as_ref().map_or(now_s, secs),
            last_schedule_s,
            active: &active,
            now_s,
        };
        let d = schedule::decide(&input);
        if let Some(next) = d.next_s {
            requeue = Duration::from_secs(u64::try_from(next - now_s).unwrap_or(0).max(1));
        }
        if d.missed > 0 {
            let note = format!(
                "{} schedule time(s) missed (the operator was down or runs were forbidden); only the latest is considered",
                d.missed
            );
            publish(ctx, &on, None, EventType::Warning, "MissedSchedules", "Schedule", note).await;
        }
        match &d.skipped {
            None => {}
            // No Event: a suspended sweep is what the user asked for.
            Some(Skip::Suspended) => {}
            Some(Skip::Forbidden { active }) => {
                let note = format!("a firing is due but concurrencyPolicy is Forbid and {} still active", active.join(", "));
                publish(ctx, &on, None, EventType::Warning, "FiringSkipped", "Schedule", note).await;
                // Retried until the run ends (its completion requeues) or the deadline passes.
                requeue = requeue.min(Duration::from_secs(ctx.config.resync_seconds.max(1)));
            }
            Some(Skip::MissedDeadline { scheduled_s, late_s }) => {
                let note = format!(
                    "the firing scheduled at {} is {late_s} s late, beyond startingDeadlineSeconds {}: not started",
                    time_of(*scheduled_s).0,
                    sweep.spec.starting_deadline_seconds.unwrap_or_default()
                );
                // `lastScheduleTime` stays the last firing that started a run (the CRD's meaning).
                publish(ctx, &on, None, EventType::Warning, "MissedSchedule", "Schedule", note).await;
            }
        }
        for victim in &d.cancel {
            let prev = runs.iter().find(|r| r.name_any() == *victim).and_then(|r| r.status.clone());
            cancel(ctx, &ns, victim, prev, &format!("replaced by a newer firing of {name} (concurrencyPolicy Replace)")).await?;
            publish(
                ctx,
                &on,
                None,
                EventType::Normal,
                "RunCancelled",
                "Replace",
                format!("run {victim} cancelled: a newer firing replaces it"),
            )
            .await;
            runs.retain(|r| r.name_any() != *victim);
        }
        if let Some(scheduled) = d.start {
            let run = create_run(sctx, sweep, &ns, scheduled).await?;
            last_schedule_s = Some(scheduled);
            runs.retain(|r| r.name_any() != run.name_any());
            runs.push(Arc::new(run));
        }
    }

    // History: finished runs beyond the limits, except baselines.
    let doomed = prune_runs(sweep, &runs, &sctx.sweeps.results.state());
    let api: Api<SweepRun> = Api::namespaced(ctx.client.clone(), &ns);
    for victim in &doomed {
        match api.delete(victim, &DeleteParams::background()).await {
            Ok(_) => info!(run = %victim, "pruned"),
            Err(e) if api_code(&e) == Some(404) => {}
            Err(e) => return Err(Error::kube(format!("deleting SweepRun {ns}/{victim}"), e)),
        }
    }
    runs.retain(|r| !doomed.contains(&r.name_any()));

    let invalid = parsed.as_ref().err().map(String::as_str);
    let status = sweep_status(sweep, &runs, last_schedule_s, invalid, Time(now))?;
    if sweep.status.as_ref() != Some(&status) {
        let patch = json!({
            "apiVersion": "brink.dev/v1alpha1",
            "kind": "RegressionSweep",
            "metadata": { "name": name },
            "status": status,
        });
        Api::<RegressionSweep>::namespaced(ctx.client.clone(), &ns)
            .patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
            .await
            .map_err(|e| Error::kube(format!("writing the status of RegressionSweep {ns}/{name}"), e))?;
    }
    if let Err(why) = parsed {
        return Err(Error::InvalidSpec { what: format!("RegressionSweep {ns}/{name}"), why });
    }
    Ok(Action::requeue(requeue))
}

/// Creates the firing's run; a run of that name already there is the same firing, retried
/// after a crash between the create and the status write.
async fn create_run(sctx: &SweepContext, sweep: &RegressionSweep, ns: &str, scheduled_s: i64) -> Result<SweepRun> {
    let ctx = &sctx.base;
    let caches = &ctx.caches;
    let name = schedule::run_name(&sweep.name_any(), scheduled_s);
    let mut nodes = select_nodes(&sweep.spec.node_selector, &caches.nodes.state(), &caches.spark_nodes.state());
    let replicas = caches.replicas.state();
    if let Some(d) = &sweep.spec.deployment_ref {
        nodes = deployment_nodes(nodes, Some(ns), &d.name, &replicas);
    }
    let spec = run_spec(sweep, scheduled_s, nodes, &replicas);
    let mut run = SweepRun::new(&name, spec);
    run.metadata.namespace = Some(ns.to_string());
    let owner = sweep.controller_owner_ref(&()).ok_or_else(|| Error::MissingField {
        kind: "RegressionSweep",
        name: sweep.name_any(),
        field: "metadata.uid",
    })?;
    run.metadata.owner_references = Some(vec![owner]);
    let api: Api<SweepRun> = Api::namespaced(ctx.client.clone(), ns);
    let on = sweep.object_ref(&());
    match api.create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() }, &run).await {
        Ok(created) => {
            let note = format!("run {name} over {} node(s) for {}", created.spec.nodes.len(), time_of(scheduled_s).0);
            info!(run = %name, nodes = created.spec.nodes.len(), "sweep fired");
            publish(ctx, &on, None, EventType::Normal, "RunCreated", "Schedule", note).await;
            Ok(created)
        }
        Err(e) if api_code(&e) == Some(409) => {
            warn!(run = %name, "the run exists already (a retried firing)");
            Ok(sctx.sweeps.runs.get(&ObjectRef::new(&name).within(ns)).map(|r| (*r).clone()).unwrap_or(run))
        }
        Err(e) => Err(Error::kube(format!("creating SweepRun {ns}/{name}"), e)),
    }
}

/// The status of a run cancelled now: what it had, with the phase, the time and why.
pub fn cancelled_status(prev: Option<SweepRunStatus>, now: Time, why: &str) -> SweepRunStatus {
    SweepRunStatus { phase: RunPhase::Cancelled, completion_time: Some(now), message: Some(why.to_string()), ..prev.unwrap_or_default() }
}

/// Marks a run cancelled (its results stay; the agents stop when they read the phase). The
/// apply carries the whole status: the run controller applies it as the same field manager,
/// and an apply of the phase alone would remove the progress of every node (server-side apply
/// drops what its manager leaves out), leaving a status without its required `nodes`.
async fn cancel(ctx: &Context, ns: &str, run: &str, prev: Option<SweepRunStatus>, why: &str) -> Result<()> {
    let patch = json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "SweepRun",
        "metadata": { "name": run },
        "status": cancelled_status(prev, Time(ctx.clock.now()), why),
    });
    match Api::<SweepRun>::namespaced(ctx.client.clone(), ns)
        .patch_status(run, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if api_code(&e) == Some(404) => Ok(()),
        Err(e) => Err(Error::kube(format!("cancelling SweepRun {ns}/{run}"), e)),
    }
}

/// Runs the sweep and run controllers until `shutdown`, with the caches they share; returns
/// when both have drained.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let shutdown = shutdown.shared();
    let c = ctx.client.clone();
    let (runs, f1) = super::cache(Api::<SweepRun>::all(c.clone()));
    let (results, f2) = super::cache(Api::<SweepResult>::all(c.clone()));
    let sctx = Arc::new(SweepContext { base: ctx, sweeps: SweepCaches { runs: runs.clone(), results: results.clone() } });
    let controllers = async move {
        // A shutdown while the caches still fill (CRDs missing, API server slow) ends this at once.
        let ready = futures::future::join(runs.wait_until_ready(), results.wait_until_ready());
        futures::pin_mut!(ready);
        if let futures::future::Either::Right(_) = futures::future::select(ready, shutdown.clone()).await {
            return;
        }
        futures::join!(sweeps(sctx.clone(), shutdown.clone()), super::sweep_run::controller(sctx, shutdown));
    };
    futures::pin_mut!(controllers);
    let feeds = futures::future::join(f1, f2);
    futures::pin_mut!(feeds);
    // The feeds never end by themselves: the controllers' drain ends both.
    futures::future::select(controllers, feeds).await;
}

/// Logs a failed reconcile and tries again after [`super::retry_after`].
pub(super) fn error_policy<K: Resource<DynamicType = ()>>(obj: Arc<K>, error: &Error, _ctx: Arc<SweepContext>) -> Action {
    warn!(object = obj.name_any(), %error, "reconcile failed");
    Action::requeue(super::retry_after(error))
}

async fn sweeps(sctx: Arc<SweepContext>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let c = sctx.base.client.clone();
    let wc = watcher::Config::default().any_semantic();
    Controller::new(Api::<RegressionSweep>::all(c.clone()), wc.clone())
        .owns(Api::<SweepRun>::all(c), wc)
        .graceful_shutdown_on(shutdown)
        .run(|s, c| super::traced(CONTROLLER, reconcile, s, c), error_policy, sctx)
        .for_each(|r| {
            if let Err(e) = r {
                warn!(error = %e, "regression sweep controller");
            }
            futures::future::ready(())
        })
        .await;
    info!("regression sweep controller stopped");
}
