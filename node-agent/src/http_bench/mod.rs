//! `brink-agent bench --url`: a grid of prompt lengths x concurrency x generated tokens against a
//! running OpenAI-compatible server, like `vllm bench sweep` and llama-bench.
//!
//! Pure parts: [`grid`] (the flags to points), [`prompt`] (distinct prompts of a token count),
//! [`sse`] (the stream's events), [`stats`] (percentiles and per-point figures), [`report`]
//! (table, CSV, JSON). I/O: [`client`] (hyper, HTTP/1.1) and [`runner`] (tokio clients).

pub mod client;
pub mod grid;
pub mod prompt;
pub mod report;
pub mod runner;
pub mod sse;
pub mod stats;

#[cfg(test)]
mod kept_alive_tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args as ClapArgs;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use grid::{Budget, GridPoint};
use runner::{Calibrated, CalibrationError, PromptSizes, Target};
use stats::PointResult;

/// The flags of the HTTP mode (refused with `--model`).
#[derive(ClapArgs, Debug)]
pub struct UrlArgs {
    /// Benchmark a running OpenAI-compatible server at this base URL (http://HOST:PORT) through
    /// streaming /v1/completions, instead of timing an engine in process. Prompts are built to each
    /// --prompt-tokens value (sized against the server's usage.prompt_tokens) and differ from
    /// their first word, so no request reuses another's cached prefix. Requests are greedy
    /// (temperature 0); the server may stop before --max-tokens at end of sequence, and the
    /// output tokens reported are the ones its usage counts.
    #[arg(long, conflicts_with_all = ["backend", "context", "prefill_chunk"])]
    pub url: Option<String>,
    /// The model to request (default: the first one /v1/models lists).
    #[arg(long, conflicts_with = "model")]
    pub model_name: Option<String>,
    /// Prompt lengths in tokens (grid axis).
    #[arg(long, value_delimiter = ',', default_values_t = [128, 1024, 8192], conflicts_with = "model")]
    pub prompt_tokens: Vec<u64>,
    /// Concurrent streaming clients (grid axis).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 16], conflicts_with = "model")]
    pub concurrency: Vec<usize>,
    /// Tokens to generate per request (grid axis).
    #[arg(long, value_delimiter = ',', default_values_t = [64, 256], conflicts_with = "model")]
    pub max_tokens: Vec<u64>,
    /// Requests per point, in all (default: 4 per client). Rejected and failed ones count.
    #[arg(long, conflicts_with = "duration", conflicts_with = "model")]
    pub requests: Option<u64>,
    /// Seconds per point instead of a request count (requests in flight at the end finish).
    #[arg(long, conflicts_with = "model")]
    pub duration: Option<f64>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long, conflicts_with = "model")]
    pub api_key: Option<String>,
    /// Also write the results as CSV here (one row per point).
    #[arg(long, conflicts_with = "model")]
    pub csv: Option<PathBuf>,
    /// Seed of the prompts' word order (the same seed sends the same prompts).
    #[arg(long, default_value_t = 0, conflicts_with = "model")]
    pub seed: u64,
}

/// What stops `bench --url`; every message names the URL, flag or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Url(#[from] client::UrlError),
    #[error(transparent)]
    Grid(#[from] grid::GridError),
    #[error("cannot start the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Http(#[from] client::HttpError),
    #[error(transparent)]
    Model(#[from] PickError),
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
    #[error("{}: cannot serialise the results: {source}", path.display())]
    Serialise {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no request to {url} succeeded (see the failures above)")]
    NoneSucceeded { url: String },
}

/// Runs the grid and writes the table (stdout), then `json` and the CSV if asked.
pub fn bench(a: &UrlArgs, url: &str, json_out: Option<&Path>) -> Result<(), BenchError> {
    let endpoint = client::endpoint(url)?;
    let budget = match (a.requests, a.duration) {
        (Some(n), _) => Budget::Requests(n),
        (None, Some(s)) => Budget::Duration(grid::duration_flag(s)?),
        (None, None) => Budget::PerClient(4),
    };
    let points = grid::expand(&a.prompt_tokens, &a.concurrency, &a.max_tokens, budget)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(BenchError::Runtime)?;
    rt.block_on(async {
        let models = client::fetch_json(&endpoint, "/v1/models", a.api_key.as_deref()).await?;
        let model = pick_model(&models, a.model_name.as_deref(), &endpoint.url("/v1/models"))?;
        eprintln!("benchmarking {model} at {} over {} points", endpoint.base, points.len());
        let target = Arc::new(Target { endpoint: endpoint.clone(), model: model.clone(), api_key: a.api_key.clone(), seed: a.seed });
        let (sizes, results) = measure(target, &points, budget).await?;
        print!("{}", report::table(&results));
        let settings = json!({
            "url": endpoint.base, "model": model, "prompt_tokens": a.prompt_tokens, "concurrency": a.concurrency,
            "max_tokens": a.max_tokens, "requests": budget_json(budget), "seed": a.seed, "api_key": a.api_key.is_some(),
            "prompt_words": sizes.iter().map(|(p, c)| json!({"prompt_tokens": p, "words": c.words, "server_tokens": c.prompt_tokens})).collect::<Vec<_>>(),
        });
        if let Some(path) = json_out {
            let doc = report::json_doc(settings, &endpoint.base, models, &results);
            let text = serde_json::to_string_pretty(&doc).map_err(|source| BenchError::Serialise { path: path.to_path_buf(), source })?;
            write(path, &text)?;
        }
        if let Some(path) = &a.csv {
            write(path, &report::csv(&results))?;
        }
        if results.iter().all(|r| r.requests == 0) {
            return Err(BenchError::NoneSucceeded { url: endpoint.url("/v1/completions") });
        }
        Ok(())
    })
}

/// Sizes the prompts of every length in `points` on the server's token counts, then runs the
/// points in order: each prompt length's calibration and each point's figures.
pub async fn measure(
    target: Arc<Target>,
    points: &[GridPoint],
    budget: Budget,
) -> Result<(Vec<(u64, Calibrated)>, Vec<PointResult>), CalibrationError> {
    let mut sizes = PromptSizes::default();
    for point in points {
        sizes.words(&target, point.prompt_tokens).await?;
    }
    for (p, c) in sizes.calibrated() {
        eprintln!("{p}-token prompts: {} words ({} tokens by the server's count)", c.words, c.prompt_tokens);
    }
    let mut results = Vec::new();
    for (i, &point) in points.iter().enumerate() {
        // Calibrated above: no request.
        let prompt = sizes.calibration(&target, point.prompt_tokens).await?;
        let bar = progress(point, budget);
        let (outcomes, wall) = runner::run_point(target.clone(), point, prompt, budget, i as u64, bar.clone()).await;
        bar.finish_and_clear();
        results.push(stats::aggregate(point, &outcomes, wall));
    }
    Ok((sizes.calibrated().to_vec(), results))
}

/// A model that the server at `url` does not list (`wanted`: `--model-name`).
#[derive(Debug, thiserror::Error)]
pub enum PickError {
    #[error("--model-name {wanted}: {url} lists {}", if listed.is_empty() { "no models".to_string() } else { listed.join(", ") })]
    NotListed { wanted: String, url: String, listed: Vec<String> },
    #[error("{url} lists no models (expected {{\"data\": [{{\"id\": ...}}]}})")]
    NoModels { url: String },
}

/// The model to request: `--model-name` if the server lists it, else the first listed.
pub fn pick_model(models: &Value, wanted: Option<&str>, url: &str) -> Result<String, PickError> {
    let ids: Vec<&str> = models["data"].as_array().map(|d| d.iter().filter_map(|m| m["id"].as_str()).collect()).unwrap_or_default();
    match wanted {
        Some(w) if ids.contains(&w) => Ok(w.to_string()),
        Some(w) => {
            Err(PickError::NotListed { wanted: w.to_string(), url: url.to_string(), listed: ids.iter().map(|s| s.to_string()).collect() })
        }
        None => ids.first().map(|s| s.to_string()).ok_or_else(|| PickError::NoModels { url: url.to_string() }),
    }
}

fn budget_json(b: Budget) -> Value {
    match b {
        Budget::Requests(n) => json!({"per_point": n}),
        Budget::PerClient(k) => json!({"per_client": k}),
        Budget::Duration(d) => json!({"seconds_per_point": d.as_secs_f64()}),
    }
}

fn progress(p: grid::GridPoint, budget: Budget) -> ProgressBar {
    let label = format!("prompt {} conc {} gen {}", p.prompt_tokens, p.concurrency, p.max_tokens);
    // indicatif draws nothing when stderr is not a terminal.
    let bar = match budget.requests(p.concurrency) {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} requests [{elapsed}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {pos} requests [{elapsed}] {msg}").unwrap_or_else(|_| ProgressStyle::default_spinner()),
        ),
    };
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar.with_message(label)
}

fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Write { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_model() {
        let models = json!({"object": "list", "data": [{"id": "a"}, {"id": "b"}]});
        let url = "http://h:1/v1/models";
        assert_eq!(pick_model(&models, None, url).unwrap(), "a");
        assert_eq!(pick_model(&models, Some("b"), url).unwrap(), "b");
        assert_eq!(pick_model(&models, Some("c"), url).unwrap_err().to_string(), "--model-name c: http://h:1/v1/models lists a, b");
        assert!(pick_model(&json!({"data": []}), None, url).unwrap_err().to_string().contains("lists no models"));
        assert!(pick_model(&json!({"data": []}), Some("x"), url).unwrap_err().to_string().contains("lists no models"));
    }
}
