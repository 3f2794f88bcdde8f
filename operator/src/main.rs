//! brink-operator: `run` runs the controllers against the cluster of a kubeconfig; `crds`
//! prints the CRDs of the `brink.dev` group; `schema` prints the JSON schema of the self-test
//! report agents publish.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use brink_operator::controllers::{self, Config, Metrics, Shared, SystemClock, server, startup};
use brink_operator::leader::{self, Outcome};
use brink_operator::{crds, telemetry};
use clap::{Args, Parser, Subcommand};
use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(Parser)]
#[command(name = "brink-operator", version, about = "brink's fleet operator")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the controllers (ModelDeployment → ModelReplicas → Pods, Services) until SIGTERM.
    Run(RunArgs),
    /// Print the JSON schema of the node self-test report that agents publish.
    Schema,
    /// Print every brink.dev CustomResourceDefinition as one multi-document YAML
    /// (`brink-operator crds | kubectl apply -f -`).
    Crds,
}

#[derive(Args)]
struct RunArgs {
    /// Kubeconfig to use (default: in-cluster, then $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Where `/metrics` and `/healthz` are served.
    #[arg(long, default_value = "0.0.0.0:8081")]
    metrics_addr: SocketAddr,
    /// Namespace of the agents' heartbeat Leases (`brink-node-<node>`).
    #[arg(long, default_value = "brink-system")]
    lease_namespace: String,
    /// The agents' model cache directory on every node (mounted read-only into replica Pods).
    #[arg(long, default_value = "/var/lib/brink/cache")]
    model_cache_dir: String,
    /// The agents' state directory on every node (mounted into replica Pods: their model-level
    /// test results are kept there, so a recreated Pod reuses the node's result).
    #[arg(long, default_value = "/var/lib/brink/state")]
    node_state_dir: String,
    /// Memory kept free on a node after a replica is placed there, in bytes.
    #[arg(long, default_value_t = 0)]
    memory_reserve_bytes: u64,
    /// The port `brink-agent serve` listens on inside replica Pods.
    #[arg(long, default_value_t = 8080)]
    serve_port: u16,
    /// Seconds a replica may take to load its model and pass its model test.
    #[arg(long, default_value_t = 1800)]
    startup_seconds: u32,
    /// Seconds in-flight reconciles may run after SIGTERM before the operator exits.
    #[arg(long, default_value_t = 25)]
    drain_seconds: u64,
    /// Run the controllers only while holding the Lease `brink-operator` in --lease-namespace
    /// (several operator replicas: one leads, the others stand by).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Who this operator is in the leader Lease (default: $POD_NAME, else the host name).
    #[arg(long)]
    leader_identity: Option<String>,
    /// Seconds a leader's Lease lasts without renewal (renewed every third).
    #[arg(long, default_value_t = 15)]
    leader_lease_seconds: u64,
    /// A Secret in each replica's namespace holding the replicas' API keys (key `keys`, one per
    /// line), mounted into replica Pods and passed as `--api-key-file`. Unset: no keys.
    #[arg(long)]
    replica_api_keys_secret: Option<String>,
    /// The OTLP http/protobuf endpoint replica Pods export metrics to. Unset: no export.
    #[arg(long)]
    replica_otlp_endpoint: Option<String>,
    /// brink-agent's image: the qualification sidecar of replicas on other engines (vLLM,
    /// SGLang, llama.cpp) runs it. Unset: such replicas get no Pods and say why.
    #[arg(long)]
    agent_image: Option<String>,
}

/// The leader Lease's name, in --lease-namespace.
const LEADER_LEASE: &str = "brink-operator";

fn main() -> ExitCode {
    match Cli::parse().command {
        Cmd::Run(args) => run(args),
        Cmd::Crds => match crds::render() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot render the CRDs as YAML: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Schema => {
            let schema = schemars::schema_for!(brink_api::SelfTestReport);
            match serde_json::to_string_pretty(&schema) {
                Ok(s) => {
                    println!("{s}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn run(args: RunArgs) -> ExitCode {
    // Two rustls providers may be compiled in (see Cargo.toml): pick one before any TLS client
    // is built. An error means one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Before the runtime: the OTLP batch exporter runs its own thread with a blocking client.
    let telemetry = match telemetry::init() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if telemetry.exporting() {
        tracing::info!("exporting reconcile traces over OTLP");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(serve(args));
    drop(runtime);
    // The spans of the last reconciles are still batched: send them before exiting.
    if let Err(e) = telemetry.shutdown() {
        eprintln!("warning: {e}");
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn kube_config(path: Option<&PathBuf>) -> Result<kube::Config, String> {
    match path {
        Some(p) => {
            let kc = Kubeconfig::read_from(p).map_err(|e| format!("reading the kubeconfig {}: {e}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| format!("using the kubeconfig {}: {e}", p.display()))
        }
        None => kube::Config::infer().await.map_err(|e| {
            format!(
                "no Kubernetes configuration found (not in a cluster, and no usable $KUBECONFIG or ~/.kube/config): {e}; pass --kubeconfig"
            )
        }),
    }
}

async fn serve(args: RunArgs) -> Result<(), String> {
    if !(3..=3600).contains(&args.leader_lease_seconds) {
        return Err(format!("--leader-lease-seconds {}: expected 3 to 3600", args.leader_lease_seconds));
    }
    let config = kube_config(args.kubeconfig.as_ref()).await?;
    let cluster_url = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(|e| format!("building a client for {cluster_url}: {e}"))?;
    startup::preflight(&client, &cluster_url).await.map_err(|e| e.to_string())?;

    let metrics = Arc::new(Metrics::new().map_err(|e| format!("registering metrics: {e}"))?);
    let listener = server::bind(args.metrics_addr).await.map_err(|e| format!("binding --metrics-addr {}: {e}", args.metrics_addr))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let http = tokio::spawn(server::serve(listener, metrics.clone(), wait_stop(stop_rx.clone())));

    let shared = Arc::new(Shared {
        client,
        metrics,
        clock: Arc::new(SystemClock),
        config: Config {
            lease_namespace: args.lease_namespace.clone(),
            model_cache_dir: args.model_cache_dir,
            node_state_dir: args.node_state_dir,
            memory_reserve_bytes: args.memory_reserve_bytes,
            serve_port: args.serve_port,
            startup_seconds: args.startup_seconds,
            drain_seconds: args.drain_seconds,
            replica_api_keys_secret: args.replica_api_keys_secret.filter(|s| !s.trim().is_empty()),
            replica_otlp_endpoint: args.replica_otlp_endpoint.filter(|s| !s.trim().is_empty()),
            agent_image: args.agent_image.filter(|s| !s.trim().is_empty()),
            ..Config::default()
        },
    });
    tracing::info!(%cluster_url, metrics = %args.metrics_addr, "brink-operator running");
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: draining reconciles");
        let _ = stop_tx.send(true);
    });
    if args.leader_elect {
        let identity = args
            .leader_identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()))
            .filter(|s| !s.is_empty())
            .ok_or("no leader identity: pass --leader-identity or set POD_NAME")?;
        // The controllers drain on the stop signal themselves and then return (the Lease is
        // released after them); the elector's own shutdown is the backstop for a standby, or a
        // drain that overruns.
        let backstop_rx = stop_rx.clone();
        let backstop = Duration::from_secs(args.drain_seconds + 5);
        let elector_stop = async move {
            wait_stop(backstop_rx).await;
            tokio::time::sleep(backstop).await;
        };
        let lease = Duration::from_secs(args.leader_lease_seconds);
        let client = shared.client.clone();
        tracing::info!(%identity, lease = LEADER_LEASE, namespace = %args.lease_namespace, "standing by for leadership");
        let work = || controllers::run(shared, wait_stop(stop_rx));
        match leader::run_as_leader(client, &args.lease_namespace, LEADER_LEASE, &identity, lease, work, elector_stop).await {
            Ok(Outcome::Finished { released, .. } | Outcome::Shutdown { released }) => {
                tracing::info!(released, "stopped; leader Lease released: {released}");
            }
            Ok(Outcome::Lost { why, .. }) => {
                return Err(format!("lost the leader Lease: {why}; exiting so that a restart stands by again"));
            }
            Err(e) => return Err(format!("leader election: {e}")),
        }
    } else {
        controllers::run(shared, wait_stop(stop_rx)).await;
    }
    match http.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("the metrics server failed: {e}")),
        Err(e) => Err(format!("the metrics server task failed: {e}")),
    }
}

/// SIGTERM (what the kubelet sends) or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
