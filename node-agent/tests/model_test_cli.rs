//! `brink-agent selftest --model` on the CPU with the tiny synthetic model: the kernel cases of
//! its shape class and the model-level threshold test, parsed from `--json`. With the test-only
//! fault reaching the model test's worker, steps from some row count hang (killed at their
//! deadline, the worker restarted: the verdict clamps under them) or small steps fail (a
//! failure below a passing count disqualifies).

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use brink_api::selftest::{CaseResult, Verdict};
use brink_api::{ModelTestReport, SelfTestWithModel};

/// Counts 1..=12 run: every composition (one prompt; four sequences from 4; a prefill beside
/// 8 decode rows from 9), 25 cases, in a few seconds on the CPU.
const CAP: &str = "12";

fn selftest(model: &std::path::Path, fault: Option<&str>, extra: &[&str]) -> (SelfTestWithModel, Output) {
    let mut cmd = common::agent();
    cmd.args(["selftest", "--json", "--no-negative-controls", "--max-tokens", "64", "--backend", "cpu", "--model-max-tokens", CAP])
        .arg("--model")
        .arg(model)
        .args(extra);
    match fault {
        Some(f) => cmd.env("BRINK_INJECT_FAULT", f),
        None => cmd.env_remove("BRINK_INJECT_FAULT"),
    };
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}\nstdout: {stdout}\nstderr: {stderr}"));
    (report, out)
}

fn executed(m: &ModelTestReport) -> Vec<&brink_api::CaseReport> {
    m.cases.iter().filter(|c| c.result != CaseResult::Skipped).collect()
}

#[test]
fn model_cases_pass_on_the_cpu_and_the_report_is_complete() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let t0 = Instant::now();
    let (r, out) = selftest(&model, None, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The kernel part qualifies the tiny model's own class.
    // The kernel part qualifies the tiny model's own key: its label and the hash of its shape.
    assert!(r.kernels.shape_class.starts_with("qwen3moe-h256-e16-top4-ffn256-"), "{}", r.kernels.shape_class);
    let m = &r.model;
    assert_eq!(m.shape_class, r.kernels.shape_class);
    assert_eq!(m.backend, "cpu");
    assert_eq!(m.max_tokens, Some(12));
    assert!(m.calibration_tokens_per_s.is_some_and(|t| t > 0.0));
    // Counts 1..=12 in every composition they allow: 12 + 9 + 4 cases.
    assert_eq!(m.executed, 25, "{stderr}");
    assert_eq!((m.passed, m.failed, m.hung), (25, 0, 0), "{stderr}");
    assert_eq!(m.verdict, Verdict::Qualified { max_tokens: 12 });
    for kind in ["model/single", "model/4-seqs", "model/mixed-decode"] {
        assert!(m.cases.iter().any(|c| c.kernel == kind && c.result == CaseResult::Passed), "{kind}");
    }
    for c in executed(m) {
        assert_eq!(c.batch.iter().sum::<u64>(), c.tokens, "{}", c.id);
        assert!(c.max_rel_err.is_some_and(|e| e <= m.tolerance), "{}: {}", c.id, c.detail);
        assert!(!c.reasons.is_empty(), "{}", c.id);
    }
    // Every count up to max batch tokens is derived; those above the cap are skipped, saying so.
    assert_eq!(m.derived, m.executed + m.skipped);
    assert!(m.counts_derived > 100, "{}", m.counts_derived);
    let skipped: Vec<_> = m.cases.iter().filter(|c| c.result == CaseResult::Skipped).collect();
    assert!(skipped.iter().all(|c| c.tokens > 12 && c.detail.contains("cap of 12")), "{:?}", skipped.first());
    assert!(skipped.iter().any(|c| c.tokens == 16_384), "max batch tokens is derived");
    assert!(stderr.contains("model-level threshold test") && stderr.contains("QUALIFIED"), "{stderr}");
    eprintln!("selftest --model tiny (25 model cases): {:.1} s; phases {:?}", t0.elapsed().as_secs_f64(), m.phases);
}

#[test]
fn a_hang_from_some_row_count_is_killed_and_clamps_the_envelope() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let t0 = Instant::now();
    // Steps of 11 rows or more hang in layer 1 (the calibration runs before the fault is armed).
    let (r, out) = selftest(&model, Some("hang:layer=1,min-rows=11"), &["--model-deadline-floor-ms", "1500"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let m = &r.model;
    let hung: Vec<_> = m.cases.iter().filter(|c| c.result == CaseResult::Hung).collect();
    // Counts 11 and 12, each in its three compositions: each killed at its deadline, and each
    // later case answered by a fresh worker (a failed restart would read "worker died").
    assert_eq!(hung.len(), 6, "{stderr}");
    assert!(hung.iter().all(|c| c.tokens >= 11 && c.detail.contains("killed after")), "{hung:?}");
    for c in &hung {
        // "... killed after D ms": the kill comes at the deadline, not later.
        let d: f64 = c.detail.split("killed after ").nth(1).and_then(|s| s.split(' ').next()).and_then(|s| s.parse().ok()).unwrap();
        assert!(c.wall_ms >= d - 50.0 && c.wall_ms < d + 2_000.0, "{}: {} ms, deadline {d} ms", c.id, c.wall_ms);
    }
    assert_eq!(m.passed, 19, "{stderr}");
    assert_eq!(m.verdict, Verdict::Clamped { max_tokens: 10, first_failure: 11 }, "{stderr}");
    assert!(out.status.success(), "a clamped envelope still serves: {stderr}");
    assert!(t0.elapsed() < Duration::from_secs(90), "took {:?}", t0.elapsed());
}

#[test]
fn a_failure_below_a_passing_count_disqualifies() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    // Steps of at most 2 rows fail in layer 0, as a tail bug would; larger ones pass.
    let (r, out) = selftest(&model, Some("fail:layer=0,max-rows=2"), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let m = &r.model;
    let failed: Vec<_> = m.cases.iter().filter(|c| c.result == CaseResult::Failed).collect();
    assert!(failed.iter().any(|c| c.tokens == 1 && c.detail.contains("engine error")), "{failed:?}");
    assert!(m.passed > 0, "{stderr}");
    assert!(matches!(&m.verdict, Verdict::Disqualified { reason } if reason.contains("chunking cannot avoid")), "{:?}", m.verdict);
    assert!(!out.status.success(), "a disqualified class fails the command");
    // Every step failing is disqualified too (a failure at one token).
    let (r, _) = selftest(&model, Some("fail:layer=0,min-rows=1"), &[]);
    assert_eq!(r.model.passed, 0);
    assert!(matches!(&r.model.verdict, Verdict::Disqualified { .. }), "{:?}", r.model.verdict);
}

#[test]
fn bad_model_arguments_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file").unwrap();
    for (args, needle) in [
        (vec!["selftest".to_string(), "--model".into(), missing.display().to_string()], "missing.gguf"),
        (vec!["selftest".to_string(), "--model".into(), junk.display().to_string()], "junk.gguf"),
        (vec!["selftest".to_string(), "--model-max-tokens".into(), "5".into()], "--model"),
    ] {
        let out = common::agent().args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
