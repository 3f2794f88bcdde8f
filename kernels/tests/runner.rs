//! The self-test runner against scripted workers (no GPU): results come back, a worker that
//! hangs is killed at the case's deadline and reported as hung while the run goes on with a
//! fresh worker, a worker that dies is reported, and "no GPU" is recognised at start.

use std::process::Command;
use std::time::{Duration, Instant};

use brink_api::selftest::CaseResult;
use brink_kernels::check::{Check, Outcome};
use brink_kernels::cuda::{DeviceInfo, LaunchError};
use brink_kernels::limits::DeviceLimits;
use brink_kernels::ops::latent_proj::LatentCase;
use brink_kernels::ops::moe_combine::CombineCase;
use brink_kernels::quant::WeightType;
use brink_kernels::selftest::case::{Case, Expect, OpCase};
use brink_kernels::selftest::report::judge;
use brink_kernels::selftest::runner::{Returned, Runner, Start};
use brink_kernels::selftest::worker::WorkerMsg;

fn ready_line() -> String {
    let info =
        DeviceInfo { name: "scripted".into(), ordinal: 0, driver_cuda_version: 13000, nvrtc_version: (13, 0), free_mem_bytes: 1 << 34 };
    serde_json::to_string(&WorkerMsg::Ready { limits: DeviceLimits::h200(), info, compile_seconds: 0.0 }).unwrap()
}

fn passed(id: &str) -> String {
    let check = Check {
        max_rel_err: 0.0,
        tolerance: 1e-6,
        compared: 1,
        unwritten: 0,
        past_end: 0,
        int_mismatches: 0,
        kernel_ms: 0.1,
        note: String::new(),
    };
    serde_json::to_string(&WorkerMsg::Result {
        id: id.into(),
        outcome: Outcome::Ran(check),
        wall_ms: 0.2,
        gpu_ms: None,
        host_ms: None,
        parts: vec![],
    })
    .unwrap()
}

/// The answer of a case whose GPU half is done and whose host check is in flight.
fn staged(id: &str) -> String {
    serde_json::to_string(&WorkerMsg::Staged { id: id.into(), gpu_ms: 0.1 }).unwrap()
}

fn case(id: &str, deadline_ms: u64, expect: Expect) -> Case {
    Case {
        id: id.into(),
        kernel: "moe_combine".into(),
        tokens: 1,
        batch: vec![1],
        reasons: vec![],
        params: OpCase::MoeCombine(CombineCase { top_k: 8, n: 2048 }),
        expect,
        deadline_ms,
        device_bytes: 0,
    }
}

/// A worker script: prints Ready, then runs `body` for each case line (`$line` holds it).
/// Each start appends a line to `starts` so the test can count workers.
fn scripted(body: &str, starts: &std::path::Path) -> Runner {
    let script = format!("echo start >> '{}'; echo '{}'; while read -r line; do {body}; done", starts.display(), ready_line());
    Runner::new(move || {
        let mut c = Command::new("sh");
        c.arg("-c").arg(&script);
        c
    })
}

fn starts(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map(|s| s.lines().count()).unwrap_or(0)
}

#[test]
fn results_come_back_from_one_worker() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts");
    // Answer each case with a pass carrying its id (the id is the 2nd JSON string field).
    let body = format!(
        "id=$(echo \"$line\" | sed 's/^{{\"id\":\"\\([^\"]*\\)\".*/\\1/'); echo \"$(echo '{}' | sed \"s/ID/$id/\")\"",
        passed("ID")
    );
    let mut runner = scripted(&body, &log);
    assert!(matches!(runner.start(), Start::Ready { .. }));
    for id in ["a", "b", "c"] {
        match runner.run(&case(id, 5_000, Expect::Pass)) {
            Returned::Outcome { outcome: Outcome::Ran(c), .. } => assert!(c.passed()),
            other => panic!("{id}: {other:?}"),
        }
    }
    assert_eq!(starts(&log), 1, "one worker for every case");
}

#[test]
fn a_hang_is_killed_at_its_deadline_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts");
    // Hang on the case whose id contains "hang", answer the others.
    let body = format!(
        "case \"$line\" in *hang*) exec sleep 600;; *) id=$(echo \"$line\" | sed 's/^{{\"id\":\"\\([^\"]*\\)\".*/\\1/'); echo \"$(echo '{}' | sed \"s/ID/$id/\")\";; esac",
        passed("ID")
    );
    let mut runner = scripted(&body, &log);
    assert!(matches!(runner.start(), Start::Ready { .. }));
    let t = Instant::now();
    let hung = case("latent/hang", 400, Expect::Pass);
    let r = runner.run(&hung);
    assert!(matches!(r, Returned::Hung { .. }), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "killed at the deadline, not later");
    let report = judge(&hung, &r);
    assert_eq!(report.result, CaseResult::Hung);
    assert!(report.detail.contains("moe_combine") && report.detail.contains("1 tokens"), "{}", report.detail);
    // A negative control that must hang is flagged by the same event.
    let broken = LatentCase { k: 2560, width: 1792, groups: 8, wtype: WeightType::Q8_0 };
    let neg =
        Case { kernel: "neg_latent_tailskip".into(), params: OpCase::NegLatentTailSkip(broken), ..case("neg/hang", 400, Expect::Hang) };
    assert_eq!(judge(&neg, &Returned::Hung { wall_ms: 400.0 }).result, CaseResult::Flagged);
    // ... and one that finished is a miss: the self-test could not have caught the bug.
    let finished = Returned::Outcome { outcome: Outcome::Error { error: "x".into() }, wall_ms: 1.0, times: Default::default() };
    assert_eq!(judge(&neg, &finished).result, CaseResult::Missed);
    // The next case runs in a fresh worker.
    assert!(matches!(runner.run(&case("after", 5_000, Expect::Pass)), Returned::Outcome { .. }));
    assert_eq!(starts(&log), 2);
}

#[test]
fn a_dead_worker_is_reported_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts");
    let mut runner = scripted("exit 7", &log);
    assert!(matches!(runner.start(), Start::Ready { .. }));
    match runner.run(&case("x", 5_000, Expect::Pass)) {
        Returned::WorkerDied { detail, .. } => assert!(detail.contains('7'), "{detail}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(runner.run(&case("y", 5_000, Expect::Pass)), Returned::WorkerDied { .. }));
    assert_eq!(starts(&log), 2);
}

/// A worker script that stages every case (hanging on ids with "hang"), logs each case and
/// each collection to `log`, and answers a collection with a pass.
fn staging(log: &std::path::Path, starts: &std::path::Path) -> Runner {
    staging_with(log, starts, "")
}

/// [`staging`] with `first` run on each line before it (to answer some cases otherwise).
fn staging_with(log: &std::path::Path, starts: &std::path::Path, first: &str) -> Runner {
    let id_of = |key: &str| format!("$(echo \"$line\" | sed 's/^{{\"{key}\":\"\\([^\"]*\\)\".*/\\1/')");
    let body = format!(
        "{first}{sep}case \"$line\" in *collect*) id={}; echo \"collect $id\" >> '{log}'; echo \"$(echo '{}' | sed \"s/ID/$id/\")\";; \
         *hang*) exec sleep 600;; \
         *) id={}; echo \"case $id\" >> '{log}'; echo \"$(echo '{}' | sed \"s/ID/$id/\")\";; esac",
        id_of("collect"),
        passed("ID"),
        id_of("id"),
        staged("ID"),
        log = log.display(),
        sep = if first.is_empty() { "" } else { "; " },
    );
    scripted(&body, starts)
}

/// The overlap: cases are sent while earlier host checks are in flight (at most `depth`), the
/// results come back in the cases' order, and a negative control that must hang runs with no
/// check in flight, so its kill loses nothing and it is flagged.
#[test]
fn host_checks_overlap_the_next_cases_and_results_keep_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let (log, st) = (dir.path().join("log"), dir.path().join("starts"));
    let mut runner = staging(&log, &st);
    runner.depth = 2;
    assert!(matches!(runner.start(), Start::Ready { .. }));
    let broken = LatentCase { k: 2560, width: 1792, groups: 8, wtype: WeightType::Q8_0 };
    let neg =
        Case { kernel: "neg_latent_tailskip".into(), params: OpCase::NegLatentTailSkip(broken), ..case("neg-hang", 400, Expect::Hang) };
    let mut cases: Vec<Case> = ["a", "b", "c", "d"].iter().map(|id| case(id, 5_000, Expect::Pass)).collect();
    cases.push(neg.clone());
    cases.push(case("e", 5_000, Expect::Pass));
    let mut order = Vec::new();
    let results = runner.run_all(&cases, &mut |i, _| order.push(i));
    assert_eq!(order, (0..cases.len()).collect::<Vec<_>>());
    for (c, r) in cases.iter().zip(&results) {
        let want = if c.id == "neg-hang" { CaseResult::Flagged } else { CaseResult::Passed };
        assert_eq!(judge(c, r).result, want, "{}: {r:?}", c.id);
    }
    let log = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    // Two checks in flight at most: b is sent before a is collected, c only after.
    assert_eq!(lines[..4], ["case a", "case b", "collect a", "case c"], "{log}");
    // Every check was collected before the negative control was sent, and once only.
    let before_neg: Vec<&str> = lines.iter().copied().take_while(|l| *l != "case e").collect();
    for id in ["a", "b", "c", "d"] {
        assert_eq!(before_neg.iter().filter(|l| **l == format!("collect {id}")).count(), 1, "{log}");
    }
    assert_eq!(starts(&st), 2, "the hang's kill, then a fresh worker for e");
}

/// A case that hangs unexpectedly while checks are in flight: it is reported hung, and the
/// cases whose checks the killed worker held run again in a fresh worker.
#[test]
fn checks_lost_with_a_killed_worker_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let (log, st) = (dir.path().join("log"), dir.path().join("starts"));
    let mut runner = staging(&log, &st);
    assert!(matches!(runner.start(), Start::Ready { .. }));
    let cases = vec![case("a", 5_000, Expect::Pass), case("b-hang", 400, Expect::Pass), case("c", 5_000, Expect::Pass)];
    let results = runner.run_all(&cases, &mut |_, _| {});
    let got: Vec<CaseResult> = cases.iter().zip(&results).map(|(c, r)| judge(c, r).result).collect();
    assert_eq!(got, [CaseResult::Passed, CaseResult::Hung, CaseResult::Passed]);
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(log.lines().filter(|l| *l == "case a").count(), 2, "a ran again: {log}");
    assert_eq!(starts(&st), 2);
    assert!(runner.timing.host_ms == 0.0 && runner.timing.gpu_ms > 0.0);
}

/// A sticky CUDA error ends the worker with the checks it held: they run again in a fresh
/// worker, and the next case is not sent to the dead one.
#[test]
fn checks_lost_with_a_sticky_error_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let (log, st) = (dir.path().join("log"), dir.path().join("starts"));
    let err = LaunchError {
        kernel: "k".into(),
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        shape: String::new(),
        phase: "execution".into(),
        error: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        sticky: true,
    };
    let line = WorkerMsg::Result {
        id: "b-sticky".into(),
        outcome: Outcome::LaunchError(err),
        wall_ms: 1.0,
        gpu_ms: None,
        host_ms: None,
        parts: vec![],
    };
    let sticky_line = serde_json::to_string(&line).unwrap();
    // The staging script, with the sticky case answered and the worker exiting after it.
    let body = format!("case \"$line\" in *sticky*) echo '{sticky_line}'; exit 3;; esac");
    let mut runner = staging_with(&log, &st, &body);
    assert!(matches!(runner.start(), Start::Ready { .. }));
    let cases = vec![case("a", 5_000, Expect::Pass), case("b-sticky", 5_000, Expect::Pass), case("c", 5_000, Expect::Pass)];
    let results = runner.run_all(&cases, &mut |_, _| {});
    let got: Vec<CaseResult> = cases.iter().zip(&results).map(|(c, r)| judge(c, r).result).collect();
    assert_eq!(got, [CaseResult::Passed, CaseResult::Failed, CaseResult::Passed], "{results:?}");
    assert_eq!(starts(&st), 2);
}

#[test]
fn no_gpu_is_recognised_at_start() {
    let line = serde_json::to_string(&WorkerMsg::NoGpu { reason: "no CUDA driver".into() }).unwrap();
    let mut runner = Runner::new(move || {
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!("echo '{line}'"));
        c
    });
    assert!(matches!(runner.start(), Start::NoGpu { reason } if reason.contains("driver")));
}

#[test]
fn a_worker_that_never_gets_ready_times_out() {
    let mut runner = Runner::new(|| {
        let mut c = Command::new("sh");
        // exec: the kill at the timeout ends the sleep itself (dash forks a lone command, and
        // an orphaned sleep would hold the test's output open for ten minutes).
        c.arg("-c").arg("exec sleep 600");
        c
    });
    runner.startup_timeout = Duration::from_millis(300);
    assert!(matches!(runner.start(), Start::Failed { error } if error.contains("not ready")));
}
