//! The deployment controller's pure side of the rollout: the decision's inputs from the
//! deployment, its replicas and the node views, and the objects its answer asks for. A
//! replica is recreated, never edited (its `creationTimestamp` starts the rollout's clock),
//! so a recreate is a delete and a create under the same name, on the same node.
//!
//! Going back to a revision needs that revision's engine build, which the deployment's spec
//! no longer names: it is taken from a replica that still runs the revision, or from the
//! record a recreated replica keeps of the one it replaced ([`PREVIOUS_TEMPLATE_ANNOTATION`]).

use std::collections::{BTreeMap, BTreeSet};

use brink_api::crd::{EngineBuild, ModelDeployment, ModelReplica, RolloutStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::names::REVISION_LABEL;
use super::rollout_view::rollout_replica;
use super::views::{MEMORY_ANNOTATION, replica_memory};
use crate::decide::{HeartbeatPolicy, NodeView, RolloutDecision, RolloutPolicy, RolloutReplica, RolloutSpec, decide_rollout};

/// On a recreated replica: the template of the revision it replaced, as JSON, so that a
/// rollback can return to it when no other replica runs it any more.
pub const PREVIOUS_TEMPLATE_ANNOTATION: &str = "brink.dev/previous-template";

/// What a replica at one revision runs: the parts of its spec that the revision hashes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Template {
    pub revision: String,
    /// The `Model`'s name. The agent loads that Model's current spec: a revision that differs
    /// from another only in the Model's content cannot be returned to by name alone.
    pub model: String,
    pub engine: EngineBuild,
    /// The memory a replica of this revision requests; `None`: what placement computed now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

impl Template {
    /// The revision the deployment asks for now.
    pub fn desired(dep: &ModelDeployment, revision: &str) -> Template {
        Template {
            revision: revision.to_string(),
            model: dep.spec.model_ref.name.clone(),
            engine: dep.spec.engine.clone(),
            memory_bytes: None,
        }
    }

    fn of(r: &ModelReplica) -> Template {
        let memory = replica_memory(r);
        Template {
            revision: r.spec.revision.clone(),
            model: r.spec.model.clone(),
            engine: r.spec.engine.clone(),
            memory_bytes: (memory > 0).then_some(memory),
        }
    }

    fn recorded(r: &ModelReplica) -> Option<Template> {
        serde_json::from_str(r.annotations().get(PREVIOUS_TEMPLATE_ANNOTATION)?).ok()
    }
}

/// The template of `revision`: the deployment's when it is the desired one, else that of a
/// replica running it, else one a recreated replica recorded.
pub fn template_for(revision: &str, desired: &Template, replicas: &[&ModelReplica]) -> Result<Template> {
    if revision == desired.revision {
        return Ok(desired.clone());
    }
    let running = replicas.iter().find(|r| r.spec.revision == revision).map(|r| Template::of(r));
    running.or_else(|| replicas.iter().filter_map(|r| Template::recorded(r)).find(|t| t.revision == revision)).ok_or_else(|| {
        Error::InvalidSpec {
            what: format!("revision {revision}"),
            why: "no replica runs it or recorded its engine build, so it cannot be returned to".into(),
        }
    })
}

/// Nodes the rollout may judge a canary on: schedulable, with a fresh heartbeat. A node not
/// in `nodes` is absent.
pub fn healthy_nodes(nodes: &[NodeView], now_s: u64, policy: &HeartbeatPolicy) -> BTreeSet<String> {
    nodes.iter().filter(|n| !n.unschedulable && n.heartbeat.assess(now_s, policy).accepts_replicas()).map(|n| n.name.clone()).collect()
}

/// Decides the rollout of `revision` for `dep`, whose live replicas are `replicas`.
pub fn decide(
    dep: &ModelDeployment,
    revision: &str,
    replicas: &[&ModelReplica],
    healthy: &BTreeSet<String>,
    now_s: u64,
) -> Result<RolloutDecision> {
    let what = || format!("rollout of ModelDeployment {}/{}", dep.namespace().unwrap_or_default(), dep.name_any());
    let views: Vec<RolloutReplica> = replicas
        .iter()
        .map(|r| rollout_replica(r, healthy.contains(&r.spec.node)))
        .collect::<Result<_, _>>()
        .map_err(|e| Error::InvalidSpec { what: what(), why: e.to_string() })?;
    let spec = RolloutSpec {
        desired_revision: revision.to_string(),
        strategy: dep.spec.rollout.strategy,
        progress_deadline_s: u64::from(dep.spec.rollout.progress_deadline_seconds),
        replicas: u64::try_from(dep.spec.replicas).unwrap_or(0),
    };
    let previous: Option<&RolloutStatus> = dep.status.as_ref().and_then(|s| s.rollout.as_ref());
    decide_rollout(&spec, previous, &views, now_s, &RolloutPolicy::default())
        .map_err(|e| Error::InvalidSpec { what: what(), why: e.to_string() })
}

/// `old` created again at `template`'s revision: same name, node, owner and serving limits
/// (clamped for that node), a new spec revision and engine, and a record of the template it
/// replaces. Server-set metadata (uid, resourceVersion, creation time) and status are dropped.
pub fn recreated(old: &ModelReplica, template: &Template) -> ModelReplica {
    let mut labels = old.labels().clone();
    labels.insert(REVISION_LABEL.to_string(), template.revision.clone());
    let mut annotations: BTreeMap<String, String> = old.annotations().clone();
    let memory = template.memory_bytes.unwrap_or_else(|| replica_memory(old));
    annotations.insert(MEMORY_ANNOTATION.to_string(), memory.to_string());
    if old.spec.revision != template.revision {
        // Serialising a struct of strings and integers cannot fail; an empty record is skipped.
        if let Ok(json) = serde_json::to_string(&Template::of(old)) {
            annotations.insert(PREVIOUS_TEMPLATE_ANNOTATION.to_string(), json);
        }
    }
    let mut spec = old.spec.clone();
    spec.revision = template.revision.clone();
    spec.model = template.model.clone();
    spec.engine = template.engine.clone();
    ModelReplica {
        metadata: ObjectMeta {
            name: old.metadata.name.clone(),
            namespace: old.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: old.metadata.owner_references.clone(),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::crd::{ModelReplicaSpec, Serving};

    fn engine(v: &str) -> EngineBuild {
        EngineBuild { image: format!("img:{v}"), version: v.into(), ..Default::default() }
    }

    fn replica(name: &str, revision: &str, v: &str) -> ModelReplica {
        let mut r = ModelReplica::new(
            name,
            ModelReplicaSpec {
                deployment: "d".into(),
                node: "n1".into(),
                model: "m".into(),
                revision: revision.into(),
                engine: engine(v),
                serving: Serving { context: 1024, max_batch_tokens: 256, prefill_chunk: 128, concurrency: 1, kv_fraction: 0.5 },
                gang: None,
            },
        );
        r.metadata.uid = Some(format!("uid-{name}"));
        r.metadata.resource_version = Some("7".into());
        r.metadata.annotations = Some(BTreeMap::from([(MEMORY_ANNOTATION.to_string(), "100".to_string())]));
        r
    }

    fn desired() -> Template {
        Template { revision: "new".into(), model: "m".into(), engine: engine("2"), memory_bytes: Some(200) }
    }

    #[test]
    fn a_recreate_keeps_name_node_and_limits_and_records_what_it_replaced() {
        let old = replica("d-0", "old", "1");
        let new = recreated(&old, &desired());
        assert_eq!(new.metadata.name.as_deref(), Some("d-0"));
        assert_eq!((new.metadata.uid.as_ref(), new.metadata.resource_version.as_ref()), (None, None));
        assert_eq!((new.spec.node.as_str(), new.spec.revision.as_str(), new.spec.engine.version.as_str()), ("n1", "new", "2"));
        assert_eq!(new.spec.serving, old.spec.serving);
        assert_eq!(new.labels().get(REVISION_LABEL).map(String::as_str), Some("new"));
        assert_eq!(new.annotations().get(MEMORY_ANNOTATION).map(String::as_str), Some("200"));
        let back = Template::recorded(&new).expect("a record of the old revision");
        assert_eq!(back, Template { revision: "old".into(), model: "m".into(), engine: engine("1"), memory_bytes: Some(100) });

        // Rolled back from that record alone (no replica runs "old" any more).
        let t = template_for("old", &desired(), &[&new]).expect("from the record");
        let again = recreated(&new, &t);
        assert_eq!((again.spec.revision.as_str(), again.spec.engine.version.as_str()), ("old", "1"));
        assert_eq!(again.annotations().get(MEMORY_ANNOTATION).map(String::as_str), Some("100"));
        assert_eq!(Template::recorded(&again).map(|t| t.revision), Some("new".to_string()));
    }

    #[test]
    fn templates_come_from_the_spec_a_running_replica_or_a_record() {
        let running = replica("d-1", "old", "1");
        assert_eq!(template_for("new", &desired(), &[]).expect("desired"), desired());
        assert_eq!(template_for("old", &desired(), &[&running]).expect("running").engine, engine("1"));
        let err = template_for("gone", &desired(), &[&running]).expect_err("nothing knows it");
        assert_eq!(err.to_string(), "revision gone: no replica runs it or recorded its engine build, so it cannot be returned to");
        // A garbled record is ignored, not trusted.
        let mut garbled = replica("d-2", "new", "2");
        garbled.metadata.annotations.get_or_insert_default().insert(PREVIOUS_TEMPLATE_ANNOTATION.into(), "{not json".into());
        assert!(template_for("old", &desired(), &[&garbled]).is_err());
    }
}
