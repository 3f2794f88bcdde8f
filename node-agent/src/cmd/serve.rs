//! `brink-agent serve`: the OpenAI- and Anthropic-compatible HTTP server over one model.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brink_engine::server::jobs::WorkerConfig;
use brink_engine::server::supervisor::EngineCommand;
use brink_engine::server::{ServeOptions, default_stall_dir, load_api_keys, serve};
use clap::Args as ClapArgs;

use brink_api::qualification::ServingParams;
use brink_api::selftest::Verdict;

use brink_api::{BackendCheck, DeviceInfo};
use brink_engine::BackendKind;
use brink_engine::server::ready_check::ReadyCheck;

use crate::cmd::flags::{BackendArg, KvLayoutFlags, ReplicaFlags, ServingFlags, model_config};
use crate::envelope;
use crate::error::Error;
use crate::node_metrics::{self, QualificationMetrics};
use crate::qualify::backend_truth::{ClaimedBackend, GpuHolders, judge_serving};
use crate::qualify::{self, cache, replica, verdict};

#[derive(ClapArgs)]
pub struct Args {
    /// GGUF model file (the first part of a split model).
    #[arg(long)]
    model: PathBuf,
    /// Backend: auto takes cuda when a GPU is present, else cpu (and says which); a backend
    /// asked for by name never falls back.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    #[command(flatten)]
    replica: ReplicaFlags,
    #[command(flatten)]
    serving: ServingFlags,
    #[command(flatten)]
    kv: KvLayoutFlags,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests that may wait for a slot; more get 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Where stall and crash reports (JSON) go (default: $BRINK_STATE_DIR/stalls, else ./brink-stalls).
    #[arg(long)]
    stall_dir: Option<PathBuf>,
    /// TEST ONLY: make the engine hang, fail or fail a kernel launch at a layer
    /// (hang:layer=N[,min-rows=R], fail:…, launch-error:…, sticky-launch-error:…); also env BRINK_INJECT_FAULT. Never in production.
    #[arg(long, hide_short_help = true)]
    inject_fault: Option<String>,
    /// Smallest prefill chunk a prompt that stalled the engine is retried in before it is refused.
    #[arg(long, default_value_t = 64)]
    quarantine_min_chunk: usize,
    /// Times a request in flight when the engine died or stalled runs again on the restarted
    /// engine, if its client has seen no output yet (non-streaming, or a stream before its first
    /// token); 0: they fail with 503 like the rest.
    #[arg(long, default_value_t = 1)]
    requeue_after_restart: u32,
    /// Seconds in-flight requests may run after SIGTERM.
    #[arg(long, default_value_t = 30)]
    grace: u64,
    /// API keys, one per line (also from env BRINK_API_KEYS, comma-separated). None: no auth.
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// The model name clients send (default: the file name without .gguf; `brink` also works).
    #[arg(long)]
    served_model_name: Option<String>,
    /// This node's self-test report (`brink-agent selftest --json`): batches and prefill chunks
    /// are clamped to the envelope it validated for the model's shape class; a report that
    /// disqualifies the class refuses to serve.
    #[arg(long)]
    selftest_report: Option<PathBuf>,
    /// Run the model-level threshold test for this model and these serving parameters before
    /// `/ready` (replica Pods do), or reuse the node's result for the same shape key and
    /// fingerprint: serving is clamped to the envelope it validated, and a failure below a
    /// passing count keeps `/ready` at 503 naming the failing case.
    #[arg(long)]
    model_test: bool,
    /// Where the node keeps qualifications (the agent's state directory, mounted from the host
    /// into replica Pods): results are reused from and kept there (default: $BRINK_STATE_DIR).
    #[arg(long, requires = "model_test")]
    qualification_dir: Option<PathBuf>,
    /// Model-level test: counts above this are derived and listed as skipped (default: none on
    /// cuda; 1024 on cpu, whose engine has no launch geometry to test).
    #[arg(long, requires = "model_test", value_parser = clap::value_parser!(u64).range(1..))]
    model_test_max_tokens: Option<u64>,
}

/// What the replica's own model-level test decided: the limits to serve under, why `/ready`
/// is held (if it is), and the report the node agent publishes.
struct ModelTestOutcome {
    max_batch_tokens: usize,
    prefill_chunk: usize,
    hold: Option<String>,
    report: replica::ReplicaReport,
    report_path: Option<PathBuf>,
}

/// Runs (or reuses) the model-level threshold test for the model at the requested limits.
fn model_test(a: &Args, backend: BackendKind, device: Option<&DeviceInfo>, batch: usize, chunk: usize) -> Result<ModelTestOutcome, Error> {
    let model = &a.model;
    let config = model_config("--model", model)?;
    let key = config.shape_class();
    let context = a.replica.context_for(config.context);
    let serving = ServingParams {
        max_batch_tokens: batch as u64,
        prefill_chunk: chunk as u64,
        context: context as u64,
        full_window_kv: a.kv.full_window_kv,
    };
    let fingerprint = qualify::fingerprint(device.filter(|_| backend == BackendKind::Cuda), &key, serving);
    let dir = a.qualification_dir.clone().or_else(|| std::env::var_os("BRINK_STATE_DIR").map(PathBuf::from));
    let own_path = dir.as_deref().map(|d| replica::path(d, &key));
    let found = match (&dir, &own_path) {
        (Some(d), Some(own)) => {
            replica::reuse(&fingerprint, replica::read(own), cache::read(&cache::path(d, &key))).map_err(|e| e.to_string())
        }
        _ => Err("no --qualification-dir or $BRINK_STATE_DIR to keep results in".to_string()),
    };
    let (result, reused) = match found {
        Ok(r) => {
            eprintln!(
                "brink serve: model-level threshold test: reusing the node's result of {} for {key} (fingerprint unchanged)",
                r.tested_at
            );
            (r, true)
        }
        Err(why) => {
            eprintln!("brink serve: model-level threshold test for {key} ({why}): running it before /ready");
            let t0 = Instant::now();
            let opts = qualify::model_test::options(model, backend, serving, a.model_test_max_tokens);
            let report = qualify::model_test::run_with_progress(&opts);
            let seconds = t0.elapsed().as_secs_f64();
            eprintln!(
                "brink serve: model-level threshold test took {seconds:.1} s: {} cases executed, {} passed, {} failed, {} hung: {}",
                report.executed,
                report.passed,
                report.failed,
                report.hung,
                crate::up::report::verdict_line(&report.verdict)
            );
            let r = replica::ModelTestResult::of(&report, fingerprint.clone(), qualify::rfc3339(std::time::SystemTime::now()), seconds);
            if let Some(p) = &own_path
                && let Err(e) = replica::write_json(p, &r)
            {
                eprintln!("brink serve: warning: the model-level result is not kept on the node: {e}");
            }
            (r, false)
        }
    };
    let mut hold = replica::hold_reason(&result);
    let (mut max_batch_tokens, mut prefill_chunk) = (batch, chunk);
    if hold.is_none() {
        match verdict::envelope(&result.verdict, serving) {
            Ok(env) => {
                // Both are at most the requested usize values.
                (max_batch_tokens, prefill_chunk) = (env.max_batch_tokens as usize, env.prefill_chunk as usize);
                if let Some(max) = env.validated_tokens {
                    eprintln!(
                        "brink serve: model-level test validated {max} tokens: max batch tokens {max_batch_tokens}, prefill chunk {prefill_chunk}"
                    );
                }
            }
            Err(why) => hold = Some(format!("model-level threshold test: {why}")),
        }
    }
    let report = replica::ReplicaReport {
        shape_class: key,
        model_test_state: node_metrics::qualification::state_name(&result.verdict).into(),
        model_test_message: crate::up::report::verdict_line(&result.verdict),
        reused,
        failing_cases: result.failing_cases.clone(),
        model_test_seconds: (!reused).then_some(result.seconds),
        held: hold.clone(),
        ready_check: None,
        seconds_to_ready: None,
        method: Some(brink_api::crd::QualificationMethod::ModelTest),
        // The model-level test's counts are a step's tokens (what brink clamps its batch
        // limits to), not a prompt's: they stay in the message.
        admitted_prompt_tokens: None,
        first_failure_tokens: None,
    };
    let replica_name = std::env::var("BRINK_REPLICA").ok().filter(|s| !s.is_empty());
    let namespace = std::env::var("POD_NAMESPACE").unwrap_or_default();
    let report_path = dir.zip(replica_name).map(|(d, name)| replica::report_path(&d, &namespace, &name));
    Ok(ModelTestOutcome { max_batch_tokens, prefill_chunk, hold, report, report_path })
}

/// The replica's report, updated with the ready check's result, written where the agent reads it.
fn write_report(path: Option<&PathBuf>, report: &replica::ReplicaReport) {
    if let Some(p) = path
        && let Err(e) = replica::write_json(p, report)
    {
        eprintln!("brink serve: warning: the replica report is not written: {e}");
    }
}

/// `--max-batch-tokens` and `--prefill-chunk`, clamped to the self-test's envelope if a report
/// is given; and the report's gauges.
fn batch_limits(a: &Args) -> Result<(usize, usize, Option<QualificationMetrics>), Error> {
    let Some(path) = &a.selftest_report else {
        return Ok((
            usize::try_from(a.serving.max_batch_tokens).unwrap_or(usize::MAX),
            usize::try_from(a.serving.prefill_chunk).unwrap_or(usize::MAX),
            None,
        ));
    };
    let report = envelope::read_report(path)?;
    let class = model_config("--model", &a.model)?.shape_class();
    let requested = ServingParams {
        max_batch_tokens: a.serving.max_batch_tokens,
        prefill_chunk: a.serving.prefill_chunk,
        context: a.replica.context as u64,
        full_window_kv: a.kv.full_window_kv,
    };
    let env = envelope::envelope(&report, &class, path, requested)?;
    // Both are at most the requested usize values.
    let (batch, chunk) = (env.max_batch_tokens as usize, env.prefill_chunk as usize);
    match env.validated_tokens {
        Some(max) => eprintln!(
            "brink serve: {class} validated up to {max} tokens per batch ({}): max batch tokens {batch}, prefill chunk {chunk}",
            path.display()
        ),
        None => eprintln!("brink serve: {}: no GPU envelope to clamp to ({})", path.display(), unvalidated_reason(&report.verdict)),
    }
    Ok((batch, chunk, Some(QualificationMetrics::new(&report, None))))
}

/// Why a report that validated nothing did not (the only verdict without a token count that serves).
fn unvalidated_reason(v: &Verdict) -> &str {
    match v {
        Verdict::NotQualified { reason } | Verdict::Disqualified { reason } | Verdict::ProofIncomplete { reason } => reason,
        Verdict::Qualified { .. } | Verdict::Clamped { .. } => "no count validated",
    }
}

/// The backend to serve on and the GPU it runs on. An explicit `--backend cuda` without a
/// usable GPU is an error, never a fallback.
fn backend(asked: BackendArg) -> Result<(BackendKind, Option<DeviceInfo>), Error> {
    match asked {
        BackendArg::Cpu => Ok((BackendKind::Cpu, None)),
        BackendArg::Cuda | BackendArg::Auto => {
            let d = crate::device::discover(0);
            for w in &d.warnings {
                eprintln!("brink serve: warning: {w}");
            }
            match (d.report.device, asked) {
                (Some(device), _) => Ok((BackendKind::Cuda, Some(device))),
                (None, BackendArg::Cuda) => Err(Error::Flag {
                    flag: "--backend cuda",
                    reason: format!(
                        "no usable CUDA GPU ({}); refusing to start rather than fall back to the cpu",
                        d.report.no_gpu_reason.as_deref().unwrap_or("none found")
                    ),
                }),
                (None, _) => {
                    eprintln!(
                        "brink serve: no CUDA GPU found ({}): using the cpu backend",
                        d.report.no_gpu_reason.as_deref().unwrap_or("none")
                    );
                    Ok((BackendKind::Cpu, None))
                }
            }
        }
    }
}

/// Backend truth before `/ready`, from outside the engine as `up` checks it: the engine child
/// reports the backend it was given, and on cuda the driver lists its pid on the GPU.
fn backend_truth_check(backend: BackendKind, device: Option<DeviceInfo>) -> ReadyCheck {
    ReadyCheck::new(move |status| {
        let asked = match backend {
            BackendKind::Cuda => ClaimedBackend::Cuda { ordinal: device.as_ref().map_or(0, |d| d.ordinal) },
            BackendKind::Cpu => ClaimedBackend::Cpu,
        };
        let holders = match (backend, &device) {
            (BackendKind::Cuda, Some(d)) => crate::device::nvml::gpu_holders(&d.uuid),
            _ => GpuHolders::Listed(Vec::new()),
        };
        let on = device.as_ref().map(|d| format!(" on {} ({})", d.name, d.uuid)).unwrap_or_default();
        match judge_serving(asked, status.backend.as_deref(), status.engine_pid, &holders) {
            BackendCheck::Pass { detail } => Ok(format!("backend truth: {}{on}: {detail}", backend.name())),
            BackendCheck::Fail { reasons } => Err(format!("backend truth failed: {}", reasons.join("; "))),
            BackendCheck::Unverified { reason } => Err(format!("backend truth unverified: {reason}")),
            BackendCheck::NotRun { reason } => Err(format!("backend truth not run: {reason}")),
        }
    })
}

/// What `/ready` requires of each engine child: the model-level test's hold (if any), then
/// backend truth. The first ready answer logs (and reports) the time since `serve` started.
fn ready_check(backend: BackendKind, device: Option<DeviceInfo>, outcome: Option<ModelTestOutcome>, started: Instant) -> ReadyCheck {
    let truth = backend_truth_check(backend, device);
    let state = Arc::new(Mutex::new(outcome));
    ReadyCheck::new(move |status| {
        let mut outcome = state.lock().unwrap_or_else(|p| p.into_inner());
        let result = match outcome.as_ref().and_then(|o| o.hold.clone()) {
            Some(why) => Err(why),
            None => truth.call(status),
        };
        let seconds = started.elapsed().as_secs_f64();
        if result.is_ok() {
            eprintln!("brink serve: READY {seconds:.1} s after start");
        }
        if let Some(o) = outcome.as_mut() {
            o.report.ready_check = Some(match &result {
                Ok(d) => format!("passed: {d}"),
                Err(w) => format!("failed: {w}"),
            });
            if result.is_ok() && o.report.seconds_to_ready.is_none() {
                o.report.seconds_to_ready = Some(seconds);
            }
            write_report(o.report_path.as_ref(), &o.report);
        }
        result
    })
}

pub fn run(a: Args) -> ExitCode {
    let started = Instant::now();
    let env_keys = std::env::var("BRINK_API_KEYS").ok();
    let api_keys = match load_api_keys(a.api_key_file.as_deref(), env_keys.as_deref()) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: finding this program to run the engine child: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (backend, device) = match backend(a.backend) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let state_dir = std::env::var_os("BRINK_STATE_DIR").map(PathBuf::from);
    let inject_fault = a.inject_fault.clone().or_else(|| brink_engine::test_switches::get(brink_engine::test_switches::INJECT_FAULT));
    let (max_batch_tokens, prefill_chunk, qualification) = match batch_limits(&a) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = if a.model_test {
        match model_test(&a, backend, device.as_ref(), max_batch_tokens, prefill_chunk) {
            Ok(o) => Some(o),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        None
    };
    let (max_batch_tokens, prefill_chunk) =
        outcome.as_ref().map_or((max_batch_tokens, prefill_chunk), |o| (o.max_batch_tokens, o.prefill_chunk));
    if let Some(o) = &outcome {
        write_report(o.report_path.as_ref(), &o.report);
        if let Some(why) = &o.hold {
            eprintln!("brink serve: NOT READY: {why}");
        }
    }
    let ready_check = ready_check(backend, device, outcome, started);
    let opts = ServeOptions {
        worker: WorkerConfig {
            model: a.model.clone(),
            backend,
            slots: a.replica.slots,
            context: a.replica.context,
            max_batch_tokens,
            prefill_chunk,
            full_window_kv: a.kv.full_window_kv,
            max_queue: a.max_queue,
        },
        engine: EngineCommand { program, args: vec!["engine-child".into()] },
        model_name: a.served_model_name,
        api_keys,
        stall_timeout: a.serving.stall_timeout(),
        stall_dir: a.stall_dir.unwrap_or_else(|| default_stall_dir(state_dir.as_deref())),
        inject_fault,
        quarantine_min_chunk: a.quarantine_min_chunk,
        requeue_after_restart: a.requeue_after_restart,
        grace: Duration::from_secs(a.grace),
        max_n: 8,
        node_metrics: Some(node_metrics::provider(qualification)),
        ready_check: Some(ready_check),
    };
    match serve(&a.host, a.port, opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
