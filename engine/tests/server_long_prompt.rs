//! A 24,000-token prompt through the server (chunked prefill on the CPU backend), then the
//! same long prefix with another question: the second request reports the prefix's tokens as
//! reused (`prompt_tokens_details.cached_tokens`) and reaches its first token much sooner.
//!
//! The model is a one-layer, one-head qwen3moe with a 32k context: the CPU reference's
//! attention is quadratic, and this keeps a cold 24k prefill to seconds.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brink_engine::gguf::GgufFile;
use brink_engine::synth::{self, Preset, Qwen3MoeShape, SynthSpec};
use brink_engine::tokenizer::Tokenizer;
use common::*;
use serde_json::{Value as Json, json};

const CONTEXT: usize = 32_768;

fn long_context_model(dir: &Path) -> PathBuf {
    let mut spec = SynthSpec::from_preset(Preset::Tiny);
    spec.shape = Qwen3MoeShape { layers: 1, heads: 1, kv_heads: 1, experts: 4, top_k: 2, context: CONTEXT as u32, ..spec.shape };
    let path = dir.join("long.gguf");
    synth::generate(&spec, &path, |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    path
}

/// A completion with `max_tokens` 1: its wall time is the time to the first token.
fn first_token(addr: std::net::SocketAddr, prompt: &str) -> (Json, Duration) {
    let body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}).to_string();
    let t0 = Instant::now();
    let mut s = send(addr, "POST", "/v1/completions", &[], &body);
    s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let elapsed = t0.elapsed();
    let r = parse(&raw);
    assert_eq!(r.status, 200, "{}", r.body);
    (r.json(), elapsed)
}

#[test]
fn a_24k_prompt_completes_and_its_prefix_is_reused_by_the_next_request() {
    let dir = tempfile::tempdir().unwrap();
    let model = long_context_model(dir.path());
    let tok = Tokenizer::from_gguf(GgufFile::open(&model).unwrap().metadata()).unwrap();
    // An agent's long system prompt: numbered rules until it passes 24,000 tokens.
    let mut prefix = String::new();
    let mut i = 0;
    while tok.encode(&prefix, true, true).unwrap().len() < 24_050 {
        prefix += &format!("Rule {i}: when the user asks about topic {}, answer in at most {} words. ", i * 7 % 101, i % 9 + 3);
        i += 1;
    }
    let (first, second) = (format!("{prefix}Question: what is rule 3?"), format!("{prefix}Question: which rule is last?"));
    let n_first = tok.encode(&first, true, true).unwrap().len();
    let n_second = tok.encode(&second, true, true).unwrap().len();
    let shared = tok.encode(&prefix, true, true).unwrap().len();
    assert!(n_first >= 24_000 && n_second < CONTEXT, "prompts of {n_first} and {n_second} tokens");

    let mut opts = options(2, 4, Vec::new());
    opts.worker.model = model.clone();
    opts.worker.context = CONTEXT;
    opts.worker.max_batch_tokens = 4096;
    opts.worker.prefill_chunk = 4096;
    let server = start(opts);

    let (a, cold) = first_token(server.addr, &first);
    assert_eq!(a["usage"]["prompt_tokens"].as_u64(), Some(n_first as u64));
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(0));
    let (b, warm) = first_token(server.addr, &second);
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
    eprintln!(
        "24k prompt: {n_first} tokens, first token after {:.2} s; same prefix ({shared} tokens shared): {cached} reused, first token after {:.2} s ({:.1}x sooner)",
        cold.as_secs_f64(),
        warm.as_secs_f64(),
        cold.as_secs_f64() / warm.as_secs_f64()
    );
    // Every full 16-position block of the shared prefix is reused (the prefix's last tokens may
    // merge with the question's first in the tokenizer, hence the margin of a block).
    assert!(cached + 32 >= shared && cached <= shared, "{cached} of {shared} shared tokens reused");
    // What reuse is for: the second request skips ~24k tokens of prefill. A generous bound (the
    // measured ratio is printed above): at least 4x sooner.
    assert!(warm * 4 < cold, "with reuse {warm:?}, without {cold:?}");
    stop(server);
}
