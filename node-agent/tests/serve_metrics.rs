//! `brink-agent serve --selftest-report R` exposes the node gauges beside the server's: the
//! qualification (cases by result and suite, the state set, the envelope) and the OS's memory,
//! in its `/metrics` text (parsed strictly) and, scraped by a real Prometheus
//! (`scripts/prom-check`), through Prometheus's query API with their labels.
//!
//! CPU only: CI has no NVML, so the GPU gauges (`brink_gpu_*`) must be absent there — not zero.
//! On a machine with NVML they must be there instead.

mod common;

use std::path::Path;
use std::process::Command;

use brink_api::selftest::{SelfTestReport, Verdict};
use brink_engine::server::telemetry::prometheus::{Sample, parse_exposition};
use common::{agent, http, serve, tiny_model};

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
