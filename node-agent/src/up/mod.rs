//! `brink-agent up`: the main job on one machine. Discover the device, qualify it for the model
//! (kernel self-test and model-level threshold test, each in a child process with deadlines;
//! reused from the cache while the fingerprint holds), start the server within the validated
//! envelope, benchmark it through its HTTP API, check backend truth from outside the engine,
//! print the report (and write it as JSON), then serve — or refuse, saying why.

mod bench;
pub(crate) mod demo_model;
pub(crate) mod report;
pub(crate) mod server;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use brink_api::{BackendCheck, DeviceInfo, ModelSummary, Phase, QualificationReport, ReportSummary, ServingParams, SuiteResult, Verdict};
use brink_engine::BackendKind;
use brink_engine::model::ModelConfig;
use brink_kernels::selftest::session;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cmd::flags::{BackendArg, KvLayoutFlags, ReplicaFlags, ServingFlags};
use crate::error::{Error, write_file};
use crate::node_metrics::kernel_cases::{KernelCases, by_kernel};
use crate::node_metrics::qualification::{CaseCounts, QualificationMetrics};
use crate::qualify::backend_truth::{ClaimedBackend, ThroughputFloor};
use crate::qualify::{self, cache, verdict};

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model to qualify and serve (default: the built-in demo model, a small synthetic
    /// qwen3moe generated on first use under the state directory).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Backend: auto takes cuda when a GPU is present, else cpu.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    #[command(flatten)]
    replica: ReplicaFlags,
    #[command(flatten)]
    serving: ServingFlags,
    #[command(flatten)]
    kv: KvLayoutFlags,
    /// Where qualifications, the demo model and reports are kept (default: $BRINK_STATE_DIR,
    /// else $XDG_STATE_HOME/brink, else ~/.local/state/brink).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Also write the report as JSON to this file (it always goes to <state>/reports/).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Qualify again even when the cached result's fingerprint is unchanged.
    #[arg(long)]
    requalify: bool,
    /// Lowest acceptable single-stream decode speed, tokens/s: below it backend truth fails
    /// (default: 10 on cuda, 1 on cpu).
    #[arg(long, value_name = "TOK_S", allow_negative_numbers = true)]
    min_decode_tokens_per_s: Option<f64>,
    /// Model-level test: counts above this are derived and listed as skipped (default: the max
    /// batch tokens on cuda; 1024 on cpu, whose engine has no launch geometry to test).
    #[arg(long, value_name = "N")]
    model_test_max_tokens: Option<u64>,
    /// Do not run the kernel self-test's deliberately broken kernels.
    #[arg(long)]
    no_negative_controls: bool,
    /// Seconds the engine may take to load the model.
    #[arg(long, default_value_t = 900)]
    load_timeout: u64,
    /// Print the report and stop instead of serving.
    #[arg(long)]
    no_serve: bool,
}

/// Records how long each phase took, showing a spinner while it runs.
struct Phases {
    done: Vec<Phase>,
    t0: Instant,
}

impl Phases {
    fn run<T>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
            .with_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]").unwrap_or_else(|_| ProgressStyle::default_spinner()))
            .with_message(name.to_string());
        spinner.enable_steady_tick(Duration::from_millis(200));
        let t = Instant::now();
        let out = f();
        spinner.finish_and_clear();
        let seconds = t.elapsed().as_secs_f64();
        eprintln!("brink up: {name}: {seconds:.1} s");
        self.done.push(Phase { name: name.into(), seconds });
        out
    }

    fn finish(mut self) -> Vec<Phase> {
        self.done.push(Phase { name: "total".into(), seconds: self.t0.elapsed().as_secs_f64() });
        self.done
    }
}

pub fn run(a: Args) -> ExitCode {
    match up(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// What a bad flag, file or model is: an error before anything runs (exit 2). A node that may
/// not serve is not an error: it is the report's answer (exit 1).
fn up(a: Args) -> Result<ExitCode, Error> {
    if let Some(f) = a.min_decode_tokens_per_s {
        ThroughputFloor::new(f).map_err(|e| Error::Flag { flag: "--min-decode-tokens-per-s", reason: e.to_string() })?;
    }
    let state_dir = a.state_dir.clone().or_else(|| cache::state_dir(|k| std::env::var(k).ok())).ok_or(Error::NoStateDir)?;
    let mut phases = Phases { done: Vec::new(), t0: Instant::now() };

    let discovery = phases.run("discover the device", || crate::device::discover(0));
    for w in &discovery.warnings {
        eprintln!("brink up: warning: {w}");
    }
    let device = discovery.report;
    let backend = match (a.backend, device.gpu) {
        (BackendArg::Cuda, false) => {
            let reason = device.no_gpu_reason.clone().unwrap_or_else(|| "no CUDA GPU found".into());
            return Err(Error::Flag { flag: "--backend cuda", reason });
        }
        (BackendArg::Cpu, _) | (BackendArg::Auto, false) => BackendKind::Cpu,
        (BackendArg::Cuda | BackendArg::Auto, true) => BackendKind::Cuda,
    };
    match (&device.device, backend) {
        (Some(d), BackendKind::Cuda) => eprintln!("brink up: {} (sm_{}): cuda backend", d.name, d.compute_capability.replace('.', "")),
        (_, _) => eprintln!("brink up: cpu backend ({})", device.no_gpu_reason.as_deref().unwrap_or("--backend cpu: the GPU is not used")),
    }

    let (model_path, demo) = match &a.model {
        Some(p) => (p.clone(), false),
        None => {
            let (p, fresh) = phases.run("prepare the demo model", || demo_model::ensure(&state_dir))?;
            if fresh {
                eprintln!("brink up: generated the demo model at {}", p.display());
            }
            (p, true)
        }
    };
    let config = read_config(&model_path)?;
    let shape = brink_engine::qualify::kernel_shape(&config);
    let shape_class = shape.key();
    let context = a.replica.context_for(config.context);
    let serving = a.serving.params(context as u64, a.kv.full_window_kv);
    // On the CPU backend the GPU is not part of what is qualified (the engine does not use it).
    let gpu = device.device.as_ref().filter(|_| backend == BackendKind::Cuda);
    let fingerprint = qualify::fingerprint(gpu, &shape_class, serving);

    let cache_path = cache::path(&state_dir, &shape_class);
    let decision = if a.requalify {
        cache::CacheDecision::Invalid("--requalify".into())
    } else {
        match cache::decide(&fingerprint, cache::read(&cache_path)) {
            cache::CacheDecision::NoCache => cache::no_cache_reason(
                &shape,
                cache::read_shape(&cache::last_shape_path(&state_dir)).as_ref(),
                cache::path(&state_dir, &shape.name).exists(),
            ),
            d => d,
        }
    };
    eprintln!("brink up: {}", decision.describe());
    let (kernels, model_test, reused) = match &decision {
        cache::CacheDecision::Reuse(q) => {
            let suite = |s: &Option<ReportSummary>, v: &Option<Verdict>| SuiteResult {
                summary: s.clone().unwrap_or_default(),
                verdict: v.clone().unwrap_or(Verdict::NotQualified { reason: "not in the cached result".into() }),
            };
            // A cached result keeps only its counts: no per-kernel series.
            ((suite(&Some(q.summary.clone()), &q.kernel_verdict), KernelCases::new()), suite(&q.model_summary, &q.model_verdict), true)
        }
        _ => {
            let kernels = phases.run("kernel self-test", || kernel_suite(&a, &config, backend, &state_dir, &fingerprint))?;
            let model_test = phases.run("model-level threshold test", || model_suite(&a, &model_path, backend, serving));
            (kernels, model_test, false)
        }
    };
    let (kernels, kernel_cases) = kernels;
    let node_verdict = verdict::combine(&kernels.verdict, &model_test.verdict);
    if !reused {
        let q = brink_api::Qualification {
            schema: brink_api::QUALIFICATION_SCHEMA,
            digest: fingerprint.digest(),
            fingerprint: fingerprint.clone(),
            verdict: node_verdict.clone(),
            summary: kernels.summary.clone(),
            qualified_at: qualify::rfc3339(std::time::SystemTime::now()),
            model_summary: Some(model_test.summary.clone()),
            kernel_verdict: Some(kernels.verdict.clone()),
            model_verdict: Some(model_test.verdict.clone()),
        };
        if let Err(e) = cache::write(&cache_path, &q) {
            eprintln!("brink up: warning: the qualification is not cached: {e}");
        }
    }
    if let Err(e) = cache::write_shape(&cache::last_shape_path(&state_dir), &shape) {
        eprintln!("brink up: warning: the qualified shape is not kept: {e}");
    }

    let mut report = QualificationReport {
        schema: brink_api::report::REPORT_SCHEMA,
        agent_version: env!("CARGO_PKG_VERSION").into(),
        device: device.clone(),
        backend: backend.name().into(),
        model: ModelSummary {
            path: model_path.display().to_string(),
            demo,
            arch: config.arch.clone(),
            shape_class: shape_class.clone(),
            layers: config.layers as u64,
            experts: config.moe.experts as u64,
            top_k: config.moe.top_k as u64,
            context: context as u64,
        },
        fingerprint,
        cache: decision.describe(),
        reused,
        kernels,
        model_test,
        verdict: node_verdict.clone(),
        envelope: None,
        bench: None,
        backend_truth: BackendCheck::NotRun { reason: "the node may not serve this class".into() },
        ok: false,
        refusal: None,
        phases: Vec::new(),
        url: None,
    };
    let envelope = match verdict::envelope(&node_verdict, serving) {
        Ok(e) => e,
        Err(why) => {
            report.refusal = Some(why.to_string());
            report.phases = phases.finish();
            return finish(&report, &state_dir, a.report.as_deref(), None);
        }
    };
    report.envelope = Some(envelope);

    let gauges = QualificationMetrics {
        shape_class: shape_class.clone(),
        verdict: node_verdict.clone(),
        kernel: CaseCounts::from_summary(&report.kernels.summary),
        model: Some(CaseCounts::from_summary(&report.model_test.summary)),
        kernels: kernel_cases,
    };
    let opts = server::options(&server::EngineSpec {
        model: &model_path,
        backend,
        slots: a.replica.slots,
        context,
        full_window_kv: a.kv.full_window_kv,
        envelope: &envelope,
        stall_timeout: a.serving.stall_timeout,
        state_dir: &state_dir,
        gauges: Some(gauges),
    })?;
    let mut running = server::start(&a.host, a.port, opts)?;
    let url = format!("http://{}", running.addr);
    eprintln!("brink up: listening on {url} (loading {})", model_path.display());
    let status = match phases.run("load the model", || running.wait_ready(Duration::from_secs(a.load_timeout))) {
        Ok(s) => s,
        Err(e) => {
            running.stop();
            report.refusal = Some(format!("the engine did not start: {e}"));
            report.phases = phases.finish();
            return finish(&report, &state_dir, a.report.as_deref(), None);
        }
    };
    let model_name = status.served_models.first().cloned().unwrap_or_else(|| "brink".into());
    let bench = phases.run("benchmark", || running.rt.block_on(bench::run(&running.endpoint, &model_name, backend)));
    let decode = bench.as_ref().map_or(f64::NAN, |b| b.decode_tokens_per_s);
    if let Err(e) = &bench {
        eprintln!("brink up: the benchmark failed: {e}");
    }
    report.bench = bench.ok();
    let floor = a.min_decode_tokens_per_s.unwrap_or(match backend {
        BackendKind::Cuda => 10.0,
        BackendKind::Cpu => 1.0,
    });
    report.backend_truth = phases.run("backend truth", || {
        // Asked again after the benchmark: a restart during it would show a new pid.
        let status = running.engine_status().unwrap_or(status);
        backend_truth(device.device.as_ref(), backend, &status, decode, floor)
    });
    if !report.backend_truth.passed() {
        report.refusal = Some(match &report.backend_truth {
            BackendCheck::Fail { reasons } => format!("backend truth failed: {}", reasons.join("; ")),
            BackendCheck::Unverified { reason } => format!("backend truth unverified: {reason}"),
            other => format!("backend truth: {other:?}"),
        });
    }
    report.ok = report.refusal.is_none();
    report.phases = phases.finish();
    if report.refusal.is_some() || a.no_serve {
        running.stop();
        return finish(&report, &state_dir, a.report.as_deref(), None);
    }
    report.url = Some(url);
    finish(&report, &state_dir, a.report.as_deref(), Some(running))
}

fn read_config(model: &Path) -> Result<ModelConfig, Error> {
    let file = brink_engine::gguf::GgufFile::open(model).map_err(|e| Error::Flag { flag: "--model", reason: e.to_string() })?;
    brink_engine::arch::config(&file).map_err(|e| Error::content(Some("--model"), model, e))
}

/// The kernel self-test for the model's shape class, or why it has nothing to run.
fn kernel_suite(
    a: &Args,
    config: &ModelConfig,
    backend: BackendKind,
    state_dir: &Path,
    fingerprint: &brink_api::Fingerprint,
) -> Result<(SuiteResult, KernelCases), Error> {
    if backend == BackendKind::Cpu && a.backend == BackendArg::Cpu {
        let suite = SuiteResult {
            summary: ReportSummary::default(),
            verdict: Verdict::NotQualified { reason: "--backend cpu: the engine does not run the GPU kernels".into() },
        };
        return Ok((suite, KernelCases::new()));
    }
    let mut opts = session::Options::new(brink_engine::qualify::kernel_shape(config), env!("CARGO_PKG_VERSION"));
    opts.serving.max_batch_tokens = a.serving.max_batch_tokens;
    opts.serving.prefill_chunk = a.serving.prefill_chunk;
    if a.no_negative_controls {
        opts.negative_controls = false;
        opts.negative_controls_off_reason = Some("--no-negative-controls".into());
    }
    let report = qualify::controls::run_kernels(opts, state_dir, fingerprint)?;
    for c in report.cases.iter().filter(|c| matches!(c.result, brink_api::CaseResult::Failed | brink_api::CaseResult::Hung)) {
        eprintln!("brink up: kernel case {} {:?}: {}", c.id, c.result, c.detail);
    }
    let kernel_cases = by_kernel(&report);
    Ok((SuiteResult { summary: ReportSummary::from(&report), verdict: report.verdict }, kernel_cases))
}

/// The model-level threshold test (prefills at the derived counts through the whole model).
fn model_suite(a: &Args, model: &Path, backend: BackendKind, serving: ServingParams) -> SuiteResult {
    let opts = qualify::model_test::options(model, backend, serving, a.model_test_max_tokens);
    let r = qualify::model_test::run_with_progress(&opts);
    for c in r.cases.iter().filter(|c| matches!(c.result, brink_api::CaseResult::Failed | brink_api::CaseResult::Hung)) {
        eprintln!("brink up: model case {} {:?}: {}", c.id, c.result, c.detail);
    }
    SuiteResult { summary: ReportSummary::from(&r), verdict: r.verdict }
}

/// Backend truth for the engine the server reports: the claim (`GET /engine`) against the
/// driver's process list and the measured decode speed.
fn backend_truth(
    device: Option<&DeviceInfo>,
    asked: BackendKind,
    status: &brink_engine::server::state::EngineStatus,
    decode_tokens_per_s: f64,
    floor: f64,
) -> BackendCheck {
    let floor = match ThroughputFloor::new(floor) {
        Ok(f) => f,
        Err(e) => return BackendCheck::Fail { reasons: vec![e.to_string()] },
    };
    let Some(pid) = status.engine_pid else {
        return BackendCheck::Fail { reasons: vec!["the server reports no running engine process".into()] };
    };
    let claimed = match status.backend.as_deref() {
        Some("cuda") => ClaimedBackend::Cuda { ordinal: device.map_or(0, |d| d.ordinal) },
        Some("cpu") => ClaimedBackend::Cpu,
        other => return BackendCheck::Fail { reasons: vec![format!("the engine reports backend {other:?}, neither cpu nor cuda")] },
    };
    let mut check = qualify::check_backend(device, claimed, pid, decode_tokens_per_s, floor);
    let claimed_name = claimed.to_string();
    if claimed_name != asked.name() {
        let why = format!("asked for the {} backend, the engine reports {claimed_name}", asked.name());
        check = match check {
            BackendCheck::Fail { mut reasons } => {
                reasons.insert(0, why);
                BackendCheck::Fail { reasons }
            }
            _ => BackendCheck::Fail { reasons: vec![why] },
        };
    }
    check
}

/// Prints the report, writes its JSON, then serves (`running`) or exits 1 when refused.
fn finish(
    report: &QualificationReport,
    state_dir: &Path,
    extra: Option<&Path>,
    running: Option<server::Running>,
) -> Result<ExitCode, Error> {
    let json =
        serde_json::to_string_pretty(report).map_err(|e| Error::Setup { what: "cannot serialise the report", reason: e.to_string() })?;
    let latest = state_dir.join("reports").join("up-latest.json");
    write_file(None, &latest, "the report", &json)?;
    if let Some(path) = extra {
        write_file(Some("--report"), path, "the report", &json)?;
    }
    print!("{}", report::render(report));
    println!("report       {}", latest.display());
    match running {
        Some(r) => {
            r.serve_until_signal()?;
            Ok(ExitCode::SUCCESS)
        }
        None if report.refusal.is_some() => Ok(ExitCode::FAILURE),
        None => Ok(ExitCode::SUCCESS),
    }
}
