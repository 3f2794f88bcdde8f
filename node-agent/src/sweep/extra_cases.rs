//! Batch shapes that stalled in serving (`SweepRun.spec.extraCases`), replayed as model-level
//! threshold cases: the whole model's forward pass at that token and sequence count, compared
//! with per-sequence references, in the model-test worker (`brink-agent __model-test-worker`)
//! under a deadline, so a shape that hangs is reported as hung instead of hanging the sweep.
//! The cases are reported like the self-test's own: counted in its summary, failures listed.

use std::path::{Path, PathBuf};
use std::process::Command;

use brink_api::crd::{FailingCase, SelfTestOutcome};
use brink_api::selftest::{CaseReport, CaseResult};
use brink_engine::BackendKind;
use brink_engine::qualify::cases::{self, Composition, DeadlinePolicy, ModelCase};
use brink_engine::qualify::plan::ReferenceWork;
use brink_engine::qualify::session;
use brink_engine::qualify::worker::{ModelWorkerMsg, WorkerConfig};
use brink_kernels::selftest::deadline::{DeadlineChild, Started};

/// One stalled batch shape to replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtraCase {
    /// Tokens in the stalled forward pass.
    pub tokens: u64,
    /// Sequences in it.
    pub sequences: u32,
    /// Where it was seen (for the case's reasons).
    pub source: String,
}

/// Failing cases a result keeps (the API's limit).
const MAX_FAILING: usize = 16;

/// The model-level case for `c`: one sequence is a prompt of `tokens`; several are what a
/// serving step holds, a prefill chunk of `tokens - (sequences - 1)` beside one decode row per
/// other sequence. `Err`: a shape no step can have (why, naming it).
pub fn model_case(c: &ExtraCase) -> Result<ModelCase, NoSuchStep> {
    let id = format!("model/extra/t{}x{}", c.tokens, c.sequences);
    let seqs = u64::from(c.sequences);
    if c.tokens == 0 || seqs == 0 {
        return Err(NoSuchStep::Empty { id });
    }
    if seqs > c.tokens {
        return Err(NoSuchStep::TooManySequences { id, sequences: c.sequences, tokens: c.tokens });
    }
    let (composition, batch) = if seqs == 1 {
        (Composition::Single, vec![c.tokens])
    } else {
        let mut batch = vec![c.tokens - (seqs - 1)];
        batch.extend(std::iter::repeat_n(1, (seqs - 1) as usize));
        (Composition::MixedDecode, batch)
    };
    Ok(ModelCase { id, composition, tokens: c.tokens, batch, reasons: vec![format!("stalled in serving: {}", c.source)] })
}

/// An extra case whose shape no serving step can have (`id`: the case's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoSuchStep {
    #[error("{id}: a step has at least one token and one sequence")]
    Empty { id: String },
    #[error("{id}: {sequences} sequences cannot share {tokens} tokens (each has at least one row)")]
    TooManySequences { id: String, sequences: u32, tokens: u64 },
}

/// What the replay needs to start its worker.
pub struct Replay<'a> {
    pub model: &'a Path,
    pub backend: BackendKind,
    /// The engine's context (a case whose longest sequence does not fit is skipped).
    pub context: u64,
    pub prefill_chunk: u64,
    /// This executable (its `__model-test-worker`).
    pub exe: PathBuf,
}

/// Runs every case in one worker, each under the model test's deadline for it. A shape that
/// cannot be a step, or does not fit the context, is reported skipped with the reason.
pub fn run(r: &Replay<'_>, extra: &[ExtraCase]) -> Vec<CaseReport> {
    let mut out = Vec::new();
    let mut runnable = Vec::new();
    for c in extra {
        match model_case(c) {
            Ok(case) if case.longest() > r.context => {
                let why = format!("longest sequence {} exceeds the context {}", case.longest(), r.context);
                out.push(session::skipped(&case, &why));
            }
            Ok(case) => runnable.push(case),
            Err(why) => out.push(invalid(c, &why.to_string())),
        }
    }
    if runnable.is_empty() {
        return out;
    }
    let block_size = brink_kernels::ops::attention::DEFAULT_BLOCK_SIZE as u64;
    let largest = runnable.iter().map(|c| c.blocks_needed(block_size) * block_size).max().unwrap_or(0);
    let cfg = WorkerConfig {
        model: r.model.to_path_buf(),
        backend: r.backend.name().into(),
        context: r.context,
        prefill_chunk: r.prefill_chunk,
        pool_blocks: cases::pool_blocks(largest.max(2 * cases::REFERENCE_CHUNK), block_size),
        // Extra cases are free-form shapes: a sequence may be longer than a ring serves, so the
        // windowed layers keep whole sequences, as before the worker ran the rings.
        full_window_kv: true,
    };
    let exe = r.exe.clone();
    let cfg_json = serde_json::to_string(&cfg).unwrap_or_default();
    let mut child = DeadlineChild::<ModelWorkerMsg>::new(
        move || {
            let mut c = Command::new(&exe);
            c.arg("__model-test-worker").arg(&cfg_json);
            c
        },
        |m| matches!(m, ModelWorkerMsg::Ready { .. }),
        "loading the model and calibrating",
    );
    let tps = match child.start() {
        Started::Ready(ModelWorkerMsg::Ready { calibration, .. }) => calibration.tokens_per_s(),
        Started::NotReady(ModelWorkerMsg::Fatal { error }) | Started::Failed(error) => {
            let why = format!("not run: the model-test worker could not start: {error}");
            out.extend(runnable.iter().map(|c| session::skipped(c, &why)));
            return out;
        }
        Started::Ready(other) | Started::NotReady(other) => {
            let why = format!("not run: the model-test worker sent {other:?} first");
            out.extend(runnable.iter().map(|c| session::skipped(c, &why)));
            return out;
        }
    };
    let policy = DeadlinePolicy::default();
    for case in &runnable {
        // Sent bare, a case computes each of its sequences alone as its reference.
        let deadline = policy.deadline(case.step_tokens() + ReferenceWork::alone(case).tokens(case), tps);
        let answer = child.request(case, deadline, |m| matches!(m, ModelWorkerMsg::Result { id, .. } if *id == case.id));
        let report = session::judge(case, &answer, deadline);
        eprintln!("brink sweep: extra case {} ({}): {:?} {}", report.id, case.reasons.join("; "), report.result, report.detail);
        out.push(report);
    }
    child.stop();
    out
}

/// A shape no step can have: reported as failed, so the bad entry is seen, not dropped.
fn invalid(c: &ExtraCase, why: &str) -> CaseReport {
    CaseReport {
        id: format!("model/extra/t{}x{}", c.tokens, c.sequences),
        kernel: "model/extra".into(),
        tokens: c.tokens,
        batch: Vec::new(),
        reasons: vec![format!("stalled in serving: {}", c.source)],
        expect: "pass".into(),
        result: CaseResult::Skipped,
        detail: why.into(),
        max_rel_err: None,
        tolerance: None,
        compared: 0,
        kernel_ms: None,
        wall_ms: 0.0,
    }
}

/// Adds the replayed cases to the self-test's outcome: its counts, and the failing ones with
/// the fewest tokens first (as the self-test lists its own).
pub fn merge(outcome: &mut SelfTestOutcome, reports: &[CaseReport]) {
    let s = &mut outcome.summary;
    for r in reports {
        s.derived += 1;
        match r.result {
            CaseResult::Skipped => s.skipped += 1,
            CaseResult::Passed => {
                s.executed += 1;
                s.passed += 1;
            }
            CaseResult::Hung => {
                s.executed += 1;
                s.hung += 1;
            }
            // Failed; a model-level case has no negative controls (flagged/missed).
            _ => {
                s.executed += 1;
                s.failed += 1;
            }
        }
    }
    let failing = reports.iter().filter(|r| matches!(r.result, CaseResult::Failed | CaseResult::Hung)).map(|r| FailingCase {
        id: r.id.clone(),
        kernel: r.kernel.clone(),
        tokens: r.tokens,
        detail: r.detail.clone(),
    });
    outcome.failing_cases.extend(failing);
    outcome.failing_cases.sort_by(|a, b| (a.tokens, &a.id).cmp(&(b.tokens, &b.id)));
    outcome.failing_cases.truncate(MAX_FAILING);
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::ReportSummary;

    fn extra(tokens: u64, sequences: u32) -> ExtraCase {
        ExtraCase { tokens, sequences, source: "ai/r-0 prefill".into() }
    }

    #[test]
    fn shapes_become_steps() {
        let one = model_case(&extra(37, 1)).unwrap();
        assert_eq!(
            (one.id.as_str(), one.composition, one.batch.clone(), one.tokens),
            ("model/extra/t37x1", Composition::Single, vec![37], 37)
        );
        assert_eq!(one.reasons, ["stalled in serving: ai/r-0 prefill"]);
        let mixed = model_case(&extra(40, 4)).unwrap();
        assert_eq!((mixed.composition, mixed.batch.clone()), (Composition::MixedDecode, vec![37, 1, 1, 1]));
        assert_eq!(mixed.batch.iter().sum::<u64>(), 40, "the step's rows are the stalled count");
        let decode = model_case(&extra(8, 8)).unwrap();
        assert_eq!(decode.batch, vec![1; 8]);
        for (t, s, needle) in [(0, 1, "at least one token"), (5, 0, "at least one token"), (3, 4, "4 sequences cannot share 3 tokens")] {
            let e = model_case(&extra(t, s)).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains(&format!("t{t}x{s}")), "{e}");
        }
    }

    #[test]
    fn cases_that_cannot_run_are_skipped_without_a_worker() {
        let r = Replay {
            model: Path::new("/nonexistent.gguf"),
            backend: BackendKind::Cpu,
            context: 64,
            prefill_chunk: 32,
            exe: PathBuf::from("/nonexistent/brink-agent"),
        };
        let reports = run(&r, &[extra(100, 1), extra(2, 3)]);
        assert_eq!(reports.len(), 2);
        assert!(reports.iter().all(|c| c.result == CaseResult::Skipped), "{reports:?}");
        assert!(reports[0].detail.contains("exceeds the context 64"), "{}", reports[0].detail);
        assert!(reports[1].detail.contains("3 sequences cannot share 2 tokens"), "{}", reports[1].detail);
        // A worker that cannot start: every runnable case is skipped, saying why.
        let reports = run(&r, &[extra(16, 2)]);
        assert_eq!(reports[0].result, CaseResult::Skipped);
        assert!(reports[0].detail.contains("could not start"), "{}", reports[0].detail);
    }

    #[test]
    fn merged_cases_count_and_failures_are_listed_smallest_first() {
        let mut o = SelfTestOutcome {
            summary: ReportSummary { derived: 10, executed: 8, passed: 8, failed: 0, hung: 0, skipped: 2, negative_controls_missed: 0 },
            failing_cases: vec![FailingCase { id: "k/t64".into(), kernel: "k".into(), tokens: 64, detail: "x".into() }],
            negative_controls_ran: false,
        };
        let case = |t: u64, result| CaseReport { result, detail: "d".into(), ..session::skipped(&model_case(&extra(t, 1)).unwrap(), "") };
        merge(
            &mut o,
            &[case(37, CaseResult::Passed), case(90, CaseResult::Hung), case(12, CaseResult::Failed), case(5, CaseResult::Skipped)],
        );
        let s = o.summary;
        assert_eq!((s.derived, s.executed, s.passed, s.failed, s.hung, s.skipped), (14, 11, 9, 1, 1, 3));
        let ids: Vec<&str> = o.failing_cases.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(ids, ["model/extra/t12x1", "k/t64", "model/extra/t90x1"]);
    }
}
