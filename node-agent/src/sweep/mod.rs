//! `brink-agent sweep`: one node's part of a regression sweep, run here and now — the threshold
//! self-test, then the benchmark grid against the model served by a local server — written as a
//! `SweepResult` and judged against a baseline result (a file from an earlier sweep, or
//! `kubectl get sweepresult NAME -o json`). In the fleet the agent runs the same executor for
//! the operator's `SweepRun`s. `brink-agent sweep-report` prints results and a node's trend.

mod execute;
mod extra_cases;
pub(crate) mod figures;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use brink_api::crd::{Judgement, NodeRunState, SweepResult, SweepResultSpec, SweepSelfTest, SweepVerdict, Tolerance, WorkloadGrid};
use brink_api::sweep::judge::{NodeInput, judge};
use brink_engine::BackendKind;

use crate::cmd::flags::{BackendArg, ReplicaFlags, ServingFlags};
use crate::error::{Error, read_json, write_file};
use crate::qualify::cache;

pub use execute::{External, Plan, execute};
pub use extra_cases::ExtraCase;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model (default: the built-in demo model, as `up` uses). With --url: the model the
    /// engine serves, read for its shape only (default: Qwen3-30B-A3B's shape).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Sweep a running OpenAI-compatible engine at this URL (vLLM, llama.cpp's server, brink's
    /// serve) instead of starting brink's engine: the black-box qualification over its API takes
    /// the kernel self-test's place, and the grid runs through the same API.
    #[arg(long, conflicts_with_all = ["extra_case", "slots", "load_timeout", "stall_timeout", "no_negative_controls"])]
    url: Option<String>,
    /// With --url: the model to request (default: the first /v1/models lists).
    #[arg(long, requires = "url")]
    model_name: Option<String>,
    /// With --url: sent as `Authorization: Bearer KEY`.
    #[arg(long, requires = "url")]
    api_key: Option<String>,
    /// With --url: the black-box qualification's deadline floor per case, in seconds.
    #[arg(long, requires = "url", default_value_t = 30.0)]
    case_deadline_s: f64,
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Prompt lengths of the grid, in tokens (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "128")]
    prompt_tokens: Vec<u32>,
    /// Concurrent streams of the grid (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    concurrency: Vec<u32>,
    /// Tokens generated per request (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "32")]
    generated_tokens: Vec<u32>,
    /// Requests per grid point.
    #[arg(long, default_value_t = 8)]
    requests_per_point: u32,
    /// Skip the threshold self-test (benchmark only).
    #[arg(long)]
    no_self_test: bool,
    /// Do not run the self-test's deliberately broken kernels.
    #[arg(long)]
    no_negative_controls: bool,
    /// A batch shape that stalled in serving, replayed after the self-test as a model-level
    /// case: TOKENS or TOKENSxSEQUENCES (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', value_name = "TOKENS[xSEQS]")]
    extra_case: Vec<String>,
    /// A `SweepResult` (JSON) of an earlier sweep of this node to judge against.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Tokens/s may fall this many percent below the baseline.
    #[arg(long, default_value_t = Tolerance::default().throughput_percent)]
    throughput_tolerance: u32,
    /// Time to first token and inter-token latency may rise this many percent.
    #[arg(long, default_value_t = Tolerance::default().latency_percent)]
    latency_tolerance: u32,
    /// Name of this run (default: local-<unix minutes>).
    #[arg(long)]
    run: Option<String>,
    /// Node name in the result (default: $NODE_NAME, else the host name).
    #[arg(long)]
    node: Option<String>,
    /// Write the `SweepResult` as JSON here (default: <state>/sweeps/<run>-<node>.json).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Print the result as JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    serving: ServingFlags,
    #[command(flatten)]
    replica: ReplicaFlags,
    /// Seconds a grid point may take before its unanswered requests count as hung.
    #[arg(long, default_value_t = 600)]
    point_timeout: u64,
    #[arg(long, default_value_t = 900)]
    load_timeout: u64,
    /// As `up`'s (qualifications, the demo model; results under <state>/sweeps/).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

/// The grid from the flags, checked against the same bounds as the CRD's.
pub fn grid(prompt: &[u32], concurrency: &[u32], generated: &[u32], requests: u32) -> Result<WorkloadGrid, Error> {
    let check = |flag: &'static str, v: &[u32], max: u32| -> Result<(), Error> {
        if v.is_empty() || v.len() > 16 {
            return Err(Error::Flag { flag, reason: format!("give 1 to 16 values, got {}", v.len()) });
        }
        match v.iter().find(|&&x| x == 0 || x > max) {
            Some(x) => Err(Error::Flag { flag, reason: format!("{x} is outside 1..={max}") }),
            None => Ok(()),
        }
    };
    check("--prompt-tokens", prompt, 1 << 20)?;
    check("--concurrency", concurrency, 1024)?;
    check("--generated-tokens", generated, 65_536)?;
    if requests == 0 || requests > 10_000 {
        return Err(Error::Flag { flag: "--requests-per-point", reason: format!("{requests} is outside 1..=10000") });
    }
    Ok(WorkloadGrid {
        prompt_tokens: prompt.to_vec(),
        concurrency: concurrency.to_vec(),
        generated_tokens: generated.to_vec(),
        requests_per_point: requests,
    })
}

/// `--extra-case`: `TOKENS` (one sequence) or `TOKENSxSEQUENCES`.
pub fn parse_extra_case(s: &str) -> Result<ExtraCase, Error> {
    let bad = || Error::Flag { flag: "--extra-case", reason: format!("{s}: expected TOKENS or TOKENSxSEQUENCES (e.g. 37 or 40x4)") };
    let (t, q) = s.trim().split_once('x').unwrap_or((s.trim(), "1"));
    let tokens: u64 = t.parse().map_err(|_| bad())?;
    let sequences: u32 = q.parse().map_err(|_| bad())?;
    extra_cases::model_case(&ExtraCase { tokens, sequences, source: "--extra-case".into() })
        .map_err(|e| Error::Flag { flag: "--extra-case", reason: format!("{s}: {e}") })?;
    Ok(ExtraCase { tokens, sequences, source: "--extra-case".into() })
}

/// Reads a `SweepResult` written by `sweep` or by `kubectl get sweepresult -o json`.
pub fn read_result(flag: Option<&'static str>, path: &Path) -> Result<SweepResult, Error> {
    read_json(flag, path, "a SweepResult")
}

pub fn run(a: Args) -> ExitCode {
    match sweep(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Exit 0 when the verdict is `Pass`, 1 otherwise (a regression is news), 2 for bad input.
fn sweep(a: Args) -> Result<ExitCode, Error> {
    let grid = grid(&a.prompt_tokens, &a.concurrency, &a.generated_tokens, a.requests_per_point)?;
    let extra_cases = a.extra_case.iter().map(|s| parse_extra_case(s)).collect::<Result<Vec<_>, _>>()?;
    let baseline = a.baseline.as_deref().map(|p| read_result(Some("--baseline"), p)).transpose()?;
    let state_dir = a.state_dir.clone().or_else(|| cache::state_dir(|k| std::env::var(k).ok())).ok_or(Error::NoStateDir)?;
    let node = a.node.clone().or_else(|| std::env::var("NODE_NAME").ok()).unwrap_or_else(host_name);
    let run = a.run.clone().unwrap_or_else(|| {
        let minutes = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 60);
        format!("local-{minutes}")
    });
    let device = crate::device::discover(0).report;
    let backend = match (a.backend, device.gpu) {
        (BackendArg::Cuda, false) => {
            let reason = device.no_gpu_reason.clone().unwrap_or_else(|| "no CUDA GPU found".into());
            return Err(Error::Flag { flag: "--backend cuda", reason });
        }
        (BackendArg::Cpu, _) | (BackendArg::Auto, false) => BackendKind::Cpu,
        (BackendArg::Cuda | BackendArg::Auto, true) => BackendKind::Cuda,
    };
    let external = a.url.as_ref().map(|url| external(&a, url)).transpose()?;
    let model = match (&a.model, &external) {
        (Some(p), _) => p.clone(),
        // The engine serves its own model: no file is needed here.
        (None, Some(_)) => PathBuf::new(),
        (None, None) => crate::up::demo_model::ensure(&state_dir)?.0,
    };
    let plan = Plan {
        model,
        backend,
        grid,
        self_test: SweepSelfTest { enabled: !a.no_self_test, negative_controls: !a.no_negative_controls },
        negative_controls_allowed: true,
        extra_cases,
        max_batch_tokens: a.serving.max_batch_tokens,
        prefill_chunk: a.serving.prefill_chunk,
        context: a.replica.context,
        slots: a.replica.slots,
        point_timeout: Duration::from_secs(a.point_timeout.max(1)),
        load_timeout: Duration::from_secs(a.load_timeout),
        stall_timeout: a.serving.stall_timeout,
        state_dir: state_dir.clone(),
        external,
    };
    let engine = plan.external.as_ref().map_or_else(|| format!("{} backend", backend.name()), |e| e.url.clone());
    eprintln!("brink sweep: run {run} on {node} ({engine}, {} grid points)", plan.grid.points().len());
    let mut status = execute(&plan, &device);
    let tolerance = Tolerance { throughput_percent: a.throughput_tolerance, latency_percent: a.latency_tolerance };
    let base_status = baseline.as_ref().and_then(|b| b.status.as_ref());
    let (verdict, findings) = judge(&NodeInput {
        node: &node,
        state: NodeRunState::Done,
        message: None,
        result: Some(&status),
        baseline: base_status,
        tolerance,
    });
    status.judgement = Some(Judgement { verdict, baseline_run: baseline.as_ref().map(|b| b.spec.run.clone()), findings });

    let name = brink_api::crd::result_name(&run, &node);
    let mut result = SweepResult::new(&name, SweepResultSpec { run: run.clone(), node: node.clone() });
    result.status = Some(status);
    let out = a.out.clone().unwrap_or_else(|| state_dir.join("sweeps").join(format!("{name}.json")));
    let json =
        serde_json::to_string_pretty(&result).map_err(|e| Error::Setup { what: "cannot serialise the result", reason: e.to_string() })?;
    write_file(a.out.is_some().then_some("--out"), &out, "the result", &(json.clone() + "\n"))?;
    if a.json {
        println!("{json}");
    } else if let Some(s) = &result.status {
        print!("{}", figures::table(&node, &run, s));
        println!("result       {}", out.display());
    }
    Ok(if verdict == SweepVerdict::Pass { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `--url` and what goes with it; the shape from `--model`'s header when given.
fn external(a: &Args, url: &str) -> Result<External, Error> {
    crate::http_bench::client::endpoint(url)?;
    if !(a.case_deadline_s.is_finite() && a.case_deadline_s > 0.0 && a.case_deadline_s <= 86_400.0) {
        return Err(Error::Flag { flag: "--case-deadline-s", reason: format!("{}: expected seconds in (0, 86400]", a.case_deadline_s) });
    }
    let shape = match &a.model {
        Some(path) => crate::cmd::flags::model_shape("--model", path)?,
        None => brink_kernels::thresholds::ModelShape::qwen3_30b_a3b(),
    };
    Ok(External {
        url: url.to_string(),
        model_name: a.model_name.clone(),
        api_key: a.api_key.clone(),
        shape,
        context: (a.replica.context > 0).then_some(a.replica.context as u64),
        case_deadline: Duration::from_secs_f64(a.case_deadline_s),
    })
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(flags: &[&str]) -> Args {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let argv = ["sweep"].into_iter().chain(flags.iter().copied());
        <Cli as clap::Parser>::try_parse_from(argv).unwrap_or_else(|e| panic!("{flags:?}: {e}")).args
    }

    #[test]
    fn an_external_engine_s_flags_are_checked_and_named() {
        let url = "http://127.0.0.1:8000";
        let ext = external(&parsed(&["--url", url, "--context", "4096"]), url).unwrap();
        assert_eq!((ext.context, ext.case_deadline), (Some(4096), Duration::from_secs(30)));
        for bad in ["0", "86401", "NaN", "inf"] {
            let e = external(&parsed(&["--url", url, "--case-deadline-s", bad]), url).unwrap_err();
            assert!(matches!(e, Error::Flag { flag: "--case-deadline-s", .. }), "{bad}: {e:?}");
        }
        let e = external(&parsed(&["--url", url, "--model", "/nonexistent/model.gguf"]), url).unwrap_err();
        assert!(e.to_string().starts_with("--model /nonexistent/model.gguf: "), "{e}");
        let e = external(&parsed(&["--url", "https://x"]), "https://x").unwrap_err();
        assert!(e.to_string().starts_with("--url https://x: "), "{e}");
    }
}
