//! What every reconcile shares: the client, the caches it reads from, the Event recorder, the
//! metrics, the clock and the settings. Reads come from the caches (reflector stores fed by
//! watches), writes go through ordinary `kube::Api` calls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use brink_api::crd::{Model, ModelDeployment, ModelReplica, SparkNode, SweepRun};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};

use super::metrics::Metrics;
use crate::decide::{HeartbeatHistory, HeartbeatPolicy, RecoveryPolicy};

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "brink-operator";

/// Now, injectable so that tests and the heartbeat hysteresis see the time they are given.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that says what it was set to (tests, simulations).
pub struct FixedClock(pub Mutex<Timestamp>);

impl FixedClock {
    pub fn new(at: Timestamp) -> FixedClock {
        FixedClock(Mutex::new(at))
    }

    pub fn set(&self, at: Timestamp) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = at;
    }
}

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Settings of the controllers (the `run` flags).
#[derive(Clone, Debug)]
pub struct Config {
    /// Namespace of the agents' heartbeat Leases (`brink-node-<node>`).
    pub lease_namespace: String,
    /// Directory of the agents' model cache on every node; mounted read-only into replica Pods.
    pub model_cache_dir: String,
    /// The agents' state directory on every node (qualifications); mounted into replica Pods,
    /// which reuse and keep their model-level test results there.
    pub node_state_dir: String,
    /// Memory kept free on a node after a replica is placed there, on top of the node's own reserve.
    pub memory_reserve_bytes: u64,
    /// The port `brink-agent serve` listens on in a replica Pod (and the Service's target).
    pub serve_port: u16,
    /// How long a replica may take to load and pass its model test before the startup probe fails it.
    pub startup_seconds: u32,
    pub heartbeat: HeartbeatPolicy,
    /// The backoff of replacing a replica's failed Pod (see `decide::pod_recovery`).
    pub recovery: RecoveryPolicy,
    /// How often a deployment is decided again with no event (heartbeats expire without one).
    pub resync_seconds: u64,
    /// How long in-flight reconciles may run after the shutdown signal.
    pub drain_seconds: u64,
    /// A Secret in each replica's namespace whose key `keys` holds the replicas' API keys (one
    /// per line); None: replicas accept requests without a key.
    pub replica_api_keys_secret: Option<String>,
    /// The OTLP endpoint replica Pods export to (`OTEL_EXPORTER_OTLP_ENDPOINT`); None: no export.
    pub replica_otlp_endpoint: Option<String>,
    /// brink-agent's image, for the qualification sidecar of replicas on other engines; None:
    /// such replicas cannot get Pods (their reconcile says so).
    pub agent_image: Option<String>,
    /// Whether the LeaderWorkerSet API (`leaderworkerset.x-k8s.io/v1`) is served: gangs are
    /// then LeaderWorkerSets instead of bare Pods. Found by discovery when the controllers start.
    pub leader_worker_set: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            lease_namespace: "brink-system".into(),
            model_cache_dir: "/var/lib/brink/cache".into(),
            node_state_dir: "/var/lib/brink/state".into(),
            memory_reserve_bytes: 0,
            serve_port: 8080,
            startup_seconds: 1800,
            heartbeat: HeartbeatPolicy::default(),
            recovery: RecoveryPolicy::default(),
            // Twice per default 40 s lease, as the heartbeat rule needs.
            resync_seconds: 20,
            // Inside the kubelet's default 30 s termination grace.
            drain_seconds: 25,
            replica_api_keys_secret: None,
            replica_otlp_endpoint: None,
            agent_image: None,
            leader_worker_set: false,
        }
    }
}

/// The reflector stores reconciles read from.
#[derive(Clone)]
pub struct Caches {
    pub nodes: Store<Node>,
    pub spark_nodes: Store<SparkNode>,
    pub leases: Store<Lease>,
    pub models: Store<Model>,
    pub replicas: Store<ModelReplica>,
    /// Runs that drain nodes (`drainReplicas`) keep replicas off them.
    pub sweep_runs: Store<SweepRun>,
}

/// Heartbeat histories per node, kept between reconciles (the hysteresis needs the past).
#[derive(Default)]
pub struct HeartbeatBook(Mutex<HashMap<String, HeartbeatHistory>>);

impl HeartbeatBook {
    /// Records the node's Lease as read now and returns its history.
    pub fn observe(
        &self,
        node: &str,
        renew_s: Option<u64>,
        lease_duration_s: u64,
        now_s: u64,
        policy: &HeartbeatPolicy,
    ) -> HeartbeatHistory {
        let mut book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let h = book.entry(node.to_string()).or_insert_with(|| HeartbeatHistory::new(lease_duration_s));
        h.observe(renew_s, lease_duration_s, now_s, policy);
        h.clone()
    }

    /// Forgets nodes that no longer exist.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).retain(|k, _| keep(k));
    }
}

pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub config: Config,
    pub caches: Caches,
    pub heartbeats: HeartbeatBook,
    /// Deployments with replicas that could not be placed: any node change requeues them.
    pub unplaced: Mutex<std::collections::HashSet<ObjectRef<ModelDeployment>>>,
}

/// What `main` builds before the controllers run: everything but the caches, which
/// [`super::run`] fills from its watches each time it starts.
#[derive(Clone)]
pub struct Shared {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub config: Config,
}

impl Context {
    pub fn new(shared: &Shared, caches: Caches) -> Context {
        let reporter = Reporter { controller: FIELD_MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
        Context {
            recorder: Recorder::new(shared.client.clone(), reporter),
            client: shared.client.clone(),
            metrics: shared.metrics.clone(),
            clock: shared.clock.clone(),
            config: shared.config.clone(),
            caches,
            heartbeats: HeartbeatBook::default(),
            unplaced: Mutex::new(Default::default()),
        }
    }

    /// Seconds since the Unix epoch (0 before it).
    pub fn now_s(&self) -> u64 {
        u64::try_from(self.clock.now().as_second()).unwrap_or(0)
    }

    pub fn mark_unplaced(&self, dep: ObjectRef<ModelDeployment>, unplaced: bool) {
        let mut set = self.unplaced.lock().unwrap_or_else(|p| p.into_inner());
        if unplaced {
            set.insert(dep);
        } else {
            set.remove(&dep);
        }
    }

    pub fn unplaced_deployments(&self) -> Vec<ObjectRef<ModelDeployment>> {
        self.unplaced.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }
}
