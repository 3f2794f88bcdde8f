//! `brink-agent serve` as an operator runs it: the supervisor starts `brink-agent engine-child`
//! (its own executable), serves a request, runs the injected hang into a stall report, and exits
//! cleanly on SIGTERM; bad watchdog flags are refused with a message naming the flag.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{agent, http, serve, tiny_model};

#[test]
fn serves_through_its_engine_child_catches_a_stall_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let stalls = dir.path().join("stalls");
    let args = [
        "--model",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
        "--context",
        "512",
        "--prefill-chunk",
        "64",
        "--stall-timeout",
        "1.5",
        "--stall-dir",
        stalls.to_str().unwrap(),
        "--inject-fault",
        "hang:layer=1,min-rows=48",
        // The error path: the stalled request fails instead of running again.
        "--requeue-after-restart",
        "0",
    ];
    let (mut child, addr) = serve(&args);
    let small = r#"{"model": "brink", "prompt": "hello", "max_tokens": 3}"#;
    assert_eq!(http(&addr, "POST", "/v1/completions", small).0, 200);
    let poison = format!(r#"{{"model": "brink", "prompt": "{}", "max_tokens": 3}}"#, "word ".repeat(80));
    let (status, body) = http(&addr, "POST", "/v1/completions", &poison);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("layer 1"), "{body}");
    let reports: Vec<_> = std::fs::read_dir(&stalls).unwrap().flatten().collect();
    assert_eq!(reports.len(), 1, "one stall, one report");
    let t0 = Instant::now();
    while http(&addr, "GET", "/ready", "").0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(20), "the engine was not restarted");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(http(&addr, "POST", "/v1/completions", small).0, 200);

    let term = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(term.success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "serve did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn bad_watchdog_flags_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    for (flags, needle) in
        [(vec!["--inject-fault", "explode:layer=1"], "--inject-fault"), (vec!["--stall-timeout", "0"], "--stall-timeout")]
    {
        let out =
            agent().args(["serve", "--backend", "cpu", "--port", "0", "--model", model.to_str().unwrap()]).args(&flags).output().unwrap();
        assert!(!out.status.success(), "{flags:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
}
