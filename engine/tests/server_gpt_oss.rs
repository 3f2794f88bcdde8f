//! Both official SDKs against the server on a tiny synthetic gpt-oss model: the
//! harmony template renders the request (`reasoning_effort` included), the reply's `analysis`
//! channel comes back as OpenAI `reasoning_content` / Anthropic `thinking` blocks and `final` as
//! the answer, and a harmony tool call as `tool_calls` / `tool_use`, whose result goes back in the
//! next request as the template's tool message; plain and streamed. A synthetic model writes
//! random tokens, so the replies are scripted (`BRINK_TEST_SCRIPT_REPLY`, test builds only): each
//! is picked by markers in the rendered prompt, so a reply that comes back proves the prompt held
//! them (e.g. `Reasoning: high`, the tool's result as `functions.get_weather to=assistant`).
//!
//! Needs the cargo feature `test-switches` (`required-features` in engine/Cargo.toml; the
//! workspace's `cargo test` enables it through the agent's dev-dependencies; alone:
//! `cargo test -p brink-engine --features test-switches --test server_gpt_oss`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use brink_engine::synth::GptOssPreset;
use brink_engine::synth::gpt_oss::{self, GptOssSpec};
use brink_engine::test_switches;
use common::*;
use serde_json::{Value as Json, json};

const THINK_FINAL: &str =
    "<|channel|>analysis<|message|>Two plus two is four.<|end|><|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>";
const CALL: &str = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
const AFTER_RESULT: &str =
    "<|channel|>analysis<|message|>It said sunny.<|end|><|start|>assistant<|channel|>final<|message|>Sunny in Paris.<|return|>";

fn gpt_oss_model() -> &'static Path {
    static MODEL: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = MODEL.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny-gpt-oss.gguf");
        gpt_oss::generate(&GptOssSpec::from_preset(GptOssPreset::Tiny), &path, |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
        (dir, path)
    });
    path
}

/// The script: the first entry whose markers the rendered prompt all holds gives the reply.
fn script() -> Json {
    json!([
        // A tool's result, rendered as harmony's tool message, whichever SDK sent it.
        {"when": ["<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>", "sunny"], "reply": AFTER_RESULT},
        {"when": ["GAMMA"], "reply": CALL},
        {"when": ["DELTA"], "reply": CALL},
        {"when": ["ALPHA", "Reasoning: high"], "reply": THINK_FINAL},
        {"when": ["ALPHA", "Reasoning: low"], "reply": "<|channel|>final<|message|>Low effort: 4.<|return|>"},
        {"when": ["BETA"], "reply": THINK_FINAL},
    ])
}

#[test]
fn sdks_against_gpt_oss_reasoning_final_and_tool_calls() {
    if !have_sdks() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script_path = dir.path().join("script.json");
    std::fs::write(&script_path, script().to_string()).unwrap();
    // SAFETY: this test binary has one test, and the variable is set before the server starts.
    unsafe { std::env::set_var(test_switches::SCRIPT_REPLY, &script_path) };
    let mut opts = options(2, 8, Vec::new());
    opts.worker.model = gpt_oss_model().to_path_buf();
    opts.worker.max_batch_tokens = 512;
    opts.worker.prefill_chunk = 512;
    let server = start(opts);

    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/sdk_client.py");
    let out =
        std::process::Command::new("python3").arg(&sdk).arg(format!("http://{}", server.addr)).args(["tiny", "gpt-oss"]).output().unwrap();
    assert!(out.status.success(), "{}: {}", sdk.display(), String::from_utf8_lossy(&out.stderr));
    let v: Json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));

    // OpenAI: reasoning and answer apart, whole and streamed; the effort reached the template.
    for key in ["openai", "openai_stream"] {
        let r = &v[key];
        assert_eq!(
            (&r["reasoning"], &r["content"], &r["finish"]),
            (&json!("Two plus two is four."), &json!("The answer is 4."), &json!("stop")),
            "{key}: {v}"
        );
    }
    assert_eq!(v["openai_low"]["content"], "Low effort: 4.", "reasoning_effort low reached the template: {v}");

    // OpenAI tool calls: the harmony call as `tool_calls`, its result back as the tool message.
    for key in ["openai_tools", "openai_tools_stream"] {
        let r = &v[key];
        assert_eq!(r["finish"], "tool_calls", "{key}: {v}");
        assert_eq!(r["reasoning"], "Need the weather.", "{key}: {v}");
        let calls = r["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{key}: {v}");
        assert_eq!((&calls[0]["name"], &calls[0]["arguments"]), (&json!("get_weather"), &json!({"city": "Paris"})), "{key}: {v}");
        assert!(calls[0]["id"].as_str().is_some_and(|id| !id.is_empty()), "{key}: {v}");
        let after = &v[format!("{key}_result")];
        assert_eq!((&after["content"], &after["finish"]), (&json!("Sunny in Paris."), &json!("stop")), "{key}: {v}");
    }

    // Anthropic: thinking then text blocks, whole and streamed.
    let think_text = json!([{"type": "thinking", "text": "Two plus two is four."}, {"type": "text", "text": "The answer is 4."}]);
    for key in ["anthropic", "anthropic_stream"] {
        assert_eq!((&v[key]["blocks"], &v[key]["stop_reason"]), (&think_text, &json!("end_turn")), "{key}: {v}");
    }
    assert_eq!(v["anthropic_stream"]["block_starts"], json!(["thinking", "text"]), "{v}");

    // Anthropic tool use, and the result sent back.
    for key in ["anthropic_tools", "anthropic_tools_stream"] {
        let r = &v[key];
        assert_eq!(r["stop_reason"], "tool_use", "{key}: {v}");
        let blocks = r["blocks"].as_array().unwrap();
        let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["thinking", "tool_use"], "{key}: {v}");
        assert_eq!((&blocks[1]["name"], &blocks[1]["input"]), (&json!("get_weather"), &json!({"city": "Paris"})), "{key}: {v}");
        let after = &v[format!("{key}_result")];
        let want = json!([{"type": "thinking", "text": "It said sunny."}, {"type": "text", "text": "Sunny in Paris."}]);
        assert_eq!((&after["blocks"], &after["stop_reason"]), (&want, &json!("end_turn")), "{key}: {v}");
    }
    stop(server);
}
