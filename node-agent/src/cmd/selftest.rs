//! `brink-agent selftest`: derive the critical cases, run them in a child process with
//! deadlines, print the report (table, or JSON with `--json`), exit non-zero unless qualified.
//! With `--model FILE`: the kernel cases of that model's shape class, then the model-level
//! threshold test of the file (whole forward passes at the critical counts), both reported.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use brink_api::selftest::Verdict;
use brink_api::{ModelTestReport, SelfTestWithModel, ServingParams};
use brink_kernels::selftest::report::render;
use brink_kernels::selftest::session::{self, Options};
use brink_kernels::thresholds::ModelShape;

use crate::cmd::flags::{BackendArg, KvLayoutFlags, model_shape};
use crate::qualify::model_test;

#[derive(clap::Args)]
pub struct Args {
    /// Print the report as JSON on stdout (the table goes to stderr).
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Do not run the deliberately broken kernels (they hang the GPU until killed: never run
    /// them while a replica is serving on it).
    #[arg(long)]
    no_negative_controls: bool,
    /// Run token counts up to N; larger derived counts are listed as skipped (a nightly sweep
    /// raises it to run the 2^31 overflow points of the narrow buffers too).
    #[arg(long, value_name = "N", default_value_t = session::DEFAULT_MAX_TOKENS, value_parser = clap::value_parser!(u64).range(1..))]
    max_tokens: u64,
    /// Run only the cases whose id contains TEXT (e.g. `moe_gemm/q4_0`).
    #[arg(long, value_name = "TEXT")]
    only: Option<String>,
    /// Multiply every case's deadline (for runs under compute-sanitizer, which slows kernels down).
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    deadline_scale: f64,
    /// The serving envelope whose edges are tested: max tokens in one batch.
    #[arg(long, value_name = "N", default_value_t = 16_384, value_parser = clap::value_parser!(u64).range(1..))]
    max_batch_tokens: u64,
    /// The serving envelope: prefill chunk size.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    prefill_chunk: u64,
    /// Device memory the cases may use in GiB (default: free memory minus a 4 GiB reserve).
    #[arg(long, value_name = "GIB", allow_negative_numbers = true)]
    memory_budget_gib: Option<f64>,
    /// A GGUF model: qualify its shape class, then run the model-level threshold test (whole
    /// forward passes at the critical counts, compared with each sequence computed alone).
    #[arg(long, value_name = "FILE")]
    model: Option<PathBuf>,
    /// Backend of the model-level test: auto takes cuda when a GPU is present, else cpu.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto, requires = "model")]
    backend: BackendArg,
    /// Model-level counts above N are listed as skipped (default: 16 on the cpu backend, every
    /// count up to --max-batch-tokens on cuda).
    #[arg(long, value_name = "N", requires = "model", value_parser = clap::value_parser!(u64).range(1..))]
    model_max_tokens: Option<u64>,
    /// KV positions per sequence of the model-level test (default: the model's context).
    #[arg(long, value_name = "N", requires = "model", value_parser = clap::value_parser!(u64).range(1..))]
    context: Option<u64>,
    /// Smallest deadline of a model-level case in milliseconds (each case gets this plus 10x its
    /// calibrated work).
    #[arg(long, value_name = "MS", default_value_t = 10_000, requires = "model", value_parser = clap::value_parser!(u64).range(1..))]
    model_deadline_floor_ms: u64,
    // The model-level test's KV layout (as `serve --full-window-kv` would serve).
    #[command(flatten)]
    kv: KvLayoutFlags,
}

pub fn run(args: Args) -> ExitCode {
    let shape = match &args.model {
        Some(path) => match model_shape("--model", path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        None => ModelShape::qwen3_30b_a3b(),
    };
    let mut opts = Options::new(shape, env!("CARGO_PKG_VERSION"));
    opts.serving.max_batch_tokens = args.max_batch_tokens;
    opts.serving.prefill_chunk = args.prefill_chunk;
    opts.max_tokens = Some(args.max_tokens);
    opts.only = args.only;
    if !(args.deadline_scale.is_finite() && args.deadline_scale >= 1.0) {
        eprintln!("error: --deadline-scale {}: expected a number >= 1", args.deadline_scale);
        return ExitCode::from(2);
    }
    opts.deadline_scale = args.deadline_scale;
    if args.no_negative_controls {
        opts.negative_controls = false;
        opts.negative_controls_off_reason = Some("--no-negative-controls".into());
    }
    if let Some(g) = args.memory_budget_gib {
        if !(g.is_finite() && g > 0.0) {
            eprintln!("error: --memory-budget-gib {g}: expected a positive number of GiB");
            return ExitCode::from(2);
        }
        opts.memory_budget_bytes = Some((g * (1u64 << 30) as f64) as u64);
    }
    let report = match crate::qualify::kernels::run(&opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let model = args.model.as_deref().map(|path| {
        let serving = ServingParams {
            max_batch_tokens: args.max_batch_tokens,
            prefill_chunk: args.prefill_chunk,
            context: args.context.unwrap_or(0),
            full_window_kv: args.kv.full_window_kv,
        };
        let mut mopts = model_test::options(path, args.backend.resolve(), serving, args.model_max_tokens);
        mopts.deadline.floor = Duration::from_millis(args.model_deadline_floor_ms);
        model_test::run_with_progress(&mopts)
    });
    let kernels_ok = match report.verdict {
        Verdict::Qualified { .. } | Verdict::Clamped { .. } => true,
        // No GPU: the plans were checked and all fit; say so and succeed.
        Verdict::NotQualified { .. } => report.failed == 0,
        _ => false,
    };
    let ok = kernels_ok && model.as_ref().is_none_or(ModelTestReport::ok);
    let mut table = render(&report);
    if let Some(m) = &model {
        table = format!("kernel self-test\n{table}\nmodel-level threshold test\n{}", brink_engine::qualify::render::render(m));
    }
    let json = match &model {
        None => serde_json::to_string_pretty(&report),
        Some(m) => serde_json::to_string_pretty(&SelfTestWithModel { kernels: report, model: m.clone() }),
    };
    let json = match json {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: cannot serialise the report: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &args.out
        && let Err(e) = std::fs::write(path, &json)
    {
        eprintln!("error: cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    if args.json {
        eprint!("{table}");
        println!("{json}");
    } else {
        print!("{table}");
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn a_model_that_cannot_be_read_is_named_by_its_flag() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.gguf");
        let e = model_shape("--model", &missing).unwrap_err();
        assert!(matches!(e, Error::Content { flag: Some("--model"), .. }), "{e:?}");
        assert!(e.to_string().starts_with(&format!("--model {}: ", missing.display())), "{e}");
        let junk = dir.path().join("junk.gguf");
        std::fs::write(&junk, b"not a gguf file").unwrap();
        assert!(model_shape("--model", &junk).unwrap_err().to_string().starts_with(&format!("--model {}: ", junk.display())));
    }
}
