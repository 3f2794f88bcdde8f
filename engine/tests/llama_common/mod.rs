//! What the llama.cpp checks of the synthetic models share (`synth_llama.rs`,
//! `synth_llama_gpt_oss.rs`): running `scripts/llama_ref.py` (llama-cpp-python) and checking the
//! logits and the greedy continuation it returns.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama_ref.py")
}

/// Whether llama-cpp-python is importable; panics when it is required and missing. `what` names
/// the models in the message that says the check is skipped.
pub fn have_llama_cpp(what: &str) -> bool {
    let ok = Command::new("python3").args(["-c", "import llama_cpp, numpy"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with llama-cpp-python (pip install llama-cpp-python==0.3.36) is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the llama.cpp check of {what}: {msg}");
    }
    ok
}

pub fn llama_ref(args: &[&str]) -> Json {
    let out = Command::new("python3").arg(script()).args(args).output().expect("run python3");
    assert!(out.status.success(), "llama_ref.py {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("llama_ref.py {args:?} printed no JSON ({e})"))
}

pub fn ids(v: &Json) -> Vec<u64> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}")).iter().map(|x| x.as_u64().expect("token id")).collect()
}

/// Checks llama_ref.py's `tokens` and `logits` (`out`): `n_predict` of each; every row of
/// `vocab` finite logits whose argmax is the token chosen, of the planned spread (standard
/// deviation ~4: neither flat nor exploding); greedy decoding that follows the context (not one
/// token over and over) and never picks a padding token (`live_tokens..`). Returns the tokens.
pub fn check_continuation(label: &str, out: &Json, n_predict: usize, vocab: usize, live_tokens: u64) -> Vec<u64> {
    let tokens = ids(&out["tokens"]);
    assert_eq!(tokens.len(), n_predict, "{label}");
    let logits = out["logits"].as_array().unwrap();
    assert_eq!(logits.len(), n_predict, "{label}");
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
    assert!(distinct.len() >= n_predict / 4, "{label}: only {} distinct tokens in {tokens:?}", distinct.len());
    assert!(tokens.iter().all(|&t| t < live_tokens), "{label}: a padding token was chosen: {tokens:?}");
    tokens
}
