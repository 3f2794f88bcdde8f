//! The HTTP server over the engine: `brink-agent serve`.
//!
//! - [`http`] — the axum routes: OpenAI and Anthropic APIs, health, readiness, liveness, metrics.
//! - [`jobs`] — the jobs and events between the handlers and the supervisor; [`state`] — the
//!   heartbeat and the handlers' counters they share; [`metrics`] — the `/metrics` table.
//! - [`supervisor`] — the scheduler and the quarantine; runs the engine as a child process, one
//!   step at a time, watches it for stalls and restarts it.
//! - [`child`] — the engine child's side; [`protocol`] — their framed messages.
//! - [`watchdog`] — stall detection, reports and restart back-off (pure); [`requeue`] — which
//!   requests in flight at a restart run again (pure).
//! - [`telemetry`] — the metrics store behind `/metrics` and the OTLP export, and the spans.
//!
//! The server binds first and starts the engine child, so `/health` answers while a large model
//! loads and `/ready` turns 200 when it is done. On shutdown it stops accepting, lets in-flight
//! requests finish within the grace period, then closes the child.

pub mod child;
pub mod http;
pub mod jobs;
pub mod metrics;
pub mod protocol;
pub mod ready_check;
pub mod requeue;
pub mod scripted;
pub mod state;
pub mod supervisor;
pub mod telemetry;
pub mod watchdog;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http::AppState;
use jobs::WorkerConfig;
use state::{Heartbeat, HttpCounters};
use supervisor::{EngineCommand, SupervisorConfig};
use telemetry::otlp::{OtlpConfig, OtlpPipeline};

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub worker: WorkerConfig,
    /// The engine child's program: `brink-agent engine-child` (tests: the built binary).
    pub engine: EngineCommand,
    /// The model name clients use; the file's stem when `None`. `brink` is always accepted too.
    pub model_name: Option<String>,
    /// Accepted API keys; empty: no key needed.
    pub api_keys: Vec<String>,
    /// A step in flight with no progress on the board for this long is a stall: the engine
    /// child is killed and restarted.
    pub stall_timeout: Duration,
    /// Where stall and crash reports are written.
    pub stall_dir: PathBuf,
    /// Test-only: a fault the engine child injects (`hang:layer=N[,min-rows=R]`, `fail:…`).
    pub inject_fault: Option<String>,
    /// The smallest prefill chunk a quarantined prompt is served in before it is refused (after
    /// three stalls of one prompt length it is refused anyway).
    pub quarantine_min_chunk: usize,
    /// Times a request in flight when the engine died or stalled runs again on the restarted
    /// engine if its client has seen no output yet (non-streaming, or a stream before its first
    /// token); 0: every request in flight fails with 503.
    pub requeue_after_restart: u32,
    /// How long in-flight requests may run after a shutdown signal.
    pub grace: Duration,
    /// The most choices (`n`) per request.
    pub max_n: usize,
    /// The agent's node gauges (memory, GPU sensors, qualification), read at every `/metrics`
    /// scrape and OTLP collection beside the server's own.
    pub node_metrics: Option<telemetry::NodeMetrics>,
    /// What `/ready` also requires of each engine child (backend truth, the replica's own
    /// threshold test); `None`: a loaded engine is ready.
    pub ready_check: Option<ready_check::ReadyCheck>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("binding {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("loading the model: {0}")]
    Load(String),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Config(String),
}

/// API keys from a file (one per line; blank lines and `#` comments skipped) and from the
/// comma-separated `env` value (`BRINK_API_KEYS`).
pub fn load_api_keys(file: Option<&Path>, env: Option<&str>) -> Result<Vec<String>, ServeError> {
    let mut keys = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| ServeError::Config(format!("--api-key-file {}: {e}", path.display())))?;
        keys.extend(text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from));
        if keys.is_empty() {
            return Err(ServeError::Config(format!("--api-key-file {}: no keys in the file", path.display())));
        }
    }
    if let Some(env) = env {
        keys.extend(env.split(',').map(str::trim).filter(|k| !k.is_empty()).map(String::from));
    }
    Ok(keys)
}

/// Reports go to `$BRINK_STATE_DIR/stalls`, or `./brink-stalls` without it.
pub fn default_stall_dir(state_dir: Option<&Path>) -> PathBuf {
    match state_dir {
        Some(d) => d.join("stalls"),
        None => PathBuf::from("brink-stalls"),
    }
}

fn served_models(opts: &ServeOptions) -> Vec<String> {
    let stem = opts.worker.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    let mut names = vec![opts.model_name.clone().unwrap_or(stem)];
    if names[0] != "brink" {
        names.push("brink".into());
    }
    names
}

/// Serves on `listener` until `shutdown` resolves (or the model fails to load), then drains.
/// Exports over OTLP when the standard `OTEL_EXPORTER_OTLP_*` variables say so.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let otlp = OtlpConfig::from_env().map_err(ServeError::Config)?;
    serve_on_with(listener, opts, otlp, shutdown).await
}

/// Starts the OTLP exporters (off the runtime's threads: their HTTP clients block) with the
/// counter and gauge table read from `state`, and installs their instruments.
async fn start_otlp(cfg: OtlpConfig, state: &Arc<AppState>) -> Result<OtlpPipeline, ServeError> {
    // Weak: the exporter's callbacks must not keep the state (which holds the exporter) alive.
    let weak = Arc::downgrade(state);
    let read: Arc<dyn Fn() -> Vec<telemetry::Scalar> + Send + Sync> =
        Arc::new(move || weak.upgrade().map(|s| metrics::scalars(&s.heartbeat, &s.counters)).unwrap_or_default());
    let describe =
        format!("traces to {}, metrics to {}", cfg.traces.as_deref().unwrap_or("(off)"), cfg.metrics.as_deref().unwrap_or("(off)"));
    let (otel, pipeline) = tokio::task::spawn_blocking(move || telemetry::otlp::start(&cfg, read))
        .await
        .map_err(|e| ServeError::Config(format!("starting the OTLP export: {e}")))?
        .map_err(ServeError::Config)?;
    let _ = state.heartbeat.telemetry.otel.set(otel);
    eprintln!("brink serve: exporting OTLP ({describe})");
    Ok(pipeline)
}

/// [`serve_on`] with the OTLP export given (`None`: none).
pub async fn serve_on_with(
    listener: tokio::net::TcpListener,
    opts: ServeOptions,
    otlp: Option<OtlpConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    if opts.max_n == 0 {
        return Err(ServeError::Config("max_n must be at least 1".into()));
    }
    if let Some(spec) = &opts.inject_fault {
        spec.parse::<crate::monitor::Fault>().map_err(|e| ServeError::Config(format!("--inject-fault: {e}")))?;
    }
    if opts.stall_timeout.is_zero() {
        return Err(ServeError::Config("--stall-timeout must be above 0".into()));
    }
    let heartbeat = Arc::new(Heartbeat::new());
    if let Some(node) = &opts.node_metrics {
        let _ = heartbeat.telemetry.node.set(node.clone());
    }
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel();
    let state = Arc::new(AppState {
        jobs: Mutex::new(Some(jobs_tx)),
        heartbeat: heartbeat.clone(),
        loaded: OnceLock::new(),
        served_models: served_models(&opts),
        api_keys: opts.api_keys.clone(),
        stall_timeout: opts.stall_timeout,
        max_n: opts.max_n,
        counters: HttpCounters::default(),
        ready_gate: ready_check::ReadyGate::new(opts.ready_check.clone()),
    });
    // Before the supervisor starts, so every request gets its span.
    let pipeline = match otlp {
        Some(cfg) => Some(start_otlp(cfg, &state).await?),
        None => None,
    };
    let (load_tx, load_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
    let worker_state = state.clone();
    let sup_cfg = SupervisorConfig {
        worker: opts.worker.clone(),
        engine: opts.engine.clone(),
        stall_timeout: opts.stall_timeout,
        stall_dir: opts.stall_dir.clone(),
        fault: opts.inject_fault.clone(),
        quarantine_min_chunk: opts.quarantine_min_chunk,
        quarantine_max_strikes: 3,
        requeue_limit: opts.requeue_after_restart,
    };
    let worker = std::thread::Builder::new().name("brink-supervisor".into()).spawn(move || {
        supervisor::run(sup_cfg, jobs_rx, heartbeat, |loaded| {
            let result = loaded.map(|l| {
                let _ = worker_state.loaded.set(l);
            });
            let _ = load_tx.send(result);
        })
    })?;

    // Stop on the caller's signal or a failed load; remember which.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load_error = Arc::new(Mutex::new(None::<String>));
    let load_error_w = load_error.clone();
    tokio::spawn(async move {
        let load_failed = async {
            match load_rx.await {
                Ok(Err(e)) => {
                    if let Ok(mut slot) = load_error_w.lock() {
                        *slot = Some(e);
                    }
                }
                // Loaded (or the supervisor is gone): keep serving until the shutdown signal.
                _ => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = shutdown => {}
            _ = load_failed => {}
        }
        let _ = stop_tx.send(true);
    });
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|&stop| stop).await;
    };
    let app = http::router(state.clone());
    let server = axum::serve(listener, app).with_graceful_shutdown(wait_stop(stop_rx.clone()));
    let grace = opts.grace;
    let drained = tokio::select! {
        r = server => { r?; true }
        _ = async { wait_stop(stop_rx).await; tokio::time::sleep(grace).await } => false,
    };
    if !drained {
        eprintln!("brink serve: the grace period of {grace:?} is over; closing the requests still running");
    }
    // Closing the job channel lets the supervisor finish, stop the child and exit once nothing runs.
    if let Ok(mut jobs) = state.jobs.lock() {
        jobs.take();
    }
    // The export reads the state until its last flush.
    let export_state = pipeline.as_ref().map(|_| state.clone());
    drop(state);
    let _ = tokio::task::spawn_blocking(move || worker.join()).await;
    if let Some(p) = pipeline
        && let Ok(Err(e)) = tokio::task::spawn_blocking(move || p.shutdown()).await
    {
        eprintln!("brink serve: flushing the OTLP export: {e}");
    }
    drop(export_state);
    match load_error.lock().ok().and_then(|mut e| e.take()) {
        Some(e) => Err(ServeError::Load(e)),
        None => Ok(()),
    }
}

/// Binds `host:port` and serves until SIGTERM or ctrl-c. Blocks; builds its own runtime.
pub fn serve(host: &str, port: u16, opts: ServeOptions) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let addr = format!("{host}:{port}");
        let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|source| ServeError::Bind { addr: addr.clone(), source })?;
        let local: SocketAddr = listener.local_addr()?;
        eprintln!("brink serve: listening on http://{local} (loading {})", opts.worker.model.display());
        serve_on(listener, opts, shutdown_signal()).await
    })
}

/// SIGTERM (what the kubelet sends) or ctrl-c: how every long-running brink process is stopped.
pub async fn terminate_or_interrupt() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// SIGTERM or ctrl-c (the stop of `serve`, and of `up` once it serves).
pub async fn shutdown_signal() {
    terminate_or_interrupt().await;
    eprintln!("brink serve: shutting down (finishing in-flight requests)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_from_file_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("keys");
        std::fs::write(&f, "# ops keys\nalpha\n\n  beta  \n").unwrap();
        assert_eq!(load_api_keys(Some(&f), Some("gamma, ,delta")).unwrap(), ["alpha", "beta", "gamma", "delta"]);
        assert!(load_api_keys(None, None).unwrap().is_empty());
        std::fs::write(&f, "# nothing\n").unwrap();
        assert!(load_api_keys(Some(&f), None).unwrap_err().to_string().contains("no keys"));
        let missing = dir.path().join("nope");
        assert!(load_api_keys(Some(&missing), None).unwrap_err().to_string().contains("nope"));
    }
}
