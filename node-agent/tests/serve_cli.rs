//! `brink-agent serve` as an operator runs it: the supervisor starts `brink-agent engine-child`
//! (its own executable), serves a request, runs the injected hang into a stall report, and exits
//! cleanly on SIGTERM; bad watchdog flags are refused with a message naming the flag.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brink_engine::synth::{self, Preset, SynthSpec};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_brink-agent"))
}

/// `(status, body)` of one HTTP/1.1 request (`Connection: close`).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Starts `serve` on port 0 and returns it with the address it printed.
fn serve(args: &[&str]) -> (Child, String, std::sync::mpsc::Receiver<String>) {
    let mut child = agent().arg("serve").args(args).args(["--port", "0"]).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let addr = loop {
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("serve printed no address");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let t0 = Instant::now();
    while http(&addr, "GET", "/ready", "").0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(30), "not ready in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, addr, rx)
}

#[test]
fn serves_through_its_engine_child_catches_a_stall_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &model, |_, _| {}).unwrap();
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
    ];
    let (mut child, addr, _log) = serve(&args);
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
    let model = dir.path().join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &model, |_, _| {}).unwrap();
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
