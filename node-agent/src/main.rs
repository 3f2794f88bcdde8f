//! `brink-agent`: the one binary for every brink process on a node.
//!
//! Today: `selftest` (qualify this machine's GPU for a model shape class with the threshold
//! self-test), `kernels` (compile every kernel for given archs), and the engine's commands:
//! `gen-model` (synthetic GGUF models), `generate`, `bench` and `parity` (CUDA against the CPU
//! reference). `serve` (the OpenAI- and Anthropic-compatible
//! HTTP server), `up` (qualify, benchmark and serve one machine) and `run` (cluster mode: the
//! DaemonSet's process, see `cluster`).

use std::process::ExitCode;

use brink_agent::cmd::{bench, device, gen_model, generate, kernels, parity, qualify, selftest, serve, sweep_report};
use brink_agent::{cluster, sweep, up};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "brink-agent", version, about = "brink node agent: qualifies the node's GPU for MoE serving")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Qualify this machine for a model (the built-in demo model by default), benchmark it, then serve.
    Up(up::Args),
    /// Cluster mode (the DaemonSet): keep this node's SparkNode and heartbeat Lease, qualify on demand, cache models.
    Run(cluster::Args),
    /// Show the GPU (name, capability, memory, driver, CUDA, NVRTC) or why there is none.
    Device(device::Args),
    /// Run the kernel threshold self-test (derived critical token counts, negative controls).
    Selftest(selftest::Args),
    /// Qualify a running engine (any OpenAI-compatible server) over HTTP at the critical prompt lengths.
    Qualify(qualify::Args),
    /// Write a synthetic model: deterministic random weights, a small real BPE vocabulary.
    GenModel(gen_model::Args),
    /// Run a prompt through a GGUF model and print the continuation (greedy at temperature 0).
    Generate(generate::Args),
    /// Prefill and decode tokens/s of a model on a backend; with --url, a grid against a running server.
    Bench(bench::Args),
    /// Compare two backends (default: CUDA against the CPU reference) logit by logit on one model.
    Parity(parity::Args),
    /// Serve a model over HTTP: OpenAI /v1/chat/completions, /v1/completions, Anthropic /v1/messages.
    Serve(serve::Args),
    /// One node's regression sweep here and now: self-test and benchmark grid, judged against a baseline result.
    Sweep(sweep::Args),
    /// Print sweep results (files or `kubectl get sweepresults -o json`) as a table, JSON or CSV, or a node's trend.
    SweepReport(sweep_report::ReportArgs),
    /// Compile every kernel with NVRTC for the given archs and print ptxas's resource report.
    Kernels(kernels::Args),
    /// Internal: the self-test's child process (reads cases on stdin, answers on stdout).
    #[command(name = "__selftest-worker", hide = true)]
    SelftestWorker,
    /// Internal: the model-level test's child process (its configuration as one JSON argument).
    #[command(name = "__model-test-worker", hide = true)]
    ModelTestWorker { config: String },
    /// Internal: `serve`'s engine process (the supervisor's protocol on stdin/stdout).
    #[command(name = "engine-child", hide = true)]
    EngineChild,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Up(args) => up::run(args),
        Cmd::Run(args) => cluster::run(args),
        Cmd::Selftest(args) => selftest::run(args),
        Cmd::Qualify(args) => qualify::run(args),
        Cmd::Device(args) => device::run(args),
        Cmd::Kernels(args) => kernels::run(args),
        Cmd::GenModel(args) => gen_model::run(args),
        Cmd::Generate(args) => generate::run(args),
        Cmd::Bench(args) => bench::run(args),
        Cmd::Parity(args) => parity::run(args),
        Cmd::Serve(args) => serve::run(args),
        Cmd::Sweep(args) => sweep::run(args),
        Cmd::SweepReport(args) => sweep_report::run_report(args),
        Cmd::SelftestWorker => {
            let code = brink_kernels::selftest::worker::serve(std::io::stdin().lock(), std::io::stdout().lock());
            ExitCode::from(code as u8)
        }
        Cmd::ModelTestWorker { config } => ExitCode::from(brink_engine::qualify::worker::main_stdio(&config) as u8),
        Cmd::EngineChild => ExitCode::from(brink_engine::server::child::main_stdio() as u8),
    }
}
