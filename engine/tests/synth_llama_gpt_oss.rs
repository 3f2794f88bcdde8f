//! llama.cpp loads the synthetic gpt-oss models: the tiny file (MXFP4 experts, q8_0 elsewhere;
//! sinks, biases, a 128-token window on layer 0 and full attention on layer 1, YaRN) goes through
//! `scripts/llama_ref.py` (llama-cpp-python), which must load it, run a prompt longer than the
//! window and return finite logits of the planned spread whose greedy continuation is not one
//! repeated token; and a harmony conversation rendered by brink's template must tokenize to the
//! same ids in llama.cpp as in brink's tokenizer.
//!
//! Skipped with a message when python3 or llama-cpp-python is missing, unless BRINK_REQUIRE_PY=1
//! (as scripts/test sets), where that is a failure.

mod llama_common;

use std::path::Path;

use brink_engine::chat_template::ChatTemplate;
use brink_engine::gguf::GgufFile;
use brink_engine::synth::gpt_oss::{self, GptOssSpec};
use brink_engine::synth::{GptOssPreset, QuantScheme};
use brink_engine::tokenizer::Tokenizer;
use brink_kernels::quant::TensorType;
use llama_common::{check_continuation, have_llama_cpp, ids, llama_ref};
use serde_json::json;

/// The models, in the message that says the llama.cpp check is skipped.
const WHAT: &str = "the synthetic gpt-oss models";
const N_PREDICT: usize = 24;

/// A prompt of ~200 tokens: past the 128-token window of the even layers.
fn long_prompt() -> String {
    let sentence = "The model reads the whole context on odd layers and only the last window on even ones, ";
    let mut text = String::new();
    for i in 0..12 {
        text.push_str(&format!("{i}: {sentence}"));
    }
    text
}

fn check_model(dir: &Path, spec: &GptOssSpec) {
    let path = dir.join(format!("gpt-oss-{}-{}.gguf", spec.preset, spec.scheme));
    gpt_oss::generate(spec, &path, |_, _| {}).unwrap();
    let model = path.to_str().unwrap();
    let label = format!("gpt-oss {} {}", spec.preset, spec.scheme);
    let prompt = long_prompt();

    let out = llama_ref(&["--model", model, "--prompt", &prompt, "--n-predict", &N_PREDICT.to_string()]);
    let vocab = spec.shape.vocab as usize;
    assert_eq!(out["n_vocab"].as_u64(), Some(vocab as u64), "{label}");
    let prompt_tokens = ids(&out["prompt_tokens"]);
    let window = spec.shape.sliding_window as usize;
    assert!(prompt_tokens.len() > window + 16, "{label}: the prompt is {} tokens, not past the {window}-token window", prompt_tokens.len());
    check_continuation(&label, &out, N_PREDICT, vocab, spec.shape.live_tokens());
}

#[test]
fn llama_cpp_loads_and_runs_tiny_gpt_oss_past_the_window() {
    if !have_llama_cpp(WHAT) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The default (MXFP4 experts, as the published files) and all-q8_0 (experts through
    // llama.cpp's q8_0 path instead).
    let tiny = GptOssSpec::from_preset(GptOssPreset::Tiny);
    check_model(dir.path(), &tiny);
    check_model(dir.path(), &GptOssSpec { scheme: QuantScheme::Uniform(TensorType::Q8_0), ..tiny });
}

/// A harmony conversation rendered by brink from the file's template: llama.cpp and brink's
/// tokenizer give the same ids, with and without parse_special.
#[test]
fn llama_cpp_tokenizes_harmony_as_brink_does() {
    if !have_llama_cpp(WHAT) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    gpt_oss::generate(&GptOssSpec::from_preset(GptOssPreset::Tiny), &path, |_, _| {}).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let template = ChatTemplate::from_gguf(file.metadata()).unwrap().expect("a chat template");
    let tokenizer = Tokenizer::from_gguf(file.metadata()).unwrap();
    let messages = [
        json!({"role": "user", "content": "Is 1234567 prime? Answer in one word."}),
        json!({"role": "assistant", "content": "No.", "reasoning_content": "It is divisible by 127."}),
        json!({"role": "user", "content": "naïve café 日本 😀, don't STOP"}),
    ];
    let rendered = template.render(&messages, None, true).unwrap();
    let texts = [rendered.as_str(), "<|start|>assistant<|channel|>final<|message|>Hi<|return|>", " the 2024 numbers: 1234567"];
    let out = llama_ref(&["--model", path.to_str().unwrap(), "--tokenize", &serde_json::to_string(&texts).unwrap()]);
    let results = out["results"].as_array().unwrap();
    for (text, result) in texts.iter().zip(results) {
        let ours: Vec<u64> = tokenizer.encode(text, false, true).unwrap().into_iter().map(u64::from).collect();
        assert_eq!(ours, ids(&result["tokens_parse_special"]), "{text:?}");
        let plain: Vec<u64> = tokenizer.encode(text, false, false).unwrap().into_iter().map(u64::from).collect();
        assert_eq!(plain, ids(&result["tokens"]), "{text:?} without parse_special");
    }
    // The markers are single tokens; llama.cpp makes <|start|>, <|channel|>, <|message|> and
    // <|constrain|> USER_DEFINED for gpt-oss, so they are matched even without parse_special
    // (and brink's tokenizer agrees, above).
    let id = |t: &str| u64::from(tokenizer.token_id(t).unwrap());
    let (special, plain) = (ids(&results[0]["tokens_parse_special"]), ids(&results[0]["tokens"]));
    for marker in [gpt_oss::START, gpt_oss::MESSAGE, gpt_oss::END] {
        assert!(special.contains(&id(marker)), "{marker} is not one token: {special:?}");
    }
    assert!(plain.contains(&id(gpt_oss::START)), "{plain:?}");
}
