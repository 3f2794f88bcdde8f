//! llama.cpp loads the synthetic models: tiny qwen3moe files in q8_0, q4_0, the K-quant mix and
//! with top-8 routing over 32 experts go through `scripts/llama_ref.py` (llama-cpp-python), which
//! must load them, tokenize (special tokens included) with the vocabulary we wrote, and return
//! finite logits whose greedy continuation is not one repeated token.
//!
//! Skipped with a message when python3 or llama-cpp-python is missing, unless BRINK_REQUIRE_PY=1
//! (as scripts/test sets), where that is a failure.

mod llama_common;

use std::path::Path;

use brink_engine::synth::{self, Preset, QuantScheme, SynthSpec, Vocab, vocab};
use brink_kernels::quant::TensorType;
use llama_common::{check_continuation, have_llama_cpp, ids, llama_ref};

/// The models, in the message that says the llama.cpp check is skipped.
const WHAT: &str = "the synthetic models";
const PROMPT: &str = "The quick brown fox jumps over the lazy dog. Hello, world!";
const N_PREDICT: usize = 32;

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
    check_continuation(&label, &out, N_PREDICT, vocab, spec.shape.live_tokens());
    prompt
}

#[test]
fn llama_cpp_loads_tokenizes_and_runs_the_synthetic_models() {
    if !have_llama_cpp(WHAT) {
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
    if !have_llama_cpp(WHAT) {
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
