//! The `ModelReplica` controller: one Pod per replica, pinned to the replica's node, recreated
//! when it differs from the desired one; the replica's phase from its Pod while the agent has
//! written none more precise.

use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{EngineKind, Model, ModelReplica, PodFailures, ReplicaPhase};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, instrument};

use super::context::{Context, FIELD_MANAGER};
use super::error::{Error, Result, api_code};
use super::events::publish;
use super::lws;
use super::member_pod;
use super::pod::{PodAction, desired_pods, phase_from_pod, pod_action, pod_state};
use crate::decide::{self, FailureRecord, PodState, Recovery};

pub const CONTROLLER: &str = "modelreplica";

/// The field manager of `status.endpoint` alone, so that publishing it never takes the phase
/// from the manager that wrote it (the agent's or this operator's own).
pub const ENDPOINT_MANAGER: &str = "brink-operator-endpoint";

/// `host:port` of the engine's HTTP API of a replica on another engine (vLLM, SGLang,
/// llama.cpp), from its leader Pod's IP: a sweep of the deployment measures it there. None for
/// brink's engine (its agent reports for it) and before the Pod has an IP.
pub fn engine_endpoint(replica: &ModelReplica, leader: Option<&Pod>, config: &super::context::Config) -> Option<String> {
    if replica.spec.engine.kind == EngineKind::Brink {
        return None;
    }
    let ip = leader?.status.as_ref()?.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    let port = member_pod::engine_port(replica, config);
    Some(if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") })
}

/// Publishes `endpoint` in the replica's status when it differs from what is there (None:
/// withdrawn).
async fn publish_endpoint(ctx: &Context, replica: &ModelReplica, ns: &str, endpoint: Option<String>) -> Result<()> {
    if replica.status.as_ref().and_then(|s| s.endpoint.as_ref()) == endpoint.as_ref() {
        return Ok(());
    }
    let name = replica.name_any();
    // Left out, the field this manager alone applied before is removed.
    let status = endpoint.map_or_else(|| json!({}), |e| json!({ "endpoint": e }));
    let patch = json!({ "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica", "metadata": { "name": name }, "status": status });
    let api: Api<ModelReplica> = Api::namespaced(ctx.client.clone(), ns);
    api.patch_status(&name, &PatchParams::apply(ENDPOINT_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(|e| Error::kube(format!("writing the endpoint of ModelReplica {ns}/{name}"), e))?;
    Ok(())
}

#[instrument(skip_all, fields(namespace = replica.namespace().unwrap_or_default(), replica = replica.name_any()))]
pub async fn reconcile(replica: Arc<ModelReplica>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let result = reconcile_inner(&replica, &ctx).await;
    if let Err(e) = &result {
        ctx.metrics.error(CONTROLLER, e.kind());
        publish(&ctx, &replica.object_ref(&()), None, EventType::Warning, "ReconcileFailed", "Reconcile", e.to_string()).await;
    }
    result
}

/// Whether a writer other than this operator (the replica Pod's agent) set the status phase.
/// A writer whose fields are known and hold no `phase` did not: the node's agent publishing a
/// qualification report (an external engine's sidecar verdict) or download progress leaves
/// the phase to the Pod. A writer whose fields are not recorded is taken to own it.
fn agent_wrote_status(replica: &ModelReplica) -> bool {
    replica.metadata.managed_fields.iter().flatten().any(|m| {
        m.subresource.as_deref() == Some("status")
            && m.manager.as_deref().is_some_and(|w| w != FIELD_MANAGER)
            && m.fields_v1.as_ref().is_none_or(|f| f.0.get("f:status").is_some_and(|s| s.get("f:phase").is_some()))
    })
}

/// The phase to write, if any: a failed Pod always; otherwise the Pod's phase while the agent
/// has written none (its phases are finer: Downloading, SelfTesting, Stalled).
pub fn phase_update(replica: &ModelReplica, pod_phase: ReplicaPhase) -> Option<ReplicaPhase> {
    let current = replica.status.as_ref().map(|s| s.phase);
    if current == Some(pod_phase) {
        return None;
    }
    if pod_phase == ReplicaPhase::Failed || (!agent_wrote_status(replica) && current.unwrap_or_default().may_move_to(pod_phase)) {
        return Some(pod_phase);
    }
    None
}

async fn reconcile_inner(replica: &ModelReplica, ctx: &Context) -> Result<Action> {
    let ns = replica.namespace().ok_or_else(|| Error::MissingField {
        kind: "ModelReplica",
        name: replica.name_any(),
        field: "metadata.namespace",
    })?;
    let name = replica.name_any();
    if replica.metadata.deletion_timestamp.is_some() {
        // The Pod goes with it (owner reference).
        return Ok(Action::await_change());
    }
    let Some(model) = ctx.caches.models.get(&ObjectRef::<Model>::new(&replica.spec.model).within(&ns)) else {
        return Err(Error::InvalidSpec {
            what: format!("ModelReplica {ns}/{name}"),
            why: format!("Model {ns}/{} does not exist", replica.spec.model),
        });
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    if replica.spec.gang.is_some() && ctx.config.leader_worker_set {
        return reconcile_leader_worker_set(replica, &model, ctx, &ns, &pods).await;
    }
    if replica.spec.gang.is_some() {
        let svc = member_pod::gang_service(replica, &ctx.config)?;
        let svc_name = svc.name_any();
        let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
        services
            .patch(&svc_name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&svc))
            .await
            .map_err(|e| Error::kube(format!("applying the gang's Service {ns}/{svc_name}"), e))?;
    }
    // Every member's Pod (one, but for a gang), leader first.
    let mut members_now: Vec<Option<Pod>> = Vec::new();
    for desired in desired_pods(replica, &model, &ctx.config)? {
        let pod_name = desired.name_any();
        let existing = pods.get_opt(&pod_name).await.map_err(|e| Error::kube(format!("reading Pod {ns}/{pod_name}"), e))?;
        let now = match pod_action(existing.as_ref(), &desired, replica) {
            PodAction::Keep => existing,
            PodAction::Create => {
                let pod = pods
                    .create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() }, &desired)
                    .await
                    .map_err(|e| Error::kube(format!("creating Pod {ns}/{pod_name}"), e))?;
                info!(node = %pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(), pod = %pod_name, "replica Pod created");
                Some(pod)
            }
            PodAction::Recreate => {
                match pods.delete(&pod_name, &DeleteParams::foreground()).await {
                    Ok(_) => {}
                    Err(e) if api_code(&e) == Some(404) => {}
                    Err(e) => return Err(Error::kube(format!("deleting the outdated Pod {ns}/{pod_name}"), e)),
                }
                publish(
                    ctx,
                    &replica.object_ref(&()),
                    None,
                    EventType::Normal,
                    "PodRecreated",
                    "Recreate",
                    format!("Pod {pod_name} differs from the replica's spec; recreating"),
                )
                .await;
                // Created by the reconcile its deletion triggers.
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
            PodAction::Predecessor => {
                // A rollout recreated this replica under its name: the old Pod goes with its owner.
                tracing::debug!(replica = %name, pod = %pod_name, "waiting for the previous replica's Pod to be garbage-collected");
                return Ok(Action::requeue(Duration::from_secs(2)));
            }
            PodAction::Foreign => {
                return Err(Error::InvalidSpec {
                    what: format!("ModelReplica {ns}/{name}"),
                    why: format!("a Pod named {pod_name} exists and is not controlled by this replica; delete or rename it"),
                });
            }
        };
        members_now.push(now);
    }
    let pod_now = members_now.first().cloned().flatten();
    publish_endpoint(ctx, replica, &ns, engine_endpoint(replica, pod_now.as_ref(), &ctx.config)).await?;

    let resync = Duration::from_secs(ctx.config.resync_seconds.max(1) * 3);
    let now_s = ctx.now_s();
    let policy = ctx.config.recovery;
    let status = replica.status.clone().unwrap_or_default();
    let record = status.pod_failures.as_ref().map(failure_record);
    let was_serving = matches!(status.phase, ReplicaPhase::Serving | ReplicaPhase::Stalled);
    let states: Vec<PodState> = members_now.iter().map(|p| pod_state(p.as_ref(), was_serving, now_s, &policy)).collect();
    let state = decide::gang_pod_state(&states);
    // A member that failed fails the replica; otherwise the leader's Pod says where it is.
    let phase = match members_now.iter().map(|p| phase_from_pod(p.as_ref()).0).find(|p| *p == ReplicaPhase::Failed) {
        Some(failed) => failed,
        None => phase_from_pod(pod_now.as_ref()).0,
    };
    match decide::recover(&state, record.as_ref(), now_s, &policy) {
        Recovery::Record { record, replace_in_s } => {
            let failures = pod_failures(&record)?;
            write_status(ctx, &ns, &name, ReplicaPhase::Failed, Some(&failures)).await?;
            let note = format!(
                "Pod {name} on node {} failed: {}; failure {} in a row, a new Pod in {replace_in_s} s",
                replica.spec.node, record.message, record.count
            );
            publish(ctx, &replica.object_ref(&()), None, EventType::Warning, "PodFailed", "Serve", note).await;
            Ok(Action::requeue(Duration::from_secs(replace_in_s.max(1))))
        }
        Recovery::Wait { for_s } => Ok(Action::requeue(Duration::from_secs(for_s.max(1)))),
        Recovery::Replace { pod_uid } => {
            // A gang is replaced whole: the failed member's Pod (conditional on its uid) and the
            // others with it, so the engine's multi-node mode starts again from every rank.
            let failed_pod = members_now.iter().flatten().find(|p| p.uid().as_deref() == Some(pod_uid.as_str())).map(|p| p.name_any());
            let failed_pod = failed_pod.unwrap_or_else(|| name.clone());
            let params = DeleteParams::background().preconditions(Preconditions { uid: Some(pod_uid), resource_version: None });
            match pods.delete(&failed_pod, &params).await {
                Ok(_) => {}
                Err(e) if api_code(&e) == Some(404) => {}
                // Another Pod of that name already: decide again from it.
                Err(e) if api_code(&e) == Some(409) => return Ok(Action::requeue(Duration::from_secs(1))),
                Err(e) => return Err(Error::kube(format!("deleting the failed Pod {ns}/{failed_pod}"), e)),
            }
            for other in members_now.iter().flatten().map(|p| p.name_any()).filter(|p| *p != failed_pod) {
                match pods.delete(&other, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(e) if api_code(&e) == Some(404) => {}
                    Err(e) => return Err(Error::kube(format!("deleting gang member Pod {ns}/{other}"), e)),
                }
            }
            // Pending again: the agent of the next Pod reports forward from there.
            write_status(ctx, &ns, &name, ReplicaPhase::Pending, status.pod_failures.as_ref()).await?;
            info!(node = %replica.spec.node, "failed replica Pod deleted; a new one follows");
            let note = format!("Pod {name} on node {} deleted after its backoff; creating a new one", replica.spec.node);
            publish(ctx, &replica.object_ref(&()), None, EventType::Normal, "PodReplaced", "Recreate", note).await;
            // The deletion's watch event brings the reconcile that creates the new Pod.
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Recovery::Clear => {
            let next = phase_update(replica, phase).unwrap_or(status.phase);
            write_status(ctx, &ns, &name, next, None).await?;
            Ok(Action::requeue(resync))
        }
        Recovery::Nothing => {
            if let Some(next) = phase_update(replica, phase) {
                write_status(ctx, &ns, &name, next, status.pod_failures.as_ref()).await?;
            }
            Ok(Action::requeue(resync))
        }
    }
}

/// A gang where LeaderWorkerSet is installed: the LeaderWorkerSet applied (it creates and
/// restarts the group's Pods itself, the whole group on any member's restart), the replica's
/// phase from the leader Pod it made.
async fn reconcile_leader_worker_set(replica: &ModelReplica, model: &Model, ctx: &Context, ns: &str, pods: &Api<Pod>) -> Result<Action> {
    let name = replica.name_any();
    let desired = lws::desired_lws(replica, model, &ctx.config)?;
    let lws_name = lws::lws_name(&name);
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &lws::api_resource());
    api.patch(&lws_name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired))
        .await
        .map_err(|e| Error::kube(format!("applying LeaderWorkerSet {ns}/{lws_name}"), e))?;
    let leader = lws::leader_pod_name(&name);
    let pod = pods.get_opt(&leader).await.map_err(|e| Error::kube(format!("reading Pod {ns}/{leader}"), e))?;
    let (phase, _) = phase_from_pod(pod.as_ref());
    publish_endpoint(ctx, replica, ns, engine_endpoint(replica, pod.as_ref(), &ctx.config)).await?;
    let status = replica.status.clone().unwrap_or_default();
    if let Some(next) = phase_update(replica, phase) {
        write_status(ctx, ns, &name, next, status.pod_failures.as_ref()).await?;
    }
    Ok(Action::requeue(Duration::from_secs(ctx.config.resync_seconds.max(1) * 3)))
}

/// The API's record as the decision reads it.
fn failure_record(f: &PodFailures) -> FailureRecord {
    FailureRecord {
        count: f.count,
        last_failure_s: u64::try_from(f.last_failure_time.0.as_second()).unwrap_or(0),
        pod_uid: f.pod_uid.clone(),
        message: f.message.clone(),
    }
}

fn pod_failures(r: &FailureRecord) -> Result<PodFailures> {
    let at = i64::try_from(r.last_failure_s).ok().and_then(|s| Timestamp::from_second(s).ok()).ok_or_else(|| Error::InvalidSpec {
        what: "a failed Pod's time".into(),
        why: format!("{} s since the epoch is out of range", r.last_failure_s),
    })?;
    Ok(PodFailures { count: r.count, last_failure_time: Time(at), pod_uid: r.pod_uid.clone(), message: r.message.clone() })
}

/// Applies `phase` and the operator's failure record (absent: cleared); every other status
/// field stays the agent's. Server-side apply removes what this manager applied before and
/// leaves out now, so every write carries the record that is to stay.
async fn write_status(ctx: &Context, ns: &str, name: &str, phase: ReplicaPhase, failures: Option<&PodFailures>) -> Result<()> {
    let mut status = json!({ "phase": phase });
    if let Some(f) = failures {
        status["podFailures"] = serde_json::to_value(f).map_err(|source| Error::Serialize { what: "status.podFailures", source })?;
    }
    let patch = json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "ModelReplica",
        "metadata": { "name": name },
        "status": status,
    });
    let api: Api<ModelReplica> = Api::namespaced(ctx.client.clone(), ns);
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(|e| Error::kube(format!("writing the phase of ModelReplica {ns}/{name}"), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use brink_api::crd::{EngineBuild, ModelReplicaSpec, ModelReplicaStatus, Serving};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

    fn replica(phase: Option<ReplicaPhase>, agent: bool) -> ModelReplica {
        let mut r = ModelReplica::new(
            "r",
            ModelReplicaSpec {
                deployment: "d".into(),
                node: "n".into(),
                model: "m".into(),
                revision: "x".into(),
                engine: EngineBuild { image: "i".into(), version: "v".into(), ..Default::default() },
                serving: Serving { context: 1, max_batch_tokens: 1, prefill_chunk: 1, concurrency: 1, kv_fraction: 1.0 },
                gang: None,
            },
        );
        r.status = phase.map(|phase| ModelReplicaStatus { phase, ..ModelReplicaStatus::default() });
        let manager = if agent { "brink-agent" } else { FIELD_MANAGER };
        r.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(manager.into()),
            subresource: Some("status".into()),
            ..ManagedFieldsEntry::default()
        }]);
        r
    }

    #[test]
    fn the_pod_phase_is_written_only_where_the_agent_has_not_said_more() {
        use ReplicaPhase::*;
        // (current, agent wrote, pod says) -> write
        let cases = [
            (None, false, Pending, Some(Pending)),
            (Some(Pending), false, Loading, Some(Loading)),
            (Some(Loading), false, Serving, Some(Serving)),
            (Some(Serving), false, Serving, None),
            // Backwards is not a move the phases allow (a restarting Pod is the agent's to report).
            (Some(Serving), false, Loading, None),
            (Some(SelfTesting), true, Serving, None),
            (Some(Downloading), true, Loading, None),
            // A failed Pod fails the replica whoever wrote last.
            (Some(Serving), true, Failed, Some(Failed)),
            (Some(Failed), true, Failed, None),
        ];
        for (current, agent, pod, want) in cases {
            assert_eq!(phase_update(&replica(current, agent), pod), want, "{current:?} agent={agent} pod={pod:?}");
        }
    }

    #[test]
    fn a_writer_of_other_status_fields_leaves_the_phase_to_the_pod() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
        let with_fields = |fields: serde_json::Value| {
            let mut r = replica(Some(ReplicaPhase::Loading), true);
            r.metadata.managed_fields.as_mut().expect("entries")[0].fields_v1 = Some(FieldsV1(fields));
            r
        };
        // The node's agent published the qualification sidecar's report: the Pod's readiness
        // still moves the phase.
        let report = with_fields(serde_json::json!({ "f:status": { "f:qualification": { ".": {} } } }));
        assert_eq!(phase_update(&report, ReplicaPhase::Serving), Some(ReplicaPhase::Serving));
        // A writer that set the phase keeps it.
        let agent = with_fields(serde_json::json!({ "f:status": { "f:phase": {}, "f:qualification": {} } }));
        assert_eq!(phase_update(&agent, ReplicaPhase::Serving), None);
    }
}
