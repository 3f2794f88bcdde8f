//! Runs one node's part of a sweep: the threshold self-test (in its child process), then the
//! model served by a local server and the benchmark grid through its HTTP API, point by point
//! with a deadline each, and returns the `SweepResult` status. Whatever fails is recorded in the
//! result (never a panic, never a hang past the deadlines): a sweep must report a broken node.
//!
//! On an external engine (`Plan::external`: vLLM, llama.cpp's server, any OpenAI-compatible
//! one already running) the kernel self-test cannot reach its GPU: the black-box qualification
//! over its API takes the self-test's place in the result, and the grid runs through the same API.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{GridPoint, NodeFingerprint, ResultState, SweepResultStatus, SweepSelfTest, WorkloadGrid};
use brink_api::qualification::Envelope;
use brink_api::{DeviceReport, ServingParams, Verdict};
use brink_engine::BackendKind;
use brink_kernels::selftest::session;
use indicatif::ProgressBar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use brink_kernels::thresholds::ModelShape;

use super::extra_cases::{self, ExtraCase};
use super::figures;
use crate::blackbox;
use crate::http_bench::grid::{self, Budget};
use crate::http_bench::runner::{self, Target};
use crate::http_bench::stats;
use crate::http_bench::{self, client::endpoint};
use crate::qualify::{self, verdict};
use crate::up::server;

/// What one node runs.
#[derive(Clone, Debug)]
pub struct Plan {
    pub model: PathBuf,
    pub backend: BackendKind,
    pub grid: WorkloadGrid,
    pub self_test: SweepSelfTest,
    /// False while serving replicas are resident: the negative controls' deliberate hangs
    /// would occupy their GPU.
    pub negative_controls_allowed: bool,
    /// Batch shapes that stalled in serving, replayed after the self-test (with it only).
    pub extra_cases: Vec<ExtraCase>,
    pub max_batch_tokens: u64,
    pub prefill_chunk: u64,
    /// KV positions per sequence (0: the model's).
    pub context: usize,
    pub slots: usize,
    pub point_timeout: Duration,
    pub load_timeout: Duration,
    pub stall_timeout: f64,
    pub state_dir: PathBuf,
    /// Run against this running engine instead of starting brink's (`model`, `backend`,
    /// `slots`, `extra_cases` and the load and stall timeouts then do not apply).
    pub external: Option<External>,
}

/// A running engine the sweep measures through its OpenAI-compatible API.
#[derive(Clone, Debug)]
pub struct External {
    pub url: String,
    /// The model to request (default: the first `/v1/models` lists).
    pub model_name: Option<String>,
    pub api_key: Option<String>,
    /// The served model's shape (the black-box qualification's lengths derive from it).
    pub shape: ModelShape,
    /// The engine's context, when known (else asked of the engine).
    pub context: Option<u64>,
    /// The black-box qualification's deadline floor per case.
    pub case_deadline: Duration,
}

/// Why a node's part of a sweep stopped (recorded as the result's `error`); each names the
/// model file, URL or step at fault.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("{}: {source}", path.display())]
    Gguf {
        path: PathBuf,
        #[source]
        source: brink_engine::gguf::GgufError,
    },
    #[error("{}: {source}", path.display())]
    Config {
        path: PathBuf,
        #[source]
        source: brink_engine::model::ModelError,
    },
    #[error("self-test: {0}")]
    SelfTest(#[source] qualify::kernels::NoWorker),
    #[error("cannot find this executable to start the model-test worker: {0}")]
    Exe(#[source] std::io::Error),
    #[error("not benchmarked: {0}")]
    Refused(#[source] verdict::Refusal),
    /// Starting the engine's server.
    #[error(transparent)]
    Server(#[from] crate::error::Error),
    #[error("the engine did not start: {0}")]
    NotReady(#[source] crate::error::Error),
    #[error("black-box qualification: {0}")]
    BlackBox(#[source] blackbox::session::RunError),
    /// The black-box qualification of the engine at `url` did not pass (`verdict`: its line).
    #[error("not benchmarked: {verdict}")]
    NotQualified { url: String, verdict: String },
    #[error(transparent)]
    Url(#[from] http_bench::client::UrlError),
    #[error("cannot start the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Http(#[from] http_bench::client::HttpError),
    #[error(transparent)]
    Model(#[from] http_bench::PickError),
    #[error("{point}: calibrating the prompt: {source}")]
    Calibration {
        point: String,
        #[source]
        source: runner::CalibrationError,
    },
}

/// The result of running `plan` on this node (`device` as discovered).
pub fn execute(plan: &Plan, device: &DeviceReport) -> SweepResultStatus {
    let mut r = SweepResultStatus { state: ResultState::Running, started_at: Some(now()), ..SweepResultStatus::default() };
    let outcome = match &plan.external {
        Some(ext) => run_external(plan, ext, device, &mut r),
        None => run(plan, device, &mut r),
    };
    if let Err(e) = outcome {
        r.error = Some(e.to_string());
    }
    r.state = if r.error.is_some() { ResultState::Failed } else { ResultState::Done };
    r.finished_at = Some(now());
    r
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn run(plan: &Plan, device: &DeviceReport, r: &mut SweepResultStatus) -> Result<(), SweepError> {
    let file = brink_engine::gguf::GgufFile::open(&plan.model).map_err(|source| SweepError::Gguf { path: plan.model.clone(), source })?;
    let config = brink_engine::arch::config(&file).map_err(|source| SweepError::Config { path: plan.model.clone(), source })?;
    drop(file);
    let context = crate::cmd::flags::context_for(plan.context, config.context);
    let serving = ServingParams {
        max_batch_tokens: plan.max_batch_tokens,
        prefill_chunk: plan.prefill_chunk,
        context: context as u64,
        full_window_kv: false,
    };
    let gpu = device.device.as_ref().filter(|_| plan.backend == BackendKind::Cuda);
    r.fingerprint = Some(NodeFingerprint::of(&qualify::fingerprint(gpu, &config.shape_class(), serving)));

    let mut node_verdict = Verdict::NotQualified { reason: "the sweep ran no self-test".into() };
    if plan.self_test.enabled {
        let mut opts = session::Options::new(brink_engine::qualify::kernel_shape(&config), env!("CARGO_PKG_VERSION"));
        opts.serving.max_batch_tokens = plan.max_batch_tokens;
        opts.serving.prefill_chunk = plan.prefill_chunk;
        let controls = plan.self_test.negative_controls && plan.negative_controls_allowed;
        if !controls {
            opts.negative_controls = false;
            opts.negative_controls_off_reason = Some(
                if plan.negative_controls_allowed { "selfTest.negativeControls is false" } else { "serving replicas resident" }.into(),
            );
        }
        let report = qualify::kernels::run(&opts).map_err(SweepError::SelfTest)?;
        let mut outcome = figures::self_test_outcome(&report);
        if !plan.extra_cases.is_empty() {
            let exe = std::env::current_exe().map_err(SweepError::Exe)?;
            let replay = extra_cases::Replay {
                model: &plan.model,
                backend: plan.backend,
                context: context as u64,
                prefill_chunk: plan.prefill_chunk,
                exe,
            };
            extra_cases::merge(&mut outcome, &extra_cases::run(&replay, &plan.extra_cases));
        }
        r.self_test = Some(outcome);
        node_verdict = report.verdict;
    }
    // The grid runs within what the self-test validated, like serving would.
    let envelope: Envelope = verdict::envelope(&node_verdict, serving).map_err(SweepError::Refused)?;

    let opts = server::options(&server::EngineSpec {
        model: &plan.model,
        backend: plan.backend,
        slots: plan.slots,
        context,
        // The sweep serves in the default layout (rings), as a replica does.
        full_window_kv: false,
        envelope: &envelope,
        stall_timeout: plan.stall_timeout,
        state_dir: &plan.state_dir,
        gauges: None,
    })?;
    let mut running = server::start("127.0.0.1", 0, opts)?;
    let outcome = (|| {
        let status = running.wait_ready(plan.load_timeout).map_err(SweepError::NotReady)?;
        let model = status.served_models.first().cloned().unwrap_or_else(|| "brink".into());
        let target = Arc::new(Target { endpoint: running.endpoint.clone(), model, api_key: None, seed: 0 });
        r.points = running.rt.block_on(grid_points(target, &plan.grid, plan.point_timeout))?;
        Ok(())
    })();
    running.stop();
    outcome
}

/// The black-box qualification of the external engine (unless the self-test is off), then
/// the grid through its API.
fn run_external(plan: &Plan, ext: &External, device: &DeviceReport, r: &mut SweepResultStatus) -> Result<(), SweepError> {
    let endpoint = endpoint(&ext.url)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(SweepError::Runtime)?;
    let context = ext.context.unwrap_or(u64::from(ext.shape.context));
    let serving =
        ServingParams { max_batch_tokens: plan.max_batch_tokens, prefill_chunk: plan.prefill_chunk, context, full_window_kv: false };
    r.fingerprint = Some(NodeFingerprint::of(&qualify::fingerprint(device.device.as_ref(), &ext.shape.name, serving)));
    if plan.self_test.enabled {
        let opts = blackbox::Options {
            url: ext.url.clone(),
            model: ext.model_name.clone(),
            api_key: ext.api_key.clone(),
            shape: ext.shape.clone(),
            context: ext.context,
            max_batch_tokens: plan.max_batch_tokens,
            prefill_chunk: plan.prefill_chunk,
            deadline: ext.case_deadline,
            deadline_factor: 10.0,
            seed: 0,
        };
        let report = rt.block_on(blackbox::run(&opts)).map_err(SweepError::BlackBox)?;
        eprintln!("brink sweep: black-box qualification of {}: {}", ext.url, blackbox::render::verdict_line(&report.verdict));
        r.self_test = Some(figures::black_box_outcome(&report));
        if !report.ok() {
            return Err(SweepError::NotQualified { url: ext.url.clone(), verdict: blackbox::render::verdict_line(&report.verdict) });
        }
    }
    rt.block_on(async {
        let models_url = endpoint.url("/v1/models");
        let models = http_bench::client::fetch_json(&endpoint, "/v1/models", ext.api_key.as_deref()).await?;
        let model = http_bench::pick_model(&models, ext.model_name.as_deref(), &models_url)?;
        let target = Arc::new(Target { endpoint: endpoint.clone(), model, api_key: ext.api_key.clone(), seed: 0 });
        r.points = grid_points(target, &plan.grid, plan.point_timeout).await?;
        Ok(())
    })
}

/// Every point of `grid` in order, each under `deadline` (a point that does not finish counts
/// its requests as unanswered: a hang, not a slow number).
async fn grid_points(target: Arc<Target>, g: &WorkloadGrid, deadline: Duration) -> Result<Vec<brink_api::crd::PointFigures>, SweepError> {
    let budget = Budget::Requests(u64::from(g.requests_per_point));
    let mut sizes = runner::PromptSizes::default();
    let mut out = Vec::new();
    for (i, point) in g.points().into_iter().enumerate() {
        let prompt = sizes
            .calibration(&target, u64::from(point.prompt_tokens))
            .await
            .map_err(|source| SweepError::Calibration { point: point.to_string(), source })?;
        out.push(run_point(&target, point, prompt, budget, i as u64, deadline).await);
    }
    Ok(out)
}

async fn run_point(
    target: &Arc<Target>,
    point: GridPoint,
    prompt: runner::Calibrated,
    budget: Budget,
    index: u64,
    deadline: Duration,
) -> brink_api::crd::PointFigures {
    let bench_point = grid::GridPoint {
        prompt_tokens: u64::from(point.prompt_tokens),
        concurrency: point.concurrency as usize,
        max_tokens: u64::from(point.generated_tokens),
    };
    let run = runner::run_point(target.clone(), bench_point, prompt, budget, index, ProgressBar::hidden());
    let figures = match tokio::time::timeout(deadline, run).await {
        Ok((outcomes, wall)) => figures::point_figures(point, &stats::aggregate(bench_point, &outcomes, wall)),
        Err(_) => figures::timed_out(point, budget.requests(bench_point.concurrency).unwrap_or(0)),
    };
    eprintln!(
        "brink sweep: {point}: {} ok, {} failed, {} unanswered, {} output tok/s",
        figures.requests,
        figures.failed,
        figures.timed_out,
        figures.output_tokens_per_s.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
    );
    figures
}
