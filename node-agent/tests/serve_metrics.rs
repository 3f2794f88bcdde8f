//! `brink-agent serve --selftest-report R` exposes the node gauges beside the server's: the
//! qualification (cases by result and suite, the state set, the envelope) and the OS's memory,
//! in its `/metrics` text (parsed strictly) and, scraped by a real Prometheus
//! (`scripts/prom-check`), through Prometheus's query API with their labels.
//!
//! The same gauges leave the agent over OTLP to a receiver that decodes the real protobuf.
//!
//! CPU only: CI has no NVML, so the GPU gauges (`brink_gpu_*`) must be absent there — not zero.
//! On a machine with NVML they must be there instead.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brink_api::selftest::{SelfTestReport, Verdict};
use brink_engine::server::telemetry::prometheus::{Sample, parse_exposition};
use common::{agent, http, serve, serve_with_env, tiny_model};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point;
use prost::Message;

/// The CPU self-test's own report, re-labelled for `class` with distinctive counts.
fn write_report(class: &str, path: &Path) {
    let out = agent().args(["selftest", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut r: SelfTestReport = serde_json::from_slice(&out.stdout).unwrap();
    r.shape_class = class.into();
    r.verdict = Verdict::Qualified { max_tokens: 256 };
    (r.passed, r.failed, r.hung, r.skipped) = (11, 0, 0, 3);
    (r.negative_controls.flagged, r.negative_controls.missed) = (2, 0);
    std::fs::write(path, serde_json::to_vec(&r).unwrap()).unwrap();
}

fn nvml_present() -> bool {
    nvml_wrapper::Nvml::init().is_ok()
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples.iter().find(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v))).map(|s| s.value)
}

#[test]
fn serve_exposes_the_qualification_and_memory_gauges_to_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let file = brink_engine::gguf::GgufFile::open(&model).unwrap();
    let class = brink_engine::arch::config(&file).unwrap().shape_class();
    let report = dir.path().join("node.json");
    write_report(&class, &report);

    let (mut child, addr) = serve(&["--backend", "cpu", "--model", model.to_str().unwrap(), "--selftest-report", report.to_str().unwrap()]);
    // A request, so the GenAI histograms prom-check also looks for have a series.
    let (status, body) = http(&addr, "POST", "/v1/completions", r#"{"model":"tiny","prompt":"Hi","max_tokens":2}"#);
    assert_eq!(status, 200, "{body}");

    let (status, text) = http(&addr, "GET", "/metrics", "");
    assert_eq!(status, 200);
    let samples = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let c = class.as_str();
    for (result, n) in [("passed", 11.0), ("failed", 0.0), ("hung", 0.0), ("skipped", 3.0), ("flagged", 2.0), ("missed", 0.0)] {
        assert_eq!(value(&samples, "brink_selftest_cases", &[("result", result), ("suite", "kernel")]), Some(n), "{result}\n{text}");
    }
    assert_eq!(value(&samples, "brink_selftest_cases", &[("suite", "model")]), None, "serve runs no model-level test");
    for (state, v) in [("qualified", 1.0), ("clamped", 0.0), ("disqualified", 0.0), ("notQualified", 0.0)] {
        assert_eq!(value(&samples, "brink_qualified", &[("shape_class", c), ("state", state)]), Some(v), "{state}\n{text}");
    }
    assert_eq!(value(&samples, "brink_envelope_max_batch_tokens", &[("shape_class", c)]), Some(256.0));
    let total = value(&samples, "brink_node_memory_total_bytes", &[]).unwrap_or_else(|| panic!("no memory total\n{text}"));
    let available = value(&samples, "brink_node_memory_available_bytes", &[]).unwrap();
    let cache = value(&samples, "brink_node_memory_page_cache_bytes", &[]).unwrap();
    assert!(total > 0.0 && available <= total && cache <= total, "{total} {available} {cache}");
    // The CPU backend launches no kernels: the counter is declared, with no series.
    assert!(text.contains("# TYPE brink_kernel_launch_errors_total counter"), "{text}");
    assert_eq!(value(&samples, "brink_kernel_launch_errors_total", &[]), None);
    let nvml = nvml_present();
    let gpu = samples.iter().filter(|s| s.name.starts_with("brink_gpu_")).count();
    if nvml {
        assert!(gpu > 0 && text.contains("gpu_uuid=\"GPU-"), "NVML is here but no GPU gauges\n{text}");
    } else {
        assert_eq!(gpu, 0, "no NVML: the GPU gauges must be absent, not zero\n{text}");
        assert!(!text.contains("brink_gpu_"), "{text}");
    }

    prometheus_check(&addr, c, nvml);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A real Prometheus scrapes the agent; its query API must give each series with its labels.
/// Skipped without `prometheus` on PATH, unless `BRINK_REQUIRE_PROMETHEUS=1` (CI).
fn prometheus_check(addr: &str, class: &str, nvml: bool) {
    let have = Command::new("prometheus").arg("--version").output().is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var("BRINK_REQUIRE_PROMETHEUS").as_deref() != Ok("1"),
            "BRINK_REQUIRE_PROMETHEUS=1 but no `prometheus` on PATH (apt-get install -y --no-install-recommends prometheus)"
        );
        eprintln!("skipped the Prometheus part: no `prometheus` on PATH");
        return;
    }
    let mut expects: Vec<(String, String)> = vec![
        (format!(r#"brink_qualified{{shape_class="{class}",state="qualified"}}"#), "1".into()),
        (format!(r#"brink_qualified{{shape_class="{class}",state="clamped"}}"#), "0".into()),
        (format!(r#"brink_envelope_max_batch_tokens{{shape_class="{class}"}}"#), "256".into()),
        (r#"brink_selftest_cases{suite="kernel",result="passed"}"#.into(), "11".into()),
        (r#"brink_selftest_cases{suite="kernel",result="flagged"}"#.into(), "2".into()),
        (r#"count(brink_selftest_cases{suite="kernel"})"#.into(), "6".into()),
        ("brink_node_memory_total_bytes > 0".into(), "any".into()),
        ("brink_node_memory_available_bytes <= brink_node_memory_total_bytes".into(), "any".into()),
        ("brink_node_memory_page_cache_bytes".into(), "any".into()),
    ];
    if !nvml {
        expects.push(("absent(brink_gpu_temperature_celsius)".into(), "1".into()));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/prom-check");
    let mut cmd = Command::new(&script);
    cmd.arg(addr).arg("tiny");
    for (q, v) in &expects {
        cmd.arg("--expect").arg(q).arg(v);
    }
    let out = cmd.output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{}: {report}", script.display());
    eprintln!("{report}");
    for (q, _) in &expects {
        assert!(report.contains(&format!("{q}: ")), "{q} not checked: {report}");
    }
}

/// Exported metrics as a minimal OTLP/HTTP receiver got them (decoded with the real OTLP types).
type Exports = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

/// One HTTP/1.1 request off `r`: (path, body); `None` when the connection closed.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut line = String::new();
    r.read_line(&mut line).ok().filter(|&n| n > 0)?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut length = 0;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok().filter(|&n| n > 0)?;
        if h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).ok()?;
    Some((path, body))
}

/// A receiver on its own threads: every `/v1/metrics` body it gets is decoded and kept.
fn otlp_receiver() -> (String, Exports) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let exports = Exports::default();
    let kept = exports.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            let kept = kept.clone();
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                while let Some((path, body)) = read_request(&mut r) {
                    if path == "/v1/metrics" {
                        let m = ExportMetricsServiceRequest::decode(body.as_slice()).expect("not an OTLP metrics request");
                        kept.lock().unwrap().push(m);
                    }
                    let _ = w.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n");
                }
            });
        }
    });
    (addr, exports)
}

/// An attribute as `key=value` (string values; `?` for others).
fn attr(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => format!("{}={s}", kv.key),
        _ => format!("{}=?", kv.key),
    }
}

/// The gauge `name`'s points in the latest export that has it: (attributes as `k=v`, value).
fn gauge_points(exports: &[ExportMetricsServiceRequest], name: &str) -> Option<Vec<(Vec<String>, f64)>> {
    let m = exports
        .iter()
        .rev()
        .flat_map(|e| &e.resource_metrics)
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .find(|m| m.name == name)?;
    let Some(Data::Gauge(g)) = &m.data else { panic!("{name} is not a gauge: {m:?}") };
    Some(
        g.data_points
            .iter()
            .map(|p| {
                let attrs = p.attributes.iter().map(attr).collect();
                let v = match p.value {
                    Some(number_data_point::Value::AsDouble(v)) => v,
                    Some(number_data_point::Value::AsInt(v)) => v as f64,
                    None => f64::NAN,
                };
                (attrs, v)
            })
            .collect(),
    )
}

/// The same node gauges leave the real agent over OTLP when `OTEL_EXPORTER_OTLP_*` is set.
#[test]
fn serve_exports_the_node_gauges_over_otlp() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let file = brink_engine::gguf::GgufFile::open(&model).unwrap();
    let class = brink_engine::arch::config(&file).unwrap().shape_class();
    let report = dir.path().join("node.json");
    write_report(&class, &report);
    let (at, exports) = otlp_receiver();
    let endpoint = format!("http://{at}/v1/metrics");
    let (mut child, _addr) = serve_with_env(
        &["--backend", "cpu", "--model", model.to_str().unwrap(), "--selftest-report", report.to_str().unwrap()],
        &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", &endpoint), ("OTEL_METRIC_EXPORT_INTERVAL", "200"), ("OTEL_TRACES_EXPORTER", "none")],
    );
    let t0 = Instant::now();
    let (states, cases, memory) = loop {
        {
            let got = exports.lock().unwrap();
            let read = |name| gauge_points(&got, name);
            if let (Some(s), Some(c), Some(m)) =
                (read("brink_qualified"), read("brink_selftest_cases"), read("brink_node_memory_available_bytes"))
            {
                break (s, c, m);
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no export with the node gauges within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    // Prometheus label names become OTel attribute names (`shape_class` → `shape.class`, as the
    // server's `attributes` maps every label; Prometheus' OTLP ingestion maps them back).
    let current: Vec<&Vec<String>> = states.iter().filter(|(_, v)| *v == 1.0).map(|(a, _)| a).collect();
    assert_eq!(current, [&vec![format!("shape.class={class}"), "state=qualified".to_string()]], "{states:?}");
    assert_eq!(states.len(), 5, "one series per verdict state: {states:?}");
    let passed = cases.iter().find(|(a, _)| a.contains(&"result=passed".to_string()) && a.contains(&"suite=kernel".to_string()));
    assert_eq!(passed.map(|(_, v)| *v), Some(11.0), "{cases:?}");
    assert!(memory.len() == 1 && memory[0].1 > 0.0, "{memory:?}");
    if !nvml_present() {
        let got = exports.lock().unwrap();
        assert!(gauge_points(&got, "brink_gpu_temperature_celsius").is_none(), "no NVML: no GPU gauge may be exported");
    }
}
