//! From what each request measured to a grid point's figures: percentiles, means, throughput and
//! the errors by kind. Pure: times come in as seconds, so tests give known values.

use std::collections::BTreeMap;

use serde::Serialize;

use super::grid::GridPoint;

/// One finished request's measurements.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSample {
    /// `usage.prompt_tokens`: the server's count, not the one asked for.
    pub prompt_tokens: u64,
    /// `usage.completion_tokens`.
    pub output_tokens: u64,
    /// Request sent to the first SSE chunk carrying text.
    pub ttft_s: f64,
    /// Between consecutive chunks carrying text.
    pub itl_s: Vec<f64>,
    /// Request sent to the end of the stream.
    pub e2e_s: f64,
}

/// How one request ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Ok(RequestSample),
    /// The server declined it for now (503 with Retry-After): load shedding, not a failure.
    Rejected,
    /// Any other end: the status code (`"500"`), or `"connection"`, `"stream"`, `"not streaming"`.
    Failed(String),
}

/// Clocks one streaming request; times are seconds since the request was sent.
#[derive(Default)]
pub struct RequestTimer {
    first: Option<f64>,
    last: Option<f64>,
    itl: Vec<f64>,
}

impl RequestTimer {
    /// An SSE chunk carrying text arrived at `t`.
    pub fn text_at(&mut self, t: f64) {
        match self.last {
            None => self.first = Some(t),
            Some(prev) => self.itl.push(t - prev),
        }
        self.last = Some(t);
    }

    /// Chunks that carried text so far (one token each on servers that stream token by token).
    pub fn text_chunks(&self) -> u64 {
        if self.first.is_some() { self.itl.len() as u64 + 1 } else { 0 }
    }

    /// The stream ended at `t` with the server's usage. A stream without text (0 tokens
    /// generated) has no first token: its TTFT is the whole request.
    pub fn finish(self, t: f64, prompt_tokens: u64, output_tokens: u64) -> RequestSample {
        RequestSample { prompt_tokens, output_tokens, ttft_s: self.first.unwrap_or(t), itl_s: self.itl, e2e_s: t }
    }
}

/// The `p`-th percentile (0..=100) of ascending `sorted`, interpolating linearly between the
/// closest ranks (numpy's default, which vLLM's benchmarks report). `None` without samples.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = p.clamp(0.0, 100.0) / 100.0 * last as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// Mean and percentiles of one latency, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Summary {
    /// `None` without samples (a point where every request failed).
    pub fn of(samples: impl IntoIterator<Item = f64>) -> Option<Summary> {
        let mut v: Vec<f64> = samples.into_iter().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let pct = |p| percentile(&v, p).unwrap_or(f64::NAN);
        Some(Summary { mean: v.iter().sum::<f64>() / v.len() as f64, p50: pct(50.0), p90: pct(90.0), p99: pct(99.0) })
    }
}

/// A grid point's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PointResult {
    pub prompt_tokens: u64,
    pub concurrency: usize,
    pub max_tokens: u64,
    /// Requests that finished with a complete stream.
    pub requests: u64,
    pub rejected: u64,
    /// Failed requests by status code or kind.
    pub failed: BTreeMap<String, u64>,
    /// First request sent to last one finished.
    pub duration_s: f64,
    pub mean_prompt_tokens: Option<f64>,
    pub mean_output_tokens: Option<f64>,
    pub request_throughput: f64,
    pub output_tokens_per_s: f64,
    /// Prompt and output tokens per second.
    pub total_tokens_per_s: f64,
    pub ttft_s: Option<Summary>,
    pub itl_s: Option<Summary>,
    pub e2e_s: Option<Summary>,
}

/// The point's figures from its requests' outcomes, over `duration_s` of wall time.
pub fn aggregate(point: GridPoint, outcomes: &[Outcome], duration_s: f64) -> PointResult {
    let ok: Vec<&RequestSample> = outcomes.iter().filter_map(|o| if let Outcome::Ok(s) = o { Some(s) } else { None }).collect();
    let mut failed = BTreeMap::new();
    for o in outcomes {
        if let Outcome::Failed(kind) = o {
            *failed.entry(kind.clone()).or_insert(0) += 1;
        }
    }
    let prompt: u64 = ok.iter().map(|s| s.prompt_tokens).sum();
    let output: u64 = ok.iter().map(|s| s.output_tokens).sum();
    let n = ok.len() as f64;
    let mean = |total: u64| (!ok.is_empty()).then(|| total as f64 / n);
    let rate = |x: f64| if duration_s > 0.0 { x / duration_s } else { 0.0 };
    PointResult {
        prompt_tokens: point.prompt_tokens,
        concurrency: point.concurrency,
        max_tokens: point.max_tokens,
        requests: ok.len() as u64,
        rejected: outcomes.iter().filter(|o| matches!(o, Outcome::Rejected)).count() as u64,
        failed,
        duration_s,
        mean_prompt_tokens: mean(prompt),
        mean_output_tokens: mean(output),
        request_throughput: rate(n),
        output_tokens_per_s: rate(output as f64),
        total_tokens_per_s: rate((prompt + output) as f64),
        ttft_s: Summary::of(ok.iter().map(|s| s.ttft_s)),
        // Pooled over every request's gaps, as vLLM's benchmarks do.
        itl_s: Summary::of(ok.iter().flat_map(|s| s.itl_s.iter().copied())),
        e2e_s: Summary::of(ok.iter().map(|s| s.e2e_s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_match_numpy() {
        // numpy.percentile(x, p) with the default linear method.
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        for (p, want) in [(0.0, 1.0), (50.0, 5.5), (90.0, 9.1), (99.0, 9.91), (100.0, 10.0), (25.0, 3.25)] {
            assert!(close(percentile(&x, p).unwrap(), want), "p{p}: {:?}", percentile(&x, p));
        }
        let y = [0.010, 0.020, 0.040, 0.100];
        for (p, want) in [(50.0, 0.030), (90.0, 0.082), (99.0, 0.0982)] {
            assert!(close(percentile(&y, p).unwrap(), want), "p{p}");
        }
        assert_eq!(percentile(&[0.25], 99.0), Some(0.25), "one sample is every percentile");
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn summary_sorts_and_handles_edges() {
        let s = Summary::of([4.0, 1.0, 3.0, 2.0]).unwrap();
        assert!(close(s.mean, 2.5) && close(s.p50, 2.5) && close(s.p90, 3.7) && close(s.p99, 3.97), "{s:?}");
        assert_eq!(Summary::of([0.5]), Some(Summary { mean: 0.5, p50: 0.5, p90: 0.5, p99: 0.5 }));
        assert_eq!(Summary::of(std::iter::empty()), None);
    }

    #[test]
    fn timer_measures_first_token_and_gaps() {
        let mut t = RequestTimer::default();
        for at in [0.5, 0.6, 0.75, 0.8] {
            t.text_at(at);
        }
        let s = t.finish(0.9, 100, 4);
        assert_eq!((s.ttft_s, s.e2e_s, s.prompt_tokens, s.output_tokens), (0.5, 0.9, 100, 4));
        let want = [0.1, 0.15, 0.05];
        assert!(s.itl_s.iter().zip(want).all(|(a, b)| close(*a, b)) && s.itl_s.len() == 3, "{:?}", s.itl_s);
        let empty = RequestTimer::default().finish(0.3, 10, 0);
        assert_eq!((empty.ttft_s, empty.itl_s.len()), (0.3, 0));
    }

    #[test]
    fn aggregates_a_point() {
        let point = GridPoint { prompt_tokens: 100, concurrency: 2, max_tokens: 4 };
        let sample = |ttft: f64, itl: &[f64], e2e: f64, out: u64| {
            Outcome::Ok(RequestSample { prompt_tokens: 101, output_tokens: out, ttft_s: ttft, itl_s: itl.to_vec(), e2e_s: e2e })
        };
        let outcomes = [
            sample(0.1, &[0.01, 0.03], 0.2, 3),
            sample(0.3, &[0.02], 0.4, 2),
            Outcome::Rejected,
            Outcome::Failed("500".into()),
            Outcome::Failed("500".into()),
            Outcome::Failed("connection".into()),
        ];
        let r = aggregate(point, &outcomes, 2.0);
        assert_eq!((r.requests, r.rejected), (2, 1));
        assert_eq!(r.failed, BTreeMap::from([("500".to_string(), 2), ("connection".to_string(), 1)]));
        assert_eq!((r.mean_prompt_tokens, r.mean_output_tokens), (Some(101.0), Some(2.5)));
        assert!(close(r.request_throughput, 1.0) && close(r.output_tokens_per_s, 2.5) && close(r.total_tokens_per_s, 103.5));
        let ttft = r.ttft_s.unwrap();
        assert!(close(ttft.mean, 0.2) && close(ttft.p50, 0.2) && close(ttft.p99, 0.298), "{ttft:?}");
        let itl = r.itl_s.unwrap();
        assert!(close(itl.p50, 0.02) && close(itl.mean, 0.02), "{itl:?}");
        assert!(close(r.e2e_s.unwrap().p90, 0.38));

        let none = aggregate(point, &[Outcome::Rejected], 1.0);
        assert_eq!((none.requests, none.ttft_s, none.mean_output_tokens, none.request_throughput), (0, None, None, 0.0));
    }
}
