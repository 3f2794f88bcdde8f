//! Gang flows: the real controllers against the in-memory API server with replicas over two
//! nodes (vLLM over Ray). A gang is placed on two qualified nodes of one fabric with a leader
//! and a worker Pod; a member's node lost replaces the whole gang; a fabric without enough
//! peers (or a gang larger than any fabric) leaves the deployment `Degraded` with reason
//! `Unplaced` and a message that says why, and the controllers keep running.

mod common;
#[allow(dead_code)]
mod flows;

use std::collections::BTreeMap;

use brink_api::crd::{EngineKind, FABRIC_LABEL, GangSettings, ModelDeployment};
use common::NS;
use flows::{Fleet, NodeSetup, Snapshot};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

fn nodes(n: usize) -> Vec<NodeSetup> {
    const NAMES: [&str; 4] = ["spark-1", "spark-2", "spark-3", "spark-4"];
    NAMES[..n].iter().map(|name| NodeSetup { name, qualified: true }).collect()
}

/// The admin labels `node` with its fabric.
async fn label(fleet: &Fleet, node: &str, fabric: &str) {
    let api: Api<Node> = Api::all(fleet.double.client());
    let patch = json!({ "metadata": { "labels": { FABRIC_LABEL: fabric } } });
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("label Node");
}

/// A vLLM deployment of one replica over `nodes` nodes.
async fn deploy_gang(fleet: &Fleet, nodes: u32) -> ModelDeployment {
    let mut dep = common::deployment(1);
    dep.metadata.uid = None;
    dep.metadata.resource_version = None;
    dep.metadata.generation = None;
    dep.spec.engine.kind = EngineKind::Vllm;
    dep.spec.engine.image = "vllm/vllm-openai:v0.11.0".into();
    dep.spec.engine.version = "0.11.0".into();
    dep.spec.nodes_per_replica = nodes;
    dep.spec.gang = Some(GangSettings { socket_interface: Some("enp1s0f1np1".into()), ..GangSettings::default() });
    fleet.deployments().create(&Default::default(), &dep).await.expect("create ModelDeployment")
}

/// Replicas not being deleted: name -> (leader, workers).
fn gangs(s: &Snapshot) -> BTreeMap<String, (String, Vec<String>)> {
    s.replicas
        .iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .map(|r| (r.name_any(), (r.spec.node.clone(), r.spec.gang.as_ref().map(|g| g.workers.clone()).unwrap_or_default())))
        .collect()
}

fn pod<'a>(s: &'a Snapshot, name: &str) -> Option<&'a Pod> {
    s.pods.iter().find(|p| p.name_any() == name)
}

fn command(p: &Pod) -> String {
    p.spec.as_ref().map(|s| s.containers[0].command.clone().unwrap_or_default().join(" ")).unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_gang_of_two_is_placed_on_two_nodes_of_one_fabric() {
    let fleet = Fleet::start(&nodes(4));
    // spark-2 is alone on its fabric and spark-4 has none: only spark-1 and spark-3 pair up.
    for (node, fabric) in [("spark-1", "cx7-a"), ("spark-2", "cx7-b"), ("spark-3", "cx7-a")] {
        label(&fleet, node, fabric).await;
    }
    deploy_gang(&fleet, 2).await;
    let placed = fleet.until("a gang placed", 60, |s: &Snapshot| (!gangs(s).is_empty()).then(|| gangs(s))).await;
    assert_eq!(placed, BTreeMap::from([("qwen-0".to_string(), ("spark-1".to_string(), vec!["spark-3".to_string()]))]));
    let s = fleet.until("leader and worker Pods", 60, |s: &Snapshot| (s.pods.len() == 2).then(|| s.pod_nodes())).await;
    assert_eq!(s, BTreeMap::from([("qwen-0".into(), "spark-1".into()), ("qwen-0-w1".into(), "spark-3".into())]));

    let snap = fleet.snapshot().await;
    let replica = snap.replicas.iter().find(|r| r.name_any() == "qwen-0").expect("replica");
    let gang = replica.spec.gang.as_ref().expect("gang");
    assert_eq!((gang.fabric.as_str(), gang.rdma), ("cx7-a", false));
    let leader = pod(&snap, "qwen-0").expect("leader Pod");
    let worker = pod(&snap, "qwen-0-w1").expect("worker Pod");
    assert!(command(leader).contains("ray start --head --port=6379"), "{}", command(leader));
    assert!(command(leader).contains("vllm serve") && command(leader).contains("--tensor-parallel-size 2"), "{}", command(leader));
    assert!(command(worker).contains("ray start --address=qwen-0.qwen-0-gang.llm.svc:6379"), "{}", command(worker));
    for p in [leader, worker] {
        let spec = p.spec.as_ref().expect("spec");
        assert_eq!((spec.host_network, spec.dns_policy.as_deref()), (Some(true), Some("ClusterFirstWithHostNet")), "{}", p.name_any());
        assert_eq!(spec.subdomain.as_deref(), Some("qwen-0-gang"));
        let env = spec.containers[0].env.clone().unwrap_or_default();
        assert!(env.iter().any(|e| e.name == "NCCL_SOCKET_IFNAME" && e.value.as_deref() == Some("enp1s0f1np1")), "{}", p.name_any());
    }
    // The leader runs the qualification sidecar, which owns readiness; the worker does not.
    let sidecars = |p: &Pod| p.spec.as_ref().map(|s| s.containers.iter().map(|c| c.name.clone()).collect::<Vec<_>>()).unwrap_or_default();
    assert_eq!((sidecars(leader), sidecars(worker)), (vec!["engine".into(), "qualify".into()], vec!["engine".to_string()]));

    // The headless Service names the members; the deployment's Service selects the leader only.
    let services: Api<Service> = Api::namespaced(fleet.double.client(), NS);
    let headless = services.get("qwen-0-gang").await.expect("the gang's headless Service").spec.expect("spec");
    assert_eq!((headless.cluster_ip.as_deref(), headless.publish_not_ready_addresses), (Some("None"), Some(true)));
    let selector = services.get("qwen").await.expect("the deployment's Service").spec.and_then(|s| s.selector).expect("selector");
    let query = selector.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let selected = fleet.pods().list(&ListParams::default().labels(&query)).await.expect("list Pods");
    assert_eq!(selected.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(), ["qwen-0"]);

    // The leader turns Ready (its sidecar's qualification passed): the replica serves.
    fleet.mark_ready("qwen-0").await;
    fleet.until("the gang serves", 60, |s: &Snapshot| s.settled(1, 1, "True").then_some(())).await;
    fleet.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_member_replaces_the_whole_gang() {
    let fleet = Fleet::start(&nodes(4));
    for node in ["spark-1", "spark-2", "spark-3", "spark-4"] {
        label(&fleet, node, "cx7-a").await;
    }
    deploy_gang(&fleet, 2).await;
    fleet.until("a gang placed", 60, |s: &Snapshot| (s.pods.len() == 2).then_some(())).await;
    assert_eq!(
        gangs(&fleet.snapshot().await),
        BTreeMap::from([("qwen-0".to_string(), ("spark-1".to_string(), vec!["spark-2".to_string()]))])
    );
    fleet.mark_ready("qwen-0").await;
    fleet.until("the gang serves", 60, |s: &Snapshot| s.settled(1, 1, "True").then_some(())).await;

    // The worker's node is lost: a new gang on the two free nodes, the old one goes whole.
    let api: Api<Node> = Api::all(fleet.double.client());
    api.delete("spark-2", &DeleteParams::default()).await.expect("delete Node");
    let now = fleet
        .until("the gang replaced", 120, |s: &Snapshot| {
            let g = gangs(s);
            (g.len() == 1 && g.contains_key("qwen-1") && s.pods.len() == 2).then_some((g, s.pod_nodes()))
        })
        .await;
    assert_eq!(now.0, BTreeMap::from([("qwen-1".to_string(), ("spark-3".to_string(), vec!["spark-4".to_string()]))]));
    // Both of the old gang's Pods went with it (the leader on the healthy spark-1 too).
    assert_eq!(now.1, BTreeMap::from([("qwen-1".into(), "spark-3".into()), ("qwen-1-w1".into(), "spark-4".into())]));
    fleet.mark_ready("qwen-1").await;
    fleet.until("the new gang serves", 60, |s: &Snapshot| s.settled(1, 1, "True").then_some(())).await;
    fleet.stop().await;
}

#[tokio::test(start_paused = true)]
async fn too_few_peers_in_a_fabric_leave_the_gang_unplaced_and_say_why() {
    let fleet = Fleet::start(&nodes(3));
    label(&fleet, "spark-1", "cx7-a").await;
    label(&fleet, "spark-2", "cx7-b").await;
    deploy_gang(&fleet, 2).await;
    let degraded =
        fleet.until("Degraded: Unplaced", 60, |s: &Snapshot| s.condition("Degraded").filter(|c| c.reason == "Unplaced").cloned()).await;
    assert_eq!(degraded.status, "True");
    for text in [
        "1 of 1 gangs of 2 nodes cannot be placed: a gang needs 2 eligible nodes of one fabric",
        "fabrics by label brink.dev/fabric: cx7-a: 1 of 1 eligible, cx7-b: 1 of 1 eligible",
        "1 no fabric label brink.dev/fabric",
    ] {
        assert!(degraded.message.contains(text), "{:?} lacks {text:?}", degraded.message);
    }
    let s = fleet.snapshot().await;
    assert!(s.replicas.is_empty() && s.pods.is_empty(), "{}", s.describe());

    // A gang larger than any fabric: the message says so; nothing crashes, nothing is created.
    label(&fleet, "spark-2", "cx7-a").await;
    label(&fleet, "spark-3", "cx7-a").await;
    let deployments = fleet.deployments();
    deployments
        .patch("qwen", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "nodesPerReplica": 4 } })))
        .await
        .expect("ask for 4 nodes");
    let degraded = fleet
        .until("Degraded names the largest fabric", 60, |s: &Snapshot| {
            s.condition("Degraded").filter(|c| c.message.contains("no fabric has 4 nodes (the largest has 3)")).cloned()
        })
        .await;
    assert_eq!(degraded.reason, "Unplaced");
    let progressing = fleet.snapshot().await.condition("Progressing").cloned().expect("Progressing");
    assert_eq!((progressing.status.as_str(), progressing.reason.as_str()), ("False", "Unplaceable"));
    // Room in a fabric again (back to 2 nodes): the gang is placed, the condition clears.
    deployments
        .patch("qwen", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "nodesPerReplica": 2 } })))
        .await
        .expect("ask for 2 nodes");
    fleet.until("placed after all", 60, |s: &Snapshot| (gangs(s).len() == 1 && s.pods.len() == 2).then_some(())).await;
    fleet.stop().await;
}

/// What a gang's agent writes once its leader's qualification passed: the replica serves and
/// passed its threshold test since `at_s`.
async fn agent_serves(fleet: &Fleet, replica: &str, at_s: i64) {
    let api: Api<brink_api::crd::ModelReplica> = Api::namespaced(fleet.double.client(), NS);
    let at = k8s_openapi::jiff::Timestamp::from_second(at_s).expect("valid time").to_string();
    let status = json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica", "metadata": { "name": replica },
        "status": { "conditions": [
            { "type": "Ready", "status": "True", "reason": "Serving", "message": "serving", "lastTransitionTime": at },
            { "type": "Qualified", "status": "True", "reason": "Passed", "message": "qualified", "lastTransitionTime": at },
        ] }
    });
    api.patch_status(replica, &PatchParams::apply("brink-agent").force(), &Patch::Apply(&status)).await.expect("agent status");
}

/// A gang as the rollout leaves it at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
enum GangState {
    /// Replica and every member Pod present, all of one replica object, at `revision`, and
    /// (for the new revision) serving.
    Whole { revision: String },
    /// Anything else: being replaced.
    Replacing(String),
}

/// Every gang of `s` (replicas of `size` nodes), by replica name.
fn gang_states(s: &Snapshot, size: usize, new_revision: &str) -> BTreeMap<String, GangState> {
    let mut out = BTreeMap::new();
    let names: std::collections::BTreeSet<String> = s.replicas.iter().map(|r| r.name_any()).collect();
    for name in names {
        let live: Vec<_> = s.replicas.iter().filter(|r| r.name_any() == name && r.metadata.deletion_timestamp.is_none()).collect();
        let member_names: Vec<String> = std::iter::once(name.clone()).chain((1..size).map(|i| format!("{name}-w{i}"))).collect();
        let members: Vec<&Pod> = s.pods.iter().filter(|p| member_names.contains(&p.name_any())).collect();
        // Never a partial gang: the members present belong to one replica object.
        let owners: std::collections::BTreeSet<String> =
            members.iter().filter_map(|p| p.owner_references().first().map(|o| o.uid.clone())).collect();
        assert!(owners.len() <= 1, "gang {name} has members of two replicas at once: {}", s.describe());
        let state = match live.as_slice() {
            [r] if members.len() == size
                && members.iter().all(|p| p.metadata.deletion_timestamp.is_none())
                && owners.iter().all(|o| Some(o) == r.metadata.uid.as_ref()) =>
            {
                let serving = r.status.as_ref().is_some_and(|st| st.phase == brink_api::crd::ReplicaPhase::Serving);
                if r.spec.revision != new_revision || serving {
                    GangState::Whole { revision: r.spec.revision.clone() }
                } else {
                    GangState::Replacing(format!("{name} at the new revision, not serving yet"))
                }
            }
            _ => GangState::Replacing(format!("{name}: {} live replica(s), {} member Pod(s)", live.len(), members.len())),
        };
        out.insert(name, state);
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_rollout_replaces_one_whole_gang_at_a_time() {
    let fleet = Fleet::start(&nodes(4));
    let sparks = ["spark-1", "spark-2", "spark-3", "spark-4"];
    for node in sparks {
        label(&fleet, node, "cx7-a").await;
    }
    let dep = deploy_gang(&fleet, 2).await;
    fleet
        .deployments()
        .patch(&dep.name_any(), &PatchParams::default(), &Patch::Merge(json!({ "spec": { "replicas": 2 } })))
        .await
        .expect("two gangs");
    fleet.until("two gangs placed", 60, |s: &Snapshot| (gangs(s).len() == 2 && s.pods.len() == 4).then_some(())).await;
    for leader in ["qwen-0", "qwen-1"] {
        fleet.mark_ready(leader).await;
        agent_serves(&fleet, leader, common::NOW_S).await;
    }
    fleet.until("both gangs serve", 60, |s: &Snapshot| s.settled(2, 2, "True").then_some(())).await;
    let before = fleet.snapshot().await;
    let old_revision = before.replicas[0].spec.revision.clone();
    assert!(before.replicas.iter().all(|r| r.spec.revision == old_revision), "{}", before.describe());
    let old_uids: BTreeMap<String, Option<String>> = before.replicas.iter().map(|r| (r.name_any(), r.metadata.uid.clone())).collect();

    let patch = json!({ "spec": { "engine": { "image": "vllm/vllm-openai:v0.11.1", "version": "0.11.1" } } });
    fleet.deployments().patch("qwen", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("new engine build");

    // Play the kubelet and the agents while the clock moves: every new leader turns Ready and
    // serves; at every step at most one gang is being replaced, and never in part.
    let mut now_s = common::NOW_S;
    let mut new_revision: Option<String> = None;
    let mut replaced_in_order: Vec<String> = Vec::new();
    let mut done = false;
    for _ in 0..400 {
        let s = fleet.snapshot().await;
        if new_revision.is_none() {
            new_revision = s.replicas.iter().map(|r| r.spec.revision.clone()).find(|r| *r != old_revision);
        }
        let Some(new) = new_revision.clone() else {
            fleet.let_pass(1).await;
            continue;
        };
        let states = gang_states(&s, 2, &new);
        let replacing: Vec<&String> = states.iter().filter(|(_, st)| matches!(st, GangState::Replacing(_))).map(|(n, _)| n).collect();
        assert!(replacing.len() <= 1, "two gangs replaced at once: {states:?}\n{}", s.describe());
        if let Some(name) = replacing.first() {
            if replaced_in_order.last() != Some(name) {
                replaced_in_order.push((*name).clone());
            }
        }
        if states.len() == 2 && states.values().all(|st| *st == GangState::Whole { revision: new.clone() }) {
            done = true;
            break;
        }
        for r in s.replicas.iter().filter(|r| r.spec.revision == new && r.metadata.deletion_timestamp.is_none()) {
            let leader_ready = s.pods.iter().any(|p| {
                p.name_any() == r.name_any()
                    && p.owner_references().first().map(|o| Some(&o.uid) == r.metadata.uid.as_ref()).unwrap_or(false)
                    && p.status
                        .as_ref()
                        .and_then(|st| st.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
            let worker = s.pods.iter().any(|p| p.name_any() == format!("{}-w1", r.name_any()));
            let agent_done = r.status.as_ref().is_some_and(|st| st.conditions.iter().any(|c| c.type_ == "Qualified" && c.status == "True"));
            if worker && !leader_ready && s.pods.iter().any(|p| p.name_any() == r.name_any()) {
                fleet.mark_ready(&r.name_any()).await;
            }
            if worker && !agent_done {
                agent_serves(&fleet, &r.name_any(), now_s).await;
            }
        }
        now_s += 2;
        fleet.set_clock(now_s);
        for node in sparks {
            fleet.renew(node, now_s).await;
        }
        fleet.let_pass(1).await;
    }
    let s = fleet.snapshot().await;
    assert!(done, "the rollout did not finish: {replaced_in_order:?}\n{}", s.describe());
    // Each gang was replaced (new objects), one after the other, each once.
    assert_eq!(replaced_in_order.len(), 2, "{replaced_in_order:?}");
    assert_ne!(replaced_in_order[0], replaced_in_order[1]);
    for r in s.replicas.iter() {
        assert_ne!(old_uids.get(&r.name_any()).cloned().flatten(), r.metadata.uid, "{} was not recreated", r.name_any());
    }
    // Each gang came back whole on its own nodes.
    assert_eq!(gangs(&s), gangs(&before));
    fleet.stop().await;
}
