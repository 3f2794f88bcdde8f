//! `brink-agent qualify --url URL`: the black-box threshold qualification of a running engine
//! (see `blackbox`). Exit 0 on pass or clamp, 1 when refused, 2 on bad input.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use brink_kernels::thresholds::ModelShape;

use crate::blackbox::{self, render};
use crate::cmd::flags::model_shape;
use crate::error::{Error, write_file};

#[derive(clap::Args)]
pub struct Args {
    /// The engine's base URL (http://HOST:PORT; a trailing /v1 is accepted).
    #[arg(long)]
    url: String,
    /// The model to request (default: the first one /v1/models lists).
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key: Option<String>,
    /// The model's GGUF file: its shape is read from the header (no tensor data is read).
    /// Without it, the shape is Qwen3-30B-A3B's with the flags below changed.
    #[arg(long, value_name = "GGUF", conflicts_with_all = ["top_k", "experts", "hidden", "expert_ffn", "vocab"])]
    shape: Option<PathBuf>,
    /// Experts used per token.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    top_k: Option<u32>,
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    experts: Option<u32>,
    /// embedding_length.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    hidden: Option<u32>,
    /// Each expert's intermediate width.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    expert_ffn: Option<u32>,
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    vocab: Option<u32>,
    /// Tokens per sequence the engine runs with (default: what the engine says, else the model's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..))]
    context: Option<u64>,
    /// The engine's most tokens in one step (vLLM --max-num-batched-tokens, llama.cpp --batch-size).
    #[arg(long, value_name = "N", default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    max_batch_tokens: u64,
    /// The engine's prefill chunk (llama.cpp --ubatch-size, brink --prefill-chunk).
    #[arg(long, value_name = "N", default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    prefill_chunk: u64,
    /// Seconds every case may take on top of 10x its expected time; also how long a failed
    /// engine has to answer again before it counts as dead.
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    deadline_s: f64,
    /// Seed of the prompts' word order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the report as JSON on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Also write the verdict as a replica's qualification report (what the node's agent
    /// publishes in the `ModelReplica`'s status: pass, clamp with the longest admitted prompt,
    /// or refuse) to this file. The qualification sidecar of a replica on another engine
    /// writes it under the node's state directory, where brink's own replicas write theirs.
    #[arg(long, value_name = "FILE")]
    replica_report: Option<PathBuf>,
}

pub fn run(a: Args) -> ExitCode {
    match qualify(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn shape(a: &Args) -> Result<ModelShape, Error> {
    if let Some(path) = &a.shape {
        return model_shape("--shape", path);
    }
    let mut s = ModelShape::qwen3_30b_a3b();
    s.top_k = a.top_k.unwrap_or(s.top_k);
    s.experts = a.experts.unwrap_or(s.experts);
    s.hidden = a.hidden.unwrap_or(s.hidden);
    s.expert_ffn = a.expert_ffn.unwrap_or(s.expert_ffn);
    s.vocab = a.vocab.unwrap_or(s.vocab);
    if s.top_k > s.experts {
        return Err(Error::Value { flag: "--top-k", value: s.top_k.to_string(), reason: format!("more than the {} experts", s.experts) });
    }
    if a.top_k.or(a.experts).or(a.hidden).or(a.expert_ffn).or(a.vocab).is_some() {
        s.name = format!("custom-h{}-e{}-top{}-ffn{}-v{}", s.hidden, s.experts, s.top_k, s.expert_ffn, s.vocab);
    }
    Ok(s)
}

fn qualify(a: Args) -> Result<ExitCode, Error> {
    if !(a.deadline_s.is_finite() && a.deadline_s > 0.0 && a.deadline_s <= 86_400.0) {
        return Err(Error::Value {
            flag: "--deadline-s",
            value: a.deadline_s.to_string(),
            reason: "expected seconds in (0, 86400]".into(),
        });
    }
    let opts = blackbox::Options {
        url: a.url.clone(),
        model: a.model.clone(),
        api_key: a.api_key.clone(),
        shape: shape(&a)?,
        context: a.context,
        max_batch_tokens: a.max_batch_tokens,
        prefill_chunk: a.prefill_chunk,
        deadline: Duration::from_secs_f64(a.deadline_s),
        deadline_factor: 10.0,
        seed: a.seed,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Setup { what: "cannot start the tokio runtime", reason: e.to_string() })?;
    eprintln!("qualifying {} for {} (top_k {})", opts.url, opts.shape.name, opts.shape.top_k);
    let t0 = std::time::Instant::now();
    let report = rt.block_on(blackbox::run(&opts))?;
    if let Some(path) = &a.replica_report {
        let r = crate::qualify::replica::black_box_report(&report, t0.elapsed().as_secs_f64());
        crate::qualify::replica::write_json(path, &r)
            .map_err(|e| Error::Setup { what: "cannot write the replica report (--replica-report)", reason: e.to_string() })?;
    }
    let json =
        serde_json::to_string_pretty(&report).map_err(|e| Error::Setup { what: "cannot serialise the report", reason: e.to_string() })?;
    if let Some(path) = &a.out {
        write_file(Some("--out"), path, "the report", &format!("{json}\n"))?;
    }
    if a.json {
        println!("{json}");
    } else {
        print!("{}", render::render(&report));
    }
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
