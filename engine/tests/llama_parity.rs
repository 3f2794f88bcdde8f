//! brink's CPU backend against llama.cpp (llama-cpp-python 0.3.36, built from source by
//! scripts/test) on synthetic qwen3moe models: identical tokenization, identical greedy
//! continuation for 32 tokens, and the largest relative logit error (per row, relative to the
//! row's largest logit; `brink_engine::parity`) under a tolerance per quant type.
//!
//! Tolerances. Where brink's CPU arithmetic repeats llama.cpp's rounding points (K-quants with
//! q8_K activations, float weights) the rows agree to ~1e-6: the bound is 1e-3. For q8_0 and
//! q4_0 weights llama.cpp on x86-64 runs SIMD and repacked GEMV/GEMM paths whose activation
//! rounding brink does not reproduce, and some rows differ by up to ~1.2% (seen on the first
//! runs: 0.5–1.2% on about half of the rows, 1e-7 on the others): the bound is 3e-2, still far
//! below what a wrong kernel, block or expert gives (the perturbed-expert test below moves the
//! logits by far more, and the greedy tokens must match exactly in every case).
//!
//! Skipped with a message when llama-cpp-python is missing, unless BRINK_REQUIRE_PY=1.

use std::path::{Path, PathBuf};
use std::process::Command;

use brink_engine::backend::cpu::CpuBackend;
use brink_engine::gguf::GgufFile;
use brink_engine::parity::{LogitDiff, compare};
use brink_engine::synth::{self, Preset, QuantScheme, SynthSpec};
use brink_engine::tokenizer::Tokenizer;
use brink_engine::{Engine, EngineOptions, GenerateParams};
use serde_json::Value as Json;

const N_PREDICT: usize = 32;
const PLAIN: &str = "The quick brown fox jumps over the lazy dog. Hello, world! 1234 + 5678 =";
const CHAT: &str = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";

struct Case {
    preset: Preset,
    scheme: &'static str,
    tolerance: f64,
}

const CASES: [Case; 5] = [
    Case { preset: Preset::Tiny, scheme: "q8_0", tolerance: 3e-2 },
    Case { preset: Preset::Tiny, scheme: "q4_0", tolerance: 3e-2 },
    Case { preset: Preset::Tiny, scheme: "k-mix", tolerance: 1e-3 },
    Case { preset: Preset::Tiny, scheme: "f16", tolerance: 1e-3 },
    Case { preset: Preset::TinyTop8, scheme: "q4_0", tolerance: 3e-2 },
];

fn have_llama_cpp() -> bool {
    let ok = Command::new("python3").args(["-c", "import llama_cpp"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with llama-cpp-python (pip install llama-cpp-python==0.3.36) is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the llama.cpp parity test: {msg}");
    }
    ok
}

/// What llama.cpp produced for a prompt.
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
    let ids = |v: &Json| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let logits = j["logits"].as_array().unwrap().iter().flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32)).collect();
    Reference { prompt_tokens: ids(&j["prompt_tokens"]), tokens: ids(&j["tokens"]), logits }
}

fn brink(model: &Path, prompt: &str) -> Reference {
    let file = GgufFile::open(model).unwrap();
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let prompt_tokens = tok.encode(prompt, true, true).unwrap();
    let opts = EngineOptions { context: 512, slots: 1, prefill_chunk: 512 };
    let mut engine = Engine::load(model, CpuBackend::new(), opts).unwrap();
    let p = GenerateParams { max_tokens: N_PREDICT, sampling: Default::default(), stop_tokens: Vec::new(), record_logits: true };
    let g = engine.generate(0, &prompt_tokens, &p, |_| true).unwrap();
    Reference { prompt_tokens, tokens: g.tokens, logits: g.logits.concat() }
}

fn generate(dir: &Path, preset: Preset, scheme: &str) -> PathBuf {
    let scheme: QuantScheme = scheme.parse().unwrap();
    let spec = SynthSpec { scheme, ..SynthSpec::from_preset(preset) };
    let path = dir.join(format!("{preset}-{scheme}.gguf"));
    synth::generate(&spec, &path, |_, _| {}).unwrap();
    path
}

fn diff(model: &Path, ours: &Reference, theirs: &Reference) -> LogitDiff {
    let vocab = GgufFile::open(model).unwrap().require_tensor("token_embd.weight").unwrap().dims()[1] as usize;
    compare(&ours.logits, &theirs.logits, vocab).expect("logits of the same shape")
}

#[test]
fn cpu_backend_matches_llama_cpp_token_for_token() {
    if !have_llama_cpp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for c in &CASES {
        let model = generate(dir.path(), c.preset, c.scheme);
        for prompt in [PLAIN, CHAT] {
            let (theirs, ours) = (llama(&model, prompt), brink(&model, prompt));
            let d = diff(&model, &ours, &theirs);
            let same_tokens = ours.tokens == theirs.tokens;
            let label = format!("{} {} {:?}", c.preset, c.scheme, &prompt[..12]);
            eprintln!(
                "{label:<40} prompt {:>2} tokens {} | greedy {}/{} identical | max rel logit err {:.2e} (row {}, tolerance {:.0e})",
                ours.prompt_tokens.len(),
                if ours.prompt_tokens == theirs.prompt_tokens { "identical" } else { "DIFFER" },
                ours.tokens.iter().zip(&theirs.tokens).take_while(|(a, b)| a == b).count(),
                N_PREDICT,
                d.max_rel_err,
                d.worst_row,
                c.tolerance
            );
            if ours.prompt_tokens != theirs.prompt_tokens {
                failures.push(format!("{label}: tokenization {:?} vs llama.cpp {:?}", ours.prompt_tokens, theirs.prompt_tokens));
            }
            if !same_tokens {
                failures.push(format!("{label}: greedy {:?} vs llama.cpp {:?}", ours.tokens, theirs.tokens));
            }
            if !d.within(c.tolerance) {
                failures.push(format!("{label}: {d:?} over tolerance {}", c.tolerance));
            }
        }
    }
    assert!(failures.is_empty(), "parity failures:\n{}", failures.join("\n"));
}

/// Negates the quants of expert 0's down projection in layer 0 of a q8_0 file (each 34-byte
/// block: f16 scale, then 32 signed quants).
fn perturb_expert(model: &Path, copy: &Path) {
    std::fs::copy(model, copy).unwrap();
    let file = GgufFile::open(copy).unwrap();
    let t = file.require_tensor("blk.0.ffn_down_exps.weight").unwrap();
    let expert_bytes = t.size() / t.dims()[2];
    let (start, len) = (t.file_offset() as usize, expert_bytes as usize);
    drop(file);
    let mut bytes = std::fs::read(copy).unwrap();
    for block in bytes[start..start + len].chunks_exact_mut(34) {
        block[2..].iter_mut().for_each(|q| *q = (*q as i8).wrapping_neg() as u8);
    }
    std::fs::write(copy, bytes).unwrap();
}

#[test]
fn the_comparison_fails_on_a_model_with_one_expert_perturbed() {
    if !have_llama_cpp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = generate(dir.path(), Preset::Tiny, "q8_0");
    let perturbed = dir.path().join("perturbed.gguf");
    perturb_expert(&model, &perturbed);
    let ours = brink(&model, PLAIN);
    let theirs = llama(&perturbed, PLAIN);
    let d = diff(&model, &ours, &theirs);
    eprintln!("brink on the model vs llama.cpp on the perturbed copy: {d:?}");
    assert!(!d.within(CASES[0].tolerance), "a perturbed expert went unnoticed: {d:?}");
    // And the same comparison on the unperturbed file passes, so the failure is the perturbation.
    assert!(diff(&model, &ours, &llama(&model, PLAIN)).within(CASES[0].tolerance));
}
