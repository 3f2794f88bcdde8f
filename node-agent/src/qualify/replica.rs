//! A replica's own model-level threshold test: the result a replica Pod needs before `/ready`,
//! kept on the node (the agent's state directory, which replica Pods mount from the host) under
//! the shape key and the fingerprint, so a recreated Pod on the same node reuses it instead of
//! paying for the test again. What the replica proved is also written for the node agent to
//! publish in the `ModelReplica`'s status ([`ReplicaReport`]).
//!
//! The decisions are pure ([`reuse`], [`hold_reason`]); reading and writing are thin and name
//! the file in every error.

use std::path::{Path, PathBuf};

use brink_api::crd::FailingCase;
use brink_api::{CaseResult, FieldChange, Fingerprint, ModelTestReport, ReportSummary, Verdict};
use serde::{Deserialize, Serialize};

use super::cache;

/// Bumped when a field changes meaning; a result of another schema is not reused. 2: with
/// the fingerprint's KV layout (`brink_api::QUALIFICATION_SCHEMA` 2).
pub const RESULT_SCHEMA: u32 = 2;
/// Failing cases kept (smallest counts first: they say where the envelope ends).
pub const MAX_FAILING: usize = 8;

/// A model-level test's result on this node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelTestResult {
    pub schema: u32,
    pub fingerprint: Fingerprint,
    /// `fingerprint.digest()` when written: a file edited afterwards is not trusted.
    pub digest: String,
    pub verdict: Verdict,
    pub summary: ReportSummary,
    pub failing_cases: Vec<FailingCase>,
    /// RFC 3339.
    pub tested_at: String,
    /// Wall time of the test (model load included).
    pub seconds: f64,
}

impl ModelTestResult {
    pub fn of(report: &ModelTestReport, fingerprint: Fingerprint, tested_at: String, seconds: f64) -> ModelTestResult {
        ModelTestResult {
            schema: RESULT_SCHEMA,
            digest: fingerprint.digest(),
            fingerprint,
            verdict: report.verdict.clone(),
            summary: ReportSummary::from(report),
            failing_cases: failing(report),
            tested_at,
            seconds,
        }
    }
}

/// The failed and hung cases, smallest count first, at most [`MAX_FAILING`].
pub fn failing(report: &ModelTestReport) -> Vec<FailingCase> {
    let mut v: Vec<FailingCase> = report
        .cases
        .iter()
        .filter(|c| matches!(c.result, CaseResult::Failed | CaseResult::Hung))
        .map(|c| FailingCase { id: c.id.clone(), kernel: c.kernel.clone(), tokens: c.tokens, detail: c.detail.clone() })
        .collect();
    v.sort_by(|a, b| (a.tokens, &a.id).cmp(&(b.tokens, &b.id)));
    v.truncate(MAX_FAILING);
    v
}

/// Where the node keeps the model-level result for `shape_key`: beside `up`'s qualification.
pub fn path(dir: &Path, shape_key: &str) -> PathBuf {
    cache::path(dir, shape_key).with_extension("model-test.json")
}

/// Why no result on the node may be reused for the current fingerprint: what is wrong with
/// the replica's own kept result, and with `up`'s cached qualification when it has one.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{own}{}", up.as_ref().map(|u| format!("; {u}")).unwrap_or_default())]
pub struct NotReused {
    pub own: OwnResult,
    pub up: Option<UpResult>,
}

/// The replica's own result file.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum OwnResult {
    #[error("no replica result on this node")]
    Missing,
    #[error("the kept result has schema {0} (this agent writes {RESULT_SCHEMA})")]
    Schema(u32),
    #[error("the kept result does not match its fingerprint (edited or damaged)")]
    Edited,
    #[error("the kept result is for another fingerprint: {}", .0.iter().map(|c| c.to_string()).collect::<Vec<_>>().join("; "))]
    OtherFingerprint(Vec<FieldChange>),
}

/// `up`'s cached qualification of the same shape key.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum UpResult {
    #[error("`up`'s result has no model-level verdict")]
    NoModelVerdict,
    /// Not reusable for the current fingerprint (changed, corrupt, another schema).
    #[error("`up`'s result: {}", .0.describe())]
    Unusable(cache::CacheDecision),
}

/// A result found on the node, `Ok` when it may be used for `current`; `Err` says why not.
/// Either the replicas' own result file, or `up`'s cached qualification (which carries its
/// model-level verdict) under the same fingerprint.
pub fn reuse(current: &Fingerprint, own: Option<ModelTestResult>, up: cache::Cached) -> Result<ModelTestResult, NotReused> {
    let own = match own {
        None => OwnResult::Missing,
        Some(r) if r.schema != RESULT_SCHEMA => OwnResult::Schema(r.schema),
        Some(r) if r.digest != r.fingerprint.digest() => OwnResult::Edited,
        Some(r) => {
            let changes = r.fingerprint.changed_fields(current);
            if changes.is_empty() {
                return Ok(r);
            }
            OwnResult::OtherFingerprint(changes)
        }
    };
    let up = match cache::decide(current, up) {
        cache::CacheDecision::Reuse(q) => match (q.model_verdict, q.model_summary) {
            (Some(verdict), Some(summary)) => {
                return Ok(ModelTestResult {
                    schema: RESULT_SCHEMA,
                    digest: q.digest,
                    fingerprint: q.fingerprint,
                    verdict,
                    summary,
                    failing_cases: Vec::new(),
                    tested_at: q.qualified_at,
                    seconds: 0.0,
                });
            }
            _ => Some(UpResult::NoModelVerdict),
        },
        cache::CacheDecision::NoCache => None,
        other => Some(UpResult::Unusable(other)),
    };
    Err(NotReused { own, up })
}

/// Why the replica must stay not ready after its model-level test, if it must: a failure
/// below a passing count (disqualified), a test that could not run, or an envelope that
/// validated nothing. `None`: it may serve (clamped to the envelope).
pub fn hold_reason(result: &ModelTestResult) -> Option<String> {
    let first = result.failing_cases.first().map(|c| format!(" (first failing case {} at {} tokens: {})", c.id, c.tokens, c.detail));
    match &result.verdict {
        Verdict::Disqualified { reason } => Some(format!("model-level threshold test disqualified: {reason}{}", first.unwrap_or_default())),
        Verdict::NotQualified { reason } if result.summary.executed == 0 => {
            Some(format!("model-level threshold test did not run: {reason}"))
        }
        Verdict::ProofIncomplete { reason } => Some(format!("model-level threshold test: {reason}")),
        Verdict::Qualified { max_tokens } | Verdict::Clamped { max_tokens, .. } if *max_tokens == 0 => {
            Some("model-level threshold test validated no batch size (0 tokens)".into())
        }
        _ => None,
    }
}

pub fn read(path: &Path) -> Option<ModelTestResult> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Writes `value` as JSON to `path` (creating its directory) through a temporary file and a
/// rename, so a reader never sees half of it.
pub use super::store::write_json;

/// What a replica proved before `/ready`, for the node agent to put in its status: kept at
/// [`report_path`] by the replica's `serve`.
pub type ReplicaReport = brink_api::crd::ReplicaQualification;

/// What a black-box qualification (`brink-agent qualify --url`, the qualification sidecar of a
/// replica on another engine) proved, as the replica's report: the verdict (pass, clamp with the
/// longest admitted prompt, refuse) and its failing cases. A refused engine's Pod stays not
/// ready, and `held` says why.
pub fn black_box_report(r: &brink_api::BlackBoxReport, seconds: f64) -> ReplicaReport {
    let mut failing_cases: Vec<FailingCase> = r
        .cases
        .iter()
        .filter(|c| matches!(c.result, CaseResult::Failed | CaseResult::Hung))
        .map(|c| FailingCase { id: c.id.clone(), kernel: c.kernel.clone(), tokens: c.tokens, detail: c.detail.clone() })
        .collect();
    failing_cases.sort_by(|a, b| (a.tokens, &a.id).cmp(&(b.tokens, &b.id)));
    failing_cases.truncate(MAX_FAILING);
    let line = crate::up::report::verdict_line(&r.verdict);
    let first_failure_tokens = match r.verdict {
        Verdict::Clamped { first_failure, .. } => Some(first_failure),
        _ => None,
    };
    let held = (!r.ok()).then(|| {
        let first = failing_cases.first().map(|c| format!(" (first failing case {} at {} tokens: {})", c.id, c.tokens, c.detail));
        format!("black-box qualification of the engine refused: {line}{}", first.unwrap_or_default())
    });
    ReplicaReport {
        shape_class: r.shape_class.clone(),
        model_test_state: crate::node_metrics::qualification::state_name(&r.verdict).into(),
        model_test_message: format!("black-box qualification of {} at {}: {line}", r.model, r.url),
        reused: false,
        failing_cases,
        model_test_seconds: Some(seconds),
        held,
        ready_check: None,
        seconds_to_ready: None,
        method: Some(brink_api::crd::QualificationMethod::BlackBox),
        admitted_prompt_tokens: r.max_prompt_tokens(),
        first_failure_tokens,
    }
}

/// Where the replica `namespace/name` keeps its report under the node's directory.
pub fn report_path(dir: &Path, namespace: &str, name: &str) -> PathBuf {
    let safe = |s: &str| s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '.') { c } else { '_' }).collect::<String>();
    dir.join("replicas").join(safe(namespace)).join(format!("{}.json", safe(name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::{QUALIFICATION_SCHEMA, Qualification, ServingParams};

    fn fp() -> Fingerprint {
        super::super::fingerprint(
            None,
            "qwen3moe-h256-e16-top4-ffn256-0123456789abcdef",
            ServingParams { max_batch_tokens: 64, prefill_chunk: 32, context: 512, full_window_kv: false },
        )
    }

    fn result(verdict: Verdict, failing: Vec<FailingCase>) -> ModelTestResult {
        let f = fp();
        ModelTestResult {
            schema: RESULT_SCHEMA,
            digest: f.digest(),
            fingerprint: f,
            verdict,
            summary: ReportSummary { derived: 4, executed: 4, passed: 3, failed: 1, hung: 0, skipped: 0, negative_controls_missed: 0 },
            failing_cases: failing,
            tested_at: "2026-12-01T21:00:00Z".into(),
            seconds: 12.5,
        }
    }

    fn black_box(verdict: Verdict, failing_at: &[u64]) -> brink_api::BlackBoxReport {
        let case = |tokens: u64, result: CaseResult| brink_api::CaseReport {
            id: format!("single/t{tokens}"),
            kernel: "blackbox/single".into(),
            tokens,
            batch: vec![tokens],
            reasons: vec![],
            expect: "pass".into(),
            result,
            detail: if result == CaseResult::Passed { String::new() } else { "HTTP 500 Internal Server Error".into() },
            max_rel_err: None,
            tolerance: None,
            compared: 1,
            kernel_ms: None,
            wall_ms: 10.0,
        };
        let mut cases = vec![case(1, CaseResult::Passed), case(4096, CaseResult::Passed)];
        cases.extend(failing_at.iter().rev().map(|t| case(*t, CaseResult::Failed)));
        let mut r = brink_api::BlackBoxReport {
            schema: brink_api::BLACKBOX_SCHEMA,
            agent_version: "0".into(),
            url: "http://127.0.0.1:8080".into(),
            model: "qwen".into(),
            shape_class: "qwen3moe-h2048-e128-top8-ffn768".into(),
            top_k: 8,
            limits: brink_api::EngineLimits {
                context: 8192,
                context_source: "--context".into(),
                max_batch_tokens: 2048,
                prefill_chunk: 512,
            },
            sizing: "tokenize".into(),
            finite_check: "logprobs".into(),
            calibration_tokens_per_s: None,
            derived: 0,
            executed: 0,
            passed: 0,
            failed: 0,
            hung: 0,
            skipped: 0,
            length_mismatches: 0,
            engine_died: None,
            verdict,
            phases: vec![],
            cases,
        };
        r.count();
        r
    }

    #[test]
    fn a_black_box_verdict_becomes_the_replicas_report() {
        // Pass: the whole context admitted, nothing held.
        let pass = black_box_report(&black_box(Verdict::Qualified { max_tokens: 8192 }, &[]), 3.0);
        assert_eq!(
            (pass.model_test_state.as_str(), pass.admitted_prompt_tokens, pass.first_failure_tokens, pass.held.as_deref()),
            ("qualified", Some(8192), None, None)
        );
        assert_eq!(pass.method, Some(brink_api::crd::QualificationMethod::BlackBox));
        assert_eq!(pass.model_test_message, "black-box qualification of qwen at http://127.0.0.1:8080: QUALIFIED up to 8192 tokens");
        assert_eq!(
            (pass.model_test_seconds, pass.reused, pass.shape_class.as_str()),
            (Some(3.0), false, "qwen3moe-h2048-e128-top8-ffn768")
        );

        // Clamp: admitted under the first failure; serves (not held); failing cases smallest first.
        let clamp = black_box_report(&black_box(Verdict::Clamped { max_tokens: 7068, first_failure: 7069 }, &[7069, 8192]), 3.0);
        assert_eq!(
            (clamp.model_test_state.as_str(), clamp.admitted_prompt_tokens, clamp.first_failure_tokens, clamp.held.as_deref()),
            ("clamped", Some(7068), Some(7069), None)
        );
        assert_eq!(clamp.failing_cases.iter().map(|c| c.tokens).collect::<Vec<_>>(), [7069, 8192]);
        assert!(clamp.model_test_message.ends_with("CLAMPED to 7068 tokens (first failure at 7069)"), "{}", clamp.model_test_message);

        // Refuse: nothing admitted, held with the first failing case.
        let refuse =
            black_box_report(&black_box(Verdict::Disqualified { reason: "single/t64 fails below passing 4096".into() }, &[64]), 3.0);
        assert_eq!((refuse.model_test_state.as_str(), refuse.admitted_prompt_tokens), ("disqualified", None));
        let held = refuse.held.expect("held");
        assert!(
            held.starts_with("black-box qualification of the engine refused: DISQUALIFIED") && held.contains("single/t64 at 64 tokens"),
            "{held}"
        );
    }

    #[test]
    fn a_result_is_reused_only_under_the_same_fingerprint() {
        let mine = result(Verdict::Qualified { max_tokens: 64 }, vec![]);
        assert_eq!(reuse(&fp(), Some(mine.clone()), cache::Cached::Missing), Ok(mine.clone()));
        let mut other = fp();
        other.shape_class = "qwen3moe-h256-e16-top4-ffn256-fedcba9876543210".into();
        let why = reuse(&other, Some(mine.clone()), cache::Cached::Missing).unwrap_err();
        assert!(matches!(&why.own, OwnResult::OtherFingerprint(c) if c[0].field == "shapeClass"), "{why:?}");
        assert!(why.to_string().contains("shapeClass changed"), "{why}");
        let mut edited = mine.clone();
        edited.fingerprint.gpu_name = "NVIDIA GB10".into();
        assert!(reuse(&fp(), Some(edited), cache::Cached::Missing).unwrap_err().to_string().contains("edited or damaged"));
        let none = reuse(&fp(), None, cache::Cached::Missing).unwrap_err();
        assert_eq!(none, NotReused { own: OwnResult::Missing, up: None });
        assert_eq!(none.to_string(), "no replica result on this node");
    }

    #[test]
    fn ups_result_with_a_model_verdict_is_reused_too() {
        let f = fp();
        let q = Qualification {
            schema: QUALIFICATION_SCHEMA,
            digest: f.digest(),
            fingerprint: f.clone(),
            verdict: Verdict::Qualified { max_tokens: 64 },
            summary: ReportSummary::default(),
            qualified_at: "2026-12-01T20:00:00Z".into(),
            model_summary: Some(ReportSummary { executed: 9, passed: 9, ..ReportSummary::default() }),
            kernel_verdict: None,
            model_verdict: Some(Verdict::Clamped { max_tokens: 63, first_failure: 64 }),
        };
        let r = reuse(&f, None, cache::Cached::Found(Box::new(q.clone()))).unwrap();
        assert_eq!((r.verdict, r.tested_at.as_str()), (Verdict::Clamped { max_tokens: 63, first_failure: 64 }, "2026-12-01T20:00:00Z"));
        let mut no_model = q;
        no_model.model_verdict = None;
        let why = reuse(&f, None, cache::Cached::Found(Box::new(no_model))).unwrap_err();
        assert_eq!(why.up, Some(UpResult::NoModelVerdict));
        assert_eq!(why.to_string(), "no replica result on this node; `up`'s result has no model-level verdict");
    }

    #[test]
    fn a_failure_below_a_pass_holds_ready_naming_the_case() {
        let case = FailingCase { id: "model/single/t5".into(), kernel: "model/single".into(), tokens: 5, detail: "logits differ".into() };
        let why = hold_reason(&result(Verdict::Disqualified { reason: "model/single fails at 5 tokens but 64 pass".into() }, vec![case]));
        assert!(why.as_deref().is_some_and(|w| w.contains("model/single/t5 at 5 tokens: logits differ")), "{why:?}");
        assert_eq!(hold_reason(&result(Verdict::Qualified { max_tokens: 64 }, vec![])), None);
        assert_eq!(hold_reason(&result(Verdict::Clamped { max_tokens: 31, first_failure: 32 }, vec![])), None);
        let mut not_run = result(Verdict::NotQualified { reason: "tiny.gguf: not a GGUF file".into() }, vec![]);
        not_run.summary.executed = 0;
        assert!(hold_reason(&not_run).is_some_and(|w| w.contains("did not run")));
    }

    #[test]
    fn results_and_reports_round_trip_through_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), &fp().shape_class);
        assert!(p.ends_with("qualifications/qwen3moe-h256-e16-top4-ffn256-0123456789abcdef.model-test.json"), "{}", p.display());
        assert_eq!(read(&p), None);
        let r = result(Verdict::Qualified { max_tokens: 64 }, vec![]);
        write_json(&p, &r).unwrap();
        assert_eq!(read(&p), Some(r));
        assert_eq!(report_path(dir.path(), "llm", "../x"), dir.path().join("replicas/llm/.._x.json"));
    }
}
