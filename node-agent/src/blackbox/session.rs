//! One black-box qualification of a running engine: discover what it offers, calibrate the
//! prompt sizes and the deadlines, run every derived case (a failure is followed by a health
//! check: an engine that stopped answering ends the run), bisect a clamp down to one token, and
//! build the report. Errors (`Err`) are bad input: an engine that cannot be reached or does not
//! speak the OpenAI API. An engine that fails is a verdict, not an error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use brink_api::blackbox::{BLACKBOX_SCHEMA, BlackBoxReport, EngineLimits};
use brink_api::selftest::{CaseReport, CaseResult, Phase, Verdict};
use brink_kernels::limits::DeviceLimits;
use brink_kernels::thresholds::ModelShape;
use hyper::Method;
use indicatif::{ProgressBar, ProgressStyle};

use super::client::{AnswerError, Dropped, Engine, Sent, TokenizerEndpoint, context_of};
use super::plan::{self, Composition, GEN_TOKENS, HttpCase, Limits};
use super::prompt::{self, NoFiller, Sizer, WordCost};
use super::verdict::{self, Answer};
use crate::http_bench::client::endpoint;

/// Bad input to a run: an engine that cannot be reached or does not speak the OpenAI API,
/// named by its URL (or by the flag at fault).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// `--url` is not an engine's URL (the message names it).
    #[error("{0}")]
    Url(String),
    #[error("{url}: 404 Not Found (is this an OpenAI-compatible server?)")]
    NoModelList { url: String },
    /// `GET /v1/models` failed.
    #[error(transparent)]
    ModelList(#[from] AnswerError),
    /// `--model` names no model the engine lists, or it lists none (the message says which).
    #[error("{0}")]
    Model(String),
    #[error("{url}: not an OpenAI-compatible completion: {reason}")]
    NotCompletion { url: String, reason: String },
    #[error("{url}: {reason}")]
    FirstDropped { url: String, reason: String },
    /// The first, short prompt refused with a 4xx.
    #[error("{url}: HTTP {status}{} to a {words}-word prompt: {body}", status_hint(*.status))]
    FirstRefused { url: String, status: u16, words: usize, body: String },
    #[error("calibrating the prompt sizes: {0}")]
    Calibration(#[source] CountError),
    #[error("{url}: {source}")]
    Sizing {
        url: String,
        #[source]
        source: NoFiller,
    },
    #[error("the context is too short for any prompt")]
    ContextTooShort,
}

/// What to do about a 4xx to the first prompt.
fn status_hint(status: u16) -> &'static str {
    match status {
        401 | 403 => " (pass the engine's key with --api-key)",
        404 => " (is this an OpenAI-compatible server?)",
        _ => "",
    }
}

/// A prompt that could not be counted.
#[derive(Debug, thiserror::Error)]
pub enum CountError {
    /// The tokenizer endpoint.
    #[error(transparent)]
    Tokenizer(#[from] AnswerError),
    #[error("{path}: a negative count")]
    Negative { path: &'static str },
    /// A one-token completion whose usage could not be read (`problem`: what it answered).
    #[error("{url}: {problem}")]
    Usage { url: String, problem: String },
}

/// A prompt of a case's length that could not be built.
#[derive(Debug, thiserror::Error)]
enum SizeError {
    #[error("shorter than {min}")]
    TooShort { min: u64 },
    #[error("the tokenizer endpoint counts {counted}")]
    Miscounted { counted: u64 },
    #[error(transparent)]
    Count(#[from] CountError),
}

/// What an engine did instead of answering again after a failure.
#[derive(Debug, thiserror::Error)]
enum Silence {
    #[error("GET {path}: HTTP {status}: {said}")]
    Health { path: &'static str, status: u16, said: String },
    #[error("GET {path}: no answer")]
    HealthTimeout { path: &'static str },
    #[error("GET {path}: {source}")]
    HealthDropped {
        path: &'static str,
        #[source]
        source: Dropped,
    },
    #[error("a short prompt again: {0}")]
    Probe(String),
}

/// The engine stayed silent for `after` (the whole window a failed engine has).
#[derive(Debug, thiserror::Error)]
#[error("{last} (for {:.0} s)", .after.as_secs_f64())]
struct Unresponsive {
    last: Silence,
    after: Duration,
}

/// What to qualify, and how patiently.
#[derive(Clone, Debug)]
pub struct Options {
    pub url: String,
    /// The model to request (default: the first `/v1/models` lists).
    pub model: Option<String>,
    pub api_key: Option<String>,
    pub shape: ModelShape,
    /// The engine's context, when given (else asked of the engine).
    pub context: Option<u64>,
    pub max_batch_tokens: u64,
    pub prefill_chunk: u64,
    /// Every case's deadline starts here (plus `deadline_factor` times its expected time);
    /// also how long a failed engine has to answer again before it counts as dead.
    pub deadline: Duration,
    pub deadline_factor: f64,
    pub seed: u64,
}

/// Deadline of the discovery and calibration requests (short prompts, metadata).
const SETUP_DEADLINE: Duration = Duration::from_secs(60);

/// The short prompt every run starts with: does the engine speak the API at all?
const FIRST_PROMPT: &str = "the river and the city";

/// Prompt tokens of the request the first deadlines are calibrated on.
const CALIBRATION_TOKENS: u64 = 256;

/// Prompt tokens of the health probe after a failure.
const PROBE_TOKENS: u64 = 16;

/// How prompts are counted before they run.
enum Counter {
    /// The engine's tokenizer endpoint; `offset`: what its usage adds (e.g. a BOS the endpoint leaves out).
    Tokenizer { endpoint: TokenizerEndpoint, offset: i64 },
    /// One-token completions, read from `usage.prompt_tokens`.
    Usage,
}

impl Counter {
    fn describe(&self) -> String {
        match self {
            Counter::Tokenizer { endpoint, offset } => {
                format!(
                    "tokenizer endpoint {} (usage adds {offset}), each prompt checked before it is sent and against usage",
                    endpoint.path
                )
            }
            Counter::Usage => "calibrated from the usage counts of one-token completions, each prompt checked against usage".into(),
        }
    }

    async fn count(&self, engine: &Engine, text: &str) -> Result<u64, CountError> {
        match self {
            Counter::Tokenizer { endpoint, offset } => {
                let n = endpoint.tokens(engine, text, SETUP_DEADLINE).await?;
                u64::try_from(n as i64 + offset).map_err(|_| CountError::Negative { path: endpoint.path })
            }
            Counter::Usage => match engine.complete(text, 1, SETUP_DEADLINE).await {
                Answer::Completion { prompt_tokens, .. } => Ok(prompt_tokens),
                other => {
                    let req = plan::Request { prompt_tokens: 0, max_tokens: 1 };
                    let problem = verdict::problem(&req, &other).map_or_else(|| format!("{other:?}"), |(p, _)| p);
                    Err(CountError::Usage { url: engine.endpoint.url("/v1/completions"), problem })
                }
            },
        }
    }
}

/// Runs the qualification; `Err` for bad input (message names the URL or the flag).
pub async fn run(o: &Options) -> Result<BlackBoxReport, RunError> {
    let mut phases = Vec::new();
    let t0 = Instant::now();
    let endpoint = endpoint(&o.url).map_err(|e| RunError::Url(e.to_string()))?;
    let mut engine = Engine { endpoint, model: String::new(), api_key: o.api_key.clone(), logprobs: true };
    let models_url = engine.endpoint.url("/v1/models");
    let models = engine.get_json("/v1/models", SETUP_DEADLINE).await?.ok_or_else(|| RunError::NoModelList { url: models_url.clone() })?;
    engine.model = crate::http_bench::pick_model(&models, o.model.as_deref(), &models_url)
        .map_err(|e| RunError::Model(e.to_string().replace("--model-name", "--model")))?;
    let health = match engine.send(Method::GET, "/health", None, SETUP_DEADLINE).await {
        Sent::Answered { status, .. } if (200..300).contains(&status) => Some("/health"),
        _ => None,
    };
    let (context, context_source) = match o.context {
        Some(c) => (c, "--context".to_string()),
        None => {
            let status = engine.get_json("/engine", SETUP_DEADLINE).await.ok().flatten();
            let props = engine.get_json("/props", SETUP_DEADLINE).await.ok().flatten();
            context_of(status.as_ref(), &models, &engine.model, props.as_ref()).unwrap_or((
                u64::from(o.shape.context),
                "the model's context (the engine does not say its own: pass --context if it runs with less)".into(),
            ))
        }
    };
    let limits_report = EngineLimits { context, context_source, max_batch_tokens: o.max_batch_tokens, prefill_chunk: o.prefill_chunk };
    let mut report = BlackBoxReport {
        schema: BLACKBOX_SCHEMA,
        agent_version: env!("CARGO_PKG_VERSION").into(),
        url: engine.endpoint.base.clone(),
        model: engine.model.clone(),
        shape_class: o.shape.key(),
        top_k: o.shape.top_k,
        limits: limits_report,
        sizing: String::new(),
        finite_check: String::new(),
        calibration_tokens_per_s: None,
        derived: 0,
        executed: 0,
        passed: 0,
        failed: 0,
        hung: 0,
        skipped: 0,
        length_mismatches: 0,
        engine_died: None,
        verdict: Verdict::NotQualified { reason: "not run".into() },
        phases: vec![],
        cases: vec![],
    };

    // Does it complete a short prompt, and does it give log-probabilities?
    let first = match engine.complete(FIRST_PROMPT, GEN_TOKENS, SETUP_DEADLINE).await {
        Answer::Completion { finite: None, .. } | Answer::Status { status: 400..=499, .. } => {
            engine.logprobs = false;
            engine.complete(FIRST_PROMPT, GEN_TOKENS, SETUP_DEADLINE).await
        }
        a => a,
    };
    let completions_url = engine.endpoint.url("/v1/completions");
    let first_tokens = match first {
        Answer::Completion { prompt_tokens, completion_tokens, .. } if completion_tokens > 0 => prompt_tokens,
        Answer::Malformed(reason) => return Err(RunError::NotCompletion { url: completions_url, reason }),
        Answer::Dropped(reason) => return Err(RunError::FirstDropped { url: completions_url, reason }),
        Answer::Status { status: status @ 400..=499, body } => {
            return Err(RunError::FirstRefused { url: completions_url, status, words: FIRST_PROMPT.split(' ').count(), body });
        }
        other => {
            // It answers the API but fails a short prompt: refused, with that case.
            let counted = match other {
                Answer::Completion { prompt_tokens, .. } => prompt_tokens,
                _ => 0,
            };
            let case = HttpCase::single(counted, vec!["the first prompt, a few words".into()]);
            let mut line = verdict::judge(&case, &[other], 0.0);
            line.id = "http/first-prompt".into();
            report.cases.push(line);
            return Ok(finish(report, phases, None, t0));
        }
    };
    report.finite_check = if engine.logprobs {
        "log-probabilities of every generated token (logprobs: 1), the text and the token counts".into()
    } else {
        "the text and the token counts (the engine gives no log-probabilities)".into()
    };

    let mut counter = Counter::Usage;
    for endpoint in TokenizerEndpoint::KNOWN {
        if let Ok(n) = endpoint.tokens(&engine, FIRST_PROMPT, SETUP_DEADLINE).await {
            counter = Counter::Tokenizer { endpoint, offset: first_tokens as i64 - n as i64 };
            break;
        }
    }
    report.sizing = counter.describe();
    phases.push(Phase { name: "discover".into(), seconds: t0.elapsed().as_secs_f64() });

    let t_cal = Instant::now();
    let mut costs: Vec<WordCost> = Vec::new();
    for w in prompt::candidates() {
        let (alone, repeated) = prompt::calibration_texts(w);
        let (a, r) = (counter.count(&engine, &alone).await, counter.count(&engine, &repeated).await);
        match (a, r) {
            (Ok(a), Ok(r)) => costs.extend(prompt::word_cost(w, a, r)),
            (Err(e), _) | (_, Err(e)) => return Err(RunError::Calibration(e)),
        }
    }
    let sizer = Sizer::new(&costs).map_err(|source| RunError::Sizing { url: engine.endpoint.base.clone(), source })?;
    let limits = Limits { context, max_batch_tokens: o.max_batch_tokens, prefill_chunk: o.prefill_chunk, min_prompt: sizer.min_prompt() };
    let derived = plan::derive(&o.shape, &limits, &DeviceLimits::gb10());
    let probe_len = PROBE_TOKENS.max(limits.min_prompt).min(limits.max_prompt());
    let probe = (sizer.build(probe_len, o.seed, u64::MAX).ok_or(RunError::ContextTooShort)?, probe_len);

    // The first deadlines scale with the prefill speed of one medium prompt.
    let run = Arc::new(Runner { engine, sizer, counter, seed: o.seed });
    let cal_len = CALIBRATION_TOKENS.max(limits.min_prompt).min(limits.max_prompt());
    let cal = HttpCase::single(cal_len, vec![]);
    let mut cal_nonce = 1 << 48;
    let (answers, wall) = run.case(&cal, SETUP_DEADLINE, &mut cal_nonce).await;
    let mut tokens_per_s = match verdict::judge(&cal, &answers, 0.0).result {
        CaseResult::Passed => Some(cal_len as f64 / wall.as_secs_f64().max(1e-3)),
        _ => None,
    };
    report.calibration_tokens_per_s = tokens_per_s;
    phases.push(Phase { name: "calibrate".into(), seconds: t_cal.elapsed().as_secs_f64() });

    let t_cases = Instant::now();
    let bar = progress(derived.cases.len() as u64);
    let mut nonce = 0u64;
    let mut died: Option<String> = None;
    let mut cases: Vec<CaseReport> = Vec::new();
    let mut mismatches = 0;
    let mut queue: std::collections::VecDeque<HttpCase> = derived.cases.iter().cloned().collect();
    let mut bisecting = false;
    loop {
        let case = match queue.pop_front() {
            Some(c) => c,
            None if died.is_none() => match verdict::next_bisect(&cases) {
                Some(n) => {
                    if !bisecting {
                        bisecting = true;
                        bar.finish_and_clear();
                        phases.push(Phase { name: "cases".into(), seconds: t_cases.elapsed().as_secs_f64() });
                    }
                    HttpCase::single(n, vec!["bisecting between the longest prompt that passed and the shortest that failed".into()])
                }
                None => break,
            },
            None => break,
        };
        if let Some(d) = &died {
            cases.push(verdict::skipped(&case, &format!("not run: {d}")));
            continue;
        }
        let deadline = deadline_of(&case, tokens_per_s, o);
        let (answers, wall) = run.case(&case, deadline, &mut nonce).await;
        mismatches += verdict::mismatches(&case, &answers);
        let line = verdict::judge(&case, &answers, wall.as_secs_f64() * 1000.0);
        bar.inc(1);
        match line.result {
            CaseResult::Passed if case.composition == Composition::Single && case.count >= 64 => {
                tokens_per_s = Some(case.prompt_tokens() as f64 / wall.as_secs_f64().max(1e-3));
            }
            CaseResult::Passed => {}
            _ => {
                bar.println(format!("{:?} {}: {}", line.result, line.id, line.detail));
                if let Err(why) = run.alive(health, &probe, o.deadline).await {
                    let d = format!("after {} failed ({}), {why}", line.id, line.detail);
                    bar.println(format!("the engine stopped answering: {why}"));
                    died = Some(d);
                }
            }
        }
        cases.push(line);
    }
    bar.finish_and_clear();
    phases.push(Phase { name: if bisecting { "bisect" } else { "cases" }.into(), seconds: t_cases.elapsed().as_secs_f64() });
    cases.extend(derived.skipped.iter().map(|(c, why)| verdict::skipped(c, why)));
    cases.sort_by(|a, b| (a.tokens, &a.kernel, &a.id).cmp(&(b.tokens, &b.kernel, &b.id)));
    report.cases = cases;
    report.length_mismatches = mismatches;
    Ok(finish(report, phases, died, t0))
}

fn finish(mut report: BlackBoxReport, mut phases: Vec<Phase>, died: Option<String>, t0: Instant) -> BlackBoxReport {
    phases.push(Phase { name: "total".into(), seconds: t0.elapsed().as_secs_f64() });
    report.phases = phases;
    report.count();
    report.verdict = verdict::verdict(&report.cases, died.as_deref());
    report.engine_died = died;
    report
}

/// A case's deadline: the floor, plus `factor` times the time its prompts take at the last
/// measured speed (a conservative 50 tokens/s when none was measured).
fn deadline_of(case: &HttpCase, tokens_per_s: Option<f64>, o: &Options) -> Duration {
    let tps = tokens_per_s.filter(|t| t.is_finite() && *t > 0.0).unwrap_or(50.0);
    let work = case.prompt_tokens() as f64 / tps * o.deadline_factor;
    o.deadline + Duration::from_secs_f64(work.min(86_400.0))
}

fn progress(n: u64) -> ProgressBar {
    // indicatif draws nothing when stderr is not a terminal.
    let bar = ProgressBar::new(n).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} cases [{elapsed}] {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// What running cases needs.
struct Runner {
    engine: Engine,
    sizer: Sizer,
    counter: Counter,
    seed: u64,
}

impl Runner {
    /// A prompt of exactly `tokens` (checked with the tokenizer endpoint when there is one: a
    /// few orders are tried), or why not.
    async fn prompt(&self, tokens: u64, nonce: &mut u64) -> Result<String, SizeError> {
        let mut tries = 0;
        loop {
            tries += 1;
            *nonce += 1;
            let text = self.sizer.build(tokens, self.seed, *nonce).ok_or(SizeError::TooShort { min: self.sizer.min_prompt() })?;
            let miscount = match &self.counter {
                Counter::Usage => return Ok(text),
                Counter::Tokenizer { .. } => match self.counter.count(&self.engine, &text).await {
                    Ok(n) if n == tokens => return Ok(text),
                    Ok(n) => SizeError::Miscounted { counted: n },
                    Err(e) => SizeError::Count(e),
                },
            };
            if tries == 3 {
                return Err(miscount);
            }
        }
    }

    /// Sends the case's requests together (a mixed case's decoding requests first) and returns
    /// their answers in the order of `case.requests`, and the wall time.
    async fn case(self: &Arc<Self>, case: &HttpCase, deadline: Duration, nonce: &mut u64) -> (Vec<Answer>, Duration) {
        let mut prompts = Vec::new();
        for r in &case.requests {
            prompts.push(self.prompt(r.prompt_tokens, nonce).await);
        }
        let start = Instant::now();
        let mut handles = Vec::new();
        // Decoding requests go first, so that they decode while the long prompt fills.
        let order: Vec<usize> = match case.composition {
            Composition::MixedDecode => (1..case.requests.len()).chain([0]).collect(),
            _ => (0..case.requests.len()).collect(),
        };
        let mut slots: Vec<Option<Answer>> = vec![None; case.requests.len()];
        for i in order {
            let req = case.requests[i];
            match &prompts[i] {
                Err(e) => slots[i] = Some(Answer::Unsized(e.to_string())),
                Ok(text) => {
                    let (me, text) = (self.clone(), text.clone());
                    handles.push((i, tokio::spawn(async move { me.engine.complete(&text, req.max_tokens, deadline).await })));
                }
            }
            if case.composition == Composition::MixedDecode && i == case.requests.len() - 1 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        for (i, h) in handles {
            slots[i] = Some(h.await.unwrap_or_else(|e| Answer::Dropped(format!("the request's task failed: {e}"))));
        }
        let answers = slots.into_iter().map(|a| a.unwrap_or(Answer::Dropped("not sent".into()))).collect();
        (answers, start.elapsed())
    }

    /// After a failure: the engine answers its health endpoint (when it has one) and completes
    /// a short prompt again within `window`, or `Err` with what it did instead.
    async fn alive(&self, health: Option<&'static str>, probe: &(String, u64), window: Duration) -> Result<(), Unresponsive> {
        let t0 = Instant::now();
        loop {
            let left = window.saturating_sub(t0.elapsed()).max(Duration::from_secs(1));
            let why = match health {
                Some(path) => match self.engine.send(Method::GET, path, None, left).await {
                    Sent::Answered { status, .. } if (200..300).contains(&status) => None,
                    Sent::Answered { status, body } => Some(Silence::Health { path, status, said: super::client::said(&body) }),
                    Sent::Timeout => Some(Silence::HealthTimeout { path }),
                    Sent::Dropped(source) => Some(Silence::HealthDropped { path, source }),
                },
                None => None,
            };
            let why = match why {
                Some(w) => w,
                None => match self.engine.complete(&probe.0, GEN_TOKENS, left).await {
                    Answer::Completion { completion_tokens, .. } if completion_tokens > 0 => return Ok(()),
                    other => {
                        let req = plan::Request { prompt_tokens: probe.1, max_tokens: GEN_TOKENS };
                        Silence::Probe(verdict::problem(&req, &other).map_or_else(|| format!("{other:?}"), |(p, _)| p))
                    }
                },
            };
            if t0.elapsed() >= window {
                return Err(Unresponsive { last: why, after: t0.elapsed() });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_first_prompt_says_what_to_do() {
        let url = "http://engine:8000/v1/completions".to_string();
        let refused = |status| RunError::FirstRefused { url: url.clone(), status, words: 5, body: "no".into() };
        assert_eq!(
            refused(401).to_string(),
            "http://engine:8000/v1/completions: HTTP 401 (pass the engine's key with --api-key) to a 5-word prompt: no"
        );
        assert!(refused(404).to_string().contains("HTTP 404 (is this an OpenAI-compatible server?) to a 5-word prompt"));
        assert_eq!(refused(422).to_string(), "http://engine:8000/v1/completions: HTTP 422 to a 5-word prompt: no");
        let e = RunError::Calibration(CountError::Negative { path: "/tokenize" });
        assert_eq!(e.to_string(), "calibrating the prompt sizes: /tokenize: a negative count");
    }
}
