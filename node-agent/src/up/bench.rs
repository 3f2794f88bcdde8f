//! `up`'s short benchmark: two points of the HTTP grid (`bench --url`) against the server it
//! just started — one stream for prefill and decode speed, then several for the aggregate — so
//! the figures are the served engine's, measured the way a client sees them.

use std::sync::Arc;

use brink_api::BenchSummary;
use brink_engine::BackendKind;

use crate::http_bench::grid::{self, Budget, GridError};
use crate::http_bench::runner::Target;
use crate::http_bench::stats::PointResult;
use crate::http_bench::{self, client::Endpoint};

/// The prompt length, tokens generated, and concurrency of the aggregate point on a backend:
/// on the CPU small, so `up` stays quick anywhere; on the GPU long enough to time.
pub fn shape(backend: BackendKind) -> (u64, u64, usize) {
    match backend {
        BackendKind::Cpu => (128, 16, 2),
        BackendKind::Cuda => (512, 64, 8),
    }
}

/// Why the benchmark gave no figures.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Grid(#[from] GridError),
    /// The requests against the server could not be made (the message names the URL).
    #[error("{0}")]
    Measure(String),
    #[error("the single-stream point did not run")]
    NoSingleStream,
    #[error("no single-stream request succeeded ({failed} failed or rejected)")]
    NoneSucceeded { failed: u64 },
    /// A stream that stopped after one token has no inter-token gap.
    #[error("the single-stream requests produced no second token: no decode speed to measure")]
    NoSecondToken,
    #[error("no single-stream request finished")]
    NoneFinished,
    #[error("no decode time to measure ({output_tokens:.1} tokens per request)")]
    NoDecodeTime { output_tokens: f64 },
}

/// Runs the two points and summarises them.
pub async fn run(endpoint: &Endpoint, model: &str, backend: BackendKind) -> Result<BenchSummary, BenchError> {
    let (prompt, generated, concurrency) = shape(backend);
    let target = Arc::new(Target { endpoint: endpoint.clone(), model: model.into(), api_key: None, seed: 0 });
    let budget = Budget::PerClient(2);
    let points = grid::expand(&[prompt], &[1, concurrency], &[generated], budget)?;
    let (_, results) = http_bench::measure(target, &points, budget).await.map_err(|e| BenchError::Measure(e.to_string()))?;
    summarise(&results, concurrency)
}

/// The report's figures from the single-stream point and the concurrent one.
pub fn summarise(results: &[PointResult], concurrency: usize) -> Result<BenchSummary, BenchError> {
    let single = results.iter().find(|r| r.concurrency == 1).ok_or(BenchError::NoSingleStream)?;
    let many = results.iter().find(|r| r.concurrency == concurrency).unwrap_or(single);
    let failed = results.iter().map(|r| r.failed.values().sum::<u64>() + r.rejected).sum();
    let (Some(ttft), Some(prompt)) = (single.ttft_s, single.mean_prompt_tokens) else {
        return Err(BenchError::NoneSucceeded { failed });
    };
    let itl = single.itl_s.ok_or(BenchError::NoSecondToken)?;
    let e2e = single.e2e_s.ok_or(BenchError::NoneFinished)?;
    let output = single.mean_output_tokens.unwrap_or(0.0);
    // Time per output token as vLLM's benchmarks define it, (e2e - ttft) / (tokens - 1): robust
    // to events that arrive together, which make the median inter-token gap 0 on a fast model.
    let tpot = (e2e.p50 - ttft.p50) / (output - 1.0);
    if !(output > 1.0 && tpot > 0.0) {
        return Err(BenchError::NoDecodeTime { output_tokens: output });
    }
    Ok(BenchSummary {
        prompt_tokens: prompt.round() as u64,
        generated_tokens: single.mean_output_tokens.map_or(0, |t| t.round() as u64),
        prefill_tokens_per_s: prompt / ttft.p50,
        decode_tokens_per_s: 1.0 / tpot,
        ttft_p50_s: ttft.p50,
        itl_p50_s: itl.p50,
        concurrency: many.concurrency as u64,
        aggregate_output_tokens_per_s: many.output_tokens_per_s,
        requests: results.iter().map(|r| r.requests).sum(),
        failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_bench::stats::Summary;

    fn point(concurrency: usize, ttft: f64, itl: Option<f64>, out_tps: f64) -> PointResult {
        let s = |v: f64| Summary { mean: v, p50: v, p90: v, p99: v };
        PointResult {
            prompt_tokens: 512,
            concurrency,
            max_tokens: 64,
            requests: 3,
            rejected: 0,
            failed: Default::default(),
            duration_s: 1.0,
            mean_prompt_tokens: Some(510.0),
            mean_output_tokens: Some(64.0),
            request_throughput: 1.0,
            output_tokens_per_s: out_tps,
            total_tokens_per_s: 1.0,
            ttft_s: Some(s(ttft)),
            itl_s: itl.map(s),
            e2e_s: Some(s(ttft + 63.0 * itl.unwrap_or(0.0))),
        }
    }

    #[test]
    fn figures_come_from_the_single_stream_and_the_aggregate_point() {
        let b = summarise(&[point(1, 0.2, Some(0.02), 45.0), point(8, 0.5, Some(0.03), 250.0)], 8).unwrap();
        assert_eq!((b.prompt_tokens, b.generated_tokens, b.concurrency), (510, 64, 8));
        assert!((b.prefill_tokens_per_s - 2550.0).abs() < 1e-9 && (b.decode_tokens_per_s - 50.0).abs() < 1e-9, "{b:?}");
        assert_eq!((b.aggregate_output_tokens_per_s, b.requests, b.failed), (250.0, 6, 0));
    }

    #[test]
    fn nothing_measured_is_an_error_not_a_zero() {
        let mut p = point(1, 0.2, None, 0.0);
        let e = summarise(std::slice::from_ref(&p), 4).unwrap_err();
        assert!(matches!(e, BenchError::NoSecondToken) && e.to_string().contains("no second token"), "{e:?}");
        p.ttft_s = None;
        p.failed.insert("503".into(), 3);
        let e = summarise(&[p], 4).unwrap_err();
        assert!(matches!(e, BenchError::NoneSucceeded { failed: 3 }) && e.to_string().contains("3 failed"), "{e:?}");
        let e = summarise(&[], 4).unwrap_err();
        assert!(matches!(e, BenchError::NoSingleStream) && e.to_string().contains("did not run"), "{e:?}");
    }
}
