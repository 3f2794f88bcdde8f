//! The `ModelDeployment` controller: maps the caches into the decisions' views, calls
//! `lifecycle` and `place`, and turns their answers into writes: new `ModelReplica`s, deleted
//! ones, shape classes asked of unqualified nodes, the Service, Events and the status.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{Model, ModelDeployment, ModelReplica, SparkNode};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
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
use super::plan::{self, Outcome, ReplicaState};
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
            views::node_view(node, spark.as_deref(), heartbeat, &replicas)
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

    // A replica serves only if its node is there and its heartbeat is not lost.
    let healthy_on_node = |r: &ReplicaView| {
        r.healthy && nodes.iter().find(|n| n.name == r.node).is_some_and(|n| !n.heartbeat.assess(now_s, &policy).evicts())
    };
    let healthy: BTreeSet<String> = live.iter().map(|r| views::replica_view(r)).filter(|r| healthy_on_node(r)).map(|r| r.name).collect();

    let outdated = plan::revision_targets(&live, &revision);
    let current: Vec<ReplicaView> = live.iter().filter(|r| !outdated.contains(&r.name_any())).map(|r| views::replica_view(r)).collect();
    let life = decide::lifecycle(&view, &current, &nodes, now_s, &policy)?;
    let placement = decide::place(&view, &nodes, life.place, now_s, &policy)?;

    // Qualification asked of nodes that never ran the class.
    for node in &placement.qualify {
        request_qualification(ctx, node, &facts.shape_class).await?;
    }

    // New replicas.
    let api: Api<ModelReplica> = Api::namespaced(ctx.client.clone(), &ns);
    let names = plan::free_names(&name, &taken, placement.assignments.len());
    let mut created = Vec::new();
    let mut stale_cache = false;
    for (assignment, replica_name) in placement.assignments.iter().zip(&names) {
        let replica = plan::new_replica(dep, replica_name, assignment, &revision)?;
        match api.create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() }, &replica).await {
            Ok(r) => {
                ctx.metrics.placements.with_label_values(&[ns.as_str()]).inc();
                let limits = &assignment.limits;
                let clamp = if limits.max_batch_tokens < dep.spec.serving.max_batch_tokens {
                    format!(", clamped to {} batch tokens", limits.max_batch_tokens)
                } else {
                    String::new()
                };
                info!(replica = %replica_name, node = %assignment.node, "placed");
                publish(
                    ctx,
                    &dep.object_ref(&()),
                    Some(r.object_ref(&())),
                    EventType::Normal,
                    "Placed",
                    "Place",
                    format!("replica {replica_name} on node {}{clamp}", assignment.node),
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

    // Removals: scale-down victims in the decided order, then replicas of old revisions.
    let mut candidates = life.remove.clone();
    candidates.extend(outdated.iter().cloned());
    let remove = plan::removable(&candidates, &healthy, view.replicas);
    let mut deleted = BTreeSet::new();
    for victim in &remove {
        // Lifecycle's removals cover both scale-down and replaced replicas (a replaced one is
        // surplus once its replacement exists).
        let why = if outdated.contains(victim) { "revision" } else { "lifecycle" };
        match api.delete(victim, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(e) if api_code(&e) == Some(404) => {}
            Err(e) => return Err(Error::kube(format!("deleting ModelReplica {ns}/{victim}"), e)),
        }
        ctx.metrics.replacements.with_label_values(&[why]).inc();
        publish(
            ctx,
            &dep.object_ref(&()),
            Some(replica_ref(&ns, victim)),
            EventType::Normal,
            "Deleted",
            "Delete",
            format!("replica {victim} ({why})"),
        )
        .await;
        deleted.insert(victim.clone());
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
    let mut states: Vec<ReplicaState> = live
        .iter()
        .filter(|r| !deleted.contains(&r.name_any()))
        .map(|r| ReplicaState { serving: healthy.contains(&r.name_any()), ..ReplicaState::of(r, Some(&revision)) })
        .collect();
    states.extend(created.iter().map(|r| ReplicaState::of(r, Some(&revision))));
    let outcome = Outcome {
        replicas: states,
        created: created.len(),
        deleted: deleted.len(),
        unplaced: placement.message.clone(),
        blocked: None,
        held: life.held.iter().map(|h| h.replica.clone()).collect(),
    };
    write_status(dep, ctx, &outcome, Time(now)).await?;

    let requeue =
        if stale_cache { Duration::from_secs(1) } else { life.recheck_in_s.map_or(resync, |s| resync.min(Duration::from_secs(s.max(1)))) };
    Ok(Action::requeue(requeue))
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

/// Applies the status when it changed (forced: the operator is the only writer of these fields).
async fn write_status(dep: &ModelDeployment, ctx: &Context, outcome: &Outcome, now: Time) -> Result<()> {
    let status = plan::status(dep, outcome, now)?;
    let mut current = dep.status.clone().unwrap_or_default();
    current.rollout = None;
    if current == status {
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
