//! `up`'s server: the same supervisor and engine child as `brink-agent serve`, run on a runtime
//! `up` owns, so it can benchmark the server through its HTTP API, check the engine from outside
//! (`GET /engine`) and stop it again if the node may not serve.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use brink_api::Envelope;
use brink_engine::BackendKind;
use brink_engine::server::jobs::WorkerConfig;
use brink_engine::server::state::EngineStatus;
use brink_engine::server::supervisor::EngineCommand;
use brink_engine::server::{ServeError, ServeOptions, serve_on, shutdown_signal};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::Error;
use crate::http_bench::client::{self, Endpoint};
use crate::node_metrics::{self, qualification::QualificationMetrics};

/// The engine a local server runs (`up`, local sweeps): batch and chunk from the envelope.
pub struct EngineSpec<'a> {
    pub model: &'a Path,
    pub backend: BackendKind,
    pub slots: usize,
    pub context: usize,
    /// The sliding-window layers keep whole sequences (`--full-window-kv`), not rings.
    pub full_window_kv: bool,
    pub envelope: &'a Envelope,
    pub stall_timeout: f64,
    /// Stall reports go under `<state>/stalls`.
    pub state_dir: &'a Path,
    /// The node's qualification gauges on `/metrics`.
    pub gauges: Option<QualificationMetrics>,
}

/// The supervisor's options for `spec`, with this executable as the engine child.
pub fn options(spec: &EngineSpec<'_>) -> Result<ServeOptions, Error> {
    let program = std::env::current_exe()
        .map_err(|e| Error::Setup { what: "finding this program to run the engine child", reason: e.to_string() })?;
    let usize_of = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    Ok(ServeOptions {
        worker: WorkerConfig {
            model: spec.model.to_path_buf(),
            backend: spec.backend,
            slots: spec.slots.max(1),
            context: spec.context,
            max_batch_tokens: usize_of(spec.envelope.max_batch_tokens),
            prefill_chunk: usize_of(spec.envelope.prefill_chunk),
            full_window_kv: spec.full_window_kv,
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

/// Binds `host:port` (errors name the flags and the address) and starts serving in the background.
pub fn start(host: &str, port: u16, opts: ServeOptions) -> Result<Running, Error> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Setup { what: "cannot start the tokio runtime", reason: e.to_string() })?;
    let bind = format!("{host}:{port}");
    let listen = |source| Error::Listen { flag: "--host/--port", addr: bind.clone(), source };
    let listener = rt.block_on(tokio::net::TcpListener::bind(&bind)).map_err(listen)?;
    let addr = listener.local_addr().map_err(listen)?;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let shutdown = async move {
        tokio::select! {
            _ = shutdown_signal() => {}
            _ = stop_rx => {}
        }
    };
    let task = rt.spawn(serve_on(listener, opts, shutdown));
    let endpoint = client::endpoint(&format!("http://{addr}"))?;
    Ok(Running { rt, endpoint, addr, task, stop: Some(stop_tx) })
}

impl Running {
    /// Polls `GET /engine` until the engine is loaded; fails when the server stops first (a
    /// model that does not load) or after `timeout`.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<EngineStatus, Error> {
        let t0 = Instant::now();
        loop {
            if self.task.is_finished() {
                return Err(match self.rt.block_on(&mut self.task) {
                    Ok(Err(e)) => Error::Server(e),
                    Ok(Ok(())) => Error::Step("the server stopped before the engine was ready".into()),
                    Err(e) => Error::Setup { what: "the server task failed", reason: e.to_string() },
                });
            }
            if let Ok(status) = self.engine_status()
                && status.ready
            {
                return Ok(status);
            }
            if t0.elapsed() > timeout {
                return Err(Error::Timeout { flag: "--load-timeout", waiting: "the engine was not ready", after: timeout });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the server says about its engine (`GET /engine`).
    pub fn engine_status(&self) -> Result<EngineStatus, Error> {
        let v = self.rt.block_on(client::fetch_json(&self.endpoint, "/engine", None))?;
        serde_json::from_value(v)
            .map_err(|e| Error::Answer { url: self.endpoint.url("/engine"), reason: format!("not an engine status: {e}") })
    }

    /// Serves until SIGTERM or ctrl-c, then drains (as `serve`).
    pub fn serve_until_signal(mut self) -> Result<(), Error> {
        let task = &mut self.task;
        match self.rt.block_on(task) {
            Ok(r) => r.map_err(Error::Server),
            Err(e) => Err(Error::Setup { what: "the server task failed", reason: e.to_string() }),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_in_use_is_named_with_its_flags() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let envelope =
            Envelope { validated: false, validated_tokens: None, first_failure: None, max_batch_tokens: 512, prefill_chunk: 128 };
        let spec = EngineSpec {
            model: Path::new("model.gguf"),
            backend: BackendKind::Cpu,
            slots: 0,
            context: 256,
            full_window_kv: false,
            envelope: &envelope,
            stall_timeout: 5.0,
            state_dir: dir.path(),
            gauges: None,
        };
        let opts = options(&spec).unwrap();
        assert_eq!((opts.worker.slots, opts.worker.max_batch_tokens, opts.worker.prefill_chunk), (1, 512, 128));
        let Err(e) = start("127.0.0.1", port, opts) else { panic!("a second listener on port {port}") };
        assert!(matches!(e, Error::Listen { flag: "--host/--port", .. }), "{e:?}");
        assert!(e.to_string().starts_with(&format!("--host/--port 127.0.0.1:{port}: cannot listen: ")), "{e}");
    }
}
