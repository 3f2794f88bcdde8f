//! `up`'s server: the same supervisor and engine child as `brink-agent serve`, run on a runtime
//! `up` owns, so it can benchmark the server through its HTTP API, check the engine from outside
//! (`GET /engine`) and stop it again if the node may not serve.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use brink_api::Envelope;
use brink_engine::BackendKind;
use brink_engine::server::state::EngineStatus;
use brink_engine::server::jobs::WorkerConfig;
use brink_engine::server::supervisor::EngineCommand;
use brink_engine::server::{ServeError, ServeOptions, serve_on, shutdown_signal};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::http_bench::client::{self, Endpoint};
use crate::node_metrics::{self, qualification::QualificationMetrics};

/// The engine a local server runs (`up`, local sweeps): batch and chunk from the envelope.
pub struct EngineSpec<'a> {
    pub model: &'a Path,
    pub backend: BackendKind,
    pub slots: usize,
    pub context: usize,
    pub envelope: &'a Envelope,
    pub stall_timeout: f64,
    /// Stall reports go under `<state>/stalls`.
    pub state_dir: &'a Path,
    /// The node's qualification gauges on `/metrics`.
    pub gauges: Option<QualificationMetrics>,
}

/// The supervisor's options for `spec`, with this executable as the engine child.
pub fn options(spec: &EngineSpec<'_>) -> Result<ServeOptions, String> {
    let program = std::env::current_exe().map_err(|e| format!("finding this program to run the engine child: {e}"))?;
    let usize_of = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    Ok(ServeOptions {
        worker: WorkerConfig {
            model: spec.model.to_path_buf(),
            backend: spec.backend,
            slots: spec.slots.max(1),
            context: spec.context,
            max_batch_tokens: usize_of(spec.envelope.max_batch_tokens),
            prefill_chunk: usize_of(spec.envelope.prefill_chunk),
            max_queue: 64,
        },
        engine: EngineCommand { program, args: vec!["engine-child".into()] },
        model_name: None,
        api_keys: Vec::new(),
        stall_timeout: Duration::from_secs_f64(spec.stall_timeout),
        stall_dir: spec.state_dir.join("stalls"),
        inject_fault: brink_engine::test_switches::get(brink_engine::test_switches::INJECT_FAULT),
        quarantine_min_chunk: 64,
        requeue_after_restart: 1,
        grace: Duration::from_secs(30),
        max_n: 8,
        node_metrics: Some(node_metrics::provider(spec.gauges.clone())),
        // `up` checks backend truth itself, after its benchmark.
        ready_check: None,
    })
}

pub struct Running {
    pub rt: Runtime,
    pub endpoint: Endpoint,
    pub addr: SocketAddr,
    task: JoinHandle<Result<(), ServeError>>,
    stop: Option<oneshot::Sender<()>>,
}

/// Binds `host:port` (errors name the address) and starts serving in the background.
pub fn start(host: &str, port: u16, opts: ServeOptions) -> Result<Running, String> {
    let rt =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| format!("cannot start the tokio runtime: {e}"))?;
    let bind = format!("{host}:{port}");
    let listener = rt.block_on(tokio::net::TcpListener::bind(&bind)).map_err(|e| format!("--host/--port {bind}: cannot listen: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("{bind}: {e}"))?;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let shutdown = async move {
        tokio::select! {
            _ = shutdown_signal() => {}
            _ = stop_rx => {}
        }
    };
    let task = rt.spawn(serve_on(listener, opts, shutdown));
    let endpoint = client::parse_url(&format!("http://{addr}"))?;
    Ok(Running { rt, endpoint, addr, task, stop: Some(stop_tx) })
}

impl Running {
    /// Polls `GET /engine` until the engine is loaded; fails when the server stops first (a
    /// model that does not load) or after `timeout`.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<EngineStatus, String> {
        let t0 = Instant::now();
        loop {
            if self.task.is_finished() {
                return Err(match self.rt.block_on(&mut self.task) {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(())) => "the server stopped before the engine was ready".into(),
                    Err(e) => format!("the server task failed: {e}"),
                });
            }
            if let Ok(status) = self.engine_status()
                && status.ready
            {
                return Ok(status);
            }
            if t0.elapsed() > timeout {
                return Err(format!("the engine was not ready after {timeout:?} (--load-timeout)"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the server says about its engine (`GET /engine`).
    pub fn engine_status(&self) -> Result<EngineStatus, String> {
        let v = self.rt.block_on(client::get_json(&self.endpoint, "/engine", None))?;
        serde_json::from_value(v).map_err(|e| format!("{}: not an engine status: {e}", self.endpoint.url("/engine")))
    }

    /// Serves until SIGTERM or ctrl-c, then drains (as `serve`).
    pub fn serve_until_signal(mut self) -> Result<(), String> {
        let task = &mut self.task;
        match self.rt.block_on(task) {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(format!("the server task failed: {e}")),
        }
    }

    /// Stops serving now (the node may not serve), waiting for the engine child to exit.
    pub fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = &mut self.task;
        let _ = self.rt.block_on(task);
    }
}
