//! What the CLI tests share: the agent binary, a tiny synthetic model, one raw HTTP request, and
//! a running `brink-agent serve`. Each test binary uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brink_engine::synth::{self, Preset, SynthSpec};

/// The agent built for these tests, with no API keys inherited from the environment.
pub fn agent() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_brink-agent"));
    c.env_remove("BRINK_API_KEYS");
    c
}

/// The `tiny` synthetic model, written to `dir/tiny.gguf`.
pub fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &model, |_, _| {}).unwrap();
    model
}

/// `(status, body)` of one HTTP/1.1 request (`Connection: close`); status 0 when nothing answers.
pub fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else { return (0, String::new()) };
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut raw = String::new();
    if s.write_all(req.as_bytes()).is_err() || s.read_to_string(&mut raw).is_err() {
        return (0, String::new());
    }
    let status = raw.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw.as_str(), ""));
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.trim().eq_ignore_ascii_case("chunked"))
    });
    (status, if chunked { dechunk(body) } else { body.to_string() })
}

/// A chunked body's data (large responses, e.g. Prometheus' query API, come chunked). Works on
/// bytes: a chunk may end inside a UTF-8 character.
fn dechunk(body: &str) -> String {
    let (mut rest, mut out) = (body.as_bytes(), Vec::new());
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&rest[..eol]);
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else { break };
        let data = &rest[eol + 2..];
        if n == 0 || data.len() < n {
            break;
        }
        out.extend_from_slice(&data[..n]);
        rest = data[n..].strip_prefix(b"\r\n").unwrap_or(&data[n..]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Starts `serve` with `args` on port 0; returns it with the address it printed, once `/ready`
/// answers 200. Its log is echoed to the test's stderr (and always drained, so it never blocks).
pub fn serve(args: &[&str]) -> (Child, String) {
    serve_with_env(args, &[])
}

/// [`serve`] with environment variables set for it.
pub fn serve_with_env(args: &[&str], env: &[(&str, &str)]) -> (Child, String) {
    let mut cmd = agent();
    cmd.envs(env.iter().copied());
    let mut child = cmd.arg("serve").args(args).args(["--port", "0"]).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).expect("serve printed no address");
    let t0 = Instant::now();
    while http(&addr, "GET", "/ready", "").0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(60), "not ready in 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, addr)
}
