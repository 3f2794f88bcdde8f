//! `brink-agent selftest` as a user runs it. On a machine without a GPU (CI) it must say so,
//! check every derived case's plans on the CPU, and succeed; bad flags are clear errors.

use std::process::Command;

use brink_api::selftest::{CaseResult, SelfTestReport, Verdict};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_brink-agent"))
}

#[test]
fn selftest_json_report_is_complete() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.json");
    let out = agent().args(["selftest", "--json", "--out"]).arg(&file).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: SelfTestReport = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}\nstdout: {stdout}\nstderr: {stderr}"));
    let written: SelfTestReport = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(report, written);
    assert_eq!(report.derived as usize, report.cases.len());
    assert!(report.derived > 100, "only {} cases derived", report.derived);
    // The seed counts are derived for the default class (top_k 8).
    let counts: std::collections::BTreeSet<u64> = report.cases.iter().map(|c| c.tokens).collect();
    for t in [8191, 8192, 1, 63, 64, 65] {
        assert!(counts.contains(&t), "{t} not derived");
    }
    assert!(stderr.contains("verdict:"), "the table goes to stderr with --json: {stderr}");
    if !report.device.gpu {
        assert!(out.status.success(), "no GPU and all plans fit: exit 0\n{stderr}");
        assert!(report.device.no_gpu_reason.as_deref().is_some_and(|r| !r.is_empty()));
        assert!(matches!(report.verdict, Verdict::NotQualified { .. }));
        assert_eq!(report.executed, 0);
        // Every case is planned against H200 and GB10, or skipped as too big for a GB10.
        assert!(report.cases.iter().all(|c| matches!(c.result, CaseResult::Planned | CaseResult::Skipped)), "a plan failed");
        assert!(report.cases.iter().filter(|c| c.result == CaseResult::Planned).count() > 100);
        assert!(stderr.contains("NO GPU"), "{stderr}");
        let neg: Vec<_> = report.cases.iter().filter(|c| c.id.starts_with("neg_gemv_gridz/q4_0/k8/t8192")).collect();
        assert_eq!(neg.len(), 1);
        assert!(neg[0].detail.contains("grid.z = 65536 > 65535"), "{}", neg[0].detail);
    }
}

#[test]
fn bad_flags_are_clear_errors() {
    for (args, needle) in [
        (vec!["selftest", "--max-batch-tokens", "0"], "--max-batch-tokens"),
        (vec!["selftest", "--memory-budget-gib", "-3"], "--memory-budget-gib"),
        (vec!["selftest", "--prefill-chunk", "x"], "--prefill-chunk"),
        (vec!["kernels", "--arch", "compute_90"], "--arch"),
    ] {
        let out = agent().args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
