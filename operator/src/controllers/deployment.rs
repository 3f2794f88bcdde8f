//! The `ModelDeployment` controller: maps the caches into the decisions' views, calls
//! `lifecycle`, `place` and `rollout`, and turns their answers into writes: new
//! `ModelReplica`s, deleted ones, ones recreated at another revision, shape classes asked of
//! unqualified nodes, the Service, Events and the status (`status.rollout` included).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{Model, ModelDeployment, ModelReplica, SparkNode};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, instrument, warn};

use super::context::{Context, FIELD_MANAGER};
use super::error::{Error, Result, api_code};
use super::events::{publish, replica_ref};
use super::names::heartbeat_lease;
use super::plan::{self, ClampedReplica, Outcome, ReplicaState};
use super::rollout::{self, Template};
use super::rollout_view;
use super::service;
use super::views;
use crate::decide::{self, NodeView, ReplicaView};

pub const CONTROLLER: &str = "modeldeployment";

/// Lease duration assumed for a Lease that does not say (the agent's default).
const DEFAULT_LEASE_S: u64 = 40;

/// Every node as the decisions see it now, its heartbeat observed at `now_s`.
pub fn node_views(ctx: &Context, now_s: u64, replicas: &[Arc<ModelReplica>]) -> Vec<NodeView> {
    let replicas: Vec<&ModelReplica> = replicas.iter().map(|r| r.as_ref()).filter(|r| r.metadata.deletion_timestamp.is_none()).collect();
    let nodes = ctx.caches.nodes.state();
    ctx.heartbeats.retain(|n| nodes.iter().any(|node| node.name_any() == n));
    let runs = ctx.caches.sweep_runs.state();
    let sweeping = views::sweeping_nodes(&runs.iter().map(|r| r.as_ref()).collect::<Vec<_>>());
    nodes
        .iter()
        .map(|node| {
            let name = node.name_any();
            let spark = ctx.caches.spark_nodes.get(&ObjectRef::<SparkNode>::new(&name));
            let lease = ctx.caches.leases.get(&ObjectRef::<Lease>::new(&heartbeat_lease(&name)).within(&ctx.config.lease_namespace));
            let spec = lease.as_ref().and_then(|l| l.spec.clone()).unwrap_or_default();
            let renew_s = spec.renew_time.and_then(|t| u64::try_from(t.0.as_second()).ok());
            let duration = spec.lease_duration_seconds.and_then(|d| u64::try_from(d).ok()).unwrap_or(DEFAULT_LEASE_S);
            let heartbeat = ctx.heartbeats.observe(&name, renew_s, duration, now_s, &ctx.config.heartbeat);
            NodeView { sweep: sweeping.get(&name).cloned(), ..views::node_view(node, spark.as_deref(), heartbeat, &replicas) }
        })
        .collect()
}

#[instrument(skip_all, fields(namespace = dep.namespace().unwrap_or_default(), deployment = dep.name_any()))]
pub async fn reconcile(dep: Arc<ModelDeployment>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let result = reconcile_inner(&dep, &ctx).await;
    if let Err(e) = &result {
        ctx.metrics.error(CONTROLLER, e.kind());
        publish(&ctx, &dep.object_ref(&()), None, EventType::Warning, "ReconcileFailed", "Reconcile", e.to_string()).await;
    }
    result
}

async fn reconcile_inner(dep: &ModelDeployment, ctx: &Context) -> Result<Action> {
    let ns = dep.namespace().ok_or_else(|| Error::MissingField {
        kind: "ModelDeployment",
        name: dep.name_any(),
        field: "metadata.namespace",
    })?;
    let name = dep.name_any();
    let dep_ref = ObjectRef::from_obj(dep);
    let now = ctx.clock.now();
    let now_s = ctx.now_s();
    let resync = Duration::from_secs(ctx.config.resync_seconds.max(1));

    service::apply(dep, ctx).await?;

    let all_replicas = ctx.caches.replicas.state();
    let ours: Vec<&ModelReplica> = all_replicas
        .iter()
        .map(|r| r.as_ref())
        .filter(|r| r.namespace().as_deref() == Some(ns.as_str()) && r.spec.deployment == name)
        .collect();
    // Names held by any replica in the namespace, also one being deleted: new names avoid them.
    let taken: BTreeSet<String> =
        all_replicas.iter().filter(|r| r.namespace().as_deref() == Some(ns.as_str())).map(|r| r.name_any()).collect();
    let live: Vec<&ModelReplica> = ours.iter().copied().filter(|r| r.metadata.deletion_timestamp.is_none()).collect();

    let model = ctx.caches.models.get(&ObjectRef::<Model>::new(&dep.spec.model_ref.name).within(&ns));
    let ready = match &model {
        None => Err(("ModelNotFound", format!("Model {ns}/{} does not exist", dep.spec.model_ref.name))),
        Some(m) => views::model_facts(m).map(|f| (m.clone(), f)).map_err(|msg| ("ModelNotReady", msg)),
    };
    let (model, facts) = match ready {
        Ok(found) => found,
        Err(blocked) => {
            // Nothing is placed or removed while the model is unknown; its arrival requeues.
            ctx.mark_unplaced(dep_ref, true);
            let outcome = Outcome {
                replicas: live.iter().map(|r| ReplicaState::of(r, None)).collect(),
                blocked: Some(blocked),
                clamped: live.iter().filter_map(|r| ClampedReplica::of(r)).collect(),
                // Nothing was decided: the last rollout status stands.
                rollout: dep.status.as_ref().and_then(|s| s.rollout.clone()),
                ..Outcome::default()
            };
            write_status(dep, ctx, &outcome, Time(now)).await?;
            return Ok(Action::requeue(resync));
        }
    };

    let revision = decide::revision(&model.spec, &dep.spec.engine);
    let view = views::deployment_view(dep, &facts, ctx.config.memory_reserve_bytes);
    let nodes = node_views(ctx, now_s, &all_replicas);
    let policy = ctx.config.heartbeat;

    // A replica serves only if its nodes (a gang's every member's) are there and their
    // heartbeats are not lost.
    let node_up = |name: &str| nodes.iter().find(|n| n.name == name).is_some_and(|n| !n.heartbeat.assess(now_s, &policy).evicts());
    let healthy_on_node =
        |r: &ReplicaView| r.healthy && node_up(&r.node) && r.gang.as_ref().is_none_or(|g| g.workers.iter().all(|w| node_up(w)));
    let current: Vec<ReplicaView> = live.iter().map(|r| views::replica_view(r)).collect();
    let healthy: BTreeSet<String> = current.iter().filter(|r| healthy_on_node(r)).map(|r| r.name.clone()).collect();

    // Replicas of every revision count: the rollout moves them between revisions in place.
    let life = decide::lifecycle(&view, &current, &nodes, now_s, &policy)?;
    let placement = decide::place(&view, &nodes, life.place, now_s, &policy)?;
    let decision = rollout::decide(dep, &revision, &live, &rollout::healthy_nodes(&nodes, now_s, &policy), now_s)?;
    // A gang member requests its share (the replica's memory over its nodes).
    let desired = Template { memory_bytes: Some(view.member_memory_bytes()?), ..Template::desired(dep, &revision) };

    // Qualification asked of nodes that never ran the class.
    for node in &placement.qualify {
        request_qualification(ctx, node, &facts.shape_class).await?;
    }

    // New replicas, at the revision the rollout allows: not an unproven one while a canary is out.
    let api: Api<ModelReplica> = Api::namespaced(ctx.client.clone(), &ns);
    let names = plan::free_names(&name, &taken, placement.assignments.len());
    let template = match placement.assignments.is_empty() {
        true => desired.clone(),
        false => rollout::template_for(&decision.new_replica_revision, &desired, &live)?,
    };
    let mut created = Vec::new();
    let mut stale_cache = false;
    for (assignment, replica_name) in placement.assignments.iter().zip(&names) {
        let replica = plan::new_replica(dep, replica_name, assignment, &template)?;
        match api.create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() }, &replica).await {
            Ok(r) => {
                ctx.metrics.placements.with_label_values(&[ns.as_str()]).inc();
                let limits = &assignment.limits;
                let clamp = if limits.max_batch_tokens < dep.spec.serving.max_batch_tokens {
                    format!(", clamped to {} batch tokens", limits.max_batch_tokens)
                } else {
                    String::new()
                };
                let gang = match &assignment.gang {
                    Some(g) => format!(" with workers {} (fabric {})", g.workers.join(", "), g.fabric),
                    None => String::new(),
                };
                info!(replica = %replica_name, node = %assignment.node, gang = %gang, "placed");
                publish(
                    ctx,
                    &dep.object_ref(&()),
                    Some(r.object_ref(&())),
                    EventType::Normal,
                    "Placed",
                    "Place",
                    format!("replica {replica_name} on node {}{gang}{clamp}", assignment.node),
                )
                .await;
                created.push(r);
            }
            // The name is taken: the replica cache is behind this reconcile's own writes.
            Err(e) if api_code(&e) == Some(409) => {
                warn!(replica = %replica_name, "replica exists already; the cache is behind, deciding again");
                stale_cache = true;
                break;
            }
            Err(e) => return Err(Error::kube(format!("creating ModelReplica {ns}/{replica_name}"), e)),
        }
    }
    if !created.is_empty() {
        for r in &life.replace {
            let why: Vec<String> = r.reasons.iter().map(ToString::to_string).collect();
            publish(
                ctx,
                &dep.object_ref(&()),
                Some(replica_ref(&ns, &r.replica)),
                EventType::Normal,
                "Replacing",
                "Replace",
                format!("replica {} on node {}: {}", r.replica, r.node, why.join("; ")),
            )
            .await;
        }
    }

    // Revision changes: each named replica deleted and created again, same name and node. One
    // that lifecycle takes out this pass is left to it (the next pass decides again).
    let leaving: BTreeSet<&str> = life.replace.iter().map(|r| r.replica.as_str()).chain(life.remove.iter().map(String::as_str)).collect();
    let mut recreated: Vec<ModelReplica> = Vec::new();
    for change in decision.recreate.iter().filter(|c| !leaving.contains(c.replica.as_str())) {
        let Some(old) = live.iter().find(|r| r.name_any() == change.replica) else { continue };
        let template = rollout::template_for(&change.revision, &desired, &live)?;
        match recreate(&api, old, &template).await? {
            Some(r) => {
                ctx.metrics.replacements.with_label_values(&["revision"]).inc();
                info!(replica = %change.replica, node = %change.node, revision = %change.revision, "recreated");
                publish(
                    ctx,
                    &dep.object_ref(&()),
                    Some(r.object_ref(&())),
                    EventType::Normal,
                    "Recreated",
                    "Rollout",
                    format!("replica {} on node {} at revision {}: {}", change.replica, change.node, change.revision, change.why),
                )
                .await;
                recreated.push(r);
            }
            None => stale_cache = true,
        }
    }

    // Removals: scale-down victims in the decided order (replaced replicas whose replacement
    // serves among them), and replicas a sweep drains where no replacement fits.
    let mut remove = plan::removable(&life.remove, &healthy, view.replicas);
    let drained = decide::drain_without_room(&life.replace, placement.unplaced);
    for victim in &drained {
        let node = life.replace.iter().find(|r| &r.replica == victim).map(|r| r.node.as_str()).unwrap_or_default();
        let run = life
            .replace
            .iter()
            .filter(|r| &r.replica == victim)
            .flat_map(|r| &r.reasons)
            .find_map(|why| match why {
                decide::Reason::SweepInProgress { run } => Some(run.as_str()),
                _ => None,
            })
            .unwrap_or_default();
        let note = format!(
            "replica {victim} on node {node} deleted without a replacement: no other node has room, and SweepRun {run} must not wait for one"
        );
        publish(ctx, &dep.object_ref(&()), Some(replica_ref(&ns, victim)), EventType::Warning, "DrainedWithoutReplacement", "Delete", note)
            .await;
        if !remove.contains(victim) {
            remove.push(victim.clone());
        }
    }
    let mut deleted = BTreeSet::new();
    for victim in &remove {
        match api.delete(victim, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(e) if api_code(&e) == Some(404) => {}
            Err(e) => return Err(Error::kube(format!("deleting ModelReplica {ns}/{victim}"), e)),
        }
        ctx.metrics.replacements.with_label_values(&["lifecycle"]).inc();
        publish(
            ctx,
            &dep.object_ref(&()),
            Some(replica_ref(&ns, victim)),
            EventType::Normal,
            "Deleted",
            "Delete",
            format!("replica {victim} (lifecycle)"),
        )
        .await;
        deleted.insert(victim.clone());
    }

    // The rollout's steps, each recorded once (the decision compares with the last status).
    for event in &decision.events {
        if let Err(e) = ctx.recorder.publish(&rollout_view::kube_event(event), &dep.object_ref(&())).await {
            warn!(reason = event.reason, error = %e, "could not write an Event");
        }
    }

    let unplaced = placement.unplaced > 0;
    ctx.metrics.unplaced.with_label_values(&[ns.as_str(), name.as_str()]).set(i64::try_from(placement.unplaced).unwrap_or(i64::MAX));
    ctx.mark_unplaced(dep_ref, unplaced);
    let was = dep
        .status
        .as_ref()
        .and_then(|s| brink_api::crd::find_condition(&s.conditions, brink_api::crd::ConditionType::Degraded).map(|c| c.message.clone()));
    if let Some(msg) = &placement.message
        && was.as_ref() != Some(msg)
    {
        publish(ctx, &dep.object_ref(&()), None, EventType::Warning, "Unplaced", "Place", msg.clone()).await;
    }

    // Ready means serving on a node that is there and whose heartbeat is not lost.
    let gone = |n: &str| deleted.contains(n) || recreated.iter().any(|r| r.name_any() == n);
    let mut states: Vec<ReplicaState> = live
        .iter()
        .filter(|r| !gone(&r.name_any()))
        .map(|r| ReplicaState { serving: healthy.contains(&r.name_any()), ..ReplicaState::of(r, Some(&revision)) })
        .collect();
    states.extend(created.iter().chain(&recreated).map(|r| ReplicaState::of(r, Some(&revision))));
    let outcome = Outcome {
        replicas: states,
        created: created.len() + recreated.len(),
        deleted: deleted.len() + recreated.len(),
        unplaced: placement.message.clone(),
        blocked: None,
        held: life.held.iter().map(|h| h.replica.clone()).collect(),
        failing: failing_pods(&live, &gone),
        not_qualified: not_qualified(&live, &gone),
        clamped: live.iter().filter(|r| !gone(&r.name_any())).filter_map(|r| ClampedReplica::of(r)).collect(),
        rollout: Some(decision.status.clone()),
        rollout_condition: Some(rollout_view::rollout_condition(&decision.condition, dep.metadata.generation, Time(now))?),
    };
    write_status(dep, ctx, &outcome, Time(now)).await?;

    let recheck = [life.recheck_in_s, decision.recheck_in_s].into_iter().flatten().min();
    let requeue = if stale_cache { Duration::from_secs(1) } else { recheck.map_or(resync, |s| resync.min(Duration::from_secs(s.max(1)))) };
    Ok(Action::requeue(requeue))
}

/// Replicas their own qualification holds not ready, with the reason (the failing case) their
/// status reports.
fn not_qualified(live: &[&ModelReplica], gone: &dyn Fn(&str) -> bool) -> Vec<String> {
    live.iter()
        .filter(|r| !gone(&r.name_any()))
        .filter_map(|r| {
            let held = r.status.as_ref()?.qualification.as_ref()?.held.as_ref()?;
            Some(format!("{}: {held}", r.name_any()))
        })
        .collect()
}

/// Replicas not serving whose Pods failed on a healthy node, each with its failure record
/// (the replica controller replaces the Pods with a backoff).
fn failing_pods(live: &[&ModelReplica], gone: &dyn Fn(&str) -> bool) -> Vec<String> {
    live.iter()
        .filter(|r| !gone(&r.name_any()))
        .filter_map(|r| {
            let s = r.status.as_ref()?;
            let f = s.pod_failures.as_ref().filter(|_| s.phase != brink_api::crd::ReplicaPhase::Serving)?;
            Some(format!("{} ({} failed Pods in a row, last: {})", r.name_any(), f.count, f.message))
        })
        .collect()
}

/// Adds `class` to the node's `spec.shapeClasses` by server-side apply. The apply carries every
/// class the node lists, so that this manager's earlier requests stay in its applied set; not
/// forced, so that a conflict names the other writer (and the reconcile is retried).
async fn request_qualification(ctx: &Context, node: &str, class: &str) -> Result<()> {
    let mut classes: Vec<String> =
        ctx.caches.spark_nodes.get(&ObjectRef::<SparkNode>::new(node)).map(|s| s.spec.shape_classes.clone()).unwrap_or_default();
    if classes.iter().any(|c| c == class) {
        return Ok(());
    }
    classes.push(class.to_string());
    let patch = json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "SparkNode",
        "metadata": { "name": node },
        "spec": { "shapeClasses": classes },
    });
    let api: Api<SparkNode> = Api::all(ctx.client.clone());
    api.patch(node, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&patch))
        .await
        .map_err(|e| Error::kube(format!("asking SparkNode {node} to qualify {class}"), e))?;
    info!(node, class, "qualification requested");
    Ok(())
}

/// `old` deleted and created again at `template`'s revision. The delete is conditional on the
/// uid the cache holds, so that a cache behind this operator's own recreate does not delete the
/// new replica: that conflict, or a create whose name is still taken, returns `None` (decide
/// again soon).
async fn recreate(api: &Api<ModelReplica>, old: &ModelReplica, template: &Template) -> Result<Option<ModelReplica>> {
    let name = old.name_any();
    let ns = old.namespace().unwrap_or_default();
    let uid = old.uid().ok_or_else(|| Error::MissingField { kind: "ModelReplica", name: name.clone(), field: "metadata.uid" })?;
    let params = DeleteParams::background().preconditions(Preconditions { uid: Some(uid), resource_version: None });
    match api.delete(&name, &params).await {
        Ok(_) => {}
        Err(e) if api_code(&e) == Some(404) => {}
        Err(e) if api_code(&e) == Some(409) => {
            warn!(replica = %name, "replica changed since the cache saw it; deciding again");
            return Ok(None);
        }
        Err(e) => return Err(Error::kube(format!("deleting ModelReplica {ns}/{name} to recreate it"), e)),
    }
    let post = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    match api.create(&post, &rollout::recreated(old, template)).await {
        Ok(r) => Ok(Some(r)),
        Err(e) if api_code(&e) == Some(409) => {
            warn!(replica = %name, "replica name still taken; deciding again");
            Ok(None)
        }
        Err(e) => Err(Error::kube(format!("recreating ModelReplica {ns}/{name} at revision {}", template.revision), e)),
    }
}

/// Applies the status when it changed (forced: the operator is the only writer of these
/// fields, `rollout` included).
async fn write_status(dep: &ModelDeployment, ctx: &Context, outcome: &Outcome, now: Time) -> Result<()> {
    let status = plan::status(dep, outcome, now)?;
    if dep.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let ns = dep.namespace().unwrap_or_default();
    let name = dep.name_any();
    let patch = json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": { "name": name },
        "status": status,
    });
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(|e| Error::kube(format!("writing the status of ModelDeployment {ns}/{name}"), e))?;
    Ok(())
}
