//! `brink-agent sweep` on the CPU backend with the demo model: a real self-test and grid, the
//! `SweepResult` written and judged — passing with no baseline, regressed against a baseline
//! that was much faster — and `sweep-report` reading the results back as a table, CSV, JSON
//! and a trend. Bad flags and files exit 2 naming them.

use std::path::Path;
use std::process::{Command, Output};

use brink_api::crd::{ResultState, SweepResult, SweepVerdict};

fn agent(args: &[&str], state: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_brink-agent")).args(args).arg("--state-dir").arg(state).output().expect("run brink-agent")
}

fn report(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_brink-agent")).arg("sweep-report").args(args).output().expect("run sweep-report")
}

fn read(path: &Path) -> SweepResult {
    serde_json::from_str(&std::fs::read_to_string(path).expect("result file")).expect("a SweepResult")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn a_cpu_sweep_is_written_judged_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let first = dir.path().join("r1.json");
    let common = ["sweep", "--backend", "cpu", "--node", "n1", "--prompt-tokens", "64", "--concurrency", "1,2", "--generated-tokens", "8"];
    let mut args = common.to_vec();
    args.extend(["--requests-per-point", "2", "--run", "r1", "--out", first.to_str().unwrap()]);
    let o = agent(&args, &state);
    assert!(o.status.success(), "{}", text(&o));
    let r1 = read(&first);
    assert_eq!((r1.spec.run.as_str(), r1.spec.node.as_str()), ("r1", "n1"));
    assert_eq!(r1.metadata.name.as_deref(), Some("r1-n1"));
    let s = r1.status.clone().expect("status");
    assert_eq!(s.state, ResultState::Done, "{:?}", s.error);
    assert!(s.started_at.is_some() && s.finished_at.is_some() && s.fingerprint.is_some());
    let st = s.self_test.expect("the self-test ran");
    assert!(st.summary.derived > 0, "{st:?}");
    assert!(!st.negative_controls_ran, "no GPU: no negative control can run");
    assert_eq!(s.points.len(), 2);
    for p in &s.points {
        assert_eq!((p.requests, p.failed, p.timed_out), (2, 0, 0), "{p:?}");
        assert!(p.output_tokens_per_s.is_some_and(|v| v > 0.0) && p.ttft_p50_s.is_some_and(|v| v > 0.0), "{p:?}");
    }
    let j = s.judgement.expect("judged");
    assert_eq!((j.verdict, j.baseline_run), (SweepVerdict::Pass, None));
    let out = text(&o);
    assert!(out.contains("sweep r1 on n1") && out.contains("verdict      Pass (no baseline yet)"), "{out}");

    // A baseline ten times faster: this node regressed, and says by how much.
    let mut fast = read(&first);
    fast.spec.run = "r0".into();
    for p in &mut fast.status.as_mut().unwrap().points {
        p.output_tokens_per_s = p.output_tokens_per_s.map(|v| v * 10.0);
        p.ttft_p50_s = p.ttft_p50_s.map(|v| v / 10.0);
    }
    let base = dir.path().join("r0.json");
    std::fs::write(&base, serde_json::to_string(&fast).unwrap()).unwrap();
    let second = dir.path().join("r2.json");
    let mut args = common.to_vec();
    args.extend(["--requests-per-point", "2", "--run", "r2", "--no-self-test", "--out", second.to_str().unwrap()]);
    args.extend(["--baseline", base.to_str().unwrap()]);
    let o = agent(&args, &state);
    assert_eq!(o.status.code(), Some(1), "a regression exits 1: {}", text(&o));
    let r2 = read(&second);
    let j = r2.status.as_ref().and_then(|s| s.judgement.clone()).expect("judged");
    assert_eq!((j.verdict, j.baseline_run.as_deref()), (SweepVerdict::Regressed, Some("r0")));
    assert!(j.findings.iter().any(|f| f.metric.as_deref() == Some("outputTokensPerS")), "{j:?}");
    assert!(j.findings.iter().any(|f| f.metric.as_deref() == Some("ttftP50S")), "{j:?}");
    assert!(r2.status.as_ref().unwrap().self_test.is_none(), "--no-self-test");

    // sweep-report reads them back.
    let files = [first.to_str().unwrap(), second.to_str().unwrap()];
    let t = report(&files);
    assert!(t.status.success(), "{}", text(&t));
    let table = String::from_utf8_lossy(&t.stdout).to_string();
    assert!(table.contains("sweep r1 on n1") && table.contains("sweep r2 on n1") && table.contains("Regressed"), "{table}");
    let c = report(&[files[0], files[1], "--format", "csv"]);
    let csv = String::from_utf8_lossy(&c.stdout).to_string();
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    assert!(csv.lines().nth(1).unwrap().starts_with("r1,n1,64,1,8,2,0,0,"), "{csv}");
    let tr = report(&[files[0], files[1], "--trend"]);
    let trend = String::from_utf8_lossy(&tr.stdout).to_string();
    assert!(trend.contains("trend of n1 over 2 run(s)") && trend.contains("p64xc2xg8"), "{trend}");
    // A List (as kubectl prints) parses too.
    let list = dir.path().join("list.json");
    let items = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [read(&first), read(&second)]});
    std::fs::write(&list, items.to_string()).unwrap();
    let j = report(&[list.to_str().unwrap(), "--format", "json"]);
    let back: Vec<SweepResult> = serde_json::from_slice(&j.stdout).expect("JSON array of results");
    assert_eq!(back.len(), 2);
}

#[test]
fn bad_flags_and_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    for (args, needle) in [
        (vec!["sweep", "--backend", "cpu", "--concurrency", "0"], "--concurrency: 0 is outside 1..=1024"),
        (vec!["sweep", "--backend", "cpu", "--requests-per-point", "0"], "--requests-per-point"),
        (vec!["sweep", "--backend", "cpu", "--baseline", "/nonexistent/b.json"], "--baseline /nonexistent/b.json"),
        (vec!["sweep", "--backend", "cpu", "--model", "/nonexistent/m.gguf", "--no-self-test"], "/nonexistent/m.gguf"),
    ] {
        let o = agent(&args, state);
        let out = text(&o);
        // The missing model is found by the executor: recorded in the result, exit 1.
        let code = if needle == "/nonexistent/m.gguf" { 1 } else { 2 };
        assert_eq!(o.status.code(), Some(code), "{args:?}: {out}");
        assert!(out.contains(needle), "{args:?}: {out}");
    }
    let junk = dir.path().join("junk.json");
    std::fs::write(&junk, "{\"kind\": 3}").unwrap();
    let o = report(&[junk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("junk.json: item 0: not a SweepResult"), "{}", text(&o));
}
