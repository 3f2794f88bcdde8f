//! The server on a tiny synthetic gpt-oss model with the window-only KV layout (its windowed
//! layer keeps a ring of blocks per sequence: context 512 and prefill chunks of 64 take rings of
//! 12 blocks of the 32 a slot has): two long prompts run at once, each in its own ring, give
//! the replies they give alone, and prefix reuse is off (a ring is not shared), so a repeated
//! prompt reuses nothing.

mod common;

use std::path::PathBuf;

use brink_engine::synth::GptOssPreset;
use brink_engine::synth::gpt_oss::{self, GptOssSpec};
use common::*;
use serde_json::{Value as Json, json};

fn completion(addr: std::net::SocketAddr, prompt: &str) -> Json {
    let r = post(addr, "/v1/completions", &json!({"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn text(v: &Json) -> String {
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn concurrent_sequences_in_their_own_rings_reply_as_alone_and_nothing_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let model: PathBuf = dir.path().join("tiny-gpt-oss.gguf");
    gpt_oss::generate(&GptOssSpec::from_preset(GptOssPreset::Tiny), &model, |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    let mut opts = options(2, 8, Vec::new());
    opts.worker.model = model;
    let server = start(opts);
    let long = |topic: &str| (0..40).map(|i| format!("{topic} line {i} says {}.", i * 7 % 13)).collect::<Vec<_>>().join(" ");
    let (a, b) = (long("alpha"), long("beta"));
    let alone_a = completion(server.addr, &a);
    let alone_b = completion(server.addr, &b);
    let tokens = alone_a["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens > 3 * 128 && tokens < 500, "a prompt of several windows that fits the context: {tokens} tokens");
    // The same prompt again: no prefix is reused under the window-only layout.
    let again = completion(server.addr, &a);
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(0), "{again}");
    assert_eq!(text(&again), text(&alone_a));
    // Both at once: mixed prefill chunks and decodes of two rings in the same steps.
    let addr = server.addr;
    let (ta, tb) = (std::thread::spawn(move || completion(addr, &a)), std::thread::spawn(move || completion(addr, &b)));
    let (together_a, together_b) = (ta.join().unwrap(), tb.join().unwrap());
    assert_eq!((text(&together_a), text(&together_b)), (text(&alone_a), text(&alone_b)));
    stop(server);
}
