//! What the llama.cpp parity tests share (`llama_parity.rs`, `llama_parity_gpt_oss.rs`): the
//! pinned reference (scripts/llama_ref.py on llama-cpp-python's x86-64 AVX2 build), brink's CPU
//! backend on the same prompt, and the comparison of the two.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use brink_engine::backend::cpu::CpuBackend;
use brink_engine::gguf::GgufFile;
use brink_engine::parity::{LogitDiff, compare};
use brink_engine::tokenizer::Tokenizer;
use brink_engine::{Engine, EngineOptions, GenerateParams};
use serde_json::Value as Json;

pub const N_PREDICT: usize = 32;

/// Whether the pinned reference can run here; panics when BRINK_REQUIRE_PY=1 and it cannot.
/// `what` names the test in the message that says it is skipped.
pub fn have_llama_cpp(what: &str) -> bool {
    let required = std::env::var("BRINK_REQUIRE_PY").as_deref() == Ok("1");
    if !cfg!(target_arch = "x86_64") {
        // llama.cpp's NEON kernels sum in other orders than the AVX2 ones brink mirrors.
        let msg = "the llama.cpp reference is its x86-64 AVX2 build, and this is not x86-64";
        assert!(!required, "BRINK_REQUIRE_PY=1 but {msg} (run the parity tests on x86-64, or leave BRINK_REQUIRE_PY unset)");
        eprintln!("skipping {what}: {msg}");
        return false;
    }
    let ok = Command::new("python3").args(["-c", "import llama_cpp"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with llama-cpp-python (pip install llama-cpp-python==0.3.36) is not available";
        assert!(!required, "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping {what}: {msg}");
    }
    ok
}

/// The llama.cpp build must be the one brink mirrors (scripts/test installs it): AVX2, FMA and
/// F16C kernels, no AVX-512 ones (a -march=native build on an AVX-512 machine takes those).
pub fn check_build(system_info: &str) {
    let has = |feature: &str| system_info.split('|').any(|f| f.trim().strip_prefix(feature).is_some_and(|v| v.trim() == "= 1"));
    let missing: Vec<&str> = ["AVX2", "FMA", "F16C"].into_iter().filter(|f| !has(f)).collect();
    let extra: Vec<&str> = system_info.split('|').map(str::trim).filter(|f| f.starts_with("AVX512") && f.ends_with("= 1")).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "llama.cpp was not built as scripts/test builds it (missing {missing:?}, extra {extra:?}; system info: {system_info}): \
         reinstall with CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF\" \
         pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python==0.3.36"
    );
}

/// What an implementation produced for a prompt.
pub struct Reference {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub logits: Vec<f32>,
}

/// llama.cpp's tokens, greedy continuation and logits (its build checked by [`check_build`]).
pub fn llama(model: &Path, prompt: &str) -> Reference {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama_ref.py");
    let args = ["--model", model.to_str().unwrap(), "--prompt", prompt, "--n-predict", &N_PREDICT.to_string(), "--parse-special"];
    let out = Command::new("python3").arg(script).args(args).output().expect("run python3");
    assert!(out.status.success(), "llama_ref.py failed on {}:\n{}", model.display(), String::from_utf8_lossy(&out.stderr));
    let j: Json = serde_json::from_slice(&out.stdout).expect("llama_ref.py prints JSON");
    check_build(j["system_info"].as_str().expect("llama_ref.py reports system_info"));
    let ids = |v: &Json| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let logits =
        j["logits"].as_array().unwrap().iter().flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32)).collect();
    Reference { prompt_tokens: ids(&j["prompt_tokens"]), tokens: ids(&j["tokens"]), logits }
}

/// brink's CPU backend on the same prompt, prefilling `prefill_chunk` tokens at a time.
pub fn brink(model: &Path, prompt: &str, prefill_chunk: usize) -> Reference {
    let file = GgufFile::open(model).unwrap();
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let prompt_tokens = tok.encode(prompt, true, true).unwrap();
    let opts = EngineOptions { context: 512, slots: 1, prefill_chunk, ..EngineOptions::default() };
    let mut engine = Engine::load(model, CpuBackend::new(), opts).unwrap();
    let p = GenerateParams { max_tokens: N_PREDICT, sampling: Default::default(), stop_tokens: Vec::new(), record_logits: true };
    let g = engine.generate(0, &prompt_tokens, &p, |_| true).unwrap();
    Reference { prompt_tokens, tokens: g.tokens, logits: g.logits.concat() }
}

pub fn diff(model: &Path, ours: &Reference, theirs: &Reference) -> LogitDiff {
    let vocab = GgufFile::open(model).unwrap().require_tensor("token_embd.weight").unwrap().dims()[1] as usize;
    compare(&ours.logits, &theirs.logits, vocab).expect("logits of the same shape")
}

/// One comparison in a line, after the prompt's length: whether the tokenizations agree, how many
/// greedy tokens agree, the largest relative logit error and the tolerance.
pub fn summary(ours: &Reference, theirs: &Reference, d: &LogitDiff, tolerance: f64) -> String {
    format!(
        "{} | greedy {}/{} identical | max rel logit err {:.2e} (row {}, tolerance {:.0e})",
        if ours.prompt_tokens == theirs.prompt_tokens { "identical" } else { "DIFFER" },
        ours.tokens.iter().zip(&theirs.tokens).take_while(|(a, b)| a == b).count(),
        N_PREDICT,
        d.max_rel_err,
        d.worst_row,
        tolerance
    )
}

/// What differs between brink (`ours`) and llama.cpp, each a line starting with `label`: the
/// tokenization, the greedy continuation, the logits over `tolerance`.
pub fn failures(label: &str, ours: &Reference, theirs: &Reference, d: &LogitDiff, tolerance: f64) -> Vec<String> {
    let mut failures = Vec::new();
    if ours.prompt_tokens != theirs.prompt_tokens {
        failures.push(format!("{label}: tokenization {:?} vs llama.cpp {:?}", ours.prompt_tokens, theirs.prompt_tokens));
    }
    if ours.tokens != theirs.tokens {
        failures.push(format!("{label}: greedy {:?} vs llama.cpp {:?}", ours.tokens, theirs.tokens));
    }
    if !d.within(tolerance) {
        failures.push(format!("{label}: {d:?} over tolerance {tolerance}"));
    }
    failures
}
