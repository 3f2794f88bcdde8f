//! llama.cpp loads the synthetic gpt-oss models: the tiny file (MXFP4 experts, q8_0 elsewhere;
//! sinks, biases, a 128-token window on layer 0 and full attention on layer 1, YaRN) goes through
//! `scripts/llama_ref.py` (llama-cpp-python), which must load it, run a prompt longer than the
//! window and return finite logits of the planned spread whose greedy continuation is not one
//! repeated token; and a harmony conversation rendered by brink's template must tokenize to the
//! same ids in llama.cpp as in brink's tokenizer.
//!
//! Skipped with a message when python3 or llama-cpp-python is missing, unless BRINK_REQUIRE_PY=1
//! (as scripts/test sets), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use brink_engine::chat_template::ChatTemplate;
use brink_engine::gguf::GgufFile;
use brink_engine::synth::gpt_oss::{self, GptOssSpec};
use brink_engine::synth::{GptOssPreset, QuantScheme};
use brink_engine::tokenizer::Tokenizer;
use brink_kernels::quant::TensorType;
use serde_json::{Value as Json, json};

const N_PREDICT: usize = 24;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama_ref.py")
}

/// Whether llama-cpp-python is importable; panics when it is required and missing.
fn have_llama_cpp() -> bool {
    let ok = Command::new("python3").args(["-c", "import llama_cpp, numpy"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with llama-cpp-python (pip install llama-cpp-python==0.3.36) is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the llama.cpp check of the synthetic gpt-oss models: {msg}");
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
        let mean = row.iter().sum::<f64>() / vocab as f64;
        let sd = (row.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / vocab as f64).sqrt();
        assert!((1.0..16.0).contains(&sd), "{label}: row {i} has logit standard deviation {sd}");
    }
    let distinct: std::collections::BTreeSet<u64> = tokens.iter().copied().collect();
    assert!(distinct.len() >= N_PREDICT / 4, "{label}: only {} distinct tokens in {tokens:?}", distinct.len());
    assert!(tokens.iter().all(|&t| t < spec.shape.live_tokens()), "{label}: a padding token was chosen: {tokens:?}");
}

#[test]
fn llama_cpp_loads_and_runs_tiny_gpt_oss_past_the_window() {
    if !have_llama_cpp() {
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
    if !have_llama_cpp() {
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
