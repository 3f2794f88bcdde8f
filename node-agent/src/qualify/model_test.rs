//! The model-level threshold test as the agent runs it (`selftest --model`, `up`): the engine's
//! [`brink_engine::qualify`] session, its worker started as `brink-agent __model-test-worker`.

use std::path::Path;
use std::process::Command;

use brink_api::{ModelTestReport, ServingParams};
use brink_engine::BackendKind;
use brink_engine::qualify::session::{self, Options, Progress};

/// Options for `model` on `backend` with `serving`; `max_tokens: None` keeps the backend's
/// default cap (the CPU's [`session::CPU_DEFAULT_MAX_TOKENS`], none on CUDA).
pub fn options(model: &Path, backend: BackendKind, serving: ServingParams, max_tokens: Option<u64>) -> Options {
    let mut opts = Options::new(model.to_path_buf(), backend, serving, env!("CARGO_PKG_VERSION"));
    if max_tokens.is_some() {
        opts.max_tokens = max_tokens;
    }
    opts
}

/// Runs the model-level test of `model` on `backend` (see [`options`]): `up`'s entry point.
#[cfg_attr(test, allow(dead_code))] // `selftest` sets a deadline floor through `run_with`
pub fn run(
    model: &Path,
    backend: BackendKind,
    serving: ServingParams,
    max_tokens: Option<u64>,
    progress: &mut dyn FnMut(Progress),
) -> ModelTestReport {
    run_with(&options(model, backend, serving, max_tokens), progress)
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
