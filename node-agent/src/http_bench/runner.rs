//! Runs the grid against the server: calibrates each prompt length's word count on the server's
//! own token counts, then for each point keeps `concurrency` clients busy until the point's
//! budget is spent. Every request is recorded as an [`Outcome`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use hyper::StatusCode;
use indicatif::ProgressBar;
use serde_json::{Value, json};
use thiserror::Error;
use tokio::task::JoinSet;

use super::client::{Conn, Endpoint, HttpError, NO_USAGE, StreamEnd, prompt_tokens_of, stream_completion};
use super::grid::{Budget, GridPoint};
use super::prompt;
use super::sse::excerpt;
use super::stats::Outcome;

/// What every request of a run shares.
pub struct Target {
    pub endpoint: Endpoint,
    pub model: String,
    pub api_key: Option<String>,
    pub seed: u64,
}

/// The streaming completion request: greedy (`temperature` 0), usage in the last chunk. The
/// server cannot be told to ignore end-of-sequence, so the output tokens are what `usage` says.
pub fn completion_body(model: &str, prompt: &str, max_tokens: u64) -> Value {
    json!({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true},
    })
}

/// How a request's end counts, and whether its connection may carry the next request.
pub fn outcome(end: StreamEnd) -> (Outcome, bool) {
    match end {
        StreamEnd::Done(s) => (Outcome::Ok(s), true),
        StreamEnd::Status { status: StatusCode::SERVICE_UNAVAILABLE, retry_after: true, .. } => (Outcome::Rejected, true),
        StreamEnd::Status { status, .. } => (Outcome::Failed(status.as_u16().to_string()), true),
        StreamEnd::NotStreaming { .. } => (Outcome::Failed("not streaming".into()), true),
        StreamEnd::Broken(_) => (Outcome::Failed("stream".into()), false),
        StreamEnd::Connection(_) => (Outcome::Failed("connection".into()), false),
    }
}

/// A request's end as the error that stops the run (calibration must succeed).
fn fatal(end: StreamEnd, url: &str) -> String {
    match end {
        StreamEnd::Done(_) => format!("{url}: finished"),
        StreamEnd::Status { status, body, .. } => HttpError::status(url, status, &body).to_string(),
        StreamEnd::NotStreaming { content_type, body } => format!(
            "{url}: asked for a stream, got `{content_type}` instead of text/event-stream (does the server support stream: true?): {}",
            excerpt(&body)
        ),
        StreamEnd::Broken(e) => format!("{url}: {e}"),
        StreamEnd::Connection(e) => e.to_string(),
    }
}

/// Why a prompt length could not be sized on the server (the run stops: every message names the
/// length and the URL).
#[derive(Debug, Error)]
pub enum CalibrationError {
    #[error("sizing a {target}-token prompt: {source}")]
    Http {
        target: u64,
        #[source]
        source: HttpError,
    },
    /// The sizing request was answered, but not with a count (a status, a stream that broke).
    #[error("sizing a {target}-token prompt: {answer}")]
    Answer { target: u64, answer: String },
}

impl From<CalibrationError> for String {
    /// For callers that report errors as text.
    fn from(e: CalibrationError) -> String {
        e.to_string()
    }
}

/// The first calibration's probe: long enough to measure tokens per word, short enough to fit.
const PROBE_WORDS: u64 = 64;

/// Calibration's result for one prompt length.
#[derive(Clone, Copy, Debug)]
pub struct Calibrated {
    pub words: usize,
    pub prompt_tokens: u64,
}

/// Each prompt length calibrated once, the next starting from the previous one's result.
#[derive(Debug, Default)]
pub struct PromptSizes(Vec<(u64, Calibrated)>);

impl PromptSizes {
    /// Words for prompts of `prompt_tokens` on `t`'s server, calibrating the length on first use.
    pub async fn words(&mut self, t: &Target, prompt_tokens: u64) -> Result<usize, CalibrationError> {
        Ok(self.calibration(t, prompt_tokens).await?.words)
    }

    /// The calibration of prompts of `prompt_tokens` on `t`'s server (run on first use).
    pub async fn calibration(&mut self, t: &Target, prompt_tokens: u64) -> Result<Calibrated, CalibrationError> {
        if let Some((_, c)) = self.0.iter().find(|(p, _)| *p == prompt_tokens) {
            return Ok(*c);
        }
        let c = calibrate(t, prompt_tokens, self.0.last().map(|(_, c)| *c)).await?;
        self.0.push((prompt_tokens, c));
        Ok(c)
    }

    /// Every length calibrated so far, in order.
    pub fn calibrated(&self) -> &[(u64, Calibrated)] {
        &self.0
    }
}

/// Finds the word count whose prompts the server counts as `target` tokens (within 2%, in at most
/// four one-token requests, keeping the closest). The first guess comes from an earlier length's
/// result, else from a short probe: a guess of one token per word could overrun the context
/// where the right count fits. Errors here stop the run: they name the URL.
pub async fn calibrate(t: &Target, target: u64, earlier: Option<Calibrated>) -> Result<Calibrated, CalibrationError> {
    let url = t.endpoint.url("/v1/completions");
    let http = |source| CalibrationError::Http { target, source };
    let mut conn = Conn::open(&t.endpoint).await.map_err(http)?;
    let mut words = match earlier {
        Some(e) => prompt::rescale(e.words, e.prompt_tokens, target),
        None => target.min(PROBE_WORDS) as usize,
    };
    let mut best: Option<Calibrated> = None;
    for attempt in 0..4u64 {
        // Nonces from the top of the range: no measured request shares these prompts.
        let text = prompt::build(words, t.seed, u64::MAX - attempt);
        let body = completion_body(&t.model, &text, 1);
        let counted = match stream_completion(&mut conn, &body, t.api_key.as_deref(), None).await {
            StreamEnd::Done(s) => s.prompt_tokens,
            // A stream without usage (llama-cpp-python's server): the same prompt unstreamed.
            StreamEnd::Broken(e) if e.contains(NO_USAGE) => {
                let mut plain = body.clone();
                plain["stream"] = false.into();
                plain.as_object_mut().map(|o| o.remove("stream_options"));
                if !conn.usable() {
                    conn = Conn::open(&t.endpoint).await.map_err(http)?;
                }
                prompt_tokens_of(&mut conn, &plain, t.api_key.as_deref()).await.map_err(http)?
            }
            other => return Err(CalibrationError::Answer { target, answer: fatal(other, &url) }),
        };
        let got = Calibrated { words, prompt_tokens: counted };
        let best = best.get_or_insert(got);
        if got.prompt_tokens.abs_diff(target) < best.prompt_tokens.abs_diff(target) {
            *best = got;
        }
        if prompt::close_enough(got.prompt_tokens, target) {
            break;
        }
        words = prompt::rescale(words, got.prompt_tokens, target);
        if !conn.usable() {
            conn = Conn::open(&t.endpoint).await.map_err(http)?;
        }
    }
    // The loop ran at least once, and every run either returned or set `best`.
    Ok(best.unwrap_or(Calibrated { words, prompt_tokens: 0 }))
}

/// Runs one point: its outcomes and the wall time from the first request to the last one's end.
pub async fn run_point(
    t: Arc<Target>,
    point: GridPoint,
    prompt: Calibrated,
    budget: Budget,
    point_index: u64,
    bar: ProgressBar,
) -> (Vec<Outcome>, f64) {
    let words = prompt.words;
    let next = Arc::new(AtomicU64::new(0));
    let limit = budget.requests(point.concurrency);
    let start = Instant::now();
    let mut clients = JoinSet::new();
    for _ in 0..point.concurrency {
        let (t, next, bar) = (t.clone(), next.clone(), bar.clone());
        clients.spawn(async move {
            let mut outcomes = Vec::new();
            let mut conn: Option<Conn> = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let more = match (limit, budget) {
                    (Some(n), _) => i < n,
                    (None, Budget::Duration(d)) => start.elapsed() < d,
                    (None, _) => false,
                };
                if !more {
                    break;
                }
                let body = completion_body(&t.model, &prompt::build(words, t.seed, (point_index << 40) | i), point.max_tokens);
                if !conn.as_ref().is_some_and(Conn::usable) {
                    conn = Conn::open(&t.endpoint).await.ok();
                }
                let (o, keep) = match conn.as_mut() {
                    Some(c) => outcome(stream_completion(c, &body, t.api_key.as_deref(), Some(prompt.prompt_tokens)).await),
                    None => (Outcome::Failed("connection".into()), false),
                };
                if !keep {
                    conn = None;
                }
                outcomes.push(o);
                bar.inc(1);
            }
            outcomes
        });
    }
    let mut all = Vec::new();
    while let Some(done) = clients.join_next().await {
        // A client task cannot panic on a server's answer; if one did, its requests are lost, not the run.
        if let Ok(outcomes) = done {
            all.extend(outcomes);
        }
    }
    (all, start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_bench::stats::RequestSample;

    #[test]
    fn request_body_asks_for_a_greedy_stream_with_usage() {
        let b = completion_body("m", "the of and", 64);
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!((b["temperature"].as_u64(), b["max_tokens"].as_u64(), b["model"].as_str()), (Some(0), Some(64), Some("m")));
    }

    #[test]
    fn outcomes_by_how_requests_end() {
        let status = |code: u16, retry_after: bool| StreamEnd::Status {
            status: StatusCode::from_u16(code).unwrap(),
            retry_after,
            body: String::new(),
        };
        let sample = RequestSample { prompt_tokens: 1, output_tokens: 1, ttft_s: 0.1, itl_s: vec![], e2e_s: 0.1 };
        let cases = [
            (StreamEnd::Done(sample.clone()), Outcome::Ok(sample), true),
            (status(503, true), Outcome::Rejected, true),
            (status(503, false), Outcome::Failed("503".into()), true),
            (status(500, false), Outcome::Failed("500".into()), true),
            (status(429, true), Outcome::Failed("429".into()), true),
            (
                StreamEnd::NotStreaming { content_type: "application/json".into(), body: "{}".into() },
                Outcome::Failed("not streaming".into()),
                true,
            ),
            (StreamEnd::Broken("x".into()), Outcome::Failed("stream".into()), false),
            (StreamEnd::Connection(HttpError::ConnectTimeout { base: "http://h:1".into() }), Outcome::Failed("connection".into()), false),
        ];
        for (end, want, keep) in cases {
            assert_eq!(outcome(end), (want, keep));
        }
    }

    #[test]
    fn fatal_errors_name_the_url() {
        let url = "http://h:1/v1/completions";
        let e = fatal(StreamEnd::NotStreaming { content_type: "application/json".into(), body: r#"{"choices":[]}"#.into() }, url);
        assert!(e.starts_with(url) && e.contains("text/event-stream"), "{e}");
        let e = fatal(StreamEnd::Status { status: StatusCode::UNAUTHORIZED, retry_after: false, body: String::new() }, url);
        assert!(e.starts_with(url) && e.contains("--api-key"), "{e}");
    }
}
