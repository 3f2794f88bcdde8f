//! `brink-agent bench --url` against the real `brink-agent serve --backend cpu` on a tiny
//! synthetic model: a 2x2x1 grid whose JSON holds what was measured, and the errors a user meets
//! first (no server, no key, a server that does not stream, a bad grid flag), each naming the URL
//! or the flag; and `bench --model` in process, whose every row is repeated and reported as a
//! median with its spread.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Output;
use std::time::Duration;

use common::{agent, serve, tiny_model};
use serde_json::Value;

fn failed_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded: {err}");
    for n in needles {
        assert!(err.contains(n), "no `{n}` in: {err}");
    }
}

#[test]
fn sweeps_a_grid_against_serve_and_names_bad_servers() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "sekrit\n").unwrap();
    let (mut server, addr) = serve(&[
        "--model",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
        "--context",
        "512",
        "--slots",
        "2",
        "--api-key-file",
        keys.to_str().unwrap(),
    ]);
    let url = format!("http://{addr}");
    let json_path = dir.path().join("bench.json");
    let csv_path = dir.path().join("bench.csv");
    let grid = ["--prompt-tokens", "48,160", "--concurrency", "1,2", "--max-tokens", "8", "--requests", "4"];
    let out = agent()
        .args(["bench", "--url", &url, "--api-key", "sekrit", "--json", json_path.to_str().unwrap(), "--csv", csv_path.to_str().unwrap()])
        .args(grid)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("TTFT p50"), "{stdout}");

    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(doc["server"]["url"], url.as_str());
    assert!(doc["server"]["models"]["data"][0]["id"].is_string(), "{doc}");
    assert_eq!(doc["settings"]["api_key"], true, "the key itself is not written");
    assert!(!doc.to_string().contains("sekrit"));
    let points = doc["points"].as_array().unwrap();
    let grid_of = |p: &Value| (p["prompt_tokens"].as_u64().unwrap(), p["concurrency"].as_u64().unwrap(), p["max_tokens"].as_u64().unwrap());
    assert_eq!(points.iter().map(grid_of).collect::<Vec<_>>(), [(48, 1, 8), (48, 2, 8), (160, 1, 8), (160, 2, 8)]);
    for p in points {
        assert_eq!(p["requests"].as_u64().unwrap() + p["rejected"].as_u64().unwrap(), 4, "{p}");
        assert!(p["failed"].as_object().unwrap().is_empty(), "{p}");
        assert!(p["requests"].as_u64().unwrap() > 0, "{p}");
        let (ttft, e2e) = (&p["ttft_s"], &p["e2e_s"]);
        for q in ["mean", "p50", "p90", "p99"] {
            let (t, e) = (ttft[q].as_f64().unwrap(), e2e[q].as_f64().unwrap());
            assert!(t > 0.0 && t <= e, "{q}: TTFT {t} > e2e {e}: {p}");
        }
        let generated = p["mean_output_tokens"].as_f64().unwrap();
        assert!(generated > 0.0, "{p}");
        if generated > 1.0 {
            assert!(p["itl_s"]["p50"].as_f64().unwrap() >= 0.0, "several tokens, gaps between them: {p}");
        }
        assert!(p["output_tokens_per_s"].as_f64().unwrap() > 0.0, "{p}");
        let asked = p["prompt_tokens"].as_f64().unwrap();
        let got = p["mean_prompt_tokens"].as_f64().unwrap();
        assert!((got - asked).abs() <= 0.1 * asked, "asked {asked} prompt tokens, the server counted {got}");
    }
    let csv = std::fs::read_to_string(&csv_path).unwrap();
    assert_eq!(csv.lines().count(), 1 + points.len(), "{csv}");

    // A point by time instead of a request count.
    let timed = dir.path().join("timed.json");
    let out = agent()
        .args(["bench", "--url", &url, "--api-key", "sekrit", "--json", timed.to_str().unwrap()])
        .args(["--prompt-tokens", "32", "--concurrency", "2", "--max-tokens", "4", "--duration", "0.5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&timed).unwrap()).unwrap();
    assert_eq!(doc["settings"]["requests"]["seconds_per_point"], 0.5);
    let p = &doc["points"][0];
    assert!(p["requests"].as_u64().unwrap() >= 2, "{p}");
    assert!(p["duration_s"].as_f64().unwrap() >= 0.5, "{p}");

    // The same server without the key: 401, the URL, and what to do.
    let out = agent().args(["bench", "--url", &url]).args(grid).output().unwrap();
    failed_with(&out, &[&format!("{url}/v1/models"), "401", "--api-key"]);
    let _ = server.kill();
    let _ = server.wait();

    // Nothing listening there any more.
    let out = agent().args(["bench", "--url", &url]).args(grid).output().unwrap();
    failed_with(&out, &["cannot reach", &url]);

    // A server that answers every request with plain JSON.
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_url = format!("http://{}", fake.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut s in fake.incoming().map_while(Result::ok) {
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            // Headers and the (small) body arrive together; the answer does not depend on them.
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            std::thread::sleep(Duration::from_millis(20));
            let body = r#"{"object":"list","data":[{"id":"fake"}],"choices":[{"text":"hi"}]}"#;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let out = agent().args(["bench", "--url", &fake_url]).args(grid).output().unwrap();
    failed_with(&out, &[&format!("{fake_url}/v1/completions"), "text/event-stream"]);

    // Bad flags, named.
    let out = agent().args(["bench", "--url", &fake_url, "--concurrency", "0"]).output().unwrap();
    failed_with(&out, &["--concurrency", "not positive"]);
    let out = agent().args(["bench", "--url", "https://example.com"]).output().unwrap();
    failed_with(&out, &["--url https://example.com", "https"]);
    let out = agent().args(["bench"]).output().unwrap();
    failed_with(&out, &["--model", "--url"]);
    let out = agent().args(["bench", "--url", &fake_url, "--model", "x.gguf"]).output().unwrap();
    failed_with(&out, &["--model", "--url"]);
    let out = agent().args(["bench", "--url", &fake_url, "--backend", "cpu"]).output().unwrap();
    failed_with(&out, &["--backend", "cannot be used with"]);
    let out = agent().args(["bench", "--concurrency", "2", "--model", "x.gguf"]).output().unwrap();
    failed_with(&out, &["--concurrency", "cannot be used with"]);
}

/// In process on the CPU: each prefill and each decode batch size is timed `--repeat` times; the
/// JSON keeps every repetition and reports their median (the table's figure) inside min..max.
#[test]
fn in_process_rows_are_medians_of_their_repetitions() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let json_path = dir.path().join("bench.json");
    let args = ["--prompt-lengths", "8,24", "--decode-context", "8", "--decode-tokens", "3", "--sequences", "1,2", "--repeat", "3"];
    let out = agent()
        .args(["bench", "--model", model.to_str().unwrap(), "--backend", "cpu", "--json", json_path.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("median"), "{stdout}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let rows = doc["results"].as_array().unwrap();
    let tests: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["prefill 8", "prefill 24", "decode 3", "decode 3 x 2 seqs (aggregate)"]);
    for r in rows {
        let seconds: Vec<f64> = r["seconds"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap()).collect();
        assert_eq!((seconds.len(), r["repetitions"].as_u64()), (3, Some(3)), "{r}");
        assert!(seconds.iter().all(|s| *s > 0.0), "{r}");
        let tokens = r["tokens"].as_f64().unwrap();
        let mut rates: Vec<f64> = seconds.iter().map(|s| tokens / s).collect();
        rates.sort_by(f64::total_cmp);
        let f = |k: &str| r[k].as_f64().unwrap();
        // The JSON's seconds are rounded when written, so a rate recomputed from them can differ
        // from the reported one in its last bits: equal to 1e-9, relative.
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
        assert!(near(f("tokens_per_s"), rates[1]), "the median of three ({}): {r}", rates[1]);
        assert!(near(f("tokens_per_s_min"), rates[0]) && near(f("tokens_per_s_max"), rates[2]), "min and max ({rates:?}): {r}");
        assert!(f("tokens_per_s_sd") >= 0.0, "{r}");
    }
    assert_eq!(rows[3]["tokens"].as_u64(), Some(6), "3 steps of 2 sequences");
    // A repetition count of 0 is refused by name.
    let out = agent().args(["bench", "--model", model.to_str().unwrap(), "--backend", "cpu", "--repeat", "0"]).output().unwrap();
    failed_with(&out, &["--repeat"]);
}
