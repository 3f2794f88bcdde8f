//! The model-level threshold test as the agent runs it (`selftest --model`, `up`): the engine's
//! [`brink_engine::qualify`] session, its worker started as `brink-agent __model-test-worker`.

use std::io::IsTerminal;
use std::path::Path;
use std::process::Command;

use brink_api::{CaseResult, ModelTestReport, ServingParams};
use brink_engine::BackendKind;
use brink_engine::qualify::session::{self, Options, Progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Options for `model` on `backend` with `serving`; `max_tokens: None` keeps the backend's
/// default cap (the CPU's [`session::CPU_DEFAULT_MAX_TOKENS`], none on CUDA).
pub fn options(model: &Path, backend: BackendKind, serving: ServingParams, max_tokens: Option<u64>) -> Options {
    let mut opts = Options::new(model.to_path_buf(), backend, serving, env!("CARGO_PKG_VERSION"));
    if max_tokens.is_some() {
        opts.max_tokens = max_tokens;
    }
    opts
}

/// Runs the test with `opts`; the worker is this executable's `__model-test-worker`.
pub fn run_with(opts: &Options, progress: &mut dyn FnMut(Progress)) -> ModelTestReport {
    let exe = std::env::current_exe();
    session::run(
        opts,
        move |cfg| {
            // A missing executable fails the spawn, which the report names.
            let mut c = Command::new(exe.as_deref().unwrap_or(Path::new("brink-agent")));
            c.arg("__model-test-worker").arg(serde_json::to_string(cfg).unwrap_or_default());
            c
        },
        progress,
    )
}

/// [`run_with`] showing a progress bar on stderr (`selftest --model`, `up`).
pub fn run_with_progress(opts: &Options) -> ModelTestReport {
    let tty = std::io::stderr().is_terminal();
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} model test {pos}/{len} [{elapsed}] {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar.set_message(format!("loading {} on {}", opts.model.display(), opts.backend.name()));
    let report = run_with(opts, &mut |p| match p {
        Progress::Ready { load_seconds, tokens_per_s } => {
            bar.println(format!("model loaded in {load_seconds:.1}s; calibration {tokens_per_s:.0} tok/s"));
        }
        Progress::Derived { cases, .. } => bar.set_length(cases as u64),
        Progress::Case { index, total, report } => {
            bar.set_position(index as u64 + 1);
            bar.set_message(report.id.clone());
            // Without a terminal the bar draws nothing: a line per case keeps the log readable
            // evidence of where the time went (and where a run was cut short).
            if !tty {
                eprintln!("model test {}/{total} {} {:?} {:.0} ms", index + 1, report.id, report.result, report.wall_ms);
            } else if matches!(report.result, CaseResult::Failed | CaseResult::Hung) {
                bar.println(format!("{:?} {}: {}", report.result, report.id, report.detail));
            }
        }
    });
    bar.finish_and_clear();
    report
}
