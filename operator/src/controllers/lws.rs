//! A gang as a LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`), where the cluster serves that
//! API: one group of `size` Pods, the leader's template and the workers' template made from the
//! same member Pods as bare gangs get ([`super::member_pod`]), pinned by node affinity to the
//! nodes the placement chose (the leader to its node, workers to theirs, one member per node).
//! LeaderWorkerSet then owns the group's lifecycle: a member that restarts recreates the group
//! (`RecreateGroupOnPodRestart`), and its headless Service names the members
//! (`<name>-0` the leader, `<name>-0-<i>` the workers).

use brink_api::crd::{Model, ModelReplica};
use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, EnvVarSource, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, Pod,
    PodAffinityTerm, PodAntiAffinity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::discovery::ApiResource;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::context::Config;
use super::error::{Error, Result};
use super::member_pod::{member_pod, members_with};
use super::names::{POD_SPEC_ANNOTATION, REPLICA_LABEL, dns_label, label_value};

pub const GROUP: &str = "leaderworkerset.x-k8s.io";
pub const VERSION: &str = "v1";
pub const KIND: &str = "LeaderWorkerSet";
/// The label LeaderWorkerSet puts on each Pod with its index in the group (0: the leader).
pub const WORKER_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/worker-index";

pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        plural: "leaderworkersets".into(),
    }
}

/// Whether the cluster serves the LeaderWorkerSet API (asked once, when the controllers start:
/// installing it later takes an operator restart). Any error reads as not served.
pub async fn served(client: &kube::Client) -> bool {
    let group_version = format!("{GROUP}/{VERSION}");
    let ask = client.list_api_group_resources(&group_version);
    match tokio::time::timeout(std::time::Duration::from_secs(10), ask).await {
        Ok(Ok(list)) => {
            let found = list.resources.iter().any(|r| r.name == "leaderworkersets");
            tracing::info!(found, "LeaderWorkerSet API discovery");
            found
        }
        Ok(Err(e)) => {
            tracing::info!(error = %e, "LeaderWorkerSet API not served: gangs are bare Pods");
            false
        }
        Err(_) => {
            tracing::warn!("LeaderWorkerSet API discovery timed out: gangs are bare Pods");
            false
        }
    }
}

/// The LeaderWorkerSet's name (a DNS label: its Pods' hostnames start with it).
pub fn lws_name(replica: &str) -> String {
    dns_label(replica)
}

/// The leader Pod LeaderWorkerSet creates (group 0).
pub fn leader_pod_name(replica: &str) -> String {
    format!("{}-0", lws_name(replica))
}

fn pinned(pod: &mut Pod, nodes: &[&str], replica: &str) {
    let Some(spec) = pod.spec.as_mut() else { return };
    spec.node_name = None;
    spec.hostname = None;
    spec.subdomain = None;
    spec.affinity = Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(nodes.iter().map(|n| n.to_string()).collect()),
                    }]),
                    ..NodeSelectorTerm::default()
                }],
            }),
            ..NodeAffinity::default()
        }),
        // One member per node: host networking gives every member the node's ports.
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some([(REPLICA_LABEL.to_string(), label_value(replica))].into()),
                    ..LabelSelector::default()
                }),
                topology_key: "kubernetes.io/hostname".into(),
                ..PodAffinityTerm::default()
            }]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    });
}

fn template(pod: Pod) -> Result<Value> {
    let mut meta = pod.metadata;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(POD_SPEC_ANNOTATION);
    }
    let spec = serde_json::to_value(&pod.spec).map_err(|source| Error::Serialize { what: "a LeaderWorkerSet template", source })?;
    Ok(json!({ "metadata": { "labels": meta.labels, "annotations": meta.annotations }, "spec": spec }))
}

/// The LeaderWorkerSet of a gang replica.
pub fn desired_lws(replica: &ModelReplica, model: &Model, config: &Config) -> Result<Value> {
    let name = replica.name_any();
    let Some(gang) = &replica.spec.gang else {
        return Err(Error::InvalidSpec { what: format!("ModelReplica {name}"), why: "a LeaderWorkerSet is for a gang".into() });
    };
    let owner = replica.controller_owner_ref(&()).ok_or_else(|| Error::MissingField {
        kind: "ModelReplica",
        name: name.clone(),
        field: "metadata.uid",
    })?;
    let ns = replica.namespace().unwrap_or_default();
    let lws = lws_name(&name);
    let address = |rank: u32| if rank == 0 { format!("{lws}-0.{lws}.{ns}.svc") } else { format!("{lws}-0-{rank}.{lws}.{ns}.svc") };
    let members = members_with(replica, &address);
    let (Some(leader), Some(worker)) = (members.first(), members.get(1)) else {
        return Err(Error::InvalidSpec { what: format!("ModelReplica {name}"), why: "a gang has a leader and at least one worker".into() });
    };
    let mut leader_pod = member_pod(replica, model, config, leader)?;
    pinned(&mut leader_pod, &[replica.spec.node.as_str()], &name);
    let mut worker_pod = member_pod(replica, model, config, worker)?;
    let workers: Vec<&str> = gang.workers.iter().map(String::as_str).collect();
    pinned(&mut worker_pod, &workers, &name);
    // One template serves every worker: the rank comes from LeaderWorkerSet's index label.
    if let Some(c) = worker_pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        if let Some(cmd) = c.command.as_mut()
            && let Some(i) = cmd.iter().position(|a| a == "--node-rank")
            && let Some(rank) = cmd.get_mut(i + 1)
        {
            *rank = "$(LWS_WORKER_INDEX)".into();
        }
        for e in c.env.iter_mut().flatten().filter(|e| e.name == "BRINK_GANG_RANK") {
            *e = EnvVar {
                name: e.name.clone(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.labels['{WORKER_INDEX_LABEL}']"),
                        ..ObjectFieldSelector::default()
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            };
        }
    }
    if let Some(labels) = worker_pod.metadata.labels.as_mut() {
        labels.remove(super::member_pod::GANG_RANK_LABEL);
    }
    let size = gang.workers.len() + 1;
    Ok(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {
            "name": lws,
            "namespace": ns,
            "labels": { REPLICA_LABEL: label_value(&name) },
            "ownerReferences": [owner],
        },
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template(leader_pod)?,
                "workerTemplate": template(worker_pod)?,
            },
        },
    }))
}
