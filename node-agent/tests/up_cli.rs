//! `brink-agent up` on the CPU with the built-in demo model: it qualifies, benchmarks, prints
//! the report, writes its JSON and serves; a second run reuses the cached qualification while
//! the fingerprint holds and re-qualifies when it changes; an engine that claims the GPU while
//! running on the CPU fails backend truth and is refused.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{agent, http};
use serde_json::Value;

fn up(state: &Path, extra: &[&str]) -> Command {
    let mut c = agent();
    c.args(["up", "--port", "0", "--state-dir"]).arg(state).args(extra);
    c.env_remove("BRINK_TEST_CLAIM_BACKEND").env_remove("BRINK_INJECT_FAULT");
    c
}

fn report(state: &Path) -> Value {
    let path = state.join("reports/up-latest.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn up_qualifies_benchmarks_and_serves_the_demo_model() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut child = up(&state, &[]).stdout(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut table = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("{line}");
            table.push_str(&line);
            table.push('\n');
            if let Some(rest) = line.split("SERVING at http://").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or_default().to_string();
                let _ = tx.send((addr, table.clone()));
            }
        }
    });
    let (addr, table) = rx.recv_timeout(Duration::from_secs(600)).expect("up never printed SERVING");
    // The table a person reads: both suites, the node's verdict, the bench and backend truth.
    for needle in ["kernels ", "model test ", "NO GPU", "[built-in demo]", "bench        prefill", "backend      PASS"] {
        assert!(table.contains(needle), "no {needle:?} in\n{table}");
    }
    let body = r#"{"model":"brink","messages":[{"role":"user","content":"Say hi"}],"max_tokens":4,"temperature":0}"#;
    let (status, answer) = http(&addr, "POST", "/v1/chat/completions", body);
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert!(answer["usage"]["completion_tokens"].as_u64().unwrap() >= 1, "{answer}");
    assert_eq!(http(&addr, "GET", "/ready", "").0, 200);
    // The node's qualification is on /metrics: both suites' cases and the combined state.
    let (_, metrics) = http(&addr, "GET", "/metrics", "");
    for needle in [r#"suite="kernel""#, r#"suite="model""#, r#"state="notQualified"} 1"#, "brink_node_memory_total_bytes"] {
        assert!(metrics.contains(needle), "no {needle} on /metrics");
    }

    let r = report(&state);
    assert_eq!(r["ok"], true, "{r:#}");
    assert_eq!((r["backend"].as_str(), r["model"]["demo"].as_bool()), (Some("cpu"), Some(true)));
    assert_eq!(r["url"].as_str(), Some(format!("http://{addr}").as_str()));
    assert!(r["kernels"]["summary"]["derived"].as_u64().unwrap() > 100, "{r:#}");
    assert_eq!(r["kernels"]["verdict"]["state"], "notQualified");
    // The model-level test ran whole forward passes on the CPU backend, and they all passed.
    let m = &r["modelTest"]["summary"];
    assert!(m["executed"].as_u64().unwrap() > 10 && m["passed"] == m["executed"], "{r:#}");
    assert_eq!(r["modelTest"]["verdict"]["state"], "qualified");
    assert!(r["bench"]["decodeTokensPerS"].as_f64().unwrap() > 0.0);
    assert_eq!(r["backendTruth"]["state"], "pass");
    assert_eq!(r["reused"], false);

    // SIGTERM: drains and exits 0.
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let t0 = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "up did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "{code}");

    // Same fingerprint: reused, no self-test. The serving parameters are part of it.
    let out = up(&state, &["--no-serve"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("cache        reusing the qualification of"), "{text}");
    assert_eq!(report(&state)["reused"], true);
    let out = up(&state, &["--no-serve", "--max-batch-tokens", "4096"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("re-qualifying: serving.maxBatchTokens changed: 8192 -> 4096"), "{text}");
    assert_eq!(report(&state)["reused"], false);
}

#[test]
fn an_engine_on_the_cpu_claiming_the_gpu_fails_backend_truth() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let out = up(&state, &["--no-serve"]).env("BRINK_TEST_CLAIM_BACKEND", "cuda").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("backend      FAIL: asked for the cpu backend, the engine reports cuda"), "{text}");
    assert!(text.contains("result       REFUSED: backend truth failed"), "{text}");
    let r = report(&state);
    assert_eq!(r["ok"], false);
    let reasons: Vec<&str> = r["backendTruth"]["reasons"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    // No GPU here: the driver lists no process on it, so the claim is refuted, not just unverified.
    assert!(reasons.iter().any(|r| r.starts_with("claims cuda but pid ") && r.contains("does not hold GPU 0")), "{reasons:?}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    let out = up(dir.path(), &["--model", missing.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("error: --model") && err.contains("nope.gguf"), "{err}");
    let out = up(dir.path(), &["--min-decode-tokens-per-s", "-3"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--min-decode-tokens-per-s"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = up(dir.path(), &["--backend", "cuda"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--backend cuda"));
}

/// `brink-agent gen-model` of the tiny preset to `out`, with `extra` overrides.
fn gen_model(out: &Path, extra: &[&str]) {
    let o = agent().args(["gen-model", "--arch", "qwen3moe", "--preset", "tiny", "--out"]).arg(out).args(extra).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Two models that share the readable label and differ only in head dim, or only in the weight
/// type: `up --model B` after `up --model A` does not reuse A's result, re-qualifies, and says
/// which field changed.
#[test]
fn another_model_with_the_same_label_requalifies_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (a, head_dim, wtype) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"), dir.path().join("c.gguf"));
    gen_model(&a, &[]);
    gen_model(&head_dim, &["--head-dim", "32"]);
    gen_model(&wtype, &["--type", "q4_0"]);
    let run = |model: &Path| {
        let out = up(&state, &["--no-serve", "--model-test-max-tokens", "8", "--model"]).arg(model).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
        (text, report(&state))
    };
    let (_, ra) = run(&a);
    assert_eq!(ra["reused"], false);
    let key_a = ra["model"]["shapeClass"].as_str().unwrap().to_string();
    assert!(key_a.starts_with("qwen3moe-h256-e16-top4-ffn256-"), "{key_a}");
    // The same model again: reused.
    assert_eq!(run(&a).1["reused"], true);

    for (model, field) in [(&head_dim, "attention.head_dim: 64 -> 32"), (&wtype, "\"q8_0\" -> \"q4_0\"")] {
        let (text, r) = run(model);
        let key = r["model"]["shapeClass"].as_str().unwrap();
        assert!(key != key_a && key.starts_with("qwen3moe-h256-e16-top4-ffn256-"), "{key} vs {key_a}");
        assert_eq!(r["reused"], false, "{text}");
        let cache = r["cache"].as_str().unwrap();
        assert!(cache.starts_with("re-qualifying: no result for shape key") && cache.contains(field), "{cache}");
        // Back to A: its own result is still there.
        let (_, back) = run(&a);
        assert_eq!((back["reused"].as_bool(), back["model"]["shapeClass"].as_str()), (Some(true), Some(key_a.as_str())));
    }
}
