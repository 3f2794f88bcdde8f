//! The harness of the whole-flow tests: the operator's real controllers (`controllers::run`)
//! against the in-memory API server (`brink_kube_double::KubeDouble`), with the test playing
//! the parts no controller of brink plays: the kubelet (Pod readiness), the node agents
//! (SparkNode qualifications, heartbeat Leases) and the cluster admin (cordon, scale).
//!
//! Tokio's clock is paused: a controller's requeue after 15 s or its 20 s resync fires as soon
//! as nothing else runs, so no flow sleeps. Every wait is bounded twice: by the controllers'
//! own time (what the flow may take under their timers) and by 10 s of real time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use brink_api::Verdict;
use brink_api::crd::{Condition, ModelDeployment, ModelReplica, ReplicaPhase, SparkNode};
use brink_kube_double::KubeDouble;
use brink_operator::controllers::{self, Config, FixedClock, Metrics, Shared};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::common::{self, LEASE_NS, NOW_S, NS};

/// Real time any one wait may take.
const REAL_LIMIT: Duration = Duration::from_secs(10);
/// Lease duration the agents write.
pub const LEASE_S: i64 = 40;

/// An object as a client would create it: no server-set metadata.
fn fresh<K: Resource>(mut obj: K) -> K {
    let meta = obj.meta_mut();
    meta.uid = None;
    meta.resource_version = None;
    meta.generation = None;
    obj
}

/// A qualification result for `CLASS` as an agent reports it (the apply body's list entry).
pub fn qualification(verdict: Verdict) -> serde_json::Value {
    serde_json::to_value(common::qualification(verdict)).expect("qualification as JSON")
}

/// One node of the fleet at the start.
pub struct NodeSetup {
    pub name: &'static str,
    pub qualified: bool,
}

/// The controllers running against a double holding a fleet, the model and nothing else.
pub struct Fleet {
    pub double: KubeDouble,
    pub clock: Arc<FixedClock>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Fleet {
    /// Seeds Nodes, SparkNodes (120 GiB available; qualified for `CLASS` or not), fresh
    /// heartbeat Leases and the Model with its facts, then starts `controllers::run`.
    pub fn start(nodes: &[NodeSetup]) -> Fleet {
        let double = KubeDouble::new();
        // The API server's clock and the controllers' agree (creation times, rollout deadlines).
        double.set_wall_clock(NOW_S);
        for n in nodes {
            double.seed(&fresh(common::node(n.name))).expect("seed Node");
            let spark = if n.qualified { common::qualified(n.name) } else { common::spark(n.name, None) };
            double.seed(&fresh(spark)).expect("seed SparkNode");
            double.seed(&lease(n.name, NOW_S)).expect("seed Lease");
        }
        double.seed(&fresh(common::model())).expect("seed Model");
        let clock = Arc::new(FixedClock::new(Timestamp::from_second(NOW_S).expect("valid time")));
        let shared = Arc::new(Shared {
            client: double.client(),
            metrics: Arc::new(Metrics::new().expect("metrics")),
            clock: clock.clone(),
            config: Config { lease_namespace: LEASE_NS.into(), agent_image: Some("ghcr.io/brink/brink:0.2.0".into()), ..Config::default() },
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(controllers::run(shared, async move {
            let _ = stopped.await;
        }));
        Fleet { double, clock, stop: Some(stop), task }
    }

    /// Stops the controllers and waits for them to drain (a hung drain fails the test).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = &mut self.task;
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("controllers drain after shutdown").expect("controllers task");
    }

    pub fn deployments(&self) -> Api<ModelDeployment> {
        Api::namespaced(self.double.client(), NS)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.double.client(), NS)
    }

    /// Creates the deployment of [`common::deployment`] with `replicas`.
    pub async fn deploy(&self, replicas: i32) -> ModelDeployment {
        let dep = fresh(common::deployment(replicas));
        self.deployments().create(&Default::default(), &dep).await.expect("create ModelDeployment")
    }

    /// Moves the controllers' clock to `at_s`.
    pub fn set_clock(&self, at_s: i64) {
        self.clock.set(Timestamp::from_second(at_s).expect("valid time"));
    }

    /// The agent of `node` renews its heartbeat at `at_s`.
    pub async fn renew(&self, node: &str, at_s: i64) {
        let leases: Api<Lease> = Api::namespaced(self.double.client(), LEASE_NS);
        let patch = json!({ "spec": { "renewTime": micro(at_s) } });
        leases.patch(&format!("brink-node-{node}"), &PatchParams::default(), &Patch::Merge(&patch)).await.expect("renew Lease");
    }

    /// The kubelet reports the Pod running and Ready (its readiness probe passed).
    pub async fn mark_ready(&self, pod: &str) {
        let status = json!({ "status": {
            "phase": "Running",
            "conditions": [{ "type": "Ready", "status": "True" }],
        }});
        self.pods().patch_status(pod, &PatchParams::default(), &Patch::Merge(&status)).await.expect("Pod status");
    }

    /// The admin cordons `node`.
    pub async fn cordon(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.double.client());
        nodes.patch(node, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "unschedulable": true } }))).await.expect("cordon");
    }

    /// The agent of `node` reports its qualification result for `CLASS`.
    pub async fn report_qualified(&self, node: &str, verdict: Verdict) {
        let sparks: Api<SparkNode> = Api::all(self.double.client());
        let patch = json!({
            "apiVersion": "brink.dev/v1alpha1",
            "kind": "SparkNode",
            "metadata": { "name": node },
            "status": { "qualifications": [qualification(verdict)] },
        });
        sparks.patch_status(node, &PatchParams::apply("brink-agent"), &Patch::Apply(&patch)).await.expect("report qualification");
    }

    /// What the flows look at, read through the API as any client would.
    pub async fn snapshot(&self) -> Snapshot {
        let replicas: Api<ModelReplica> = Api::namespaced(self.double.client(), NS);
        let params = ListParams::default();
        let replicas = replicas.list(&params).await.expect("list ModelReplicas").items;
        let pods = self.pods().list(&params).await.expect("list Pods").items;
        let deployment = self.deployments().get_opt("qwen").await.expect("get ModelDeployment");
        Snapshot { replicas, pods, deployment }
    }

    /// Waits until `probe` finds what it wants in a snapshot, for at most `within_s` seconds of
    /// the controllers' time (tokio's paused clock) and [`REAL_LIMIT`] of real time; fails the
    /// test otherwise, showing the last snapshot and the latest requests.
    pub async fn until<T>(&self, what: &str, within_s: u64, mut probe: impl FnMut(&Snapshot) -> Option<T>) -> T {
        let started = tokio::time::Instant::now();
        let real = std::time::Instant::now();
        loop {
            let snap = self.snapshot().await;
            if let Some(v) = probe(&snap) {
                return v;
            }
            let virtual_s = started.elapsed().as_secs_f64();
            if virtual_s > within_s as f64 || real.elapsed() > REAL_LIMIT {
                let log = self.double.request_lines();
                let tail: Vec<&String> = log.iter().filter(|l| !l.starts_with("GET")).rev().take(30).collect();
                panic!(
                    "{what}: not reached within {within_s} s of controller time ({virtual_s:.1} s passed, {:.1} s real)\n{}\nlatest writes:\n{}",
                    real.elapsed().as_secs_f64(),
                    snap.describe(),
                    tail.iter().rev().map(|l| l.as_str()).collect::<Vec<_>>().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Lets `secs` of controller time pass (resyncs and requeues run meanwhile).
    pub async fn let_pass(&self, secs: u64) {
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
}

/// The objects a flow asserts on.
pub struct Snapshot {
    pub replicas: Vec<ModelReplica>,
    pub pods: Vec<Pod>,
    pub deployment: Option<ModelDeployment>,
}

impl Snapshot {
    /// Replicas not being deleted: name → node.
    pub fn placed(&self) -> BTreeMap<String, String> {
        self.replicas.iter().filter(|r| r.metadata.deletion_timestamp.is_none()).map(|r| (r.name_any(), r.spec.node.clone())).collect()
    }

    /// Pods: name → `spec.nodeName`.
    pub fn pod_nodes(&self) -> BTreeMap<String, String> {
        self.pods.iter().map(|p| (p.name_any(), p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default())).collect()
    }

    pub fn phase(&self, replica: &str) -> Option<ReplicaPhase> {
        self.replicas.iter().find(|r| r.name_any() == replica).and_then(|r| r.status.as_ref()).map(|s| s.phase)
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.deployment.as_ref()?.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
    }

    /// `(replicas, readyReplicas)` of the deployment's status.
    pub fn counts(&self) -> Option<(i32, i32)> {
        self.deployment.as_ref()?.status.as_ref().map(|s| (s.replicas, s.ready_replicas))
    }

    /// The deployment's status says `replicas` and `ready`, with Ready `ready_cond`.
    pub fn settled(&self, replicas: i32, ready: i32, ready_cond: &str) -> bool {
        self.counts() == Some((replicas, ready)) && self.condition("Ready").is_some_and(|c| c.status == ready_cond)
    }

    /// A picture of the fleet for failure messages.
    pub fn describe(&self) -> String {
        let replicas: Vec<String> = self
            .replicas
            .iter()
            .map(|r| {
                let gone = if r.metadata.deletion_timestamp.is_some() { " (deleting)" } else { "" };
                format!("{}@{}:{:?}{gone}", r.name_any(), r.spec.node, r.status.as_ref().map(|s| s.phase))
            })
            .collect();
        let conditions: Vec<String> = self
            .deployment
            .as_ref()
            .and_then(|d| d.status.as_ref())
            .map(|s| s.conditions.iter().map(|c| format!("{}={} {} ({})", c.type_, c.status, c.reason, c.message)).collect())
            .unwrap_or_default();
        format!(
            "replicas {replicas:?}\npods {:?}\nstatus (replicas, ready) {:?}\nconditions {conditions:#?}",
            self.pod_nodes(),
            self.counts()
        )
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn micro(at_s: i64) -> MicroTime {
    MicroTime(Timestamp::from_second(at_s).expect("valid time"))
}

/// The heartbeat Lease of `node`, renewed at `at_s`.
pub fn lease(node: &str, at_s: i64) -> Lease {
    Lease {
        metadata: ObjectMeta { name: Some(format!("brink-node-{node}")), namespace: Some(LEASE_NS.into()), ..ObjectMeta::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.into()),
            lease_duration_seconds: Some(LEASE_S as i32),
            renew_time: Some(micro(at_s)),
            ..LeaseSpec::default()
        }),
    }
}
