//! brink's CPU backend against llama.cpp (llama-cpp-python 0.3.36, the pinned build of
//! `llama_parity.rs`) on gpt-oss models: the synthetic one (`gen-model --arch gpt-oss`, preset
//! tiny: a 128-token window on layer 0, YaRN x32; prompts shorter than the window, of ~400
//! tokens, and the long one in chunks of 100), and one written by gguf-py's own writer
//! (scripts/gpt_oss_gguf_py.py: MXFP4 experts, q8_0 elsewhere, F32 biases, sinks and router; a
//! 32-token window on layer 0, full attention on layer 1; YaRN): identical tokenization,
//! identical greedy continuation and the largest relative logit error (per row, relative to the
//! row's largest logit) under the qwen3moe tolerance, 1e-4. The prompt is past the window, whole
//! and under a chunked prefill whose chunk edges fall inside the windows of the queries after
//! them; llama.cpp evaluates it in one batch. Must-fail controls: llama.cpp on a copy of either
//! model with one expert's down projection negated must be told apart.
//!
//! Skipped with a message when llama-cpp-python is missing, unless BRINK_REQUIRE_PY=1.

mod parity_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use brink_engine::gguf::GgufFile;
use brink_engine::synth::gpt_oss::{self, GptOssSpec};
use brink_engine::synth::{self, GptOssPreset, Preset, SynthSpec};
use parity_common::{brink, diff, have_llama_cpp, llama, summary};

/// The test, in the message that says it is skipped.
const WHAT: &str = "the gpt-oss llama.cpp parity test";
const TOLERANCE: f64 = 1e-4;
const SHORT: &str = "The quick brown fox jumps over the lazy dog. Hello, world! 1234 + 5678 =";
/// Where the chunked prefill splits the synthetic model's long prompt: inside the window of
/// every later query.
const CHUNK: usize = 100;

fn long_prompt() -> String {
    let sentence = "The model reads the whole context on odd layers and only the last window on even ones, ";
    (0..12).map(|i| format!("{i}: {sentence}")).collect()
}

fn generate(dir: &Path) -> PathBuf {
    let spec = GptOssSpec::from_preset(GptOssPreset::Tiny);
    let path = dir.join("gpt-oss-tiny.gguf");
    gpt_oss::generate(&spec, &path, |_, _| {}).unwrap();
    path
}

/// A gpt-oss model written by gguf-py's own writer (scripts/gpt_oss_gguf_py.py: window 32,
/// YaRN x4, MXFP4 experts), its vocabulary copied from the synthetic qwen3moe.
fn gguf_py_model(dir: &Path) -> PathBuf {
    let vocab = dir.join("qwen3moe-tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &vocab, |_, _| {}).unwrap();
    let path = dir.join("gpt-oss-gguf-py.gguf");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpt_oss_gguf_py.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--out", path.to_str().unwrap(), "--vocab-from", vocab.to_str().unwrap(), "--window", &GGUF_PY_WINDOW.to_string()])
        .output()
        .expect("run python3");
    assert!(out.status.success(), "gpt_oss_gguf_py.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    path
}

const GGUF_PY_WINDOW: usize = 32;

#[test]
fn a_gpt_oss_model_written_by_gguf_py_matches_llama_cpp() {
    if !have_llama_cpp(WHAT) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = gguf_py_model(dir.path());
    let prompt: String = (0..20).map(|i| format!("word{i} is here. ")).collect();
    let mut failures = Vec::new();
    // Chunks of 40 end inside the 32-token windows of the queries after them.
    for (name, chunk) in [("whole", 512), ("chunked", 40)] {
        let (theirs, ours) = (llama(&model, &prompt), brink(&model, &prompt, chunk));
        let d = diff(&model, &ours, &theirs);
        let n = ours.prompt_tokens.len();
        assert!(n > 2 * GGUF_PY_WINDOW && n > chunk.min(100), "the prompt is {n} tokens: not past the window and the chunk edges");
        eprintln!("gguf-py gpt-oss {name:<8} prompt {n:>3} tokens {}", summary(&ours, &theirs, &d, TOLERANCE));
        failures.extend(parity_common::failures(name, &ours, &theirs, &d, TOLERANCE));
    }
    assert!(failures.is_empty(), "gguf-py gpt-oss parity failures:\n{}", failures.join("\n"));
}

/// Negates every value of expert 0's down projection in layer 0 of an MXFP4 expert tensor (each
/// 17-byte block: an e8m0 scale, then 32 e2m1 nibbles whose top bit is the sign).
fn perturb_expert(model: &Path, copy: &Path) {
    std::fs::copy(model, copy).unwrap();
    let file = GgufFile::open(copy).unwrap();
    let t = file.require_tensor("blk.0.ffn_down_exps.weight").unwrap();
    assert_eq!(t.ggml_type().name(), "mxfp4", "the experts are MXFP4");
    let expert_bytes = t.size() / t.dims()[2];
    let (start, len) = (t.file_offset() as usize, expert_bytes as usize);
    drop(file);
    let mut bytes = std::fs::read(copy).unwrap();
    for block in bytes[start..start + len].chunks_exact_mut(17) {
        block[1..].iter_mut().for_each(|q| *q ^= 0x88);
    }
    std::fs::write(copy, bytes).unwrap();
}

/// The must-fail control: brink on `model` against llama.cpp on a copy (in `dir`) with one
/// expert perturbed is over the tolerance, and against llama.cpp on `model` itself within it.
fn check_perturbed_is_told_apart(what: &str, dir: &Path, model: &Path, prompt: &str) {
    let perturbed = dir.join("perturbed.gguf");
    perturb_expert(model, &perturbed);
    let ours = brink(model, prompt, 512);
    let d = diff(model, &ours, &llama(&perturbed, prompt));
    eprintln!("brink on {what} vs llama.cpp on the perturbed copy: {d:?}");
    assert!(!d.within(TOLERANCE), "a perturbed expert went unnoticed: {d:?}");
    assert!(diff(model, &ours, &llama(model, prompt)).within(TOLERANCE), "the unperturbed file must pass");
}

#[test]
fn the_comparison_fails_on_the_gguf_py_gpt_oss_with_one_expert_perturbed() {
    if !have_llama_cpp(WHAT) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = gguf_py_model(dir.path());
    let prompt: String = (0..20).map(|i| format!("word{i} is here. ")).collect();
    check_perturbed_is_told_apart("the gguf-py gpt-oss", dir.path(), &model, &prompt);
}

#[test]
fn cpu_backend_matches_llama_cpp_on_the_synthetic_gpt_oss() {
    if !have_llama_cpp(WHAT) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = generate(dir.path());
    let window = GptOssPreset::Tiny.shape().sliding_window as usize;
    let long = long_prompt();
    let mut failures = Vec::new();
    for (name, prompt, chunk) in [("short", SHORT, 512), ("long", long.as_str(), 512), ("long, chunked", long.as_str(), CHUNK)] {
        let (theirs, ours) = (llama(&model, prompt), brink(&model, prompt, chunk));
        let d = diff(&model, &ours, &theirs);
        let n = ours.prompt_tokens.len();
        if name.starts_with("long") {
            assert!(
                n > window + CHUNK / 2 && n > CHUNK,
                "the long prompt is {n} tokens: not past the {window}-token window and the chunk edge"
            );
        }
        eprintln!("gpt-oss tiny {name:<14} prompt {n:>3} tokens {}", summary(&ours, &theirs, &d, TOLERANCE));
        failures.extend(parity_common::failures(name, &ours, &theirs, &d, TOLERANCE));
    }
    assert!(failures.is_empty(), "gpt-oss parity failures:\n{}", failures.join("\n"));
}

#[test]
fn the_comparison_fails_on_the_synthetic_gpt_oss_with_one_expert_perturbed() {
    if !have_llama_cpp(WHAT) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = generate(dir.path());
    check_perturbed_is_told_apart("the synthetic gpt-oss", dir.path(), &model, &long_prompt());
}
