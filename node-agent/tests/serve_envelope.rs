//! `brink-agent serve --selftest-report`: a report for another shape class, or one that
//! disqualifies the model's class, stops it with an error naming the file, before it binds a
//! port.

mod common;

use std::path::Path;

use brink_api::selftest::{SelfTestReport, Verdict};
use common::{agent, tiny_model};

fn report_for(class: &str, verdict: Verdict, path: &Path) {
    // The CPU-only self-test's report, re-labelled: the agent's own output is the format.
    let out = agent().args(["selftest", "--json"]).output().unwrap();
    let mut r: SelfTestReport = serde_json::from_slice(&out.stdout).unwrap();
    r.shape_class = class.into();
    r.verdict = verdict;
    std::fs::write(path, serde_json::to_vec(&r).unwrap()).unwrap();
}

fn serve(model: &Path, report: &Path) -> (bool, String) {
    let out = agent()
        .args(["serve", "--port", "0", "--backend", "cpu", "--model"])
        .arg(model)
        .arg("--selftest-report")
        .arg(report)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_report_for_another_class_or_a_disqualified_one_refuses_to_serve() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let file = brink_engine::gguf::GgufFile::open(&model).unwrap();
    let class = brink_engine::arch::config(&file).unwrap().shape_class();
    let report = dir.path().join("node.json");

    report_for("qwen3moe-h2048-e128-top8-ffn768", Verdict::Qualified { max_tokens: 16_384 }, &report);
    let (ok, err) = serve(&model, &report);
    assert!(!ok && err.contains("node.json") && err.contains("qualifies shape class qwen3moe-h2048"), "{err}");

    let reason = "attn_prefill_d128 fails at 63 tokens but 64 tokens pass".to_string();
    report_for(&class, Verdict::Disqualified { reason }, &report);
    let (ok, err) = serve(&model, &report);
    assert!(!ok && err.contains("disqualified") && err.contains("63 tokens"), "{err}");

    std::fs::write(&report, "not json").unwrap();
    let (ok, err) = serve(&model, &report);
    assert!(!ok && err.contains("not a self-test report"), "{err}");
}
