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
//! - [`qualifier`]: the self-test behind a trait the tests replace.

pub mod agent;
pub mod cache_plan;
pub mod errors;
pub mod lease;
pub mod node_status;
pub mod qualifier;
pub mod qualify_plan;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use brink_api::ServingParams;
use brink_api::crd::{Model, ModelReplica, NodeFingerprint, SparkNode};
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use crate::model_cache::{CacheConfig, ModelCache};
use agent::{Agent, Probes, Settings};
use node_status::NodeState;
use qualifier::{Qualifier, SelfTest};

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
    /// The self-test's batch limit (as `up`'s default, so `up`'s cached results are reused).
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    max_batch_tokens: u64,
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    prefill_chunk: u64,
    /// Unified memory kept free for the OS and the agent, bytes (reported in the capacity).
    #[arg(long, default_value_t = 4 << 30)]
    reserved_memory_bytes: u64,
    /// Seconds between full resyncs (watch events trigger one sooner).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    resync_seconds: u64,
    /// Seconds between download progress writes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    progress_seconds: u64,
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
fn flag_or_env(flag: Option<String>, var: &str, name: &str) -> Result<String, String> {
    flag.or_else(|| std::env::var(var).ok())
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| format!("{name}: not given and ${var} is not set"))
}

async fn main_loop(a: Args) -> Result<(), String> {
    let node = flag_or_env(a.node_name.clone(), "NODE_NAME", "--node-name")?;
    let lease_namespace = flag_or_env(a.lease_namespace.clone(), "POD_NAMESPACE", "--lease-namespace")?;
    let state_dir = a
        .state_dir
        .clone()
        .or_else(|| crate::qualify::cache::state_dir(|k| std::env::var(k).ok()))
        .ok_or("no state directory: pass --state-dir, or set BRINK_STATE_DIR or HOME")?;
    let cache_dir = a.cache_dir.clone().unwrap_or_else(|| state_dir.join("model-cache"));
    let cache = Arc::new(ModelCache::open(CacheConfig::new(&cache_dir, a.cache_budget_bytes)).map_err(|e| e.to_string())?);

    let config = kube::Config::infer().await.map_err(|e| {
        format!("no Kubernetes API configuration (neither in-cluster service account nor KUBECONFIG / ~/.kube/config): {e}")
    })?;
    let api_url = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|e| format!("cannot build a client for the Kubernetes API at {api_url}: {e}"))?;

    let discovery = crate::device::discover(0);
    for w in &discovery.warnings {
        eprintln!("brink-agent run: warning: {w}");
    }
    let device = discovery.report;
    let serving = ServingParams { max_batch_tokens: a.max_batch_tokens, prefill_chunk: a.prefill_chunk, context: 0 };
    let fingerprint = NodeFingerprint::of(&crate::qualify::fingerprint(device.device.as_ref(), "", serving));
    let qualifier: Arc<dyn Qualifier> = Arc::new(SelfTest {
        device: device.device.clone(),
        no_gpu_reason: device.no_gpu_reason.clone(),
        state_dir,
        cache_root: cache.root().to_path_buf(),
        max_batch_tokens: a.max_batch_tokens,
        prefill_chunk: a.prefill_chunk,
    });
    let state = NodeState::new(device, fingerprint, None);
    let settings = Settings {
        node: node.clone(),
        lease_namespace,
        lease_seconds: a.lease_duration_seconds,
        api_url,
        pvc_root: a.pvc_root.clone(),
        reserved_memory_bytes: a.reserved_memory_bytes,
        progress_every: Duration::from_secs(a.progress_seconds),
    };
    let probes = Probes {
        now: Arc::new(k8s_openapi::jiff::Timestamp::now),
        memory: Arc::new(|| {
            let text = std::fs::read_to_string(MEMINFO).ok()?;
            crate::device::meminfo::parse_meminfo(&text, MEMINFO).ok()
        }),
    };
    let agent = Arc::new(Agent::new(client.clone(), settings, probes, state));
    agent.start().await.map_err(|e| e.to_string())?;
    eprintln!("brink-agent run: SparkNode {node} is up; heartbeat every {} s", a.lease_duration_seconds / 4);

    let mut events = triggers(&client, &node);
    let mut beat = tokio::time::interval(Duration::from_secs(u64::try_from(a.lease_duration_seconds / 4).unwrap_or(10).max(1)));
    let mut resync = tokio::time::interval(Duration::from_secs(a.resync_seconds));
    let mut qualifying: Option<JoinHandle<()>> = None;
    let mut syncing: Option<JoinHandle<()>> = None;
    let mut dirty = true;
    let stop = brink_engine::server::terminate_or_interrupt();
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
        if idle(&qualifying) {
            let (agent, qualifier) = (agent.clone(), qualifier.clone());
            qualifying = Some(tokio::spawn(async move {
                if let Err(e) = agent.qualify_round(qualifier).await {
                    eprintln!("brink-agent run: qualification: {e}");
                }
            }));
        }
        if idle(&syncing) {
            let (agent, cache) = (agent.clone(), cache.clone());
            syncing = Some(tokio::spawn(async move {
                if let Err(e) = agent.sync_models(&cache).await {
                    eprintln!("brink-agent run: model cache: {e}");
                }
            }));
        }
        dirty = false;
    }
    eprintln!("brink-agent run: stopping");
    for h in [qualifying, syncing].into_iter().flatten() {
        h.abort();
    }
    if let Err(e) = agent.stop().await {
        eprintln!("brink-agent run: warning: could not mark SparkNode {node} AgentStopping: {e}");
    }
    Ok(())
}

/// One item per change to this node's SparkNode, any ModelReplica or any Model (their
/// watchers retry with backoff on errors; the periodic resync covers what a watch misses).
fn triggers(client: &Client, node: &str) -> futures::stream::BoxStream<'static, ()> {
    let cfg = watcher::Config::default();
    let own = watcher(Api::<SparkNode>::all(client.clone()), cfg.clone().fields(&format!("metadata.name={node}")));
    let replicas = watcher(Api::<ModelReplica>::all(client.clone()), cfg.clone());
    let models = watcher(Api::<Model>::all(client.clone()), cfg);
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
    ])
    .filter_map(quiet)
    // Ended (never, in practice): yields nothing more instead of being polled past its end.
    .fuse()
    .boxed()
}
