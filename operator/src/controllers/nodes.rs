//! Which deployments a change elsewhere concerns: a Node (cordon, taint, deletion), its
//! SparkNode (qualification, capacity) or its heartbeat Lease re-queues the deployments with
//! replicas on that node, and every deployment that has replicas it could not place.

use std::collections::BTreeSet;
use std::sync::Arc;

use brink_api::crd::{Model, ModelDeployment, ModelReplica, SweepRun};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::context::Context;

/// The heartbeat Lease's node, if `name` is one of them (`brink-node-<node>`).
pub fn lease_node(name: &str) -> Option<&str> {
    name.strip_prefix("brink-node-").filter(|n| !n.is_empty())
}

/// Deployments with a replica bound to `node`, each once.
pub fn deployments_on(node: &str, replicas: &[Arc<ModelReplica>]) -> Vec<ObjectRef<ModelDeployment>> {
    let keys: BTreeSet<(String, String)> = replicas
        .iter()
        .filter(|r| r.spec.nodes().contains(&node))
        .filter_map(|r| Some((r.namespace()?, r.spec.deployment.clone())))
        .collect();
    keys.into_iter().map(|(ns, name)| ObjectRef::new(&name).within(&ns)).collect()
}

/// What a change of `node` re-queues: its deployments and the unplaced ones.
pub fn requeue_for_node(node: &str, ctx: &Context) -> Vec<ObjectRef<ModelDeployment>> {
    let mut refs = deployments_on(node, &ctx.caches.replicas.state());
    for d in ctx.unplaced_deployments() {
        if !refs.contains(&d) {
            refs.push(d);
        }
    }
    refs
}

/// What a change of a `SweepRun` re-queues: the deployments on each of its nodes (draining,
/// sweeping or done: either way their eligibility changed) and the unplaced ones.
pub fn requeue_for_run(run: &SweepRun, ctx: &Context) -> Vec<ObjectRef<ModelDeployment>> {
    if !run.spec.drain_replicas {
        return Vec::new();
    }
    let mut refs = Vec::new();
    for node in run.status.iter().flat_map(|s| &s.nodes) {
        for d in requeue_for_node(&node.node, ctx) {
            if !refs.contains(&d) {
                refs.push(d);
            }
        }
    }
    refs
}

/// Deployments in the Model's namespace that serve it.
pub fn deployments_of_model(model: &Model, deployments: &Store<ModelDeployment>) -> Vec<ObjectRef<ModelDeployment>> {
    let ns = model.namespace();
    let name = model.name_any();
    deployments
        .state()
        .iter()
        .filter(|d| d.namespace() == ns && d.spec.model_ref.name == name)
        .map(|d| ObjectRef::from_obj(d.as_ref()))
        .collect()
}

/// Replicas that serve the Model (a replica whose Model was missing waits for it).
pub fn replicas_of_model(model: &Model, replicas: &Store<ModelReplica>) -> Vec<ObjectRef<ModelReplica>> {
    let ns = model.namespace();
    let name = model.name_any();
    replicas.state().iter().filter(|r| r.namespace() == ns && r.spec.model == name).map(|r| ObjectRef::from_obj(r.as_ref())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_map_to_nodes() {
        assert_eq!(lease_node("brink-node-spark-1"), Some("spark-1"));
        assert_eq!(lease_node("brink-node-"), None);
        assert_eq!(lease_node("kube-node-spark-1"), None);
    }
}
