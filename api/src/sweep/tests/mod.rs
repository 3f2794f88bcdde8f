mod baseline_cases;
mod judge_cases;
mod outlier_cases;

use crate::crd::{GridPoint, PointFigures};

/// A grid point's figures: throughput and the two latencies, no failures.
pub fn fig(prompt: u32, conc: u32, tps: f64, ttft: f64, itl: f64) -> PointFigures {
    PointFigures {
        point: GridPoint { prompt_tokens: prompt, concurrency: conc, generated_tokens: 64 },
        requests: 16,
        failed: 0,
        timed_out: 0,
        output_tokens_per_s: Some(tps),
        ttft_p50_s: Some(ttft),
        ttft_p99_s: None,
        itl_p50_s: Some(itl),
        itl_p99_s: None,
        error: None,
    }
}
