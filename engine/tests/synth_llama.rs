//! llama.cpp loads the synthetic models: tiny qwen3moe files in q8_0, q4_0, the K-quant mix and
//! with top-8 routing over 32 experts go through `scripts/llama_ref.py` (llama-cpp-python), which
//! must load them, tokenize (special tokens included) with the vocabulary we wrote, and return
//! finite logits whose greedy continuation is not one repeated token.
//!
//! Skipped with a message when python3 or llama-cpp-python is missing, unless BRINK_REQUIRE_PY=1
//! (as scripts/test sets), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use brink_engine::synth::{self, Preset, QuantScheme, SynthSpec, Vocab, vocab};
use brink_kernels::quant::TensorType;
use serde_json::Value as Json;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog. Hello, world!";
const N_PREDICT: usize = 32;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama_ref.py")
}

/// Whether llama-cpp-python is importable; panics when it is required and missing.
fn have_llama_cpp() -> bool {
    let ok = Command::new("python3").args(["-c", "import llama_cpp, numpy"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with llama-cpp-python (pip install llama-cpp-python==0.3.36) is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the llama.cpp check of the synthetic models: {msg}");
    }
    ok
}

fn llama_ref(args: &[&str]) -> Json {
    let out = Command::new("python3").arg(script()).args(args).output().expect("run python3");
    assert!(out.status.success(), "llama_ref.py {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("llama_ref.py {args:?} printed no JSON ({e})"))
}

fn ids(v: &Json) -> Vec<u64> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}")).iter().map(|x| x.as_u64().expect("token id")).collect()
}

fn check_model(dir: &Path, preset: Preset, scheme: QuantScheme, vocab: u64) -> Vec<u64> {
    let mut spec = SynthSpec { scheme, ..SynthSpec::from_preset(preset) };
    spec.shape.vocab = vocab;
    let path = dir.join(format!("{preset}-{scheme}-{vocab}.gguf"));
    synth::generate(&spec, &path, |_, _| {}).unwrap();
    let model = path.to_str().unwrap();
    let label = format!("{preset} {scheme} vocab {vocab}");

    let out = llama_ref(&["--model", model, "--prompt", PROMPT, "--n-predict", &N_PREDICT.to_string()]);
    let vocab = vocab as usize;
    assert_eq!(out["n_vocab"].as_u64(), Some(vocab as u64), "{label}");
    let prompt = ids(&out["prompt_tokens"]);
    assert!(prompt.len() > 5 && prompt.len() < PROMPT.len(), "{label}: the prompt became {} tokens", prompt.len());
    let tokens = ids(&out["tokens"]);
    assert_eq!(tokens.len(), N_PREDICT, "{label}");
    let logits = out["logits"].as_array().unwrap();
    assert_eq!(logits.len(), N_PREDICT, "{label}");
    for (i, row) in logits.iter().enumerate() {
        let row: Vec<f64> = row.as_array().unwrap().iter().map(|x| x.as_f64().expect("a finite number")).collect();
        assert_eq!(row.len(), vocab, "{label}: row {i}");
        assert!(row.iter().all(|x| x.is_finite()), "{label}: row {i} has a non-finite logit");
        let argmax = row.iter().enumerate().fold(0, |best, (j, &x)| if x > row[best] { j } else { best });
        assert_eq!(argmax as u64, tokens[i], "{label}: token {i} is not the argmax of its logits row");
        // Logits of the planned scale (standard deviation ~4): neither flat nor exploding.
        let mean = row.iter().sum::<f64>() / vocab as f64;
        let sd = (row.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / vocab as f64).sqrt();
        assert!((1.0..16.0).contains(&sd), "{label}: row {i} has logit standard deviation {sd}");
    }
    // Greedy decoding follows the context: not one token over and over.
    let distinct: std::collections::BTreeSet<u64> = tokens.iter().copied().collect();
    assert!(distinct.len() >= N_PREDICT / 4, "{label}: only {} distinct tokens in {tokens:?}", distinct.len());
    // [PAD] tokens (a vocabulary padded past the trained tokens) are never chosen.
    assert!(tokens.iter().all(|&t| t < spec.shape.live_tokens()), "{label}: a padding token was chosen: {tokens:?}");
    prompt
}

#[test]
fn llama_cpp_loads_tokenizes_and_runs_the_synthetic_models() {
    if !have_llama_cpp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trained = vocab::TRAINED_TOKENS;
    let models = [
        (Preset::Tiny, QuantScheme::Uniform(TensorType::Q8_0), trained),
        (Preset::Tiny, QuantScheme::Uniform(TensorType::Q4_0), trained),
        (Preset::Tiny, QuantScheme::KMix, trained),
        (Preset::TinyTop8, QuantScheme::Uniform(TensorType::Q8_0), trained),
        // Padded with [PAD] tokens (type UNUSED), as the 151,936-token benchmark model is.
        (Preset::Tiny, QuantScheme::Uniform(TensorType::Q8_0), 3 * trained),
    ];
    let prompts: Vec<Vec<u64>> = models.iter().map(|&(p, s, v)| check_model(dir.path(), p, s, v)).collect();
    // The vocabulary does not depend on the weights.
    assert!(prompts.windows(2).all(|w| w[0] == w[1]), "{prompts:?}");
}

/// llama.cpp reads our special tokens as special (parse_special) and plain text as BPE merges
/// of the trained vocabulary.
#[test]
fn llama_cpp_tokenizes_with_our_vocabulary() {
    if !have_llama_cpp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &path, |_, _| {}).unwrap();
    let v = Vocab::build(Preset::Tiny.shape().vocab);
    let texts = ["<|im_start|>user\nHi<|im_end|>", " the", "naïve café 日本 😀"];
    let out = llama_ref(&["--model", path.to_str().unwrap(), "--tokenize", &serde_json::to_string(&texts).unwrap()]);
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), texts.len());

    let (start, end) = (v.special(vocab::IM_START).unwrap() as u64, v.special(vocab::IM_END).unwrap() as u64);
    let special = ids(&results[0]["tokens_parse_special"]);
    assert_eq!(special.first(), Some(&start));
    assert_eq!(special.last(), Some(&end));
    let plain = ids(&results[0]["tokens"]);
    assert!(!plain.contains(&start) && !plain.contains(&end), "without parse_special the markers are text: {plain:?}");

    // " the" is one trained token.
    let the = v.tokens.iter().position(|t| t == "Ġthe").unwrap() as u64;
    assert_eq!(ids(&results[1]["tokens"]), [the]);

    // Any text encodes (through byte tokens where no merge applies) and no id is a special or
    // padding token.
    let other = ids(&results[2]["tokens"]);
    assert!(!other.is_empty() && other.iter().all(|&id| id < u64::from(v.bpe_tokens)), "{other:?}");
}
