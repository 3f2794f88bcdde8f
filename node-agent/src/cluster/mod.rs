//! `brink-agent run`: the DaemonSet's process, one per node. It keeps the node's `SparkNode`
//! (owned by its `Node`; device, fingerprint, qualification per shape class, capacity, hosted
//! replicas, conditions, heartbeat), renews the node's heartbeat Lease, qualifies the shape
//! classes the operator asks for (one at a time, the kernel self-test in child processes) and
//! keeps the model cache for the replicas placed here. Its readiness means "running", never
//! "qualified": one bad node must not block a rollout.
//!
//! - [`agent`]: the Kubernetes I/O (ordinary `kube::Api` calls);
//! - pure decisions: [`lease`] (the next renew), [`node_status`] (the status document),
//!   [`qualify_plan`] (what to qualify next), [`cache_plan`] (what to hold, the status bodies),
//!   [`errors`] (what an API failure means, in words);
//! - [`qualifier`]: the self-test behind a trait the tests replace;
//! - [`sweeper`]: this node's part of the operator's `SweepRun`s (what is due: [`sweep_plan`]),
//!   the executor behind a trait the tests replace;
//! - [`http`] and [`metrics`]: the `--listen` endpoint (`/health`, `/ready`, `/metrics`).
//!
//! [`run_loop`] is the whole process after start-up, given its parts and a stop signal.

pub mod agent;
pub mod cache_plan;
pub mod errors;
pub mod http;
pub mod lease;
pub mod metrics;
pub mod node_status;
pub mod qualifier;
pub mod qualify_plan;
pub mod sweep_plan;
pub mod sweeper;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use brink_api::crd::{Model, ModelReplica, NodeFingerprint, SparkNode, SweepRun};
use brink_engine::BackendKind;
use brink_engine::server::telemetry::NodeMetrics;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use crate::cmd::flags::ServingFlags;
use crate::error::Error;
use crate::model_cache::{CacheConfig, ModelCache};
use agent::{Agent, Probes, Settings};
use node_status::NodeState;
use qualifier::{KernelCasesByClass, Qualifier, SelfTest};
use sweeper::{RealExecutor, Round, SweepExecutor, SweepSettings};

const MEMINFO: &str = "/proc/meminfo";

#[derive(clap::Args)]
pub struct Args {
    /// This node's name (default: $NODE_NAME, set from the downward API's spec.nodeName).
    #[arg(long)]
    node_name: Option<String>,
    /// Namespace of the heartbeat Lease (default: $POD_NAMESPACE, the agent's own).
    #[arg(long)]
    lease_namespace: Option<String>,
    /// Seconds a heartbeat holds; renewed every quarter of it.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(i32).range(4..=3600))]
    lease_duration_seconds: i32,
    /// The model cache's directory (default: <state dir>/model-cache).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Disk the model cache may use, bytes (least recently used models no replica here uses are evicted).
    #[arg(long, default_value_t = 400 << 30, value_parser = clap::value_parser!(u64).range(1..))]
    cache_budget_bytes: u64,
    /// Where PVCs holding models are mounted: a Model's `pvc` source is read at <root>/<claimName>/<path>.
    #[arg(long, default_value = "/mnt/brink/pvc")]
    pvc_root: PathBuf,
    /// Where qualifications are kept (as `up`; default: $BRINK_STATE_DIR, else $XDG_STATE_HOME/brink, else ~/.local/state/brink).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// The self-test's limits (`up`'s, so `up`'s cached results are reused); the stall timeout
    /// of a sweep's server.
    #[command(flatten)]
    serving: ServingFlags,
    /// Unified memory kept free for the OS and the agent, bytes (reported in the capacity).
    #[arg(long, default_value_t = 4 << 30)]
    reserved_memory_bytes: u64,
    /// Seconds between full resyncs (watch events trigger one sooner).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    resync_seconds: u64,
    /// Seconds between download progress writes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    progress_seconds: u64,
    /// The endpoint: /health, /ready (the SparkNode was written) and /metrics.
    #[arg(long, default_value = "0.0.0.0:8082")]
    listen: SocketAddr,
    /// Seconds a sweep's grid point may take before its unanswered requests count as hung.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    sweep_point_timeout: u64,
}

pub fn run(a: Args) -> ExitCode {
    // Two providers are compiled in (see Cargo.toml): pick one before any TLS client is built.
    // An error means one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let code = rt.block_on(async {
        match main_loop(a).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        }
    });
    // A self-test still running on a blocking thread is not waited for.
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

/// A flag, else the environment variable the DaemonSet sets.
fn flag_or_env(flag: Option<String>, var: &'static str, name: &'static str) -> Result<String, Error> {
    flag.or_else(|| std::env::var(var).ok()).filter(|v| !v.trim().is_empty()).ok_or(Error::Unset { flag: name, var })
}

async fn main_loop(a: Args) -> Result<(), Error> {
    let node = flag_or_env(a.node_name.clone(), "NODE_NAME", "--node-name")?;
    let lease_namespace = flag_or_env(a.lease_namespace.clone(), "POD_NAMESPACE", "--lease-namespace")?;
    let state_dir = a.state_dir.clone().or_else(|| crate::qualify::cache::state_dir(|k| std::env::var(k).ok())).ok_or(Error::NoStateDir)?;
    let cache_dir = a.cache_dir.clone().unwrap_or_else(|| state_dir.join("model-cache"));
    let replica_reports = state_dir.clone();
    let cache = Arc::new(ModelCache::open(CacheConfig::new(&cache_dir, a.cache_budget_bytes))?);

    let config = kube::Config::infer().await.map_err(|e| Error::Setup {
        what: "no Kubernetes API configuration (neither in-cluster service account nor KUBECONFIG / ~/.kube/config)",
        reason: e.to_string(),
    })?;
    let api_url = config.cluster_url.to_string();
    let client = Client::try_from(config)
        .map_err(|e| Error::Setup { what: "cannot build a client for the Kubernetes API", reason: format!("{api_url}: {e}") })?;

    let discovery = crate::device::discover(0);
    for w in &discovery.warnings {
        eprintln!("brink-agent run: warning: {w}");
    }
    let device = discovery.report;
    let serving = a.serving.params(0, false);
    let fingerprint = NodeFingerprint::of(&crate::qualify::fingerprint(device.device.as_ref(), "", serving));
    let kernel_cases = KernelCasesByClass::default();
    let qualifier: Arc<dyn Qualifier> = Arc::new(SelfTest {
        device: device.device.clone(),
        no_gpu_reason: device.no_gpu_reason.clone(),
        state_dir: state_dir.clone(),
        cache_root: cache.root().to_path_buf(),
        max_batch_tokens: a.serving.max_batch_tokens,
        prefill_chunk: a.serving.prefill_chunk,
        kernel_cases: kernel_cases.clone(),
    });
    let sweep = SweepSettings {
        backend: if device.gpu { BackendKind::Cuda } else { BackendKind::Cpu },
        state_dir,
        max_batch_tokens: a.serving.max_batch_tokens,
        prefill_chunk: a.serving.prefill_chunk,
        point_timeout: Duration::from_secs(a.sweep_point_timeout),
        load_timeout: Duration::from_secs(900),
        stall_timeout: a.serving.stall_timeout,
    };
    let executor: Arc<dyn SweepExecutor> = Arc::new(RealExecutor { device: device.clone() });
    let state = NodeState::new(device, fingerprint, None);
    let settings = Settings {
        node: node.clone(),
        lease_namespace,
        lease_seconds: a.lease_duration_seconds,
        api_url,
        pvc_root: a.pvc_root.clone(),
        reserved_memory_bytes: a.reserved_memory_bytes,
        progress_every: Duration::from_secs(a.progress_seconds),
        replica_reports: Some(replica_reports),
    };
    let probes = Probes {
        now: Arc::new(k8s_openapi::jiff::Timestamp::now),
        memory: Arc::new(|| {
            let text = std::fs::read_to_string(MEMINFO).ok()?;
            crate::device::meminfo::parse_meminfo(&text, MEMINFO).ok()
        }),
    };
    let parts = Parts {
        agent: Arc::new(Agent::new(client, settings, probes, state)),
        qualifier,
        kernel_cases,
        cache,
        cache_budget_bytes: a.cache_budget_bytes,
        executor,
        sweep,
        beat: Duration::from_secs(u64::try_from(a.lease_duration_seconds / 4).unwrap_or(10).max(1)),
        resync: Duration::from_secs(a.resync_seconds),
        listen: Some(Listen::Addr(a.listen)),
        sensors: crate::node_metrics::provider(None),
    };
    Ok(run_loop(parts, brink_engine::server::terminate_or_interrupt()).await?)
}

/// The endpoint's socket: an address bound once the SparkNode is written (a process that cannot
/// reach the API ends before it takes the port), or a socket already bound (tests: port 0).
pub enum Listen {
    Addr(SocketAddr),
    /// Tests pass a socket bound to port 0.
    Bound(tokio::net::TcpListener),
}

/// Everything the loop runs with; `main_loop` builds them from the flags, tests from doubles.
pub struct Parts {
    pub agent: Arc<Agent>,
    pub qualifier: Arc<dyn Qualifier>,
    pub kernel_cases: KernelCasesByClass,
    pub cache: Arc<ModelCache>,
    pub cache_budget_bytes: u64,
    pub executor: Arc<dyn SweepExecutor>,
    pub sweep: SweepSettings,
    /// Heartbeat period (a quarter of the Lease).
    pub beat: Duration,
    pub resync: Duration,
    /// Where `/health`, `/ready` and `/metrics` are served (None: not served).
    pub listen: Option<Listen>,
    /// The node's sensor gauges (memory, GPU).
    pub sensors: NodeMetrics,
}

/// The agent from start-up to `stop`: the SparkNode and Lease, then the endpoint, heartbeats,
/// qualification, model-cache and sweep rounds on every watch event and resync, one of each
/// kind at a time. At `stop`: a sweep in flight is abandoned (its result says so), the other
/// rounds are aborted, the endpoint closed and the SparkNode marked stopping.
pub async fn run_loop(p: Parts, stop: impl Future<Output = ()>) -> Result<(), crate::error::Error> {
    let agent = p.agent.clone();
    let node = agent.settings.node.clone();
    let ready = Arc::new(AtomicBool::new(false));
    let scalars = scrape(&p);
    agent.start().await?;
    let listener = match p.listen {
        None => None,
        Some(Listen::Bound(l)) => Some(l),
        Some(Listen::Addr(addr)) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => Some(l),
            Err(e) => {
                if let Err(e) = agent.stop().await {
                    eprintln!("brink-agent run: warning: could not mark SparkNode {node} AgentStopping: {e}");
                }
                return Err(crate::error::Error::Listen { flag: "--listen", addr: addr.to_string(), source: e });
            }
        },
    };
    let server = listener.map(|listener| {
        let endpoint = http::Endpoint { ready: ready.clone(), scalars };
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, http::router(endpoint)).await {
                eprintln!("brink-agent run: the --listen endpoint stopped: {e}");
            }
        })
    });
    ready.store(true, Ordering::Release);
    eprintln!("brink-agent run: SparkNode {node} is up; heartbeat every {:?}", p.beat);

    let mut events = triggers(agent.client(), &node);
    let mut beat = tokio::time::interval(p.beat);
    let mut resync = tokio::time::interval(p.resync);
    let mut qualifying: Option<JoinHandle<()>> = None;
    let mut syncing: Option<JoinHandle<()>> = None;
    let mut sweeping: Option<JoinHandle<()>> = None;
    let mut dirty = true;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = beat.tick() => {
                if let Err(e) = agent.heartbeat().await {
                    eprintln!("brink-agent run: heartbeat: {e}");
                }
            }
            Some(()) = events.next() => dirty = true,
            _ = resync.tick() => dirty = true,
        }
        if !dirty {
            continue;
        }
        let idle = |h: &Option<JoinHandle<()>>| h.as_ref().is_none_or(|h| h.is_finished());
        // The sweep round first: it takes the GPU before a qualification round can.
        if idle(&sweeping) {
            let (agent, cache, executor, settings) = (agent.clone(), p.cache.clone(), p.executor.clone(), p.sweep.clone());
            sweeping = Some(tokio::spawn(async move { sweep_rounds(&agent, &cache, executor, &settings).await }));
        }
        if idle(&qualifying) {
            let (agent, qualifier) = (agent.clone(), p.qualifier.clone());
            qualifying = Some(tokio::spawn(async move {
                if let Err(e) = agent.qualify_round(qualifier).await {
                    eprintln!("brink-agent run: qualification: {e}");
                }
            }));
        }
        if idle(&syncing) {
            let (agent, cache) = (agent.clone(), p.cache.clone());
            syncing = Some(tokio::spawn(async move {
                if let Err(e) = agent.sync_models(&cache).await {
                    eprintln!("brink-agent run: model cache: {e}");
                }
            }));
        }
        dirty = false;
    }
    eprintln!("brink-agent run: stopping");
    for h in [sweeping, qualifying, syncing, server].into_iter().flatten() {
        h.abort();
        // Aborted tasks end at their next await; the sweep's blocking executor is left to the
        // runtime's shutdown.
        let _ = h.await;
    }
    match agent.abandon_sweep().await {
        Ok(Some(run)) => eprintln!("brink-agent run: sweep {run} abandoned; its result says so"),
        Ok(None) => {}
        Err(e) => eprintln!("brink-agent run: warning: could not mark the abandoned sweep's result: {e}"),
    }
    if let Err(e) = agent.stop().await {
        eprintln!("brink-agent run: warning: could not mark SparkNode {node} AgentStopping: {e}");
    }
    Ok(())
}

/// Sweep rounds until nothing is due: a run queued behind a qualification waits for the GPU
/// and is decided again, and a finished run lets the next one start without waiting for a tick.
async fn sweep_rounds(agent: &Agent, cache: &ModelCache, executor: Arc<dyn SweepExecutor>, settings: &SweepSettings) {
    loop {
        match agent.sweep_round(cache, executor.clone(), settings).await {
            Ok(Round::Nothing) => return,
            Ok(Round::Ran(..)) => {}
            Ok(Round::Waiting(run, why)) => {
                eprintln!("brink-agent run: sweep {run} is due; waiting ({why:?})");
                drop(agent.gpu.lock().await);
            }
            Err(e) => {
                eprintln!("brink-agent run: sweep: {e}");
                return;
            }
        }
    }
}

/// Every series `/metrics` shows, read at each scrape.
fn scrape(p: &Parts) -> Arc<dyn Fn() -> Vec<brink_engine::server::telemetry::Scalar> + Send + Sync> {
    let (agent, cache, kernels, sensors, budget) =
        (p.agent.clone(), p.cache.clone(), p.kernel_cases.clone(), p.sensors.clone(), p.cache_budget_bytes);
    Arc::new(move || {
        let view = metrics::View {
            qualifications: agent.snapshot().qualifications.into_values().collect(),
            kernel_cases: kernels.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            cache_bytes: cache.entries().ok().map(|es| es.iter().map(|e| e.size).fold(0u64, u64::saturating_add)),
            cache_budget_bytes: budget,
            sweeps: agent.sweeps_finished(),
        };
        let mut out = sensors.read();
        out.extend(metrics::scalars(&view));
        out
    })
}

/// One item per change to this node's SparkNode, any ModelReplica, Model or SweepRun (their
/// watchers retry with backoff on errors; the periodic resync covers what a watch misses).
fn triggers(client: &Client, node: &str) -> futures::stream::BoxStream<'static, ()> {
    let cfg = watcher::Config::default();
    let own = watcher(Api::<SparkNode>::all(client.clone()), cfg.clone().fields(&format!("metadata.name={node}")));
    let replicas = watcher(Api::<ModelReplica>::all(client.clone()), cfg.clone());
    let models = watcher(Api::<Model>::all(client.clone()), cfg.clone());
    let runs = watcher(Api::<SweepRun>::all(client.clone()), cfg);
    let quiet = |r: Result<(), watcher::Error>| async move {
        match r {
            Ok(()) => Some(()),
            Err(e) => {
                eprintln!("brink-agent run: watch: {e}");
                None
            }
        }
    };
    futures::stream::select_all([
        own.default_backoff().map(|r| r.map(|_| ())).boxed(),
        replicas.default_backoff().map(|r| r.map(|_| ())).boxed(),
        models.default_backoff().map(|r| r.map(|_| ())).boxed(),
        runs.default_backoff().map(|r| r.map(|_| ())).boxed(),
    ])
    .filter_map(quiet)
    // Ended (never, in practice): yields nothing more instead of being polled past its end.
    .fuse()
    .boxed()
}
