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

use std::path::{Path, PathBuf};
use std::process::Command;

use brink_engine::backend::cpu::CpuBackend;
use brink_engine::gguf::GgufFile;
use brink_engine::parity::{LogitDiff, compare};
use brink_engine::synth::gpt_oss::{self, GptOssSpec};
use brink_engine::synth::{self, GptOssPreset, Preset, SynthSpec};
use brink_engine::tokenizer::Tokenizer;
use brink_engine::{Engine, EngineOptions, GenerateParams};
use serde_json::Value as Json;

const N_PREDICT: usize = 32;
const TOLERANCE: f64 = 1e-4;
const SHORT: &str = "The quick brown fox jumps over the lazy dog. Hello, world! 1234 + 5678 =";
/// Where the chunked prefill splits the synthetic model's long prompt: inside the window of
/// every later query.
const CHUNK: usize = 100;

fn long_prompt() -> String {
    let sentence = "The model reads the whole context on odd layers and only the last window on even ones, ";
    (0..12).map(|i| format!("{i}: {sentence}")).collect()
}

fn have_llama_cpp() -> bool {
    let required = std::env::var("BRINK_REQUIRE_PY").as_deref() == Ok("1");
    if !cfg!(target_arch = "x86_64") {
        let msg = "the llama.cpp reference is its x86-64 AVX2 build, and this is not x86-64";
        assert!(!required, "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the gpt-oss llama.cpp parity test: {msg}");
        return false;
    }
    let ok = Command::new("python3").args(["-c", "import llama_cpp"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with llama-cpp-python (pip install llama-cpp-python==0.3.36) is not available";
        assert!(!required, "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the gpt-oss llama.cpp parity test: {msg}");
    }
    ok
}

struct Reference {
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    logits: Vec<f32>,
}

fn llama(model: &Path, prompt: &str) -> Reference {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama_ref.py");
    let args = ["--model", model.to_str().unwrap(), "--prompt", prompt, "--n-predict", &N_PREDICT.to_string(), "--parse-special"];
    let out = Command::new("python3").arg(script).args(args).output().expect("run python3");
    assert!(out.status.success(), "llama_ref.py failed on {}:\n{}", model.display(), String::from_utf8_lossy(&out.stderr));
    let j: Json = serde_json::from_slice(&out.stdout).expect("llama_ref.py prints JSON");
    let system_info = j["system_info"].as_str().expect("llama_ref.py reports system_info");
    assert!(system_info.contains("AVX2 = 1") && !system_info.contains("AVX512 = 1"), "not the pinned llama.cpp build: {system_info}");
    let ids = |v: &Json| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let logits =
        j["logits"].as_array().unwrap().iter().flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32)).collect();
    Reference { prompt_tokens: ids(&j["prompt_tokens"]), tokens: ids(&j["tokens"]), logits }
}

fn brink(model: &Path, prompt: &str, prefill_chunk: usize) -> Reference {
    let file = GgufFile::open(model).unwrap();
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let prompt_tokens = tok.encode(prompt, true, true).unwrap();
    let opts = EngineOptions { context: 512, slots: 1, prefill_chunk, ..EngineOptions::default() };
    let mut engine = Engine::load(model, CpuBackend::new(), opts).unwrap();
    let p = GenerateParams { max_tokens: N_PREDICT, sampling: Default::default(), stop_tokens: Vec::new(), record_logits: true };
    let g = engine.generate(0, &prompt_tokens, &p, |_| true).unwrap();
    Reference { prompt_tokens, tokens: g.tokens, logits: g.logits.concat() }
}

fn generate(dir: &Path) -> PathBuf {
    let spec = GptOssSpec::from_preset(GptOssPreset::Tiny);
    let path = dir.join("gpt-oss-tiny.gguf");
    gpt_oss::generate(&spec, &path, |_, _| {}).unwrap();
    path
}

fn diff(model: &Path, ours: &Reference, theirs: &Reference) -> LogitDiff {
    let vocab = GgufFile::open(model).unwrap().require_tensor("token_embd.weight").unwrap().dims()[1] as usize;
    compare(&ours.logits, &theirs.logits, vocab).expect("logits of the same shape")
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
    if !have_llama_cpp() {
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
        eprintln!(
            "gguf-py gpt-oss {name:<8} prompt {n:>3} tokens {} | greedy {}/{} identical | max rel logit err {:.2e} (row {}, tolerance {:.0e})",
            if ours.prompt_tokens == theirs.prompt_tokens { "identical" } else { "DIFFER" },
            ours.tokens.iter().zip(&theirs.tokens).take_while(|(a, b)| a == b).count(),
            N_PREDICT,
            d.max_rel_err,
            d.worst_row,
            TOLERANCE
        );
        if ours.prompt_tokens != theirs.prompt_tokens || ours.tokens != theirs.tokens || !d.within(TOLERANCE) {
            failures.push(format!("{name}: tokens {:?} vs {:?}, {d:?}", ours.tokens, theirs.tokens));
        }
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

#[test]
fn the_comparison_fails_on_the_gguf_py_gpt_oss_with_one_expert_perturbed() {
    if !have_llama_cpp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = gguf_py_model(dir.path());
    let perturbed = dir.path().join("perturbed.gguf");
    perturb_expert(&model, &perturbed);
    let prompt: String = (0..20).map(|i| format!("word{i} is here. ")).collect();
    let ours = brink(&model, &prompt, 512);
    let d = diff(&model, &ours, &llama(&perturbed, &prompt));
    eprintln!("brink on the gguf-py gpt-oss vs llama.cpp on the perturbed copy: {d:?}");
    assert!(!d.within(TOLERANCE), "a perturbed expert went unnoticed: {d:?}");
    assert!(diff(&model, &ours, &llama(&model, &prompt)).within(TOLERANCE), "the unperturbed file must pass");
}

#[test]
fn cpu_backend_matches_llama_cpp_on_the_synthetic_gpt_oss() {
    if !have_llama_cpp() {
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
        eprintln!(
            "gpt-oss tiny {name:<14} prompt {n:>3} tokens {} | greedy {}/{} identical | max rel logit err {:.2e} (row {}, tolerance {:.0e})",
            if ours.prompt_tokens == theirs.prompt_tokens { "identical" } else { "DIFFER" },
            ours.tokens.iter().zip(&theirs.tokens).take_while(|(a, b)| a == b).count(),
            N_PREDICT,
            d.max_rel_err,
            d.worst_row,
            TOLERANCE
        );
        if ours.prompt_tokens != theirs.prompt_tokens {
            failures.push(format!("{name}: tokenization {:?} vs llama.cpp {:?}", ours.prompt_tokens, theirs.prompt_tokens));
        }
        if ours.tokens != theirs.tokens {
            failures.push(format!("{name}: greedy {:?} vs llama.cpp {:?}", ours.tokens, theirs.tokens));
        }
        if !d.within(TOLERANCE) {
            failures.push(format!("{name}: {d:?} over tolerance {TOLERANCE}"));
        }
    }
    assert!(failures.is_empty(), "gpt-oss parity failures:\n{}", failures.join("\n"));
}

#[test]
fn the_comparison_fails_on_the_synthetic_gpt_oss_with_one_expert_perturbed() {
    if !have_llama_cpp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = generate(dir.path());
    let perturbed = dir.path().join("perturbed.gguf");
    perturb_expert(&model, &perturbed);
    let long = long_prompt();
    let ours = brink(&model, &long, 512);
    let d = diff(&model, &ours, &llama(&perturbed, &long));
    eprintln!("brink on the synthetic gpt-oss vs llama.cpp on the perturbed copy: {d:?}");
    assert!(!d.within(TOLERANCE), "a perturbed expert went unnoticed: {d:?}");
    assert!(diff(&model, &ours, &llama(&model, &long)).within(TOLERANCE), "the unperturbed file must pass");
}
