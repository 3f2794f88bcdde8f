//! One whole model-level threshold test (the parent side): read the model's shape class, start
//! the worker (it loads the model and calibrates), derive the cases for the device it found,
//! run each with a deadline derived from the calibration, and build the report.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use brink_api::selftest::{CaseReport, CaseResult, Phase, Verdict};
use brink_api::{MODEL_TEST_SCHEMA, ModelTestReport, ServingParams};
use brink_kernels::limits::DeviceLimits;
use brink_kernels::selftest::deadline::{Answer, DeadlineChild, Started};

use super::cases::{self, DeadlinePolicy, ModelCase, TOLERANCE};
use super::exec::{CaseRequest, ModelOutcome};
use super::plan::{self, Planner};
use super::shape::kernel_shape;
use super::worker::{ModelWorkerMsg, WorkerConfig};
use crate::engine::BackendKind;
use crate::gguf::GgufFile;
use crate::model::ModelError;

/// Counts above this are derived and listed, not run, on the CPU backend unless asked for. The
/// CPU has no launch geometry to qualify (its kernels index with `usize`), so there the test
/// checks the batching and the graph: 16 covers every decode batch size (the GEMV range), four
/// sequences from 4 and a prefill beside 8 decode rows from 9. Each case costs about twice its
/// count in tokens plus 88 for the decode prompts: the demo model runs its 37 cases in 7-14 s on
/// a shared 2-core machine (cap 32: 85 cases, ~45 s), so `up` on a CPU and CI stay fast. On CUDA
/// every reachable count runs (up to max batch tokens).
pub const CPU_DEFAULT_MAX_TOKENS: u64 = 16;

#[derive(Clone, Debug)]
pub struct Options {
    pub model: PathBuf,
    pub backend: BackendKind,
    pub serving: ServingParams,
    /// Skip counts above this; `None` runs every count up to max batch tokens.
    pub max_tokens: Option<u64>,
    pub deadline: DeadlinePolicy,
    /// Time the worker may take to load the model and calibrate.
    pub startup_timeout: Duration,
    pub agent_version: String,
}

impl Options {
    /// Defaults for `backend`: the CPU's cap ([`CPU_DEFAULT_MAX_TOKENS`]), none on CUDA.
    pub fn new(model: PathBuf, backend: BackendKind, serving: ServingParams, agent_version: &str) -> Self {
        Options {
            model,
            backend,
            serving,
            max_tokens: (backend == BackendKind::Cpu).then_some(CPU_DEFAULT_MAX_TOKENS),
            deadline: DeadlinePolicy::default(),
            startup_timeout: Duration::from_secs(600),
            agent_version: agent_version.into(),
        }
    }
}

/// Progress for a caller's display.
pub enum Progress<'a> {
    /// The worker loaded the model and calibrated.
    Ready {
        load_seconds: f64,
        tokens_per_s: f64,
    },
    Derived {
        cases: usize,
        skipped: usize,
        /// Tokens the cases' steps will run (rows under test and the decode prompts before them).
        step_tokens: u64,
        /// Tokens their references will run, with nothing lost to a restart.
        reference_tokens: u64,
    },
    Case {
        index: usize,
        total: usize,
        report: &'a CaseReport,
    },
}

/// Runs the test; `make_command` builds the worker's command for its configuration (e.g.
/// `brink-agent __model-test-worker <json>`).
pub fn run(
    opts: &Options,
    make_command: impl Fn(&WorkerConfig) -> Command + Send + 'static,
    progress: &mut dyn FnMut(Progress),
) -> ModelTestReport {
    let t_start = Instant::now();
    let mut report = ModelTestReport {
        schema: MODEL_TEST_SCHEMA,
        agent_version: opts.agent_version.clone(),
        model: opts.model.display().to_string(),
        shape_class: String::new(),
        backend: opts.backend.name().into(),
        serving: opts.serving,
        max_tokens: opts.max_tokens,
        limits: String::new(),
        calibration_tokens_per_s: None,
        tolerance: TOLERANCE,
        counts_derived: 0,
        counts_unreachable: 0,
        derived: 0,
        executed: 0,
        passed: 0,
        failed: 0,
        hung: 0,
        skipped: 0,
        verdict: Verdict::NotQualified { reason: String::new() },
        phases: Vec::new(),
        cases: Vec::new(),
        step_tokens: 0,
        setup_tokens: 0,
        reference_tokens: 0,
    };
    let not_run = |mut report: ModelTestReport, reason: String| {
        report.phases.push(Phase { name: "total".into(), seconds: t_start.elapsed().as_secs_f64() });
        report.summarise();
        report.verdict = Verdict::NotQualified { reason };
        report
    };
    // The shape class from the header alone: a bad file is named before a worker starts.
    let config = match GgufFile::open(&opts.model).map_err(ModelError::from).and_then(|f| crate::arch::config(&f)) {
        Ok(c) => c,
        Err(e) => return not_run(report, format!("{}: {e}", opts.model.display())),
    };
    let shape = kernel_shape(&config);
    report.shape_class = shape.key();
    let context = if opts.serving.context == 0 { config.context as u64 } else { opts.serving.context.min(config.context as u64) };
    let block_size = brink_kernels::ops::attention::DEFAULT_BLOCK_SIZE as u64;
    let largest = cases::largest_case_tokens(opts.serving.max_batch_tokens, opts.max_tokens, context);
    let cfg = WorkerConfig {
        model: opts.model.clone(),
        backend: opts.backend.name().into(),
        context,
        prefill_chunk: opts.serving.prefill_chunk,
        pool_blocks: cases::pool_blocks(largest.max(2 * cases::REFERENCE_CHUNK), block_size),
        // The KV layout the node serves with: the worker loads the same, so the test runs the
        // sliding-window layers' rings that serve (and the fingerprint keys the layout).
        full_window_kv: opts.serving.full_window_kv,
    };
    let worker_cfg = cfg.clone();
    let mut child = DeadlineChild::new(
        move || make_command(&worker_cfg),
        |m| matches!(m, ModelWorkerMsg::Ready { .. }),
        "loading the model and calibrating",
    );
    child.startup_timeout = opts.startup_timeout;

    let t = Instant::now();
    let started = child.start();
    report.phases.push(Phase { name: "start worker (load model, calibrate)".into(), seconds: t.elapsed().as_secs_f64() });
    let (ctx, limits, load_seconds, calibration, fault, ring_max_chunk, rings) = match started {
        Started::Ready(ModelWorkerMsg::Ready { context, limits, load_seconds, calibration, fault, ring_max_chunk, rings, .. }) => {
            (context, limits, load_seconds, calibration, fault, ring_max_chunk, rings)
        }
        Started::NotReady(ModelWorkerMsg::Fatal { error }) | Started::Failed(error) => {
            return not_run(report, format!("the model-test worker could not start: {error}"));
        }
        Started::Ready(other) | Started::NotReady(other) => return not_run(report, format!("the model-test worker sent {other:?} first")),
    };
    report.phases.push(Phase { name: "  of which load model".into(), seconds: load_seconds });
    report.serving.context = ctx;
    let tps = calibration.tokens_per_s();
    report.calibration_tokens_per_s = Some(tps);
    progress(Progress::Ready { load_seconds, tokens_per_s: tps });

    // The device's own limits on CUDA; the CPU has no launch geometry, so the counts are those
    // of the node brink ships to (GB10's recorded limits).
    let limits = limits.unwrap_or_else(DeviceLimits::gb10);
    report.limits = limits.name.clone();
    let t = Instant::now();
    let mut d = cases::derive(&shape, &opts.serving, &limits, opts.max_tokens, ctx);
    if let Some(max_chunk) = ring_max_chunk {
        cases::skip_past_ring(&mut d, max_chunk);
    }
    let rings_needed = Planner::rings_needed(&d.cases);
    if rings > 0 && rings_needed > rings {
        let why = format!("the cases need {rings_needed} KV rings at once, the model-test worker holds {rings}");
        return not_run(report, why);
    }
    report.counts_derived = d.counts.len() as u64;
    report.counts_unreachable = d.unreachable;
    report.phases.push(Phase { name: "derive cases".into(), seconds: t.elapsed().as_secs_f64() });
    let max_kept = plan::max_kept_rows(config.vocab as u64);
    let planned = Planner::totals(&d.cases, max_kept);
    progress(Progress::Derived {
        cases: d.cases.len(),
        skipped: d.skipped.len(),
        step_tokens: planned.step + planned.setup,
        reference_tokens: planned.reference,
    });

    let t = Instant::now();
    let total = d.cases.len();
    let mut stopped: Option<String> = None;
    let mut planner = Planner::new(&d.cases, max_kept);
    let (mut step_ms, mut reference_ms) = (0.0, 0.0);
    for (index, case) in d.cases.iter().enumerate() {
        if let Some(why) = &stopped {
            report.cases.push(skipped(case, why));
            continue;
        }
        let reference = planner.work(index);
        let deadline = opts.deadline.deadline(case.step_tokens() + reference.tokens(case), tps);
        let req = CaseRequest { case: case.clone(), reference };
        let answer = child.request(&req, deadline, |m| matches!(m, ModelWorkerMsg::Result { id, .. } if *id == case.id));
        match &answer {
            Answer::Reply {
                msg: ModelWorkerMsg::Result { outcome: ModelOutcome::Compared { step_ms: s, reference_tokens, reference_ms: r, .. }, .. },
                ..
            } => {
                report.step_tokens += case.tokens;
                report.setup_tokens += case.step_tokens() - case.tokens;
                report.reference_tokens += reference_tokens;
                step_ms += s;
                reference_ms += r;
            }
            // Killed, dead or failed: the worker that answers next holds no reference stream.
            _ => planner.lost(),
        }
        if worker_exits_after(&answer, &cfg.backend) {
            child.stop();
        }
        if let Answer::RestartFailed { detail } = &answer {
            // A device that does not come back after a kill would fail every restart, each after
            // the startup timeout: the cases left (none smaller than the one that killed it) are
            // listed as not run, and the hang or failure before them decides the verdict.
            let why = format!("not run: {detail}");
            report.cases.push(skipped(case, &why));
            stopped = Some(why);
            continue;
        }
        let mut r = judge(case, &answer, deadline);
        if let Some(f) = &fault {
            r.detail = format!("{} (TEST-ONLY fault armed: {f})", r.detail);
        }
        progress(Progress::Case { index, total, report: &r });
        report.cases.push(r);
    }
    child.stop();
    report.phases.push(Phase { name: "run cases".into(), seconds: t.elapsed().as_secs_f64() });
    report.phases.push(Phase { name: "  of which steps under test".into(), seconds: step_ms / 1e3 });
    report.phases.push(Phase { name: "  of which references".into(), seconds: reference_ms / 1e3 });
    report.cases.extend(d.skipped.iter().map(|(c, why)| skipped(c, why)));
    report.phases.push(Phase { name: "total".into(), seconds: t_start.elapsed().as_secs_f64() });
    report.summarise();
    report
}

/// Whether the worker that gave `answer` is exiting: on the GPU it exits after a failed case
/// (`worker::EXIT_AFTER_GPU_ERROR`: the device may hold a sticky error). The parent then stops
/// it, so the next case goes to a fresh worker, not down the exiting one's pipe (where it would
/// read as a dead worker, a failure of its own).
fn worker_exits_after(answer: &Answer<ModelWorkerMsg>, backend: &str) -> bool {
    let failed = matches!(answer, Answer::Reply { msg: ModelWorkerMsg::Result { outcome: ModelOutcome::Error { .. }, .. }, .. });
    failed && backend == BackendKind::Cuda.name()
}

fn blank(case: &ModelCase) -> CaseReport {
    CaseReport {
        id: case.id.clone(),
        kernel: case.composition.kernel().into(),
        tokens: case.tokens,
        batch: case.batch.clone(),
        reasons: case.reasons.clone(),
        expect: "pass".into(),
        result: CaseResult::Failed,
        detail: String::new(),
        max_rel_err: None,
        tolerance: None,
        compared: 0,
        kernel_ms: None,
        wall_ms: 0.0,
    }
}

/// A derived case that did not run, and why.
pub fn skipped(case: &ModelCase, why: &str) -> CaseReport {
    CaseReport { result: CaseResult::Skipped, detail: why.into(), ..blank(case) }
}

/// Turns what came back for a case into its report line. `kernel_ms` holds the batched step's
/// time, `max_rel_err` the normalised max abs difference from the references.
pub fn judge(case: &ModelCase, answer: &Answer<ModelWorkerMsg>, deadline: Duration) -> CaseReport {
    let mut r = blank(case);
    match answer {
        Answer::Hung { wall_ms } => {
            r.wall_ms = *wall_ms;
            r.result = CaseResult::Hung;
            r.detail = format!("hung: {} at {} tokens killed after {} ms", r.kernel, case.tokens, deadline.as_millis());
        }
        Answer::Died { detail, wall_ms } => {
            r.wall_ms = *wall_ms;
            r.detail = format!("worker died: {detail}");
        }
        Answer::Reply { msg: ModelWorkerMsg::Result { outcome, wall_ms, .. }, .. } => {
            r.wall_ms = *wall_ms;
            match outcome {
                ModelOutcome::Compared { max_err, worst_seq, non_finite_rows, argmax_mismatches, compared, step_ms, .. } => {
                    r.max_rel_err = Some(*max_err);
                    r.tolerance = Some(TOLERANCE);
                    r.compared = *compared;
                    r.kernel_ms = Some(*step_ms);
                    let ok = *non_finite_rows == 0 && max_err.is_finite() && *max_err <= TOLERANCE;
                    r.result = if ok { CaseResult::Passed } else { CaseResult::Failed };
                    r.detail = if *non_finite_rows > 0 {
                        format!("{non_finite_rows} of {} sequences' logits hold NaN or infinity", case.batch.len())
                    } else {
                        format!(
                            "max err {max_err:.2e} {} {TOLERANCE:.0e} (sequence {worst_seq}), {argmax_mismatches} argmax changes over {} sequences",
                            if ok { "<=" } else { ">" },
                            case.batch.len()
                        )
                    };
                }
                ModelOutcome::Error { error } => r.detail = format!("engine error: {error}"),
            }
        }
        Answer::Reply { msg, wall_ms } => {
            r.wall_ms = *wall_ms;
            r.detail = format!("unexpected worker message: {msg:?}");
        }
        Answer::RestartFailed { detail } => r.detail = format!("not run: {detail}"),
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qualify::cases::Composition;

    #[test]
    fn a_failed_case_on_the_gpu_ends_its_worker_and_nothing_else_does() {
        let result = |outcome| Answer::Reply { msg: ModelWorkerMsg::Result { id: "c".into(), outcome, wall_ms: 1.0 }, wall_ms: 1.0 };
        let failed = || result(ModelOutcome::Error { error: "the case needs 1 more KV blocks, the pool has 0 free".into() });
        let compared = result(ModelOutcome::Compared {
            max_err: 0.0,
            worst_seq: 0,
            non_finite_rows: 0,
            argmax_mismatches: 0,
            compared: 1,
            step_ms: 1.0,
            reference_tokens: 0,
            reference_ms: 0.0,
        });
        assert!(worker_exits_after(&failed(), BackendKind::Cuda.name()));
        assert!(!worker_exits_after(&failed(), BackendKind::Cpu.name()));
        assert!(!worker_exits_after(&compared, BackendKind::Cuda.name()));
        assert!(!worker_exits_after(&Answer::Hung { wall_ms: 1.0 }, BackendKind::Cuda.name()), "a hung worker is killed already");
    }

    fn case(t: u64) -> ModelCase {
        ModelCase {
            id: format!("model/single/t{t}"),
            composition: Composition::Single,
            tokens: t,
            batch: vec![t],
            reasons: vec!["r".into()],
        }
    }

    fn compared(max_err: f64, non_finite_rows: u64) -> Answer<ModelWorkerMsg> {
        let outcome = ModelOutcome::Compared {
            max_err,
            worst_seq: 0,
            non_finite_rows,
            argmax_mismatches: 0,
            compared: 10,
            step_ms: 1.0,
            reference_tokens: 5,
            reference_ms: 1.0,
        };
        Answer::Reply { msg: ModelWorkerMsg::Result { id: "x".into(), outcome, wall_ms: 2.0 }, wall_ms: 3.0 }
    }

    #[test]
    fn results_are_judged_against_the_tolerance() {
        let d = Duration::from_secs(1);
        assert_eq!(judge(&case(5), &compared(1e-6, 0), d).result, CaseResult::Passed);
        let r = judge(&case(5), &compared(0.9, 0), d);
        assert_eq!(r.result, CaseResult::Failed);
        assert!(r.detail.contains('>'), "{}", r.detail);
        assert_eq!(judge(&case(5), &compared(0.0, 1), d).result, CaseResult::Failed);
        assert_eq!(judge(&case(5), &compared(f64::NAN, 0), d).result, CaseResult::Failed);
        let r = judge(&case(7), &Answer::Hung { wall_ms: 1000.0 }, d);
        assert_eq!(r.result, CaseResult::Hung);
        assert!(r.detail.contains("model/single at 7 tokens killed after 1000 ms"), "{}", r.detail);
        let err = Answer::Reply {
            msg: ModelWorkerMsg::Result { id: "x".into(), outcome: ModelOutcome::Error { error: "boom".into() }, wall_ms: 1.0 },
            wall_ms: 1.0,
        };
        assert_eq!(judge(&case(7), &err, d).result, CaseResult::Failed);
        assert_eq!(skipped(&case(9), "cap").result, CaseResult::Skipped);
    }

    /// A scripted worker: ready at its first start, then it hangs on every case; every later
    /// start exits at once (a device that does not come back after the kill).
    #[test]
    fn a_hang_then_a_failed_restart_stops_the_run_with_the_rest_listed_as_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny.gguf");
        crate::synth::generate(&crate::synth::SynthSpec::from_preset(crate::synth::Preset::Tiny), &model, |_, _| {}).unwrap();
        let calibration = super::super::worker::Calibration { tokens: 256, seconds: 0.1 };
        let ready = ModelWorkerMsg::Ready {
            backend: "cpu".into(),
            shape_class: String::new(),
            context: 4096,
            limits: None,
            load_seconds: 0.0,
            calibration,
            fault: None,
            ring_max_chunk: None,
            rings: 0,
        };
        let starts = dir.path().join("starts");
        let script = format!(
            "if [ -e '{0}' ]; then exit 9; fi; touch '{0}'; echo '{1}'; while read -r line; do exec sleep 600; done",
            starts.display(),
            serde_json::to_string(&ready).unwrap()
        );
        let serving = ServingParams { max_batch_tokens: 16_384, prefill_chunk: 4096, context: 0, full_window_kv: false };
        let mut opts = Options::new(model, BackendKind::Cpu, serving, "test");
        opts.max_tokens = Some(4);
        opts.deadline = DeadlinePolicy { factor: 0.0, floor: Duration::from_millis(300) };
        opts.startup_timeout = Duration::from_secs(5);
        let t0 = Instant::now();
        let r = run(
            &opts,
            move |_| {
                let mut c = Command::new("sh");
                c.arg("-c").arg(&script);
                c
            },
            &mut |_| {},
        );
        assert!(t0.elapsed() < Duration::from_secs(5), "one deadline and one failed restart: {:?}", t0.elapsed());
        assert!(r.shape_class.starts_with("qwen3moe-h256-e16-top4-ffn256-"), "the key is the label and a hash: {}", r.shape_class);
        let file = crate::gguf::GgufFile::open(&opts.model).unwrap();
        assert_eq!(r.shape_class, crate::arch::config(&file).unwrap().shape_class());
        assert_eq!(r.serving.context, 4096, "the engine's context is reported");
        assert_eq!(r.hung, 1, "{:?}", r.cases);
        assert_eq!(r.cases[0].id, "model/single/t1");
        // Counts 1..=4: 1, 2, 3 and 4 single, 4 as four sequences; the 4 after the hang not run.
        let not_run = r.cases.iter().filter(|c| c.detail.starts_with("not run: could not restart")).count();
        assert_eq!(not_run, 4, "{:?}", r.cases);
        assert_eq!(r.executed, 1);
        assert!(matches!(&r.verdict, Verdict::Disqualified { reason } if reason.contains("at 1 tokens")), "{:?}", r.verdict);
    }

    /// A worker whose engine holds fewer KV rings than the cases need at once: the run is
    /// refused with both numbers before any case, not failed case by case.
    #[test]
    fn too_few_rings_for_the_plan_refuse_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny.gguf");
        crate::synth::generate(&crate::synth::SynthSpec::from_preset(crate::synth::Preset::Tiny), &model, |_, _| {}).unwrap();
        let ready = ModelWorkerMsg::Ready {
            backend: "cpu".into(),
            shape_class: String::new(),
            context: 4096,
            limits: None,
            load_seconds: 0.0,
            calibration: super::super::worker::Calibration { tokens: 256, seconds: 0.1 },
            fault: None,
            ring_max_chunk: Some(4096),
            rings: 2,
        };
        let script = format!("echo '{}'; while read -r line; do exec sleep 600; done", serde_json::to_string(&ready).unwrap());
        let serving = ServingParams { max_batch_tokens: 16_384, prefill_chunk: 4096, context: 0, full_window_kv: false };
        let mut opts = Options::new(model, BackendKind::Cpu, serving, "test");
        opts.max_tokens = Some(4);
        let r = run(
            &opts,
            move |_| {
                let mut c = Command::new("sh");
                c.arg("-c").arg(&script);
                c
            },
            &mut |_| {},
        );
        assert!(r.cases.is_empty(), "{:?}", r.cases);
        // The four-sequence case at 4 tokens beside the stream it extends.
        let want = "the cases need 5 KV rings at once, the model-test worker holds 2";
        assert!(matches!(&r.verdict, Verdict::NotQualified { reason } if reason == want), "{:?}", r.verdict);
    }

    #[test]
    fn the_verdict_follows_the_kernel_rule() {
        let d = Duration::from_secs(1);
        let mut report = ModelTestReport {
            schema: MODEL_TEST_SCHEMA,
            agent_version: String::new(),
            model: String::new(),
            shape_class: String::new(),
            backend: "cpu".into(),
            serving: ServingParams { max_batch_tokens: 64, prefill_chunk: 32, context: 128, full_window_kv: false },
            max_tokens: None,
            limits: String::new(),
            calibration_tokens_per_s: None,
            tolerance: TOLERANCE,
            counts_derived: 0,
            counts_unreachable: 0,
            derived: 0,
            executed: 0,
            passed: 0,
            failed: 0,
            hung: 0,
            skipped: 0,
            verdict: Verdict::NotQualified { reason: String::new() },
            phases: vec![],
            step_tokens: 0,
            setup_tokens: 0,
            reference_tokens: 0,
            cases: vec![
                judge(&case(1), &compared(0.0, 0), d),
                judge(&case(9), &compared(0.0, 0), d),
                judge(&case(10), &Answer::Hung { wall_ms: 1.0 }, d),
                skipped(&case(99), "cap"),
            ],
        };
        report.summarise();
        assert_eq!(report.verdict, Verdict::Clamped { max_tokens: 9, first_failure: 10 });
        assert_eq!((report.derived, report.executed, report.passed, report.hung, report.skipped), (4, 3, 2, 1, 1));
        report.cases.push(judge(&case(20), &compared(0.0, 0), d));
        report.summarise();
        assert!(matches!(report.verdict, Verdict::Disqualified { .. }));
    }
}
