//! `brink-agent serve`: the OpenAI- and Anthropic-compatible HTTP server over one model.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use brink_engine::server::jobs::WorkerConfig;
use brink_engine::server::supervisor::EngineCommand;
use brink_engine::server::{ServeOptions, default_stall_dir, load_api_keys, serve};
use clap::Args as ClapArgs;

use brink_api::qualification::ServingParams;
use brink_api::selftest::Verdict;

use crate::engine_args::EngineArgs;
use crate::envelope;
use crate::node_metrics::{self, QualificationMetrics};

#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    engine: EngineArgs,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences generated at once (each holds a KV cache of --context positions).
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// Most tokens in one forward pass (decodes plus prefill chunks).
    #[arg(long, default_value_t = 8192)]
    max_batch_tokens: usize,
    /// Requests that may wait for a slot; more get 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Seconds without engine progress during a step before it is a stall: the engine process is
    /// killed and restarted, the step's requests fail with 503, the queued ones run after.
    #[arg(long, default_value_t = 120.0)]
    stall_timeout: f64,
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
}

/// `--max-batch-tokens` and `--prefill-chunk`, clamped to the self-test's envelope if a report
/// is given; and the report's gauges.
fn batch_limits(a: &Args) -> Result<(usize, usize, Option<QualificationMetrics>), String> {
    let Some(path) = &a.selftest_report else { return Ok((a.max_batch_tokens, a.engine.prefill_chunk, None)) };
    let report = envelope::read_report(path)?;
    let model = &a.engine.model;
    let file = brink_engine::gguf::GgufFile::open(model).map_err(|e| format!("{}: {e}", model.display()))?;
    let class = brink_engine::arch::config(&file).map_err(|e| format!("{}: {e}", model.display()))?.shape_class();
    let requested = ServingParams {
        max_batch_tokens: a.max_batch_tokens as u64,
        prefill_chunk: a.engine.prefill_chunk as u64,
        context: a.engine.context as u64,
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
        Verdict::NotQualified { reason } | Verdict::Disqualified { reason } => reason,
        Verdict::Qualified { .. } | Verdict::Clamped { .. } => "no count validated",
    }
}

pub fn run(a: Args) -> ExitCode {
    let env_keys = std::env::var("BRINK_API_KEYS").ok();
    let api_keys = match load_api_keys(a.api_key_file.as_deref(), env_keys.as_deref()) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !(a.stall_timeout.is_finite() && a.stall_timeout > 0.0) {
        eprintln!("error: --stall-timeout {} must be a positive number of seconds", a.stall_timeout);
        return ExitCode::FAILURE;
    }
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: finding this program to run the engine child: {e}");
            return ExitCode::FAILURE;
        }
    };
    let state_dir = std::env::var_os("BRINK_STATE_DIR").map(PathBuf::from);
    let inject_fault = a.inject_fault.clone().or_else(|| std::env::var("BRINK_INJECT_FAULT").ok().filter(|s| !s.trim().is_empty()));
    let (max_batch_tokens, prefill_chunk, qualification) = match batch_limits(&a) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = ServeOptions {
        worker: WorkerConfig {
            model: a.engine.model.clone(),
            backend: a.engine.backend.resolve(),
            slots: a.slots,
            context: a.engine.context,
            max_batch_tokens,
            prefill_chunk,
            max_queue: a.max_queue,
        },
        engine: EngineCommand { program, args: vec!["engine-child".into()] },
        model_name: a.served_model_name,
        api_keys,
        stall_timeout: Duration::from_secs_f64(a.stall_timeout),
        stall_dir: a.stall_dir.unwrap_or_else(|| default_stall_dir(state_dir.as_deref())),
        inject_fault,
        quarantine_min_chunk: a.quarantine_min_chunk,
        grace: Duration::from_secs(a.grace),
        max_n: 8,
        node_metrics: Some(node_metrics::provider(qualification)),
    };
    match serve(&a.host, a.port, opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
